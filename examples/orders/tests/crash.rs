//! Crash safety of the real binary in transactional mode.
//!
//! The process is killed (SIGKILL) while the simulated payment provider is still answering, after
//! the key was claimed and before anything was committed. No order may exist afterwards; a
//! second instance must then take the key over once the lease lapses and create exactly one
//! order.
//!
//! Needs `DATABASE_URL` (a PostgreSQL server the test may create databases on) and `MYSQL_URL`
//! (a MySQL or MariaDB server, likewise).

mod common;

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::process::Child;

const BODY: &str = r#"{"customerId": "c_crash", "totalCents": 4000}"#;

/// A database the test can inspect, and the `DATABASE_URL` the binary gets for it.
enum Probe {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
    MySql(sqlx::MySqlPool),
}

impl Probe {
    async fn count(&self, table: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}"));
        match self {
            Probe::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Probe::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Probe::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("count {table}: {e}"))
    }
}

/// A fresh PostgreSQL database: its URL and a pool on it.
async fn fresh_postgres() -> (String, Probe) {
    let db = common::fresh_postgres("tidem_orders_crash").await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(db.options)
        .await
        .expect("connect to the test database");
    (db.url, Probe::Postgres(pool))
}

/// A fresh MySQL database: its URL and a pool on it.
async fn fresh_mysql() -> (String, Probe) {
    let (url, options) = common::fresh_mysql("tidem_orders_crash").await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("connect to the test database");
    (url, Probe::MySql(pool))
}

/// A fresh SQLite file: its URL and a pool on it (opened once the binary created it).
async fn fresh_sqlite() -> (String, std::path::PathBuf) {
    let path = tower_idempotency_testkit::fresh_sqlite_path("orders_crash");
    (format!("sqlite://{}", path.display()), path)
}

async fn sqlite_probe(path: &std::path::Path) -> Probe {
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(10));
    Probe::Sqlite(
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(opts)
            .await
            .expect("open the binary's SQLite file"),
    )
}

/// The running binary and the address it printed.
struct Server {
    child: Child,
    base: String,
}

/// Start the real binary and wait (up to 60 s) for its `listening on http://ADDR` line.
async fn start(database_url: &str, payment_latency_ms: u64) -> Server {
    let mut child = common::orders_api(database_url)
        .env("PAYMENT_LATENCY_MS", payment_latency_ms.to_string())
        .env("IDEMPOTENCY_LEASE_MS", "1000")
        .env("RUST_LOG", "warn")
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the orders-api binary");
    let base = common::listening_url(&mut child).await;
    Server { child, base }
}

/// Poll the database until `table` has `rows` rows; bounded by `within`.
async fn wait_for_rows(db: &Probe, table: &str, rows: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if db.count(table).await == rows {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{table} did not reach {rows} rows within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn killed_during_payment_leaves_no_order_and_the_retry_creates_one(
    database_url: &str,
    probe: impl AsyncFnOnce() -> Probe,
) {
    let key = uuid::Uuid::new_v4().to_string();
    let client = common::client();

    // 1. First instance: the payment takes 3 s, the lease is 1 s (renewed while it lives).
    let mut first = start(database_url, 3000).await;
    let db = probe().await;
    let request = tokio::spawn(common::post_order(&client, &first.base, &key, BODY).send());

    // 2. The claim is committed on its own before the handler runs: that is the signal that the
    //    handler is inside the payment wait. Kill the process there.
    wait_for_rows(&db, "idempotency_records", 1, Duration::from_secs(10)).await;
    first
        .child
        .kill()
        .await
        .expect("SIGKILL the first instance");
    let outcome = request.await.expect("request task");
    assert!(
        outcome.is_err(),
        "the killed instance cannot have answered: {outcome:?}"
    );
    assert_eq!(
        db.count("orders").await,
        0,
        "a process killed during the payment wait leaves no order"
    );

    // 3. Second instance: retry the same key until the dead holder's lease lapses.
    let second = start(database_url, 100).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut conflicts = 0;
    let created = loop {
        let response = common::post_order(&client, &second.base, &key, BODY)
            .send()
            .await
            .expect("the second instance answers");
        if response.status() != reqwest::StatusCode::CONFLICT {
            break response;
        }
        conflicts += 1;
        let retry_after: u64 = response.headers()["retry-after"]
            .to_str()
            .expect("Retry-After is text")
            .parse()
            .expect("Retry-After is whole seconds");
        assert!(
            Instant::now() < deadline && conflicts < 30,
            "still 409 after {conflicts} attempts"
        );
        // The server says when to come back; that is the protocol, not a guess.
        tokio::time::sleep(Duration::from_secs(retry_after)).await;
    };
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    assert!(created.headers().get("idempotent-replayed").is_none());
    let body = created.text().await.expect("body");
    assert_eq!(db.count("orders").await, 1, "exactly one order");

    // 4. And from now on the same key replays that answer.
    let replay = common::post_order(&client, &second.base, &key, BODY)
        .send()
        .await
        .expect("replay");
    assert_eq!(replay.status(), reqwest::StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.expect("body"), body);
    assert_eq!(db.count("orders").await, 1);

    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_crash_during_payment_leaves_no_order() {
    let (url, probe) = fresh_postgres().await;
    killed_during_payment_leaves_no_order_and_the_retry_creates_one(&url, async || probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_crash_during_payment_leaves_no_order() {
    let (url, path) = fresh_sqlite().await;
    killed_during_payment_leaves_no_order_and_the_retry_creates_one(&url, async || {
        sqlite_probe(&path).await
    })
    .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_crash_during_payment_leaves_no_order() {
    let (url, probe) = fresh_mysql().await;
    killed_during_payment_leaves_no_order_and_the_retry_creates_one(&url, async || probe).await;
}
