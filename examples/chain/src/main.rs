//! Run with: `cargo run -p order-chain` (after `cargo build -p order-chain --bins`)
//!
//! The whole chain once, with its faults, then its figures:
//!
//! ```text
//! DATABASE_URL  (required) postgres://...   two tidem_chain_* databases are created there (dropped at the end)
//! AMQP_URL      (required) amqp://...       a tidem_chain_* queue is declared there (and deleted)
//! INTENTS       1000                        orders placed
//! LOSS_RATE     0.2                         the share of answers the proxy loses
//! SEED          21                          the seed of the proxy's loss generator
//! ```
//!
//! The relay and the consumer are the `chain-relay` and `chain-consumer` binaries next to this
//! one.

use std::process::ExitCode;

use broker_consumers_example::{env_number, exit_code};
use order_chain::{run, BoxError, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    exit_code(start().await)
}

async fn start() -> Result<(), BoxError> {
    let here = std::env::current_exe()?;
    let dir = here.parent().ok_or("the binary is in a directory")?;
    let mut settings = Settings::new(dir.join("chain-relay"), dir.join("chain-consumer"));
    settings.intents = env_number("INTENTS", settings.intents)?;
    settings.loss_rate = env_number("LOSS_RATE", settings.loss_rate)?;
    settings.seed = env_number("SEED", settings.seed)?;
    if !(0.0..1.0).contains(&settings.loss_rate) {
        return Err(format!("LOSS_RATE={} is not in [0, 1)", settings.loss_rate).into());
    }
    for binary in [&settings.relay_binary, &settings.consumer_binary] {
        if !binary.exists() {
            return Err(format!(
                "{} is missing: build it with `cargo build -p order-chain --bins`",
                binary.display()
            )
            .into());
        }
    }
    let report = run(&settings).await?;
    println!("{report}");
    eprintln!("dropping the databases {}", report.databases.join(", "));
    order_chain::drop_databases(&report).await
}
