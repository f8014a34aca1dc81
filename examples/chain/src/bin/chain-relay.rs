//! The outbox relay of the chain (see `order_chain::relay`).
//!
//! Run with: `cargo run -p order-chain --bin chain-relay`
//!
//! ```text
//! DATABASE_URL          (required) postgres://...   the orders API's database (its outbox)
//! AMQP_URL              amqp://127.0.0.1:5672/%2f   the RabbitMQ broker
//! QUEUE                 orders                      declared durable if missing
//! RELAY_BATCH           25                          rows per batch
//! RELAY_POLL_MS         20                          wait when the outbox is empty
//! RELAY_STALL_AT_BATCH  (unset)                     the proof's hook: stall between confirm and mark
//! ```
//!
//! SIGTERM or Ctrl-C: the batch in hand is finished, then the relay exits.

use std::process::ExitCode;

use broker_consumers_example::{env, exit_code, init_tracing, shutdown_signal};
use order_chain::relay;

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    exit_code(run().await)
}

async fn run() -> Result<(), order_chain::BoxError> {
    let database_url = env("DATABASE_URL")?;
    let settings = relay::Settings::from_env()?;
    let pool = sqlx::PgPool::connect(&database_url)
        .await
        .map_err(|err| format!("cannot reach DATABASE_URL: {err}"))?;
    relay::run(pool, settings, shutdown_signal()).await
}
