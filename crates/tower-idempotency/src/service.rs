//! The [`IdempotencyService`]: the request flow of the layer.

use std::{
    fmt,
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{header::CONTENT_LENGTH, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::Instant;
use tower_service::Service;
use tracing::Instrument;

use crate::{
    body::ResponseBody,
    error::Rejection,
    fingerprint::Fingerprint,
    key::{IdempotencyKey, KeyHash},
    layer::{Config, Idempotency, WAIT_POLL_INTERVAL},
    mode::{Mode, Standard},
    not_processed::NotProcessed,
    observe::{self, Outcome, RequestRecord},
    record,
    retry_after::Running,
    store::{
        Claim, ClaimOutcome, Fenced, FencingToken, Store, StoreError, StoreErrorKind,
        StoredResponse,
    },
    timeout::bounded,
    BoxError, RequestBody,
};

/// How long a client is told to wait when the store is unavailable.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Claims tried when the store reports a conflict (serialization failure, deadlock) before
/// answering 503.
const CLAIM_ATTEMPTS: u32 = 3;

/// The answer to a store error: 503 for what a retry can cure, 500 for what needs an operator.
fn store_rejection(err: &StoreError) -> Rejection {
    match err.kind() {
        StoreErrorKind::Full => Rejection::StoreFull {
            retry_after: STORE_RETRY_AFTER,
        },
        _ if err.is_transient() => Rejection::StoreUnavailable {
            retry_after: STORE_RETRY_AFTER,
        },
        _ => Rejection::StoreFailed,
    }
}

/// The middleware produced by [`Idempotency`]. See the crate docs for the request flow.
pub struct IdempotencyService<S, St, M = Standard> {
    inner: S,
    layer: Idempotency<St, M>,
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
        Self::from_layer(inner, Idempotency::new(store))
    }
}

impl<S, St, M> IdempotencyService<S, St, M> {
    pub(crate) fn from_layer(inner: S, layer: Idempotency<St, M>) -> Self {
        Self { inner, layer }
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
            .field("layer", &self.layer)
            .finish()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The response future of [`IdempotencyService`].
pub struct ResponseFuture<B, E> {
    inner: BoxFuture<Result<Response<ResponseBody<B>>, E>>,
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
        let inner = if layer.config.covers(req.method()) {
            Box::pin(handle(inner, layer, req)) as BoxFuture<_>
        } else {
            Box::pin(pass_through(inner, req.map(RequestBody::new)))
        };
        ResponseFuture { inner }
    }
}

async fn pass_through<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<RequestBody<ReqBody>>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
{
    Ok(inner.call(req).await?.map(ResponseBody::inner))
}

/// A header name as people write it (`Idempotency-Key`), for error details; `HeaderName` keeps
/// names in lower case.
fn display_name(name: &http::HeaderName) -> String {
    name.as_str()
        .split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

fn reject<B>(rejection: Rejection) -> Response<ResponseBody<B>> {
    rejection.to_response().map(ResponseBody::from_full)
}

/// A covered request, inside its span; its final outcome is counted when the record drops.
async fn handle<S, St, M, ReqBody, ResBody>(
    inner: S,
    layer: Idempotency<St, M>,
    req: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
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
    let record = RequestRecord::new(req.method(), req.uri().path());
    let span = record.span().clone();
    let result = guard(inner, layer, req, record.clone())
        .instrument(span)
        .await;
    if let Ok(response) = &result {
        record.status(response.status());
    }
    result
}

/// The request flow for a covered method: key, body, fingerprint, claim, then one of the four
/// outcomes.
async fn guard<S, St, M, ReqBody, ResBody>(
    inner: S,
    layer: Idempotency<St, M>,
    req: Request<ReqBody>,
    record: Arc<RequestRecord>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
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
    let config = &layer.config;
    let (parts, body) = req.into_parts();

    let key = match IdempotencyKey::from_headers(&parts.headers, &config.header) {
        Ok(Some(key)) => key,
        Ok(None) if config.required => {
            record.finish(Outcome::Rejected, &"no idempotency key: 400");
            return Ok(reject(Rejection::MissingKey {
                header: display_name(&config.header),
            }));
        }
        Ok(None) => {
            record.finish(
                Outcome::NoKey,
                &"no idempotency key: passed through unguarded",
            );
            return pass_through(inner, Request::from_parts(parts, RequestBody::new(body))).await;
        }
        Err(reason) => {
            record.finish(Outcome::Rejected, &"invalid idempotency key: 400");
            return Ok(reject(Rejection::InvalidKey {
                header: display_name(&config.header),
                reason,
            }));
        }
    };

    let too_large = Rejection::BodyTooLarge {
        limit: config.body_limit,
    };
    let declared_len = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_len.is_some_and(|len| len > config.body_limit as u64) {
        record.finish(
            Outcome::Rejected,
            &"the declared body is over the limit: 413",
        );
        return Ok(reject(too_large));
    }
    let read = Limited::new(body, config.body_limit).collect();
    let bytes = match tokio::time::timeout(config.body_timeout, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(err)) if err.is::<LengthLimitError>() => {
            record.finish(Outcome::Rejected, &"the body is over the limit: 413");
            return Ok(reject(too_large));
        }
        Ok(Err(_)) => {
            record.finish(Outcome::Rejected, &"the body could not be read: 400");
            return Ok(reject(Rejection::UnreadableBody));
        }
        Err(_elapsed) => {
            record.finish(
                Outcome::Rejected,
                &"the body did not arrive within the body timeout: 408",
            );
            return Ok(reject(Rejection::BodyTimeout {
                timeout: config.body_timeout,
            }));
        }
    };

    let key_hash = key.scoped_hash(&config.scope.scope(&parts));
    let fingerprint = config.fingerprint.fingerprint(&parts, &bytes);
    record.key(&key_hash);
    let path = parts.uri.path().to_owned();

    {
        let token = FencingToken::new();
        match claim(&layer, key_hash, fingerprint, token).await {
            Ok((ClaimOutcome::Claimed { taken_over }, claimed)) => {
                if taken_over {
                    observe::record(
                        Outcome::TakenOver,
                        &"a lapsed lease was taken over; the handler runs again",
                    );
                } else {
                    observe::record(Outcome::Claimed, &"key claimed; the handler runs");
                }
                let mut parts = parts;
                parts.extensions.insert(key);
                let attempt = M::start(&layer.store, &mut parts.extensions, claimed);
                let req = Request::from_parts(parts, RequestBody::buffered(bytes));
                let run = Attempt {
                    store: layer.store.clone(),
                    config: layer.config.clone(),
                    key: key_hash,
                    token,
                    leased: M::LEASED,
                    path: path.clone(),
                    record: record.clone(),
                };
                // If the client disconnects and this future is dropped, the attempt is handed to
                // the runtime: the handler runs to the end and its answer is recorded.
                FinishOnDrop::new(
                    run.execute::<S, M, RequestBody<ReqBody>, ResBody>(inner, req, attempt)
                        .in_current_span(),
                )
                .await
            }
            Ok((ClaimOutcome::InFlight { lease_remaining }, _)) => {
                record.finish(
                    Outcome::InFlight,
                    &"the first attempt is still running: 409",
                );
                let retry_after = layer.config.durations.retry_after(
                    layer.config.retry_after,
                    &key_hash,
                    &path,
                    lease_remaining,
                );
                Ok(reject(Rejection::InFlight { retry_after }))
            }
            Ok((ClaimOutcome::Mismatch, _)) => {
                record.finish(
                    Outcome::Mismatch,
                    &"the key was first used for a different request: 422",
                );
                Ok(reject(Rejection::KeyReused))
            }
            Ok((ClaimOutcome::Done(saved), _)) => {
                record.finish(Outcome::Replayed, &"replaying the saved answer");
                Ok(record::replay(saved))
            }
            Err(err) if layer.config.fail_open => {
                record.finish(
                    Outcome::FailOpen,
                    &format_args!(
                        "store failed ({}); calling the handler without idempotency (fail-open)",
                        observe::Chain(&err)
                    ),
                );
                pass_through(
                    inner,
                    Request::from_parts(parts, RequestBody::buffered(bytes)),
                )
                .await
            }
            Err(err) => {
                let rejection = store_rejection(&err);
                record.finish(
                    Outcome::StoreError,
                    &format_args!(
                        "store failed: {}; answering {}",
                        observe::Chain(&err),
                        rejection.status().as_u16()
                    ),
                );
                Ok(reject(rejection))
            }
        }
    }
}

/// Claim once, or in wait mode keep claiming while the first attempt runs, up to the bound.
async fn claim<St: Store, M: Mode<St>>(
    layer: &Idempotency<St, M>,
    key: KeyHash,
    fingerprint: Fingerprint,
    token: FencingToken,
) -> Result<(ClaimOutcome, Option<M::Attempt>), crate::store::StoreError> {
    let config = &layer.config;
    let claim = Claim::new(key, fingerprint, token, config.lease, config.ttl);
    let deadline = config.wait.map(|wait| Instant::now() + wait);
    let mut waited = false;
    let mut conflicts = 0;
    loop {
        let attempt = bounded(
            "the claim",
            config.store_timeout,
            M::claim(&layer.store, &claim),
        );
        let (outcome, claimed) = match observe::timed(layer.store.name(), "claim", attempt).await {
            // Nothing was written: the same claim again is expected to go through.
            Err(err)
                if err.kind() == StoreErrorKind::Conflict && conflicts + 1 < CLAIM_ATTEMPTS =>
            {
                conflicts += 1;
                tracing::debug!(target: "tower_idempotency", error = %observe::Chain(&err), conflicts, "the claim conflicted with a concurrent one; claiming again");
                tokio::time::sleep(Duration::from_millis(5 << conflicts)).await;
                continue;
            }
            Ok(outcome) => outcome,
            Err(err) => {
                release_in_background(layer, key, token);
                return Err(err);
            }
        };
        let now = Instant::now();
        match (outcome, deadline) {
            (ClaimOutcome::InFlight { lease_remaining }, Some(deadline)) if now < deadline => {
                drop(claimed);
                waited = true;
                let pause = (deadline - now)
                    .min(lease_remaining)
                    .min(WAIT_POLL_INTERVAL);
                M::wait(&layer.store, &key, pause).await;
            }
            (outcome, _) => {
                if waited {
                    observe::record(Outcome::Waited, &"waited for the first attempt");
                }
                return Ok((outcome, claimed));
            }
        }
    }
}

/// After a failed claim (a timeout, a cut connection), the claim may still have landed: release it,
/// fenced by our token so nothing else is touched, so that a retry need not wait for the lease to
/// lapse. In the background, because the client's 503 should not wait for a store in trouble.
fn release_in_background<St: Store, M>(
    layer: &Idempotency<St, M>,
    key: KeyHash,
    token: FencingToken,
) {
    let store = layer.store.clone();
    let limit = layer.config.store_timeout;
    tokio::spawn(
        async move {
            match bounded("the release", limit, store.release(&key, token)).await {
                Ok(Fenced::Applied) => observe::record(
                    Outcome::Released,
                    &"the failed claim had landed after all: key released",
                ),
                Ok(Fenced::Lost) => {}
                Err(err) => observe::record(
                    Outcome::StoreError,
                    &format_args!(
                        "releasing after a failed claim failed: {}; if the claim landed, the key frees when the lease lapses",
                        observe::Chain(&err)
                    ),
                ),
            }
        }
        .in_current_span(),
    );
}

/// Polls an attempt in place, and if dropped before it completes (the client went away), spawns
/// the rest of it on the runtime so the work is finished and recorded.
///
/// Cheaper than spawning every attempt up front: no cross-thread hand-off on the common path.
struct FinishOnDrop<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    future: Option<Pin<Box<F>>>,
    runtime: tokio::runtime::Handle,
}

impl<F: Future + Send + 'static> FinishOnDrop<F>
where
    F::Output: Send + 'static,
{
    fn new(future: F) -> Self {
        Self {
            future: Some(Box::pin(future)),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

impl<F: Future + Send + 'static> Future for FinishOnDrop<F>
where
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Pending;
        };
        // A future that panicked must not be polled again, so it is not handed to the runtime.
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.future = None;
                Poll::Ready(output)
            }
            Err(panic) => {
                self.future = None;
                std::panic::resume_unwind(panic)
            }
        }
    }
}

