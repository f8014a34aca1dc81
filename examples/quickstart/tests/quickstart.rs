//! The quickstart as a client sees it: the same POST twice with one key is one order, the second
//! answer a replay; another key is another order. On the memory store and on PostgreSQL.

#[allow(dead_code)] // its `main` is the binary's
#[path = "../src/main.rs"]
mod quickstart;

use axum::{body::Body, http::Request, Router};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use tower_idempotency::{store::postgres::sqlx::ConnectOptions, REPLAYED_HEADER};

/// POST an order with `key`; the order id and whether the answer was a replay.
async fn post_order(app: &Router, key: &str) -> (u64, bool) {
    let request = Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"item":"book"}"#))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 201);
    let replayed = response.headers().get(REPLAYED_HEADER).is_some();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["order"]["item"], "book");
    (body["id"].as_u64().expect("an order id"), replayed)
}

async fn one_order_per_key(app: Router) {
    assert_eq!(post_order(&app, "key-1").await, (1, false));
    assert_eq!(
        post_order(&app, "key-1").await,
        (1, true),
        "replayed, not run"
    );
    assert_eq!(
        post_order(&app, "key-2").await,
        (2, false),
        "one execution so far"
    );
}

#[tokio::test]
async fn memory_store_runs_each_key_once() {
    one_order_per_key(quickstart::app(None)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_store_runs_each_key_once() {
    let database = tower_idempotency_tests::fresh_postgres_database().await;
    let url = database.to_url_lossy().to_string();
    let pool = quickstart::postgres(&url)
        .await
        .expect("connect and migrate");
    one_order_per_key(quickstart::app(Some(pool))).await;
}
