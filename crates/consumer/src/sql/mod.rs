//! The SQL backends (features `postgres`, `sqlite`): one implementation, [`SqlConsumer`], over
//! both databases. Only the SQL text differs, and it lives in [`postgres`] and [`sqlite`].
//!
//! # The processed mark in your own transaction
//!
//! [`SqlConsumer::claim`] marks an event processed inside a transaction the caller owns, so
//! that the caller's writes and the mark commit together:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use tower_idempotency_consumer::{sql::Claim, PgConsumer};
//!
//! let ledger = PgConsumer::new(pool.clone(), "ledger");
//! ledger.migrate().await?;
//!
//! let mut tx = pool.begin().await?;
//! match ledger.claim(&mut tx, "evt_1").await? {
//!     Claim::Claimed { .. } => {
//!         sqlx::query("INSERT INTO ledger (event_id, cents) VALUES ('evt_1', 4000)")
//!             .execute(&mut *tx)
//!             .await?;
//!         tx.commit().await?; // the write and the processed mark, together
//!     }
//!     Claim::Duplicate | Claim::Parked { .. } => tx.rollback().await?,
//! }
//! # Ok(())
//! # }
//! ```
//!
//! On SQLite, begin that transaction with `pool.begin_with("BEGIN IMMEDIATE")` (see
//! [`sqlite`]). [`Consumer::process_once`](crate::Consumer::process_once) does all of this,
//! and counts failures, for you.
//!
//! # Attempts and parking
//!
//! A work that fails is rolled back, then its failure is recorded in its own short
//! transaction: the row's `status` becomes `failed`, `attempts` grows by one and `last_error`
//! keeps the error's text. After [`with_max_attempts`](SqlConsumer::with_max_attempts) failures
//! the event is **parked**: later deliveries report [`Outcome::Parked`] without running the
//! work, so a poison message stops being retried. List parked events with
//! [`parked`](SqlConsumer::parked); [`replay`](SqlConsumer::replay) forgets one (returning its
//! record and payload) so that its next delivery runs the work afresh:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(ledger: tower_idempotency_consumer::PgConsumer) -> Result<(), sqlx::Error> {
//! # async fn republish(_: &str, _: Option<&[u8]>) {}
//! for event in ledger.parked(100).await? {
//!     println!("{} failed {} times: {:?}", event.event_id, event.attempts, event.last_error);
//!     if let Some(event) = ledger.replay(&event.event_id).await? {
//!         republish(&event.event_id, event.payload.as_deref()).await;
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Attempts count failures the work reported, and its panics. A process that crashes in the
//! middle of the work records nothing (its transaction is gone); bound such crash loops with the
//! broker's own delivery limit (RabbitMQ quorum queues' `x-delivery-limit`, JetStream's
//! `max_deliver`).
//!
//! # Table
//!
//! The table is `processed_events` unless [`with_table`](SqlConsumer::with_table) names
//! another; [`migrate`](SqlConsumer::migrate) creates it and records its versions in its own
//! tracking table ([`SqlConsumer::migrations_table`]).

use std::{fmt, num::NonZeroU32, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures_util::{future::BoxFuture, FutureExt};
use sqlx::{
    migrate::{MigrateError, Migration, MigrationType, Migrator},
    AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row,
    SqlSafeStr, Transaction, Type,
};

pub use crate::ParkedEvent;
use crate::{Error, Outcome};

/// [`SqlBackend`] and [`Consumer`](crate::Consumer) for one database, whose SQL is `$dialect`. `Consumer` is
/// implemented for each database's [`SqlConsumer`], where the driver's bounds are known to hold,
/// so they are written once, on [`SqlConsumer`]'s own methods.
macro_rules! sql_backend {
    ($db:ty, $dialect:expr) => {
        impl super::sealed::Sealed for $db {}

        impl super::SqlBackend for $db {
            fn dialect() -> &'static super::Dialect {
                $dialect
            }

            fn rows_affected(result: &<$db as sqlx::Database>::QueryResult) -> u64 {
                result.rows_affected()
            }
        }

        impl $crate::Consumer for super::SqlConsumer<$db> {
            /// The connection of the transaction that holds the processed mark: everything the
            /// work executes on it commits with the mark or not at all.
            type Context = <$db as sqlx::Database>::Connection;

            fn name(&self) -> &str {
                &self.name
            }

            async fn process_once_with_payload<T, E, F>(
                &self,
                event_id: &str,
                payload: Option<&[u8]>,
                work: F,
            ) -> Result<$crate::Outcome<T>, $crate::Error<E>>
            where
                T: Send,
                E: std::fmt::Display + Send,
                F: $crate::Work<Self::Context, T, E>,
            {
                self.run_once(event_id, payload, work).await
            }
        }
    };
}

