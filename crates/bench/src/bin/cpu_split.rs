//! Where a first-time request's CPU goes: this process (HTTP client, server, layer) and the
//! PostgreSQL server, per request, bare handler against the layer in each mode. CPU per request
//! does not depend on what else the machine runs, so it explains the bench's ratios on a busy
//! machine too.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p tower-idempotency-bench --bin cpu_split -- --workers 32
//! ```

use std::time::{Duration, Instant};

use axum::{body::Bytes, extract::State, http::StatusCode, routing::post, Router};
use clap::Parser;
use sqlx::{postgres::PgPoolOptions, Executor, PgPool, Postgres};
use tower_idempotency::{store::postgres::PostgresStore, Idempotency, IdempotencyTransaction};

/// CPU per first-time request, this process and PostgreSQL apart, bare handler against the layer.
#[derive(Debug, Parser)]
struct Args {
    /// Concurrent workers, each sending one request at a time.
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// Seconds per handler and round.
    #[arg(long, default_value_t = 4)]
    seconds: u64,
    /// Run only this handler (bare, standard, transactional).
    #[arg(long)]
    only: Option<String>,
    /// Rounds; each runs every handler once, in the same order.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Batches in flight at once, per kind of operation.
    #[arg(long, default_value_t = 2)]
    pipeline: usize,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bench's handler: one INSERT, on the pool (bare and standard mode) or in the idempotency
/// transaction (transactional mode).
const INSERT: &str =
    "INSERT INTO bench_orders (customer_id, total_cents) VALUES ($1, $2) RETURNING id";

async fn on_pool(State(pool): State<PgPool>, _body: Bytes) -> StatusCode {
    match sqlx::query_scalar::<_, i64>(INSERT)
        .bind("c_1")
        .bind(4000i64)
        .fetch_one(&pool)
        .await
    {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn in_tx(tx: IdempotencyTransaction<Postgres>, _body: Bytes) -> StatusCode {
    let Ok(mut tx) = tx.begin().await else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    match sqlx::query_scalar::<_, i64>(INSERT)
        .bind("c_1")
        .bind(4000i64)
        .fetch_one(&mut *tx)
        .await
    {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// CPU seconds (user + system) of this process.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    ticks(&stat)
}

/// CPU seconds of every process named `postgres` (the server is on this machine: the bench
/// talks to 127.0.0.1 only). A backend that exits takes its time with it, so the pools here stay
/// open for the whole run.
fn postgres_cpu() -> f64 {
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if comm.trim() == "postgres" {
            total += ticks(&std::fs::read_to_string(path.join("stat")).unwrap_or_default());
        }
    }
    total
}

/// User + system time, in seconds, of a `/proc/PID/stat` line (fields 14 and 15, in ticks of
/// 1/100 s).
fn ticks(stat: &str) -> f64 {
    let after = stat.rsplit_once(')').map(|(_, s)| s).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let stime: f64 = fields.get(12).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    (utime + stime) / 100.0
}

async fn serve(app: Router) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/orders"))
}

async fn drive(client: &reqwest::Client, url: &str, workers: usize, time: Duration) -> u64 {
    let deadline = Instant::now() + time;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (client, url, run) = (client.clone(), url.to_owned(), run.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let ok = client
                        .post(&url)
                        .header("Idempotency-Key", format!("{run}-{w}-{n}"))
                        .body("{}")
                        .send()
                        .await
                        .map(|r| r.status() == StatusCode::CREATED)
                        .unwrap_or(false);
                    n += u64::from(ok);
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or(0);
    }
    total
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let url = std::env::var("DATABASE_URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(args.workers + 8)?)
        .connect(&url)
        .await?;
    PostgresStore::new(pool.clone()).migrate().await?;
    pool.execute(
        "CREATE TABLE IF NOT EXISTS bench_orders (id bigserial PRIMARY KEY, customer_id text NOT NULL, total_cents bigint NOT NULL)",
    )
    .await?;
    let store = PostgresStore::with_batching(
        pool.clone(),
        tower_idempotency::store::Batching::default().pipeline(args.pipeline),
    );
    let bare = serve(
        Router::new()
            .route("/orders", post(on_pool))
            .with_state(pool.clone()),
    )
    .await?;
    let standard = serve(
        Router::new()
            .route("/orders", post(on_pool))
            .with_state(pool.clone())
            .route_layer(Idempotency::new(store.clone())),
    )
    .await?;
    let transactional = serve(
        Router::new()
            .route("/orders", post(in_tx))
            .route_layer(Idempotency::new(store.clone()).transactional()),
    )
    .await?;
    let client = reqwest::Client::new();
    let time = Duration::from_secs(args.seconds);
    println!(
        "| handler | req/s | this process us/req | postgres us/req | total us/req | mean batch |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for round in 0..args.rounds {
        for (name, url) in [
            ("bare", &bare),
            ("standard", &standard),
            ("transactional", &transactional),
        ] {
            if args.only.as_deref().is_some_and(|only| only != name) {
                continue;
            }
            let _ = drive(&client, url, args.workers, Duration::from_millis(300)).await;
            let (own, pg, start) = (own_cpu(), postgres_cpu(), Instant::now());
            let batches = store.batch_stats();
            let n = drive(&client, url, args.workers, time).await.max(1);
            let elapsed = start.elapsed().as_secs_f64();
            let own = (own_cpu() - own) * 1e6 / n as f64;
            let pg = (postgres_cpu() - pg) * 1e6 / n as f64;
            let stats = store.batch_stats() - batches;
            println!(
                "| {name} (round {round}) | {:.0} | {own:.0} | {pg:.0} | {:.0} | {:.1} |",
                n as f64 / elapsed,
                own + pg,
                stats.mean_batch(),
            );
        }
    }
    Ok(())
}
