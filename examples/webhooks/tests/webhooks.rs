//! The real router on a fresh SQLite file per test: signed deliveries, redelivered
//! concurrently and out of order, apply each event once; bad or stale signatures apply nothing.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    body::Body,
    http::{header, Request, StatusCode},
    Router,
};
use http_body_util::BodyExt;
use serde_json::Value;
use sqlx::SqlitePool;
use tokio::sync::Barrier;
use tower::ServiceExt;
use webhooks_example::{signature, Config, Event, PaymentData};

const SECRET: &str = "whsec_test";

/// The router on a fresh, migrated SQLite file, and its pool.
async fn receiver(config: Config) -> (Router, SqlitePool) {
    let path = std::env::temp_dir().join(format!("tidem_webhooks_{}.db", uuid_like()));
    let url = format!("sqlite://{}", path.display());
    let pool = webhooks_example::connect(&url).await.expect("open SQLite");
    webhooks_example::migrate(&pool).await.expect("migrate");
    (webhooks_example::app(pool.clone(), config), pool)
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

fn event(id: &str, kind: &str, payment_id: &str, amount_cents: i64) -> Event {
    Event {
        id: id.into(),
        kind: kind.into(),
        data: PaymentData {
            payment_id: payment_id.into(),
            amount_cents,
        },
    }
}

/// A delivery of `body` signed with `secret` at `timestamp` (no header when `None`).
fn delivery(body: &[u8], signature: Option<String>) -> Request<Body> {
    let mut request =
        Request::post("/webhooks/payments").header(header::CONTENT_TYPE, "application/json");
    if let Some(signature) = signature {
        request = request.header("Webhook-Signature", signature);
    }
    request
        .body(Body::from(body.to_vec()))
        .expect("a valid request")
}

fn signed(event: &Event) -> Request<Body> {
    let body = serde_json::to_vec(event).expect("serialize");
    let signature = signature::sign(SECRET.as_bytes(), now(), &body);
    delivery(&body, Some(signature))
}

/// Send a request through the router: status, content type, JSON body.
async fn send(app: &Router, request: Request<Body>) -> (StatusCode, String, Value) {
    let response = app
        .clone()
        .oneshot(request)
        .await
        .expect("the router answers");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, content_type, json)
}

async fn payment(app: &Router, payment_id: &str) -> (StatusCode, Value) {
    let request = Request::get(format!("/payments/{payment_id}"))
        .body(Body::empty())
        .expect("request");
    let (status, _, body) = send(app, request).await;
    (status, body)
}

