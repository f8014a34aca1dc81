//! PostgreSQL (feature `postgres`): the dedupe row and the work in one transaction.
//!
//! ```no_run
//! use tower_idempotency_consumer::{postgres, Outcome};
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! postgres::migrate(&pool).await?;
//! let outcome = postgres::process_once(&pool, "ledger", "evt_1", |tx| {
//!     Box::pin(async move {
//!         sqlx::query("INSERT INTO ledger (event_id, cents) VALUES ('evt_1', 4000)")
//!             .execute(&mut **tx)
//!             .await
//!     })
//! })
//! .await?;
//! assert!(matches!(outcome, Outcome::Processed(_) | Outcome::Duplicate));
//! # Ok(())
//! # }
//! ```
//!
//! # How concurrent deliveries are kept apart
//!
//! [`process_once`] begins a transaction and inserts the row with `INSERT .. ON CONFLICT DO
//! NOTHING` before the work runs. The primary key decides: a second delivery's insert of the
//! same (consumer, event id) waits on the first transaction's uncommitted row. When the first
//! commits, the insert does nothing and the second delivery reports [`Outcome::Duplicate`];
//! when it rolls back, the insert succeeds and the second delivery runs the work. Two
//! deliveries can never both run it.
//!
//! The wait lasts as long as the first delivery's transaction. To give up sooner, set a
//! `lock_timeout` on the pool's connections (for example with `PgConnectOptions::options`): the
//! waiting delivery then fails with [`Error::Database`], records nothing, and is redelivered.
//!
//! This relies on the default isolation level, READ COMMITTED. Under REPEATABLE READ or
//! SERIALIZABLE the waiting insert fails with a serialization error instead
//! ([`Error::Database`]); the next delivery then reports `Duplicate`.
//!
//! # Migrations
//!
//! [`migrate`] applies the embedded migrations and tracks them in its own table,
//! `_tower_idempotency_consumer_migrations`, never in your application's `_sqlx_migrations`.
//! It takes sqlx's advisory lock, so several instances may call it at start-up at once.
//!
//! If you run your own migrations instead, this is the schema
//! (`migrations/postgres/0001_processed_events.sql`, verbatim):
//!
//! ```sql
#![doc = include_str!("../migrations/postgres/0001_processed_events.sql")]
//! ```

use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::{
    migrate::{MigrateError, Migration, MigrationType, Migrator},
    PgPool, Postgres, SqlSafeStr, Transaction,
};

use crate::{Error, Outcome};

/// The table sqlx records this crate's applied migrations in, apart from the application's own.
pub const MIGRATIONS_TABLE: &str = "_tower_idempotency_consumer_migrations";

/// Claim the event for this transaction; 0 rows affected means it was processed before.
const INSERT: &str = r#"
INSERT INTO processed_events (consumer, event_id, processed_at)
VALUES ($1, $2, now())
ON CONFLICT (consumer, event_id) DO NOTHING
"#;

/// Delete up to `$2` rows processed more than `$1` milliseconds ago, skipping rows another
/// transaction holds, so a sweep never waits on (or for) a delivery in progress.
const SWEEP: &str = r#"
DELETE FROM processed_events
WHERE (consumer, event_id) IN (
    SELECT consumer, event_id FROM processed_events
    WHERE processed_at < now() - $1 * interval '1 millisecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
"#;

/// Create or upgrade the `processed_events` table.
///
/// Safe to call on every start, from several processes at once.
pub async fn migrate(pool: &PgPool) -> Result<(), MigrateError> {
    migrator().run(pool).await
}

fn migrator() -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![Migration::new(
        1,
        "processed events".into(),
        MigrationType::Simple,
        include_str!("../migrations/postgres/0001_processed_events.sql").into_sql_str(),
        false,
    )]);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// Run `work` for the event unless `consumer` has processed `event_id` before.
///
/// `work` gets the transaction that holds the dedupe row; everything it writes through it
/// commits with that row or not at all. Return `Ok` to commit, `Err` to roll back: the error
/// comes back as [`Error::Work`] and a redelivery runs the work again. A panic in `work` rolls
/// back too (the transaction is dropped) and goes on unwinding.
///
/// The closure returns a boxed future so that it may borrow the transaction (the same shape as
/// sqlx's `Connection::transaction`): write `|tx| Box::pin(async move { .. })` and execute
/// queries on `&mut **tx`.
///
/// Concurrent deliveries of one event: see the [module docs](self). Deliveries of different
/// events, or of one event to different consumers, never wait on each other.
pub async fn process_once<T, E, F>(
    pool: &PgPool,
    consumer: &str,
    event_id: &str,
    work: F,
) -> Result<Outcome<T>, Error<E>>
where
    F: for<'c> FnOnce(&'c mut Transaction<'static, Postgres>) -> BoxFuture<'c, Result<T, E>>,
{
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(INSERT)
        .bind(consumer)
        .bind(event_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if inserted == 0 {
        tx.rollback().await?;
        return Ok(Outcome::Duplicate);
    }
    match work(&mut tx).await {
        Ok(value) => {
            tx.commit().await?;
            Ok(Outcome::Processed(value))
        }
        Err(err) => {
            // The work's error is the one worth reporting; a failed rollback ends the
            // transaction anyway when the connection is closed or reused.
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(target: "tower_idempotency_consumer", consumer, event_id, error = %rollback, "rollback after a failed work failed");
            }
            Err(Error::Work(err))
        }
    }
}

/// Delete one batch of at most `batch` events processed more than `older_than` ago.
///
/// Returns how many rows it deleted. [`sweep`] calls it until the old rows are gone.
pub async fn sweep_batch(
    pool: &PgPool,
    older_than: Duration,
    batch: u32,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(SWEEP)
        .bind(millis(older_than))
        .bind(i64::from(batch))
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Delete events processed more than `older_than` ago, `batch` rows per statement.
///
/// Each batch is a statement (and transaction) of its own, so locks stay short and deliveries
/// in progress are never waited for. Returns the total deleted. Keep `older_than` longer than
/// the provider's redelivery window: a redelivery after its row was swept runs the work again.
pub async fn sweep(pool: &PgPool, older_than: Duration, batch: u32) -> Result<u64, sqlx::Error> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = sweep_batch(pool, older_than, batch).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
