//! Run with: `cargo run --release -p lossy -- --orders 2000 --loss-rate 0.1`
//!
//! Drives the same orders through a lossy proxy with a naive client and with the idempotent
//! client, and prints the duplicate orders each produced.

use std::io::IsTerminal;

use clap::Parser;
use lossy::{Settings, DEFAULT_CONCURRENCY, DEFAULT_LOSS_RATE, DEFAULT_ORDERS, DEFAULT_SEED};

/// The lossy-network proof: duplicates with a new key per attempt, none with one key per intent.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Orders (intents) each client places.
    #[arg(long, default_value_t = DEFAULT_ORDERS)]
    orders: u64,
    /// The share of answers the proxy drops after the server did the work (0 to 0.9).
    #[arg(long, default_value_t = DEFAULT_LOSS_RATE, value_parser = loss_rate)]
    loss_rate: f64,
    /// The seed of the proxy's generator.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Orders in flight at once per client.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY)]
    concurrency: usize,
}

fn loss_rate(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=0.9).contains(p))
        .ok_or_else(|| format!("`{text}` is not a loss rate; give a share from 0 to 0.9, like 0.1"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let settings = Settings {
        orders: args.orders,
        loss_rate: args.loss_rate,
        seed: args.seed,
        concurrency: args.concurrency,
        progress: std::io::stderr().is_terminal(),
    };
    let report = lossy::run(settings).await?;
    print!("{report}");
    if report.idempotent.duplicates > 0 {
        eprintln!("error: the idempotent client produced duplicates");
        std::process::exit(1);
    }
    Ok(())
}
