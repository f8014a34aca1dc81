//! Shared helpers for the integration tests: fresh databases, Redis prefixes, a test server,
//! the store contract suite ([`contract`]) and the behaviour suite ([`suite`]).
//!
//! URLs are read at run time. A missing variable fails the test with the variable's name: the
//! database tests never skip themselves.

use std::sync::atomic::{AtomicU64, Ordering};

pub mod contract;
pub mod records;
pub mod stores;
pub mod suite;

/// `DATABASE_URL`, the PostgreSQL server the tests create their databases on.
pub fn postgres_url() -> String {
    std::env::var("DATABASE_URL")
        .expect("DATABASE_URL is not set: run the tests with scripts/test.sh or export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test")
}

/// `MYSQL_URL`, the MySQL or MariaDB server the tests create their databases on.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL")
        .expect("MYSQL_URL is not set: run the tests with scripts/test.sh or export MYSQL_URL=mysql://root@127.0.0.1:3306/test")
}

/// `REDIS_URL`, the Redis server the tests use (each test under its own key prefix).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL")
        .expect("REDIS_URL is not set: run the tests with scripts/test.sh or export REDIS_URL=redis://127.0.0.1:6379")
}

/// A name no other test in this run or any earlier run uses.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        uuid::Uuid::new_v4().simple()
    )
}

/// The connect options of a freshly created PostgreSQL database of its own, on the server at
/// `DATABASE_URL`.
pub async fn fresh_postgres_database() -> sqlx::postgres::PgConnectOptions {
    use sqlx::{Connection, Executor};
    let url = postgres_url();
    let db = unique_name("tidem");
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at DATABASE_URL={url}: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{db}""#)))
        .await
        .expect("create test database");
    let opts: sqlx::postgres::PgConnectOptions = url.parse().expect("DATABASE_URL parses");
    opts.database(&db)
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
    use sqlx::{Connection, Executor};
    let url = mysql_url();
    let db = unique_name("tidem");
    let mut admin = sqlx::MySqlConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach MySQL at MYSQL_URL={url}: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{db}`")))
        .await
        .expect("create test database");
    let opts: sqlx::mysql::MySqlConnectOptions = url.parse().expect("MYSQL_URL parses");
    opts.database(&db)
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
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let path = std::env::temp_dir().join(format!("{}.db", unique_name("tidem")));
    let opts = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(10));
    SqlitePoolOptions::new()
        .max_connections(max_connections)
        .connect_with(opts)
        .await
        .expect("open the fresh SQLite file")
}

/// A Redis client for `REDIS_URL`.
pub fn redis_client() -> redis::Client {
    let url = redis_url();
    redis::Client::open(url.as_str())
        .unwrap_or_else(|e| panic!("REDIS_URL={url} is not a valid Redis URL: {e}"))
}
