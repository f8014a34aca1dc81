//! The claimed run: the handler runs under a heartbeat (`renew_forever`, which renews the lease),
//! then its answer is saved (`save.rs`) or the key released.

use std::{convert::Infallible, panic::AssertUnwindSafe, pin::Pin, sync::Arc};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower_service::Service;

use super::bundle::{Answer, Flow, RunState, Shared};
use crate::{
    body::{BoxError, RequestBody, ResponseBody},
    config::Config,
    mode::Mode,
    observe::{self, Outcome, RequestRecord},
    record,
    retry_after::Running,
    store::{bounded, Fenced, Hold, Store},
};

/// The claimed key: what the run needs to renew, save and release it.
pub(super) struct Lease<St> {
    pub(super) store: Arc<St>,
    pub(super) config: Arc<Config>,
    pub(super) hold: Hold,
    /// Whether the claim holds a lease to renew and release (see [`Mode::LEASED`]).
    pub(super) leased: bool,
    pub(super) record: Arc<RequestRecord>,
    /// The request's path, for the Retry-After estimates of its duplicates: the request's own
    /// bytes, shared, not copied.
    pub(super) path: Option<http::uri::PathAndQuery>,
}

impl<St> Lease<St> {
    pub(super) fn new<M: Mode<St>>(
        layer: &Shared<St, M>,
        hold: Hold,
        record: Arc<RequestRecord>,
        uri: &http::Uri,
    ) -> Self
    where
        St: crate::store::Store,
    {
        Self {
            store: layer.store.clone(),
            config: layer.config.clone(),
            hold,
            leased: M::LEASED,
            record,
            path: uri.path_and_query().cloned(),
        }
    }

    /// The handler's duration, counted until this drops, for the Retry-After estimate.
    fn running(&self) -> Running<'_> {
        Running {
            durations: &self.config.durations,
            key: self.hold.key,
            start: self.config.durations.started(self.hold.key),
            path: self.path(),
        }
    }

    /// The request's path, as `Uri::path` gives it (empty in authority form).
    pub(super) fn path(&self) -> &str {
        self.path.as_ref().map_or("", http::uri::PathAndQuery::path)
    }
}

/// The handler's run once the key is claimed: the lease and the mode's state for the run.
pub(super) struct ClaimedRun<F: Flow> {
    pub(super) lease: Lease<F::Store>,
    pub(super) state: RunState<F>,
}

/// How far the handler's body was read.
pub(super) enum BodyRead<B> {
    /// Whole, within the saved-body limit: its bytes and trailers.
    Whole(Bytes, HeaderMap),
    /// Over the limit: the bytes read so far (at most the limit and one frame) and the rest,
    /// unread, to be streamed to the client.
    TooLarge(Bytes, Pin<Box<B>>),
    /// The body failed while the layer read it.
    Failed(BoxError),
}

impl<F: Flow> ClaimedRun<F> {
    /// Run the handler (renewing the lease meanwhile), then save its answer, or release the key
    /// when there is nothing to save.
    pub(super) async fn execute(
        self,
        inner: F::Inner,
        req: Request<RequestBody<F::ReqBody>>,
    ) -> Answer<F> {
        let Self { lease, state } = self;
        let running = lease.running();
        let limit = lease.config.saved_body_limit;
        let result = tokio::select! {
            biased;
            result = AssertUnwindSafe(call_handler(inner, req, limit)).catch_unwind() => result,
            // Made and boxed on its first poll, that is only when the handler does not answer at
            // once: the run's future does not carry the heartbeat's room.
            never = async { Box::pin(renew_forever(&lease)).await }, if lease.leased => match never {},
        };
        // The rarer endings are boxed when they happen, so the flow's future (one allocation per
        // request, and copied whole into it) does not carry their room.
        match result {
            // The handler is done: its duration is recorded without the save that follows.
            Ok(Ok((parts, BodyRead::Whole(body, trailers)))) => {
                drop(running);
                Ok(lease
                    .finish::<F::Mode, _>(state, parts, body, trailers)
                    .await)
            }
            Ok(Ok((parts, BodyRead::TooLarge(prefix, rest)))) => {
                drop(running);
                Ok(Box::pin(lease.stream_unkept::<F::Mode, _>(state, parts, prefix, rest)).await)
            }
            Ok(Ok((parts, BodyRead::Failed(err)))) => {
                Box::pin(lease.give_up::<F::Mode>(state, "the response body failed")).await;
                Ok(Response::from_parts(parts, ResponseBody::failed(err)))
            }
            Ok(Err(err)) => {
                let why = "the inner service returned an error";
                Box::pin(lease.give_up::<F::Mode>(state, why)).await;
                Err(err)
            }
            Err(panic) => {
                Box::pin(lease.give_up::<F::Mode>(state, "the handler panicked")).await;
                std::panic::resume_unwind(panic);
            }
        }
    }
}

