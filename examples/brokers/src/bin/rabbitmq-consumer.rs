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

use broker_consumers_example::{exit_code, init_tracing, rabbitmq};

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    exit_code(rabbitmq::run_from_env().await)
}
