//! `process_once` on PostgreSQL: each test on a fresh database of its own.

mod common;
mod suite;

suite::consumer_tests! {
    backend: PgConsumer,
    pool: PgPool,
    database: Postgres,
    fresh: fresh_postgres,
    empty: empty_postgres,
    connect: postgres_pool,
    insert_ten_two_day_old_rows:
        "INSERT INTO processed_events (consumer, event_id, processed_at)
         SELECT 'ledger', 'old_' || n, now() - interval '2 days' FROM generate_series(1, 10) AS n",
    list_migration_tables:
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_name LIKE '%migrations' ORDER BY 1",
}

/// A migration that fails leaves no connection of the pool holding sqlx's advisory lock, which
/// every later `migrate`, from any process, would wait on without end.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_migration_leaves_no_lock_held() {
    use std::time::Duration;

    use sqlx::{Connection, Executor};
    use tower_idempotency_testkit::{postgres_advisory_lock_held, until_true};

    let url = common::empty_postgres().await;
    let pool = common::postgres_pool(&url).await;
    // A view where the table goes: `CREATE TABLE IF NOT EXISTS` passes over it, and the
    // migration's index on it fails.
    pool.execute("CREATE VIEW processed_events AS SELECT 1 AS one")
        .await
        .expect("create the view");
    // Bounded: the retry of a run that kept its lock waited on it for ever.
    let failed = tokio::time::timeout(
        Duration::from_secs(30),
        tower_idempotency_consumer::PgConsumer::new(pool.clone(), "ledger").migrate(),
    )
    .await
    .expect("migrate must return, not wait on its own lock");
    assert!(failed.is_err(), "an index on a view fails: {failed:?}");

    let mut other = sqlx::PgConnection::connect(&url).await.expect("connect");
    until_true(Duration::from_secs(10), "the lock is let go", async || {
        !postgres_advisory_lock_held(&mut other).await
    })
    .await;
}
