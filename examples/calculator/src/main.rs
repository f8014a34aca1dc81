//! Run with: `cargo run -p calculator -- --help`
//!
//! Prints the duplicate orders a client that retries without keys causes, the money at risk,
//! and the size of the key store that prevents them.

use std::time::Duration;

use calculator::{
    estimate, parse_dollars, parse_duration, parse_share, parse_size, report, Inputs,
};
use clap::Parser;

/// What lost answers cost without idempotency keys, and what the key store costs with them.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Keyed requests (orders placed) per day.
    #[arg(long, default_value_t = 20_000.0)]
    requests_per_day: f64,
    /// The share of requests whose answer never reaches the client: 0.2% or 0.002.
    #[arg(long, default_value = "0.2%", value_parser = parse_share)]
    timeout_rate: f64,
    /// The share of those timeouts whose work was done anyway on the server.
    #[arg(long, default_value = "50%", value_parser = parse_share)]
    succeeded_share: f64,
    /// The average order value, in dollars.
    #[arg(long, default_value = "$40", value_parser = parse_dollars)]
    order_value: f64,
    /// How long the server keeps keys and answers: 24h, 7d, 90m.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    retention: Duration,
    /// The size of one stored record (key, fingerprint, saved answer): 1KB, 2KiB, 800.
    #[arg(long, default_value = "1KB", value_parser = parse_size)]
    record_size: u64,
}

fn main() {
    let args = Args::parse();
    if !(args.requests_per_day.is_finite() && args.requests_per_day >= 0.0) {
        eprintln!(
            "error: --requests-per-day is {}; give a number of requests, like 20000",
            args.requests_per_day
        );
        std::process::exit(2);
    }
    let inputs = Inputs {
        requests_per_day: args.requests_per_day,
        timeout_rate: args.timeout_rate,
        succeeded_share: args.succeeded_share,
        order_value: args.order_value,
        retention: args.retention,
        record_bytes: args.record_size,
    };
    print!("{}", report(&inputs, &estimate(&inputs)));
}
