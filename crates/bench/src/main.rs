//! Run with: cargo run --release -p tower-idempotency-bench -- [--store postgres|sqlite|memory|redis|all] [--seconds N] [--concurrency N]
//!
//! Throughput and latency of one handler served with and without the idempotency layer.
//!
//! Every server listens on its own port on 127.0.0.1, in this process; one keep-alive client
//! (reqwest, one pool) drives each of them with the same number of concurrent workers for the
//! same time, so client overhead is the same on both sides of every ratio. The scenarios of a store
//! run in alternating rounds (slices of `seconds / rounds`, the starting scenario rotating), so a
//! change in the machine's load falls on all of them alike. Scenarios:
//!
//! - `bare`: the handler without the layer (a unique `Idempotency-Key` is sent and ignored, so
//!   requests are the same size as the layered ones);
//! - `first-time keys`: a unique key per request: claim, handler, save;
//! - `replays`: N keys created beforehand, then requested over and over: the claim finds `done`;
//! - `hot key`: every worker sends the same key (a new one each round): one execution, then
//!   replays, and 409 while the execution runs.
//!
//! Stores: `memory` and `redis` guard an in-memory handler (a push into a `Mutex<Vec>`); the
//! `redis` group also has a second bare row, the same handler plus one Redis `SET` (the fair
//! bare for a layer that adds Redis round trips). `postgres` guards a handler that INSERTs a row
//! through the same pool, in transactional mode (the INSERT in the idempotency transaction),
//! standard mode (the INSERT on the pool, as in the bare handler) and single-commit mode (claim,
//! INSERT and saved answer in one transaction); after the timed runs it counts the round trips
//! and statements per request of each PostgreSQL scenario through a counting proxy (`wire.rs`).
//! `sqlite` does the same as transactional and standard on a fresh SQLite file (WAL) in the
//! temp dir, removed afterwards. `DATABASE_URL` and `REDIS_URL` are read from the environment;
//! the PostgreSQL runs use their own database, `tower_idempotency_bench`, created if missing.
//!
//! Options (the first three also as env: `BENCH_STORE`, `BENCH_SECONDS`, `BENCH_CONCURRENCY`):
//! `--store` (default `all`), `--seconds` per scenario (default 5), `--concurrency` (default 32),
//! `--keys` for the replay scenario (default 1000), `--rounds` (default 5), `--preload N`
//! records written into the PostgreSQL table before the runs (default 0).

use std::{
    error::Error,
    fmt::Write as _,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    serve::ListenerExt,
    Json, Router,
};
use hdrhistogram::Histogram;
use serde::Deserialize;
use sqlx::{
    postgres::PgPoolOptions,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Connection, Executor, PgPool, Postgres, Sqlite, SqlitePool,
};
use tower_idempotency::{
    store::{postgres::PostgresStore, redis::RedisStore, sqlite::SqliteStore, MemoryStore},
    Idempotency, IdempotencyTransaction,
};

mod chart;
mod wire;

type BoxError = Box<dyn Error + Send + Sync>;

/// Records a memory store may hold in the bench: more first-time keys than a run sends.
const MEMORY_CAPACITY: usize = 20_000_000;

/// Records are kept this long, so a bench run leaves nothing behind for a day in Redis.
const RECORD_TTL: Duration = Duration::from_secs(600);
/// The database the PostgreSQL runs use, on the `DATABASE_URL` server.
const BENCH_DATABASE: &str = "tower_idempotency_bench";
const BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Memory,
    Redis,
    Postgres,
    Sqlite,
}

#[derive(Debug, Clone)]
struct Args {
    stores: Vec<StoreKind>,
    duration: Duration,
    /// Concurrent workers; every store runs once per value.
    concurrency: Vec<usize>,
    keys: usize,
    rounds: u32,
    /// Records written into the PostgreSQL table before the runs (an index that is not
    /// cache-hot).
    preload: u64,
    /// Where to write the SVG chart of requests/s against workers.
    chart: Option<std::path::PathBuf>,
}

const USAGE: &str = "usage: tower-idempotency-bench [--store postgres|sqlite|memory|redis|all] [--seconds N] [--concurrency N[,N..]] [--keys N] [--rounds N] [--preload N] [--chart FILE.svg]";

