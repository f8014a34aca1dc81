//! Where idempotency records live.
//!
//! A [`Store`] keeps one record per scoped key. Every method must be atomic on its own: one SQL
//! statement or one Redis script, never a read followed by a write. A store that checks whether a
//! key exists and then inserts it lets two concurrent attempts both believe they are first, which
//! is exactly the duplicate this crate exists to prevent.
//!
//! | store | feature | for |
//! |---|---|---|
//! | [`MemoryStore`] | `memory` (default) | one process: tests, single-instance services |
//! | `PostgresStore` | `postgres` | the default for real applications, transactional mode |
//! | `SqliteStore` | `sqlite` | embedded, single node, transactional mode |
//! | `MySqlStore` | `mysql` | applications on MySQL or MariaDB (InnoDB), transactional mode |
//! | `RedisStore` | `redis` | work with no database row of its own, scale-out |
//!
//! [`DynStore`] holds any of them behind one type, for a store chosen at run time.
//!
//! # Layout
//!
//! This file holds the [`Store`] trait and its rules; `record.rs` what a store keeps and answers
//! (claims, outcomes, [`StoredResponse`] and its encoding, durations in milliseconds);
//! `error.rs` [`StoreError`]. Each backend is a module of its own: `memory.rs`, `redis/`, and
//! under `sql/` what the SQL stores share (the migrator, the row decoding, the time conversions,
//! the batching executor) beside
//! `sql/postgres/`, `sql/sqlite/` and `sql/mysql/`, each with its statements and its error codes.

use std::{fmt, future::Future, time::Duration};

use crate::key::KeyHash;

mod dynamic;
mod error;
pub(crate) mod record;
pub use dynamic::{BoxFuture, DynStore, ErasedStore, FencedFuture};
pub(crate) use error::bounded;
pub use error::{StoreError, StoreErrorKind};
pub use record::{
    Claim, ClaimOutcome, Fenced, FencingToken, Hold, OldestRunning, RecordInfo, RecordState,
    StoreStats, StoredResponse,
};

#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "memory")]
pub use memory::MemoryStore;

#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
// Only SQLite has one writer at a time; the other stores' transactions leave the queue out.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) mod writers;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use sql::batch::{BatchStats, Batching, DEFAULT_BATCH_TIMEOUT, MAX_PIPELINE};
#[cfg(feature = "mysql")]
pub use sql::mysql;
#[cfg(feature = "postgres")]
pub use sql::postgres;
#[cfg(feature = "sqlite")]
pub use sql::sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use sql::table::{InvalidTableName, TableName};
cfg_any_store! {
    mod waiters;
}

