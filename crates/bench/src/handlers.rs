//! The handlers the bench serves, bare and behind the layer, and the server that runs them.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    serve::ListenerExt,
    Json, Router,
};
use serde::Deserialize;
use sqlx::{MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool};
use tower_idempotency::IdempotencyTransaction;

use crate::BoxError;

/// Records are kept this long, so a bench run leaves nothing behind for a day in Redis.
pub const RECORD_TTL: Duration = Duration::from_secs(600);

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewOrder {
    customer_id: String,
    total_cents: i64,
}

fn parse(body: &[u8]) -> Result<NewOrder, StatusCode> {
    serde_json::from_slice(body).map_err(|_| StatusCode::BAD_REQUEST)
}

fn created(id: i64, order: &NewOrder) -> Response {
    let body = serde_json::json!({
        "orderId": id,
        "customerId": order.customer_id,
        "totalCents": order.total_cents,
        "status": "pending",
    });
    (StatusCode::CREATED, Json(body)).into_response()
}

pub type Orders = Arc<Mutex<Vec<NewOrder>>>;

/// The in-memory handler: parse, push, answer 201.
pub async fn memory_create(State(orders): State<Orders>, body: Bytes) -> Response {
    let order = match parse(&body) {
        Ok(o) => o,
        Err(status) => return status.into_response(),
    };
    let response = {
        let mut orders = orders.lock().unwrap_or_else(|p| p.into_inner());
        let id = i64::try_from(orders.len()).unwrap_or(i64::MAX) + 1;
        let response = created(id, &order);
        orders.push(order);
        response
    };
    response
}

/// The in-memory handler plus one Redis write (`SET` of the order under a new key, expiring
/// like the records): the fair bare for the Redis store, whose layer adds Redis round trips.
pub async fn redis_create(
    State((orders, redis, prefix)): State<(Orders, redis::aio::ConnectionManager, Arc<str>)>,
    body: Bytes,
) -> Response {
    let order = match parse(&body) {
        Ok(o) => o,
        Err(status) => return status.into_response(),
    };
    let id = {
        let mut orders = orders.lock().unwrap_or_else(|p| p.into_inner());
        orders.push(NewOrder {
            customer_id: order.customer_id.clone(),
            total_cents: order.total_cents,
        });
        i64::try_from(orders.len()).unwrap_or(i64::MAX)
    };
    let mut redis = redis;
    let written: Result<(), redis::RedisError> = redis::cmd("SET")
        .arg(format!("{prefix}:order:{id}"))
        .arg(&body[..])
        .arg("EX")
        .arg(RECORD_TTL.as_secs())
        .query_async(&mut redis)
        .await;
    match written {
        Ok(()) => created(id, &order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The database handlers: parse, INSERT, answer 201. `$on_pool` runs the INSERT on the pool
/// (the bare handler, and standard mode); `$in_tx` runs it in the idempotency transaction
/// (transactional mode). One definition per database, so both databases run the same handler.
macro_rules! insert_handlers {
    ($db:ty, $pool:ty, $insert:literal, $on_pool:ident, $in_tx:ident) => {
        pub async fn $on_pool(State(pool): State<$pool>, body: Bytes) -> Response {
            let order = match parse(&body) {
                Ok(o) => o,
                Err(status) => return status.into_response(),
            };
            let id = sqlx::query_scalar::<_, i64>($insert)
                .bind(&order.customer_id)
                .bind(order.total_cents)
                .fetch_one(&pool)
                .await;
            inserted(id, &order)
        }

        pub async fn $in_tx(tx: IdempotencyTransaction<$db>, body: Bytes) -> Response {
            let order = match parse(&body) {
                Ok(o) => o,
                Err(status) => return status.into_response(),
            };
            let mut tx = match tx.begin().await {
                Ok(tx) => tx,
                Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
            };
            let id = sqlx::query_scalar::<_, i64>($insert)
                .bind(&order.customer_id)
                .bind(order.total_cents)
                .fetch_one(&mut *tx)
                .await;
            inserted(id, &order)
        }
    };
}

/// 201 with the order, or 503 when the INSERT failed.
fn inserted(id: Result<i64, sqlx::Error>, order: &NewOrder) -> Response {
    match id {
        Ok(id) => created(id, order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

insert_handlers!(
    Postgres,
    PgPool,
    "INSERT INTO bench_orders (customer_id, total_cents) VALUES ($1, $2) RETURNING id",
    pg_create,
    pg_create_tx
);
insert_handlers!(
    Sqlite,
    SqlitePool,
    "INSERT INTO bench_orders (customer_id, total_cents) VALUES (?1, ?2) RETURNING id",
    sqlite_create,
    sqlite_create_tx
);

/// The MySQL handlers, as [`insert_handlers!`] writes the others: MySQL 8 has no `INSERT ..
/// RETURNING`, so the id is the statement's insert id.
const MYSQL_INSERT: &str = "INSERT INTO bench_orders (customer_id, total_cents) VALUES (?, ?)";

/// The INSERT on the pool: the bare MySQL handler, and standard mode.
pub async fn mysql_create(State(pool): State<MySqlPool>, body: Bytes) -> Response {
    let order = match parse(&body) {
        Ok(o) => o,
        Err(status) => return status.into_response(),
    };
    let id = sqlx::query(MYSQL_INSERT)
        .bind(&order.customer_id)
        .bind(order.total_cents)
        .execute(&pool)
        .await
        .map(|done| done.last_insert_id() as i64);
    inserted(id, &order)
}

/// The INSERT in the idempotency transaction (transactional mode).
pub async fn mysql_create_tx(tx: IdempotencyTransaction<MySql>, body: Bytes) -> Response {
    let order = match parse(&body) {
        Ok(o) => o,
        Err(status) => return status.into_response(),
    };
    let mut tx = match tx.begin().await {
        Ok(tx) => tx,
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let id = sqlx::query(MYSQL_INSERT)
        .bind(&order.customer_id)
        .bind(order.total_cents)
        .execute(&mut *tx)
        .await
        .map(|done| done.last_insert_id() as i64);
    inserted(id, &order)
}

/// Serve `app` on 127.0.0.1 (a free port, `TCP_NODELAY`); the base URL.
pub async fn serve(app: Router) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("server on {addr} stopped: {err}");
        }
    });
    Ok(format!("http://{addr}/orders"))
}
