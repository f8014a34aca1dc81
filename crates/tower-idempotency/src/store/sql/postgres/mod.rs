//! The PostgreSQL store (feature `postgres`): the default for real applications.
//!
//! Records live in the table `idempotency_records`, in the same database as the data they
//! protect, which is what makes [transactional mode](crate::transaction) possible: the handler's
//! writes and the saved response commit together.
//!
//! ```no_run
//! use tower_idempotency::{store::postgres::{sqlx::PgPool, PostgresStore}, Idempotency};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPool::connect("postgres://postgres@localhost/app").await?;
//! let store = PostgresStore::new(pool.clone());
//! store.migrate().await?; // creates idempotency_records if needed
//! let layer = Idempotency::new(store); // or Idempotency::postgres(pool) if migrated elsewhere
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Atomicity
//!
//! Every write is one SQL statement. A claim is one `INSERT .. ON CONFLICT (key) DO UPDATE ..
//! WHERE <expired or lease lapsed> RETURNING ..`, joined in a CTE with a locking read of the
//! existing row, so the outcome that was not a claim (in flight, mismatch, done) comes back in the
//! same round trip; in the rare race with an insert its snapshot cannot see, it returns no row and
//! runs again, whole. A `complete` or `release` of a watched record is followed, on the same
//! connection, by a `pg_notify` that writes no record (see [Waiting](#waiting)). Time is the
//! database's: `now()`, never the application's clock.
//!
//! # Group commit
//!
//! Concurrent requests share statements and commits: claims and saves wait in one queue (bounded
//! for new claims; what follows a claim is never refused), and one statement runs everything that
//! queued while the previous batch was in the database: the saves as an `UPDATE .. FROM
//! unnest(..)`, each row checked against its own fencing token, and the claims as an `INSERT ..
//! SELECT .. FROM unnest(..) ON CONFLICT .. RETURNING`, each request answered its own outcome; one
//! commit for all of them. Releases and renewals likewise share one `DELETE .. USING unnest(..)` or
//! `UPDATE .. FROM unnest(..)`. There is no timer: a lone request finds an empty queue and runs at
//! once.
//! [`Batching`] sets the largest batch, how many batches may be in the database at once and the
//! queue's bound (a full queue answers [`StoreErrorKind::Full`], 503);
//! [`PostgresStore::batch_stats`] tells how much was shared. The rules per entry are those of
//! one statement per request, and two entries for one key never share a statement (a claim of a
//! key saved in the same batch runs just after the save, and is answered the saved response;
//! see the group-commit section of the project's design document). The batches run on
//! connections of their own, with a generic plan forced and table scans off, so a plan made
//! while the table was empty never scans it. They are not pinged on checkout (a round trip per
//! batch), except those that sat idle through a failed batch: after a cut network or a restarted
//! server, one batch fails (503 for its requests) and the next ones find live connections, rather
//! than one batch failing per dead connection in the pool. Nor are they pinged on their way back:
//! a batch that succeeded keeps its connection for the next one (sqlx pings every connection it
//! takes back into a pool). In single-commit mode the claim runs
//! inside the handler's transaction, which no other request can share, so it is not batched;
//! the read before it (a replay or a mismatch answered without a transaction) is, one
//! `SELECT .. FROM unnest(..)` for every read queued meanwhile. In transactional mode the claim
//! is batched and the save stays in the handler's transaction.
//!
//! # Migrations
//!
//! [`PostgresStore::migrate`] applies the embedded migrations and tracks them in its own table,
//! `_tower_idempotency_migrations`, never in your application's `_sqlx_migrations`. It takes
//! sqlx's advisory lock, so several instances may call it at start-up at once. The lock is the
//! session's, so the run's connection is closed afterwards rather than pooled: a run that fails
//! or is dropped part way (a start-up timeout) leaves no connection holding it.
//!
//! A store on another table ([`PostgresStore::with_table`]) gets the same schema under that name:
//! `migrate` creates it and tracks it in `{table}_migrations`. With your own migration tool,
//! apply the files with the name written in as [`TableName`](crate::store::TableName) says.
//!
//! If you run your own migrations instead, this is the schema the store expects
//! (`migrations/postgres/0001_idempotency_records.sql` and `0002_watched.sql`, included here verbatim):
//!
//! ```sql
#![doc = include_str!("../../../../migrations/postgres/0001_idempotency_records.sql")]
#![doc = include_str!("../../../../migrations/postgres/0002_watched.sql")]
//! ```
//!
//! # Waiting
//!
//! [`Store::wait_for_change`] uses `LISTEN`/`NOTIFY` on the channel `tower_idempotency`, and
//! only for records someone waits on. A waiter first listens, then marks the running record
//! `watched` (one statement that also tells it whether the record is still running; if not, it
//! returns at once). `complete` and `release` return the record's `watched` flag and send the
//! key's hex hash with `pg_notify` only when it is set, on the same connection (so a notification
//! inside a transaction goes out only when it commits). Without waiters nothing is notified:
//! PostgreSQL serialises the commits of every transaction that notified (a global lock), which
//! would otherwise cost every first-time key, wait mode on or off.
//!
//! Each store starts one listener in the background on the first wait, on a connection of its
//! own (same options as the pool, outside it). Until it listens, or should it fail (for example
//! behind PgBouncer in transaction mode, which cannot `LISTEN`), a wait lasts the timeout the
//! layer gives, so it is always bounded.
//!
//! # Expiry
//!
//! `claim` already treats an expired row as absent; a [`Sweeper`](crate::Sweeper) (or
//! [`Store::sweep`]) frees the space, deleting with `FOR UPDATE SKIP LOCKED` so a sweep never
//! waits on a request's row.
//!
//! # Slow handlers: room on the page for the save
//!
//! The claim inserts a record and the save writes it again, larger. While the record's page has
//! room, PostgreSQL keeps the new version there (a heap-only, HOT, update): no new entry in the
//! table's two indexes, and none for vacuum to clean. A save that follows its claim by a
//! millisecond mostly finds that room (71-72% of the saves in the bench); one that comes later,
//! after a slow handler (a payment call), may find the page filled with newer claims and write
//! both indexes. A lower fill factor keeps room on every page written from then on:
//!
//! ```sql
//! ALTER TABLE idempotency_records SET (fillfactor = 70);
//! ```
//!
//! With `pgbench`, each save one batch after its claim
//! (`crates/bench/pgbench/batch_claims_and_saves_insert_first.sql`), 6% of the saves were HOT at
//! the default fill, 55% at 70 and 86% at 50, for 4% and 14% more statements per second. With the
//! bench's quick handler the layer gained nothing at 50 (lower in three runs of three, within the
//! bench's spread: the inserts spread over twice the pages for few more HOT saves), so the
//! migrations keep PostgreSQL's default. Compare `n_tup_hot_upd` with
//! `n_tup_upd` in `pg_stat_user_tables` before and after.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use sqlx::postgres::{PgConnection, PgPool, Postgres};
use tokio::sync::watch;

