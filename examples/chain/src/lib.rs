//! The three defences wired together, for real, with faults on every hop.
//!
//! ```text
//! client ──► fault proxy ──► orders API ──► PostgreSQL ◄── relay ──► RabbitMQ ──► consumer ──► PostgreSQL
//! (one key    (loses a share   (transactional   order + outbox   (SKIP LOCKED,  (confirms)   (claim in its     (effect +
//!  per intent, of the answers)  mode, OUTBOX)    row + saved      publish, mark               own transaction,  processed mark)
//!  retries)                                      answer: 1 commit) after confirm)             ack after commit)
//! ```
//!
//! Run with: `cargo run -p order-chain` (`DATABASE_URL` and `AMQP_URL` as for the tests); the
//! test in `tests/` runs the same [`run`].
//!
//! - The **client** ([`tower_idempotency_client::IdempotentRetry`] over hyper) places each order
//!   (intent) with one `Idempotency-Key` and retries it through a [`FaultProxy`] that
//!   [loses answers](FaultProxy::lose_answers): the API did the work, the client sees a cut
//!   connection.
//! - The **orders API** (`orders_api::app`, in this process, on a fresh PostgreSQL database) runs
//!   with [`outbox`](orders_api::Config::outbox): the order row, its `order.created` event in
//!   `outbox` and the saved `201` commit together, so a retry is a replay and makes no second
//!   event.
//! - The **relay** ([`relay`], the `chain-relay` binary, a child process) publishes the outbox
//!   with publisher confirms and marks the rows after the confirm. It is SIGKILLed
//!   [`Settings::relay_kills`] times, each time between a confirm and its mark, so the batch is
//!   published again by the next run.
//! - The **consumer** (`broker_consumers_example::rabbitmq`, the `chain-consumer` binary, a child
//!   process, on a second database) claims each event in the transaction of its effect and acks
//!   after the commit. It is SIGKILLed [`Settings::consumer_kills`] times mid-stream, with
//!   deliveries in hand.
//!
//! At the end: orders = intents, effects = orders, no effect twice, none lost. [`Report`] holds the
//! figures, and the faults that really happened.

pub mod relay;

use std::{
    collections::{HashMap, HashSet},
    fmt,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use broker_consumers_example::{
    proof::{fresh_database, rabbitmq_ready, unique_name, Run, Tally},
    rabbitmq::open_queue,
};
use bytes::Bytes;
use fault_proxy::FaultProxy;
use futures_util::{stream, StreamExt};
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use lapin::options::QueueDeleteOptions;
use orders_api::{Config, Db, ServerConfig};
use sqlx::{Executor, PgPool};
use tower::ServiceExt;
use tower_idempotency_client::{Attempts, IdempotentRetry, RetryConfig};

/// Errors of a run that are not broken expectations (those panic, as in a test).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Orders (intents) placed unless told otherwise.
pub const DEFAULT_INTENTS: usize = 1_000;
/// The share of the API's answers the proxy loses unless told otherwise.
pub const DEFAULT_LOSS_RATE: f64 = 0.2;
/// The seed of the proxy's loss generator unless told otherwise.
pub const DEFAULT_SEED: u64 = 21;
/// Intents in flight at once.
pub const CONCURRENCY: usize = 8;
/// Times the relay is SIGKILLed between a confirm and its mark, unless told otherwise.
pub const DEFAULT_RELAY_KILLS: usize = 3;
/// Times the consumer is SIGKILLed mid-stream, unless told otherwise.
pub const DEFAULT_CONSUMER_KILLS: usize = 3;
/// The whole run must end within this.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Attempts per intent: with 20% of answers lost, ten losses in a row are a one in ten million
/// event.
pub const MAX_ATTEMPTS: u32 = 10;
/// Deliveries a consumer run settles before it is killed.
const SETTLED_BEFORE_KILL: usize = 100;
/// Messages the relay has published before the consumer first starts, so that the consumer
/// always has deliveries in hand when it is killed.
const BACKLOG: usize = 150;
/// The batch at which the first relay run stalls (and is killed): it starts before the first
/// order, and the load holds far more than two batches, so this batch always comes. The later
/// runs stall at their first batch, which always holds the rows the previous run stalled on (the
/// oldest unpublished), so no kill waits on orders that may no longer arrive.
const FIRST_STALL_AT_BATCH: u64 = 2;

/// One run's parameters.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Orders placed, each its own intent (its own key, its own `customerId`).
    pub intents: usize,
    /// The share of answers the proxy loses after the API did the work.
    pub loss_rate: f64,
    /// The seed of the proxy's loss generator.
    pub seed: u64,
    /// How many times the relay is SIGKILLed (between a confirm and its mark).
    pub relay_kills: usize,
    /// How many times the consumer is SIGKILLed mid-stream.
    pub consumer_kills: usize,
    /// The `chain-relay` binary.
    pub relay_binary: PathBuf,
    /// The `chain-consumer` binary.
    pub consumer_binary: PathBuf,
}