impl Args {
    fn parse() -> Result<Self, String> {
        let mut store = std::env::var("BENCH_STORE").unwrap_or_else(|_| "all".into());
        let mut seconds = std::env::var("BENCH_SECONDS").unwrap_or_else(|_| "5".into());
        let mut concurrency = std::env::var("BENCH_CONCURRENCY").unwrap_or_else(|_| "32".into());
        let mut keys = "1000".to_owned();
        let mut rounds = "5".to_owned();
        let mut preload = "0".to_owned();
        let mut chart = String::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (arg.clone(), None),
            };
            let slot = match name.as_str() {
                "--store" => &mut store,
                "--seconds" => &mut seconds,
                "--concurrency" => &mut concurrency,
                "--keys" => &mut keys,
                "--rounds" => &mut rounds,
                "--preload" => &mut preload,
                "--chart" => &mut chart,
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
            };
            *slot = match inline {
                Some(v) => v,
                None => args
                    .next()
                    .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))?,
            };
        }
        let stores = match store.as_str() {
            "all" => vec![
                StoreKind::Memory,
                StoreKind::Redis,
                StoreKind::Postgres,
                StoreKind::Sqlite,
            ],
            "memory" => vec![StoreKind::Memory],
            "redis" => vec![StoreKind::Redis],
            "postgres" => vec![StoreKind::Postgres],
            "sqlite" => vec![StoreKind::Sqlite],
            other => return Err(format!("unknown store {other:?}\n{USAGE}")),
        };
        let seconds: f64 = seconds
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 600.0)
            .ok_or_else(|| format!("--seconds must be a number in (0, 600], got {seconds:?}"))?;
        let concurrency: Vec<usize> = concurrency
            .split(',')
            .map(|c| c.trim().parse().ok().filter(|c| (1..=1024).contains(c)))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                format!(
                    "--concurrency must be 1 to 1024 (or a list: 8,32,128), got {concurrency:?}"
                )
            })?;
        let keys: usize = keys
            .parse()
            .ok()
            .filter(|k| (1..=1_000_000).contains(k))
            .ok_or_else(|| format!("--keys must be 1 to 1000000, got {keys:?}"))?;
        let rounds: u32 = rounds
            .parse()
            .ok()
            .filter(|r| (1..=100).contains(r))
            .ok_or_else(|| format!("--rounds must be 1 to 100, got {rounds:?}"))?;
        let preload: u64 = preload
            .parse()
            .ok()
            .filter(|p| *p <= 10_000_000)
            .ok_or_else(|| format!("--preload must be 0 to 10000000, got {preload:?}"))?;
        Ok(Self {
            stores,
            duration: Duration::from_secs_f64(seconds),
            concurrency,
            keys,
            rounds,
            preload,
            chart: (!chart.is_empty()).then(|| chart.into()),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The handlers
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewOrder {
    customer_id: String,
    total_cents: i64,
}

fn parse(body: &[u8]) -> Result<NewOrder, StatusCode> {
    serde_json::from_slice(body).map_err(|_| StatusCode::BAD_REQUEST)
}

fn created(id: i64, order: &NewOrder) -> Response {
    let body = serde_json::json!({
        "orderId": id,
        "customerId": order.customer_id,
        "totalCents": order.total_cents,
        "status": "pending",
    });
    (StatusCode::CREATED, Json(body)).into_response()
}

type Orders = Arc<Mutex<Vec<NewOrder>>>;

/// The in-memory handler: parse, push, answer 201.
async fn memory_create(State(orders): State<Orders>, body: Bytes) -> Response {
    let order = match parse(&body) {
        Ok(o) => o,
        Err(status) => return status.into_response(),
    };
    let response = {
        let mut orders = orders.lock().unwrap_or_else(|p| p.into_inner());
        let id = i64::try_from(orders.len()).unwrap_or(i64::MAX) + 1;
        let response = created(id, &order);
        orders.push(order);
        response
    };
    response
}

/// The in-memory handler plus one Redis write (`SET` of the order under a new key, expiring
/// like the records): the fair bare for the Redis store, whose layer adds Redis round trips.
async fn redis_create(
    State((orders, redis, prefix)): State<(Orders, redis::aio::ConnectionManager, Arc<str>)>,
    body: Bytes,
) -> Response {
    let order = match parse(&body) {
        Ok(o) => o,
        Err(status) => return status.into_response(),
    };
    let id = {
        let mut orders = orders.lock().unwrap_or_else(|p| p.into_inner());
        orders.push(NewOrder {
            customer_id: order.customer_id.clone(),
            total_cents: order.total_cents,
        });
        i64::try_from(orders.len()).unwrap_or(i64::MAX)
    };
    let mut redis = redis;
    let written: Result<(), redis::RedisError> = redis::cmd("SET")
        .arg(format!("{prefix}:order:{id}"))
        .arg(&body[..])
        .arg("EX")
        .arg(RECORD_TTL.as_secs())
        .query_async(&mut redis)
        .await;
    match written {
        Ok(()) => created(id, &order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The database handlers: parse, INSERT, answer 201. `$on_pool` runs the INSERT on the pool
/// (the bare handler, and standard mode); `$in_tx` runs it in the idempotency transaction
/// (transactional mode). One definition per database, so both databases run the same handler.
macro_rules! insert_handlers {
    ($db:ty, $pool:ty, $insert:literal, $on_pool:ident, $in_tx:ident) => {
        async fn $on_pool(State(pool): State<$pool>, body: Bytes) -> Response {
            let order = match parse(&body) {
                Ok(o) => o,
                Err(status) => return status.into_response(),
            };
            let id = sqlx::query_scalar::<_, i64>($insert)
                .bind(&order.customer_id)
                .bind(order.total_cents)
                .fetch_one(&pool)
                .await;
            inserted(id, &order)
        }

        async fn $in_tx(tx: IdempotencyTransaction<$db>, body: Bytes) -> Response {
            let order = match parse(&body) {
                Ok(o) => o,
                Err(status) => return status.into_response(),
            };
            let mut tx = match tx.begin().await {
                Ok(tx) => tx,
                Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
            };
            let id = sqlx::query_scalar::<_, i64>($insert)
                .bind(&order.customer_id)
                .bind(order.total_cents)
                .fetch_one(&mut *tx)
                .await;
            inserted(id, &order)
        }
    };
}

/// 201 with the order, or 503 when the INSERT failed.
fn inserted(id: Result<i64, sqlx::Error>, order: &NewOrder) -> Response {
    match id {
        Ok(id) => created(id, order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

insert_handlers!(
    Postgres,
    PgPool,
    "INSERT INTO bench_orders (customer_id, total_cents) VALUES ($1, $2) RETURNING id",
    pg_create,
    pg_create_tx
);
insert_handlers!(
    Sqlite,
    SqlitePool,
    "INSERT INTO bench_orders (customer_id, total_cents) VALUES (?1, ?2) RETURNING id",
    sqlite_create,
    sqlite_create_tx
);

/// Serve `app` on 127.0.0.1 (a free port, `TCP_NODELAY`); the base URL.
async fn serve(app: Router) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("server on {addr} stopped: {err}");
        }
    });
    Ok(format!("http://{addr}/orders"))
}

// ---------------------------------------------------------------------------------------------
// The load
// ---------------------------------------------------------------------------------------------

/// Which `Idempotency-Key` each request carries.
#[derive(Clone)]
enum Keys {
    /// A new key for every request.
    Unique,
    /// Round-robin over keys that were used once beforehand.
    Existing(Arc<Vec<String>>),
    /// The same key for every request.
    Hot(Arc<str>),
}

impl Keys {
    fn key(&self, worker: usize, seq: u64, run: &str) -> String {
        match self {
            Keys::Unique => format!("{run}-{worker}-{seq}"),
            Keys::Existing(keys) => {
                let i = (worker as u64).wrapping_mul(7919).wrapping_add(seq) as usize;
                keys[i % keys.len()].clone()
            }
            Keys::Hot(key) => key.to_string(),
        }
    }
}

#[derive(Default)]
struct Tally {
    created: u64,
    replayed: u64,
    in_flight: u64,
    other: u64,
    errors: u64,
}

struct Measured {
    hist: Histogram<u64>,
    tally: Tally,
    elapsed: Duration,
}

impl Measured {
    fn empty() -> Self {
        Self {
            hist: histogram(),
            tally: Tally::default(),
            elapsed: Duration::ZERO,
        }
    }

    fn merge(&mut self, other: Measured) {
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.tally.created += other.tally.created;
        self.tally.replayed += other.tally.replayed;
        self.tally.in_flight += other.tally.in_flight;
        self.tally.other += other.tally.other;
        self.tally.errors += other.tally.errors;
        self.elapsed += other.elapsed;
    }

    fn requests(&self) -> u64 {
        self.hist.len()
    }

    fn per_second(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64()
    }

    fn mix(&self) -> String {
        let t = &self.tally;
        let mut s = String::new();
        for (n, label) in [
            (t.created, "201"),
            (t.replayed, "201 replayed"),
            (t.in_flight, "409"),
            (t.other, "other"),
            (t.errors, "transport errors"),
        ] {
            if n > 0 {
                if !s.is_empty() {
                    s.push_str(", ");
                }
                let _ = write!(s, "{n} {label}");
            }
        }
        s
    }
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 us to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// `concurrency` workers, each sending one request at a time to `url` until `duration` passed.
async fn drive(
    client: &reqwest::Client,
    url: &str,
    keys: &Keys,
    concurrency: usize,
    duration: Duration,
) -> Measured {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let start = Instant::now();
    let deadline = start + duration;
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let client = client.clone();
            let url = url.to_owned();
            let keys = keys.clone();
            let run = run.clone();
            tokio::spawn(async move {
                let mut hist = histogram();
                let mut tally = Tally::default();
                let mut seq = 0u64;
                while Instant::now() < deadline {
                    let key = keys.key(worker, seq, &run);
                    seq += 1;
                    let sent = Instant::now();
                    let result = client
                        .post(&url)
                        .header("Idempotency-Key", key)
                        .header("Content-Type", "application/json")
                        .body(BODY)
                        .send()
                        .await;
                    let response = match result {
                        Ok(r) => r,
                        Err(_) => {
                            tally.errors += 1;
                            continue;
                        }
                    };
                    let status = response.status();
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    if response.bytes().await.is_err() {
                        tally.errors += 1;
                        continue;
                    }
                    let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                    hist.saturating_record(micros.max(1));
                    match status.as_u16() {
                        201 if replayed => tally.replayed += 1,
                        201 => tally.created += 1,
                        409 => tally.in_flight += 1,
                        _ => tally.other += 1,
                    }
                }
                (hist, tally)
            })
        })
        .collect();
    let mut total = Measured::empty();
    for worker in workers {
        let (hist, tally) = worker.await.expect("worker task");
        total.merge(Measured {
            hist,
            tally,
            elapsed: Duration::ZERO,
        });
    }
    total.elapsed = start.elapsed();
    total
}

/// Send each of `n` new keys once (with `concurrency` in flight), for the replay scenario.
async fn create_keys(
    client: &reqwest::Client,
    url: &str,
    n: usize,
    concurrency: usize,
) -> Result<Arc<Vec<String>>, BoxError> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("{run}-r{i}")).collect());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrency.min(n))
        .map(|_| {
            let (client, url, keys, next) =
                (client.clone(), url.to_owned(), keys.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(key) = keys.get(i) else {
                        return Ok::<(), String>(());
                    };
                    let response = client
                        .post(&url)
                        .header("Idempotency-Key", key)
                        .header("Content-Type", "application/json")
                        .body(BODY)
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    if response.status() != StatusCode::CREATED {
                        return Err(format!("creating a key answered {}", response.status()));
                    }
                    response.bytes().await.map_err(|e| e.to_string())?;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok(keys)
}

// ---------------------------------------------------------------------------------------------
// Scenarios and the table
// ---------------------------------------------------------------------------------------------

/// One line of the table: a server, and how its requests pick their keys.
struct Scenario {
    store: &'static str,
    name: &'static str,
    url: String,
    keys: Plan,
}

/// How a scenario's requests pick their keys, round after round.
#[derive(Clone)]
enum Plan {
    /// A new key per request.
    Unique,
    /// Keys created before the first round, requested over and over.
    Existing(Arc<Vec<String>>),
    /// One key for every request, a new one each round (so each round starts with its execution).
    Hot,
}

impl Plan {
    fn keys(&self) -> Keys {
        match self {
            Plan::Unique => Keys::Unique,
            Plan::Existing(keys) => Keys::Existing(keys.clone()),
            Plan::Hot => Keys::Hot(Arc::from(uuid::Uuid::new_v4().to_string())),
        }
    }
}

struct Row {
    workers: usize,
    store: &'static str,
    scenario: &'static str,
    measured: Measured,
    bare_per_second: f64,
}

struct Bench {
    args: Args,
    /// The concurrency of the current pass.
    workers: usize,
    client: reqwest::Client,
    rows: Vec<Row>,
    /// Round trips and statements per request, per PostgreSQL scenario.
    counted: Vec<(String, f64, f64)>,
}

impl Bench {
    /// Run a group of scenarios (the first one the bare handler) in alternating rounds.
    ///
    /// Each scenario gets a warm-up, then `rounds` slices of `duration / rounds`, interleaved with
    /// the other scenarios' slices (the starting scenario rotates each round), so drift in the
    /// machine's load falls on every scenario alike. The ratio is against the group's bare run.
    async fn group(&mut self, scenarios: Vec<Scenario>) {
        let rounds = self.args.rounds;
        let slice = self.args.duration / rounds;
        let warmup = (self.args.duration / 5).min(Duration::from_secs(1));
        for s in &scenarios {
            drive(&self.client, &s.url, &s.keys.keys(), self.workers, warmup).await;
        }
        let mut totals: Vec<Measured> = scenarios.iter().map(|_| Measured::empty()).collect();
        for round in 0..rounds as usize {
            for i in 0..scenarios.len() {
                let i = (i + round) % scenarios.len();
                let s = &scenarios[i];
                let m = drive(&self.client, &s.url, &s.keys.keys(), self.workers, slice).await;
                totals[i].merge(m);
            }
        }
        let bare = totals[0].per_second();
        for (s, measured) in scenarios.iter().zip(totals) {
            eprintln!(
                "  {:<26} {:<16} {:>8.0} req/s  p50 {:>9}  p99 {:>9}  ({})",
                s.store,
                s.name,
                measured.per_second(),
                ms(measured.hist.value_at_quantile(0.5)),
                ms(measured.hist.value_at_quantile(0.99)),
                measured.mix()
            );
            self.rows.push(Row {
                workers: self.workers,
                store: s.store,
                scenario: s.name,
                measured,
                bare_per_second: bare,
            });
        }
    }

    /// The bare scenario and the three layered ones against `layered`.
    async fn scenarios(
        &self,
        store: &'static str,
        bare: Option<&str>,
        layered: &str,
    ) -> Result<Vec<Scenario>, BoxError> {
        let keys = create_keys(&self.client, layered, self.args.keys, self.workers).await?;
        let mut out = Vec::new();
        if let Some(bare) = bare {
            out.push(Scenario {
                store: store.split(' ').next().unwrap_or(store),
                name: "bare",
                url: bare.to_owned(),
                keys: Plan::Unique,
            });
        }
        for (name, keys) in [
            ("first-time keys", Plan::Unique),
            ("replays", Plan::Existing(keys)),
            ("hot key", Plan::Hot),
        ] {
            out.push(Scenario {
                store,
                name,
                url: layered.to_owned(),
                keys,
            });
        }
        Ok(out)
    }

    async fn memory(&mut self) -> Result<(), BoxError> {
        let app = || Router::new().route("/orders", post(memory_create));
        let orders = Orders::default();
        let bare = serve(app().with_state(orders.clone())).await?;
        // Room for every key of a run: past its capacity a memory store answers 503, which costs
        // less than a claim and would flatter the first-time ratio.
        let store = MemoryStore::with_capacity(MEMORY_CAPACITY);
        let layer = Idempotency::new(store).with_ttl(RECORD_TTL);
        let layered = serve(app().route_layer(layer).with_state(orders)).await?;
        let scenarios = self.scenarios("memory", Some(&bare), &layered).await?;
        self.group(scenarios).await;
        Ok(())
    }

    async fn redis(&mut self) -> Result<(), BoxError> {
        let url = std::env::var("REDIS_URL").map_err(|_| {
            "REDIS_URL is not set: export REDIS_URL=redis://127.0.0.1:6379 (or skip with --store)"
        })?;
        let client = redis::Client::open(url.as_str())?;
        let prefix = format!("bench-{}", uuid::Uuid::new_v4().simple());
        let manager = redis::aio::ConnectionManager::new(client.clone()).await?;
        let store = RedisStore::connect(client)
            .await?
            .with_prefix(prefix.clone());
        let app = || Router::new().route("/orders", post(memory_create));
        let orders = Orders::default();
        let bare = serve(app().with_state(orders.clone())).await?;
        let bare_write = serve(
            Router::new()
                .route("/orders", post(redis_create))
                .with_state((orders.clone(), manager, Arc::from(prefix.as_str()))),
        )
        .await?;
        let layer = Idempotency::new(store).with_ttl(RECORD_TTL);
        let layered = serve(app().route_layer(layer).with_state(orders)).await?;
        let mut scenarios = self.scenarios("redis", Some(&bare), &layered).await?;
        scenarios.insert(
            1,
            Scenario {
                store: "redis",
                name: "bare + 1 Redis write",
                url: bare_write,
                keys: Plan::Unique,
            },
        );
        self.group(scenarios).await;
        Ok(())
    }

    async fn postgres(&mut self) -> Result<(), BoxError> {
        let max_workers = self.args.concurrency.iter().copied().max().unwrap_or(32);
        let pool = bench_database(max_workers).await?;
        pool.execute("TRUNCATE bench_orders, idempotency_records")
            .await?;
        if self.args.preload > 0 {
            preload(&pool, self.args.preload).await?;
        }
        let PostgresServers {
            bare,
            transactional,
            standard,
            single_commit,
        } = postgres_servers(&pool).await?;
        let mut scenarios = self
            .scenarios("postgres (transactional)", Some(&bare), &transactional)
            .await?;
        scenarios.extend(
            self.scenarios("postgres (standard)", None, &standard)
                .await?,
        );
        scenarios.extend(
            self.scenarios("postgres (single commit)", None, &single_commit)
                .await?,
        );
        self.group(scenarios).await;
        if self.workers == self.args.concurrency[0] {
            self.count_postgres(&pool).await?;
        }
        pool.execute("TRUNCATE bench_orders, idempotency_records")
            .await?;
        pool.close().await;
        Ok(())
    }

    /// Round trips and statements per request of each PostgreSQL scenario, counted by a proxy
    /// between a pool of its own and the server ([`wire`]), outside the timed runs.
    async fn count_postgres(&mut self, pool: &PgPool) -> Result<(), BoxError> {
        use sqlx::postgres::PgSslMode;
        const REQUESTS: usize = 200;
        let opts = pool.connect_options().as_ref().clone();
        let upstream = tokio::net::lookup_host((opts.get_host(), opts.get_port()))
            .await?
            .next()
            .ok_or("cannot resolve the PostgreSQL host")?;
        let (proxy, counts) = wire::start(upstream).await?;
        let counted_pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(
                opts.host("127.0.0.1")
                    .port(proxy.port())
                    .ssl_mode(PgSslMode::Disable),
            )
            .await?;
        let servers = postgres_servers(&counted_pool).await?;
        let mut scenarios = vec![("postgres bare".to_owned(), servers.bare.clone(), false)];
        for (mode, url) in [
            ("transactional", &servers.transactional),
            ("standard", &servers.standard),
            ("single commit", &servers.single_commit),
        ] {
            scenarios.push((
                format!("postgres ({mode}) first-time keys"),
                url.clone(),
                false,
            ));
            scenarios.push((format!("postgres ({mode}) replays"), url.clone(), true));
        }
        for (name, url, replay) in scenarios {
            // Warm up: every connection prepares its statements.
            let keys = create_keys(&self.client, &url, 40, 4).await?;
            let before = counts.snapshot();
            for i in 0..REQUESTS {
                let key = if replay {
                    keys[i % keys.len()].clone()
                } else {
                    uuid::Uuid::new_v4().to_string()
                };
                let response = self
                    .client
                    .post(&url)
                    .header("Idempotency-Key", key)
                    .header("Content-Type", "application/json")
                    .body(BODY)
                    .send()
                    .await?;
                if response.status() != StatusCode::CREATED {
                    return Err(format!("{name}: answered {}", response.status()).into());
                }
                response.bytes().await?;
            }
            let used = counts.snapshot().since(&before);
            let per = |n: u64| n as f64 / REQUESTS as f64;
            eprintln!(
                "  {name:<44} {:.2} round trips, {:.2} statements per request",
                per(used.round_trips()),
                per(used.statements())
            );
            self.counted
                .push((name, per(used.round_trips()), per(used.statements())));
        }
        counted_pool.close().await;
        Ok(())
    }

    async fn sqlite(&mut self) -> Result<(), BoxError> {
        let (pool, path) = bench_sqlite_file().await?;
        let bare = serve(
            Router::new()
                .route("/orders", post(sqlite_create))
                .with_state(pool.clone()),
        )
        .await?;
        let transactional = serve(
            Router::new()
                .route("/orders", post(sqlite_create_tx))
                .route_layer(
                    Idempotency::sqlite(pool.clone())
                        .with_ttl(RECORD_TTL)
                        .transactional(),
                ),
        )
        .await?;
        let standard = serve(
            Router::new()
                .route("/orders", post(sqlite_create))
                .route_layer(Idempotency::sqlite(pool.clone()).with_ttl(RECORD_TTL))
                .with_state(pool.clone()),
        )
        .await?;
        let mut scenarios = self
            .scenarios("sqlite (transactional)", Some(&bare), &transactional)
            .await?;
        scenarios.extend(self.scenarios("sqlite (standard)", None, &standard).await?);
        self.group(scenarios).await;
        pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        Ok(())
    }

    /// Requests/s against workers: the bare rows and the first-time rows of every store and mode.
    fn chart(&self) -> String {
        let mut series: Vec<chart::Series> = Vec::new();
        for row in &self.rows {
            let bare = row.scenario.starts_with("bare");
            if !bare && row.scenario != "first-time keys" {
                continue;
            }
            let label = if bare {
                format!("{} {}", row.store, row.scenario)
            } else {
                format!("{} first-time", row.store)
            };
            let point = (row.workers, row.measured.per_second());
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.points.push(point),
                None => series.push(chart::Series {
                    label,
                    bare,
                    points: vec![point],
                }),
            }
        }
        for s in &mut series {
            s.points.sort_by_key(|p| p.0);
        }
        chart::svg(
            "requests/s against concurrent workers (dashed: without the layer)",
            &series,
        )
    }

    fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| workers | store | scenario | requests/s | p50 | p99 | vs bare (req/s) | answers |"
        );
        let _ = writeln!(out, "|---:|---|---|---:|---:|---:|---:|---|");
        for row in &self.rows {
            let m = &row.measured;
            let ratio = if row.bare_per_second > 0.0 {
                format!("{:.2}x", m.per_second() / row.bare_per_second)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {} | {} | {} | {} |",
                row.workers,
                row.store,
                row.scenario,
                m.per_second(),
                ms(m.hist.value_at_quantile(0.5)),
                ms(m.hist.value_at_quantile(0.99)),
                ratio,
                m.mix()
            );
        }
        out
    }
}

