//! WAL checkpoints outside the writer queue.
//!
//! In WAL mode SQLite copies the log back into the database file (a checkpoint, with its
//! `fsync`s) by default in the `COMMIT` that takes the log past 1,000 pages, before that
//! `COMMIT` returns. Run in a batch's statement list, the checkpoint would hold the store's
//! writer queue for as long as the disk takes, and every claim and save of the process would wait
//! behind it (measured at 32 workers, standard mode: 2,600 first-time requests/s with it, 3,340
//! with no checkpoint at all). So
//! the batches' connections turn the automatic checkpoint off, and after every
//! [`BATCHES_PER_CHECKPOINT`] committed batches the store runs a passive checkpoint itself, on
//! another of its connections, outside the queue: writers go on meanwhile, as they do beside any
//! passive checkpoint. The log stays bounded even when the store is its only writer. The
//! application's own connections keep their own setting.

use std::sync::{
    atomic::{AtomicBool, AtomicUsize, Ordering},
    Arc,
};

use sqlx::sqlite::Sqlite;

use super::BatchConnections;
use crate::store::{error::StoreError, writers::WriterQueue};

/// Commits of the store (batches, and transactions it saved in) between two checkpoints: each
/// writes a few pages, so a checkpoint comes around the 1,000 pages of SQLite's automatic one,
/// before an application connection's own would come due in its `COMMIT`.
pub(super) const BATCHES_PER_CHECKPOINT: usize = 256;

/// The pragma the batches' connections are opened with.
pub(super) const NO_AUTOMATIC_CHECKPOINT: (&str, &str) = ("wal_autocheckpoint", "0");

/// Starts the store's checkpoints, one at a time.
pub(super) struct Checkpointer {
    connections: Arc<BatchConnections>,
    writers: WriterQueue<Sqlite>,
    committed: AtomicUsize,
    running: Arc<AtomicBool>,
}

impl Checkpointer {
    pub(super) fn new(connections: Arc<BatchConnections>, writers: WriterQueue<Sqlite>) -> Self {
        Self {
            connections,
            writers,
            committed: AtomicUsize::new(0),
            running: Arc::default(),
        }
    }

    /// A batch committed: every [`BATCHES_PER_CHECKPOINT`]th starts a checkpoint in the
    /// background, unless the last one still runs (then the next batch tries again).
    pub(super) fn committed(&self) {
        if self.committed.fetch_add(1, Ordering::Relaxed) + 1 < BATCHES_PER_CHECKPOINT {
            return;
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        self.committed.store(0, Ordering::Relaxed);
        let running = Running(self.running.clone());
        let (connections, writers) = (self.connections.clone(), self.writers.clone());
        tokio::spawn(async move {
            if let Err(err) = checkpoint(&connections, &writers).await {
                tracing::warn!(error = %err, "the SQLite store's WAL checkpoint failed");
            }
            drop(running);
        });
    }
}

/// Clears the running flag however the checkpoint's task ends (a runtime shutting down drops it).
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A passive checkpoint beside the writers, then one more in the writer queue for the pages they
/// wrote meanwhile. SQLite starts the log again from its beginning only at a write that finds
/// every page of it copied; with the store writing all along, the first checkpoint alone would
/// never leave it so, and the log would grow without end.
async fn checkpoint(
    connections: &BatchConnections,
    writers: &WriterQueue<Sqlite>,
) -> Result<(), StoreError> {
    const PASSIVE: &str = "PRAGMA wal_checkpoint(PASSIVE)";
    let mut conn = connections.acquire().await?;
    sqlx::query(PASSIVE).fetch_all(&mut *conn).await?;
    {
        let _turn = writers.turn().await;
        sqlx::query(PASSIVE).fetch_all(&mut *conn).await?;
    }
    connections.park(conn);
    Ok(())
}
