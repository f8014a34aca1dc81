//! The orders API as a service: its OpenAPI document, Prometheus metrics, request ids, the health
//! check when the database is gone, the SQLite file it uses without `DATABASE_URL`, and the
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

/// A route asked with a method it does not take answers 405 as problem+json, with `Allow`.
#[tokio::test(flavor = "multi_thread")]
async fn another_method_on_a_route_is_a_405_problem_with_allow() {
    let addr = serve().await;
    let client = reqwest::Client::new();
    for (method, path, allowed) in [
        (reqwest::Method::PUT, "/orders", "POST"),
        (reqwest::Method::DELETE, "/orders/1", "GET"),
        (reqwest::Method::POST, "/healthz", "GET"),
    ] {
        let response = client
            .request(method.clone(), format!("http://{addr}{path}"))
            .header("idempotency-key", "k-405")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method} {path}");
        let allow = response.headers()["allow"].to_str().unwrap().to_owned();
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(problem["status"], 405);
        assert!(problem["type"]
            .as_str()
            .unwrap()
            .ends_with("method-not-allowed"));
        assert!(
            problem["detail"].as_str().unwrap().contains(path),
            "{problem}"
        );
    }
}

/// `/healthz` answers 503 (problem+json, with `Retry-After`) once the database does not answer.
#[tokio::test(flavor = "multi_thread")]
async fn healthz_is_503_when_the_database_is_gone() {
    let (addr, db) = common::serve_on_fresh_sqlite("orders_health").await;
    let url = format!("http://{addr}/healthz");
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
    db.close().await;
    let response = reqwest::get(&url).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert!(response.headers().contains_key("retry-after"));
}

/// Without `DATABASE_URL` the binary runs on `orders.db` in its working directory, created and
/// migrated at start.
#[tokio::test(flavor = "multi_thread")]
async fn without_database_url_the_binary_uses_a_sqlite_file_in_its_directory() {
    let dir = std::env::temp_dir().join(tower_idempotency_testkit::unique_name("tidem_cwd"));
    std::fs::create_dir(&dir).expect("a working directory of its own");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_orders-api"))
        .current_dir(&dir)
        .env_remove("DATABASE_URL")
        .env("BIND_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start orders-api");
    let base = common::listening_url(&mut child).await;
    let created = common::post_order(
        &common::client(),
        &base,
        "no-database-url",
        r#"{"customerId": "c_1", "totalCents": 4000}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(created.status(), 201);
    assert!(dir.join(orders_api::DEFAULT_SQLITE_FILE).is_file());
    child.kill().await.expect("stop orders-api");
    let _ = std::fs::remove_dir_all(&dir);
}
