//! `LOG_FORMAT=json`: the real binary logs one JSON object per line, and the events of a guarded
//! request carry the idempotency span with the matched route and the key hash the operator routes
//! take, never the raw key.

mod common;

use tokio::io::{AsyncBufReadExt, BufReader};

const ADMIN_TOKEN: &str = "json-logs-admin-token";

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_logs_json_lines_carrying_the_matched_route() {
    let file = tower_idempotency_testkit::fresh_sqlite_path("orders_json_logs");
    let database_url = format!("sqlite://{}", file.display());
    let mut child = common::orders_api(&database_url)
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info,tower_idempotency=debug")
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the orders API");
    let stderr = child.stderr.take().expect("stderr is piped");
    let url = common::listening_url(&mut child).await;

    let key = common::unique("json-log-key");
    let created = reqwest::Client::new()
        .post(format!("{url}/orders"))
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(r#"{"customerId": "c_1", "totalCents": 4000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let mut lines = BufReader::new(stderr).lines();
    let order_created = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let event: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line}"));
            assert!(!line.contains(&key), "the raw key reached the log: {line}");
            if event["fields"]["message"] == "order created" {
                return event;
            }
        }
        panic!("the binary exited before logging the order");
    })
    .await
    .expect("the order was logged within 30 s");
    let spans = order_created["spans"].as_array().expect("the span list");
    let idempotency = spans
        .iter()
        .find(|span| span["name"] == "idempotency")
        .unwrap_or_else(|| panic!("no idempotency span in {order_created}"));
    assert_eq!(idempotency["http.route"], "/orders");
    assert_eq!(idempotency["url.path"], "/orders");
    assert_eq!(order_created["level"], "INFO");

    // From the log line to the record: the logged hash is the one the operator routes take.
    let hash = idempotency["idempotency.key_hash"]
        .as_str()
        .unwrap_or_else(|| panic!("no key hash in {idempotency}"));
    let record = reqwest::Client::new()
        .get(format!("{url}/admin/idempotency/key-hashes/{hash}"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        record.status(),
        200,
        "the logged key hash {hash} finds no record"
    );
    let record: serde_json::Value = serde_json::from_str(&record.text().await.unwrap()).unwrap();
    assert_eq!(record["state"], "done", "{record}");
    drop(child);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// A `LOG_FORMAT` the binary does not know stops it, as every other setting that does not parse.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_log_format_stops_the_binary() {
    let file = tower_idempotency_testkit::fresh_sqlite_path("orders_log_format");
    let output = common::orders_api(&format!("sqlite://{}", file.display()))
        .env("LOG_FORMAT", "xml")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(30), output)
        .await
        .expect("the binary exits within 30 s")
        .expect("run the orders API");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(r#"error: LOG_FORMAT="xml" is not valid: expected text or json"#),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"));
}
