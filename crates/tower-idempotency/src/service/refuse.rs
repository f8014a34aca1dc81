//! The answers the layer makes itself: every refusal is a [`Rejection`] rendered as
//! problem+json (or the user's own response) by [`reject`], with its log line.

use std::time::Duration;

use http::Response;

use crate::{
    body::ResponseBody,
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
    let retry_after = config.retry_after_for(key_hash, path, lease_remaining);
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

/// The store could not claim, and the layer fails closed: 503 (or 500 for a store that is
/// misconfigured or holds what it cannot read). Fail-open runs the handler instead
/// (`unguarded.rs`).
pub(super) fn store_failed<B>(
    config: &Config,
    err: &StoreError,
    record: &RequestRecord,
) -> Response<ResponseBody<B>> {
    let rejection = Rejection::for_store_error(err);
    record.finish(
        Outcome::StoreError,
        &format_args!(
            "store failed: {}; answering {}",
            observe::Chain(err),
            rejection.status().as_u16()
        ),
    );
    reject(config, rejection)
}
