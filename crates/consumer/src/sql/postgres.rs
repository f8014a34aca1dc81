//! PostgreSQL (feature `postgres`): [`PgConsumer`](crate::PgConsumer), the processed mark and
//! the work in one transaction.
//!
//! ```no_run
//! use tower_idempotency_consumer::{Consumer, Outcome, PgConsumer};
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let ledger = PgConsumer::new(pool, "ledger");
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
//! # How concurrent deliveries are kept apart
//!
//! The claim is `INSERT .. ON CONFLICT DO UPDATE .. WHERE status = 'failed'` in the work's
//! transaction, before the work runs. The primary key decides: a second delivery's claim of
//! the same (consumer, event id) waits on the first transaction's uncommitted row. When the
//! first commits, the claim does nothing and the second delivery reports
//! [`Outcome::Duplicate`](crate::Outcome::Duplicate); when it rolls back, the second claims the
//! event and runs the work. Two deliveries can never both run it.
//!
//! The wait lasts as long as the first delivery's transaction. To give up sooner, set a
//! `lock_timeout` on the pool's connections (for example with `PgConnectOptions::options`): the
//! waiting delivery then fails with [`Error::Database`](crate::Error::Database), records
//! nothing, and is redelivered.
//!
//! This relies on the default isolation level, READ COMMITTED. Under REPEATABLE READ or
//! SERIALIZABLE the waiting claim fails with a serialization error instead
//! ([`Error::Database`](crate::Error::Database)); the next delivery then reports `Duplicate`.
//!
//! # Migrations
//!
//! [`SqlConsumer::migrate`](super::SqlConsumer::migrate) applies the embedded migrations and
//! tracks them in their own table, never in your application's `_sqlx_migrations`. It takes
//! sqlx's advisory lock, so several instances may call it at start-up at once.
//!
//! If you run your own migrations instead, this is the schema (`migrations/postgres/*.sql`,
//! verbatim; another table name replaces `processed_events`):
//!
//! ```sql
#![doc = include_str!("../../migrations/postgres/0001_processed_events.sql")]
#![doc = include_str!("../../migrations/postgres/0002_attempts_and_parking.sql")]
//! ```

use sqlx::Postgres;

use super::Dialect;

sql_backend!(Postgres, &DIALECT);

static DIALECT: Dialect = Dialect {
    begin: "BEGIN",
    // A new event, or one whose earlier attempts failed, is claimed; a processed or parked one
    // is not (and is then read by `state`). RETURNING gives the failures so far.
    claim: r#"
INSERT INTO processed_events (consumer, event_id, processed_at, status, attempts)
VALUES ($1, $2, now(), 'processed', 0)
ON CONFLICT (consumer, event_id) DO UPDATE SET status = 'processed', processed_at = now()
WHERE processed_events.status = 'failed'
RETURNING attempts
"#,
    state: r#"
SELECT status, attempts FROM processed_events WHERE consumer = $1 AND event_id = $2
"#,
    // $3 the maximum attempts, $4 the error, $5 the payload (or NULL).
    fail: r#"
INSERT INTO processed_events (consumer, event_id, processed_at, status, attempts, last_error, payload)
VALUES ($1, $2, now(), CASE WHEN 1 >= $3 THEN 'parked' ELSE 'failed' END, 1, $4, $5)
ON CONFLICT (consumer, event_id) DO UPDATE SET
    attempts = processed_events.attempts + 1,
    status = CASE WHEN processed_events.attempts + 1 >= $3 THEN 'parked' ELSE 'failed' END,
    last_error = excluded.last_error,
    payload = COALESCE(excluded.payload, processed_events.payload),
    processed_at = now()
WHERE processed_events.status = 'failed'
RETURNING status, attempts
"#,
    parked: parked_sql!("(extract(epoch FROM processed_at) * 1000)::bigint"),
    replay: replay_sql!("(extract(epoch FROM processed_at) * 1000)::bigint"),
    // Skips rows another transaction holds, so a sweep never waits on a delivery in progress.
    sweep: r#"
DELETE FROM processed_events
WHERE (consumer, event_id) IN (
    SELECT consumer, event_id FROM processed_events
    WHERE consumer = $1 AND status <> 'parked'
      AND processed_at <= now() - $2 * interval '1 millisecond'
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
"#,
    migrations: [
        include_str!("../../migrations/postgres/0001_processed_events.sql"),
        include_str!("../../migrations/postgres/0002_attempts_and_parking.sql"),
    ],
    migration_lock_of_the_session: true,
};
