//! The layer's bound on every store call (see
//! [`Idempotency::with_store_timeout`](crate::Idempotency::with_store_timeout)).

use std::{fmt, future::Future, time::Duration};

use crate::store::{StoreError, StoreErrorKind};

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
pub(crate) async fn bounded<T>(
    what: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::new(
            StoreErrorKind::Unavailable,
            TimedOut { what, limit },
        )),
    }
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