fn ms(micros: u64) -> String {
    format!("{:.2} ms", micros as f64 / 1000.0)
}

/// The PostgreSQL servers of one pool: bare, and with the layer in each mode.
struct PostgresServers {
    bare: String,
    transactional: String,
    standard: String,
    single_commit: String,
}

/// Write `n` done records (keys nobody requests) in batches, then analyse the table, so the
/// runs meet a large index that is not cache-hot.
async fn preload(pool: &PgPool, n: u64) -> Result<(), BoxError> {
    const BATCH: u64 = 100_000;
    eprintln!("  preloading {n} records");
    let mut done = 0;
    while done < n {
        let upto = (done + BATCH).min(n);
        sqlx::query(
            "INSERT INTO idempotency_records
                 (key, fingerprint, token, state, status, headers, body,
                  created_at, lease_until, expires_at)
             SELECT sha256(int8send(k) || 'preload'::bytea), sha256('fp'::bytea),
                    md5(k::text)::uuid, 'done', 201, ''::bytea, '{}'::bytea,
                    now(), now(), now() + interval '1 day'
             FROM generate_series($1::bigint, $2::bigint) AS k",
        )
        .bind(i64::try_from(done + 1)?)
        .bind(i64::try_from(upto)?)
        .execute(pool)
        .await?;
        done = upto;
    }
    pool.execute("VACUUM ANALYZE idempotency_records").await?;
    Ok(())
}

