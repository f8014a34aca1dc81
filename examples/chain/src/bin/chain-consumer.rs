//! The consumer of the chain: the RabbitMQ consumer of `examples/brokers`, which claims each
//! event in the transaction of its effect and acks after the commit.
//!
//! Run with: `cargo run -p order-chain --bin chain-consumer`
//!
//! ```text
//! DATABASE_URL  (required) postgres://...   the consumer's own database (effects, processed marks)
//! AMQP_URL      amqp://127.0.0.1:5672/%2f   the RabbitMQ broker
//! QUEUE         payments                    the relay's queue (declared durable if missing)
//! PREFETCH      32                          deliveries in hand at once
//! ```

use std::process::ExitCode;

use broker_consumers_example::{exit_code, init_tracing, rabbitmq};

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    exit_code(rabbitmq::run_from_env().await)
}