pub use sqlx;

use super::{prelude::*, ClaimOrWrite};
use crate::store::error::StoreErrorKind;

mod batch;
pub(in crate::store) mod error;
mod listener;
mod queries;

use batch::{Answer, Change, ClaimsAndSaves, Op, Reads, Write, WriteKind, Writes};
use listener::ListenerState;
use queries::{Queries, NOTIFY};

/// The parameters and the claim row, as every SQL store binds and reads them.
type Codec = sql::Codec<Postgres>;

/// The `NOTIFY` channel `complete` and `release` announce a key's change on.
const CHANNEL: &str = "tower_idempotency";

/// How many times a claim is retried when it raced with an insert it could not see (see
/// `claim_sql!` in `queries.rs`). Two attempts settle it in practice; more only guard against pathological churn.
const CLAIM_ATTEMPTS: usize = 8;
/// A [`Store`] on PostgreSQL, through an sqlx [`PgPool`].
///
/// Cloning is cheap and shares the pool and the notification listener.
///
/// ```no_run
/// use tower_idempotency::store::postgres::{sqlx::PgPool, PostgresStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::new(PgPool::connect("postgres://postgres@localhost/app").await?);
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    /// The batches' own connections (see [`BatchConnections`]).
    connections: Arc<BatchConnections>,
    batching: Batching,
    table: TableName,
    queries: Queries,
    /// Claims and saves share batches: one statement, one commit.
    claims_and_saves: Batcher<ClaimsAndSaves>,
    releases: Batcher<Writes>,
    renewals: Batcher<Writes>,
    /// Single-commit mode's reads before its transaction.
    reads: Batcher<Reads>,
    batches: Arc<Counters>,
    waiters: Arc<Waiters>,
    listener: Mutex<ListenerState>,
    /// `true` while the listener task listens.
    listening: Arc<watch::Sender<bool>>,
}

