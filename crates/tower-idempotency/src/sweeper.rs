//! Background deletion of expired records.

use std::{sync::Arc, time::Duration};

use crate::store::Store;

/// Records deleted per statement by default: small enough that each delete holds its locks
/// briefly, large enough to clear a backlog quickly.
pub const DEFAULT_SWEEP_BATCH: u32 = 1000;

/// A handle on a background task that deletes expired records. The task stops when the handle
/// is dropped.
#[derive(Debug)]
pub struct Sweeper {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sweeper {
    /// Every `every`, delete expired records from `store` in batches of `batch`, until a batch
    /// comes back short.
    pub fn spawn<St: Store>(store: Arc<St>, every: Duration, batch: u32) -> Self {
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                loop {
                    match store.sweep(batch).await {
                        Ok(deleted) if deleted >= u64::from(batch) => {
                            tokio::task::yield_now().await
                        }
                        Ok(_) => break,
                        Err(err) => {
                            tracing::warn!(target: "tower_idempotency", error = %err, "sweeping expired records failed; trying again next tick");
                            break;
                        }
                    }
                }
            }
        });
        Self { task: Some(task) }
    }

    /// Stop the task and wait until it has stopped.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
