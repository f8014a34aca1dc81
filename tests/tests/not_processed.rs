//! [`NotProcessed`]: an answer the handler marks as "nothing was done" is not saved, the key is
//! released, and in transactional mode the handler's writes are rolled back. On every store.
//!
//! Run with `DATABASE_URL`, `MYSQL_URL` and `REDIS_URL` set (see `scripts/test.sh`).

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use axum::{
    body::{Body, Bytes},
    extract::State,
    http::{Request, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Router,
};
use tower::ServiceExt;
use tower_idempotency::{
    store::{
        mysql::MySqlStore, postgres::PostgresStore, redis::RedisStore, sqlite::SqliteStore,
        MemoryStore, Store,
    },
    Idempotency, IdempotencyTransaction, NotProcessed,
};
use tower_idempotency_tests::{
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, redis_client, unique_name, Isolation,
};

fn request(key: &str, body: &'static str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}

async fn call(app: &Router, key: &str, body: &'static str) -> (StatusCode, bool, Bytes) {
    let response = app.clone().oneshot(request(key, body)).await.unwrap();
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, replayed, body)
}

/// `{"ok": false}` is refused with 400 marked NotProcessed; `{"ok": true}` answers 201.
async fn validate(State(runs): State<Arc<AtomicUsize>>, body: Bytes) -> Response {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    if body.as_ref() == br#"{"ok": false}"# {
        return (StatusCode::BAD_REQUEST, NotProcessed, "fix `ok`").into_response();
    }
    (StatusCode::CREATED, format!("run {run}")).into_response()
}

/// Standard mode: the refusal is not saved; the corrected body with the same key runs once and
/// is then replayed. A refusal sent again also runs again (it was not saved).
async fn standard_mode(store: impl Store) {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(validate))
        .with_state(runs.clone())
        .layer(Idempotency::new(store));
    let (status, replayed, _) = call(&app, "np-1", r#"{"ok": false}"#).await;
    assert_eq!((status, replayed), (StatusCode::BAD_REQUEST, false));
    let (status, replayed, _) = call(&app, "np-1", r#"{"ok": false}"#).await;
    assert_eq!((status, replayed), (StatusCode::BAD_REQUEST, false));
    let (status, replayed, first) = call(&app, "np-1", r#"{"ok": true}"#).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    let (status, replayed, again) = call(&app, "np-1", r#"{"ok": true}"#).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(first, again);
    assert_eq!(runs.load(Ordering::SeqCst), 3, "two refusals and one order");
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_not_processed_releases_the_key() {
    standard_mode(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_not_processed_releases_the_key() {
    let store = RedisStore::connect(redis_client())
        .await
        .expect("connect to REDIS_URL")
        .with_prefix(unique_name("not_processed"));
    standard_mode(store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_standard_not_processed_releases_the_key() {
    let store = PostgresStore::new(fresh_postgres_pool(4).await);
    store.migrate().await.unwrap();
    standard_mode(store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_standard_not_processed_releases_the_key() {
    let store = SqliteStore::new(fresh_sqlite_pool(2).await);
    store.migrate().await.unwrap();
    standard_mode(store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_standard_not_processed_releases_the_key() {
    let store = MySqlStore::new(fresh_mysql_pool(4, Isolation::RepeatableRead).await);
    store.migrate().await.unwrap();
    standard_mode(store).await;
}

/// Transactional mode: the handler writes its row, then refuses with NotProcessed: the row is
/// rolled back and the key released; the corrected request commits one row.
macro_rules! transactional_mode {
    ($name:ident, $db:ty, $store:ty, $pool:expr, $insert:literal) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            let pool = $pool;
            let store = <$store>::new(pool.clone());
            store.migrate().await.unwrap();
            sqlx::query("CREATE TABLE rows_written (body TEXT NOT NULL)")
                .execute(&pool)
                .await
                .unwrap();
            async fn write_then_validate(
                tx: IdempotencyTransaction<$db>,
                body: String,
            ) -> Response {
                let mut conn = tx.begin().await.unwrap();
                sqlx::query($insert)
                    .bind(&body)
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                drop(conn);
                if body == r#"{"ok": false}"# {
                    return (StatusCode::BAD_REQUEST, NotProcessed, "fix `ok`").into_response();
                }
                (StatusCode::CREATED, "created").into_response()
            }
            let app = Router::new()
                .route("/orders", post(write_then_validate))
                .layer(Idempotency::new(store).transactional());
            let count = || async {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM rows_written")
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            };
            let (status, _, _) = call(&app, "tx-np", r#"{"ok": false}"#).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(
                count().await,
                0,
                "the refused attempt's row was rolled back"
            );
            let (status, replayed, _) = call(&app, "tx-np", r#"{"ok": true}"#).await;
            assert_eq!((status, replayed), (StatusCode::CREATED, false));
            let (status, replayed, _) = call(&app, "tx-np", r#"{"ok": true}"#).await;
            assert_eq!((status, replayed), (StatusCode::CREATED, true));
            assert_eq!(count().await, 1);
        }
    };
}

transactional_mode!(
    postgres_transactional_not_processed_rolls_back,
    sqlx::Postgres,
    PostgresStore,
    fresh_postgres_pool(4).await,
    "INSERT INTO rows_written (body) VALUES ($1)"
);
transactional_mode!(
    sqlite_transactional_not_processed_rolls_back,
    sqlx::Sqlite,
    SqliteStore,
    fresh_sqlite_pool(2).await,
    "INSERT INTO rows_written (body) VALUES ($1)"
);
transactional_mode!(
    mysql_transactional_not_processed_rolls_back,
    sqlx::MySql,
    MySqlStore,
    fresh_mysql_pool(4, Isolation::RepeatableRead).await,
    "INSERT INTO rows_written (body) VALUES (?)"
);
