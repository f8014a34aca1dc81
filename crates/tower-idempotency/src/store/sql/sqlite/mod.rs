//! The SQLite store (feature `sqlite`): embedded, single node.
//!
//! Records live in the table `idempotency_records`, in the same database file as the data they
//! protect, which is what makes [transactional mode](crate::transaction) possible: the handler's
//! writes and the saved response commit together.
//!
//! ```no_run
//! use tower_idempotency::{store::sqlite::{sqlx::SqlitePool, SqliteStore}, Idempotency};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlitePool::connect("sqlite://app.db?mode=rwc").await?;
//! let store = SqliteStore::new(pool.clone());
//! store.migrate().await?; // creates idempotency_records if needed
//! let layer = Idempotency::new(store); // or Idempotency::sqlite(pool) if migrated elsewhere
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! Use WAL mode (`journal_mode=WAL`) and a busy timeout, as for any SQLite database written from
//! several connections.
//!
//! # Writers
//!
//! SQLite runs one writer at a time, and a connection that finds the file locked sleeps in its
//! busy handler (in growing steps) before it tries again. The store's writes therefore queue in
//! the process instead, first come first served, on one async lock per store (shared by its
//! clones): the write of a claim, `complete`, `release`, `renew`, `sweep`, and in
//! [transactional mode](crate::transaction) the handler's whole transaction, which begins with
//! `BEGIN IMMEDIATE` (so it holds the write lock from its start and never has to upgrade a read
//! lock) and holds the queue until it commits or rolls back. Reads (replays, duplicates in
//! flight, mismatches) do not queue. Writes of the application outside the store and other
//! processes still meet the file lock and the busy timeout. A handler must not wait, inside its
//! transaction, for another request through the same store: that request's write would queue
//! behind the transaction. SQLite 3.37 or newer is required (`RETURNING`, `STRICT` tables); the
//! bundled library is newer.
//!
//! # Atomicity
//!
//! Every write is one SQL statement, and SQLite runs one writing statement at a time. A claim
//! runs at most two: a read-only `SELECT` answers the common losing cases (replays, duplicates
//! in flight, mismatches) without a write; otherwise one `INSERT .. ON CONFLICT (key) DO UPDATE ..
//! RETURNING ..` decides every outcome and returns the record as it stands afterwards, claimed or
//! not (a record that changed between the two is judged by that second statement alone). Time is
//! SQLite's clock (`julianday('now')`), in milliseconds since the Unix epoch, never the
//! application's.
//!
//! # Group commit
//!
//! The writes of concurrent requests (claims, saves, releases, renewals) share one transaction:
//! they wait in one queue (bounded for new claims; what follows a claim is never refused), and
//! one `BEGIN IMMEDIATE .. COMMIT` runs everything that queued while the previous batch held
//! the write lock. The whole batch is one statement list, sent to
//! the connection's thread in one hop (each kind's entries as a JSON array, read with
//! `json_each`), so the write lock is taken and released inside that hop, never held while a task
//! waits for the next statement. One journal sync and one hold of the write lock serve the whole
//! batch; a lone request finds an empty queue and runs at once. The reads that answer replays,
//! duplicates in flight and mismatches without the write lock are batched the same way, on any
//! connection. [`Batching`] sets the largest batch and the queue's bound (a full queue answers
//! [`StoreErrorKind::Full`](crate::store::StoreErrorKind::Full), 503); SQLite has one writer, so
//! write batches never overlap whatever the pipeline setting. [`SqliteStore::batch_stats`] tells
//! how much the writes shared. In transactional mode the claim is batched, and the handler's own
//! transaction keeps its turn in the writer queue; its save and its `COMMIT` go to the
//! connection's thread as one prepared statement list, so the transaction holds the queue for one
//! hop fewer (the list's check fails it before the `COMMIT` when the token no longer holds the
//! record, and the transaction rolls back). When another handler's transaction waits in the queue,
//! that list ends with its `BEGIN IMMEDIATE`: the write lock passes from one transaction to the
//! next inside one hop, and the waiting request finds its transaction begun (up to 16 in a row,
//! then the queue lets the store's own writes in). A transaction handed on to a request that left
//! meanwhile is rolled back by the queue. [`SqliteStore::transactions_handed_over`] counts them.
//!
//! The batches run on connections of the store's own: a pool made with your pool's connect
//! options (not its `after_connect` hook), at most one connection per read batch in flight and
//! one for the writer, opened on demand. A connection that goes back to an sqlx pool is pinged,
//! one more hop to its thread per batch; the store keeps a connection whose batch succeeded for
//! the next one instead, as the PostgreSQL store does. An in-memory
//! database must therefore be shared between connections, as `sqlite::memory:` is in sqlx.
//! [`SqliteStore::close`] closes them. On these connections SQLite's automatic WAL checkpoint is
//! off (`wal_autocheckpoint = 0`): it would run inside a batch's `COMMIT` and hold every write of
//! the process for as long as the disk's `fsync` takes. The store runs a passive checkpoint
//! itself after every 256 of its commits, mostly outside its writer queue, so the log stays bounded
//! even when the store is the file's only writer; your own connections keep their setting.
//!
//! The batch uses `json_each`, `->>` and `unhex`: SQLite 3.41 or newer, which the SQLite that
//! sqlx bundles is.
//!
//! # Standard mode: give the records a file of their own
//!
//! SQLite locks a whole file for writing. When the records share the file with the handler's
//! data, every handler write and every batch of the store queue for one lock, and a handler's
//! connection that finds it taken sleeps in its busy handler (one, two, five milliseconds...)
//! while the store's batches keep taking it. It is the handler's writes that wait: the store's
//! connections seldom find the lock taken, and a store that tried again sooner would only take
//! it more often (measured: `crates/bench/RESULTS.md`, twenty-first pass). In standard mode the
//! handler's writes and the saved response never share a transaction, so nothing needs them in
//! one file: open the store on a file of its own and each file has its own writer.
//!
//! ```no_run
//! use tower_idempotency::{store::sqlite::{sqlx::SqlitePool, SqliteStore}, Idempotency};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let app = SqlitePool::connect("sqlite://app.db?mode=rwc").await?; // the handlers' data
//! let records = SqlitePool::connect("sqlite://idempotency.db?mode=rwc").await?;
//! let store = SqliteStore::new(records);
//! store.migrate().await?;
//! let layer = Idempotency::new(store);
//! # let _ = (app, layer);
//! # Ok(())
//! # }
//! ```
//!
//! The bench (`crates/bench`, 32 workers, a handler that inserts one row, ratio to the same
//! handler without the layer) measured first-time keys at 0.53x with the records in their own
//! file against 0.32x in the handler's file (2026-12-05). [Transactional
//! mode](crate::transaction) needs the one file: the handler's writes and the saved response
//! commit in one transaction, and a transaction spanning two files is not atomic in WAL mode.
//!
//! # Migrations
//!
//! [`SqliteStore::migrate`] applies the embedded migrations and tracks them in its own table,
//! `_tower_idempotency_migrations`, never in your application's `_sqlx_migrations`. Several
//! processes may call it at start-up at once.
//!
//! A store on another table ([`SqliteStore::with_table`]) gets the same schema under that name:
//! `migrate` creates it and tracks it in `{table}_migrations`. With your own migration tool,
//! apply the files with the name written in as [`TableName`](crate::store::TableName) says.
//!
//! If you run your own migrations instead, this is the schema the store expects
//! (`migrations/sqlite/0001_idempotency_records.sql`, included here verbatim):
//!
//! ```sql
#![doc = include_str!("../../../../migrations/sqlite/0001_idempotency_records.sql")]
//! ```
//!
//! # Waiting
//!
//! SQLite cannot notify other connections. [`Store::wait_for_change`] wakes early when this
//! store (or a clone of it) completes or releases the key in this process; otherwise it waits for
//! the timeout the layer gives, so it is always bounded.
//!
//! # Expiry
//!
//! `claim` already treats an expired row as absent; a [`Sweeper`](crate::Sweeper) (or
//! [`Store::sweep`]) frees the space, each sweep one write transaction in the file's queue.

