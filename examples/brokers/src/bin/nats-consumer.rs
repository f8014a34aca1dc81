//! Run with: `cargo run -p broker-consumers-example --bin nats-consumer`
//!
//! ```text
//! DATABASE_URL     (required) postgres://...   where the effects and processed marks live
//! NATS_URL         127.0.0.1:4222              the NATS server, with JetStream enabled
//! STREAM           PAYMENTS                    the stream (it must exist)
//! CONSUMER         ledger                      the durable pull consumer, created if missing
//! ACK_WAIT_MS      30000                       redelivery after this long without an ack
//! MAX_ACK_PENDING  32                          messages in hand at once
//! ```
//!
//! Publish an event with its id as `Nats-Msg-Id`, so JetStream drops a republish within the
//! stream's duplicate window; the consumer dedupes every copy by the body's `id`:
//!
//! ```text
//! nats stream add PAYMENTS --subjects 'payments.>' --defaults
//! nats pub payments.captured -H Nats-Msg-Id:evt_1 '{"id":"evt_1","amountCents":4000}'
//! ```

use std::{process::ExitCode, time::Duration};

use broker_consumers_example::{env, env_number, exit_code, init_tracing, nats, shutdown_signal};

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = env("DATABASE_URL")?;
    let settings = nats::Settings {
        nats_url: std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".into()),
        stream: std::env::var("STREAM").unwrap_or_else(|_| "PAYMENTS".into()),
        consumer: std::env::var("CONSUMER").unwrap_or_else(|_| "ledger".into()),
        ack_wait: Duration::from_millis(env_number("ACK_WAIT_MS", 30_000)?),
        max_ack_pending: env_number("MAX_ACK_PENDING", 32)?,
    };
    let pool = sqlx::PgPool::connect(&database_url)
        .await
        .map_err(|err| format!("cannot reach DATABASE_URL: {err}"))?;
    nats::run(pool, settings, shutdown_signal()).await
}
