//! The reference orders API (`examples/orders`) over real sockets, on PostgreSQL, SQLite and
//! MySQL (MariaDB).
//!
//! Every test runs the real router from `orders_api::app` on a fresh database, behind
//! `axum::serve` on 127.0.0.1, and talks to it with reqwest. One suite, instantiated per database
//! by [`orders_suite!`]. The crash test of the real binary lives in `examples/orders/tests/crash.rs`.
//!
//! Run with `DATABASE_URL` and `MYSQL_URL` set (see `scripts/test.sh`).

mod common;

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    time::{Duration, Instant},
};

use common::serve;
use orders_api::{Config, Db, Order};
use reqwest::StatusCode;
use serde_json::Value;

/// No test may take longer than this, whatever hangs.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);

const BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the test finished within its time bound");
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(128)
        .build()
        .expect("client")
}

fn with_latency(ms: u64) -> Config {
    Config {
        payment_latency: Duration::from_millis(ms),
        ..Config::default()
    }
}

fn post(client: &reqwest::Client, base: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/orders"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
}

/// One answer, read in full.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    retry_after: Option<u64>,
    content_type: String,
    location: Option<String>,
    body: String,
}

async fn answer(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("the server answers");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("header is text").to_owned())
    };
    let status = response.status();
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after").map(|v| v.parse().expect("Retry-After is seconds"));
    let content_type = header("content-type").unwrap_or_default();
    let location = header("location");
    let body = response.text().await.expect("body");
    Answer {
        status,
        replayed,
        retry_after,
        content_type,
        location,
        body,
    }
}

/// POST with `key` until the answer is not 409, sleeping the `Retry-After` the server asks for;
/// at most 30 attempts and 30 s.
async fn post_until_settled(client: &reqwest::Client, base: &str, key: &str) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..30 {
        let a = answer(post(client, base, key, BODY)).await;
        if a.status != StatusCode::CONFLICT {
            return a;
        }
        assert!(Instant::now() < deadline, "still 409 after 30 s");
        let wait = a.retry_after.expect("409 carries Retry-After");
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
    panic!("still 409 after 30 attempts");
}

/// A second pool on the same database: what a second instance of the API would open.
async fn second_pool(db: &Db) -> Db {
    match db {
        Db::Postgres(pool) => Db::Postgres(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect_with((*pool.connect_options()).clone())
                .await
                .expect("second PostgreSQL pool"),
        ),
        Db::Sqlite(pool) => Db::Sqlite(
            sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with((*pool.connect_options()).clone())
                .await
                .expect("second SQLite pool"),
        ),
        Db::MySql(pool) => Db::MySql(
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(16)
                .connect_with((*pool.connect_options()).clone())
                .await
                .expect("second MySQL pool"),
        ),
    }
}

fn order_of(a: &Answer) -> Order {
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{e}: not an order: {}", a.body))
}

fn assert_problem(a: &Answer, status: StatusCode, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.body);
    assert_eq!(a.content_type, "application/problem+json", "{what}");
    let json: Value = serde_json::from_str(&a.body).expect("problem is JSON");
    assert_eq!(json["status"], status.as_u16(), "{what}");
    for field in ["type", "title", "detail"] {
        assert!(
            json[field].as_str().is_some_and(|s| !s.is_empty()),
            "{what}: problem without {field}: {}",
            a.body
        );
    }
}