/// The parked events, oldest first, with `$processed_at` the dialect's expression for
/// `processed_at` in milliseconds since the Unix epoch.
macro_rules! parked_sql {
    ($processed_at:literal) => {
        concat!(
            r#"
SELECT event_id, attempts, last_error, payload, "#,
            $processed_at,
            r#"
FROM processed_events
WHERE consumer = $1 AND status = 'parked'
ORDER BY processed_at, event_id
LIMIT $2
"#
        )
    };
}

/// Take one parked event out, returning what [`parked_sql!`] lists of it.
macro_rules! replay_sql {
    ($processed_at:literal) => {
        concat!(
            r#"
DELETE FROM processed_events
WHERE consumer = $1 AND event_id = $2 AND status = 'parked'
RETURNING event_id, attempts, last_error, payload, "#,
            $processed_at,
            "\n"
        )
    };
}

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// The table used unless [`SqlConsumer::with_table`] names another.
pub const DEFAULT_TABLE: &str = "processed_events";

/// The tracking table of the default table's migrations, apart from the application's own
/// `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_tower_idempotency_consumer_migrations";

pub use crate::DEFAULT_MAX_ATTEMPTS;

/// The longest error text kept in `last_error`, in bytes.
const MAX_ERROR_LEN: usize = 2000;

/// How many times `migrate` runs when another process applied the same migration meanwhile.
const MIGRATE_ATTEMPTS: usize = 3;

/// A database the SQL consumer runs on: PostgreSQL or SQLite. Sealed.
pub trait SqlBackend: Database + sealed::Sealed {
    #[doc(hidden)]
    fn dialect() -> &'static Dialect;
    #[doc(hidden)]
    fn rows_affected(result: &Self::QueryResult) -> u64;
}

mod sealed {
    pub trait Sealed {}
}

