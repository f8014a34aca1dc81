//! Run with: `WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw cargo run -p webhooks-example`
//!
//! A webhook receiver that verifies Standard Webhooks (and, optionally, Stripe) signatures and
//! applies each delivery once.
//!
//! ```text
//! WEBHOOK_SECRET          (required) the Standard Webhooks secret, whsec_<base64 key>
//! STRIPE_WEBHOOK_SECRET   (optional) a Stripe endpoint secret: enables POST /webhooks/stripe
//! WEBHOOK_TOLERANCE_SECS  300                     signatures older (or newer) than this are refused
//! DATABASE_URL            sqlite://webhooks.db    an SQLite database, created if missing
//! BIND_ADDR               127.0.0.1:3001
//! RUST_LOG                info
//! ```
//!
//! Try it (Standard Webhooks: the key is the base64 after `whsec_`):
//!
//! ```text
//! body='{"id":"evt_1","type":"payment.captured","data":{"payment_id":"pay_1","amount_cents":4000}}'
//! id=msg_1; t=$(date +%s)
//! key=$(printf '%s' MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw | base64 -d | od -An -tx1 | tr -d ' \n')
//! sig=$(printf '%s' "$id.$t.$body" | openssl dgst -sha256 -mac HMAC -macopt hexkey:$key -binary | base64)
//! curl -i localhost:3001/webhooks/payments -H "webhook-id: $id" -H "webhook-timestamp: $t" \
//!     -H "webhook-signature: v1,$sig" -d "$body"
//! curl localhost:3001/payments/pay_1
//! ```
//!
//! Send the same delivery (same `webhook-id`) again: `"status": "duplicate"`, and the payment's
//! totals stay put.

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
    let secret = std::env::var("WEBHOOK_SECRET").map_err(|_| {
        "WEBHOOK_SECRET is not set: export the sender's Standard Webhooks secret (whsec_...)"
    })?;
    let mut config = Config::new(&secret).map_err(|err| format!("WEBHOOK_SECRET: {err}"))?;
    if let Ok(stripe) = std::env::var("STRIPE_WEBHOOK_SECRET") {
        config = config
            .with_stripe_secret(stripe)
            .map_err(|err| format!("STRIPE_WEBHOOK_SECRET: {err}"))?;
    }
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
        .map_err(|err| format!("cannot open DATABASE_URL: {err}"))?;
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
