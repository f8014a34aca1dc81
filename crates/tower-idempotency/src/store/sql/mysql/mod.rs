//! The MySQL / MariaDB store (feature `mysql`): for applications whose data lives in InnoDB.
//!
//! Records live in the table `idempotency_records`, in the same database as the data they
//! protect, which is what makes [transactional mode](crate::transaction) possible: the handler's
//! writes and the saved response commit together. Tested against MariaDB 10.11; the SQL is that
//! of MySQL 8 as well.
//!
//! ```no_run
//! use tower_idempotency::{store::mysql::{sqlx::MySqlPool, MySqlStore}, Idempotency};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = MySqlPool::connect("mysql://root@localhost/app").await?;
//! let store = MySqlStore::new(pool.clone());
//! store.migrate().await?; // creates idempotency_records if needed
//! let layer = Idempotency::new(store); // or Idempotency::mysql(pool) if migrated elsewhere
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Atomicity
//!
//! Every write is one SQL statement, run in autocommit mode, so no lock outlives it. A claim
//! runs at most two:
//!
//! 1. a consistent (non-locking) `SELECT` answers the losing cases that hold until the record
//!    expires (replays, duplicates in flight, mismatches) without a write or a row lock (one
//!    `SELECT` for the claims of concurrent requests: see [Group commit](self#group-commit));
//! 2. otherwise one `INSERT .. ON DUPLICATE KEY UPDATE` decides every outcome under the primary
//!    key's exclusive lock, on the row's latest committed version, and returns the outcome in
//!    its OK packet through `LAST_INSERT_ID(code)`: no second statement, and it is the same on
//!    MySQL 8 (which has no `INSERT .. RETURNING`) and MariaDB.
//!
//! The statement, and why exactly one of any number of concurrent attempts wins under InnoDB's
//! locking at READ COMMITTED and at REPEATABLE READ (the tests run both), with its text:
//!
//! ```sql
#![doc = include_str!("claim.sql")]
//! ```
//!
//! A record completed between the two statements (the claim reports `done`) is read again by
//! the first. Time is the database's: `UTC_TIMESTAMP(6)` in milliseconds, never the
//! application's clock nor the session's time zone.
//!
//! Each statement on the pool runs in a task of its own, so a store timeout that stops waiting
//! for it does not cancel it halfway through MySQL's protocol (sqlx's MySQL connection does not
//! recover from a statement dropped while it is prepared); the save inside the handler's
//! transaction is a text statement, which needs no prepare, for the same reason.
//!
//! No `SELECT .. FOR UPDATE` is held across a handler: a claim is committed before the handler
//! runs, and an in-flight duplicate waits on a row lock only while another claim, a `complete`
//! or, in transactional mode, the `COMMIT` after the save, is under way.
//!
//! # Group commit
//!
//! The claims' reads are batched: the reads of concurrent requests wait in a bounded queue, and
//! one `SELECT .. WHERE key IN (..)` on one connection reads the records of every claim that
//! queued while the previous read ran (no timer; a read that finds nothing queued runs at once,
//! in its request's task). Each claim is then judged by its own fingerprint, exactly as its own
//! read would judge it, so claims of one key in one batch (a retry beside a reused key with
//! another body) each get their own answer. The key list is padded, by repeating a key, to 1, 2,
//! 4 .. keys, so each connection prepares a handful of statements, not one per batch size.
//!
//! The write is not batched: its outcome travels in `LAST_INSERT_ID`, one value per statement.
//! Each claim the read leaves open runs its own `INSERT .. ON DUPLICATE KEY UPDATE`, the first
//! of each batch on the read's connection (a pool checkout costs sqlx a ping each way, so a lone
//! request pays what an unbatched claim paid); saves, releases and renewals are single
//! statements as before. [`Batching`] sets the largest read (at most 1,024 keys), how many reads
//! run at once (`pipeline`, default 1: the next read gathers while one runs) and the queue's
//! bound (a full queue answers [`StoreErrorKind::Full`], 503); [`MySqlStore::batch_stats`]
//! counts the reads.
//!
//! # Errors
//!
//! Deadlocks (1213) are a [`Conflict`](StoreErrorKind::Conflict): nothing was written, and the
//! layer retries the claim before it answers 503. A lock wait timeout (1205), too many
//! connections, a full disk, a read-only server and a shutdown are
//! [`Unavailable`](StoreErrorKind::Unavailable) (503). A value the schema refuses (data too long,
//! an incorrect value) is a [`Backend`](StoreErrorKind::Backend) error (500), not an outage.
//!
//! # Migrations
//!
//! [`MySqlStore::migrate`] applies the embedded migrations and tracks them in its own table,
//! `_tower_idempotency_migrations`, never in your application's `_sqlx_migrations`. It runs
//! under a named lock per database (`GET_LOCK`, see [`run_migrator`]), so several instances may
//! call it at start-up at once.
//!
//! A store on another table ([`MySqlStore::with_table`]) gets the same schema under that name:
//! `migrate` creates it and tracks it in `{table}_migrations`. With your own migration tool,
//! apply the files with the name written in as [`TableName`](crate::store::TableName) says.
//!
//! If you run your own migrations instead, this is the schema the store expects
//! (`migrations/mysql/0001_idempotency_records.sql`, included here verbatim):
//!
//! ```sql
#![doc = include_str!("../../../../migrations/mysql/0001_idempotency_records.sql")]
//! ```
//!
//! # Waiting
//!
//! MySQL cannot notify other connections. [`Store::wait_for_change`] wakes early when this
//! store (or a clone of it) completes or releases the key in this process; otherwise it waits for
//! the timeout the layer gives (its poll interval), so wait mode polls across instances and is
//! always bounded.
//!
//! # Expiry
//!
//! `claim` already treats an expired row as absent; a [`Sweeper`](crate::Sweeper) (or
//! [`Store::sweep`]) frees the space, one `DELETE .. LIMIT` per sweep.