async fn processed_events(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM processed_events")
        .fetch_one(pool)
        .await
        .expect("count processed_events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_out_of_order_redeliveries_apply_each_event_once() {
    let (app, pool) = receiver(Config::new(SECRET)).await;
    let mut events = Vec::new();
    for p in 1..=5_i64 {
        let payment_id = format!("pay_{p}");
        events.push(event(
            &format!("evt_capture_{p}"),
            "payment.captured",
            &payment_id,
            1000 * p,
        ));
        events.push(event(
            &format!("evt_capture_more_{p}"),
            "payment.captured",
            &payment_id,
            50,
        ));
        events.push(event(
            &format!("evt_refund_{p}"),
            "payment.refunded",
            &payment_id,
            100 * p,
        ));
    }
    events.push(event("evt_dispute_1", "payment.disputed", "pay_1", 10));

    // Every event four times, in a shuffled order (refunds before captures, copies apart).
    const COPIES: usize = 4;
    let mut deliveries: Vec<Event> = events
        .iter()
        .flat_map(|event| std::iter::repeat_n(event.clone(), COPIES))
        .collect();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..deliveries.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        deliveries.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    assert_ne!(
        deliveries[0].id, deliveries[1].id,
        "the shuffle moved copies apart"
    );

    let barrier = Arc::new(Barrier::new(deliveries.len()));
    let tasks: Vec<_> = deliveries
        .into_iter()
        .map(|event| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                let request = signed(&event);
                barrier.wait().await;
                send(&app, request).await
            })
        })
        .collect();
    let mut statuses: HashMap<String, Vec<String>> = HashMap::new();
    for task in tasks {
        let (status, _, body) = task.await.expect("no panic");
        assert_eq!(status, StatusCode::OK, "{body}");
        let id = body["id"].as_str().expect("id").to_owned();
        statuses
            .entry(id)
            .or_default()
            .push(body["status"].as_str().expect("status").to_owned());
    }

    assert_eq!(statuses.len(), events.len());
    for (id, mut seen) in statuses {
        seen.sort();
        let first = if id == "evt_dispute_1" {
            "ignored"
        } else {
            "applied"
        };
        let mut expected = vec!["duplicate"; COPIES - 1];
        expected.insert(0, first);
        expected.sort();
        assert_eq!(
            seen, expected,
            "{id}: applied once, the other copies are duplicates"
        );
    }
    for p in 1..=5_i64 {
        let (status, body) = payment(&app, &format!("pay_{p}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["captured_cents"], 1000 * p + 50, "pay_{p}: {body}");
        assert_eq!(body["refunded_cents"], 100 * p, "pay_{p}: {body}");
        assert_eq!(body["events"], 3, "pay_{p}: {body}");
    }
    assert_eq!(processed_events(&pool).await, events.len() as i64);

    // A late redelivery, one at a time, is still a duplicate.
    let (_, _, late) = send(&app, signed(&events[0])).await;
    assert_eq!(late["status"], "duplicate");
    let (_, body) = payment(&app, "pay_1").await;
    assert_eq!(body["captured_cents"], 1050);
}

fn assert_unauthorized(status: StatusCode, content_type: &str, body: &Value, why: &str) {
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}: {body}");
    assert_eq!(content_type, "application/problem+json", "{why}");
    assert_eq!(body["status"], 401, "{why}");
    assert_eq!(
        body["type"], "urn:webhooks-example:invalid-signature",
        "{why}"
    );
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("Webhook-Signature")),
        "{why}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_signatures_are_401_and_apply_nothing() {
    let (app, pool) = receiver(Config::new(SECRET)).await;
    let capture = event("evt_1", "payment.captured", "pay_1", 4000);
    let body = serde_json::to_vec(&capture).expect("serialize");
    let other_body = serde_json::to_vec(&event("evt_1", "payment.captured", "pay_1", 400_000))
        .expect("serialize");
    let t = now();
    let good = signature::sign(SECRET.as_bytes(), t, &body);

    let attempts = [
        ("no header", delivery(&body, None)),
        (
            "wrong secret",
            delivery(&body, Some(signature::sign(b"whsec_other", t, &body))),
        ),
        ("tampered body", delivery(&other_body, Some(good.clone()))),
        (
            "tampered timestamp",
            delivery(
                &body,
                Some(good.replace(&format!("t={t}"), &format!("t={}", t - 1))),
            ),
        ),
        ("malformed", delivery(&body, Some("v1=deadbeef".into()))),
        (
            "not hex",
            delivery(&body, Some(format!("t={t},v1=not-hex"))),
        ),
    ];
    for (why, request) in attempts {
        let (status, content_type, problem) = send(&app, request).await;
        assert_unauthorized(status, &content_type, &problem, why);
    }
    assert_eq!(payment(&app, "pay_1").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        processed_events(&pool).await,
        0,
        "refused deliveries record nothing"
    );

    // The genuine delivery of the same event is then applied: the refusals did not burn its id.
    let (status, _, ack) = send(&app, delivery(&body, Some(good))).await;
    assert_eq!(
        (status, ack["status"].as_str()),
        (StatusCode::OK, Some("applied"))
    );
    assert_eq!(payment(&app, "pay_1").await.1["captured_cents"], 4000);
}

#[tokio::test(flavor = "multi_thread")]
async fn stale_signatures_are_401_within_a_configurable_tolerance() {
    let capture = event("evt_1", "payment.captured", "pay_1", 4000);
    let body = serde_json::to_vec(&capture).expect("serialize");
    let six_minutes_ago = now() - 6 * 60;
    let stale = signature::sign(SECRET.as_bytes(), six_minutes_ago, &body);

    let (app, pool) = receiver(Config::new(SECRET)).await;
    let (status, content_type, problem) = send(&app, delivery(&body, Some(stale.clone()))).await;
    assert_unauthorized(
        status,
        &content_type,
        &problem,
        "six minutes old, default 5 min tolerance",
    );
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("timestamp")),
        "{problem}"
    );
    let future = signature::sign(SECRET.as_bytes(), now() + 6 * 60, &body);
    let (status, content_type, problem) = send(&app, delivery(&body, Some(future))).await;
    assert_unauthorized(status, &content_type, &problem, "six minutes ahead");
    assert_eq!(processed_events(&pool).await, 0);

    let (lenient, _) =
        receiver(Config::new(SECRET).with_tolerance(Duration::from_secs(10 * 60))).await;
    let (status, _, ack) = send(&lenient, delivery(&body, Some(stale))).await;
    assert_eq!(
        (status, ack["status"].as_str()),
        (StatusCode::OK, Some("applied"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_body_that_is_not_an_event_is_400() {
    let (app, pool) = receiver(Config::new(SECRET)).await;
    for body in [&b"{\"id\": 1}"[..], br#"{"id":"evt_1","type":"payment.captured","data":{"payment_id":"pay_1","amount_cents":-5}}"#] {
        let signature = signature::sign(SECRET.as_bytes(), now(), body);
        let (status, content_type, problem) = send(&app, delivery(body, Some(signature))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(content_type, "application/problem+json");
        assert_eq!(problem["type"], "urn:webhooks-example:invalid-event");
    }
    assert_eq!(processed_events(&pool).await, 0);
}