/// `n` concurrent POSTs with one key: one order, one execution, every other answer a replay of
/// its 201 or a 409 with `Retry-After`.
async fn one_key_n_concurrent(db: &Db, base: &str, client: &reqwest::Client, n: usize) -> Order {
    let key = uuid::Uuid::new_v4().to_string();
    let before = common::count_orders(db).await;
    let attempts: Vec<_> = (0..n)
        .map(|_| tokio::spawn(answer(post(client, base, &key, BODY))))
        .collect();
    let mut answers = Vec::with_capacity(n);
    for attempt in attempts {
        answers.push(attempt.await.expect("attempt task"));
    }
    let executed: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed)
        .collect();
    assert_eq!(
        executed.len(),
        1,
        "exactly one execution among {answers:#?}"
    );
    let first = executed[0].clone();
    let order = order_of(&first);
    assert_eq!(order.status, "pending");
    assert_eq!(
        first.location.as_deref(),
        Some(format!("/orders/{}", order.order_id).as_str())
    );
    for a in &answers {
        match a.status {
            StatusCode::CREATED => {
                assert_eq!(a.body, first.body, "a replay carries the same body");
                assert_eq!(a.location, first.location);
            }
            StatusCode::CONFLICT => {
                assert!(
                    a.retry_after.is_some_and(|s| s >= 1),
                    "409 without Retry-After"
                );
                assert_problem(a, StatusCode::CONFLICT, "in-flight duplicate");
            }
            other => panic!("unexpected {other}: {}", a.body),
        }
    }
    assert!(
        answers.iter().any(|a| a.status == StatusCode::CONFLICT),
        "with a 200 ms payment the attempts overlapped: some got 409"
    );
    assert_eq!(
        common::count_orders(db).await,
        before + 1,
        "exactly one order row"
    );

    // After the first attempt finished, the key replays its answer.
    let replay = post_until_settled(client, base, &key).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed);
    assert_eq!(replay.body, first.body);
    assert_eq!(common::count_orders(db).await, before + 1);
    order
}

async fn concurrent_posts_with_one_key_create_one_order(db: Db) {
    let base = serve(db.clone(), with_latency(200)).await;
    let client = client();
    one_key_n_concurrent(&db, &base, &client, 5).await;
    one_key_n_concurrent(&db, &base, &client, 50).await;
    assert_eq!(common::count_orders(&db).await, 2);
}

async fn two_instances_create_one_order_per_key(db: Db) {
    const KEYS: usize = 20;
    const ATTEMPTS: usize = 5;
    let other = second_pool(&db).await;
    let bases = [
        serve(db.clone(), with_latency(100)).await,
        serve(other.clone(), with_latency(100)).await,
    ];
    let client = client();
    let keys: Vec<String> = (0..KEYS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();

    // 100 concurrent requests: each key 5 times, alternating between the two instances.
    let mut tasks = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        for attempt in 0..ATTEMPTS {
            let base = &bases[(k + attempt) % 2];
            let request = post(&client, base, key, BODY);
            let key = key.clone();
            tasks.push(tokio::spawn(async move { (key, answer(request).await) }));
        }
    }
    let mut by_key: HashMap<String, Vec<Answer>> = HashMap::new();
    for task in tasks {
        let (key, a) = task.await.expect("attempt task");
        by_key.entry(key).or_default().push(a);
    }

    let mut order_ids = HashSet::new();
    for key in &keys {
        let answers = &by_key[key];
        let executed = answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED && !a.replayed)
            .count();
        assert_eq!(executed, 1, "key executed {executed} times: {answers:#?}");
        for a in answers {
            assert!(
                a.status == StatusCode::CREATED || a.status == StatusCode::CONFLICT,
                "unexpected answer {a:?}"
            );
        }
        // Both instances now replay the same answer for the key.
        let settled: Vec<Answer> = futures_util::future::join_all(
            bases
                .iter()
                .map(|base| post_until_settled(&client, base, key)),
        )
        .await;
        let order = order_of(&settled[0]);
        for a in settled
            .iter()
            .chain(answers.iter().filter(|a| a.status == StatusCode::CREATED))
        {
            assert_eq!(a.status, StatusCode::CREATED);
            assert_eq!(
                order_of(a),
                order,
                "one order per key, whichever instance answers"
            );
        }
        order_ids.insert(order.order_id);
    }
    assert_eq!(order_ids.len(), KEYS);
    assert_eq!(
        common::count_orders(&db).await,
        KEYS as i64,
        "exactly one order per key"
    );
    assert_eq!(common::count_orders(&other).await, KEYS as i64);
}

