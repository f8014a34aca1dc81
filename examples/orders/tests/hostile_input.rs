//! Hostile and careless input to the orders API (`examples/orders`), on PostgreSQL and SQLite:
//! control characters, re-serialised and mislabelled bodies, duplicates while in flight, and
//! database errors classified by whose fault they are.
//!
//! The real router from `orders_api::app` is served with `orders_api::serve` (the binary's own
//! server) on 127.0.0.1. Run with `DATABASE_URL` set (see `scripts/test.sh`).

mod common;

use std::time::{Duration, Instant};

use common::serve;
use orders_api::{Config, Db, DbFault};
use reqwest::StatusCode;
use serde_json::Value;
use tower_idempotency_testkit::{
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, Isolation,
};

const BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

async fn postgres() -> Db {
    let db = Db::Postgres(fresh_postgres_pool(8).await);
    db.migrate().await.expect("migrate");
    db
}

async fn sqlite() -> Db {
    let db = Db::Sqlite(fresh_sqlite_pool(4).await);
    db.migrate().await.expect("migrate");
    db
}

async fn mysql() -> Db {
    let db = Db::MySql(fresh_mysql_pool(8, Isolation::RepeatableRead).await);
    db.migrate().await.expect("migrate");
    db
}

/// One answer, read in full.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    retry_after: Option<u64>,
    content_type: String,
    body: String,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("the server answers");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Answer {
        status: response.status(),
        replayed: header("idempotent-replayed").as_deref() == Some("true"),
        retry_after: header("retry-after").map(|v| v.parse().unwrap()),
        content_type: header("content-type").unwrap_or_default(),
        body: response.text().await.expect("body"),
    }
}

fn post(base: &str, key: &str, content_type: Option<&str>, body: &str) -> reqwest::RequestBuilder {
    let mut request = common::client()
        .post(format!("{base}/orders"))
        .header("Idempotency-Key", key)
        .body(body.to_owned());
    if let Some(ct) = content_type {
        request = request.header("Content-Type", ct);
    }
    request
}

fn assert_problem(a: &Answer, status: StatusCode, needle: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.content_type, "application/problem+json");
    let json: Value = serde_json::from_str(&a.body).expect("problem+json");
    assert!(
        json["detail"].as_str().unwrap().contains(needle),
        "{:?} lacks {needle:?}",
        json["detail"]
    );
}

async fn count_records(db: &Db) -> i64 {
    common::count(db, "SELECT count(*) FROM idempotency_records").await
}

