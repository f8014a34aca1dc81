//! Load and chaos (and, last, a database that refuses every connection): two `orders-api`
//! processes on one PostgreSQL database, each reaching it through
//! its own [`FaultProxy`], 16 concurrent clients sending 5,000 requests over 1,000 keys (every key
//! about five times, some attempts given up by their client after 40 ms, often mid-handler), while both proxies cut
//! every store connection every 1.5 s.
//!
//! Afterwards, with the faults off and a final pass that retries every key until it gets a final
//! answer: every key has exactly one order (its `customerId` names the key), every key answers
//! 201, and none stays held beyond its lease. The figures are printed.
//!
//! Needs `DATABASE_URL` (a PostgreSQL server the test may create databases on).

mod common;

use std::{
    collections::BTreeMap,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use fault_proxy::FaultProxy;
use tokio::process::Child;

const KEYS: usize = 1_000;
const REQUESTS: usize = 5_000;
const CLIENTS: usize = 16;
/// Every `GIVE_UP_EVERY`-th request is abandoned by its client after [`SHORT_TIMEOUT`].
const GIVE_UP_EVERY: usize = 10;
const SHORT_TIMEOUT: Duration = Duration::from_millis(40);
const TIMEOUT: Duration = Duration::from_secs(10);
/// How often the proxies cut every store connection.
const CUT_EVERY: Duration = Duration::from_millis(1_500);
/// The lease the servers run with: a key held by a dead attempt frees after this.
const LEASE_MS: u64 = 2_000;
/// The load phase stops issuing requests after this, whatever is left (it normally ends sooner).
const LOAD_DEADLINE: Duration = Duration::from_secs(90);

/// A fresh PostgreSQL database: its name, the server address, and a direct pool on it.
async fn fresh_postgres() -> (String, std::net::SocketAddr, sqlx::PgPool) {
    let db = common::fresh_postgres("tidem_orders_chaos").await;
    let server = tokio::net::lookup_host((db.options.get_host().to_owned(), db.options.get_port()))
        .await
        .expect("resolve the PostgreSQL host")
        .next()
        .expect("an address for the PostgreSQL host");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(db.options)
        .await
        .expect("connect to the test database");
    (db.name, server, pool)
}

/// `DATABASE_URL` with its host and port replaced by `addr` and its database by `database`.
fn url_through(addr: std::net::SocketAddr, database: &str) -> String {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL is set");
    let (scheme, rest) = url.split_once("://").expect("DATABASE_URL has a scheme");
    let (authority, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let userinfo = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    let query = tail
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{scheme}://{userinfo}{addr}/{database}{query}")
}

/// A running binary and its address.
struct Server {
    _child: Child,
    base: String,
}

/// Start the real binary on `database_url` and wait (up to 60 s) for its `listening on` line.
async fn start(database_url: &str) -> Server {
    let mut child = common::orders_api(database_url)
        .env("PAYMENT_LATENCY_MS", "2")
        .env("IDEMPOTENCY_LEASE_MS", LEASE_MS.to_string())
        .env("RUST_LOG", "error")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the orders-api binary");
    let base = common::listening_url(&mut child).await;
    Server {
        _child: child,
        base,
    }
}

/// The body of `key`: its customer names the key, so every order can be traced to one.
fn body(key: usize) -> String {
    format!(
        r#"{{"customerId":"chaos-{key}","totalCents":{}}}"#,
        1_000 + key
    )
}

fn key_name(key: usize) -> String {
    format!("chaos-key-{key}")
}

/// A small deterministic generator (xorshift64*), so a failing schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// What one request ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Created,
    Replayed,
    Status(u16),
    ClientTimeout,
    TransportError,
}

impl Outcome {
    fn label(self) -> String {
        match self {
            Outcome::Created => "201".into(),
            Outcome::Replayed => "201 replayed".into(),
            Outcome::Status(code) => code.to_string(),
            Outcome::ClientTimeout => "client timeout".into(),
            Outcome::TransportError => "transport error".into(),
        }
    }

    fn created(self) -> bool {
        matches!(self, Outcome::Created | Outcome::Replayed)
    }
}

async fn send(client: &reqwest::Client, base: &str, key: usize, timeout: Duration) -> Outcome {
    let sent = client
        .post(format!("{base}/orders"))
        .header("Idempotency-Key", key_name(key))
        .header("Content-Type", "application/json")
        .body(body(key))
        .timeout(timeout)
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(err) if err.is_timeout() => return Outcome::ClientTimeout,
        Err(_) => return Outcome::TransportError,
    };
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    match response.bytes().await {
        Err(err) if err.is_timeout() => Outcome::ClientTimeout,
        Err(_) => Outcome::TransportError,
        Ok(_) if status == 201 && replayed => Outcome::Replayed,
        Ok(_) if status == 201 => Outcome::Created,
        Ok(_) => Outcome::Status(status),
    }
}

