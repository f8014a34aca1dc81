//! The [`IdempotencyService`]: the `Service` impl and its dispatch. A covered method goes
//! through the request flow (`flow.rs`, which reads top to bottom in the order of the crate
//! docs); any other request is passed through.
//!
//! One file per step of the flow: `prepare.rs` (key, body, fingerprint), `claim.rs` (the
//! claim, or in wait mode the claims), `run.rs` (the handler under its heartbeat), `save.rs`
//! (its answer saved), `unsaved.rs` (an answer not saved, and the key released), `replay.rs` (a
//! saved answer), `refuse.rs` (the answers the layer makes itself). What the steps share (the
//! `Flow` bundle of types, the store and settings, the inner service called as is) is in
//! `bundle.rs`, below them all. The response future is here, beside the `Service` impl that makes
//! it; what it needs to keep a claimed run going after a disconnect has its own file,
//! `finish_on_drop.rs`.

use std::{
    fmt,
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::{
    body::{BoxError, RequestBody, ResponseBody},
    config::Config,
    mode::{Mode, Standard},
    observe::{self, RequestRecord},
    store::Store,
};

mod bundle;
mod claim;
mod finish_on_drop;
mod flow;
mod prepare;
mod refuse;
mod replay;
mod run;
mod save;
mod unguarded;
mod unsaved;
// The service's unit tests run on the memory store.
#[cfg(all(test, feature = "memory"))]
mod tests;

use bundle::{pass_through, Bundle, Shared};
use finish_on_drop::{BoxFuture, FinishOnDrop};

/// The middleware produced by [`Idempotency`](crate::Idempotency). See the crate docs for the request flow.
pub struct IdempotencyService<S, St, M = Standard> {
    inner: S,
    layer: Shared<St, M>,
}

impl<S, St: Store> IdempotencyService<S, St> {
    /// Wrap `inner` with the default configuration over `store`.
    ///
    /// ```
    /// use tower_idempotency::{store::MemoryStore, IdempotencyService};
    ///
    /// let handler = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
    /// });
    /// let service = IdempotencyService::new(handler, MemoryStore::new());
    /// # let _ = service;
    /// ```
    pub fn new(inner: S, store: St) -> Self {
        Self::from_parts(inner, Arc::new(store), Arc::new(Config::default()))
    }
}

impl<S, St, M> IdempotencyService<S, St, M> {
    pub(crate) fn from_parts(inner: S, store: Arc<St>, config: Arc<Config>) -> Self {
        Self {
            inner,
            layer: Shared::new(store, config),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St, M> Clone for IdempotencyService<S, St, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, M> fmt::Debug for IdempotencyService<S, St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("store", &self.layer.store)
            .field("mode", &std::any::type_name::<M>())
            .finish_non_exhaustive()
    }
}

// The public contract: the same bounds as `Bundle`'s, written out for users (a private trait in
// a public bound would hide them from the docs and error messages).
impl<S, St, M, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S, St, M>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    M: Mode<St>,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone may not be ready: keep the service `poll_ready` was called on for this
        // request, and leave the clone in its place (tower's "be careful when cloning inner
        // services" note).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        if !layer.config.covers(req.method()) {
            return ResponseFuture {
                inner: Some(Box::pin(pass_through(inner, req.map(RequestBody::new)))),
                finish_on_drop: None,
            };
        }
        let record = RequestRecord::new(req.method(), req.uri().path(), observe::route_of(&req));
        let finish_on_drop = FinishOnDrop::new(record.clone());
        let flow = flow::handle::<Bundle<S, St, M, ReqBody, ResBody>>(inner, layer, req, record);
        ResponseFuture {
            inner: Some(Box::pin(flow)),
            finish_on_drop: Some(finish_on_drop),
        }
    }
}

/// What the response future answers.
type Output<B, E> = Result<Response<ResponseBody<B>>, E>;

/// The response future of [`IdempotencyService`]: a named newtype around a boxed future
/// (tower-http's `opaque_future!` idea), since the service awaits the store before and after the
/// handler. Dropped during a claimed run, it hands the rest of the run to the runtime.
pub struct ResponseFuture<B, E> {
    /// `None` once it has answered (or panicked).
    inner: Option<BoxFuture<Output<B, E>>>,
    /// Covered requests only.
    finish_on_drop: Option<FinishOnDrop<Output<B, E>>>,
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Output<B, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Pending;
        };
        // A future that panicked must not be polled again, so it is not handed to the runtime.
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                this.inner = None;
                this.finish_on_drop = None;
                Poll::Ready(output)
            }
            Err(panic) => {
                this.inner = None;
                this.finish_on_drop = None;
                std::panic::resume_unwind(panic)
            }
        }
    }
}

impl<B, E> Drop for ResponseFuture<B, E> {
    fn drop(&mut self) {
        if let (Some(rest), Some(finish_on_drop)) = (self.inner.take(), self.finish_on_drop.take())
        {
            finish_on_drop.finish(rest);
        }
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
