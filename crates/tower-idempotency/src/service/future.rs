//! The response future of [`IdempotencyService`](super::IdempotencyService): a named newtype
//! around a boxed future (tower-http's `opaque_future!` idea), since the service awaits the store
//! before and after the handler.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::Response;

use crate::body::ResponseBody;

pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The response future of [`IdempotencyService`](crate::IdempotencyService).
pub struct ResponseFuture<B, E> {
    pub(super) inner: BoxFuture<Result<Response<ResponseBody<B>>, E>>,
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
