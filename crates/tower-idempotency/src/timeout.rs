//! The layer's bound on every store call (see
//! [`Idempotency::with_store_timeout`](crate::Idempotency::with_store_timeout)).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};

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

/// The time limit of [`within`] passed.
#[derive(Debug)]
pub(crate) struct Elapsed;

/// `future`, or [`Elapsed`] once `limit` has passed since this call: `tokio::time::timeout`,
/// except that the timer is made only if the future does not finish on its first poll. Most
/// calls here finish at once (a memory store, a buffered body), and a tokio timer costs a
/// runtime-handle clone and a timer entry to build and drop.
pub(crate) fn within<F: Future>(limit: Duration, future: F) -> Within<F> {
    Within {
        future,
        deadline: Instant::now().checked_add(limit),
        sleep: None,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`within`].
    pub(crate) struct Within<F> {
        #[pin]
        future: F,
        // `None` when the limit is too far to represent: no timer, as tokio's far future.
        deadline: Option<Instant>,
        // Boxed: a timer is large, and every flow future that awaits a store call would carry
        // its room inline, though most calls never make one.
        sleep: Option<Pin<Box<Sleep>>>,
    }
}

impl<F: Future> Future for Within<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        let Some(deadline) = *this.deadline else {
            return Poll::Pending;
        };
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
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

    #[tokio::test(start_paused = true)]
    async fn the_limit_counts_from_the_call_not_from_the_first_pending_poll() {
        let call = within(Duration::from_secs(1), std::future::pending::<()>());
        tokio::time::advance(Duration::from_millis(999)).await;
        let started = Instant::now();
        assert!(call.await.is_err());
        assert!(Instant::now() - started <= Duration::from_millis(1));
    }

    #[tokio::test]
    async fn a_call_that_answers_in_time_keeps_its_result() {
        let answer = bounded("the claim", Duration::from_secs(1), async { Ok(7) }).await;
        assert_eq!(answer.unwrap(), 7);
    }
}
