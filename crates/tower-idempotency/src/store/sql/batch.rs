//! Group commit: concurrent requests share one statement and one commit.
//!
//! A first-time key costs the SQL stores a claim and a save. Run one by one, each is a statement
//! and a commit of its own, and the database's commit rate, not the layer, sets the ceiling. A
//! [`Batcher`] queues the operations of concurrent requests and runs them together: one statement
//! for all the claims in a batch (PostgreSQL: `INSERT .. SELECT .. FROM unnest(..) ON CONFLICT ..
//! RETURNING`), one transaction for all the writes (SQLite), then hands every request its own
//! outcome.
//!
//! # No timer
//!
//! A batch is whatever arrived while the previous batches were in the database. A driver task
//! takes the first queued operation, waits for a free pipeline slot, then takes everything else
//! queued (up to [`Batching::max_batch`]) and runs it. A lone request finds a free slot and an
//! empty queue, so it waits for nothing but one hop to the driver; under load, the requests that
//! arrive during one round trip share the next.
//!
//! # Why a shared statement is as safe as one per request
//!
//! Each entry of a batch is judged by the same rules as a statement of its own: the primary key's
//! conflict check decides who holds a key, per row, and the fencing token is checked per row. A
//! batch never holds two entries for one key in one statement: the first one is run, and a later
//! one with the same fingerprint is answered exactly as a concurrent duplicate arriving at the same
//! instant (see each store's runner), or runs in a later round of the same batch. An error of a
//! round's statement fails every entry it was to answer, each with a transient error the layer
//! answers 503: nothing of the round is applied, because the statement (or the transaction) is
//! one unit. Entries that an earlier round of the batch answered keep their answers: that round
//! committed, and what they were told is what the table holds.
//!
//! # Dropped requests
//!
//! A request dropped while queued (its client went away, or the layer's store timeout fired) is
//! left out of the batch. One dropped while its claim ran may have won the key: the store then
//! releases that claim, token-checked, so the key is free at once rather than after its lease.

use std::{
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::store::{
    error::{StoreError, StoreErrorKind},
    record::{Claim, ClaimOutcome, LONGEST},
    waiters::lock,
};

/// How a SQL store batches the operations of concurrent requests (group commit).
///
/// The defaults were measured on a 2-core machine with PostgreSQL 15 and SQLite (see the
/// project's benchmark results): batches of up to 128, one batch in the database at once (the
/// next one gathers meanwhile, so batches grow with the load instead of splitting it), and a
/// queue of 4,096 operations.
///
/// ```
/// use tower_idempotency::store::Batching;
///
/// let batching = Batching::default().max_batch(64).pipeline(4).queue(10_000);
/// assert_eq!(batching.max_batch_size(), 64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    max_batch: usize,
    pipeline: usize,
    queue: usize,
    timeout: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            max_batch: 128,
            pipeline: 1,
            queue: 4096,
            timeout: DEFAULT_BATCH_TIMEOUT,
        }
    }
}

/// How long a batch may take by default: as long as the layer waits for a store call by
/// default ([`DEFAULT_STORE_TIMEOUT`](crate::DEFAULT_STORE_TIMEOUT)); past that, nobody
/// waits for its answers any more.
pub const DEFAULT_BATCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The most batches [`Batching::pipeline`] lets into the database at once: far more than any
/// pool has connections.
pub const MAX_PIPELINE: usize = 1024;

impl Batching {
    /// At most `size` operations share one statement (at least 1; 1 turns batching off, each
    /// operation still going through the queue).
    pub fn max_batch(mut self, size: usize) -> Self {
        self.max_batch = size.max(1);
        self
    }

    /// At most `batches` batches are in the database at once (at least 1, at most
    /// [`MAX_PIPELINE`]). More than the pool's connections only makes batches wait for a
    /// connection.
    pub fn pipeline(mut self, batches: usize) -> Self {
        self.pipeline = batches.clamp(1, MAX_PIPELINE);
        self
    }

    /// At most `operations` wait in the queue (at least 1); one more claim is refused at once
    /// with [`StoreErrorKind::Full`], which the layer answers 503 with `Retry-After`, before
    /// its handler runs. What follows a claim already made (its save, renewals and release) is
    /// never refused: refusing it would lose a handler's answer or its lease. Those wait past
    /// the bound; their number follows the requests holding a claim (one operation each at a
    /// time, and those whose caller stopped waiting, left out when their batch forms).
    pub fn queue(mut self, operations: usize) -> Self {
        self.queue = operations.max(1);
        self
    }

