//! What the tests of the orders API share: the real `orders_api::app` on a fresh
//! SQLite file, served over a real TCP listener on 127.0.0.1, and the helpers of the tests that
//! spawn the real binary.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::net::SocketAddr;

use orders_api::{Config, Db};

/// Serve the app on `db` with `config`, through the API's own server (its timeouts and
/// connection bound), on a free port of 127.0.0.1; its address.
pub async fn serve_at(db: Db, config: Config) -> SocketAddr {
    let (listener, addr) = tower_idempotency_testkit::free_port().await;
    tokio::spawn(orders_api::serve(
        listener,
        orders_api::app(db, config),
        Default::default(),
        std::future::pending(),
    ));
    addr
}

/// [`serve_at`], as a base URL (`http://ADDR`).
pub async fn serve(db: Db, config: Config) -> String {
    format!("http://{}", serve_at(db, config).await)
}

/// Serve the app on a fresh SQLite file whose name starts with `label`; its address and database.
pub async fn serve_on_fresh_sqlite(label: &str) -> (SocketAddr, Db) {
    let path = tower_idempotency_testkit::fresh_sqlite_path(label);
    let db = Db::connect(Some(&format!("sqlite://{}", path.display())))
        .await
        .expect("open a fresh SQLite file");
    db.migrate().await.expect("migrate");
    (serve_at(db.clone(), Config::default()).await, db)
}

#[allow(unused_imports)] // each test binary uses its own part
pub use tower_idempotency_testkit::{
    fresh_postgres, listening_url, unique_name as unique, FreshDatabase,
};

/// A database created for one test on the PostgreSQL server of `DATABASE_URL`.
pub type FreshPostgres = FreshDatabase<sqlx::postgres::PgConnectOptions>;

/// A database created for one test on the MySQL (MariaDB) server of `MYSQL_URL`: its URL and
/// its connect options.
pub async fn fresh_mysql(prefix: &str) -> (String, sqlx::mysql::MySqlConnectOptions) {
    let fresh = tower_idempotency_testkit::fresh_mysql(prefix).await;
    (fresh.url, fresh.options)
}

/// The real binary on `database_url`, on a free port of 127.0.0.1, with its stdout piped for
/// [`listening_url`] and killed when the child is dropped; each test adds its own settings.
pub fn orders_api(database_url: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orders-api"));
    command
        .env("DATABASE_URL", database_url)
        .env("BIND_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// A client whose every request ends within 20 s.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .expect("client")
}

/// `POST {base}/orders` under `key`, with a JSON `body`.
pub fn post_order(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/orders"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body)
}

/// The number `sql` (a `SELECT count(*) ..`) reads, on whichever database the API runs on.
pub async fn count(db: &Db, sql: &'static str) -> i64 {
    match db {
        Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        Db::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
    }
    .unwrap_or_else(|err| panic!("{sql}: {err}"))
}

/// The orders the API has written.
pub async fn count_orders(db: &Db) -> i64 {
    count(db, "SELECT count(*) FROM orders").await
}
