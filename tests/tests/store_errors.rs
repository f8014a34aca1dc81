//! Store errors say whose fault they are: 503 with `Retry-After` only for what a retry can cure
//! (unreachable, busy, full), 500 for what needs an operator. The handler never runs.
//!
//! Run with `DATABASE_URL` set (see `scripts/test.sh`).

use std::sync::atomic::Ordering;

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use tower::ServiceExt;
use tower_idempotency::store::{postgres::PostgresStore, sqlite::SqliteStore, MemoryStore, Store};
use tower_idempotency_tests::{counted_orders, fresh_postgres_pool, fresh_sqlite_pool};

/// POST one request with a fresh key; the status, `Retry-After`, the problem's title, and how
/// often the handler ran.
async fn post_once(
    store: impl Store,
    requests: usize,
) -> Vec<(StatusCode, Option<String>, String)> {
    let (app, runs) = counted_orders(store);
    let mut answers = Vec::new();
    for i in 0..requests {
        let request = Request::post("/orders")
            .header("idempotency-key", format!("k{i}"))
            .body(Body::from("{}"))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let title = serde_json::from_slice::<serde_json::Value>(&body)
            .map(|json| json["title"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        answers.push((status, retry_after, title));
    }
    let created = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        created,
        "the handler runs for the 201s only, never for a store error"
    );
    answers
}

/// A store whose table was never created answers an error no retry cures: 500, no Retry-After.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_without_its_table_is_a_500_not_a_503() {
    let store = PostgresStore::new(fresh_postgres_pool(2).await); // no migrate()
    let answers = post_once(store, 1).await;
    assert_eq!(
        answers[0],
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "Idempotency store error".to_owned()
        )
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_without_its_table_is_a_500_not_a_503() {
    let store = SqliteStore::new(fresh_sqlite_pool(1).await); // no migrate()
    let answers = post_once(store, 1).await;
    assert_eq!(answers[0].0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answers[0].1, None);
}

/// A memory store at its capacity answers 503 "store full" with Retry-After for new keys.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_memory_store_is_a_503_with_retry_after() {
    let answers = post_once(MemoryStore::with_capacity(16), 200).await;
    let created = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::CREATED)
        .count();
    assert!(created <= 16, "{created} records in a store of 16");
    let full = answers
        .iter()
        .find(|(s, _, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .expect("the store fills up");
    assert_eq!(full.1.as_deref(), Some("1"));
    assert_eq!(full.2, "Idempotency store full");
}