async fn invalid_input_is_400_problem(db: Db) {
    let base = serve(db.clone(), Config::default()).await;
    let client = client();
    let cases: &[(&str, Option<&str>, &str)] = &[
        (
            "malformed JSON",
            Some("application/json"),
            r#"{"customerId": "c_1", "#,
        ),
        ("empty body", Some("application/json"), ""),
        ("not an object", Some("application/json"), "[4000]"),
        (
            "missing customerId",
            Some("application/json"),
            r#"{"totalCents": 4000}"#,
        ),
        (
            "missing totalCents",
            Some("application/json"),
            r#"{"customerId": "c_1"}"#,
        ),
        (
            "zero totalCents",
            Some("application/json"),
            r#"{"customerId": "c_1", "totalCents": 0}"#,
        ),
        (
            "negative totalCents",
            Some("application/json"),
            r#"{"customerId": "c_1", "totalCents": -1}"#,
        ),
        (
            "string totalCents",
            Some("application/json"),
            r#"{"customerId": "c_1", "totalCents": "4000"}"#,
        ),
        (
            "fractional totalCents",
            Some("application/json"),
            r#"{"customerId": "c_1", "totalCents": 40.5}"#,
        ),
        (
            "number customerId",
            Some("application/json"),
            r#"{"customerId": 1, "totalCents": 4000}"#,
        ),
        (
            "empty customerId",
            Some("application/json"),
            r#"{"customerId": "", "totalCents": 4000}"#,
        ),
        (
            "null customerId",
            Some("application/json"),
            r#"{"customerId": null, "totalCents": 4000}"#,
        ),
        ("text/plain", Some("text/plain"), BODY),
        (
            "form content type",
            Some("application/x-www-form-urlencoded"),
            BODY,
        ),
    ];
    for (what, content_type, body) in cases {
        let mut request = client
            .post(format!("{base}/orders"))
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .body(body.to_string());
        if let Some(ct) = content_type {
            request = request.header("Content-Type", *ct);
        }
        assert_problem(&answer(request).await, StatusCode::BAD_REQUEST, what);
    }

    // The key is required (the layer answers before the handler).
    let no_key = client
        .post(format!("{base}/orders"))
        .header("Content-Type", "application/json")
        .body(BODY);
    assert_problem(&answer(no_key).await, StatusCode::BAD_REQUEST, "no key");
    assert_eq!(
        common::count_orders(&db).await,
        0,
        "no invalid request created an order"
    );

    // JSON without Content-Type is accepted.
    let bare = client
        .post(format!("{base}/orders"))
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(BODY);
    assert_eq!(answer(bare).await.status, StatusCode::CREATED);
    assert_eq!(common::count_orders(&db).await, 1);
}

