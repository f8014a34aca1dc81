//! Background deletion of expired records.
//!
//! Every store treats an expired record as absent when claiming, so sweeping reclaims space, it
//! does not decide correctness. SQL stores need it (Redis expires its keys by itself): without a
//! sweeper, `idempotency_records` grows by one row per key forever.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use tower_idempotency::{store::MemoryStore, sweeper::DEFAULT_SWEEP_BATCH, Sweeper};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = Arc::new(MemoryStore::new());
//! let sweeper = Sweeper::spawn(store.clone(), Duration::from_secs(60), DEFAULT_SWEEP_BATCH);
//! // ... serve with `Idempotency::from_shared(store)` ...
//! sweeper.stop().await;
//! # }
//! ```

use std::{sync::Arc, time::Duration};

use crate::store::{bounded, record::LONGEST, Store};

/// Records deleted per statement by default: small enough that each delete holds its locks
/// briefly, large enough to clear a backlog quickly.
pub const DEFAULT_SWEEP_BATCH: u32 = 1000;

/// A handle on a background task that deletes expired records.
///
/// The task stops when the handle is dropped, or with [`stop`](Self::stop), which also waits
/// for it. Errors are logged (`tracing`, target `tower_idempotency`) and the next tick tries
/// again: a sweeper never stops on its own.
#[derive(Debug)]
pub struct Sweeper {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sweeper {
    /// Start sweeping `store` on the current tokio runtime: at once, then every `every`.
    ///
    /// Each round deletes expired records `batch` at a time, one [`Store::sweep`] call per batch,
    /// and goes on while batches come back full, yielding between them, so a backlog clears in
    /// bounded steps without one long-running delete. A zero `every` or `batch` is taken as the
    /// smallest useful value (1 ms, 1 record).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, like [`tokio::spawn`].
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use tower_idempotency::{store::MemoryStore, Sweeper};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let sweeper = Sweeper::spawn(Arc::new(MemoryStore::new()), Duration::from_secs(60), 500);
    /// drop(sweeper); // stops the task
    /// # }
    /// ```
    pub fn spawn<St: Store>(store: Arc<St>, every: Duration, batch: u32) -> Self {
        Self::start(store, every, batch, false)
    }

    /// [`spawn`](Self::spawn), and after each round read [`Store::stats`] and set the gauges
    /// `idempotency_records{store, state}` and `idempotency_oldest_running_seconds{store}`
    /// (feature `metrics`): the signal of a stuck key, a handler that hangs while its heartbeat
    /// keeps the lease, which no request counter shows. The alert rules in the repository's
    /// `observability/` use them.
    ///
    /// Reading the stats visits every record (a table scan in SQL, a `SCAN` in Redis): choose
    /// `every` for the size of your table. A store without stats (Redis Cluster, a custom store)
    /// only sweeps; a failed read is logged and tried again next round.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use tower_idempotency::{store::MemoryStore, Sweeper};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = Arc::new(MemoryStore::new());
    /// let sweeper = Sweeper::spawn_with_stats(store, Duration::from_secs(60), 1000);
    /// # drop(sweeper);
    /// # }
    /// ```
    pub fn spawn_with_stats<St: Store>(store: Arc<St>, every: Duration, batch: u32) -> Self {
        Self::start(store, every, batch, true)
    }

    fn start<St: Store>(store: Arc<St>, every: Duration, batch: u32, stats: bool) -> Self {
        let every = every.clamp(Duration::from_millis(1), LONGEST);
        let batch = batch.max(1);
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut stats_supported = stats;
            loop {
                ticks.tick().await;
                sweep_backlog(&*store, batch).await;
                if stats_supported {
                    stats_supported = report_stats(&*store).await;
                }
            }
        });
        Self { task: Some(task) }
    }

    /// Stop the task and wait until it has stopped (a statement in progress is abandoned).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use tower_idempotency::{store::MemoryStore, Sweeper};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let sweeper = Sweeper::spawn(Arc::new(MemoryStore::new()), Duration::from_secs(60), 500);
    /// sweeper.stop().await;
    /// # }
    /// ```
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

/// How long one sweep batch or one stats read may take: unanswered after this (a network that
/// drops packets, a table locked by hand), it is abandoned and the next tick tries again, rather
/// than stopping the sweeper for as long as the connection hangs.
const SWEEP_CALL_LIMIT: Duration = Duration::from_secs(60);

/// One round: sweep batch after batch while they come back full. Returns how many were deleted.
async fn sweep_backlog<St: Store>(store: &St, batch: u32) -> u64 {
    let mut total = 0;
    let mut batches = 0;
    loop {
        batches += 1;
        let sweep = bounded("the sweep", SWEEP_CALL_LIMIT, store.sweep(batch));
        match crate::observe::timed(store.name(), "sweep", sweep).await {
            Ok(deleted) => {
                total += deleted;
                if deleted < u64::from(batch) {
                    if total > 0 {
                        tracing::debug!(target: "tower_idempotency", deleted = total, "swept expired idempotency records");
                    }
                    crate::observe::swept(store.name(), total, batches, false);
                    return total;
                }
                tokio::task::yield_now().await;
            }
            Err(err) => {
                tracing::warn!(target: "tower_idempotency", error = %crate::observe::Chain(&err), "sweeping expired idempotency records failed; trying again next tick");
                crate::observe::swept(store.name(), total, batches, true);
                return total;
            }
        }
    }
}

