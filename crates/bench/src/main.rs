//! Run with: `cargo run --release -p tower-idempotency-bench -- [--store all|memory,redis,postgres,sqlite,mysql] [--workers 1,8,32,128] [--seconds N] [--quick]`
//!
//! Throughput and latency of one handler served with and without the idempotency layer.
//!
//! Every server listens on its own port on 127.0.0.1, in this process; one keep-alive client
//! (reqwest, one pool) drives each of them with the same number of concurrent workers for the
//! same time, so client overhead is the same on both sides of every ratio. The scenarios of a store
//! run in alternating rounds ([`scenarios`]), so a change in the machine's load falls on all of
//! them alike. Scenarios:
//!
//! - `bare`: the handler without the layer (a unique `Idempotency-Key` is sent and ignored, so
//!   requests are the same size as the layered ones);
//! - `first-time keys`: a unique key per request: claim, handler, save;
//! - `replays`: N keys created beforehand, then requested over and over: the claim finds `done`;
//! - `hot key`: every worker sends the same key (a new one each round): one execution, then
//!   replays, and 409 while the execution runs.
//!
//! Stores ([`stores`]): `memory` and `redis` guard an in-memory handler (a push into a
//! `Mutex<Vec>`); the `redis` group also has a second bare row, the same handler plus one Redis
//! `SET`. `postgres` guards a handler that INSERTs a row through the same pool, in transactional,
//! standard and single-commit mode; `sqlite` does the same as transactional and standard on a
//! fresh SQLite file (WAL) in the temp dir; `mysql` as PostgreSQL does, on MySQL or MariaDB.
//! `DATABASE_URL`, `MYSQL_URL` and `REDIS_URL` are read from the environment; the PostgreSQL runs use their own database, `tower_idempotency_bench`, created if
//! missing. After the timed runs of a store on a server, its messages per request are counted
//! through a proxy ([`wire`]) at the same worker count.
//!
//! The report ([`report`]) has every row measured; per store and mode, the first-time, replay and
//! hot-key ratios to the bare handler at each worker count, with the mean batch size of a
//! batching store and the round trips per first-time request; p50 and p99 at one worker; and the
//! messages per request. `--chart FILE.svg` draws requests/s against workers ([`chart`]).
//!
//! Options (`--help`): `--store` (default `all`, env `BENCH_STORE`), `--workers` (default
//! `1,8,32,128`, env `BENCH_WORKERS`; alias `--concurrency`), `--seconds` per scenario and worker
//! count (default 5, env `BENCH_SECONDS`), `--rounds` (default 5), `--keys` for the replay
//! scenario (default 1000), `--quick` (1 s in 1 round with 200 keys: every store at four worker
//! counts in a few minutes), `--preload N` records written into the PostgreSQL table before the
//! runs (default 0), `--chart FILE.svg`.
//!
//! **Adding a store** (say Valkey) is a change to `stores.rs` only: a `StoreKind` variant, its
//! name, and a `start_*` function that serves its bare handler and the layer in each mode (with
//! its batch statistics, and its route through the counting proxy if it has a server). Every
//! table, the chart and `--store` pick it up.

use std::{error::Error, process::ExitCode, time::Duration};

use clap::Parser;

mod chart;
mod cli;
mod handlers;
mod load;
mod report;
mod scenarios;
mod stores;
mod wire;

type BoxError = Box<dyn Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    let settings = cli::Cli::parse().settings();
    let client = match reqwest::Client::builder()
        .pool_max_idle_per_host(settings.max_workers() * 2)
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
        settings.duration, settings.rounds, settings.workers, settings.keys
    );
    let mut bench = scenarios::Bench::new(settings.clone(), client);
    let mut failed = false;
    for &workers in &settings.workers {
        for &store in &settings.stores {
            eprintln!("{store:?}, {workers} workers:");
            if let Err(err) = bench.run(store, workers).await {
                eprintln!("error: {store:?} bench failed: {err}");
                failed = true;
            }
        }
    }
    print!("{}", report::render(&settings, &bench.rows, &bench.counted));
    if let Some(path) = &settings.chart {
        match std::fs::write(path, report::chart(&bench.rows)) {
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
