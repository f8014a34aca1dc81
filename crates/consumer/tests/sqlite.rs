//! `process_once` on SQLite: each test on a fresh database file of its own.

mod common;
mod suite;

suite::consumer_tests! {
    backend: SqliteConsumer,
    pool: SqlitePool,
    database: Sqlite,
    fresh: fresh_sqlite,
    empty: empty_sqlite,
    connect: sqlite_pool,
    insert_ten_two_day_old_rows:
        "WITH RECURSIVE n(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n WHERE n < 10)
         INSERT INTO processed_events (consumer, event_id, processed_at)
         SELECT 'ledger', 'old_' || n,
                CAST(round((julianday('now', '-2 days') - 2440587.5) * 86400000.0) AS INTEGER)
         FROM n",
    list_migration_tables:
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%migrations' ORDER BY 1",
}
