//! Run with: cargo run --release -p orders-api
//!
//! The reference orders API, `POST /orders` guarded by tower-idempotency in transactional mode.
//!
//! ```text
//! DATABASE_URL          postgres://..., mysql://... (MySQL 8, MariaDB) or sqlite://...
//!                       (default: SQLite file orders.db here)
//! BIND_ADDR             127.0.0.1:3000                   (port 0: any free port)
//! PAYMENT_LATENCY_MS    0       simulated payment provider latency, before the order is written
//! IDEMPOTENCY_LEASE_MS  30000   a crashed attempt's key frees after this
//! IDEMPOTENCY_TTL_SECS  86400   answers are replayed for this long
//! BODY_TIMEOUT_MS       10000   408 for a POST /orders body slower than this
//! MAX_IN_FLIGHT_ORDERS  64      POST /orders handled at once; more wait, bodies unread
//! OUTBOX                false   true: each order also writes its order.created event to the
//!                               outbox table, in the same transaction (PostgreSQL only)
//! HEADER_READ_TIMEOUT_MS 10000  a request head (or the next one on an idle connection) must
//!                               arrive within this, or the connection is closed
//! MAX_CONNECTIONS       1024    connections served at once; more wait in the backlog
//! SHUTDOWN_GRACE_MS     10000   after SIGTERM/SIGINT, running requests get this long
//! ADMIN_TOKEN           (unset) serve the idempotency operator routes at /admin/idempotency
//!                               to `Authorization: Bearer <ADMIN_TOKEN>` (16 characters or more)
//! RUST_LOG              info
//! LOG_FORMAT            text    `json`: one JSON object per line, with the span fields
//!                               (http.route, idempotency.key_hash, outcome, request_id)
//! ```
//!
//! Try it:
//!
//! ```text
//! curl -i localhost:3000/orders -H 'Idempotency-Key: 3f1c' -H 'Content-Type: application/json' \
//!      -d '{"customerId": "c_1", "totalCents": 4000}'
//! ```
//!
//! Send it twice: the second answer is the same 201, with `Idempotent-Replayed: true`.

use std::process::ExitCode;

use orders_api::{Db, Settings};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // As the other settings: surrounding blanks are ignored, and an empty value is unset.
    let format = std::env::var("LOG_FORMAT").map(|v| v.trim().to_ascii_lowercase());
    match format.as_deref() {
        Ok("json") => logs
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
        Ok("text" | "") | Err(std::env::VarError::NotPresent) => logs.init(),
        // As every other setting that does not parse: the server does not start.
        Ok(other) => {
            eprintln!("error: LOG_FORMAT={other:?} is not valid: expected text or json");
            return ExitCode::FAILURE;
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            eprintln!("error: LOG_FORMAT is not valid: expected text or json");
            return ExitCode::FAILURE;
        }
    }
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let settings = Settings::from_env().map_err(|e| e.to_string())?;
    let db = Db::connect(settings.database_url.as_deref())
        .await
        .map_err(|e| format!("cannot open the database (DATABASE_URL): {e}"))?;
    db.migrate()
        .await
        .map_err(|e| format!("database migrations failed: {e}"))?;

    let listener = tokio::net::TcpListener::bind(settings.bind_addr)
        .await
        .map_err(|e| format!("cannot listen on BIND_ADDR={}: {e}", settings.bind_addr))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let mut app = orders_api::app(db.clone(), settings.config);
    if let Some(token) = settings.admin_token.clone() {
        app = app.merge(orders_api::admin_routes(&db, token));
    }
    // After the app: building it installs the metrics recorder the sweeper's gauges go to.
    let sweeper = orders_api::sweeper(&db);
    tracing::info!(database = db.kind(), config = ?settings.config, "orders API ready");
    // Tests and scripts wait for this exact line on stdout.
    println!("listening on http://{addr}");

    match orders_api::serve(listener, app, settings.server, shutdown_signal()).await {
        orders_api::Shutdown::Clean => {
            tracing::info!("every request finished; closing the database");
            sweeper.stop().await;
            db.close().await;
        }
        orders_api::Shutdown::DeadlinePassed { requests } => {
            // What still runs is abandoned: an attempt that did not commit is rolled back by
            // the database, and its key frees when its lease lapses.
            tracing::warn!(
                requests,
                "the shutdown grace period passed with requests still running; exiting anyway"
            );
        }
    }
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