/// Renew the lease every third of it, forever; the caller drops this when the work ends.
async fn renew_forever<St: Store>(run: &Lease<St>) -> Infallible {
    let period = run.config.heartbeat();
    let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let renew = run.store.renew(&run.hold, run.config.lease);
        let renew = bounded("the renewal", run.config.store_timeout, renew);
        match observe::timed(run.store.name(), "renew", renew).await {
            Ok(Fenced::Applied) => observe::renewed(),
            Ok(Fenced::Lost) => {
                observe::record(
                    Outcome::FencedOut,
                    &"the lease was lost while the handler ran; its answer will not be saved",
                );
                return std::future::pending().await;
            }
            Err(err) => observe::record(
                Outcome::StoreError,
                &format_args!(
                    "renewing the lease failed: {}; trying again next beat",
                    observe::Chain(&err)
                ),
            ),
        }
    }
}

/// The handler's answer with its body read up to `limit` bytes; trailers are kept with the
/// body, since gRPC's outcome (`grpc-status`) is in them. A body that says it is larger than
/// `limit` is not read at all, nor is a stream of server-sent events: it has no end to wait for,
/// and its client waits for each event as it comes.
async fn call_handler<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<ReqBody>,
    limit: usize,
) -> Result<(http::response::Parts, BodyRead<ResBody>), S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = inner.call(req).await?.into_parts();
    let mut body = Box::pin(body);
    if body.size_hint().lower() > limit as u64 || record::is_event_stream(&parts.headers) {
        return Ok((parts, BodyRead::TooLarge(Bytes::new(), body)));
    }
    let mut reading = Reading::default();
    loop {
        match body.frame().await {
            None => break,
            Some(Err(err)) => return Ok((parts, BodyRead::Failed(err.into()))),
            Some(Ok(frame)) => {
                if let Some(prefix) = reading.take(frame, limit) {
                    return Ok((parts, BodyRead::TooLarge(prefix, body)));
                }
            }
        }
    }
    let (whole, trailers) = reading.finish();
    Ok((parts, BodyRead::Whole(whole, trailers)))
}

/// A response body as read so far. The first data frame is kept as it is, and copied only when
/// a second one follows: most bodies are one frame.
#[derive(Default)]
struct Reading {
    first: Bytes,
    read: bytes::BytesMut,
    trailers: HeaderMap,
}

impl Reading {
    /// Take one frame; the data read so far when it made the body longer than `limit`.
    fn take(&mut self, frame: Frame<Bytes>, limit: usize) -> Option<Bytes> {
        match frame.into_data() {
            Ok(data) if self.first.is_empty() && self.read.is_empty() => {
                self.first = data;
                (self.first.len() > limit).then(|| std::mem::take(&mut self.first))
            }
            Ok(data) => {
                if self.read.is_empty() {
                    self.read
                        .extend_from_slice(&std::mem::take(&mut self.first));
                }
                self.read.extend_from_slice(&data);
                (self.read.len() > limit).then(|| std::mem::take(&mut self.read).freeze())
            }
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    self.trailers.extend(more);
                }
                None
            }
        }
    }

    /// The whole body and its trailers.
    fn finish(self) -> (Bytes, HeaderMap) {
        let whole = if self.read.is_empty() {
            self.first
        } else {
            self.read.freeze()
        };
        (whole, self.trailers)
    }
}