use std::{future::Future, sync::Arc, time::Duration};

use sqlx::{
    mysql::{MySql, MySqlArguments, MySqlPool},
    pool::PoolConnection,
    Arguments, SqlStr,
};

pub use sqlx;

use super::prelude::*;
use crate::store::error::StoreErrorKind;

mod batch;
pub(in crate::store) mod error;
mod queries;

use batch::{Read, Reads};
use queries::Queries;

/// The parameters and the claim row, as every SQL store binds and reads them.
type Codec = sql::Codec<MySql>;

/// How many times a claim runs when the record changed between its read and its write (it was
/// completed, then the read finds it done; or it was released and swept, then the write
/// inserts). Two settle it in practice; more only guard against pathological churn.
const CLAIM_ATTEMPTS: usize = 8;

/// What the claim statement decided, from its insert id (see `CLAIM` in `queries.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    /// No row: inserted (insert id 0), or an expired row claimed afresh (1).
    Claimed,
    /// A running row with a lapsed lease and this fingerprint, taken over (2).
    TakenOver,
    /// Another fingerprint (3).
    Mismatch,
    /// Done: the saved response is read by the next attempt's first statement (4).
    Done,
    /// Running under a valid lease, with this much left (5 + milliseconds).
    InFlight(Duration),
}

impl Code {
    fn from_insert_id(id: u64) -> Self {
        match id {
            0 | 1 => Code::Claimed,
            2 => Code::TakenOver,
            3 => Code::Mismatch,
            4 => Code::Done,
            n => Code::InFlight(Duration::from_millis(n - 5)),
        }
    }
}

/// A [`Store`] on MySQL or MariaDB, through an sqlx [`MySqlPool`].
///
/// Cloning is cheap and shares the pool and the waiters of this process.
///
/// ```no_run
/// use tower_idempotency::store::mysql::{sqlx::MySqlPool, MySqlStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MySqlStore::new(MySqlPool::connect("mysql://root@localhost/app").await?);
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MySqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    batching: Batching,
    table: TableName,
    /// The statements for `table`, moved into the tasks that run them.
    queries: Arc<Queries>,
    /// The claims' lock-free reads, batched (see [Group commit](self#group-commit)).
    reads: Batcher<Reads>,
    /// What the reads' batches shared.
    batches: Arc<Counters>,
    waiters: Arc<Waiters>,
}

impl MySqlStore {
    /// A store on `pool`, batching the claims' reads with [`Batching::default`]. Nothing is
    /// sent to the database until the first operation.
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_batching(pool, Batching::default())
    }

    fn build(pool: MySqlPool, batching: Batching, table: TableName) -> Self {
        let batches = Arc::new(Counters::default());
        let (reads, read_batching) = Reads::new(pool.clone(), &table, batching);
        Self {
            inner: Arc::new(Inner {
                reads: Batcher::new(reads, read_batching, batches.clone()),
                batches,
                pool,
                batching,
                queries: Arc::new(Queries::new(&table)),
                table,
                waiters: Arc::default(),
            }),
        }
    }

    /// `statement` on the pool in a task of its own ([`detached`]): the rows it changed.
    async fn write(
        &self,
        statement: &SqlStr,
        arguments: MySqlArguments,
    ) -> Result<u64, StoreError> {
        let write = sqlx::query_with(statement.clone(), arguments);
        let pool = self.inner.pool.clone();
        let done = detached(async move { write.execute(&pool).await }).await?;
        Ok(done.rows_affected())
    }

    /// Run `CLAIM` for `claim`, on `conn` if its read handed one over, else on a connection of
    /// the pool, in a task of its own.
    async fn write_claim(
        &self,
        claim: &Claim,
        conn: Option<PoolConnection<MySql>>,
    ) -> Result<Code, StoreError> {
        let write = sqlx::query_with(self.inner.queries.claim.clone(), Codec::claim(claim)?);
        let pool = self.inner.pool.clone();
        let done = detached(async move {
            let mut conn = match conn {
                Some(conn) => conn,
                None => pool.acquire().await?,
            };
            write.execute(&mut *conn).await
        })
        .await?;
        Ok(Code::from_insert_id(done.last_insert_id()))
    }
}

