//! The lossy-network proof: the same orders sent through a network that loses answers, by a
//! client that retries with a new key per attempt and by one that keeps one key per intent.
//!
//! Run with: `cargo run --release -p lossy` (see `--help`; the test in `tests/` runs the same
//! code).
//!
//! The orders API (`orders_api::app`, transactional mode) runs in-process on 127.0.0.1 over a
//! SQLite file in a temporary directory. Between it and the clients sits a [`FaultProxy`] that
//! [loses answers](FaultProxy::lose_answers): for a share of requests it lets the server do the
//! work and then closes the connection instead of answering. The client sees the invisible
//! failure: the same error as a network that lost the answer. Each client places the same number of orders, each order (intent) with
//! its own `customerId`, so the orders in the database minus the intents are the duplicates.
//!
//! A seed gives the same figures on every run, whatever the concurrency: the proxy draws once per
//! answered request, and every intent sends until one answer is kept, so a client sends exactly
//! as many requests as it takes the seeded stream to keep `orders` answers. Both clients face the
//! same stream (each has its own proxy with the same seed), hence the same lost answers; only
//! what a lost answer costs differs. The expected value and spread are in [`stats`].

pub mod clients;
pub mod report;
pub mod stats;

use std::{net::SocketAddr, time::Duration};

use fault_proxy::FaultProxy;
use futures_util::{stream, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orders_api::Db;

use clients::{IdempotentClient, NaiveClient, PlaceOrder};
pub use report::{ClientReport, Report};

/// Orders per client when not given.
pub const DEFAULT_ORDERS: u64 = 2_000;
/// The share of answers lost when not given.
pub const DEFAULT_LOSS_RATE: f64 = 0.1;
/// The seed of the proxy's generator when not given.
pub const DEFAULT_SEED: u64 = 7;
/// Orders in flight at once per client when not given.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// How long each client's part of a run may take at most; it fails after that.
pub const MAX_RUN_TIME: Duration = Duration::from_secs(600);

/// One run's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Orders (intents) each client places.
    pub orders: u64,
    /// The share of answers the proxy drops after the server did the work.
    pub loss_rate: f64,
    /// The seed of the proxy's generator.
    pub seed: u64,
    /// Orders in flight at once.
    pub concurrency: usize,
    /// Show progress bars (on a terminal).
    pub progress: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            orders: DEFAULT_ORDERS,
            loss_rate: DEFAULT_LOSS_RATE,
            seed: DEFAULT_SEED,
            concurrency: DEFAULT_CONCURRENCY,
            progress: false,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Start the orders API, then drive both clients through their own lossy proxy (same seed).
pub async fn run(settings: Settings) -> Result<Report, BoxError> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("orders.db").display());
    let db = Db::connect(Some(&url)).await?;
    db.migrate().await?;
    let app = orders_api::app(db.clone(), orders_api::Config::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let naive = drive("naive", api, &settings, NaiveClient::new, &db).await;
    let idempotent = drive("idempotent", api, &settings, IdempotentClient::new, &db).await;
    server.abort();
    db.close().await;
    Ok(Report {
        settings,
        naive: naive?,
        idempotent: idempotent?,
    })
}

async fn drive<C: PlaceOrder>(
    name: &'static str,
    api: SocketAddr,
    settings: &Settings,
    make: impl FnOnce(&str) -> C,
    db: &Db,
) -> Result<ClientReport, BoxError> {
    let proxy = FaultProxy::start(api).await?;
    proxy.lose_answers(settings.loss_rate, settings.seed);
    let client = make(&format!("http://{}", proxy.addr()));
    let bar = progress_bar(name, settings);
    // Each intent sends at most MAX_ATTEMPTS requests; the time bound ends a run that hangs.
    let placed: Vec<_> = tokio::time::timeout(
        MAX_RUN_TIME,
        stream::iter(0..settings.orders)
            .map(|i| {
                let client = &client;
                let bar = &bar;
                async move {
                    let placed = client.place(&format!("{name}-{i}"), 1_000 + i as i64).await;
                    bar.inc(1);
                    placed
                }
            })
            .buffer_unordered(settings.concurrency.max(1))
            .collect(),
    )
    .await
    .map_err(|_| format!("the {name} client did not finish within {MAX_RUN_TIME:?}"))?;
    bar.finish_and_clear();
    let dropped = proxy.traffic().answers_lost;
    let (orders, customers) = count_orders(db, name).await?;
    Ok(ClientReport {
        intents: settings.orders,
        attempts: placed.iter().map(|p| u64::from(p.attempts)).sum(),
        failed: placed.iter().filter(|p| !p.created).count() as u64,
        dropped,
        orders,
        duplicates: orders - customers,
    })
}

fn progress_bar(name: &str, settings: &Settings) -> ProgressBar {
    let target = if settings.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(settings.orders), target);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>11} [{bar:40}] {pos}/{len} orders {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_owned());
    bar
}

/// The orders of one client (its `customerId`s start with `name-`) and the intents they belong to.
async fn count_orders(db: &Db, name: &str) -> Result<(u64, u64), BoxError> {
    const COUNT: &str =
        "SELECT COUNT(*), COUNT(DISTINCT customer_id) FROM orders WHERE customer_id LIKE $1";
    const COUNT_MYSQL: &str =
        "SELECT COUNT(*), COUNT(DISTINCT customer_id) FROM orders WHERE customer_id LIKE ?";
    let pattern = format!("{name}-%");
    let (orders, customers): (i64, i64) = match db {
        Db::Sqlite(pool) => sqlx::query_as(COUNT).bind(&pattern).fetch_one(pool).await?,
        Db::Postgres(pool) => sqlx::query_as(COUNT).bind(&pattern).fetch_one(pool).await?,
        Db::MySql(pool) => {
            sqlx::query_as(COUNT_MYSQL)
                .bind(&pattern)
                .fetch_one(pool)
                .await?
        }
    };
    Ok((orders.try_into()?, customers.try_into()?))
}