/// A backend that keeps idempotency records.
///
/// # Atomicity
///
/// Each method is one atomic operation in the backend: one SQL statement (a CTE counts as one) or
/// one Lua script. In particular [`claim`](Store::claim) must decide between the four outcomes and
/// write the claim in the same step: `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE stale RETURNING`
/// in SQL, a single script in Redis. Never read then write.
///
/// # Time
///
/// Leases and expiry are judged by the store's own clock (the database's `now()`, Redis' `TIME`),
/// so several application instances with skewed clocks agree on who holds a key.
///
/// # Example
///
/// ```
/// use tower_idempotency::store::{MemoryStore, Store};
///
/// # tokio_test_like::run(async {
/// let store = MemoryStore::new();
/// assert_eq!(store.sweep(1000).await.unwrap(), 0);
/// # });
/// # mod tokio_test_like { pub fn run<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f) } }
/// ```
pub trait Store: fmt::Debug + Send + Sync + 'static {
    /// A short name for metrics and logs: the `store` label of
    /// `idempotency_store_duration_seconds`. The built-in stores answer `memory`, `postgres`,
    /// `sqlite` and `redis`; the default is `custom`.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Claim `claim.key` for `claim.fingerprint`, atomically.
    ///
    /// - no record, or an expired one: write a `running` record with `claim.token`, lease and
    ///   expiry; return [`ClaimOutcome::Claimed`].
    /// - a record with another fingerprint (any state, not expired): [`ClaimOutcome::Mismatch`].
    /// - `running`, same fingerprint, lease lapsed: take it over (new token, new lease, original
    ///   expiry, moved to the end of the new lease if it comes sooner, as [`renew`](Self::renew)
    ///   does: the new holder is live); `Claimed { taken_over: true }`.
    /// - `running`, same fingerprint, lease valid: [`ClaimOutcome::InFlight`] with the time left.
    /// - `done`, same fingerprint: [`ClaimOutcome::Done`] with the saved response.
    fn claim(&self, claim: &Claim)
        -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Extend the lease of the running record `hold` holds to `lease` from now, and its expiry
    /// to the lease's end if it came sooner: a record does not expire under a holder that is
    /// still renewing (a handler that outlives the retention is not run twice).
    fn renew(
        &self,
        hold: &Hold,
        lease: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Save `response` on the running record `hold` holds and mark it done.
    /// The record keeps its expiry.
    fn complete(
        &self,
        hold: &Hold,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Delete the running record `hold` holds, so a retry can claim the key afresh.
    fn release(&self, hold: &Hold) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Delete up to `batch` expired records; return how many were deleted.
    ///
    /// Bounded so that a backlog of millions is cleared in short steps without a long lock.
    fn sweep(&self, batch: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Wait until the record of `key` may have changed (completed, released, or its lease lapsed),
    /// or until `timeout` passes, whichever is first. Used by wait mode between two claims.
    ///
    /// Stores with a notification channel (memory: `Notify`, PostgreSQL: `LISTEN`, Redis:
    /// pub/sub) wake early; the default sleeps for `timeout`, which the layer bounds to a short
    /// poll interval. A spurious early return is harmless: the layer claims again.
    fn wait_for_change(&self, key: &KeyHash, timeout: Duration) -> impl Future<Output = ()> + Send {
        let _ = key;
        tokio::time::sleep(timeout)
    }

    /// Operators: the live record of `key`, `None` when there is none (or it expired). Reads
    /// only. Every built-in store implements it; the default answers
    /// [`StoreErrorKind::Unsupported`].
    fn get(
        &self,
        key: &KeyHash,
    ) -> impl Future<Output = Result<Option<RecordInfo>, StoreError>> + Send {
        let _ = key;
        async { Err(StoreError::unsupported("get")) }
    }

    /// Operators: delete the record of `key` whatever its state, so the next request with the
    /// key runs as new (a stuck key, an erasure request). `true` when there was one.
    ///
    /// # Warning
    ///
    /// Forgetting a done record lets a retry of its request run again; forgetting a running one
    /// lets a duplicate run beside its holder, whose answer is then not saved (it is fenced
    /// out). Forget only what you know is safe to redo. The default answers
    /// [`StoreErrorKind::Unsupported`].
    fn forget(&self, key: &KeyHash) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = key;
        async { Err(StoreError::unsupported("forget")) }
    }

    /// Operators: the records by state and the oldest running one ([`StoreStats`]). Reads
    /// only, but visits every record (a table scan in SQL, a `SCAN` in Redis): for a dashboard
    /// or a command line, not for every request. Every built-in store implements it (Redis
    /// Cluster excepted); the default answers [`StoreErrorKind::Unsupported`].
    fn stats(&self) -> impl Future<Output = Result<StoreStats, StoreError>> + Send {
        async { Err(StoreError::unsupported("stats")) }
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
/// A store whose records live in a SQL database, so the handler's writes and the saved response
/// can commit in one transaction (transactional mode).
///
/// The layer claims the key with [`Store::claim`] (committed on its own, so the claim is visible
/// to other attempts at once), then hands the handler a lazily-begun transaction. When the handler
/// answers, [`complete_in`](TransactionalStore::complete_in) saves the response inside that
/// transaction, token-checked, and the layer commits. If the token check fails the layer rolls
/// back, so a holder that lost its lease cannot commit its work.
pub trait TransactionalStore: Store {
    /// The sqlx database.
    type Database: sqlx::Database;

    /// The pool transactions are begun from.
    fn pool(&self) -> &sqlx::Pool<Self::Database>;

    /// The statement that begins the handler's transaction (`BEGIN` when `None`).
    #[doc(hidden)]
    const BEGIN: Option<&'static str> = None;

    /// The in-process queue of this store's writers, if it has one: the handler's transaction
    /// holds it from its begin to its commit or rollback.
    #[doc(hidden)]
    fn writer_queue(&self) -> Option<writers::WriterQueue<Self::Database>> {
        None
    }

    /// [`Store::complete`], inside the handler's transaction.
    fn complete_in(
        &self,
        tx: &mut sqlx::Transaction<'static, Self::Database>,
        hold: &Hold,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Save the response in the handler's transaction, token-checked, and end the transaction:
    /// commit when the save applied, roll back (the handler's work with it) when the token no
    /// longer holds the record ([`Fenced::Lost`]). Each trip to the database is bounded by
    /// `limit` (the layer's store timeout).
    ///
    /// The default runs [`complete_in`](Self::complete_in), then `COMMIT` or `ROLLBACK`: two
    /// round trips. SQLite sends the save and the commit as one statement list, whose check
    /// fails on purpose when the token no longer matches, so the `COMMIT` after it never runs
    /// for a holder that lost its lease; when another transaction waits in the store's
    /// [`writer_queue`](Self::writer_queue) (`turn`, held until the transaction ends), the
    /// same list begins the next transaction for it.
    #[doc(hidden)]
    fn complete_and_commit(
        &self,
        tx: sqlx::Transaction<'static, Self::Database>,
        turn: Option<writers::TransactionTurn<Self::Database>>,
        hold: &Hold,
        response: &StoredResponse,
        limit: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        async move {
            let ended = complete_then_commit(self, tx, hold, response, limit).await;
            drop(turn);
            ended
        }
    }
}

/// [`TransactionalStore::complete_in`], then `COMMIT` if it applied or `ROLLBACK` if not, each
/// bounded by `limit`. A timeout drops the transaction, which rolls it back unless the `COMMIT`
/// already landed: either way the work and the saved answer stay together.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
async fn complete_then_commit<St: TransactionalStore + ?Sized>(
    store: &St,
    mut tx: sqlx::Transaction<'static, St::Database>,
    hold: &Hold,
    response: &StoredResponse,
    limit: Duration,
) -> Result<Fenced, StoreError> {
    let saved = bounded(
        "the save in the transaction",
        limit,
        store.complete_in(&mut tx, hold, response),
    );
    match saved.await? {
        Fenced::Applied => {
            bounded("the commit", limit, async { Ok(tx.commit().await?) }).await?;
            Ok(Fenced::Applied)
        }
        Fenced::Lost => {
            bounded("the rollback", limit, async { Ok(tx.rollback().await?) }).await?;
            Ok(Fenced::Lost)
        }
    }
}
