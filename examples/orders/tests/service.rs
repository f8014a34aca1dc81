//! The orders API as a service: its OpenAPI document, Prometheus metrics, request ids, and the
//! fallback outside the idempotency layer. Runs the real `orders_api::app` on a fresh SQLite file
//! over a real TCP listener.

mod common;

use std::net::SocketAddr;

use serde_json::Value;

async fn serve() -> SocketAddr {
    common::serve_on_fresh_sqlite("orders_service").await.0
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openapi_document_is_json_and_names_the_orders_routes() {
    let addr = serve().await;
    let response = reqwest::get(format!("http://{addr}/openapi.json"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let document: Value = serde_json::from_str(&response.text().await.unwrap())
        .expect("GET /openapi.json is valid JSON");
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    let paths = document["paths"].as_object().expect("paths");
    assert!(paths.contains_key("/orders"), "{paths:?}");
    assert!(paths.contains_key("/orders/{orderId}"));
    assert!(document["paths"]["/orders"]["post"]["responses"]["201"].is_object());
    assert!(document["components"]["schemas"]["Order"].is_object());
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_the_final_outcome_of_each_guarded_request() {
    let addr = serve().await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let response = client
            .post(format!("http://{addr}/orders"))
            .header("idempotency-key", "metrics-1")
            .header("content-type", "application/json")
            .body(r#"{"customerId": "c_1", "totalCents": 4000}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
    }
    let response = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();
    assert!(
        text.contains(r#"idempotency_requests_total{outcome="saved",http_route="/orders"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"idempotency_requests_total{outcome="replayed",http_route="/orders"} 1"#),
        "{text}"
    );
    assert!(text.contains("# HELP idempotency_requests_total"), "{text}");
    assert!(
        text.contains(r#"idempotency_store_duration_seconds_bucket{op="claim",store="sqlite""#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_are_made_or_kept_and_typos_stay_404() {
    let addr = serve().await;
    let client = reqwest::Client::new();
    let made = client
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 200);
    let id = made.headers()["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");

    let kept = client
        .post(format!("http://{addr}/typo"))
        .header("x-request-id", "req-42")
        .send()
        .await
        .unwrap();
    // route_layer: the fallback is not under the idempotency layer, so no key is asked for.
    assert_eq!(kept.status(), 404);
    assert_eq!(kept.headers()["x-request-id"], "req-42");
}