impl<F: Future + Send + 'static> Drop for FinishOnDrop<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(unfinished) = self.future.take() {
            self.runtime.spawn(unfinished);
        }
    }
}

/// `, grpc-status N` when the answer carries one, for the log line of a released key.
fn grpc_status_note(headers: &http::HeaderMap, trailers: &http::HeaderMap) -> String {
    trailers
        .get("grpc-status")
        .or_else(|| headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(|code| format!(", grpc-status {code}"))
        .unwrap_or_default()
}

/// One claimed attempt: the handler, the heartbeat, and the recording of the answer.
struct Attempt<St> {
    store: Arc<St>,
    config: Arc<Config>,
    key: KeyHash,
    token: FencingToken,
    /// Whether the claim holds a lease to renew and release (see [`Mode::LEASED`]).
    leased: bool,
    path: String,
    record: Arc<RequestRecord>,
}

impl<St: Store> Attempt<St> {
    async fn execute<S, M, ReqBody, ResBody>(
        mut self,
        mut inner: S,
        req: Request<ReqBody>,
        attempt: M::Attempt,
    ) -> Result<Response<ResponseBody<ResBody>>, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        M: Mode<St>,
        ResBody: Body<Data = Bytes>,
        ResBody::Error: Into<BoxError>,
    {
        let running = Running {
            durations: self.config.durations.clone(),
            key: self.key,
            start: self.config.durations.started(self.key),
            path: std::mem::take(&mut self.path),
        };
        let work = AssertUnwindSafe(async {
            let response = inner.call(req).await?;
            let (parts, body) = response.into_parts();
            // Trailers are kept with the body: gRPC's outcome (`grpc-status`) is in them.
            let body: Result<(Bytes, http::HeaderMap), BoxError> = body
                .collect()
                .await
                .map(|c| {
                    let trailers = c.trailers().cloned().unwrap_or_default();
                    (c.to_bytes(), trailers)
                })
                .map_err(Into::into);
            Ok::<_, S::Error>((parts, body))
        })
        .catch_unwind();
        let result = tokio::select! {
            biased;
            result = work => result,
            never = self.heartbeat(), if self.leased => match never {},
        };

        let (parts, (body, trailers)) = match result {
            Err(panic) => {
                M::abandon(attempt, self.config.store_timeout).await;
                self.release("the handler panicked").await;
                std::panic::resume_unwind(panic);
            }
            Ok(Err(err)) => {
                M::abandon(attempt, self.config.store_timeout).await;
                self.release("the inner service returned an error").await;
                return Err(err);
            }
            Ok(Ok((parts, Err(err)))) => {
                M::abandon(attempt, self.config.store_timeout).await;
                self.release("the response body failed").await;
                return Ok(Response::from_parts(parts, ResponseBody::failed(err)));
            }
            Ok(Ok((parts, Ok(body)))) => (parts, body),
        };
        // The handler is done: its duration is recorded without the save that follows.
        drop(running);

        if parts.extensions.get::<NotProcessed>().is_some() {
            M::abandon(attempt, self.config.store_timeout).await;
            self.release("the handler marked its answer NotProcessed")
                .await;
            return Ok(Response::from_parts(
                parts,
                ResponseBody::with_trailers(body, trailers),
            ));
        }

        if !self
            .config
            .save
            .should_save_response(parts.status, &parts.headers, &trailers)
        {
            M::abandon(attempt, self.config.store_timeout).await;
            self.release(&format!(
                "the answer (status {}{}) is not saved",
                parts.status.as_u16(),
                grpc_status_note(&parts.headers, &trailers)
            ))
            .await;
            return Ok(Response::from_parts(
                parts,
                ResponseBody::with_trailers(body, trailers),
            ));
        }

        let saved = StoredResponse::new(
            parts.status,
            record::saved_headers(&parts.headers),
            body.clone(),
        )
        .with_trailers(trailers.clone());
        let limit = self.config.store_timeout;
        let finish = M::finish(&self.store, attempt, &self.key, self.token, &saved, limit);
        match observe::timed(self.store.name(), "complete", finish).await {
            Ok(Fenced::Applied) => self.record.finish(Outcome::Saved, &"answer saved"),
            Ok(Fenced::Lost) if M::TRANSACTIONAL => {
                self.record.finish(Outcome::FencedOut, &"the lease was taken over before the commit; the work was rolled back: 409");
                return Ok(reject(Rejection::LeaseLost {
                    retry_after: self.config.lease,
                }));
            }
            Ok(Fenced::Lost) => self.record.finish(
                Outcome::FencedOut,
                &"the lease was taken over before the answer was saved; the answer is sent but not saved",
            ),
            Err(err) if M::TRANSACTIONAL => {
                let rejection = store_rejection(&err);
                self.record.finish(Outcome::StoreError, &format_args!("committing the transaction failed: {}; the work was rolled back: {}", observe::Chain(&err), rejection.status().as_u16()));
                self.release("the commit failed").await;
                return Ok(reject(rejection));
            }
            Err(err) => self.record.finish(
                Outcome::StoreError,
                &format_args!("saving the answer failed: {}; the answer is sent but not saved, and a retry after the lease runs the handler again", observe::Chain(&err)),
            ),
        }
        Ok(Response::from_parts(
            parts,
            ResponseBody::with_trailers(body, trailers),
        ))
    }

    /// Renew the lease every third of it, forever; the caller drops this when the work ends.
    async fn heartbeat(&self) -> std::convert::Infallible {
        let period = self.config.heartbeat();
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let renew = self.store.renew(&self.key, self.token, self.config.lease);
            let renew = bounded("the renewal", self.config.store_timeout, renew);
            match observe::timed(self.store.name(), "renew", renew).await {
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

    async fn release(&self, why: &str) {
        if !self.leased {
            // The claim was made in the rolled-back transaction: it is gone with it.
            self.record.finish(
                Outcome::Released,
                &format_args!("key released with the rollback: {why}"),
            );
            return;
        }
        let release = self.store.release(&self.key, self.token);
        let release = bounded("the release", self.config.store_timeout, release);
        match observe::timed(self.store.name(), "release", release).await {
            Ok(Fenced::Applied) => self
                .record
                .finish(Outcome::Released, &format_args!("key released: {why}")),
            Ok(Fenced::Lost) => self.record.finish(
                Outcome::FencedOut,
                &format_args!("key not released ({why}): the lease was already taken over"),
            ),
            Err(err) => self.record.finish(
                Outcome::StoreError,
                &format_args!(
                    "releasing the key failed ({why}): {}; it frees when the lease lapses",
                    observe::Chain(&err)
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::StatusCode;
    use http_body_util::Full;
    use tower::ServiceExt;

    use super::*;
    use crate::store::MemoryStore;

    fn counting_service(
        count: Arc<AtomicUsize>,
        status: StatusCode,
    ) -> impl Service<
        Request<RequestBody<Full<Bytes>>>,
        Response = Response<Full<Bytes>>,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone {
        tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let mut response = Response::new(Full::new(Bytes::from(format!("run {n}"))));
                *response.status_mut() = status;
                Ok(response)
            }
        })
    }

    fn post(key: &str, body: &'static str) -> Request<Full<Bytes>> {
        Request::post("/orders")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    }

    async fn body_of<B: Body<Data = Bytes>>(response: Response<B>) -> Bytes
    where
        B::Error: fmt::Debug,
    {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_retry_replays_instead_of_running_again() {
        let count = Arc::new(AtomicUsize::new(0));
        let service = IdempotencyService::new(
            counting_service(count.clone(), StatusCode::CREATED),
            MemoryStore::new(),
        );
        let first = service.clone().oneshot(post("k", "a")).await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        assert!(first.headers().get(&crate::REPLAYED_HEADER).is_none());
        assert_eq!(body_of(first).await, "run 1");

        let retry = service.clone().oneshot(post("k", "a")).await.unwrap();
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert_eq!(retry.headers()[&crate::REPLAYED_HEADER], "true");
        assert_eq!(body_of(retry).await, "run 1");

        let reused = service.clone().oneshot(post("k", "b")).await.unwrap();
        assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn try_again_statuses_release_the_key() {
        let count = Arc::new(AtomicUsize::new(0));
        let service = IdempotencyService::new(
            counting_service(count.clone(), StatusCode::TOO_MANY_REQUESTS),
            MemoryStore::new(),
        );
        for _ in 0..2 {
            let response = service.clone().oneshot(post("k", "a")).await.unwrap();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        }
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_not_processed_answer_releases_the_key() {
        let count = Arc::new(AtomicUsize::new(0));
        let handler = {
            let count = count.clone();
            tower::service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                let count = count.clone();
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let mut response = Response::new(Full::new(body.clone()));
                    if body == "bad" {
                        *response.status_mut() = StatusCode::BAD_REQUEST;
                        response.extensions_mut().insert(NotProcessed);
                    } else {
                        *response.status_mut() = StatusCode::CREATED;
                    }
                    Ok::<_, std::convert::Infallible>(response)
                }
            })
        };
        let service = IdempotencyService::new(handler, MemoryStore::new());
        let refused = service.clone().oneshot(post("k", "bad")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        // The corrected body with the same key runs (no 422), and is then saved as usual.
        let fixed = service.clone().oneshot(post("k", "good")).await.unwrap();
        assert_eq!(fixed.status(), StatusCode::CREATED);
        let retry = service.clone().oneshot(post("k", "good")).await.unwrap();
        assert_eq!(retry.headers()[&crate::REPLAYED_HEADER], "true");
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    /// A request body that sends its first bytes, then stalls for ever (a slow client).
    struct StallingBody {
        first: Option<Bytes>,
        stalls: bool,
    }

    impl Body for StallingBody {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            match self.first.take() {
                Some(bytes) => Poll::Ready(Some(Ok(http_body::Frame::data(bytes)))),
                None if self.stalls => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_slower_than_the_timeout_gets_408_and_claims_nothing() {
        let count = Arc::new(AtomicUsize::new(0));
        let handler = {
            let count = count.clone();
            tower::service_fn(move |_req: Request<RequestBody<StallingBody>>| {
                count.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new()))) }
            })
        };
        let layer = Idempotency::new(MemoryStore::new()).with_body_timeout(Duration::from_secs(5));
        let store = layer.store().clone();
        let service = IdempotencyService::from_layer(handler, layer);
        let req = Request::post("/orders")
            .header("idempotency-key", "k")
            .body(StallingBody {
                first: Some(Bytes::from_static(b"{\"a\":")),
                stalls: true,
            })
            .unwrap();
        let started = Instant::now();
        let response = service.clone().oneshot(req).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(
            response.headers()[http::header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert!(store.is_empty(), "nothing was claimed");
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_of_a_duplicate_estimates_the_time_left() {
        let handler = tower::service_fn(|_req: Request<RequestBody<Full<Bytes>>>| async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
        });
        let service = IdempotencyService::from_layer(handler, Idempotency::new(MemoryStore::new()));
        // Teach the estimate: a few attempts of 4 s each.
        for i in 0..20 {
            service
                .clone()
                .oneshot(post(&format!("warm{i}"), ""))
                .await
                .unwrap();
        }
        let first = tokio::spawn(service.clone().oneshot(post("k", "")));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let duplicate = service.clone().oneshot(post("k", "")).await.unwrap();
        assert_eq!(duplicate.status(), StatusCode::CONFLICT);
        // About 2.5 s left of a 4 s attempt, not the 30 s lease.
        assert_eq!(duplicate.headers()[http::header::RETRY_AFTER], "3");
        first.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_full_memory_store_answers_503_store_full() {
        let count = Arc::new(AtomicUsize::new(0));
        let service = IdempotencyService::new(
            counting_service(count.clone(), StatusCode::CREATED),
            MemoryStore::with_capacity(16),
        );
        let mut full = None;
        for i in 0..200 {
            let response = service
                .clone()
                .oneshot(post(&format!("k{i}"), ""))
                .await
                .unwrap();
            if response.status() == StatusCode::SERVICE_UNAVAILABLE {
                full = Some(response);
                break;
            }
        }
        let full = full.expect("a store of 16 records fills up");
        assert!(full.headers().contains_key(http::header::RETRY_AFTER));
        let json: serde_json::Value = serde_json::from_slice(&body_of(full).await).unwrap();
        assert_eq!(json["title"], "Idempotency store full");
        assert!(count.load(Ordering::SeqCst) <= 16);
    }

    #[test]
    fn header_names_are_shown_as_written_in_requests() {
        assert_eq!(display_name(&crate::DEFAULT_HEADER_NAME), "Idempotency-Key");
        assert_eq!(
            display_name(&http::HeaderName::from_static("x-request-key")),
            "X-Request-Key"
        );
    }

    #[tokio::test]
    async fn uncovered_methods_pass_through_without_a_key() {
        let count = Arc::new(AtomicUsize::new(0));
        let service = IdempotencyService::new(
            counting_service(count.clone(), StatusCode::OK),
            MemoryStore::new(),
        );
        let get = Request::get("/orders")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(service.oneshot(get).await.unwrap().status(), StatusCode::OK);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// A recorder that keeps every counter and the sample count of every histogram, by key and
    /// labels.
    #[cfg(feature = "metrics")]
    #[derive(Default)]
    struct Recorded(std::sync::Mutex<std::collections::BTreeMap<String, Arc<Samples>>>);

    #[cfg(feature = "metrics")]
    #[derive(Default)]
    struct Samples(std::sync::atomic::AtomicU64);

    #[cfg(feature = "metrics")]
    impl metrics::CounterFn for Samples {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::SeqCst);
        }
        fn absolute(&self, value: u64) {
            self.0.store(value, Ordering::SeqCst);
        }
    }

    #[cfg(feature = "metrics")]
    impl metrics::HistogramFn for Samples {
        fn record(&self, _: f64) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[cfg(feature = "metrics")]
    impl Recorded {
        fn samples(&self, key: &metrics::Key) -> Arc<Samples> {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            self.0.lock().unwrap().entry(name).or_default().clone()
        }

        fn get(&self, name: &str) -> u64 {
            self.0
                .lock()
                .unwrap()
                .get(name)
                .map_or(0, |s| s.0.load(Ordering::SeqCst))
        }

        fn sum(&self, prefix: &str) -> u64 {
            self.0
                .lock()
                .unwrap()
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, s)| s.0.load(Ordering::SeqCst))
                .sum()
        }
    }

    #[cfg(feature = "metrics")]
    impl metrics::Recorder for Recorded {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            metrics::Counter::from_arc(self.samples(key))
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::from_arc(self.samples(key))
        }
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn every_guarded_request_counts_exactly_one_final_outcome() {
        let recorded = Recorded::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorded, || {
            runtime.block_on(async {
                let created = IdempotencyService::new(
                    counting_service(Arc::new(AtomicUsize::new(0)), StatusCode::CREATED),
                    MemoryStore::new(),
                );
                let limited = IdempotencyService::new(
                    counting_service(Arc::new(AtomicUsize::new(0)), StatusCode::TOO_MANY_REQUESTS),
                    MemoryStore::new(),
                );
                created.clone().oneshot(post("k", "a")).await.unwrap();
                created.clone().oneshot(post("k", "a")).await.unwrap();
                created.clone().oneshot(post("k", "b")).await.unwrap();
                let no_key = Request::post("/orders")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                created.clone().oneshot(no_key).await.unwrap();
                limited.clone().oneshot(post("k", "a")).await.unwrap();
                // Not a covered method: not a guarded request, not counted.
                let get = Request::get("/orders")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                created.clone().oneshot(get).await.unwrap();
            })
        });
        let total = "idempotency_requests_total{outcome=";
        assert_eq!(recorded.get(&format!("{total}saved}}")), 1);
        assert_eq!(recorded.get(&format!("{total}replayed}}")), 1);
        assert_eq!(recorded.get(&format!("{total}mismatch}}")), 1);
        assert_eq!(recorded.get(&format!("{total}rejected}}")), 1);
        assert_eq!(recorded.get(&format!("{total}released}}")), 1);
        assert_eq!(
            recorded.sum(total),
            5,
            "one final outcome per guarded request"
        );
        assert_eq!(
            recorded.get("idempotency_store_duration_seconds{op=claim,store=memory}"),
            4
        );
        assert_eq!(
            recorded.get("idempotency_store_duration_seconds{op=complete,store=memory}"),
            1
        );
        assert_eq!(
            recorded.get("idempotency_store_duration_seconds{op=release,store=memory}"),
            1
        );
    }
}
