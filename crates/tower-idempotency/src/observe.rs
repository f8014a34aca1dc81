//! Tracing events and metrics for every outcome.
//!
//! Events are emitted under the target `tower_idempotency`, inside a span named `idempotency`
//! that carries the scoped key hash (`key`): never the raw key, the scope or the body.
//!
//! With the `metrics` feature, the counter `idempotency_requests_total` is incremented once per
//! outcome, labelled `outcome`:
//!
//! | outcome | meaning | level |
//! |---|---|---|
//! | `claimed` | new key: the handler runs | debug |
//! | `taken_over` | a dead holder's lapsed lease was taken over: the handler runs | warn |
//! | `replayed` | a saved answer was replayed | debug |
//! | `in_flight` | 409: the first attempt is still running | info |
//! | `waited` | wait mode: a duplicate waited for the first attempt | debug |
//! | `mismatch` | 422: the key was used for a different request | warn |
//! | `saved` | the handler's answer was saved | debug |
//! | `released` | the key was released (not-saved status, inner error or panic) | info |
//! | `fenced_out` | the holder lost its lease before saving: the answer was not saved | warn |
//! | `store_error` | the store failed (503, or fail-open) | error |
//! | `fail_open` | the store failed and the handler ran anyway | warn |
//!
//! and `idempotency_lease_renewals_total` once per heartbeat renewal.

use crate::key::KeyHash;

/// What happened to one request (or one step of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Claimed,
    TakenOver,
    Replayed,
    InFlight,
    Waited,
    Mismatch,
    Saved,
    Released,
    FencedOut,
    StoreError,
    FailOpen,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Claimed => "claimed",
            Outcome::TakenOver => "taken_over",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::Waited => "waited",
            Outcome::Mismatch => "mismatch",
            Outcome::Saved => "saved",
            Outcome::Released => "released",
            Outcome::FencedOut => "fenced_out",
            Outcome::StoreError => "store_error",
            Outcome::FailOpen => "fail_open",
        }
    }
}

/// Record `outcome`: one tracing event at the level the table gives, one counter increment.
pub(crate) fn record(outcome: Outcome, detail: &dyn std::fmt::Display) {
    let name = outcome.as_str();
    match outcome {
        Outcome::Claimed | Outcome::Replayed | Outcome::Waited | Outcome::Saved => {
            tracing::debug!(target: "tower_idempotency", outcome = name, "{detail}")
        }
        Outcome::InFlight | Outcome::Released => {
            tracing::info!(target: "tower_idempotency", outcome = name, "{detail}")
        }
        Outcome::TakenOver | Outcome::Mismatch | Outcome::FencedOut | Outcome::FailOpen => {
            tracing::warn!(target: "tower_idempotency", outcome = name, "{detail}")
        }
        Outcome::StoreError => {
            tracing::error!(target: "tower_idempotency", outcome = name, "{detail}")
        }
    }
    #[cfg(feature = "metrics")]
    metrics::counter!("idempotency_requests_total", "outcome" => name).increment(1);
}

/// An error and its sources, `a: b: c`, for log lines (a store error's own text says only what
/// kind of failure it was; the cause is in its source).
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}

/// Count one lease renewal.
pub(crate) fn renewed() {
    #[cfg(feature = "metrics")]
    metrics::counter!("idempotency_lease_renewals_total").increment(1);
}

/// The span one covered request runs in.
pub(crate) fn span(key: &KeyHash, method: &http::Method, path: &str) -> tracing::Span {
    tracing::info_span!(target: "tower_idempotency", "idempotency", key = %ShortKey(key), %method, path)
}

/// The first 16 hex digits of a key hash: enough to find the record, short in a log line.
/// Formatted only if a subscriber records the span.
struct ShortKey<'a>(&'a KeyHash);

impl std::fmt::Display for ShortKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::key::hex(&self.0 .0[..8]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreError, StoreErrorKind};

    #[test]
    fn log_lines_carry_the_cause_of_a_store_error() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let err = StoreError::new(StoreErrorKind::Unavailable, io);
        assert_eq!(
            Chain(&err).to_string(),
            "idempotency store unavailable: connection refused"
        );
    }
}
