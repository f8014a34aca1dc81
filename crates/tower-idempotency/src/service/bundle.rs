//! What every step of the flow shares: the [`Flow`] bundle of the types one guarded request runs
//! with, the [`Shared`] store and settings of one service, and the inner service called as is
//! ([`pass_through`]). The steps import from here, never from `mod.rs`, so the service folder's
//! imports run one way: `mod.rs` -> `flow.rs` -> the steps -> this file.

use std::{marker::PhantomData, sync::Arc};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::{
    body::{BoxError, RequestBody, ResponseBody},
    config::Config,
    mode::Mode,
    store::Store,
};

/// What every request through one service shares: the store and the settings.
pub(crate) struct Shared<St, M> {
    pub(crate) store: Arc<St>,
    pub(crate) config: Arc<Config>,
    mode: PhantomData<fn() -> M>,
}

impl<St, M> Shared<St, M> {
    pub(crate) fn new(store: Arc<St>, config: Arc<Config>) -> Self {
        Self {
            store,
            config,
            mode: PhantomData,
        }
    }
}

impl<St, M> Clone for Shared<St, M> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            config: self.config.clone(),
            mode: PhantomData,
        }
    }
}

/// The types one guarded request runs with, as one bundle: the flow's functions take `F: Flow`
/// and name `F::Store`, `F::Mode`, `F::Inner` and the bodies, so the bounds are written here
/// once. The guarded flow is sent to the runtime when a client disconnects, so everything in it
/// is `Send + 'static`.
pub(super) trait Flow: 'static {
    /// The wrapped service.
    type Inner: Service<
            Request<RequestBody<Self::ReqBody>>,
            Response = Response<Self::ResBody>,
            Error = Self::Error,
            Future: Send + 'static,
        > + Send
        + 'static;
    /// The wrapped service's error, which the layer returns unchanged.
    type Error: Send + 'static;
    /// Where keys are claimed and answers saved.
    type Store: Store;
    /// How a claimed run's answer is recorded.
    type Mode: Mode<Self::Store>;
    /// The request body, buffered before the claim.
    type ReqBody: Body<Data: Send, Error: Into<BoxError>> + Send + 'static;
    /// The handler's response body, collected and recorded.
    type ResBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static;
}

/// The [`Flow`] of an `IdempotencyService<S, St, M>` over `Request<ReqBody>`; a type only, never
/// a value.
pub(super) struct Bundle<S, St, M, ReqBody, ResBody>(
    PhantomData<Types<S, St, M, ReqBody, ResBody>>,
);

/// The types a [`Bundle`] carries.
pub(super) type Types<S, St, M, ReqBody, ResBody> = fn() -> (S, St, M, ReqBody, ResBody);

impl<S, St, M, ReqBody, ResBody> Flow for Bundle<S, St, M, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    M: Mode<St>,
    ReqBody: Body<Data: Send, Error: Into<BoxError>> + Send + 'static,
    ResBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static,
{
    type Inner = S;
    type Error = S::Error;
    type Store = St;
    type Mode = M;
    type ReqBody = ReqBody;
    type ResBody = ResBody;
}

/// What a flow answers: the response, or the inner service's error.
pub(super) type Answer<F> =
    Result<Response<ResponseBody<<F as Flow>::ResBody>>, <F as Flow>::Error>;

/// What every request of one flow shares.
pub(super) type SharedOf<F> = Shared<<F as Flow>::Store, <F as Flow>::Mode>;

/// The run state of the flow's mode.
pub(super) type RunState<F> = <<F as Flow>::Mode as Mode<<F as Flow>::Store>>::RunState;

/// The request to the handler as it came, the answer as it goes.
pub(super) async fn pass_through<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<RequestBody<ReqBody>>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
{
    Ok(inner.call(req).await?.map(ResponseBody::inner))
}