impl PostgresStore {
    /// A store on `pool`, batching with [`Batching::default`]. Nothing is sent to the database
    /// until the first operation.
    pub fn new(pool: PgPool) -> Self {
        Self::with_batching(pool, Batching::default())
    }

    fn build(pool: PgPool, batching: Batching, table: TableName) -> Self {
        let batches = Arc::new(Counters::default());
        let connections = Arc::new(batch_connections(&pool, batching));
        let writes = |kind| {
            let runner = Writes::new(connections.clone(), kind, &table);
            Batcher::new(runner, batching, batches.clone())
        };
        Self {
            inner: Arc::new(Inner {
                claims_and_saves: Batcher::new(
                    ClaimsAndSaves::new(connections.clone(), &table),
                    batching,
                    batches.clone(),
                ),
                releases: writes(WriteKind::Release),
                renewals: writes(WriteKind::Renew),
                reads: Batcher::new(
                    Reads::new(connections.clone(), &table),
                    batching,
                    batches.clone(),
                ),
                batches,
                pool,
                connections,
                batching,
                queries: Queries::new(&table),
                table,
                waiters: Arc::default(),
                listener: Mutex::default(),
                listening: Arc::new(watch::channel(false).0),
            }),
        }
    }

    /// Close the connections the store's batches run on, for a clean shutdown: they are the
    /// store's own, beside the pool it was given, which stays yours to close. Operations after
    /// this that need a batch (claims, saves, releases, renewals, and single-commit mode's read
    /// before its transaction) fail as [`StoreErrorKind::Unavailable`].
    ///
    /// ```no_run
    /// # async fn run(store: tower_idempotency::store::postgres::PostgresStore) {
    /// store.close().await;
    /// store.pool().close().await;
    /// # }
    /// ```
    pub async fn close(&self) {
        self.inner.connections.close().await;
    }
}

sql_store!(
    PostgresStore in postgres on PgPool ("postgres://postgres@localhost/app"),
    migrations: [1 => "0001_idempotency_records.sql", 2 => "0002_watched.sql"],
    migrate: "sqlx serialises them with an advisory lock",
    batching: "concurrent claims, saves, releases and renewals share statements"
);

/// The batches' connections: the application pool's options with generic plans forced, in a
/// pool of the store's own (see [`connections`](crate::store::sql::connections)), at most four
/// per pipeline slot: one for each kind of batch (claims and saves, releases, renewals, and
/// single-commit mode's reads), each with its own slots.
///
/// The batch statements take arrays, and PostgreSQL would otherwise plan every execution anew for
/// the arrays' actual contents (a custom plan), which for the claim costs more than running it:
/// measured with pgbench, 16-key claims ran at 479 statements/s with custom plans and 1,661 with
/// the generic one. One generic plan fits every batch: each entry is one index probe.
type BatchConnections = sql::connections::BatchConnections<Postgres>;

/// A connection for one batch.
pub(super) type BatchConnection = sql::connections::BatchConnection<Postgres>;

fn batch_connections(pool: &PgPool, batching: Batching) -> BatchConnections {
    let options = pool.connect_options().as_ref().clone().options([
        ("plan_cache_mode", "force_generic_plan"),
        // Every batch statement finds its rows by key. A generic plan made while the table
        // looked empty (a fresh or truncated table, before autovacuum's first analyse)
        // would scan the whole table on every batch for the connection's life.
        ("enable_seqscan", "off"),
        ("enable_bitmapscan", "off"),
    ]);
    BatchConnections::new(options, batching.pipeline_depth() * 4, batching)
}

/// Run `migrator` on `pool` as [`PostgresStore::migrate`] runs the store's own migrations:
/// sqlx's advisory lock keeps runs from several processes at once apart, so an application can
/// run its own migrations the same way beside the store's.
pub async fn run_migrator(pool: &PgPool, migrator: Migrator) -> Result<(), StoreError> {
    sql::migrate(pool, &migrator, 1, true).await
}

impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        let op = Op::Claim(claim.clone());
        self.inner.claims_and_saves.submit(op).await?.claimed()
    }

    async fn renew(&self, hold: &Hold, lease: Duration) -> Result<Fenced, StoreError> {
        let lease_ms = sql::millis(lease);
        let renewal = Write {
            hold: *hold,
            change: Change::Renew { lease_ms },
        };
        self.inner.renewals.submit(renewal).await
    }

    async fn complete(&self, hold: &Hold, response: &StoredResponse) -> Result<Fenced, StoreError> {
        let save = Op::Complete {
            hold: *hold,
            status: i32::from(response.status.as_u16()),
            headers: response.encode_headers(),
            body: response.body.clone(),
        };
        self.inner.claims_and_saves.submit(save).await?.fenced()
    }

    async fn release(&self, hold: &Hold) -> Result<Fenced, StoreError> {
        let release = Write {
            hold: *hold,
            change: Change::Release,
        };
        self.inner.releases.submit(release).await
    }

    async fn sweep(&self, batch: u32) -> Result<u64, StoreError> {
        Codec::sweep(&self.inner.pool, self.inner.queries.sweep.clone(), batch).await
    }

    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        let deadline = sql::deadline_after(timeout);
        // Lazy, like any future: the listener starts only once the waiter is registered, so no
        // notification slips between.
        let watch = self.inner.watch(key, deadline);
        sql::wait_for_change(&self.inner.waiters, key, deadline, watch).await;
    }

    sql_store!(reads);
}

impl TransactionalStore for PostgresStore {
    type Database = Postgres;

    fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    async fn complete_in(
        &self,
        tx: &mut sqlx::Transaction<'static, Postgres>,
        hold: &Hold,
        response: &StoredResponse,
    ) -> Result<Fenced, StoreError> {
        complete_on(&self.inner.queries, tx, hold, response).await
    }
}

/// The one-key `COMPLETE` on a connection (inside the handler's transaction), then the
/// notification if a waiter watches the record. The statement returns one row per record it
/// completed, so its row count is the fencing result.
async fn complete_on(
    queries: &Queries,
    conn: &mut PgConnection,
    hold: &Hold,
    response: &StoredResponse,
) -> Result<Fenced, StoreError> {
    let watched: Option<bool> =
        sqlx::query_scalar_with(queries.complete.clone(), Codec::complete(hold, response)?)
            .fetch_optional(&mut *conn)
            .await?;
    notify_if_watched(conn, &hold.key, watched).await
}

/// The fencing result of a `complete` or `release` that returned `watched` (`None`: the token
/// did not match), after notifying the waiters of a watched record.
async fn notify_if_watched(
    conn: &mut PgConnection,
    key: &KeyHash,
    watched: Option<bool>,
) -> Result<Fenced, StoreError> {
    match watched {
        None => Ok(Fenced::Lost),
        Some(false) => Ok(Fenced::Applied),
        Some(true) => {
            sqlx::query(NOTIFY)
                .bind(CHANNEL)
                .bind(key.to_hex())
                .execute(conn)
                .await?;
            Ok(Fenced::Applied)
        }
    }
}

impl PostgresStore {
    /// What `claim` would be answered by a committed record (a replay, a mismatch, a key in
    /// flight under a lease), read without claiming and without a transaction; `None` when only
    /// a claim can answer. Concurrent reads share one statement (single-commit mode's look
    /// before it begins the handler's transaction, so that a replay costs no `BEGIN`).
    pub(crate) async fn answer_without_claiming(
        &self,
        claim: &Claim,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        self.inner.reads.submit(claim.clone()).await
    }

    /// [`CLAIM_LOCKED`] in the transaction on `conn` (single-commit mode).
    pub(crate) async fn claim_in(
        &self,
        conn: &mut PgConnection,
        claim: &Claim,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut lock_key = [0u8; 8];
        lock_key.copy_from_slice(&claim.key.as_bytes()[..8]);
        for _ in 0..CLAIM_ATTEMPTS {
            let row = sqlx::query_with(
                self.inner.queries.claim_locked.clone(),
                Codec::claim(claim)?,
            )
            .bind(i64::from_be_bytes(lock_key))
            .fetch_optional(&mut *conn)
            .await?;
            if let Some(row) = row {
                return Codec::claim_outcome(&row);
            }
        }
        Err(raced())
    }
}

impl ClaimOrWrite for Answer {
    fn into_result(self) -> Result<ClaimOutcome, Fenced> {
        match self {
            Answer::Claim(outcome) => Ok(outcome),
            Answer::Fenced(fenced) => Err(fenced),
        }
    }
}

fn raced() -> StoreError {
    StoreError::new(
        StoreErrorKind::Conflict,
        "the claim kept racing with concurrent inserts",
    )
}