async fn postgres_servers(pool: &PgPool) -> Result<PostgresServers, BoxError> {
    let bare = serve(
        Router::new()
            .route("/orders", post(pg_create))
            .with_state(pool.clone()),
    )
    .await?;
    let transactional = serve(
        Router::new()
            .route("/orders", post(pg_create_tx))
            .route_layer(
                Idempotency::postgres(pool.clone())
                    .with_ttl(RECORD_TTL)
                    .transactional(),
            ),
    )
    .await?;
    let standard = serve(
        Router::new()
            .route("/orders", post(pg_create))
            .route_layer(Idempotency::postgres(pool.clone()).with_ttl(RECORD_TTL))
            .with_state(pool.clone()),
    )
    .await?;
    let single_commit = serve(
        Router::new()
            .route("/orders", post(pg_create_tx))
            .route_layer(
                Idempotency::postgres(pool.clone())
                    .with_ttl(RECORD_TTL)
                    .transactional_single_commit(),
            ),
    )
    .await?;
    Ok(PostgresServers {
        bare,
        transactional,
        standard,
        single_commit,
    })
}

/// A pool on a fresh SQLite file in the temp dir (WAL, `synchronous = NORMAL`, the usual
/// settings for a server on SQLite), migrated, with the `bench_orders` table; and its path.
async fn bench_sqlite_file() -> Result<(SqlitePool, std::path::PathBuf), BoxError> {
    let path = std::env::temp_dir().join(format!(
        "tower-idempotency-bench-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let opts = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(opts)
        .await?;
    SqliteStore::new(pool.clone()).migrate().await?;
    pool.execute(
        "CREATE TABLE IF NOT EXISTS bench_orders (
            id          INTEGER PRIMARY KEY,
            customer_id TEXT    NOT NULL,
            total_cents INTEGER NOT NULL
        )",
    )
    .await?;
    Ok((pool, path))
}

/// A pool on [`BENCH_DATABASE`] (created if missing), migrated, with the `bench_orders` table.
async fn bench_database(concurrency: usize) -> Result<PgPool, BoxError> {
    let url = std::env::var("DATABASE_URL").map_err(|_| {
        "DATABASE_URL is not set: export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test (or skip with --store)"
    })?;
    let opts: sqlx::postgres::PgConnectOptions = url.parse()?;
    let mut admin = sqlx::PgConnection::connect_with(&opts).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(BENCH_DATABASE)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                r#"CREATE DATABASE "{BENCH_DATABASE}""#
            )))
            .await?;
    }
    admin.close().await?;
    let max = u32::try_from(concurrency + 8).unwrap_or(u32::MAX).min(90);
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .min_connections(max.min(16))
        .connect_with(opts.database(BENCH_DATABASE))
        .await?;
    PostgresStore::new(pool.clone()).migrate().await?;
    pool.execute(
        "CREATE TABLE IF NOT EXISTS bench_orders (
            id          bigserial PRIMARY KEY,
            customer_id text      NOT NULL,
            total_cents bigint    NOT NULL
        )",
    )
    .await?;
    Ok(pool)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let client = match reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency.iter().copied().max().unwrap_or(32) * 2)
        .timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .build()
    {
        Ok(c) => c,
        Err(err) => {
            eprintln!("error: cannot build the HTTP client: {err}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "tower-idempotency bench: {:?} per scenario in {} rounds, {:?} concurrent workers, {} replay keys",
        args.duration, args.rounds, args.concurrency, args.keys
    );
    let mut bench = Bench {
        args: args.clone(),
        workers: args.concurrency[0],
        client,
        rows: Vec::new(),
        counted: Vec::new(),
    };
    let mut failed = false;
    for &workers in &args.concurrency {
        bench.workers = workers;
        for store in &args.stores {
            eprintln!("{store:?}, {workers} workers:");
            let result = match store {
                StoreKind::Memory => bench.memory().await,
                StoreKind::Redis => bench.redis().await,
                StoreKind::Postgres => bench.postgres().await,
                StoreKind::Sqlite => bench.sqlite().await,
            };
            if let Err(err) = result {
                eprintln!("error: {store:?} bench failed: {err}");
                failed = true;
            }
        }
    }
    println!(
        "{} s per scenario in {} alternating rounds, {:?} concurrent keep-alive workers, client and servers in one process on 127.0.0.1\n",
        args.duration.as_secs_f64(),
        args.rounds,
        args.concurrency
    );
    print!("{}", bench.table());
    if !bench.counted.is_empty() {
        println!(
            "\nPostgreSQL messages per request (counted by a proxy, outside the timed runs):\n"
        );
        println!("| scenario | round trips | statements |\n|---|---:|---:|");
        for (name, round_trips, statements) in &bench.counted {
            println!("| {name} | {round_trips:.2} | {statements:.2} |");
        }
    }
    if let Some(path) = &args.chart {
        match std::fs::write(path, bench.chart()) {
            Ok(()) => eprintln!("chart written to {}", path.display()),
            Err(err) => {
                eprintln!("error: cannot write the chart to {}: {err}", path.display());
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