    /// A batch still running after `timeout` (at least 1 ms, at most 100 years) is abandoned
    /// (default [`DEFAULT_BATCH_TIMEOUT`]): each of its operations fails as
    /// [`StoreErrorKind::Unavailable`], and its pipeline slot goes to the next batch, so a
    /// statement that hangs (a connection whose packets are lost) holds up the queue for at most
    /// this long. A claim of such a batch that did commit is held by nobody until its lease passes.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.clamp(Duration::from_millis(1), LONGEST);
        self
    }

    /// The largest batch.
    pub fn max_batch_size(&self) -> usize {
        self.max_batch
    }

    /// How many batches may be in the database at once.
    pub fn pipeline_depth(&self) -> usize {
        self.pipeline
    }

    /// How many operations may wait.
    pub fn queue_capacity(&self) -> usize {
        self.queue
    }

    /// How long a batch may run.
    pub fn batch_timeout(&self) -> Duration {
        self.timeout
    }
}

/// How much a store's batching has shared, counted since the store was made (all operations:
/// claims, saves, releases and renewals).
///
/// ```
/// use tower_idempotency::store::BatchStats;
///
/// let stats = BatchStats { batches: 4, entries: 100 };
/// assert_eq!(stats.mean_batch(), 25.0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batches run.
    pub batches: u64,
    /// Operations run in them.
    pub entries: u64,
}

impl BatchStats {
    /// Operations per batch, on average (0 before the first batch).
    pub fn mean_batch(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.entries as f64 / self.batches as f64
        }
    }
}

impl std::ops::Sub for BatchStats {
    type Output = BatchStats;

    /// The batches run between two readings.
    fn sub(self, earlier: BatchStats) -> BatchStats {
        BatchStats {
            batches: self.batches.saturating_sub(earlier.batches),
            entries: self.entries.saturating_sub(earlier.entries),
        }
    }
}

/// Shared counters behind [`BatchStats`], one per store.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    batches: AtomicU64,
    entries: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> BatchStats {
        BatchStats {
            batches: self.batches.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
        }
    }

    fn count(&self, entries: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.entries.fetch_add(entries as u64, Ordering::Relaxed);
    }
}

/// What a claim is answered when an earlier claim of the same key with the same fingerprint ran
/// in the same round of a batch (`outcome`): in flight behind a fresh claim, for the whole lease,
/// or the same answer, as a duplicate arriving at the same instant would be.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn duplicate_of(outcome: &ClaimOutcome, first: &Claim) -> ClaimOutcome {
    match outcome {
        ClaimOutcome::Claimed { .. } => ClaimOutcome::in_flight(first.lease),
        other => other.clone(),
    }
}

/// Each entry's result once a batch's rounds stopped: its answer, kept even when a later round
/// failed (the round that gave it committed), or for an entry no round answered, the failed
/// round's error (each entry its own copy), else `left` (no round failed, yet none answered
/// it). The caller fails the whole batch instead when no round answered anything.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn answers_after_rounds<T>(
    answers: impl IntoIterator<Item = Option<Result<T, StoreError>>>,
    failed: Option<&StoreError>,
    left: impl Fn() -> StoreError,
) -> Vec<Result<T, StoreError>> {
    let unanswered = || failed.map_or_else(&left, StoreError::for_each_entry);
    answers
        .into_iter()
        .map(|answer| answer.unwrap_or_else(|| Err(unanswered())))
        .collect()
}

