//! The real router on a fresh SQLite file per test, under both signature schemes (Standard
//! Webhooks and Stripe): signed deliveries, redelivered concurrently and out of order, apply
//! each event once; bad or stale signatures apply nothing.

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
use webhooks_example::{
    signature::{standard, stripe},
    Config, Event, PaymentData, Scheme,
};

/// The Standard Webhooks secret (the specification's example secret).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The Stripe endpoint secret.
const STRIPE_SECRET: &str = "whsec_stripe_test";
const SCHEMES: [Scheme; 2] = [Scheme::Standard, Scheme::Stripe];

/// Both schemes, the default tolerance.
fn config() -> Config {
    Config::new(SECRET)
        .expect("a valid secret")
        .with_stripe_secret(STRIPE_SECRET)
        .expect("a Stripe secret")
}

fn standard_secret() -> standard::Secret {
    standard::Secret::parse(SECRET).expect("a valid secret")
}

/// The router on a fresh, migrated SQLite file, and its pool.
async fn receiver(config: Config) -> (Router, SqlitePool) {
    let path = tower_idempotency_testkit::fresh_sqlite_path("webhooks");
    let url = format!("sqlite://{}", path.display());
    let pool = webhooks_example::connect(&url).await.expect("open SQLite");
    webhooks_example::migrate(&pool).await.expect("migrate");
    (webhooks_example::app(pool.clone(), config), pool)
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

/// How a test signs a delivery: under which scheme, when, with which secret.
#[derive(Debug, Clone)]
struct Signing {
    scheme: Scheme,
    /// The Standard Webhooks delivery id (`webhook-id`).
    delivery_id: String,
    timestamp: u64,
    /// Another secret than the receiver's (a forgery).
    wrong_secret: bool,
}

impl Signing {
    fn now(scheme: Scheme, delivery_id: &str) -> Self {
        Self {
            scheme,
            delivery_id: delivery_id.into(),
            timestamp: now(),
            wrong_secret: false,
        }
    }

    fn at(mut self, timestamp: u64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// The scheme's headers for `body`.
    fn headers(&self, body: &[u8]) -> Vec<(&'static str, String)> {
        match self.scheme {
            Scheme::Standard => {
                let secret = if self.wrong_secret {
                    standard::Secret::parse("whsec_b3RoZXIgc2VjcmV0").expect("secret")
                } else {
                    standard_secret()
                };
                vec![
                    (standard::ID, self.delivery_id.clone()),
                    (standard::TIMESTAMP, self.timestamp.to_string()),
                    (
                        standard::SIGNATURE,
                        standard::sign(&secret, &self.delivery_id, self.timestamp, body),
                    ),
                ]
            }
            Scheme::Stripe => {
                let secret: &[u8] = if self.wrong_secret {
                    b"whsec_other"
                } else {
                    STRIPE_SECRET.as_bytes()
                };
                vec![(stripe::HEADER, stripe::sign(secret, self.timestamp, body))]
            }
        }
    }
}

fn route(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Standard => "/webhooks/payments",
        Scheme::Stripe => "/webhooks/stripe",
    }
}

/// A delivery of `body` to the scheme's route with these headers.
fn delivery(scheme: Scheme, body: &[u8], headers: &[(&'static str, String)]) -> Request<Body> {
    let mut request = Request::post(route(scheme)).header(header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request
        .body(Body::from(body.to_vec()))
        .expect("a valid request")
}

/// The event, signed now under `scheme`; its delivery id is derived from the event id, so a
/// redelivery carries the same one.
fn signed(scheme: Scheme, event: &Event) -> Request<Body> {
    signed_as(scheme, event, &format!("msg_{}", event.id))
}

/// The event, signed now under `scheme` with this delivery id (Standard Webhooks' `webhook-id`).
fn signed_as(scheme: Scheme, event: &Event, delivery_id: &str) -> Request<Body> {
    let body = serde_json::to_vec(event).expect("serialize");
    let signing = Signing::now(scheme, delivery_id);
    delivery(scheme, &body, &signing.headers(&body))
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
    for scheme in SCHEMES {
        concurrent_out_of_order_redeliveries(scheme).await;
    }
}

async fn concurrent_out_of_order_redeliveries(scheme: Scheme) {
    let (app, pool) = receiver(config()).await;
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
                let request = signed(scheme, &event);
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
            "{scheme:?} {id}: applied once, the other copies are duplicates"
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
    let (_, _, late) = send(&app, signed(scheme, &events[0])).await;
    assert_eq!(late["status"], "duplicate");
    let (_, body) = payment(&app, "pay_1").await;
    assert_eq!(body["captured_cents"], 1050);
}

fn assert_unauthorized(
    scheme: Scheme,
    status: StatusCode,
    content_type: &str,
    body: &Value,
    why: &str,
) {
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}: {body}");
    assert_eq!(content_type, "application/problem+json", "{why}");
    assert_eq!(body["status"], 401, "{why}");
    assert_eq!(
        body["type"], "urn:webhooks-example:invalid-signature",
        "{why}"
    );
    let header = match scheme {
        Scheme::Standard => "webhook-signature",
        Scheme::Stripe => "Stripe-Signature",
    };
    assert!(
        body["detail"].as_str().is_some_and(|d| d.contains(header)),
        "{why}: the detail says how to sign: {body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_signatures_are_401_and_apply_nothing() {
    for scheme in SCHEMES {
        bad_signatures(scheme).await;
    }
}

async fn bad_signatures(scheme: Scheme) {
    let (app, pool) = receiver(config()).await;
    let capture = event("evt_1", "payment.captured", "pay_1", 4000);
    let body = serde_json::to_vec(&capture).expect("serialize");
    let other_body = serde_json::to_vec(&event("evt_1", "payment.captured", "pay_1", 400_000))
        .expect("serialize");
    let signing = Signing::now(scheme, "msg_1");
    let good = signing.headers(&body);
    let forged = Signing {
        wrong_secret: true,
        ..signing.clone()
    }
    .headers(&body);
    // The signature of one moment, sent with another timestamp.
    let mut moved = good.clone();
    match scheme {
        Scheme::Standard => moved[1].1 = (signing.timestamp - 1).to_string(),
        Scheme::Stripe => {
            moved[0].1 = moved[0].1.replace(
                &format!("t={}", signing.timestamp),
                &format!("t={}", signing.timestamp - 1),
            )
        }
    }
    let mut attempts = vec![
        ("no headers", delivery(scheme, &body, &[])),
        ("wrong secret", delivery(scheme, &body, &forged)),
        ("tampered body", delivery(scheme, &other_body, &good)),
        ("tampered timestamp", delivery(scheme, &body, &moved)),
    ];
    match scheme {
        Scheme::Standard => {
            let mut no_id = good.clone();
            no_id.remove(0);
            let mut other_id = good.clone();
            other_id[0].1 = "msg_2".into();
            let mut not_base64 = good.clone();
            not_base64[2].1 = "v1,not base64!".into();
            // Stripe's format under the standard's header: refused, not misread.
            let mut stripe_format = good.clone();
            stripe_format[2].1 = stripe::sign(STRIPE_SECRET.as_bytes(), signing.timestamp, &body);
            attempts.extend([
                ("no webhook-id", delivery(scheme, &body, &no_id)),
                ("another webhook-id", delivery(scheme, &body, &other_id)),
                ("not base64", delivery(scheme, &body, &not_base64)),
                ("Stripe's format", delivery(scheme, &body, &stripe_format)),
            ]);
        }
        Scheme::Stripe => {
            attempts.extend([
                (
                    "malformed",
                    delivery(scheme, &body, &[(stripe::HEADER, "v1=deadbeef".into())]),
                ),
                (
                    "not hex",
                    delivery(
                        scheme,
                        &body,
                        &[(
                            stripe::HEADER,
                            format!("t={},v1=not-hex", signing.timestamp),
                        )],
                    ),
                ),
                // A valid Standard Webhooks delivery is not a Stripe one.
                (
                    "the standard's headers",
                    delivery(
                        scheme,
                        &body,
                        &Signing::now(Scheme::Standard, "msg_1").headers(&body),
                    ),
                ),
            ]);
        }
    }
    for (why, request) in attempts {
        let (status, content_type, problem) = send(&app, request).await;
        assert_unauthorized(scheme, status, &content_type, &problem, why);
    }
    assert_eq!(payment(&app, "pay_1").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        processed_events(&pool).await,
        0,
        "refused deliveries record nothing"
    );

    // The genuine delivery of the same event is then applied: the refusals did not burn its id.
    let (status, _, ack) = send(&app, delivery(scheme, &body, &good)).await;
    assert_eq!(
        (status, ack["status"].as_str()),
        (StatusCode::OK, Some("applied"))
    );
    assert_eq!(payment(&app, "pay_1").await.1["captured_cents"], 4000);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_standard_dedupe_key_is_the_delivery_id() {
    let (app, pool) = receiver(config()).await;
    let capture = event("evt_1", "payment.captured", "pay_1", 4000);
    let body = serde_json::to_vec(&capture).expect("serialize");
    let first = Signing::now(Scheme::Standard, "msg_1").at(now() - 60);
    let (_, _, ack) = send(
        &app,
        delivery(Scheme::Standard, &body, &first.headers(&body)),
    )
    .await;
    assert_eq!(ack["status"], "applied");
    // The sender's retry: the same webhook-id, a new timestamp and signature.
    let retry = Signing::now(Scheme::Standard, "msg_1");
    let (_, _, ack) = send(
        &app,
        delivery(Scheme::Standard, &body, &retry.headers(&body)),
    )
    .await;
    assert_eq!(ack["status"], "duplicate");
    let ids: Vec<String> = sqlx::query_scalar("SELECT event_id FROM processed_events")
        .fetch_all(&pool)
        .await
        .expect("processed ids");
    assert_eq!(ids, ["msg_1"], "the mark is the delivery id");
    assert_eq!(payment(&app, "pay_1").await.1["captured_cents"], 4000);
}

/// The two schemes' ids are not one namespace: a Standard delivery whose `webhook-id` equals a
/// Stripe event's `id` does not make that event a duplicate.
#[tokio::test(flavor = "multi_thread")]
async fn a_standard_delivery_id_equal_to_a_stripe_event_id_is_another_event() {
    let (app, _pool) = receiver(config()).await;
    let standard_capture = event("evt_a", "payment.captured", "pay_standard", 1000);
    let standard = signed_as(Scheme::Standard, &standard_capture, "evt_1");
    let (_, _, ack) = send(&app, standard).await;
    assert_eq!(ack["status"], "applied");
    let stripe_capture = event("evt_1", "payment.captured", "pay_stripe", 2500);
    let (_, _, ack) = send(&app, signed(Scheme::Stripe, &stripe_capture)).await;
    assert_eq!(ack["status"], "applied", "{ack}");
    assert_eq!(payment(&app, "pay_stripe").await.1["captured_cents"], 2500);
}

#[tokio::test(flavor = "multi_thread")]
async fn stale_signatures_are_401_within_a_configurable_tolerance() {
    for scheme in SCHEMES {
        stale_signatures(scheme).await;
    }
}

async fn stale_signatures(scheme: Scheme) {
    let capture = event("evt_1", "payment.captured", "pay_1", 4000);
    let body = serde_json::to_vec(&capture).expect("serialize");
    let stale = Signing::now(scheme, "msg_1")
        .at(now() - 6 * 60)
        .headers(&body);

    let (app, pool) = receiver(config()).await;
    let (status, content_type, problem) = send(&app, delivery(scheme, &body, &stale)).await;
    assert_unauthorized(
        scheme,
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
    let future = Signing::now(scheme, "msg_1")
        .at(now() + 6 * 60)
        .headers(&body);
    let (status, content_type, problem) = send(&app, delivery(scheme, &body, &future)).await;
    assert_unauthorized(scheme, status, &content_type, &problem, "six minutes ahead");
    assert_eq!(processed_events(&pool).await, 0);

    let (lenient, _) = receiver(config().with_tolerance(Duration::from_secs(10 * 60))).await;
    let (status, _, ack) = send(&lenient, delivery(scheme, &body, &stale)).await;
    assert_eq!(
        (status, ack["status"].as_str()),
        (StatusCode::OK, Some("applied"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_body_that_is_not_an_event_is_400() {
    for scheme in SCHEMES {
        let (app, pool) = receiver(config()).await;
        for body in [&b"{\"id\": 1}"[..], br#"{"id":"evt_1","type":"payment.captured","data":{"payment_id":"pay_1","amount_cents":-5}}"#] {
            let headers = Signing::now(scheme, "msg_1").headers(body);
            let (status, content_type, problem) = send(&app, delivery(scheme, body, &headers)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{scheme:?}: {problem}");
            assert_eq!(content_type, "application/problem+json");
            assert_eq!(problem["type"], "urn:webhooks-example:invalid-event");
        }
        assert_eq!(processed_events(&pool).await, 0);
    }
}

/// An id the consumer cannot key by (over 1,024 bytes, a NUL) is a 400 no redelivery mends, not
/// a 503 the sender would retry for its whole window.
#[tokio::test(flavor = "multi_thread")]
async fn an_id_that_cannot_be_a_dedupe_key_is_400() {
    let (app, pool) = receiver(config()).await;
    let long = "m".repeat(1_025);
    let capture = event("evt_1", "payment.captured", "pay_1", 4000);
    let standard = signed_as(Scheme::Standard, &capture, &long);
    let with_nul = event("evt_\u{0}", "payment.captured", "pay_1", 4000);
    let stripe = signed(Scheme::Stripe, &with_nul);
    for request in [standard, stripe] {
        let (status, content_type, problem) = send(&app, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(content_type, "application/problem+json");
        assert_eq!(problem["type"], "urn:webhooks-example:invalid-event");
    }
    assert_eq!(processed_events(&pool).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_stripe_secret_there_is_no_stripe_route() {
    let (app, _) = receiver(Config::new(SECRET).expect("a valid secret")).await;
    let capture = event("evt_1", "payment.captured", "pay_1", 4000);
    let (status, _, _) = send(&app, signed(Scheme::Stripe, &capture)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// An empty Stripe secret would let anyone sign: it is refused, so no route opens with it.
#[test]
fn an_empty_stripe_secret_is_refused() {
    for blank in ["", " ", "\n\t"] {
        let config = Config::new(SECRET).expect("a valid secret");
        assert!(
            config.with_stripe_secret(blank).is_err(),
            "{blank:?} was taken as a Stripe secret"
        );
    }
}
