//! What every test crate of the workspace shares: the servers' URLs from the environment, a
//! fresh database per test (PostgreSQL, MySQL, SQLite), a router served on a fresh port, and
//! waiting for a spawned binary to be ready.
//!
//! Never published, and only ever a dev-dependency (or the dependency of a test-only crate, or
//! of an example's proof harness).
//!
//! URLs are read at run time. A missing variable fails the test with the variable's name: the
//! database tests never skip themselves. Every database a test creates is named `tidem_..`, and
//! every SQLite file `tidem_..db` in the system temp dir: `scripts/test.sh` drops and removes
//! them on its next run.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// The value of the environment variable `name`; a test without it fails, saying how to set it.
pub fn env_url(name: &str, example: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with scripts/test.sh or export {name}={example}")
    })
}

/// `DATABASE_URL`, the PostgreSQL server the tests create their databases on.
pub fn postgres_url() -> String {
    env_url("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// `MYSQL_URL`, the MySQL or MariaDB server the tests create their databases on.
pub fn mysql_url() -> String {
    env_url("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// `REDIS_URL`, the Redis server the tests use (each test under its own key prefix).
pub fn redis_url() -> String {
    env_url("REDIS_URL", "redis://127.0.0.1:6379")
}

/// A name no other test in this run or any earlier run uses: `prefix`, this process, a counter,
/// a random part.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        uuid::Uuid::new_v4().simple()
    )
}

/// A database created for one test: its name, its URL and its connect options.
#[derive(Debug, Clone)]
pub struct FreshDatabase<O> {
    /// Its name.
    pub name: String,
    /// The server's URL with the database replaced by this one (a query string, if any, kept).
    pub url: String,
    /// The server's connect options, on this database.
    pub options: O,
}

/// `url` with its database name replaced by `name`, its query string kept.
#[cfg(any(feature = "postgres", feature = "mysql", test))]
fn with_database(url: &str, name: &str) -> String {
    let (without_query, query) = match url.split_once('?') {
        Some((u, q)) => (u, format!("?{q}")),
        None => (url, String::new()),
    };
    let (server, _) = without_query
        .rsplit_once('/')
        .expect("the database URL ends with a database name");
    format!("{server}/{name}{query}")
}

/// Create a database named `{prefix}_..` on the PostgreSQL server of `DATABASE_URL`.
#[cfg(feature = "postgres")]
pub async fn fresh_postgres(prefix: &str) -> FreshDatabase<sqlx::postgres::PgConnectOptions> {
    use sqlx::{Connection, Executor};
    let url = postgres_url();
    let name = unique_name(prefix);
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at DATABASE_URL={url}: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
        .await
        .expect("create the test database");
    admin.close().await.ok();
    let options = url
        .parse::<sqlx::postgres::PgConnectOptions>()
        .expect("DATABASE_URL parses")
        .database(&name);
    FreshDatabase {
        url: with_database(&url, &name),
        name,
        options,
    }
}

/// Create a database named `{prefix}_..` on the MySQL (MariaDB) server of `MYSQL_URL`.
#[cfg(feature = "mysql")]
pub async fn fresh_mysql(prefix: &str) -> FreshDatabase<sqlx::mysql::MySqlConnectOptions> {
    use sqlx::{Connection, Executor};
    let url = mysql_url();
    let name = unique_name(prefix);
    let mut admin = sqlx::MySqlConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach MySQL at MYSQL_URL={url}: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .await
        .expect("create the test database");
    admin.close().await.ok();
    let options = url
        .parse::<sqlx::mysql::MySqlConnectOptions>()
        .expect("MYSQL_URL parses")
        .database(&name);
    FreshDatabase {
        url: with_database(url.split('?').next().unwrap_or(&url), &name),
        name,
        options,
    }
}

/// A fresh SQLite file's path in the system temp dir, `tidem_{label}_...db`; nothing is created
/// yet.
pub fn fresh_sqlite_path(label: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{}.db", unique_name(&format!("tidem_{label}"))))
}

/// A pool on the SQLite file at `path` (created if missing; WAL mode; a busy timeout of
/// `busy_timeout`, long enough for the test's concurrent writers).
#[cfg(feature = "sqlite")]
pub async fn sqlite_pool(
    path: &std::path::Path,
    max_connections: u32,
    busy_timeout: Duration,
) -> sqlx::SqlitePool {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(busy_timeout);
    SqlitePoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options)
        .await
        .expect("open the SQLite file")
}

/// A pool on a freshly created PostgreSQL database of its own (`tidem_..`).
///
/// `#[sqlx::test]` runs on a current-thread runtime; the concurrency tests need a multi-thread
/// runtime and their own database, which this gives them.
#[cfg(feature = "postgres")]
pub async fn fresh_postgres_pool(max_connections: u32) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(fresh_postgres("tidem").await.options)
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
    /// The statement that sets it for a session.
    pub fn sql(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        }
    }
}

