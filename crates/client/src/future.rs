//! The response future of [`IdempotentRetry`](crate::IdempotentRetry).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use futures_util::future::BoxFuture;
use http::Response;

use crate::Error;

/// The answer of an intent: its attempts run inside, so the future is boxed.
pub struct ResponseFuture<T> {
    inner: BoxFuture<'static, Result<Response<T>, Error>>,
}

impl<T> ResponseFuture<T> {
    pub(crate) fn new(inner: BoxFuture<'static, Result<Response<T>, Error>>) -> Self {
        Self { inner }
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = Result<Response<T>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