impl Settings {
    /// The defaults, with the two binaries.
    pub fn new(relay_binary: impl Into<PathBuf>, consumer_binary: impl Into<PathBuf>) -> Self {
        Self {
            intents: DEFAULT_INTENTS,
            loss_rate: DEFAULT_LOSS_RATE,
            seed: DEFAULT_SEED,
            relay_kills: DEFAULT_RELAY_KILLS,
            consumer_kills: DEFAULT_CONSUMER_KILLS,
            relay_binary: relay_binary.into(),
            consumer_binary: consumer_binary.into(),
        }
    }
}

/// What a run did and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Intents placed.
    pub intents: usize,
    /// Intents that ended with a `201` (fresh or replayed).
    pub created: usize,
    /// Of those, the ones whose last answer was a replay (`Idempotent-Replayed`).
    pub replayed: usize,
    /// Requests sent, every attempt counted.
    pub attempts: u64,
    /// Answers the proxy lost after the API did the work.
    pub answers_lost: u64,
    /// Rows in `orders`.
    pub orders: usize,
    /// Customers (intents) with more than one order: the duplicates the client and the layer
    /// prevent.
    pub duplicate_orders: usize,
    /// Rows in `outbox`.
    pub events: usize,
    /// Outbox rows never marked published.
    pub unpublished: usize,
    /// Relay runs SIGKILLed between a confirm and its mark.
    pub relay_kills: usize,
    /// Messages the broker confirmed, over every relay run.
    pub confirmed: usize,
    /// Messages confirmed but not marked when their relay was killed: published again.
    pub republished: usize,
    /// Consumer runs SIGKILLed mid-stream.
    pub consumer_kills: usize,
    /// What the consumer runs reported.
    pub consumer: Tally,
    /// Events with an effect.
    pub effects: usize,
    /// Events with more than one effect.
    pub applied_twice: usize,
    /// Orders without an effect.
    pub lost: usize,
    /// Effects of events that belong to no order.
    pub strangers: usize,
    /// Effects whose amount is not their order's total.
    pub wrong_amounts: usize,
    /// Events the consumer marked processed (`processed_events`).
    pub processed_marks: usize,
    /// Messages left in the queue after the last consumer stopped.
    pub left_in_queue: u32,
    /// How long the run took.
    pub elapsed: Duration,
    /// The two databases the run created (orders, then the consumer's): see [`drop_databases`].
    pub databases: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "client:   {} intents, {} attempts, {} answers lost by the proxy; {} intents got their 201 ({} of them as a replay)",
            self.intents, self.attempts, self.answers_lost, self.created, self.replayed
        )?;
        writeln!(
            f,
            "orders:   {} orders ({} intents with more than one), {} outbox events, {} unpublished",
            self.orders, self.duplicate_orders, self.events, self.unpublished
        )?;
        writeln!(
            f,
            "relay:    {} SIGKILLs between confirm and mark; {} messages confirmed, {} of them published again",
            self.relay_kills, self.confirmed, self.republished
        )?;
        writeln!(
            f,
            "consumer: {} SIGKILLs; {} deliveries settled: {} applied, {} duplicates absorbed, {} flagged redelivered, {} other",
            self.consumer_kills,
            self.consumer.settled,
            self.consumer.applied,
            self.consumer.duplicate,
            self.consumer.redelivered,
            self.consumer.other
        )?;
        write!(
            f,
            "end:      {} effects for {} orders ({} processed marks); applied twice {}, lost {}, strangers {}, wrong amounts {}, left in the queue {}; {:.1} s",
            self.effects,
            self.orders,
            self.processed_marks,
            self.applied_twice,
            self.lost,
            self.strangers,
            self.wrong_amounts,
            self.left_in_queue,
            self.elapsed.as_secs_f64()
        )
    }
}

