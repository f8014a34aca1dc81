//! Every way `POST /orders` refuses a body (bad JSON, wrong types, missing fields, a total
//! below 1, a wrong `Content-Type`) answers 400 `application/problem+json`, and none is saved:
//! the corrected order sent with the same `Idempotency-Key` is created. Runs the real
//! `orders_api::app` on a fresh SQLite file over a real TCP listener.

mod common;

use orders_api::Db;
use reqwest::StatusCode;
use serde_json::Value;

const BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

async fn serve() -> (String, Db) {
    let (addr, db) = common::serve_on_fresh_sqlite("orders_invalid_body").await;
    (format!("http://{addr}"), db)
}

#[tokio::test(flavor = "multi_thread")]
async fn each_refused_body_is_a_400_problem_and_the_corrected_order_reuses_the_key() {
    let (base, db) = serve().await;
    let client = reqwest::Client::new();
    let json = Some("application/json");
    let cases: &[(&str, Option<&str>, &str, &str)] = &[
        (
            "malformed JSON",
            json,
            r#"{"customerId": "c_1", "#,
            "not valid JSON",
        ),
        ("empty body", json, "", "the body is empty"),
        ("not an object", json, "[4000]", "the body is a JSON array"),
        (
            "missing field",
            json,
            r#"{"customerId": "c_1"}"#,
            "missing field `totalCents`",
        ),
        (
            "wrong type",
            json,
            r#"{"customerId": "c_1", "totalCents": "4000"}"#,
            "totalCents: invalid type: string",
        ),
        (
            "zero total",
            json,
            r#"{"customerId": "c_1", "totalCents": 0}"#,
            "`totalCents` is 0",
        ),
        (
            "negative total",
            json,
            r#"{"customerId": "c_1", "totalCents": -1}"#,
            "`totalCents` is -1",
        ),
        (
            "wrong Content-Type",
            Some("application/x-www-form-urlencoded"),
            BODY,
            "Content-Type is `application/x-www-form-urlencoded`",
        ),
    ];
    for (i, (what, content_type, body, needle)) in cases.iter().enumerate() {
        let key = format!("invalid-body-{i}");
        let mut refused = client
            .post(format!("{base}/orders"))
            .header("Idempotency-Key", &key)
            .body(body.to_string());
        if let Some(ct) = content_type {
            refused = refused.header("Content-Type", *ct);
        }
        let refused = refused.send().await.expect("the server answers");
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{what}");
        assert_eq!(
            refused.headers()["content-type"],
            "application/problem+json",
            "{what}"
        );
        let problem: Value = serde_json::from_str(&refused.text().await.unwrap())
            .unwrap_or_else(|e| panic!("{what}: the problem is JSON: {e}"));
        assert_eq!(problem["status"], 400, "{what}");
        let detail = problem["detail"].as_str().expect("detail");
        assert!(
            detail.contains(needle),
            "{what}: {detail:?} lacks {needle:?}"
        );

        let corrected = client
            .post(format!("{base}/orders"))
            .header("Idempotency-Key", &key)
            .header("Content-Type", "application/json")
            .body(BODY)
            .send()
            .await
            .expect("the server answers");
        assert_eq!(corrected.status(), StatusCode::CREATED, "{what}");
        assert!(
            corrected.headers().get("idempotent-replayed").is_none(),
            "{what}: the corrected order runs, nothing was saved for the key"
        );
        assert!(corrected.headers().contains_key("location"), "{what}");
        let order: Value = serde_json::from_str(&corrected.text().await.unwrap()).unwrap();
        assert_eq!(order["status"], "pending", "{what}");
        assert_eq!(order["totalCents"], 4000, "{what}");
    }
    assert_eq!(
        common::count_orders(&db).await,
        cases.len() as i64,
        "one order per corrected key, none for a refusal"
    );
}