fn histogram(outcomes: &[Outcome]) -> BTreeMap<Outcome, usize> {
    let mut counts = BTreeMap::new();
    for outcome in outcomes {
        *counts.entry(*outcome).or_default() += 1;
    }
    counts
}

fn show(counts: &BTreeMap<Outcome, usize>) -> String {
    counts
        .iter()
        .map(|(outcome, n)| format!("{}: {n}", outcome.label()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_under_load_with_cut_store_connections_run_each_key_once() {
    let (database, postgres, db) = fresh_postgres().await;
    let proxies = [
        Arc::new(FaultProxy::start(postgres).await.expect("start proxy 1")),
        Arc::new(FaultProxy::start(postgres).await.expect("start proxy 2")),
    ];
    // One after the other: the first runs the migrations.
    let first = start(&url_through(proxies[0].addr(), &database)).await;
    let second = start(&url_through(proxies[1].addr(), &database)).await;
    let bases = [first.base.clone(), second.base.clone()];

    // The schedule: every key five times, shuffled, each request to either instance.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut schedule: Vec<usize> = (0..REQUESTS).map(|i| i % KEYS).collect();
    for i in (1..schedule.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        schedule.swap(i, j);
    }
    let schedule: Arc<Vec<(usize, usize)>> = Arc::new(
        schedule
            .into_iter()
            .map(|key| (key, (rng.next() % 2) as usize))
            .collect(),
    );

    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .expect("client");
    let started = Instant::now();
    let load_done = Arc::new(AtomicBool::new(false));
    let chaos = {
        let proxies = proxies.clone();
        let load_done = load_done.clone();
        tokio::spawn(async move {
            let mut cuts = 0;
            while !load_done.load(Ordering::SeqCst) {
                tokio::time::sleep(CUT_EVERY).await;
                for proxy in &proxies {
                    proxy.cut_all();
                }
                cuts += 1;
            }
            cuts
        })
    };

    let next = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(vec![Vec::new(); KEYS]));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, schedule, results, client, bases) = (
                next.clone(),
                schedule.clone(),
                results.clone(),
                client.clone(),
                bases.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= schedule.len() || started.elapsed() > LOAD_DEADLINE {
                        return;
                    }
                    let (key, instance) = schedule[i];
                    let timeout = if i % GIVE_UP_EVERY == 0 {
                        SHORT_TIMEOUT
                    } else {
                        TIMEOUT
                    };
                    let outcome = send(&client, &bases[instance], key, timeout).await;
                    results.lock().unwrap()[key].push(outcome);
                }
            })
        })
        .collect();
    for task in clients {
        task.await.expect("a client task panicked");
    }
    let load_elapsed = started.elapsed();
    load_done.store(true, Ordering::SeqCst);
    let cuts = chaos.await.expect("the chaos task");
    let cut_connections: usize = proxies.iter().map(|p| p.cut_connections()).sum();

    let per_key = results.lock().unwrap().clone();
    let during: Vec<Outcome> = per_key.iter().flatten().copied().collect();
    let keys_created_during = per_key
        .iter()
        .filter(|outcomes| outcomes.iter().any(|o| o.created()))
        .count();

    // The final pass, faults off: every key until a final answer. A key still 409 after its lease
    // (plus the time to get round to it) is stuck.
    for proxy in &proxies {
        proxy.restore();
    }
    let final_started = Instant::now();
    let mut final_outcomes = Vec::with_capacity(KEYS);
    let mut stuck = Vec::new();
    for key in 0..KEYS {
        let mut tries = 0;
        let outcome = loop {
            let outcome = send(&client, &bases[key % 2], key, TIMEOUT).await;
            let retry = matches!(
                outcome,
                Outcome::Status(409 | 503) | Outcome::TransportError
            );
            if !retry || tries >= 20 {
                break outcome;
            }
            tries += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if !outcome.created() {
            stuck.push((key, outcome));
        }
        final_outcomes.push(outcome);
    }
    let final_elapsed = final_started.elapsed();

    let orders: Vec<(String, i64)> = sqlx::query_as(
        "SELECT customer_id, count(*) FROM orders GROUP BY customer_id ORDER BY customer_id",
    )
    .fetch_all(&db)
    .await
    .expect("count the orders");
    let total_orders: i64 = orders.iter().map(|(_, n)| n).sum();
    let duplicated: Vec<&(String, i64)> = orders.iter().filter(|(_, n)| *n > 1).collect();
    let strangers: Vec<&(String, i64)> = orders
        .iter()
        .filter(|(customer, _)| !customer.starts_with("chaos-"))
        .collect();
    let orders_of_created_keys = per_key
        .iter()
        .enumerate()
        .filter(|(_, outcomes)| outcomes.iter().any(|o| o.created()))
        .filter(|(key, _)| orders.iter().any(|(c, _)| *c == format!("chaos-{key}")))
        .count();

    println!("chaos: {} requests in {load_elapsed:.1?} by {CLIENTS} clients over {KEYS} keys, two instances; {cuts} cuts ({cut_connections} store connections cut)", during.len());
    println!(
        "chaos: statuses during the load: {}",
        show(&histogram(&during))
    );
    println!("chaos: keys with a 201 during the load: {keys_created_during}, all of them with an order: {}", orders_of_created_keys == keys_created_during);
    println!(
        "chaos: final pass over {KEYS} keys in {final_elapsed:.1?}: {}",
        show(&histogram(&final_outcomes))
    );
    println!("chaos: orders {total_orders}, keys with 201 {}, keys with more than one order {}, keys stuck {}", final_outcomes.iter().filter(|o| o.created()).count(), duplicated.len(), stuck.len());

    assert_eq!(
        during.len(),
        REQUESTS,
        "the load did not finish within {LOAD_DEADLINE:?}"
    );
    assert!(
        cuts >= 2,
        "the load ended before the proxies cut twice: {cuts} cuts"
    );
    assert!(cut_connections > 0, "no store connection was cut");
    assert!(duplicated.is_empty(), "keys executed twice: {duplicated:?}");
    assert!(
        strangers.is_empty(),
        "orders that belong to no key: {strangers:?}"
    );
    assert_eq!(
        orders_of_created_keys, keys_created_during,
        "a key got 201 without an order"
    );
    assert!(
        stuck.is_empty(),
        "keys without a final answer after their lease: {stuck:?}"
    );
    assert_eq!(
        total_orders as usize, KEYS,
        "orders must equal the keys that got a 201"
    );
}