/// What runs one batch of one kind of operation against the database.
pub(crate) trait Runner: Send + Sync + 'static {
    /// One queued operation.
    type Entry: Send + Sync + 'static;
    /// Its outcome.
    type Output: Send + 'static;

    /// Run `entries` together; one result per entry, in order. An `Err` fails the whole batch,
    /// so it is for a failure before anything was committed.
    fn run(
        &self,
        entries: &[Self::Entry],
    ) -> impl Future<Output = Result<Vec<Result<Self::Output, StoreError>>, StoreError>> + Send;

    /// `true` for a runner whose batches only read: a request that finds no batch running and
    /// nothing queued runs its own batch of one in its own task, skipping the hop to the driver.
    /// A writer never does, because its batch must finish (and undo a claim whose request is
    /// gone) even if the request is dropped halfway.
    const INLINE_WHEN_IDLE: bool = false;

    /// `entry` ran, but the request that queued it is gone: undo what needs undoing (a claim
    /// that won is released).
    fn abandoned(self: &Arc<Self>, entry: Self::Entry, output: Self::Output) {
        let _ = (entry, output);
    }

    /// The whole batch failed (a lost connection, a timeout): a runner on connections of its
    /// own may stop trusting the idle ones.
    fn failed(&self) {}

    /// Whether a full queue may refuse `entry`: a new claim may (nothing has run for it yet);
    /// the save, renewal or release of a claim already held may not.
    fn refusable(entry: &Self::Entry) -> bool {
        let _ = entry;
        true
    }

    /// The bytes `entry` adds to its batch's statement (a saved answer's body): a batch stops
    /// taking entries at [`MAX_BATCH_BYTES`], so that large answers do not make one statement
    /// too large for the database, failing every entry that shares it.
    fn bytes(entry: &Self::Entry) -> usize {
        let _ = entry;
        0
    }
}

/// The most bytes of saved answers one batch carries: far below PostgreSQL's 1 GB for one
/// message and SQLite's 1,000,000,000 for one value, with room for SQLite's hex. An entry larger
/// than this alone still runs, in a batch of its own.
pub(crate) const MAX_BATCH_BYTES: usize = 64 << 20;

struct Pending<R: Runner> {
    entry: R::Entry,
    reply: oneshot::Sender<Result<R::Output, StoreError>>,
}

/// The queue and driver of one kind of operation.
pub(crate) struct Batcher<R: Runner> {
    runner: Arc<R>,
    settings: Batching,
    counters: Arc<Counters>,
    /// The queue to the driver task; started on first use, and again if its runtime went away.
    /// Unbounded as a channel: `queued` bounds what [`Runner::refusable`] lets it refuse.
    queue: Mutex<Option<mpsc::UnboundedSender<Pending<R>>>>,
    /// Operations in the queue, not yet taken into a batch.
    queued: Arc<AtomicUsize>,
    /// The pipeline's slots, one per batch in the database.
    slots: Arc<Semaphore>,
}

impl<R: Runner> fmt::Debug for Batcher<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<R: Runner> Batcher<R> {
    pub(crate) fn new(runner: R, settings: Batching, counters: Arc<Counters>) -> Self {
        Self {
            runner: Arc::new(runner),
            settings,
            counters,
            queue: Mutex::new(None),
            queued: Arc::default(),
            slots: Arc::new(Semaphore::new(settings.pipeline)),
        }
    }

    /// Queue `entry` and wait for its outcome.
    pub(crate) async fn submit(&self, entry: R::Entry) -> Result<R::Output, StoreError> {
        if R::INLINE_WHEN_IDLE && self.idle() {
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                self.counters.count(1);
                let ran = run_bounded(&self.runner, std::slice::from_ref(&entry), &self.settings);
                let outcome = ran.await.and_then(|mut outcomes| {
                    outcomes.pop().unwrap_or_else(|| {
                        Err(StoreError::corrupt("a batch of one answered nothing"))
                    })
                });
                drop(slot);
                return outcome;
            }
        }
        let (reply, answer) = oneshot::channel();
        self.enqueue(Pending { entry, reply })?;
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the batch this operation was in stopped before it answered",
            ))
        })
    }

    /// Nothing is queued (or the queue is not started yet).
    fn idle(&self) -> bool {
        self.queued.load(Ordering::Relaxed) == 0
    }

    fn enqueue(&self, pending: Pending<R>) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        // The driver's runtime shut down (a store shared across runtimes): what its queue held
        // went with it, so it counts no more, and a driver starts anew below.
        if queue.as_ref().is_some_and(mpsc::UnboundedSender::is_closed) {
            *queue = None;
            self.queued.store(0, Ordering::Relaxed);
        }
        if R::refusable(&pending.entry)
            && self.queued.load(Ordering::Relaxed) >= self.settings.queue
        {
            return Err(StoreError::new(
                StoreErrorKind::Full,
                "the store's batch queue is full",
            ));
        }
        // Counted before it is sent, so the driver never takes more than was counted.
        self.queued.fetch_add(1, Ordering::Relaxed);
        let pending = match queue.as_ref() {
            Some(sender) => match sender.send(pending) {
                Ok(()) => return Ok(()),
                // Closed since the check above: start anew as there.
                Err(mpsc::error::SendError(pending)) => pending,
            },
            None => pending,
        };
        self.queued.store(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(drive(
            receiver,
            self.runner.clone(),
            self.settings,
            self.counters.clone(),
            self.slots.clone(),
            self.queued.clone(),
        ));
        let _ = sender.send(pending);
        *queue = Some(sender);
        Ok(())
    }
}

