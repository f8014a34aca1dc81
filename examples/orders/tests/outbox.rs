//! The outbox (`Config::outbox`, PostgreSQL): each order inserts its `order.created` event in the
//! transaction of the order and the saved answer, so a replay adds no event, and without the
//! setting nothing is written there.
//!
//! Needs `DATABASE_URL` (a PostgreSQL server the test may create databases on).

mod common;

use orders_api::{Config, Db};
use serde_json::Value;

/// The app on a fresh PostgreSQL database with `outbox`; its base URL and a pool on it.
async fn serve(outbox: bool) -> (String, sqlx::PgPool) {
    let fresh = common::fresh_postgres("tidem_orders_outbox").await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(fresh.options)
        .await
        .expect("connect to the test database");
    let db = Db::Postgres(pool.clone());
    db.migrate().await.expect("migrate");
    let config = Config {
        outbox,
        ..Config::default()
    };
    (common::serve(db, config).await, pool)
}

/// `POST /orders` with `key`; the status, whether it was a replay, and the body.
async fn order(base: &str, key: &str) -> (u16, bool, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}/orders"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"customerId": "c_outbox", "totalCents": 4000}"#)
        .send()
        .await
        .expect("the API answers");
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = serde_json::from_str(&response.text().await.unwrap()).expect("a JSON body");
    (status, replayed, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn each_order_writes_one_event_and_a_replay_none() {
    let (base, pool) = serve(true).await;
    let (status, replayed, first) = order(&base, "outbox-1").await;
    assert_eq!((status, replayed), (201, false));
    let (status, replayed, again) = order(&base, "outbox-1").await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, first, "the replay is the first answer");
    let (status, _, second) = order(&base, "outbox-2").await;
    assert_eq!(status, 201);

    let events: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT event_id, kind, payload::text, published_at::text FROM outbox ORDER BY created_at, event_id",
    )
    .fetch_all(&pool)
    .await
    .expect("read the outbox");
    assert_eq!(events.len(), 2, "one event per order: {events:?}");
    for order in [&first, &second] {
        let id = order["orderId"].as_str().unwrap();
        let (_, kind, payload, published_at) = events
            .iter()
            .find(|(event_id, ..)| event_id == id)
            .unwrap_or_else(|| panic!("no event for order {id}: {events:?}"));
        assert_eq!(kind, "order.created");
        let payload: Value = serde_json::from_str(payload).expect("the payload is JSON");
        assert_eq!(payload["id"], id);
        assert_eq!(payload["orderId"], id);
        assert_eq!(payload["customerId"], "c_outbox");
        assert_eq!(payload["amountCents"], 4000);
        assert_eq!(*published_at, None, "unpublished until a relay marks it");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_setting_the_outbox_stays_empty() {
    let (base, pool) = serve(false).await;
    let (status, _, _) = order(&base, "no-outbox").await;
    assert_eq!(status, 201);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((orders, events), (1, 0));
}

#[tokio::test]
#[should_panic(expected = "the outbox (OUTBOX=true) needs PostgreSQL")]
async fn the_outbox_on_sqlite_is_refused() {
    let path = tower_idempotency_testkit::fresh_sqlite_path("orders_outbox");
    let db = Db::connect(Some(&format!("sqlite://{}", path.display())))
        .await
        .expect("open a SQLite file");
    let config = Config {
        outbox: true,
        ..Config::default()
    };
    let _ = orders_api::app(db, config);
}