/// The SQL text of one database, with `processed_events` standing for the table name.
#[doc(hidden)]
#[derive(Debug)]
pub struct Dialect {
    begin: &'static str,
    claim: &'static str,
    state: &'static str,
    fail: &'static str,
    parked: &'static str,
    replay: &'static str,
    sweep: &'static str,
    migrations: [&'static str; 2],
    /// sqlx's migration lock belongs to the connection's session (PostgreSQL's advisory lock):
    /// a run that fails or is dropped part way keeps it, so `migrate` closes that connection
    /// instead of giving it back to the pool, where every later run would wait on it.
    migration_lock_of_the_session: bool,
}

/// The statements of one table: the dialect's text with the table's name in it.
#[derive(Debug)]
struct Statements {
    claim: Arc<str>,
    state: Arc<str>,
    fail: Arc<str>,
    parked: Arc<str>,
    replay: Arc<str>,
    sweep: Arc<str>,
}

impl Statements {
    fn new(dialect: &Dialect, table: &TableName) -> Self {
        let sql = |text: &str| Arc::from(table.substitute(text));
        Self {
            claim: sql(dialect.claim),
            state: sql(dialect.state),
            fail: sql(dialect.fail),
            parked: sql(dialect.parked),
            replay: sql(dialect.replay),
            sweep: sql(dialect.sweep),
        }
    }
}

/// A table name: lower-case ASCII letters, digits and `_`, starting with a letter or `_`, at
/// most 40 bytes (so that the names derived from it fit PostgreSQL's 63).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName(Arc<str>);

impl TableName {
    /// Check `name`.
    ///
    /// ```
    /// use tower_idempotency_consumer::sql::TableName;
    /// assert!(TableName::new("billing_events").is_ok());
    /// assert!(TableName::new("Events; DROP TABLE x").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self, InvalidTableName> {
        let mut bytes = name.bytes();
        let valid_start = bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
        let valid_rest = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if valid_start && valid_rest && name.len() <= 40 {
            Ok(Self(name.into()))
        } else {
            Err(InvalidTableName(name.into()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn substitute(&self, template: &str) -> String {
        template.replace(DEFAULT_TABLE, &self.0)
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(DEFAULT_TABLE.into())
    }
}

/// A table name [`TableName::new`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a valid table name: use 1 to 40 lower-case ASCII letters, digits and `_`, starting with a letter or `_`")]
pub struct InvalidTableName(String);

/// What [`SqlConsumer::claim`] found for an event, inside the caller's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "only Claimed lets the caller do the work"]
pub enum Claim {
    /// The event is now marked processed in the transaction: do the work in it and commit.
    Claimed {
        /// How many earlier attempts failed (0 on the first delivery).
        failed_attempts: u32,
    },
    /// The event was processed (and committed) before: do nothing.
    Duplicate,
    /// The event failed too often and is parked: do nothing until it is replayed.
    Parked {
        /// How many attempts failed.
        attempts: u32,
    },
}

/// Runs work at most once per event id of one consumer, with the processed mark in the work's
/// own SQL transaction. [`PgConsumer`](crate::PgConsumer) and
/// [`SqliteConsumer`](crate::SqliteConsumer) name it for each database.
pub struct SqlConsumer<DB: SqlBackend> {
    pool: Pool<DB>,
    name: Arc<str>,
    table: TableName,
    max_attempts: NonZeroU32,
    statements: Arc<Statements>,
}

impl<DB: SqlBackend> Clone for SqlConsumer<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            name: self.name.clone(),
            table: self.table.clone(),
            max_attempts: self.max_attempts,
            statements: self.statements.clone(),
        }
    }
}

impl<DB: SqlBackend> fmt::Debug for SqlConsumer<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConsumer")
            .field("name", &self.name)
            .field("table", &self.table.as_str())
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl<DB> SqlConsumer<DB>
where
    DB: SqlBackend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    for<'r> i64: Encode<'r, DB> + Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// A consumer named `name` (one queue handler, one webhook endpoint) on `pool`, with the
    /// [`DEFAULT_TABLE`] and [`DEFAULT_MAX_ATTEMPTS`].
    pub fn new(pool: Pool<DB>, name: impl Into<Arc<str>>) -> Self {
        let table = TableName::default();
        Self {
            statements: Arc::new(Statements::new(DB::dialect(), &table)),
            pool,
            name: name.into(),
            table,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Keep the marks in `table` instead of [`DEFAULT_TABLE`]; run [`migrate`](Self::migrate)
    /// to create it.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn run(pool: sqlx::SqlitePool) -> Result<(), tower_idempotency_consumer::sql::InvalidTableName> {
    /// use tower_idempotency_consumer::{sql::TableName, SqliteConsumer};
    /// let billing = SqliteConsumer::new(pool, "billing").with_table(TableName::new("billing_events")?);
    /// assert_eq!(billing.table(), "billing_events");
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_table(mut self, table: TableName) -> Self {
        self.statements = Arc::new(Statements::new(DB::dialect(), &table));
        self.table = table;
        self
    }

    /// Park an event after `max_attempts` failures instead of [`DEFAULT_MAX_ATTEMPTS`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn run(pool: sqlx::SqlitePool) {
    /// use std::num::NonZeroU32;
    /// use tower_idempotency_consumer::SqliteConsumer;
    /// let ledger = SqliteConsumer::new(pool, "ledger").with_max_attempts(NonZeroU32::MIN);
    /// # }
    /// ```
    pub fn with_max_attempts(mut self, max_attempts: NonZeroU32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The table the marks live in.
    pub fn table(&self) -> &str {
        self.table.as_str()
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The table sqlx tracks this table's migrations in: [`MIGRATIONS_TABLE`] for the default
    /// table, `_tower_idempotency_consumer_<table>_migrations` for another.
    pub fn migrations_table(&self) -> String {
        if self.table.as_str() == DEFAULT_TABLE {
            MIGRATIONS_TABLE.to_owned()
        } else {
            format!(
                "_tower_idempotency_consumer_{}_migrations",
                self.table.as_str()
            )
        }
    }

    /// Create or upgrade the table. Safe to call on every start, from several processes at once.
    pub async fn migrate(&self) -> Result<(), MigrateError>
    where
        DB: sqlx::migrate::MigrateDatabase,
        DB::Connection: sqlx::migrate::Migrate,
    {
        let descriptions = ["processed events", "attempts and parking"];
        let migrations = DB::dialect()
            .migrations
            .iter()
            .zip(descriptions)
            .zip(1..)
            .map(|((sql, description), version)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    AssertSqlSafe(self.table.substitute(sql)).into_sql_str(),
                    false,
                )
            })
            .collect();
        let mut migrator = Migrator::with_migrations(migrations);
        migrator.dangerous_set_table_name(self.migrations_table());
        let mut attempt = 1;
        loop {
            let mut conn = self.pool.acquire().await?;
            if DB::dialect().migration_lock_of_the_session {
                conn.close_on_drop();
            }
            match migrator.run_direct(None, &mut *conn, false).await {
                Ok(()) => return Ok(()),
                // Another process applied the same version meanwhile: the next run finds it.
                Err(MigrateError::Execute(_) | MigrateError::ExecuteMigration(..))
                    if attempt < MIGRATE_ATTEMPTS =>
                {
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Begin a transaction the way this database needs for [`claim`](Self::claim):
    /// `BEGIN` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite.
    pub async fn begin(&self) -> Result<Transaction<'static, DB>, sqlx::Error> {
        self.pool.begin_with(DB::dialect().begin).await
    }

    /// Mark `event_id` processed inside `tx`, the caller's own transaction.
    ///
    /// One statement (`INSERT .. ON CONFLICT DO UPDATE .. WHERE status = 'failed'
    /// RETURNING`), plus a read when the event was not claimed. A concurrent transaction
    /// claiming the same event waits for this one: it finds [`Claim::Duplicate`] if this one
    /// commits, or claims it if this one rolls back.
    pub async fn claim(
        &self,
        tx: &mut Transaction<'_, DB>,
        event_id: &str,
    ) -> Result<Claim, sqlx::Error> {
        let claimed: Option<(i64,)> = sqlx::query_as(AssertSqlSafe(self.statements.claim.clone()))
            .bind(&*self.name)
            .bind(event_id)
            .fetch_optional(&mut **tx)
            .await?;
        if let Some((failed_attempts,)) = claimed {
            return Ok(Claim::Claimed {
                failed_attempts: count(failed_attempts),
            });
        }
        let (status, attempts): (String, i64) =
            sqlx::query_as(AssertSqlSafe(self.statements.state.clone()))
                .bind(&*self.name)
                .bind(event_id)
                .fetch_one(&mut **tx)
                .await?;
        Ok(if status == "parked" {
            Claim::Parked {
                attempts: count(attempts),
            }
        } else {
            Claim::Duplicate
        })
    }

    /// Record a failed attempt of `event_id` (after its transaction rolled back), parking the
    /// event when it reached the maximum. Returns whether it is now parked, and its attempts.
    ///
    /// `payload` is kept for [`replay`](Self::replay) (the last one given wins). An event that
    /// meanwhile committed or was parked is left alone.
    pub async fn record_failure(
        &self,
        event_id: &str,
        error: &str,
        payload: Option<&[u8]>,
    ) -> Result<Option<(bool, u32)>, sqlx::Error> {
        let recorded: Option<(String, i64)> =
            sqlx::query_as(AssertSqlSafe(self.statements.fail.clone()))
                .bind(&*self.name)
                .bind(event_id)
                .bind(i64::from(self.max_attempts.get()))
                .bind(&*error_text(error))
                .bind(payload)
                .fetch_optional(&self.pool)
                .await?;
        Ok(recorded.map(|(status, attempts)| (status == "parked", count(attempts))))
    }

    /// [`Consumer::process_once_with_payload`](crate::Consumer::process_once_with_payload), as a plain method of this type.
    async fn run_once<T, E, F>(
        &self,
        event_id: &str,
        payload: Option<&[u8]>,
        work: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        E: fmt::Display,
        F: for<'c> FnOnce(&'c mut DB::Connection) -> BoxFuture<'c, Result<T, E>>,
    {
        crate::error::check_event_id(event_id)?;
        let mut tx = self.begin().await?;
        match self.claim(&mut tx, event_id).await? {
            Claim::Claimed { .. } => {}
            Claim::Duplicate => {
                tx.rollback().await?;
                return Ok(Outcome::Duplicate);
            }
            Claim::Parked { attempts } => {
                tx.rollback().await?;
                return Ok(Outcome::Parked { attempts });
            }
        }
        let err = match AssertUnwindSafe(work(&mut *tx)).catch_unwind().await {
            Ok(Ok(value)) => {
                tx.commit().await?;
                return Ok(Outcome::Processed(value));
            }
            Ok(Err(err)) => err,
            Err(panic) => {
                // Counted like a failure, so that a work that always panics is parked at the
                // maximum attempts instead of coming back for ever; then the panic goes on.
                drop(tx);
                let why = crate::error::panicked(&*panic);
                match self.record_failure(event_id, &why, payload).await {
                    Ok(Some((true, attempts))) => {
                        tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.name, event_id, attempts, error = why, "event parked after its last allowed attempt");
                    }
                    Ok(_) => {}
                    Err(record) => {
                        tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.name, event_id, error = %record, "recording a panicked attempt failed");
                    }
                }
                std::panic::resume_unwind(panic)
            }
        };
        // The work's error is the one worth reporting; a failed rollback ends the transaction
        // anyway when the connection is closed or reused.
        if let Err(rollback) = tx.rollback().await {
            tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.name, event_id, error = %rollback, "rollback after a failed work failed");
        }
        match self
            .record_failure(event_id, &err.to_string(), payload)
            .await
        {
            Ok(Some((true, attempts))) => {
                tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.name, event_id, attempts, error = %err, "event parked after its last allowed attempt");
                Err(Error::Parked(err))
            }
            Ok(_) => Err(Error::Work(err)),
            Err(record) => {
                tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.name, event_id, error = %record, "recording a failed attempt failed; the next delivery runs the work again");
                Err(Error::Work(err))
            }
        }
    }

