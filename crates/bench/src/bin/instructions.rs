//! Requests through the layer in-process (memory store, no HTTP, one thread), for counting the
//! layer's own instructions per request under callgrind:
//!
//! ```sh
//! cargo build --release -p tower-idempotency-bench --bin instructions
//! for n in 10000 20000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//!       target/release/instructions first-time $n
//! done
//! # instructions per request: (total at 20000 - total at 10000) / 10000
//! ```
//!
//! Scenarios: `bare` (the handler alone), `first-time` (a new key per request), `replays` (one
//! key, answered from the store after the first request).

use std::process::ExitCode;

use axum::{body::Body, http::Request, routing::post, Router};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::Idempotency;

const BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

async fn create() -> (axum::http::StatusCode, &'static str) {
    (
        axum::http::StatusCode::CREATED,
        r#"{"orderId":1,"customerId":"c_1","totalCents":4000,"status":"pending"}"#,
    )
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let scenario = args.next().unwrap_or_default();
    let n: usize = match args.next().and_then(|n| n.parse().ok()) {
        Some(n) => n,
        None => {
            eprintln!("usage: instructions bare|first-time|replays N");
            return ExitCode::from(2);
        }
    };
    let router = Router::new().route("/orders", post(create));
    let app = match scenario.as_str() {
        "bare" => router,
        "first-time" | "replays" => router.route_layer(Idempotency::memory()),
        other => {
            eprintln!("unknown scenario {other:?}: bare, first-time or replays");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        for i in 0..n {
            let key = if scenario == "replays" {
                "the-same-key".to_owned()
            } else {
                format!("key-{i}")
            };
            let request = Request::post("/orders")
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(Body::from(BODY))
                .expect("a valid request");
            let response = app.clone().oneshot(request).await.expect("infallible");
            assert_eq!(response.status(), axum::http::StatusCode::CREATED);
            let _ = response.into_body().collect().await;
        }
    });
    ExitCode::SUCCESS
}
