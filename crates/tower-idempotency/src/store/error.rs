//! [`StoreError`]: what went wrong in a store, and its kind. Each backend sorts its own errors
//! into the kinds beside its code (`sql/error.rs` and each SQL backend's `error.rs`,
//! `redis/error.rs`).

use std::{fmt, future::Future, time::Duration};

use crate::timeout::{within, Elapsed};

/// What went wrong in a store.
///
/// Unless fail-open is enabled, the layer answers `503 Service Unavailable` with `Retry-After`
/// for the kinds a retry can cure ([`Unavailable`](StoreErrorKind::Unavailable),
/// [`Conflict`](StoreErrorKind::Conflict) after the layer's own retries, and
/// [`Full`](StoreErrorKind::Full)), and `500 Internal Server Error` for the others, which need
/// an operator. It never shows the source's text to the client; the log carries it.
#[derive(Debug, thiserror::Error)]
#[error("idempotency store {kind}")]
pub struct StoreError {
    pub(super) kind: StoreErrorKind,
    #[source]
    pub(super) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The kind of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend could not be reached or did not answer in time.
    Unavailable,
    /// The backend answered with an error that a retry will not cure (a missing table, a
    /// constraint, a bug).
    Backend,
    /// The backend aborted the operation over a conflict with a concurrent one (a
    /// serialization failure or a deadlock): nothing was written, and the same operation
    /// retried is expected to succeed. The layer retries a claim a few times before answering
    /// 503.
    Conflict,
    /// The store refused the operation before writing anything: it holds as many records as it
    /// may (see [`MemoryStore::with_capacity`](crate::store::MemoryStore::with_capacity)), or a
    /// SQL store's batch queue is full. A refused claim is not released afterwards, since it
    /// holds nothing.
    Full,
    /// A saved record could not be decoded.
    Corrupt,
    /// Running the store's migrations failed.
    Migration,
    /// The store does not implement this operation (a custom store without
    /// [`Store::get`](crate::store::Store::get), [`Store::forget`](crate::store::Store::forget)
    /// or [`Store::stats`](crate::store::Store::stats); `stats` on Redis Cluster).
    Unsupported,
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Backend => "backend error",
            StoreErrorKind::Conflict => "conflict with a concurrent operation",
            StoreErrorKind::Full => "full",
            StoreErrorKind::Corrupt => "record corrupt",
            StoreErrorKind::Migration => "migration failed",
            StoreErrorKind::Unsupported => "operation not supported",
        })
    }
}

impl StoreError {
    /// An error of `kind` caused by `source`.
    pub fn new(
        kind: StoreErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// The store does not implement `operation`.
    pub fn unsupported(operation: &'static str) -> Self {
        Self::new(StoreErrorKind::Unsupported, operation)
    }

    /// A record could not be decoded.
    pub fn corrupt(what: &'static str) -> Self {
        Self::new(StoreErrorKind::Corrupt, what)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The same failure, for each of the operations that shared a failed batch: the kind, and
    /// the source's text.
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
    pub(crate) fn for_each_entry(&self) -> Self {
        match &self.source {
            Some(source) => Self::new(self.kind, source.to_string()),
            None => Self {
                kind: self.kind,
                source: None,
            },
        }
    }

    /// `true` for the kinds a later retry can cure (the layer answers 503 with `Retry-After`):
    /// [`Unavailable`](StoreErrorKind::Unavailable), [`Conflict`](StoreErrorKind::Conflict) and
    /// [`Full`](StoreErrorKind::Full).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Unavailable | StoreErrorKind::Conflict | StoreErrorKind::Full
        )
    }
}

/// The source of a [`StoreError`] for a store call that did not answer within the store timeout.
#[derive(Debug)]
struct TimedOut {
    what: &'static str,
    limit: Duration,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the store did not answer {} within the store timeout of {:?}",
            self.what, self.limit
        )
    }
}

impl std::error::Error for TimedOut {}

/// Run one store call, or give up after `limit` with an [`Unavailable`](StoreErrorKind::Unavailable)
/// error.
///
/// Giving up drops the call's future. The store backends in this crate are cancellation-safe in
/// the sense that matters here: sqlx returns (or closes) a connection whose query was dropped,
/// and the Redis connection manager fails only the dropped request.
///
/// A combinator rather than an `async fn`: an `async fn` keeps its argument and the future it
/// awaits as two copies in its state, and the flow's futures nest several of these.
pub(crate) fn bounded<T>(
    what: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = Result<T, StoreError>> {
    futures_util::FutureExt::map(within(limit, call), move |result| match result {
        Ok(result) => result,
        Err(Elapsed) => Err(StoreError::new(
            StoreErrorKind::Unavailable,
            TimedOut { what, limit },
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_does_not_answer_in_time_is_unavailable() {
        let never = std::future::pending::<Result<(), StoreError>>();
        let err = bounded("the claim", Duration::from_millis(500), never)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable);
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(
            source.contains("the claim") && source.contains("500ms"),
            "{source}"
        );
    }

    #[tokio::test]
    async fn a_call_that_answers_in_time_keeps_its_result() {
        let answer = bounded("the claim", Duration::from_secs(1), async { Ok(7) }).await;
        assert_eq!(answer.unwrap(), 7);
    }
}
