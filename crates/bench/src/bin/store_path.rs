//! The SQL stores' write path alone, no HTTP: concurrent workers each claim a fresh key and save
//! its answer, over and over, with group commit at several batch sizes (`--max-batch 1` is one
//! statement per operation). Prints claim+save pairs per second and the mean batch size.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p tower-idempotency-bench --bin store_path -- --workers 32
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use sqlx::{postgres::PgPoolOptions, sqlite::SqlitePoolOptions};
use tower_idempotency::{
    store::{
        postgres::PostgresStore, sqlite::SqliteStore, BatchStats, Batching, Claim, FencingToken,
        Store, StoredResponse,
    },
    Fingerprint, KeyHash,
};

/// Claim+save pairs per second of the SQL stores, by batch size.
#[derive(Debug, Parser)]
struct Args {
    /// Concurrent workers.
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// Seconds per configuration.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Largest batches to compare (1: one statement per operation).
    #[arg(long, value_delimiter = ',', default_value = "1,128")]
    max_batch: Vec<usize>,
    /// Batches in flight at once, per kind of operation.
    #[arg(long, default_value_t = 2)]
    pipeline: usize,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let url = std::env::var("DATABASE_URL").map_err(|_| {
        "DATABASE_URL is not set: export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
    })?;
    let sqlite_file = std::env::temp_dir().join(format!("store-path-{}.db", std::process::id()));
    println!("| store | largest batch | pipeline | pairs/s | mean batch |");
    println!("|---|---:|---:|---:|---:|");
    for &max_batch in &args.max_batch {
        // One statement per operation gets as many in flight as there are workers, as before
        // group commit; batches get the configured pipeline.
        let pipeline = if max_batch == 1 {
            args.workers
        } else {
            args.pipeline
        };
        let batching = Batching::default().max_batch(max_batch).pipeline(pipeline);
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(args.workers + 8)?)
            .connect(&url)
            .await?;
        let store = PostgresStore::with_batching(pool, batching);
        store.migrate().await?;
        let (pairs, stats) = run(&store, &args, || store.batch_stats()).await?;
        println!(
            "| postgres | {max_batch} | {pipeline} | {pairs:.0} | {:.1} |",
            stats.mean_batch()
        );
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&sqlite_file)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await?;
        let store = SqliteStore::with_batching(pool, batching);
        store.migrate().await?;
        let (pairs, stats) = run(&store, &args, || store.batch_stats()).await?;
        println!(
            "| sqlite | {max_batch} | 1 | {pairs:.0} | {:.1} |",
            stats.mean_batch()
        );
    }
    let _ = std::fs::remove_file(&sqlite_file);
    Ok(())
}

/// Pairs per second over `args.seconds`, and the batches run meanwhile.
async fn run<S: Store + Clone>(
    store: &S,
    args: &Args,
    stats: impl Fn() -> BatchStats,
) -> Result<(f64, BatchStats), BoxError> {
    let before = stats();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let workers: Vec<_> = (0..args.workers)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut pairs = 0u64;
                while Instant::now() < deadline {
                    let mut key = [0u8; 32];
                    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
                    let claim = Claim::new(
                        KeyHash(key),
                        Fingerprint([1; 32]),
                        FencingToken::new(),
                        Duration::from_secs(30),
                        Duration::from_secs(600),
                    );
                    store.claim(&claim).await?;
                    let answer = StoredResponse::new(
                        http::StatusCode::CREATED,
                        http::HeaderMap::new(),
                        "{}",
                    );
                    store.complete(&claim.hold(), &answer).await?;
                    pairs += 1;
                }
                Ok::<_, tower_idempotency::store::StoreError>(pairs)
            })
        })
        .collect();
    let mut pairs = 0;
    for worker in workers {
        pairs += worker.await??;
    }
    Ok((
        pairs as f64 / started.elapsed().as_secs_f64(),
        stats() - before,
    ))
}
