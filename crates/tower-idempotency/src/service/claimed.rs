//! The claimed run: the handler runs under a heartbeat, then its answer is saved or the key
//! released.

use std::{panic::AssertUnwindSafe, sync::Arc};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tower_service::Service;

use super::{heartbeat, reject, store_rejection};
use crate::{
    body::ResponseBody,
    config::Config,
    error::Rejection,
    key::KeyHash,
    mode::Mode,
    not_processed::NotProcessed,
    observe::{self, Outcome, RequestRecord},
    record,
    retry_after::Running,
    store::{Fenced, FencingToken, Store, StoredResponse},
    timeout::bounded,
    BoxError,
};

/// The handler's run once the key is claimed: what it needs to renew, save and release.
pub(super) struct ClaimedRun<St> {
    pub(super) store: Arc<St>,
    pub(super) config: Arc<Config>,
    pub(super) key: KeyHash,
    pub(super) token: FencingToken,
    /// Whether the claim holds a lease to renew and release (see [`Mode::LEASED`]).
    pub(super) leased: bool,
    /// The request's path, for the Retry-After estimate of its duplicates.
    pub(super) path: String,
    pub(super) record: Arc<RequestRecord>,
}

/// The handler's answer, its body and trailers collected; or why there is none.
type HandlerResult<E> = Result<(http::response::Parts, Result<(Bytes, HeaderMap), BoxError>), E>;

impl<St: Store> ClaimedRun<St> {
    /// Run the handler (renewing the lease meanwhile), then save its answer, or release the key
    /// when there is nothing to save.
    pub(super) async fn execute<S, M, ReqBody, ResBody>(
        mut self,
        inner: S,
        req: Request<ReqBody>,
        mode_state: M::Attempt,
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
        let result = tokio::select! {
            biased;
            result = AssertUnwindSafe(call_handler(inner, req)).catch_unwind() => result,
            never = heartbeat::renew_forever(&self), if self.leased => match never {},
        };
        let (parts, (body, trailers)) = match result {
            Err(panic) => {
                self.give_up::<M>(mode_state, "the handler panicked").await;
                std::panic::resume_unwind(panic);
            }
            Ok(Err(err)) => {
                let why = "the inner service returned an error";
                self.give_up::<M>(mode_state, why).await;
                return Err(err);
            }
            Ok(Ok((parts, Err(err)))) => {
                self.give_up::<M>(mode_state, "the response body failed")
                    .await;
                return Ok(Response::from_parts(parts, ResponseBody::failed(err)));
            }
            Ok(Ok((parts, Ok(body)))) => (parts, body),
        };
        // The handler is done: its duration is recorded without the save that follows.
        drop(running);

        if let Some(why) = self.not_to_save(&parts, &trailers) {
            self.give_up::<M>(mode_state, &why).await;
        } else if let Some(rejection) = self.save::<M>(mode_state, &parts, &body, &trailers).await {
            return Ok(reject(rejection));
        }
        Ok(Response::from_parts(
            parts,
            ResponseBody::with_trailers(body, trailers),
        ))
    }

    /// Why the answer is not to be saved (the key is released instead), if it is not: the handler
    /// marked it [`NotProcessed`], or the save policy refuses it.
    fn not_to_save(&self, parts: &http::response::Parts, trailers: &HeaderMap) -> Option<String> {
        if parts.extensions.get::<NotProcessed>().is_some() {
            return Some("the handler marked its answer NotProcessed".to_owned());
        }
        let policy = &self.config.save;
        if policy.should_save_response(parts.status, &parts.headers, trailers) {
            return None;
        }
        Some(format!(
            "the answer (status {}{}) is not saved",
            parts.status.as_u16(),
            grpc_status_note(&parts.headers, trailers)
        ))
    }

    /// Save the answer (fenced by the token). `Some` when the client must get a rejection
    /// instead of the answer: in transactional mode a failed save rolled the work back.
    async fn save<M: Mode<St>>(
        &self,
        mode_state: M::Attempt,
        parts: &http::response::Parts,
        body: &Bytes,
        trailers: &HeaderMap,
    ) -> Option<Rejection> {
        let headers = record::saved_headers(&parts.headers);
        let saved = StoredResponse::new(parts.status, headers, body.clone())
            .with_trailers(trailers.clone());
        let limit = self.config.store_timeout;
        let finish = M::finish(
            &self.store,
            mode_state,
            &self.key,
            self.token,
            &saved,
            limit,
        );
        match observe::timed(self.store.name(), "complete", finish).await {
            Ok(Fenced::Applied) => self.record.finish(Outcome::Saved, &"answer saved"),
            Ok(Fenced::Lost) if M::TRANSACTIONAL => {
                self.record.finish(Outcome::FencedOut, &"the lease was taken over before the commit; the work was rolled back: 409");
                return Some(Rejection::LeaseLost {
                    retry_after: self.config.lease,
                });
            }
            Ok(Fenced::Lost) => self.record.finish(
                Outcome::FencedOut,
                &"the lease was taken over before the answer was saved; the answer is sent but not saved",
            ),
            Err(err) if M::TRANSACTIONAL => {
                let rejection = store_rejection(&err);
                self.record.finish(Outcome::StoreError, &format_args!("committing the transaction failed: {}; the work was rolled back: {}", observe::Chain(&err), rejection.status().as_u16()));
                self.release("the commit failed").await;
                return Some(rejection);
            }
            Err(err) => self.record.finish(
                Outcome::StoreError,
                &format_args!("saving the answer failed: {}; the answer is sent but not saved, and a retry after the lease runs the handler again", observe::Chain(&err)),
            ),
        }
        None
    }

    /// Nothing is saved: undo the mode's uncommitted work, then free the key for a retry.
    async fn give_up<M: Mode<St>>(&self, mode_state: M::Attempt, why: &str) {
        M::abandon(mode_state, self.config.store_timeout).await;
        self.release(why).await;
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

/// The handler's answer with its body collected; trailers are kept with the body, since gRPC's
/// outcome (`grpc-status`) is in them.
async fn call_handler<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<ReqBody>,
) -> HandlerResult<S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = inner.call(req).await?.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| {
            let trailers = c.trailers().cloned().unwrap_or_default();
            (c.to_bytes(), trailers)
        })
        .map_err(Into::into);
    Ok((parts, body))
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