/// Instances starting at once on a fresh database (each with its own pool) all migrate it, the
/// store's table and the example's, and it then takes orders.
async fn instances_starting_at_once_all_migrate(db: Db) {
    let mut instances = vec![db.clone()];
    for _ in 1..4 {
        instances.push(second_pool(&db).await);
    }
    let starts: Vec<_> = instances
        .into_iter()
        .map(|instance| {
            tokio::spawn(async move { instance.migrate().await.map_err(|e| e.to_string()) })
        })
        .collect();
    for start in starts {
        start
            .await
            .expect("the start task")
            .expect("every instance migrates");
    }
    let base = serve(db.clone(), Config::default()).await;
    let created = answer(post(&client(), &base, "after-the-migrations", BODY)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(common::count_orders(&db).await, 1);
}

async fn orders_can_be_read_back(db: Db) {
    let base = serve(db.clone(), Config::default()).await;
    let client = client();
    let create = |customer: &str, cents: i64| {
        let body = format!(r#"{{"customerId": "{customer}", "totalCents": {cents}}}"#);
        answer(post(
            &client,
            &base,
            &uuid::Uuid::new_v4().to_string(),
            &body,
        ))
    };
    let mut mine = Vec::new();
    for cents in [100, 200, 300] {
        let a = create("c_list", cents).await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        mine.push(a);
    }
    assert_eq!(create("c_other", 999).await.status, StatusCode::CREATED);

    // GET /orders/{id}: 200 with the same order, via the Location header.
    for a in &mine {
        let location = a.location.as_deref().expect("Location");
        let got = answer(client.get(format!("{base}{location}"))).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(order_of(&got), order_of(a));
    }
    let unknown = answer(client.get(format!("{base}/orders/{}", uuid::Uuid::new_v4()))).await;
    assert_problem(&unknown, StatusCode::NOT_FOUND, "unknown id");
    let malformed = answer(client.get(format!("{base}/orders/not-an-id"))).await;
    assert_problem(&malformed, StatusCode::NOT_FOUND, "malformed id");

    // GET /orders?customerId=: that customer's orders, oldest first.
    let list = answer(client.get(format!("{base}/orders?customerId=c_list"))).await;
    assert_eq!(list.status, StatusCode::OK);
    let json: Value = serde_json::from_str(&list.body).expect("JSON");
    let listed: Vec<Order> =
        serde_json::from_value(json["orders"].clone()).expect("{\"orders\": [...]}");
    let expected: Vec<Order> = mine.iter().map(order_of).collect();
    assert_eq!(listed, expected);
    // A customer id with a trailing space is another customer (MySQL's `utf8mb4_bin` would
    // compare them equal).
    assert_eq!(create("c_list ", 400).await.status, StatusCode::CREATED);
    for query in ["c_list", "c_list%20"] {
        let list = answer(client.get(format!("{base}/orders?customerId={query}"))).await;
        let json: Value = serde_json::from_str(&list.body).expect("JSON");
        let count = json["orders"].as_array().map_or(0, Vec::len);
        assert_eq!(
            count,
            if query == "c_list" { 3 } else { 1 },
            "{query}: {}",
            list.body
        );
    }
    let none = answer(client.get(format!("{base}/orders?customerId=c_nobody"))).await;
    assert_eq!(none.status, StatusCode::OK);
    assert_eq!(none.body, r#"{"orders":[]}"#);
    let missing = answer(client.get(format!("{base}/orders"))).await;
    assert_problem(&missing, StatusCode::BAD_REQUEST, "list without customerId");

    // GET /healthz.
    let health = answer(client.get(format!("{base}/healthz"))).await;
    assert_eq!(health.status, StatusCode::OK);
}

/// The stale holder's request: the fingerprint the layer computes for `POST /orders` with
/// [`BODY`], and the scoped hash of `key` for a caller without `Authorization`.
fn layer_view_of(key: &str) -> (tower_idempotency::KeyHash, tower_idempotency::Fingerprint) {
    use tower_idempotency::fingerprint::{DefaultFingerprint, FingerprintFn};
    let (parts, ()) = http::Request::post("/orders")
        .header("content-type", "application/json")
        .body(())
        .expect("request")
        .into_parts();
    let fingerprint = DefaultFingerprint::default().fingerprint(&parts, &bytes::Bytes::from(BODY));
    let hash = tower_idempotency::IdempotencyKey::parse(key.as_bytes())
        .expect("valid key")
        .scoped_hash(&tower_idempotency::Scope::new(""));
    (hash, fingerprint)
}

/// One suite per database: `$fresh` makes a fresh pool, `$variant` wraps it in [`Db`], `$store`
/// is the idempotency store on it, `$insert` the stale holder's order insert in its dialect.
macro_rules! orders_suite {
    ($module:ident, $fresh:path, $variant:ident, $store:ty, $insert:literal) => {
        mod $module {
            use super::*;
            use tower_idempotency::store::{Claim, FencingToken, StoredResponse};
            use tower_idempotency::store::{ClaimOutcome, Fenced, Store, TransactionalStore};

            async fn fresh() -> Db {
                let db = Db::$variant($fresh(16).await);
                db.migrate().await.expect("migrations");
                db
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_posts_with_one_key_create_one_order() {
                bounded(super::concurrent_posts_with_one_key_create_one_order(
                    fresh().await,
                ))
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn two_instances_create_one_order_per_key() {
                bounded(super::two_instances_create_one_order_per_key(fresh().await)).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn invalid_input_is_400_problem() {
                bounded(super::invalid_input_is_400_problem(fresh().await)).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn instances_starting_at_once_all_migrate() {
                bounded(super::instances_starting_at_once_all_migrate(Db::$variant(
                    $fresh(16).await,
                )))
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn orders_can_be_read_back() {
                bounded(super::orders_can_be_read_back(fresh().await)).await
            }

            /// A holder whose lease lapsed and was taken over by a retry cannot commit its work.
            ///
            /// The stale holder is driven through the store directly: it claims the key as the
            /// layer would, never renews, and does its work only after an HTTP retry took the key
            /// over and committed. Its `complete_in` is then fenced out and its transaction,
            /// order included, rolls back.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_holder_whose_lease_was_taken_over_cannot_commit() {
                bounded(async {
                    let pool = $fresh(16).await;
                    let db = Db::$variant(pool.clone());
                    db.migrate().await.expect("migrations");
                    let store = <$store>::new(pool.clone());
                    let base = serve(db.clone(), Config::default()).await;
                    let client = client();

                    // 1. The stale holder claims the key with a 300 ms lease.
                    let key = uuid::Uuid::new_v4().to_string();
                    let (hash, fingerprint) = layer_view_of(&key);
                    let claim = Claim::new(
                        hash,
                        fingerprint,
                        FencingToken::new(),
                        Duration::from_millis(300),
                        Duration::from_secs(3600),
                    );
                    let stale = claim.hold();
                    let outcome = store.claim(&claim).await.expect("claim");
                    assert_eq!(outcome, ClaimOutcome::Claimed { taken_over: false });

                    // 2. While its lease is valid, the HTTP attempt is refused; once it lapses,
                    //    the retry takes the key over and commits an order.
                    let early = answer(post(&client, &base, &key, BODY)).await;
                    assert_eq!(early.status, StatusCode::CONFLICT, "{}", early.body);
                    let taken_over = post_until_settled(&client, &base, &key).await;
                    assert_eq!(
                        taken_over.status,
                        StatusCode::CREATED,
                        "{}",
                        taken_over.body
                    );
                    assert!(!taken_over.replayed);
                    assert_eq!(common::count_orders(&db).await, 1);

                    // 3. The stale holder now does its work in its own transaction...
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query($insert)
                        .bind(uuid::Uuid::new_v4().to_string())
                        .execute(&mut *tx)
                        .await
                        .expect("stale insert");
                    // ...and cannot record its answer: the token was replaced.
                    let response = StoredResponse::new(
                        axum::http::StatusCode::CREATED,
                        axum::http::HeaderMap::new(),
                        axum::body::Bytes::from_static(b"stale"),
                    );
                    let fenced = store
                        .complete_in(&mut tx, &stale, &response)
                        .await
                        .expect("complete_in");
                    assert_eq!(fenced, Fenced::Lost);
                    tx.rollback().await.expect("rollback");
                    assert_eq!(
                        common::count_orders(&db).await,
                        1,
                        "the stale work was rolled back"
                    );

                    // Every other write of the stale holder is fenced out too.
                    assert_eq!(
                        store
                            .renew(&stale, Duration::from_secs(30))
                            .await
                            .expect("renew"),
                        Fenced::Lost
                    );
                    assert_eq!(
                        store.complete(&stale, &response).await.expect("complete"),
                        Fenced::Lost
                    );
                    assert_eq!(store.release(&stale).await.expect("release"), Fenced::Lost);

                    // The key still replays the retry's answer.
                    let replay = post_until_settled(&client, &base, &key).await;
                    assert_eq!(replay.status, StatusCode::CREATED);
                    assert!(replay.replayed);
                    assert_eq!(replay.body, taken_over.body);
                    assert_eq!(common::count_orders(&db).await, 1);
                })
                .await
            }
        }
    };
}

orders_suite!(
    postgres,
    tower_idempotency_testkit::fresh_postgres_pool,
    Postgres,
    tower_idempotency::store::postgres::PostgresStore,
    "INSERT INTO orders (order_id, customer_id, total_cents) VALUES ($1, 'c_1', 4000)"
);
orders_suite!(
    sqlite,
    tower_idempotency_testkit::fresh_sqlite_pool,
    Sqlite,
    tower_idempotency::store::sqlite::SqliteStore,
    "INSERT INTO orders (order_id, customer_id, total_cents) VALUES ($1, 'c_1', 4000)"
);

/// A MySQL pool at InnoDB's default isolation level (REPEATABLE READ).
async fn fresh_mysql_pool(max_connections: u32) -> sqlx::MySqlPool {
    tower_idempotency_testkit::fresh_mysql_pool(
        max_connections,
        tower_idempotency_testkit::Isolation::RepeatableRead,
    )
    .await
}

orders_suite!(
    mysql,
    fresh_mysql_pool,
    MySql,
    tower_idempotency::store::mysql::MySqlStore,
    "INSERT INTO orders (order_id, customer_id, total_cents) VALUES (?, 'c_1', 4000)"
);
