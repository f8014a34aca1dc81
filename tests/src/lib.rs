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

pub use tower_idempotency_testkit::{
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_path, fresh_sqlite_pool,
    postgres_advisory_lock_held, sqlite_pool, until_true, Isolation,
};

/// The connect options of a freshly created PostgreSQL database of its own, on the server at
/// `DATABASE_URL`.
pub async fn fresh_postgres_database() -> sqlx::postgres::PgConnectOptions {
    tower_idempotency_testkit::fresh_postgres("tidem")
        .await
        .options
}

/// The connect options of a freshly created MySQL database of its own, on the server at
/// `MYSQL_URL`.
pub async fn fresh_mysql_database() -> sqlx::mysql::MySqlConnectOptions {
    tower_idempotency_testkit::fresh_mysql("tidem")
        .await
        .options
}

/// A Redis client for `REDIS_URL`.
pub fn redis_client() -> redis::Client {
    let url = redis_url();
    redis::Client::open(url.as_str())
        .unwrap_or_else(|e| panic!("REDIS_URL={url} is not a valid Redis URL: {e}"))
}

/// A router whose `POST /orders` answers 201 behind the layer on `store` (standard mode), and
/// the count of the handler's runs: for the tests that ask only whether the handler ran.
pub fn counted_orders<St: tower_idempotency::store::Store>(
    store: St,
) -> (axum::Router, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = axum::Router::new()
        .route(
            "/orders",
            axum::routing::post(move || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                http::StatusCode::CREATED
            }),
        )
        .layer(tower_idempotency::Idempotency::new(store));
    (app, runs)
}
