//! `ADMIN_TOKEN`: the real binary serves the library's operator routes at `/admin/idempotency`,
//! to the token's bearer only. An operator sees an order's saved answer, counts records by state,
//! and forgets a key, after which the same request runs as new.

mod common;

const TOKEN: &str = "s3cret-admin-token-for-tests";
const ORDER: &str = r#"{"customerId": "c_admin", "totalCents": 4000}"#;

async fn admin(
    url: &str,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut request =
        reqwest::Client::new().request(method, format!("{url}/admin/idempotency{path}"));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_default())
}

async fn order(url: &str, key: &str) -> String {
    let created = reqwest::Client::new()
        .post(format!("{url}/orders"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let body: serde_json::Value = serde_json::from_str(&created.text().await.unwrap()).unwrap();
    body["orderId"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_routes_answer_the_token_only_and_forget_frees_a_key() {
    let file = tower_idempotency_testkit::fresh_sqlite_path("orders_admin");
    let database_url = format!("sqlite://{}", file.display());
    let mut child = common::orders_api(&database_url)
        .env("ADMIN_TOKEN", TOKEN)
        .spawn()
        .expect("start the orders API");
    let url = common::listening_url(&mut child).await;

    let key = common::unique("admin-key");
    let first = order(&url, &key).await;
    assert_eq!(order(&url, &key).await, first, "a replay");

    for token in [
        None,
        Some("wrong-token-of-enough-length"),
        Some(&TOKEN[1..]),
    ] {
        let (status, problem) = admin(&url, reqwest::Method::GET, "/stats", token).await;
        assert_eq!(status, 401, "{token:?}: {problem}");
        assert_eq!(problem["title"], "Admin token required");
    }
    // The scheme's name in any case; every answer, refused or not, carries a request id, and a
    // method a route does not take is a 405 problem.
    for (scheme, method, path, status) in [
        ("bearer", reqwest::Method::GET, "/stats", 200),
        ("BEARER", reqwest::Method::GET, "/stats", 200),
        ("Bearer", reqwest::Method::GET, "/sweep", 405),
        ("Basic", reqwest::Method::GET, "/stats", 401),
    ] {
        let answer = reqwest::Client::new()
            .request(method, format!("{url}/admin/idempotency{path}"))
            .header("authorization", format!("{scheme} {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{scheme} {path}");
        assert!(
            answer.headers().contains_key("x-request-id"),
            "{scheme} {path}"
        );
        if status != 200 {
            assert_eq!(answer.headers()["content-type"], "application/problem+json");
        }
    }
    let (status, stats) = admin(&url, reqwest::Method::GET, "/stats", Some(TOKEN)).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["done"], 1, "{stats}");
    assert_eq!(stats["running"], 0, "{stats}");

    // The caller sent no Authorization: the anonymous scope, no `scope=`.
    let (status, record) = admin(
        &url,
        reqwest::Method::GET,
        &format!("/keys/{key}?body=true"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], 201);
    assert!(
        record["body"].as_str().unwrap().contains(&first),
        "{record}"
    );

    let (status, _) = admin(
        &url,
        reqwest::Method::DELETE,
        &format!("/keys/{key}"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 204);
    let again = order(&url, &key).await;
    assert_ne!(again, first, "forgotten: the request ran as new");

    // The sweeper's stats round sets the record gauges (its first round runs at start).
    let metrics = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let text = reqwest::get(format!("{url}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if text.contains("idempotency_oldest_running_seconds") {
                return text;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the record gauges within 30 s");
    assert!(
        metrics.contains("idempotency_records{store=\"sqlite\",state=\"running\"}"),
        "{metrics}"
    );

    drop(child);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_token_there_are_no_admin_routes() {
    let (addr, _db) = common::serve_on_fresh_sqlite("orders_no_admin").await;
    let (status, _) = admin(
        &format!("http://{addr}"),
        reqwest::Method::GET,
        "/stats",
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 404);
}