/// A pool on a freshly created MySQL database of its own (`tidem_..`), every connection at
/// `isolation`.
#[cfg(feature = "mysql")]
pub async fn fresh_mysql_pool(max_connections: u32, isolation: Isolation) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(conn, isolation.sql()).await?;
                Ok(())
            })
        })
        .connect_with(fresh_mysql("tidem").await.options)
        .await
        .expect("connect to the fresh MySQL test database")
}

/// A pool on a fresh SQLite file (`tidem_..`) in the system temp dir (WAL mode, a 10 s busy
/// timeout).
#[cfg(feature = "sqlite")]
pub async fn fresh_sqlite_pool(max_connections: u32) -> sqlx::SqlitePool {
    let path = fresh_sqlite_path("store");
    sqlite_pool(&path, max_connections, Duration::from_secs(10)).await
}

/// A listener on a free port of 127.0.0.1, and its address.
pub async fn free_port() -> (tokio::net::TcpListener, std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a free port of 127.0.0.1");
    let addr = listener.local_addr().expect("the listener's address");
    (listener, addr)
}

/// Serve `app` on a free port of 127.0.0.1, on a task of its own: its address and the task
/// (abort it to stop serving). The listener is bound before this returns, so the address takes
/// connections at once.
#[cfg(feature = "serve")]
pub async fn serve(app: axum::Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let (listener, addr) = free_port().await;
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .await
            .expect("serve the test app");
    });
    (addr, task)
}

/// Wait (up to `within`) for a spawned binary's line starting with `prefix` on its stdout (its
/// readiness signal, such as `listening on http://ADDR`), and return the rest of that line; its
/// stdout is drained after, so the child never blocks on a full pipe.
pub async fn ready_line(
    child: &mut tokio::process::Child,
    prefix: &str,
    within: Duration,
) -> String {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let stdout = child.stdout.take().expect("the binary's stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let rest = tokio::time::timeout(within, async {
        while let Some(line) = lines.next_line().await.expect("read the binary's stdout") {
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
        panic!("the binary exited before printing `{prefix}`");
    })
    .await
    .unwrap_or_else(|_| panic!("the binary printed `{prefix}` within {within:?}"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    rest
}

/// The URL of a spawned server from its `listening on http://ADDR` line (up to 60 s).
pub async fn listening_url(child: &mut tokio::process::Child) -> String {
    ready_line(child, "listening on ", Duration::from_secs(60)).await
}

/// Polls `ask` every 10 ms until it answers `true`; fails the test, saying `what` it waited for,
/// past `limit`. For a state only a query can see (a lock let go, a row written elsewhere).
pub async fn until_true(limit: Duration, what: &str, mut ask: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !ask().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether a session of `conn`'s database holds an advisory lock (sqlx's migration lock is one).
#[cfg(feature = "postgres")]
pub async fn postgres_advisory_lock_held(conn: &mut sqlx::PgConnection) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
    )
    .fetch_one(conn)
    .await
    .expect("read pg_locks")
}

/// Messages ready in the RabbitMQ queue `queue` (not delivered to any consumer): a test or a
/// proof is over when none is left.
#[cfg(feature = "rabbitmq")]
pub async fn rabbitmq_ready(channel: &lapin::Channel, queue: &str) -> u32 {
    use lapin::{options::QueueDeclareOptions, types::FieldTable};

    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .expect("inspect the queue")
        .message_count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_replaced_and_the_query_kept() {
        assert_eq!(
            with_database("postgres://u@h:5432/test?sslmode=disable", "tidem_1"),
            "postgres://u@h:5432/tidem_1?sslmode=disable"
        );
        assert_eq!(
            with_database("mysql://root@h/test", "x"),
            "mysql://root@h/x"
        );
    }

    #[test]
    fn names_do_not_repeat() {
        assert_ne!(unique_name("tidem"), unique_name("tidem"));
    }
}