    /// Up to `limit` parked events of this consumer, oldest first.
    pub async fn parked(&self, limit: u32) -> Result<Vec<ParkedEvent>, sqlx::Error> {
        let rows = sqlx::query(AssertSqlSafe(self.statements.parked.clone()))
            .bind(&*self.name)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(parked_event::<DB>).collect()
    }

    /// Forget a parked event so that its next delivery runs the work with fresh attempts;
    /// returns its record (with its payload, to republish it), or `None` if it was not parked.
    pub async fn replay(&self, event_id: &str) -> Result<Option<ParkedEvent>, sqlx::Error> {
        let row = sqlx::query(AssertSqlSafe(self.statements.replay.clone()))
            .bind(&*self.name)
            .bind(event_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(parked_event::<DB>).transpose()
    }

    /// Delete one batch of at most `batch` of this consumer's marks older than `older_than`.
    ///
    /// Parked events are kept (replay them or keep them for the record). Returns how many rows
    /// it deleted; [`sweep`](Self::sweep) calls it until the old rows are gone.
    pub async fn sweep_batch(&self, older_than: Duration, batch: u32) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(self.statements.sweep.clone()))
            .bind(&*self.name)
            .bind(millis(older_than))
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done))
    }

    /// Delete this consumer's marks older than `older_than`, `batch` rows per statement.
    ///
    /// Each batch is a statement (and transaction) of its own, so locks stay short. Returns the
    /// total deleted.
    ///
    /// # Warning
    ///
    /// Keep `older_than` longer than the provider's redelivery window (Stripe retries for three
    /// days): a redelivery after its mark was swept runs the work again.
    pub async fn sweep(&self, older_than: Duration, batch: u32) -> Result<u64, sqlx::Error> {
        let batch = batch.max(1);
        let mut total = 0;
        loop {
            let deleted = self.sweep_batch(older_than, batch).await?;
            total += deleted;
            if deleted < u64::from(batch) {
                return Ok(total);
            }
        }
    }
}

fn parked_event<DB>(row: &DB::Row) -> Result<ParkedEvent, sqlx::Error>
where
    DB: Database,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    Ok(ParkedEvent {
        event_id: row.try_get(0)?,
        attempts: count(row.try_get(1)?),
        last_error: row.try_get(2)?,
        payload: row.try_get(3)?,
        parked_at_ms: row.try_get(4)?,
    })
}

fn count(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

/// [`crate::time::millis`] as the SQL's `BIGINT`.
fn millis(duration: Duration) -> i64 {
    i64::try_from(crate::time::millis(duration)).unwrap_or(i64::MAX)
}

/// `error` as a `last_error` every database takes: at most [`MAX_ERROR_LEN`] bytes, and NUL
/// (which PostgreSQL's `text` refuses, and a work's error can quote from its input) written as
/// U+FFFD, so that recording the failure cannot fail for what the error says.
fn error_text(error: &str) -> std::borrow::Cow<'_, str> {
    let mut end = error.len().min(MAX_ERROR_LEN);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    let kept = &error[..end];
    if kept.contains('\0') {
        kept.replace('\0', "\u{FFFD}").into()
    } else {
        kept.into()
    }
}
