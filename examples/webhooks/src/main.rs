//! Run with: `WEBHOOK_SECRET=whsec_dev cargo run -p webhooks-example`
//!
//! A webhook receiver that verifies HMAC-SHA256 signatures and applies each event once.
//!
//! ```text
//! WEBHOOK_SECRET          (required) the secret shared with the sender
//! WEBHOOK_TOLERANCE_SECS  300                     signatures older (or newer) than this are refused
//! DATABASE_URL            sqlite://webhooks.db    an SQLite database, created if missing
//! BIND_ADDR               127.0.0.1:3001
//! RUST_LOG                info
//! ```
//!
//! Try it:
//!
//! ```text
//! body='{"id":"evt_1","type":"payment.captured","data":{"payment_id":"pay_1","amount_cents":4000}}'
//! t=$(date +%s)
//! sig=$(printf '%s' "$t.$body" | openssl dgst -sha256 -hmac whsec_dev -hex | cut -d' ' -f2)
//! curl -i localhost:3001/webhooks/payments -H "Webhook-Signature: t=$t,v1=$sig" -d "$body"
//! curl localhost:3001/payments/pay_1
//! ```
//!
//! Send the same delivery again: `"status": "duplicate"`, and the payment's totals stay put.

use std::{process::ExitCode, time::Duration};

use tracing_subscriber::EnvFilter;
use webhooks_example::Config;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("WEBHOOK_SECRET")
        .map_err(|_| "WEBHOOK_SECRET is not set: export the secret shared with the sender")?;
    let mut config = Config::new(secret);
    if let Ok(seconds) = std::env::var("WEBHOOK_TOLERANCE_SECS") {
        let seconds: u64 = seconds.parse().map_err(|_| {
            format!("WEBHOOK_TOLERANCE_SECS={seconds:?} is not a number of seconds")
        })?;
        config = config.with_tolerance(Duration::from_secs(seconds));
    }
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://webhooks.db".into());
    let bind = std::env::var("BIND_ADDR").unwrap_or_else(|_| "127.0.0.1:3001".into());

    let pool = webhooks_example::connect(&url)
        .await
        .map_err(|err| format!("cannot open DATABASE_URL={url}: {err}"))?;
    webhooks_example::migrate(&pool).await?;
    let listener = tokio::net::TcpListener::bind(&bind)
        .await
        .map_err(|err| format!("cannot listen on BIND_ADDR={bind}: {err}"))?;
    tracing::info!(addr = %listener.local_addr()?, "receiving webhooks");
    axum::serve(listener, webhooks_example::app(pool, config))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
