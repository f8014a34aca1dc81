//! Shared helpers for the integration tests: fresh databases, Redis prefixes, a test server,
//! the store contract suite ([`contract`]) and the behaviour suite ([`suite`]).
//!
//! URLs are read at run time. A missing variable fails the test with the variable's name: the
//! database tests never skip themselves.

pub mod contract;
pub mod records;
pub mod stores;
pub mod suite;

pub use tower_idempotency_testkit::{mysql_url, postgres_url, redis_url, unique_name};

/// The connect options of a freshly created PostgreSQL database of its own, on the server at
/// `DATABASE_URL`.
pub async fn fresh_postgres_database() -> sqlx::postgres::PgConnectOptions {
    tower_idempotency_testkit::fresh_postgres("tidem")
        .await
        .options
}

/// A pool on a freshly created PostgreSQL database of its own.
///
/// `#[sqlx::test]` runs on a current-thread runtime; the concurrency tests need a multi-thread
/// runtime and their own database, which this gives them.
pub async fn fresh_postgres_pool(max_connections: u32) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(fresh_postgres_database().await)
        .await
        .expect("connect to the fresh test database")
}

/// The transaction isolation level of every connection of a MySQL test pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// `READ COMMITTED`: no gap locks, each statement reads the latest committed rows.
    ReadCommitted,
    /// `REPEATABLE READ`: InnoDB's default, with gap (next-key) locks.
    RepeatableRead,
}

impl Isolation {
    fn sql(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        }
    }
}

/// The connect options of a freshly created MySQL database of its own, on the server at
/// `MYSQL_URL`.
pub async fn fresh_mysql_database() -> sqlx::mysql::MySqlConnectOptions {
    tower_idempotency_testkit::fresh_mysql("tidem")
        .await
        .options
}

/// A pool on a freshly created MySQL database of its own, every connection at `isolation`.
pub async fn fresh_mysql_pool(max_connections: u32, isolation: Isolation) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(conn, isolation.sql()).await?;
                Ok(())
            })
        })
        .connect_with(fresh_mysql_database().await)
        .await
        .expect("connect to the fresh MySQL test database")
}

/// A pool on a fresh SQLite file in the system temp dir (WAL mode, busy timeout set).
pub async fn fresh_sqlite_pool(max_connections: u32) -> sqlx::SqlitePool {
    let path = tower_idempotency_testkit::fresh_sqlite_path("tidem");
    let busy = std::time::Duration::from_secs(10);
    tower_idempotency_testkit::sqlite_pool(&path, max_connections, busy).await
}

/// A Redis client for `REDIS_URL`.
pub fn redis_client() -> redis::Client {
    let url = redis_url();
    redis::Client::open(url.as_str())
        .unwrap_or_else(|e| panic!("REDIS_URL={url} is not a valid Redis URL: {e}"))
}