use std::{sync::Arc, time::Duration};

use futures_util::TryStreamExt;
use sqlx::sqlite::{Sqlite, SqlitePool};

pub use sqlx;

use super::{prelude::*, ClaimOrWrite};
use crate::store::{
    error::bounded,
    writers::{TransactionTurn, WriterQueue},
};

mod batch;
mod checkpoint;
pub(in crate::store) mod error;
mod queries;

use batch::{Reads, Write, Writes, Written};
use checkpoint::Checkpointer;
use queries::Queries;

/// The parameters and the claim row, as every SQL store binds and reads them.
type Codec = sql::Codec<Sqlite>;

/// Batches of reads in SQLite at once: reads in WAL mode do not block each other.
const READ_PIPELINE: usize = 4;

/// The connections the batches run on: a pool of the store's own, made with the application
/// pool's connect options (but for the automatic checkpoint, see [`checkpoint`]), one
/// connection per read batch in flight, one for the writer and one for a checkpoint, so a
/// batch never waits for the application's connections and its connection is not pinged on
/// its way back (see [`connections`](crate::store::sql::connections)).
type BatchConnections = sql::connections::BatchConnections<Sqlite>;

/// The batches' connections for `read_pipeline` read batches in flight, the writer, and a
/// checkpoint. "The writer" is whoever holds the writer queue's turn: a batch of writes, or the
/// release of a claim whose request is gone; each takes one connection under the turn.
fn batch_connections(
    pool: &SqlitePool,
    batching: Batching,
    read_pipeline: usize,
) -> BatchConnections {
    let (pragma, value) = checkpoint::NO_AUTOMATIC_CHECKPOINT;
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .pragma(pragma, value);
    BatchConnections::new(options, read_pipeline + 2, batching)
}