/// Read the store's stats into the gauges; `false` when the store has none (stop asking).
async fn report_stats<St: Store>(store: &St) -> bool {
    let stats = bounded("the stats", SWEEP_CALL_LIMIT, store.stats());
    match crate::observe::timed(store.name(), "stats", stats).await {
        Ok(stats) => {
            crate::observe::store_stats(store.name(), &stats);
            true
        }
        Err(err) if err.kind() == crate::store::StoreErrorKind::Unsupported => {
            tracing::info!(target: "tower_idempotency", store = store.name(), "this store has no stats: the record gauges are not set");
            false
        }
        Err(err) => {
            tracing::warn!(target: "tower_idempotency", error = %crate::observe::Chain(&err), "reading the idempotency store's stats failed; trying again next round");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use super::*;
    use crate::store::{Claim, ClaimOutcome, Fenced, Hold, StoreError, StoredResponse};

    /// A store with `backlog` expired records and an optional failure, or hang, on the first
    /// call.
    #[derive(Debug, Default)]
    struct Backlog {
        backlog: AtomicU64,
        calls: AtomicU32,
        fail_first: bool,
        hang_first: bool,
    }

    impl Store for Backlog {
        async fn claim(&self, _: &Claim) -> Result<ClaimOutcome, StoreError> {
            unimplemented!()
        }
        async fn renew(&self, _: &Hold, _: Duration) -> Result<Fenced, StoreError> {
            unimplemented!()
        }
        async fn complete(&self, _: &Hold, _: &StoredResponse) -> Result<Fenced, StoreError> {
            unimplemented!()
        }
        async fn release(&self, _: &Hold) -> Result<Fenced, StoreError> {
            unimplemented!()
        }
        async fn sweep(&self, batch: u32) -> Result<u64, StoreError> {
            let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
            if first && self.hang_first {
                // A statement whose answer never comes (a connection that drops packets).
                std::future::pending::<()>().await;
            }
            if first && self.fail_first {
                return Err(StoreError::new(
                    crate::store::StoreErrorKind::Unavailable,
                    "down",
                ));
            }
            let left = self.backlog.load(Ordering::SeqCst);
            let deleted = left.min(u64::from(batch));
            self.backlog.store(left - deleted, Ordering::SeqCst);
            Ok(deleted)
        }
    }

    #[tokio::test]
    async fn a_backlog_is_cleared_in_batches_until_one_comes_back_short() {
        let store = Backlog {
            backlog: AtomicU64::new(2500),
            ..Backlog::default()
        };
        assert_eq!(sweep_backlog(&store, 1000).await, 2500);
        assert_eq!(store.calls.load(Ordering::SeqCst), 3);
        // An exact multiple needs one more call to see the short (empty) batch.
        store.backlog.store(2000, Ordering::SeqCst);
        assert_eq!(sweep_backlog(&store, 1000).await, 2000);
        assert_eq!(store.calls.load(Ordering::SeqCst), 6);
    }

    /// A store with ten expired records.
    fn ten_expired() -> Backlog {
        Backlog {
            backlog: AtomicU64::new(10),
            ..Backlog::default()
        }
    }

    /// A sweeper on `store` every second, in batches of `batch`, until its backlog is gone.
    async fn sweep_every_second_until_none_is_left(store: &Arc<Backlog>, batch: u32) {
        let sweeper = Sweeper::spawn(store.clone(), Duration::from_secs(1), batch);
        while store.backlog.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sweeper.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_logged_and_the_next_tick_tries_again() {
        let store = Arc::new(Backlog {
            fail_first: true,
            ..ten_expired()
        });
        sweep_every_second_until_none_is_left(&store, 0).await;
        // One failed call, then ten batches of one and a final empty batch.
        assert_eq!(store.calls.load(Ordering::SeqCst), 12);
    }

    /// A sweep whose answer never comes is abandoned after its limit, and the next tick sweeps:
    /// the sweeper does not stop for as long as a connection hangs.
    #[tokio::test(start_paused = true)]
    async fn a_sweep_that_hangs_is_abandoned_and_the_next_tick_sweeps() {
        let store = Arc::new(Backlog {
            hang_first: true,
            ..ten_expired()
        });
        let started = tokio::time::Instant::now();
        sweep_every_second_until_none_is_left(&store, 100).await;
        assert!(
            started.elapsed() >= SWEEP_CALL_LIMIT,
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            2,
            "the hung call, then one batch"
        );
    }

    /// A stats round sets the record gauges, the oldest running record's age included; a store
    /// without stats is asked once.
    #[cfg(all(feature = "metrics", feature = "memory"))]
    #[test]
    fn a_stats_round_sets_the_record_gauges() {
        use crate::{key::KeyHash, store::FencingToken};

        let recorder = crate::observe::recorded::Recorded::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let store = crate::store::MemoryStore::new();
        let claim = Claim::new(
            KeyHash([7; 32]),
            crate::fingerprint::Fingerprint::of(&[b"POST"]),
            FencingToken::new(),
            Duration::from_secs(30),
            Duration::from_secs(3600),
        );
        let (reported, unsupported) = metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                store.claim(&claim).await.unwrap();
                tokio::time::advance(Duration::from_secs(90)).await;
                (
                    report_stats(&store).await,
                    report_stats(&Backlog::default()).await,
                )
            })
        });
        assert!(reported, "the memory store has stats");
        assert!(!unsupported, "a store without stats is not asked again");
        let seen = recorder.gauges();
        let value = |name: &str| {
            seen.iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("{name} not set: {seen:?}"))
        };
        assert_eq!(
            value("idempotency_records{store=memory,state=running}"),
            1.0
        );
        assert_eq!(value("idempotency_records{store=memory,state=done}"), 0.0);
        assert_eq!(
            value("idempotency_records{store=memory,state=expired}"),
            0.0
        );
        assert_eq!(
            value("idempotency_oldest_running_seconds{store=memory}"),
            90.0
        );
    }
}