/// Run `entries`, failing them all as unavailable past the batch timeout.
async fn run_bounded<R: Runner>(
    runner: &Arc<R>,
    entries: &[R::Entry],
    settings: &Batching,
) -> Result<Vec<Result<R::Output, StoreError>>, StoreError> {
    let limit = settings.timeout;
    tokio::time::timeout(limit, runner.run(entries))
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("a batch took longer than {limit:?}"),
            ))
        })
        .inspect_err(|_| runner.failed())
}

/// Take batches off the queue and run them, at most `settings.pipeline` at once, until every
/// sender is gone.
async fn drive<R: Runner>(
    mut queue: mpsc::UnboundedReceiver<Pending<R>>,
    runner: Arc<R>,
    settings: Batching,
    counters: Arc<Counters>,
    slots: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
) {
    // The entry that would have made the last batch too large: the next one starts with it.
    let mut carried: Option<Pending<R>> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match queue.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        // While every slot is busy, the next batch gathers in the queue.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = Vec::with_capacity(settings.max_batch.min(queue.len() + 1));
        let mut bytes = R::bytes(&first.entry);
        batch.push(first);
        while batch.len() < settings.max_batch {
            let Ok(pending) = queue.try_recv() else {
                break;
            };
            bytes = bytes.saturating_add(R::bytes(&pending.entry));
            if bytes > MAX_BATCH_BYTES {
                carried = Some(pending);
                break;
            }
            batch.push(pending);
        }
        // A carried entry is still queued: it is counted when its batch takes it.
        queued.fetch_sub(batch.len(), Ordering::Relaxed);
        batch.retain(|pending| !pending.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        counters.count(batch.len());
        let runner = runner.clone();
        tokio::spawn(async move {
            run_batch(&runner, batch, &settings).await;
            drop(slot);
        });
    }
}