/// Run `migrator` on `pool` as [`SqliteStore::migrate`] runs the store's own migrations, safe
/// from several processes at once: SQLite has no migration lock, so a run that loses the race to
/// record a version runs again (up to three times) and finds it applied. Write the migrations
/// with `IF NOT EXISTS` for that.
pub async fn run_migrator(pool: &SqlitePool, migrator: Migrator) -> Result<(), StoreError> {
    sql::migrate(pool, &migrator, 3, false).await
}

/// A [`Store`] on SQLite, through an sqlx [`SqlitePool`].
///
/// Cloning is cheap and shares the pool and the waiters of this process.
///
/// ```no_run
/// use tower_idempotency::store::sqlite::{sqlx::SqlitePool, SqliteStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = SqliteStore::new(SqlitePool::connect("sqlite://app.db?mode=rwc").await?);
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    batching: Batching,
    table: TableName,
    /// The statements for `table`, shared with the batch runner.
    queries: Arc<Queries>,
    /// Every write of the store, batched (see [Group commit](self#group-commit)).
    writes: Batcher<Writes>,
    /// The reads that answer claims without a write, batched too (not in `batches`: those
    /// count the writes).
    reads: Batcher<Reads>,
    batches: Arc<Counters>,
    waiters: Arc<Waiters>,
    /// This process's writers, one at a time in arrival order (see the module docs).
    writers: WriterQueue<Sqlite>,
    /// The batches' own connections, closed by [`SqliteStore::close`].
    connections: Arc<BatchConnections>,
    /// Told of every commit of the store's writes, batches and transactions.
    checkpoints: Arc<Checkpointer>,
}