/// What the relay runs printed, summed.
#[derive(Debug, Default)]
struct RelayTally {
    confirmed: usize,
    stalled: usize,
}

impl RelayTally {
    /// Count a relay line; whether it is the stall.
    fn count(&mut self, line: &str) -> bool {
        let rows = |prefix: &str| {
            line.strip_prefix(prefix)
                .and_then(|n| n.trim().parse::<usize>().ok())
        };
        if let Some(n) = rows("confirmed rows=") {
            self.confirmed += n;
        } else if let Some(n) = rows("stalled rows=") {
            self.stalled += n;
            return true;
        }
        false
    }
}

type HyperClient = Client<HttpConnector, Full<Bytes>>;

/// How one intent ended.
#[derive(Debug, Clone, Copy, Default)]
struct Placed {
    attempts: u32,
    created: bool,
    replayed: bool,
}

/// Place order `n` (customer `chain-{n}`) through `client`: one intent, one key, retried.
async fn place(client: &IdempotentRetry<HyperClient>, url: &Uri, n: usize) -> Placed {
    let body = format!(r#"{{"customerId":"chain-{n}","totalCents":{}}}"#, 100 + n);
    let request = Request::post(url.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request");
    match client.clone().oneshot(request).await {
        Ok(response) => {
            let attempts = response
                .extensions()
                .get::<Attempts>()
                .map_or(1, |a| a.count);
            let created = response.status() == http::StatusCode::CREATED;
            let replayed = response.headers().contains_key("idempotent-replayed");
            // Read to the end, so the connection goes back to the pool.
            let _ = response.into_body().collect().await;
            Placed {
                attempts,
                created,
                replayed,
            }
        }
        Err(err) => Placed {
            attempts: err.attempts(),
            ..Placed::default()
        },
    }
}

async fn count(pool: &PgPool, sql: &'static str) -> usize {
    let n: i64 = sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    usize::try_from(n).expect("a count is not negative")
}

/// Run the chain with `settings`: `DATABASE_URL` (PostgreSQL, where two fresh `tidem_chain_*`
/// databases are created, named in [`Report::databases`]) and `AMQP_URL` (RabbitMQ, a fresh
/// queue, deleted at the end) from the environment.
///
/// # Panics
///
/// When an expectation of the proof breaks (a process exits on its own, the deadline passes, a
/// service cannot be reached): the message says which.
pub async fn run(settings: &Settings) -> Result<Report, BoxError> {
    let started = Instant::now();
    let deadline = started + DEADLINE;
    let amqp_url =
        broker_consumers_example::proof::required_env("AMQP_URL", "amqp://127.0.0.1:5672/%2f");
    let (orders_pool, orders_url) = fresh_database("tidem_chain_orders", 16).await;
    let (ledger_pool, ledger_url) = fresh_database("tidem_chain_ledger", 4).await;
    let queue = unique_name("tidem_chain");

    // The broker: the queue, and a channel to look at it.
    let (connection, channel) = open_queue(&amqp_url, &queue).await?;

    // The orders API with its outbox, behind the lossy proxy.
    let db = Db::Postgres(orders_pool.clone());
    db.migrate().await?;
    broker_consumers_example::migrate(&ledger_pool)
        .await
        .map_err(|e| format!("the consumer's tables: {e}"))?;
    let config = Config {
        outbox: true,
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api_addr = listener.local_addr()?;
    let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
    let api = tokio::spawn(orders_api::serve(
        listener,
        orders_api::app(db, config),
        ServerConfig::default(),
        async {
            let _ = api_stopped.await;
        },
    ));
    let proxy = FaultProxy::start(api_addr).await?;
    proxy.lose_answers(settings.loss_rate, settings.seed);
    let url: Uri = format!("http://{}/orders", proxy.addr()).parse()?;
    let retry = RetryConfig::default()
        .with_max_attempts(MAX_ATTEMPTS)
        .with_backoff(Duration::from_millis(5), Duration::from_millis(200));
    let client = IdempotentRetry::new(Client::builder(TokioExecutor::new()).build_http(), retry)?;

    let relay_envs = [
        ("DATABASE_URL", orders_url.clone()),
        ("AMQP_URL", amqp_url.clone()),
        ("QUEUE", queue.clone()),
    ];
    let consumer_envs = [
        ("DATABASE_URL", ledger_url.clone()),
        ("AMQP_URL", amqp_url.clone()),
        ("QUEUE", queue.clone()),
        ("PREFETCH", "32".to_owned()),
    ];

    let load_done = AtomicBool::new(false);
    let relay_done = AtomicBool::new(false);
    let (published, mut backlog) = tokio::sync::watch::channel(0_usize);

    // The client: every intent, CONCURRENCY at a time.
    let load = async {
        let placed: Vec<Placed> = stream::iter(0..settings.intents)
            .map(|n| place(&client, &url, n))
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        load_done.store(true, Ordering::SeqCst);
        placed
    };

    // The relay: killed between a confirm and its mark, restarted, and at last stopped once
    // every order is in and every event is published.
    let relay = async {
        let mut tally = RelayTally::default();
        let on_line = |tally: &mut RelayTally, line: &str| {
            let stalled = tally.count(line);
            published.send_replace(tally.confirmed);
            stalled
        };
        let mut kills = 0;
        for run in 0..settings.relay_kills {
            let stall_at = if run == 0 { FIRST_STALL_AT_BATCH } else { 1 };
            let mut envs = relay_envs.to_vec();
            envs.push(("RELAY_STALL_AT_BATCH", stall_at.to_string()));
            Run::start(&settings.relay_binary, &envs)
                .kill_when(
                    deadline,
                    "the relay stalling between confirm and mark",
                    |line| on_line(&mut tally, line),
                )
                .await;
            kills += 1;
        }
        Run::start(&settings.relay_binary, &relay_envs)
            .stop_when(
                deadline,
                |line| {
                    on_line(&mut tally, line);
                },
                || async {
                    load_done.load(Ordering::SeqCst)
                        && count(
                            &orders_pool,
                            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
                        )
                        .await
                            == 0
                },
            )
            .await;
        relay_done.store(true, Ordering::SeqCst);
        (kills, tally)
    };

    // The consumer: started on a backlog, killed with deliveries in hand, restarted, and at
    // last stopped once every event has its effect and the queue is empty.
    let consumer = async {
        let mut tally = Tally::default();
        let wanted = BACKLOG.min(settings.intents);
        tokio::time::timeout_at(deadline.into(), backlog.wait_for(|n| *n >= wanted))
            .await
            .expect("the relay published the consumer's backlog before the deadline")
            .expect("the relay's count is kept");
        let mut kills = 0;
        for _ in 0..settings.consumer_kills {
            Run::start(&settings.consumer_binary, &consumer_envs)
                .kill_after(SETTLED_BEFORE_KILL, &mut tally, deadline)
                .await;
            kills += 1;
        }
        Run::start(&settings.consumer_binary, &consumer_envs)
            .finish_when(&mut tally, deadline, || async {
                relay_done.load(Ordering::SeqCst)
                    && count(&ledger_pool, "SELECT count(DISTINCT event_id) FROM effects").await
                        >= count(&orders_pool, "SELECT count(*) FROM orders").await
                    && rabbitmq_ready(&channel, &queue).await == 0
            })
            .await;
        (kills, tally)
    };

    let (placed, (relay_kills, relay_tally), (consumer_kills, consumer_tally)) =
        tokio::join!(load, relay, consumer);
    let _ = stop_api.send(());
    let _ = api.await;

    let order_rows: Vec<(String, i64)> = sqlx::query_as("SELECT order_id, total_cents FROM orders")
        .fetch_all(&orders_pool)
        .await?;
    let effect_rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT event_id, amount_cents FROM effects")
            .fetch_all(&ledger_pool)
            .await?;
    let totals: HashMap<&str, i64> = order_rows
        .iter()
        .map(|(id, cents)| (id.as_str(), *cents))
        .collect();
    let orders: HashSet<&str> = totals.keys().copied().collect();
    let mut effects = HashSet::new();
    let applied_twice = effect_rows
        .iter()
        .filter(|(id, _)| !effects.insert(id.as_str()))
        .map(|(id, _)| id.as_str())
        .collect::<HashSet<_>>()
        .len();
    let wrong_amounts = effect_rows
        .iter()
        .filter(|(id, cents)| totals.get(id.as_str()).is_some_and(|total| total != cents))
        .count();
    let report = Report {
        intents: settings.intents,
        created: placed.iter().filter(|p| p.created).count(),
        replayed: placed.iter().filter(|p| p.created && p.replayed).count(),
        attempts: placed.iter().map(|p| u64::from(p.attempts)).sum(),
        answers_lost: proxy.traffic().answers_lost,
        orders: order_rows.len(),
        duplicate_orders: count(
            &orders_pool,
            "SELECT count(*) FROM (SELECT customer_id FROM orders GROUP BY customer_id HAVING count(*) > 1) d",
        )
        .await,
        events: count(&orders_pool, "SELECT count(*) FROM outbox").await,
        unpublished: count(
            &orders_pool,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        )
        .await,
        relay_kills,
        confirmed: relay_tally.confirmed,
        republished: relay_tally.stalled,
        consumer_kills,
        consumer: consumer_tally,
        effects: effects.len(),
        applied_twice,
        lost: orders.difference(&effects).count(),
        strangers: effects.difference(&orders).count(),
        wrong_amounts,
        processed_marks: count(
            &ledger_pool,
            "SELECT count(*) FROM processed_events WHERE status = 'processed'",
        )
        .await,
        left_in_queue: rabbitmq_ready(&channel, &queue).await,
        elapsed: started.elapsed(),
        databases: [&orders_url, &ledger_url]
            .iter()
            .map(|url| database_name(url).to_owned())
            .collect(),
    };

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    connection.close(200, "done".into()).await?;
    orders_pool.close().await;
    ledger_pool.close().await;
    Ok(report)
}

/// The database a `postgres://` URL names.
fn database_name(url: &str) -> &str {
    let path = url.split('?').next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path)
}

/// Drop the databases of a finished run, from a connection to the server of `DATABASE_URL`.
///
/// [`run`] leaves them, for a look after the fact and because `DROP DATABASE` waits for a
/// checkpoint, which on a busy server takes long; `scripts/test.sh` drops every `tidem_*`
/// database on its next run.
pub async fn drop_databases(report: &Report) -> Result<(), BoxError> {
    use sqlx::Connection;
    let server = std::env::var("DATABASE_URL")?;
    let mut admin = sqlx::PgConnection::connect(&server).await?;
    for name in &report.databases {
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#
            )))
            .await?;
    }
    admin.close().await?;
    Ok(())
}