/// The database unreachable (every connection refused): the binary answers 503 problem+json
/// with `Retry-After`, runs nothing and holds no key, and once the database is back the same
/// key creates its one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_a_503_with_retry_after_and_the_key_runs_later() {
    let (name, server, pool) = fresh_postgres().await;
    let proxy = FaultProxy::start(server).await.expect("start the proxy");
    let binary = start(&url_through(proxy.addr(), &name)).await;
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT * 2)
        .build()
        .expect("client");
    proxy.refuse();
    let refused = client
        .post(format!("{}/orders", binary.base))
        .header("idempotency-key", key_name(1))
        .header("content-type", "application/json")
        .body(body(1))
        .send()
        .await
        .expect("an answer while the database is down");
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert!(refused.headers().contains_key("retry-after"));
    proxy.restore();
    let orders = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM orders")
            .fetch_one(&pool)
            .await
            .expect("count the orders")
    };
    assert_eq!(orders().await, 0, "nothing ran while the database was down");
    let deadline = Instant::now() + TIMEOUT * 3;
    loop {
        let answer = send(&client, &binary.base, 1, TIMEOUT).await;
        if answer == Outcome::Created {
            break;
        }
        // Only the outage's own answers may come before it: a held key would answer 409.
        assert_eq!(answer, Outcome::Status(503), "after the outage");
        assert!(Instant::now() < deadline, "the key never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(orders().await, 1);
}