impl SqliteStore {
    /// A store on `pool`, batching with [`Batching::default`]. Nothing is sent to the database
    /// until the first operation.
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_batching(pool, Batching::default())
    }

    /// Close the connections the store's batches run on, for a clean shutdown: they are the
    /// store's own, beside the pool it was given, which stays yours to close. Operations after
    /// this that need a batch fail as
    /// [`StoreErrorKind::Unavailable`](crate::store::StoreErrorKind::Unavailable).
    ///
    /// ```no_run
    /// # async fn run(store: tower_idempotency::store::sqlite::SqliteStore) {
    /// store.close().await;
    /// store.pool().close().await;
    /// # }
    /// ```
    pub async fn close(&self) {
        self.inner.connections.close().await;
    }

    /// How many transactions of [transactional mode](crate::transaction) began on the write
    /// lock the transaction before them handed on (see [Writers](self#writers)), since the store
    /// was built.
    pub fn transactions_handed_over(&self) -> u64 {
        self.inner.writers.handed_over()
    }

    fn build(pool: SqlitePool, batching: Batching, table: TableName) -> Self {
        let queries = Arc::new(Queries::new(&table));
        let waiters: Arc<Waiters> = Arc::default();
        let writers = WriterQueue::default();
        let batches = Arc::new(Counters::default());
        let read_pipeline = batching.pipeline_depth().max(READ_PIPELINE);
        let connections = Arc::new(batch_connections(&pool, batching, read_pipeline));
        let announce = {
            let waiters = waiters.clone();
            Arc::new(move |key: &KeyHash| waiters.wake(key))
        };
        let checkpoints = Arc::new(Checkpointer::new(connections.clone(), writers.clone()));
        let runner = Writes {
            connections: connections.clone(),
            checkpoints: checkpoints.clone(),
            queries: queries.clone(),
            batches: queries::batches(&table),
            writers: writers.clone(),
            announce,
        };
        Self {
            inner: Arc::new(Inner {
                writes: Batcher::new(runner, batching.pipeline(1), batches.clone()),
                reads: Batcher::new(
                    Reads {
                        connections: connections.clone(),
                        queries: queries.clone(),
                    },
                    // Readers do not wait on each other: a batch per connection.
                    batching.pipeline(read_pipeline),
                    Arc::default(),
                ),
                batches,
                pool,
                batching,
                table,
                queries,
                waiters,
                writers,
                connections,
                checkpoints,
            }),
        }
    }
}

sql_store!(
    SqliteStore in sqlite on SqlitePool ("sqlite://app.db?mode=rwc"),
    migrations: [1 => "0001_idempotency_records.sql"],
    migrate: "the schema is created with `IF NOT EXISTS`, and a run that loses the race to record a version runs again and finds it applied",
    batching: "concurrent writes share transactions"
);

impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        match self.inner.reads.submit(claim.clone()).await? {
            Some(outcome) => Ok(outcome),
            None => {
                let write = Write::Claim(claim.clone());
                self.inner.writes.submit(write).await?.claimed()
            }
        }
    }

    async fn renew(&self, hold: &Hold, lease: Duration) -> Result<Fenced, StoreError> {
        let hold = *hold;
        self.inner.fenced(Write::Renew { hold, lease }).await
    }

    async fn complete(&self, hold: &Hold, response: &StoredResponse) -> Result<Fenced, StoreError> {
        let (hold, response) = (*hold, response.clone());
        self.inner.fenced(Write::Complete { hold, response }).await
    }

    async fn release(&self, hold: &Hold) -> Result<Fenced, StoreError> {
        self.inner.fenced(Write::Release(*hold)).await
    }

    async fn sweep(&self, batch: u32) -> Result<u64, StoreError> {
        let _turn = self.inner.writers.turn().await;
        Codec::sweep(&self.inner.pool, self.inner.queries.sweep.clone(), batch).await
    }

    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        let deadline = sql::deadline_after(timeout);
        // Nothing to watch: changes are announced in this process only (see `sql::announce`).
        sql::wait_for_change(&self.inner.waiters, key, deadline, async { true }).await;
    }

    sql_store!(reads);
}

impl TransactionalStore for SqliteStore {
    type Database = Sqlite;

    /// Take the write lock at the start: a deferred transaction that reads first and then
    /// writes must upgrade its lock, and fails with `SQLITE_BUSY` if another connection wrote
    /// meanwhile.
    const BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");

    fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    fn writer_queue(&self) -> Option<WriterQueue<Sqlite>> {
        Some(self.inner.writers.clone())
    }

    /// Waiters are woken as soon as the update is made, before the commit: their next claim
    /// needs SQLite's write lock, which this transaction holds until it commits or rolls back,
    /// so they read the committed outcome (or, after a rollback, the record still running).
    async fn complete_in(
        &self,
        tx: &mut sqlx::Transaction<'static, Sqlite>,
        hold: &Hold,
        response: &StoredResponse,
    ) -> Result<Fenced, StoreError> {
        let fenced = complete_on(&self.inner.queries, &mut **tx, hold, response).await?;
        Ok(sql::announce(&self.inner.waiters, &hold.key, fenced))
    }

    /// The save and the `COMMIT` in one statement list, prepared once per connection: one hop
    /// to the connection's thread while the transaction holds the write lock and the writer
    /// queue, instead of two. After the save, a `SELECT` overflows `abs` unless it changed one
    /// record, so for a token that no longer holds the record the `COMMIT` never runs and the
    /// transaction is rolled back. The list ends with a `BEGIN`: when another handler's
    /// transaction waits in the writer queue, `BEGIN IMMEDIATE`, and the transaction is left in
    /// the queue for it (see [Writers](self#writers)); otherwise a deferred one, so the
    /// transaction sqlx still holds open is an empty one (no lock), rolled back when it is
    /// dropped, without a wait.
    async fn complete_and_commit(
        &self,
        mut tx: sqlx::Transaction<'static, Sqlite>,
        turn: Option<TransactionTurn<Sqlite>>,
        hold: &Hold,
        response: &StoredResponse,
        limit: Duration,
    ) -> Result<Fenced, StoreError> {
        let hand_over = turn.as_ref().is_some_and(TransactionTurn::next_waits);
        let queries = &self.inner.queries;
        let list = match hand_over {
            true => queries.complete_and_hand_over.clone(),
            false => queries.complete_and_commit.clone(),
        };
        let list = sqlx::query_with(list, Codec::complete(hold, response)?);
        let ended = bounded("the save and commit in the transaction", limit, async {
            save_and_commit(list.fetch(&mut *tx), hand_over).await
        })
        .await;
        let next_begun = match ended {
            Ok(Ended::Committed { next_begun }) => next_begun,
            // Fenced out, failed, or stopped part way by the timeout: the list may have ended
            // the transaction or not.
            fenced_out_or_failed => {
                bounded("the rollback", limit, roll_back_whatever_state(tx)).await?;
                return fenced_out_or_failed.map(|_| Fenced::Lost);
            }
        };
        // Counted for the store's checkpoints, which keep the log short enough that this
        // connection's own automatic checkpoint, in its COMMIT inside the writer queue, seldom
        // comes due.
        self.inner.checkpoints.committed();
        match (turn, next_begun) {
            (Some(turn), true) => turn.hand_over(tx),
            // Another process took the lock between the COMMIT and the BEGIN IMMEDIATE.
            (_, false) if hand_over => {
                if let Err(err) = bounded("the rollback", limit, roll_back_whatever_state(tx)).await
                {
                    tracing::debug!(target: "tower_idempotency", error = %err, "ending the transaction after its hand-over failed");
                }
            }
            _ => {}
        }
        Ok(sql::announce(
            &self.inner.waiters,
            &hold.key,
            Fenced::Applied,
        ))
    }
}

/// How [`COMPLETE_AND_COMMIT`](queries::COMPLETE_AND_COMMIT) or
/// [`COMPLETE_AND_HAND_OVER`](queries::COMPLETE_AND_HAND_OVER) ended, short of an error.
enum Ended {
    /// The token no longer holds the record: nothing was committed.
    FencedOut,
    /// The save is committed; `next_begun`: the list began the next transaction too.
    Committed { next_begun: bool },
}