/// A `customerId` with NUL (anywhere), a line break or another control character is refused
/// with 400 on both databases, never 503; the refusal is not saved, so the corrected order with
/// the same key is created (once).
async fn control_characters_are_refused_and_the_corrected_retry_succeeds(db: Db) {
    let base = serve(db.clone(), Config::default()).await;
    for (i, bad) in [
        "a\u{0}b",
        "\u{0}c_1",
        "c_1\n2026-01-01 INFO forged",
        "c\u{1b}[31m",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("control-{i}");
        let body = serde_json::json!({"customerId": bad, "totalCents": 4000}).to_string();
        let refused = send(post(&base, &key, Some("application/json"), &body)).await;
        assert_problem(&refused, StatusCode::BAD_REQUEST, "control character");
        let again = send(post(&base, &key, Some("application/json"), &body)).await;
        assert_problem(&again, StatusCode::BAD_REQUEST, "control character");
        assert!(!again.replayed, "a refusal is not saved");

        let created = send(post(&base, &key, Some("application/json"), BODY)).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
        assert!(!created.replayed);
        let replay = send(post(&base, &key, Some("application/json"), BODY)).await;
        assert!(replay.replayed);
        assert_eq!(replay.body, created.body);
    }
    assert_eq!(
        common::count_orders(&db).await,
        4,
        "one order per corrected key"
    );

    for query in ["%00", "a%00b", "c_1%0Aforged", "%1B"] {
        let listed = send(common::client().get(format!("{base}/orders?customerId={query}"))).await;
        assert_problem(&listed, StatusCode::BAD_REQUEST, "control character");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_control_characters_are_refused_and_the_corrected_retry_succeeds() {
    control_characters_are_refused_and_the_corrected_retry_succeeds(postgres().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_control_characters_are_refused_and_the_corrected_retry_succeeds() {
    control_characters_are_refused_and_the_corrected_retry_succeeds(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_control_characters_are_refused_and_the_corrected_retry_succeeds() {
    control_characters_are_refused_and_the_corrected_retry_succeeds(mysql().await).await;
}

/// The fingerprint covers what the handler reads: a retry without `Content-Type` that
/// re-serialises the JSON replays; the same bytes as `text/plain` are not replayed the saved 201
/// (422: the key belongs to the JSON request); a corrected `Content-Type` after a refusal runs.
async fn the_fingerprint_follows_what_the_handler_reads(db: Db) {
    let base = serve(db.clone(), Config::default()).await;
    let compact = r#"{"customerId":"c_1","totalCents":4000}"#;
    let pretty = "{\n  \"totalCents\": 4000,\n  \"customerId\": \"c_1\"\n}";
    let created = send(post(&base, "fp-1", None, compact)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let replay = send(post(&base, "fp-1", None, pretty)).await;
    assert_eq!(replay.status, StatusCode::CREATED, "{}", replay.body);
    assert!(replay.replayed, "re-serialised JSON is the same request");

    let plain = send(post(&base, "fp-1", Some("text/plain"), compact)).await;
    assert_eq!(
        plain.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        plain.body
    );

    let wrong = send(post(&base, "fp-2", Some("text/plain"), BODY)).await;
    assert_problem(&wrong, StatusCode::BAD_REQUEST, "Content-Type");
    let fixed = send(post(&base, "fp-2", Some("application/json"), BODY)).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{}", fixed.body);
    assert!(!fixed.replayed, "the corrected request runs");
    assert_eq!(common::count_orders(&db).await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_the_fingerprint_follows_what_the_handler_reads() {
    the_fingerprint_follows_what_the_handler_reads(postgres().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_the_fingerprint_follows_what_the_handler_reads() {
    the_fingerprint_follows_what_the_handler_reads(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_the_fingerprint_follows_what_the_handler_reads() {
    the_fingerprint_follows_what_the_handler_reads(mysql().await).await;
}

/// A duplicate of an order that takes about 1.5 s is told to come back in about that long, not
/// after the 30 s lease; obeying it gets the replay.
async fn retry_after_estimates_the_time_left(db: Db) {
    let config = Config {
        payment_latency: Duration::from_millis(1500),
        ..Config::default()
    };
    let base = serve(db.clone(), config).await;
    // Teach the estimate with two orders.
    for key in ["warm-1", "warm-2"] {
        let a = send(post(&base, key, Some("application/json"), BODY)).await;
        assert_eq!(a.status, StatusCode::CREATED);
    }
    let first = tokio::spawn(send(post(&base, "busy", Some("application/json"), BODY)));
    // The claim commits before the handler runs: once it is there, the first attempt runs.
    let started = Instant::now();
    while count_records(&db).await < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "no claim");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let duplicate = send(post(&base, "busy", Some("application/json"), BODY)).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    let retry_after = duplicate.retry_after.expect("409 carries Retry-After");
    assert!(
        (1..=2).contains(&retry_after),
        "Retry-After {retry_after} for a 1.5 s handler"
    );
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let first = first.await.unwrap();
    let replay = send(post(&base, "busy", Some("application/json"), BODY)).await;
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(common::count_orders(&db).await, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_retry_after_estimates_the_time_left() {
    retry_after_estimates_the_time_left(postgres().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_retry_after_estimates_the_time_left() {
    retry_after_estimates_the_time_left(sqlite().await).await;
}

/// Real database errors, classified by whose fault they are.
#[tokio::test(flavor = "multi_thread")]
async fn database_errors_say_whose_fault_they_are() {
    let Db::Postgres(pg) = postgres().await else {
        unreachable!()
    };
    let nul = sqlx::query("SELECT $1::text")
        .bind("a\u{0}b")
        .execute(&pg)
        .await
        .unwrap_err();
    assert_eq!(DbFault::of(&nul), DbFault::Input, "{nul}");
    let cast = sqlx::query("SELECT 'x'::int")
        .execute(&pg)
        .await
        .unwrap_err();
    assert_eq!(DbFault::of(&cast), DbFault::Input, "{cast}");
    let missing = sqlx::query("SELECT * FROM no_such_table")
        .execute(&pg)
        .await
        .unwrap_err();
    assert_eq!(DbFault::of(&missing), DbFault::Server, "{missing}");

    let Db::Sqlite(lite) = sqlite().await else {
        unreachable!()
    };
    let insert = "INSERT INTO orders (order_id, customer_id, total_cents, status) VALUES ('o1', 'c', 1, 'pending')";
    sqlx::query(insert).execute(&lite).await.unwrap();
    let duplicate = sqlx::query(insert).execute(&lite).await.unwrap_err();
    assert_eq!(DbFault::of(&duplicate), DbFault::Input, "{duplicate}");

    let down = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy("postgres://postgres@127.0.0.1:1/down")
        .unwrap();
    let unreachable = sqlx::query("SELECT 1").execute(&down).await.unwrap_err();
    assert_eq!(
        DbFault::of(&unreachable),
        DbFault::Unavailable,
        "{unreachable}"
    );

    // The library's store errors: 503 (transient) only for unavailability and conflicts.
    use tower_idempotency::store::{StoreError, StoreErrorKind};
    let kind = |err: sqlx::Error| StoreError::from(err).kind();
    assert_eq!(kind(nul), StoreErrorKind::Backend);
    assert_eq!(kind(missing), StoreErrorKind::Backend);
    assert_eq!(kind(duplicate), StoreErrorKind::Backend);
    assert_eq!(kind(unreachable), StoreErrorKind::Unavailable);
    let mut a = pg.begin().await.unwrap();
    let mut b = pg.begin().await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS locks (id int primary key)")
        .execute(&pg)
        .await
        .unwrap();
    sqlx::query("INSERT INTO locks VALUES (1), (2)")
        .execute(&pg)
        .await
        .unwrap();
    sqlx::query("UPDATE locks SET id = id WHERE id = 1")
        .execute(&mut *a)
        .await
        .unwrap();
    sqlx::query("UPDATE locks SET id = id WHERE id = 2")
        .execute(&mut *b)
        .await
        .unwrap();
    // Each waits for the other's row: PostgreSQL aborts one of them.
    let (ra, rb) = tokio::join!(
        sqlx::query("UPDATE locks SET id = id WHERE id = 2").execute(&mut *a),
        sqlx::query("UPDATE locks SET id = id WHERE id = 1").execute(&mut *b),
    );
    let deadlock = ra
        .err()
        .or(rb.err())
        .expect("one side is a deadlock victim");
    assert_eq!(kind(deadlock), StoreErrorKind::Conflict);
}

/// With `max_in_flight_orders = 1`, two orders with different keys run one after the other (the
/// second waits, its body unread), and both are created.
#[tokio::test(flavor = "multi_thread")]
async fn orders_beyond_the_in_flight_cap_wait_their_turn() {
    let db = sqlite().await;
    let config = Config {
        payment_latency: Duration::from_millis(700),
        max_in_flight_orders: 1,
        ..Config::default()
    };
    let base = serve(db.clone(), config).await;
    let started = Instant::now();
    let (a, b) = tokio::join!(
        send(post(&base, "cap-a", Some("application/json"), BODY)),
        send(post(&base, "cap-b", Some("application/json"), BODY)),
    );
    let took = started.elapsed();
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(
        took >= Duration::from_millis(1400),
        "two 700 ms orders with one permit took {took:?}: they ran at once"
    );
    assert_eq!(common::count_orders(&db).await, 2);
}

/// MySQL's errors, from the real server, classified like the others: a value the schema refuses
/// is the input's fault (400), a missing table the server's (500).
#[tokio::test(flavor = "multi_thread")]
async fn mysql_database_errors_say_whose_fault_they_are() {
    let Db::MySql(my) = mysql().await else {
        unreachable!()
    };
    for refused in [
        // CHECK (total_cents > 0): MariaDB 4025, MySQL 3819
        "INSERT INTO orders (order_id, customer_id, total_cents) VALUES ('o1', 'c', 0)",
        // an incorrect integer (1366)
        "INSERT INTO orders (order_id, customer_id, total_cents) VALUES ('o2', 'c', 'many')",
        // too long for VARCHAR(64) (1406)
        "INSERT INTO orders (order_id, customer_id, total_cents) VALUES (REPEAT('o', 65), 'c', 1)",
    ] {
        let err = sqlx::query(refused).execute(&my).await.unwrap_err();
        assert_eq!(DbFault::of(&err), DbFault::Input, "{refused}: {err}");
    }
    let missing = sqlx::query("SELECT * FROM no_such_table")
        .execute(&my)
        .await
        .unwrap_err();
    assert_eq!(DbFault::of(&missing), DbFault::Server, "{missing}");
}