async fn run_batch<R: Runner>(runner: &Arc<R>, batch: Vec<Pending<R>>, settings: &Batching) {
    let (entries, replies): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|pending| (pending.entry, pending.reply))
        .unzip();
    let ran = run_bounded(runner, &entries, settings).await;
    match ran {
        Ok(outputs) => {
            for ((entry, reply), output) in entries.into_iter().zip(replies).zip(outputs) {
                if let Err(Ok(output)) = reply.send(output) {
                    runner.abandoned(entry, output);
                }
            }
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.for_each_entry()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Doubles numbers; when gated, each batch takes a permit of `gate` first, so a test decides
    /// when it finishes.
    struct Doubler {
        gate: Semaphore,
        gated: bool,
        sizes: Mutex<Vec<usize>>,
        abandoned: Mutex<Vec<u32>>,
    }

    impl Default for Doubler {
        fn default() -> Self {
            Self {
                gate: Semaphore::new(0),
                gated: false,
                sizes: Mutex::default(),
                abandoned: Mutex::default(),
            }
        }
    }

    impl Runner for Doubler {
        type Entry = u32;
        type Output = u32;

        async fn run(&self, entries: &[u32]) -> Result<Vec<Result<u32, StoreError>>, StoreError> {
            lock(&self.sizes).push(entries.len());
            if self.gated {
                self.gate.acquire().await.expect("gate open").forget();
            }
            if entries.contains(&13) {
                return Err(StoreError::new(StoreErrorKind::Unavailable, "unlucky"));
            }
            Ok(entries.iter().map(|n| Ok(n * 2)).collect())
        }

        fn abandoned(self: &Arc<Self>, entry: u32, _: u32) {
            lock(&self.abandoned).push(entry);
        }

        /// Numbers from 100 on stand for what follows a claim (a save, a renewal, a release).
        fn refusable(entry: &u32) -> bool {
            *entry < 100
        }

        /// Numbers from 1,000 on stand for saves of 40 MiB answers.
        fn bytes(entry: &u32) -> usize {
            if *entry >= 1000 {
                40 << 20
            } else {
                0
            }
        }
    }

    fn batcher(runner: Doubler, settings: Batching) -> Arc<Batcher<Doubler>> {
        Arc::new(Batcher::new(runner, settings, Arc::default()))
    }

    #[tokio::test]
    async fn a_lone_operation_runs_alone_and_gets_its_own_answer() {
        let batcher = batcher(Doubler::default(), Batching::default());
        assert_eq!(batcher.submit(21).await.unwrap(), 42);
        assert_eq!(*lock(&batcher.runner.sizes), [1]);
        assert_eq!(
            batcher.counters.snapshot(),
            BatchStats {
                batches: 1,
                entries: 1
            }
        );
    }

    /// Queue `n` at once (no task to schedule), keeping the receiver of its answer.
    fn queue(batcher: &Batcher<Doubler>, n: u32) -> oneshot::Receiver<Result<u32, StoreError>> {
        let (reply, answer) = oneshot::channel();
        batcher
            .enqueue(Pending { entry: n, reply })
            .expect("queued");
        answer
    }

    /// Let the driver run until `done` holds.
    async fn until(done: impl Fn() -> bool) {
        while !done() {
            tokio::task::yield_now().await;
        }
    }

    fn gated() -> Doubler {
        Doubler {
            gated: true,
            ..Doubler::default()
        }
    }

    #[tokio::test]
    async fn what_queues_while_a_batch_runs_shares_the_next_one() {
        let batcher = batcher(gated(), Batching::default().pipeline(1).max_batch(8));
        let first = queue(&batcher, 1);
        until(|| !lock(&batcher.runner.sizes).is_empty()).await;
        let rest: Vec<_> = (2..=11).map(|n| queue(&batcher, n)).collect();
        batcher.runner.gate.add_permits(3);
        assert_eq!(first.await.unwrap().unwrap(), 2);
        for (n, answer) in (2..=11).zip(rest) {
            assert_eq!(answer.await.unwrap().unwrap(), n * 2);
        }
        assert_eq!(*lock(&batcher.runner.sizes), [1, 8, 2]);
        assert_eq!(
            batcher.counters.snapshot(),
            BatchStats {
                batches: 3,
                entries: 11
            }
        );
    }

    #[tokio::test]
    async fn a_failed_batch_fails_each_entry_with_the_same_kind() {
        let batcher = batcher(gated(), Batching::default().pipeline(1));
        let blocker = queue(&batcher, 1);
        until(|| !lock(&batcher.runner.sizes).is_empty()).await;
        let answers: Vec<_> = [12, 13, 14].map(|n| queue(&batcher, n)).into();
        batcher.runner.gate.add_permits(2);
        blocker.await.unwrap().unwrap();
        for answer in answers {
            let err = answer.await.unwrap().unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Unavailable);
            assert!(err.source.is_some_and(|s| s.to_string() == "unlucky"));
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let batcher = batcher(gated(), Batching::default().pipeline(1).queue(2));
        let running = queue(&batcher, 1);
        until(|| !lock(&batcher.runner.sizes).is_empty()).await;
        // Nothing runs between these: the queue holds exactly these two.
        let queued = [queue(&batcher, 2), queue(&batcher, 3)];
        let refused = batcher.submit(4).await.unwrap_err();
        assert_eq!(refused.kind(), StoreErrorKind::Full);
        // The save of a claim already made is queued past the bound, not refused.
        let save = queue(&batcher, 104);
        batcher.runner.gate.add_permits(2);
        running.await.unwrap().unwrap();
        for answer in queued {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(save.await.unwrap().unwrap(), 208);
        assert_eq!(*lock(&batcher.runner.sizes), [1, 3]);
        // Once the queue has emptied, claims are let in again.
        batcher.runner.gate.add_permits(1);
        assert_eq!(batcher.submit(5).await.unwrap(), 10);
    }

    /// A store shared across runtimes: the first one shuts down with a full queue, and the next
    /// claim, on another runtime, starts a new queue rather than being refused for what the
    /// dead one held.
    #[test]
    fn a_queue_whose_runtime_shut_down_starts_anew() {
        let batcher = batcher(gated(), Batching::default().pipeline(1).queue(2));
        let first = tokio::runtime::Runtime::new().expect("a runtime");
        first.block_on(async {
            let _running = queue(&batcher, 1);
            until(|| !lock(&batcher.runner.sizes).is_empty()).await;
            let _queued = [queue(&batcher, 2), queue(&batcher, 3)];
            let refused = batcher.submit(4).await.unwrap_err();
            assert_eq!(refused.kind(), StoreErrorKind::Full);
        });
        drop(first);
        let second = tokio::runtime::Runtime::new().expect("a runtime");
        second.block_on(async {
            batcher.runner.gate.add_permits(1);
            assert_eq!(batcher.submit(5).await.unwrap(), 10);
        });
    }

    #[tokio::test]
    async fn a_batch_stops_taking_entries_at_its_bytes() {
        let batcher = batcher(gated(), Batching::default().pipeline(1));
        let blocker = queue(&batcher, 1);
        until(|| !lock(&batcher.runner.sizes).is_empty()).await;
        // Two large saves do not fit in one batch; the small entries after the second join it.
        let answers: Vec<_> = [1000, 1001, 2, 3].map(|n| queue(&batcher, n)).into();
        batcher.runner.gate.add_permits(3);
        blocker.await.unwrap().unwrap();
        for (n, answer) in [1000, 1001, 2, 3].into_iter().zip(answers) {
            assert_eq!(answer.await.unwrap().unwrap(), n * 2);
        }
        assert_eq!(*lock(&batcher.runner.sizes), [1, 1, 3]);
    }

    /// A read-only runner: idle, a request runs its batch of one itself.
    struct InlineDoubler(Doubler);

    impl Runner for InlineDoubler {
        type Entry = u32;
        type Output = u32;
        const INLINE_WHEN_IDLE: bool = true;

        async fn run(&self, entries: &[u32]) -> Result<Vec<Result<u32, StoreError>>, StoreError> {
            self.0.run(entries).await
        }
    }

    #[tokio::test]
    async fn a_reader_that_finds_nothing_queued_runs_in_its_own_task() {
        let batcher = Batcher::new(
            InlineDoubler(Doubler::default()),
            Batching::default(),
            Arc::default(),
        );
        assert_eq!(batcher.submit(21).await.unwrap(), 42);
        assert!(lock(&batcher.queue).is_none(), "the driver was started");
        assert_eq!(*lock(&batcher.runner.0.sizes), [1]);
        assert_eq!(batcher.counters.snapshot().entries, 1);
    }

    #[test]
    fn a_batch_may_run_as_long_as_the_layer_waits_for_it() {
        assert_eq!(DEFAULT_BATCH_TIMEOUT, crate::config::DEFAULT_STORE_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_hangs_fails_its_entries_and_frees_its_slot() {
        let limit = Duration::from_secs(2);
        let batcher = batcher(gated(), Batching::default().timeout(limit));
        let started = tokio::time::Instant::now();
        let err = batcher.submit(1).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable);
        assert_eq!(started.elapsed(), limit);
        // The slot is free: the next batch runs (and finishes once the gate opens).
        batcher.runner.gate.add_permits(1);
        assert_eq!(batcher.submit(2).await.unwrap(), 4);
        assert_eq!(*lock(&batcher.runner.sizes), [1, 1]);
    }

    #[tokio::test]
    async fn a_dropped_request_is_left_out_or_undone() {
        let batcher = batcher(gated(), Batching::default().pipeline(1));
        // Dropped while its batch runs: the runner is told, so it can undo the claim.
        let running = queue(&batcher, 5);
        until(|| !lock(&batcher.runner.sizes).is_empty()).await;
        drop(running);
        // Dropped while queued: never run.
        drop(queue(&batcher, 6));
        batcher.runner.gate.add_permits(1);
        until(|| !lock(&batcher.runner.abandoned).is_empty()).await;
        assert_eq!(*lock(&batcher.runner.abandoned), [5]);
        let next = queue(&batcher, 7);
        until(|| lock(&batcher.runner.sizes).len() == 2).await;
        batcher.runner.gate.add_permits(1);
        assert_eq!(next.await.unwrap().unwrap(), 14);
        assert_eq!(*lock(&batcher.runner.sizes), [1, 1]);
    }
}
