//! After the handler: its answer saved (fenced by the run's token; with the handler's work when
//! the mode has a transaction to commit), or nothing saved and the key released.

use std::{pin::Pin, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, Response};

use super::{refuse::reject, run::Lease};
use crate::{
    body::ResponseBody,
    config::Config,
    error::Rejection,
    mode::{Mode, Save, SaveFailure},
    not_processed::NotProcessed,
    observe::{self, Outcome},
    record,
    store::{bounded, Fenced, Store, StoreError, StoredResponse},
};

/// Saves tried before giving up on recording an answer that has no transaction to commit with.
const SAVE_TRIES: u32 = 3;

impl<St: Store> Lease<St> {
    /// A whole answer: saved (or the key released when it is not to be saved), then sent; a
    /// rejection instead when the mode rolled the work back with a failed save.
    pub(super) async fn finish<M: Mode<St>, B>(
        &self,
        run_state: M::RunState,
        parts: http::response::Parts,
        body: Bytes,
        trailers: HeaderMap,
    ) -> Response<ResponseBody<B>> {
        if let Some(why) = not_to_save(&self.config, &parts, &trailers) {
            self.give_up::<M>(run_state, &why).await;
        } else if let Some(rejection) = self.save::<M>(run_state, &parts, &body, &trailers).await {
            return reject(&self.config, rejection);
        }
        Response::from_parts(parts, ResponseBody::with_trailers(body, trailers))
    }

    /// An answer whose body is over the saved-body limit: the body is not kept. Saved in its
    /// place: the status and headers, without the body's own headers (`Content-Length`,
    /// `Content-Type`..), with `Idempotent-Body-Not-Kept: true` and an empty body, so a retry
    /// learns the request was done and how it ended, and fetches the result by other means (its
    /// `Location`, say). The client of this attempt gets the whole body, streamed: the layer
    /// holds at most the limit and one frame of it.
    pub(super) async fn stream_unkept<M: Mode<St>, ResBody>(
        &self,
        run_state: M::RunState,
        parts: http::response::Parts,
        prefix: Bytes,
        rest: Pin<Box<ResBody>>,
    ) -> Response<ResponseBody<ResBody>> {
        // The trailers come after the body: the policy sees none.
        if let Some(why) = not_to_save(&self.config, &parts, &HeaderMap::new()) {
            self.give_up::<M>(run_state, &why).await;
        } else {
            let mut headers = parts.headers.clone();
            for name in record::BODY_HEADERS {
                headers.remove(name);
            }
            headers.insert(
                record::BODY_NOT_KEPT_HEADER,
                http::HeaderValue::from_static("true"),
            );
            let stand_in = parts_with(&parts, headers);
            if let Some(rejection) = self
                .save::<M>(run_state, &stand_in, &Bytes::new(), &HeaderMap::new())
                .await
            {
                return reject(&self.config, rejection);
            }
        }
        Response::from_parts(parts, ResponseBody::prefixed(prefix, rest))
    }

    /// Save the answer (fenced by the token): with the handler's work when the mode has a
    /// transaction to commit, else on its own. `Some` when the client must get a rejection
    /// instead of the answer (the mode rolled the work back with a failed save).
    async fn save<M: Mode<St>>(
        &self,
        run_state: M::RunState,
        parts: &http::response::Parts,
        body: &Bytes,
        trailers: &HeaderMap,
    ) -> Option<Rejection> {
        let headers = record::saved_headers(&parts.headers);
        let response = StoredResponse::new(parts.status, headers, body.clone())
            .with_trailers(trailers.clone());
        let limit = self.config.store_timeout;
        let mut saved_alone = false;
        let save = async {
            let with_work = M::save_with_work(
                run_state,
                Save {
                    store: &self.store,
                    hold: &self.hold,
                    response: &response,
                    limit,
                },
            );
            match with_work.await {
                Some(committed) => committed,
                None => {
                    saved_alone = true;
                    self.save_alone(&response).await
                }
            }
        };
        let err = match observe::timed(self.store.name(), "complete", save).await {
            Ok(Fenced::Applied) => {
                self.record.finish(Outcome::Saved, &"answer saved");
                return None;
            }
            Ok(Fenced::Lost) => None,
            Err(err) => Some(err),
        };
        let failure = err
            .as_ref()
            .map_or(SaveFailure::FencedOut, SaveFailure::Failed);
        // A save alone (no transaction was begun) rolled no work back: the answer is sent and
        // the key kept, as in standard mode, not released for a retry to do the work again.
        let rejection = (!saved_alone)
            .then(|| M::unsaved(&failure, self.superseded_retry_after()))
            .flatten();
        // Boxed: a rare ending, so the flow's future does not carry its room.
        Box::pin(self.report_unsaved(&failure, rejection)).await
    }

    /// When the attempt that took the key over may have its answer (the 409 of a run whose
    /// work rolled back), estimated as for a duplicate in flight on the same path.
    fn superseded_retry_after(&self) -> Duration {
        let lease = self.config.lease;
        self.config
            .retry_after_for(&self.hold.key, self.path(), lease)
    }

    /// One store write, tried up to [`SAVE_TRIES`] times: a save that fails leaves the work
    /// done but unrecorded, so that a retry after the lease would run the handler again.
    async fn save_alone(&self, response: &StoredResponse) -> Result<Fenced, StoreError> {
        let limit = self.config.store_timeout;
        let mut tries = 1;
        loop {
            let complete = self.store.complete(&self.hold, response);
            match bounded("the save", limit, complete).await {
                Err(err) if tries < SAVE_TRIES => {
                    tracing::warn!(target: "tower_idempotency", key = %self.hold.key, error = %observe::Chain(&err), tries, "saving the response failed; trying again");
                    // Boxed: the save's future does not carry a timer's room for the rare retry.
                    Box::pin(tokio::time::sleep(Duration::from_millis(20 << tries))).await;
                    tries += 1;
                }
                result => return result,
            }
        }
    }
}

/// Why an answer is not to be saved (a claimed run's key is released instead, an unguarded
/// run's transaction rolled back), if it is not: the handler marked it [`NotProcessed`], or
/// the save policy refuses it.
pub(super) fn not_to_save(
    config: &Config,
    parts: &http::response::Parts,
    trailers: &HeaderMap,
) -> Option<String> {
    if parts.extensions.get::<NotProcessed>().is_some() {
        return Some("the handler marked its answer NotProcessed".to_owned());
    }
    if config.save.should_save_response(parts, trailers) {
        return None;
    }
    Some(format!(
        "the answer (status {}{}) is not saved",
        parts.status.as_u16(),
        observe::grpc_status_note(&parts.headers, trailers)
    ))
}

/// The status and version of `parts` with other headers (and no extensions, which are not
/// `Clone`).
fn parts_with(parts: &http::response::Parts, headers: HeaderMap) -> http::response::Parts {
    let mut response = Response::new(());
    *response.status_mut() = parts.status;
    *response.version_mut() = parts.version;
    *response.headers_mut() = headers;
    response.into_parts().0
}
