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
