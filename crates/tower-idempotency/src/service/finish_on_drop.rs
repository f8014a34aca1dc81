//! [`FinishOnDrop`]: a future that, dropped before it completes, finishes on the runtime.

use std::{
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    task::{Context, Poll},
};

/// Polls a claimed run in place, and if dropped before it completes (the client went away), spawns
/// the rest of it on the runtime so the work is finished and recorded.
///
/// Cheaper than spawning every attempt up front: no cross-thread hand-off on the common path.
pub(super) struct FinishOnDrop<F: Future + Send + 'static>
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
    pub(super) fn new(future: F) -> Self {
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
