//! A claimed run finishes even when its client goes away: the response future of a covered
//! request, dropped while its claimed run is under way, hands the rest of its flow to the
//! runtime, so the handler runs to the end and its answer is recorded.
//!
//! The flow is one boxed future, and this is what it carries for that: not a second box around
//! the run (a large allocation and a copy of the run's state on every claimed request).

use std::{future::Future, pin::Pin, sync::Arc};

use tokio::runtime::Handle;

use crate::observe::RequestRecord;

/// A boxed flow, as the response future holds it.
pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the response future of a covered request needs to finish its claimed run after a drop.
pub(super) struct FinishOnDrop<T> {
    /// The request's record: it holds the runtime once the claimed run has begun.
    pub(super) record: Arc<RequestRecord>,
    /// Spawns the rest of the flow. A function made where the output is known to be `Send +
    /// 'static`, since the response future's `Drop` cannot ask for bounds of its own.
    pub(super) spawn: fn(BoxFuture<T>, &Handle),
}

impl<T> FinishOnDrop<T> {
    pub(super) fn new(record: Arc<RequestRecord>) -> Self
    where
        T: Send + 'static,
    {
        Self {
            record,
            spawn: spawn_rest::<T>,
        }
    }

    /// Hand `rest` to the runtime if a claimed run is under way; else it is dropped (the request
    /// is cancelled).
    pub(super) fn finish(self, rest: BoxFuture<T>) {
        if let Some(runtime) = self.record.runtime() {
            (self.spawn)(rest, runtime);
        }
    }
}

fn spawn_rest<T: Send + 'static>(rest: BoxFuture<T>, runtime: &Handle) {
    runtime.spawn(rest);
}
