//! SQLite (feature `sqlite`): [`SqliteConsumer`](crate::SqliteConsumer), the processed mark and
//! the work in one transaction.
//!
//! ```no_run
//! use tower_idempotency_consumer::{Consumer, Outcome, SqliteConsumer};
//!
//! # async fn run(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! let ledger = SqliteConsumer::new(pool, "ledger");
//! ledger.migrate().await?;
//! let outcome = ledger
//!     .process_once("evt_1", |tx| {
//!         Box::pin(async move {
//!             sqlx::query("INSERT INTO ledger (event_id, cents) VALUES ('evt_1', 4000)")
//!                 .execute(&mut *tx)
//!                 .await
//!         })
//!     })
//!     .await?;
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
//! The transaction begins with `BEGIN IMMEDIATE` ([`SqlConsumer::begin`](super::SqlConsumer::begin)),
//! which takes SQLite's write lock at once, then claims the event before the work runs. A second
//! delivery's `BEGIN IMMEDIATE` waits (up to the busy timeout) until the first commits or rolls
//! back; it then finds the event processed (`Duplicate`) or not (the work runs). A delivery that
//! waits longer than the busy timeout fails with [`Error::Database`](crate::Error::Database)
//! ("database is locked") and nothing is recorded: let the provider redeliver.
//!
//! When you call [`claim`](super::SqlConsumer::claim) in a transaction of your own, begin it
//! with `pool.begin_with("BEGIN IMMEDIATE")` for the same reason.
//!
//! The write lock is held while the work runs, so every writer of the database waits for it:
//! keep the work short, as any SQLite write transaction.
//!
//! # Migrations
//!
//! [`SqlConsumer::migrate`](super::SqlConsumer::migrate) applies the embedded migrations and
//! tracks them in their own table, never in your application's `_sqlx_migrations`. Several
//! processes may call it at start-up at once.
//!
//! If you run your own migrations instead, this is the schema (`migrations/sqlite/*.sql`,
//! verbatim; another table name replaces `processed_events`):
//!
//! ```sql
#![doc = include_str!("../../migrations/sqlite/0001_processed_events.sql")]
#![doc = include_str!("../../migrations/sqlite/0002_attempts_and_parking.sql")]
//! ```

use sqlx::Sqlite;

use super::Dialect;

sql_backend!(Sqlite, &DIALECT);

/// SQLite's clock in milliseconds since the Unix epoch.
macro_rules! now_ms {
    () => {
        "CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}

// The same statements as PostgreSQL's, in the same order, with SQLite's clock and no row
// locks (the write lock taken by BEGIN IMMEDIATE serialises writers).
static DIALECT: Dialect = Dialect {
    begin: "BEGIN IMMEDIATE",
    claim: concat!(
        r#"
INSERT INTO processed_events (consumer, event_id, processed_at, status, attempts)
VALUES ($1, $2, "#,
        now_ms!(),
        r#", 'processed', 0)
ON CONFLICT (consumer, event_id) DO UPDATE SET status = 'processed', processed_at = "#,
        now_ms!(),
        r#"
WHERE processed_events.status = 'failed'
RETURNING attempts
"#
    ),
    state: r#"
SELECT status, attempts FROM processed_events WHERE consumer = $1 AND event_id = $2
"#,
    fail: concat!(
        r#"
INSERT INTO processed_events (consumer, event_id, processed_at, status, attempts, last_error, payload)
VALUES ($1, $2, "#,
        now_ms!(),
        r#", CASE WHEN 1 >= $3 THEN 'parked' ELSE 'failed' END, 1, $4, $5)
ON CONFLICT (consumer, event_id) DO UPDATE SET
    attempts = processed_events.attempts + 1,
    status = CASE WHEN processed_events.attempts + 1 >= $3 THEN 'parked' ELSE 'failed' END,
    last_error = excluded.last_error,
    payload = COALESCE(excluded.payload, processed_events.payload),
    processed_at = "#,
        now_ms!(),
        r#"
WHERE processed_events.status = 'failed'
RETURNING status, attempts
"#
    ),
    parked: parked_sql!("processed_at"),
    replay: replay_sql!("processed_at"),
    sweep: concat!(
        r#"
DELETE FROM processed_events
WHERE rowid IN (
    SELECT rowid FROM processed_events
    WHERE consumer = $1 AND status <> 'parked'
      AND processed_at <= "#,
        now_ms!(),
        r#" - $2
    LIMIT $3
)
"#
    ),
    migrations: [
        include_str!("../../migrations/sqlite/0001_processed_events.sql"),
        include_str!("../../migrations/sqlite/0002_attempts_and_parking.sql"),
    ],
    migration_lock_of_the_session: false,
};
