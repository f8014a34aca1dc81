//! A time limit that costs nothing until the limited future is pending: the layer's bound on
//! every store call (see [`Idempotency::with_store_timeout`](crate::Idempotency::with_store_timeout)
//! and `store::error::bounded`) and on reading a body.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};

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
    async fn the_limit_counts_from_the_call_not_from_the_first_pending_poll() {
        let call = within(Duration::from_secs(1), std::future::pending::<()>());
        tokio::time::advance(Duration::from_millis(999)).await;
        let started = Instant::now();
        assert!(call.await.is_err());
        assert!(Instant::now() - started <= Duration::from_millis(1));
    }
}