/// The rows of [`COMPLETE_AND_HAND_OVER`](queries::COMPLETE_AND_HAND_OVER) up to the one after its
/// `COMMIT`: the save's, the check's and that marker.
const ROWS_UNTIL_COMMITTED: usize = 3;

/// Read the rows of a save-and-commit list: the save's row (none when the token no longer
/// holds the record: then the check fails the list), the check's, and for a hand-over the row
/// that tells the `COMMIT` ran, after which a failed `BEGIN IMMEDIATE` leaves the save standing.
async fn save_and_commit(
    mut rows: impl futures_util::Stream<Item = Result<sqlx::sqlite::SqliteRow, sqlx::Error>> + Unpin,
    hand_over: bool,
) -> Result<Ended, StoreError> {
    match rows.try_next().await {
        Ok(Some(_)) => {}
        Ok(None) => return Err(sqlx::Error::RowNotFound.into()),
        Err(sqlx::Error::Database(err)) if err.message() == queries::FENCED_OUT => {
            return Ok(Ended::FencedOut)
        }
        Err(err) => return Err(err.into()),
    }
    let mut seen = 1;
    loop {
        match rows.try_next().await {
            Ok(Some(_)) => seen += 1,
            Ok(None) => {
                return Ok(Ended::Committed {
                    next_begun: hand_over,
                })
            }
            Err(_) if hand_over && seen == ROWS_UNTIL_COMMITTED => {
                return Ok(Ended::Committed { next_begun: false })
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Roll back a transaction whose statement list failed: inside the transaction (the save's
/// check failed), or after a `COMMIT` that failed and may have ended it. sqlx still counts it
/// open either way, so a `BEGIN` after a `ROLLBACK` that found nothing to end gives its own
/// rollback a transaction to end, and the connection goes back to the pool as it came.
async fn roll_back_whatever_state(
    mut tx: sqlx::Transaction<'static, Sqlite>,
) -> Result<(), StoreError> {
    // Fails only when the failure already ended the transaction.
    let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await;
    sqlx::raw_sql("BEGIN").execute(&mut *tx).await?;
    tx.rollback().await?;
    Ok(())
}

impl Inner {
    /// Run a token-checked write in the next batch.
    async fn fenced(&self, write: Write) -> Result<Fenced, StoreError> {
        self.writes.submit(write).await?.fenced()
    }
}

impl ClaimOrWrite for Written {
    fn into_result(self) -> Result<ClaimOutcome, Fenced> {
        match self {
            Written::Claim(outcome) => Ok(outcome),
            Written::Fenced(fenced) => Err(fenced),
        }
    }
}

/// [`COMPLETE`] on a pool or inside a transaction.
async fn complete_on<'e>(
    queries: &Queries,
    executor: impl sqlx::SqliteExecutor<'e>,
    hold: &Hold,
    response: &StoredResponse,
) -> Result<Fenced, StoreError> {
    let done = sqlx::query_with(queries.complete.clone(), Codec::complete(hold, response)?)
        .execute(executor)
        .await?;
    Ok(Fenced::from_rows(done.rows_affected()))
}

#[cfg(test)]
mod hand_over_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    use crate::store::FencingToken;

    #[tokio::test]
    async fn in_memory_database_claims_and_replays() {
        use sqlx::sqlite::SqlitePoolOptions;
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let store = SqliteStore::new(pool);
        store.migrate().await.unwrap();
        let claim = Claim {
            key: KeyHash([7; 32]),
            fingerprint: crate::Fingerprint([8; 32]),
            token: FencingToken::new(),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
        };
        assert_eq!(
            store.claim(&claim).await.unwrap(),
            ClaimOutcome::Claimed { taken_over: false }
        );
        let saved = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            Bytes::from_static(b"{}"),
        );
        assert!(store
            .complete(&claim.hold(), &saved)
            .await
            .unwrap()
            .applied());
        let again = Claim {
            token: FencingToken::new(),
            ..claim
        };
        assert_eq!(
            store.claim(&again).await.unwrap(),
            ClaimOutcome::Done(saved)
        );
    }
}
