//! The smallest axum app with idempotent POSTs: a retry with the same `Idempotency-Key` gets the
//! first answer back instead of creating a second order.
//!
//! Run with:
//!
//! ```sh
//! cargo run -p quickstart                                       # memory store
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p quickstart  # PostgreSQL
//!
//! # twice: one order, the second answer is a replay (`idempotent-replayed: true`)
//! curl -i localhost:3000/orders -H 'Idempotency-Key: 8e03978e' \
//!      -H 'Content-Type: application/json' -d '{"item":"book"}'
//! ```

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use axum::{extract::State, http::StatusCode, routing::post, Json, Router};
use serde_json::{json, Value};
use tower_idempotency::{
    store::postgres::{sqlx::PgPool, PostgresStore},
    Idempotency,
};

/// Creates an order: runs once per key; retries get its saved answer.
async fn create_order(
    State(next_id): State<Arc<AtomicU64>>,
    Json(order): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let id = next_id.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        Json(json!({ "id": id, "order": order })),
    )
}

/// The routes, with the idempotency layer on them: PostgreSQL with a pool, memory without.
pub fn app(pool: Option<PgPool>) -> Router {
    let routes = Router::new()
        .route("/orders", post(create_order))
        .with_state(Arc::new(AtomicU64::new(0)));
    match pool {
        Some(pool) => routes.route_layer(Idempotency::postgres(pool)),
        None => routes.route_layer(Idempotency::memory()),
    }
}

/// A pool on `url`, with the idempotency table created (once; later runs find it).
pub async fn postgres(url: &str) -> Result<PgPool, Box<dyn std::error::Error>> {
    let pool = PgPool::connect(url).await?;
    PostgresStore::new(pool.clone()).migrate().await?;
    Ok(pool)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = match std::env::var("DATABASE_URL") {
        Ok(url) => Some(postgres(&url).await?),
        Err(_) => None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(pool)).await?;
    Ok(())
}