sql_store!(
    MySqlStore in mysql on MySqlPool ("mysql://root@localhost/app"),
    migrations: [1 => "0001_idempotency_records.sql"],
    migrate: "a named lock per database (`GET_LOCK`) keeps them apart, on MariaDB too",
    batching: "concurrent claims share their reads"
);

/// How long a migration run waits for another process's run on the same database.
const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(60);

/// Take the named lock that keeps migrations of one database apart (lock names are
/// server-wide, and at most 64 characters), waiting up to `?` seconds; 1 when taken.
const LOCK_MIGRATIONS: &str =
    "SELECT GET_LOCK(CONCAT('tower_idempotency_migrate_', MD5(COALESCE(DATABASE(), ''))), ?)";
/// Let it go.
const UNLOCK_MIGRATIONS: &str =
    "SELECT RELEASE_LOCK(CONCAT('tower_idempotency_migrate_', MD5(COALESCE(DATABASE(), ''))))";

/// Run `migrator` on `pool` as [`MySqlStore::migrate`] runs the store's own migrations, safe
/// from several processes at once: under a named lock per database (`GET_LOCK`, waited for up to
/// a minute) on the connection that runs them, so an application can run its own migrations the
/// same way beside the store's.
///
/// sqlx's own lock asks for a wait without end (`GET_LOCK(name, -1)`), which MariaDB answers
/// with NULL at once: concurrent runs would not be kept apart there.
pub async fn run_migrator(pool: &MySqlPool, mut migrator: Migrator) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    // The lock belongs to this connection's session. A run dropped part way (a start-up
    // timeout) must not hand the pool back a connection that still holds it, or every later run
    // would wait out its minute: this one is closed instead, and the lock goes with its session.
    conn.close_on_drop();
    let locked: Option<i64> = sqlx::query_scalar(LOCK_MIGRATIONS)
        .bind(MIGRATION_LOCK_WAIT.as_secs())
        .fetch_one(&mut *conn)
        .await?;
    if locked != Some(1) {
        return Err(StoreError::new(
            StoreErrorKind::Migration,
            format!(
                "another process held the migration lock for {} s: is a migration stuck? \
                 Check SHOW PROCESSLIST, then run migrate again",
                MIGRATION_LOCK_WAIT.as_secs()
            ),
        ));
    }
    migrator.set_locking(false);
    // `run_direct`, not `run(&mut *conn)`: the latter's future cannot be shown `Send` (sqlx's
    // "`Acquire` is not general enough").
    let ran = migrator
        .run_direct(None, &mut *conn, false)
        .await
        .map_err(|err| StoreError::new(StoreErrorKind::Migration, err));
    // A connection that fails here is gone, and its session's lock with it.
    let _ = sqlx::query(UNLOCK_MIGRATIONS).execute(&mut *conn).await;
    ran
}

