//! The answers the layer makes itself: every refusal is a [`Rejection`] rendered as
//! problem+json (or the user's own response) by [`reject`], with its log line.

use std::time::Duration;

use http::{Request, Response};
use tower_service::Service;

use super::bundle::pass_through;
use crate::{
    body::{RequestBody, ResponseBody},
    config::Config,
    error::Rejection,
    key::KeyHash,
    observe::{self, Outcome, RequestRecord},
    store::StoreError,
};

/// The layer's answer for `rejection`.
pub(super) fn reject<B>(config: &Config, rejection: Rejection) -> Response<ResponseBody<B>> {
    crate::error::render(
        &config.problem_type_base,
        config.rejection_response.as_deref(),
        rejection,
    )
    .map(ResponseBody::from_full)
}

/// A request the layer answers itself before claiming anything: the answer and its log line.
pub(super) struct Refusal {
    pub(super) rejection: Rejection,
    pub(super) note: &'static str,
}

impl Refusal {
    pub(super) fn answer<B>(
        self,
        config: &Config,
        record: &RequestRecord,
    ) -> Response<ResponseBody<B>> {
        record.finish(Outcome::Rejected, &self.note);
        reject(config, self.rejection)
    }
}

/// The first attempt is still running: 409 with a `Retry-After` estimated from the lease left
/// and the path's recent durations.
pub(super) fn in_flight<B>(
    config: &Config,
    key_hash: &KeyHash,
    path: &str,
    lease_remaining: Duration,
    record: &RequestRecord,
) -> Response<ResponseBody<B>> {
    record.finish(
        Outcome::InFlight,
        &"the first attempt is still running: 409",
    );
    let retry_after =
        config
            .durations
            .retry_after(config.retry_after, key_hash, path, lease_remaining);
    reject(config, Rejection::InFlight { retry_after })
}

/// The key was first used for a different request: 422.
pub(super) fn mismatch<B>(config: &Config, record: &RequestRecord) -> Response<ResponseBody<B>> {
    record.finish(
        Outcome::Mismatch,
        &"the key was first used for a different request: 422",
    );
    reject(config, Rejection::KeyReused)
}

/// The store could not claim: 503 or 500 (fail closed), or with fail-open the handler without a
/// claim.
pub(super) async fn store_failed<S, ReqBody, ResBody>(
    inner: S,
    config: &Config,
    req: Request<RequestBody<ReqBody>>,
    err: &StoreError,
    record: &RequestRecord,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
{
    if !config.fail_open {
        let rejection = Rejection::for_store_error(err);
        record.finish(
            Outcome::StoreError,
            &format_args!(
                "store failed: {}; answering {}",
                observe::Chain(err),
                rejection.status().as_u16()
            ),
        );
        return Ok(reject(config, rejection));
    }
    record.finish(
        Outcome::FailOpen,
        &format_args!(
            "store failed ({}); calling the handler without idempotency (fail-open)",
            observe::Chain(err)
        ),
    );
    pass_through(inner, req).await
}
