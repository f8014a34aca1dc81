//! SQLite (feature `sqlite`): the dedupe row and the work in one transaction.
//!
//! ```no_run
//! use tower_idempotency_consumer::{sqlite, Outcome};
//!
//! # async fn run(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! sqlite::migrate(&pool).await?;
//! let outcome = sqlite::process_once(&pool, "ledger", "evt_1", |tx| {
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
//! Use WAL mode (`journal_mode=WAL`) and a busy timeout longer than your longest work, as for
//! any SQLite database written from several connections.
//!
//! # How concurrent deliveries are kept apart
//!
//! [`process_once`] begins with `BEGIN IMMEDIATE`, which takes SQLite's write lock at once, then
//! inserts the row with `INSERT .. ON CONFLICT DO NOTHING` before the work runs. A second
//! delivery's `BEGIN IMMEDIATE` waits (up to the busy timeout) until the first commits or rolls
//! back; it then finds the row ([`Outcome::Duplicate`]) or not (the work runs). A delivery that
//! waits longer than the busy timeout fails with [`Error::Database`] ("database is locked") and
//! nothing is recorded: let the provider redeliver.
//!
//! The write lock is held while the work runs, so every writer of the database waits for it:
//! keep the work short, as any SQLite write transaction.
//!
//! # Migrations
//!
//! [`migrate`] applies the embedded migrations and tracks them in its own table,
//! `_tower_idempotency_consumer_migrations`, never in your application's `_sqlx_migrations`.
//! Several processes may call it at start-up at once.
//!
//! If you run your own migrations instead, this is the schema
//! (`migrations/sqlite/0001_processed_events.sql`, verbatim):
//!
//! ```sql
#![doc = include_str!("../migrations/sqlite/0001_processed_events.sql")]
//! ```

use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::{
    migrate::{MigrateError, Migration, MigrationType, Migrator},
    SqlSafeStr, Sqlite, SqlitePool, Transaction,
};

use crate::{Error, Outcome};

/// The table sqlx records this crate's applied migrations in, apart from the application's own.
pub const MIGRATIONS_TABLE: &str = "_tower_idempotency_consumer_migrations";

/// How many times `migrate` runs when another process applied the same migration meanwhile.
const MIGRATE_ATTEMPTS: usize = 3;

/// SQLite's clock in milliseconds since the Unix epoch.
macro_rules! now_ms {
    () => {
        "CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}

/// Claim the event for this transaction; 0 rows affected means it was processed before.
const INSERT: &str = concat!(
    r#"
INSERT INTO processed_events (consumer, event_id, processed_at)
VALUES ($1, $2, "#,
    now_ms!(),
    r#")
ON CONFLICT (consumer, event_id) DO NOTHING
"#
);

/// Delete up to `$2` rows processed more than `$1` milliseconds ago.
const SWEEP: &str = concat!(
    r#"
DELETE FROM processed_events
WHERE rowid IN (
    SELECT rowid FROM processed_events
    WHERE processed_at < "#,
    now_ms!(),
    r#" - $1
    LIMIT $2
)
"#
);

/// Create or upgrade the `processed_events` table.
///
/// Safe to call on every start, from several processes at once: the schema is created with
/// `IF NOT EXISTS`, and a run that loses the race to record a version runs again and finds it
/// applied.
pub async fn migrate(pool: &SqlitePool) -> Result<(), MigrateError> {
    let migrator = migrator();
    let mut attempt = 1;
    loop {
        match migrator.run(pool).await {
            Ok(()) => return Ok(()),
            Err(MigrateError::Execute(_) | MigrateError::ExecuteMigration(..))
                if attempt < MIGRATE_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

fn migrator() -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![Migration::new(
        1,
        "processed events".into(),
        MigrationType::Simple,
        include_str!("../migrations/sqlite/0001_processed_events.sql").into_sql_str(),
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
/// Concurrent deliveries: see the [module docs](self).
pub async fn process_once<T, E, F>(
    pool: &SqlitePool,
    consumer: &str,
    event_id: &str,
    work: F,
) -> Result<Outcome<T>, Error<E>>
where
    F: for<'c> FnOnce(&'c mut Transaction<'static, Sqlite>) -> BoxFuture<'c, Result<T, E>>,
{
    // IMMEDIATE: take the write lock now, so a concurrent delivery waits here for the outcome
    // of this one instead of failing later on a lock upgrade.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
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
    pool: &SqlitePool,
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
/// Each batch is a statement (and transaction) of its own, so the write lock is released between
/// batches and deliveries are not held up for long. Returns the total deleted. Keep `older_than`
/// longer than the provider's redelivery window: a redelivery after its row was swept runs the
/// work again.
pub async fn sweep(
    pool: &SqlitePool,
    older_than: Duration,
    batch: u32,
) -> Result<u64, sqlx::Error> {
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