impl Store for MySqlStore {
    fn name(&self) -> &'static str {
        "mysql"
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..CLAIM_ATTEMPTS {
            let conn = match self.inner.reads.submit(claim.clone()).await? {
                Read::Answered(outcome) => return Ok(outcome),
                Read::Claimable(conn) => conn,
            };
            match self.write_claim(claim, conn).await? {
                Code::Claimed => return Ok(ClaimOutcome::claimed()),
                Code::TakenOver => return Ok(ClaimOutcome::taken_over()),
                Code::Mismatch => return Ok(ClaimOutcome::Mismatch),
                Code::InFlight(left) => return Ok(ClaimOutcome::in_flight(left)),
                // Completed since the read: the next read answers with the saved response.
                Code::Done => {
                    tracing::trace!(target: "tower_idempotency", "claim found a record completed since its read; reading again")
                }
            }
        }
        Err(StoreError::new(
            StoreErrorKind::Backend,
            "the claim kept racing with concurrent completions",
        ))
    }

    async fn renew(&self, hold: &Hold, lease: Duration) -> Result<Fenced, StoreError> {
        let arguments = Codec::renew_set_first(hold, lease)?;
        let renewed = self.write(&self.inner.queries.renew, arguments).await?;
        Ok(Fenced::from_rows(renewed))
    }

    async fn complete(&self, hold: &Hold, response: &StoredResponse) -> Result<Fenced, StoreError> {
        let arguments = Codec::complete_set_first(hold, response)?;
        let completed = self.write(&self.inner.queries.complete, arguments).await?;
        let fenced = Fenced::from_rows(completed);
        Ok(sql::announce(&self.inner.waiters, &hold.key, fenced))
    }

    async fn release(&self, hold: &Hold) -> Result<Fenced, StoreError> {
        let released = self
            .write(&self.inner.queries.release, Codec::held(hold)?)
            .await?;
        let fenced = Fenced::from_rows(released);
        Ok(sql::announce(&self.inner.waiters, &hold.key, fenced))
    }

    async fn sweep(&self, batch: u32) -> Result<u64, StoreError> {
        let arguments = Codec::encoded(|args| args.add(i64::from(batch)))?;
        self.write(&self.inner.queries.sweep, arguments).await
    }

    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        let deadline = sql::deadline_after(timeout);
        // Nothing to watch: changes are announced in this process only (see `sql::announce`);
        // across instances the layer's next claim, one poll interval later, sees them.
        sql::wait_for_change(&self.inner.waiters, key, deadline, async { true }).await;
    }

    async fn get(&self, key: &KeyHash) -> Result<Option<RecordInfo>, StoreError> {
        let get = self.inner.queries.get.clone();
        detached(Codec::get(self.inner.pool.clone(), get, *key)).await
    }

    async fn forget(&self, key: &KeyHash) -> Result<bool, StoreError> {
        let forget = self.inner.queries.forget.clone();
        let forgot = detached(Codec::forget(self.inner.pool.clone(), forget, *key)).await?;
        if forgot {
            self.inner.waiters.wake(key);
        }
        Ok(forgot)
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let read = sqlx::query_as(self.inner.queries.stats.clone());
        let pool = self.inner.pool.clone();
        let row = detached(async move { read.fetch_one(&pool).await }).await?;
        sql::stats_of(row)
    }
}

impl TransactionalStore for MySqlStore {
    type Database = MySql;

    fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// Waiters are woken as soon as the update is made, before the commit: their next claim
    /// reads the record as committed, still running until the commit lands (and then waits
    /// again, a poll interval at most), done after it.
    async fn complete_in(
        &self,
        tx: &mut sqlx::Transaction<'static, MySql>,
        hold: &Hold,
        response: &StoredResponse,
    ) -> Result<Fenced, StoreError> {
        let text = queries::complete_text(&self.inner.table, hold, response);
        let done = sqlx::raw_sql(sqlx::AssertSqlSafe(text))
            .execute(&mut **tx)
            .await?;
        let fenced = Fenced::from_rows(done.rows_affected());
        Ok(sql::announce(&self.inner.waiters, &hold.key, fenced))
    }
}

/// Run a statement on the pool in a task of its own, so that a caller who stops waiting (the
/// layer's store timeout) does not cancel it halfway through MySQL's protocol.
///
/// sqlx's MySQL connection cannot recover from a statement dropped while it is being prepared
/// (the first use of a statement on a connection): it waits for an answer the server never sends,
/// and the pool's check of the returned connection hangs with it, a pool slot lost for good. In
/// its own task the statement runs to its end and returns the connection whole; its result, if
/// nobody waits any more, is dropped. The layer already accounts for a write that lands after its
/// timeout (a claim that lands late holds the key until its lease lapses).
async fn detached<T: Send + 'static, E: Send + 'static>(
    statement: impl Future<Output = Result<T, E>> + Send + 'static,
) -> Result<T, StoreError>
where
    StoreError: From<E>,
{
    match tokio::spawn(statement).await {
        Ok(result) => Ok(result?),
        Err(err) => Err(StoreError::new(StoreErrorKind::Backend, err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_ids_decode_to_outcomes() {
        assert_eq!(Code::from_insert_id(0), Code::Claimed);
        assert_eq!(Code::from_insert_id(1), Code::Claimed);
        assert_eq!(Code::from_insert_id(2), Code::TakenOver);
        assert_eq!(Code::from_insert_id(3), Code::Mismatch);
        assert_eq!(Code::from_insert_id(4), Code::Done);
        assert_eq!(Code::from_insert_id(5), Code::InFlight(Duration::ZERO));
        assert_eq!(
            Code::from_insert_id(5 + 1500),
            Code::InFlight(Duration::from_millis(1500))
        );
    }
}
