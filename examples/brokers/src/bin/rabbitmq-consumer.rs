//! Run with: `cargo run -p broker-consumers-example --bin rabbitmq-consumer`
//!
//! ```text
//! DATABASE_URL  (required) postgres://...   where the effects and processed marks live
//! AMQP_URL      amqp://127.0.0.1:5672/%2f  the RabbitMQ broker (guest/guest by default)
//! QUEUE         payments                   declared durable if missing
//! PREFETCH      32                         deliveries in hand at once
//! ```
//!
//! Publish an event (the `message_id` property is the event id):
//!
//! ```text
//! rabbitmqadmin publish routing_key=payments properties='{"message_id":"evt_1"}' \
//!     payload='{"id":"evt_1","amountCents":4000}'
//! ```

use std::process::ExitCode;

use broker_consumers_example::{env, init_tracing, rabbitmq, shutdown_signal};

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = env("DATABASE_URL")?;
    let prefetch = std::env::var("PREFETCH").unwrap_or_else(|_| "32".into());
    let settings = rabbitmq::Settings {
        amqp_url: std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://127.0.0.1:5672/%2f".into()),
        queue: std::env::var("QUEUE").unwrap_or_else(|_| "payments".into()),
        prefetch: prefetch
            .parse()
            .map_err(|_| format!("PREFETCH={prefetch:?} is not a number from 1 to 65535"))?,
    };
    let pool = sqlx::PgPool::connect(&database_url)
        .await
        .map_err(|err| format!("cannot reach DATABASE_URL={database_url}: {err}"))?;
    rabbitmq::run(pool, settings, shutdown_signal()).await
}
