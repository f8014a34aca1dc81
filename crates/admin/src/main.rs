//! Run with: `cargo run -p tower-idempotency-admin -- --url postgres://... COMMAND`
//!
//! The operator's tool for a tower-idempotency store: PostgreSQL, SQLite (`sqlite://file.db`)
//! or Redis (`redis://`, with `--prefix` when the store uses another key prefix).
//!
//! ```text
//! migrate                        create or upgrade the table (SQL stores; Redis needs none)
//! check                          the schema is present and current (exit 1 with what to do)
//! inspect KEY [--scope S] [--body]
//!                                state, status, lease and expiry left; the body with --body
//! forget KEY [--scope S]         delete the key's record whatever its state
//! sweep [--batch N]              delete expired records now (SQL stores)
//! stats                          records by state, the oldest running one
//! ```
//!
//! `--scope` is what the layer scoped the key by: with the default scope, the caller's
//! `Authorization` header value (`--scope "Bearer sk_live_..."`); none for anonymous callers.

use std::{process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use tower_idempotency::{
    store::{
        postgres::{sqlx::PgPool, PostgresStore},
        redis::{redis, RedisStore},
        sqlite::{sqlx::SqlitePool, SqliteStore},
        RecordState, Store, StoreError,
    },
    IdempotencyKey, KeyHash, Scope,
};

mod stats;

/// Operator tool for tower-idempotency stores.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The store: postgres://..., sqlite://FILE or redis://...
    #[arg(long, env = "DATABASE_URL")]
    url: String,
    /// Redis only: the key prefix the store uses.
    #[arg(long, default_value = "idempotency")]
    prefix: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the idempotency table (PostgreSQL, SQLite).
    Migrate,
    /// Check that the schema is present and current.
    Check,
    /// Show one key's record.
    Inspect {
        /// The Idempotency-Key, as the client sent it.
        key: String,
        /// The scope: with the default scope, the caller's Authorization header value.
        #[arg(long, default_value = "")]
        scope: String,
        /// Also print the saved body.
        #[arg(long)]
        body: bool,
    },
    /// Delete one key's record whatever its state: its next request runs as new.
    Forget {
        /// The Idempotency-Key, as the client sent it.
        key: String,
        /// The scope: with the default scope, the caller's Authorization header value.
        #[arg(long, default_value = "")]
        scope: String,
    },
    /// Delete expired records now.
    Sweep {
        /// Records deleted per statement.
        #[arg(long, default_value_t = 1000)]
        batch: u32,
    },
    /// Records by state, and the oldest running one.
    Stats,
}

/// The store behind `--url`.
enum Backend {
    Postgres(PostgresStore, PgPool),
    Sqlite(SqliteStore, SqlitePool),
    Redis(RedisStore, redis::Client),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn connect(cli: &Cli) -> Result<Backend, String> {
    let url = cli.url.as_str();
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let pool = PgPool::connect(url)
            .await
            .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
        Ok(Backend::Postgres(PostgresStore::new(pool.clone()), pool))
    } else if url.starts_with("sqlite:") {
        let pool = SqlitePool::connect(url)
            .await
            .map_err(|e| format!("cannot open SQLite: {e}"))?;
        Ok(Backend::Sqlite(SqliteStore::new(pool.clone()), pool))
    } else if url.starts_with("redis:") || url.starts_with("rediss:") {
        let client = redis::Client::open(url).map_err(|e| format!("invalid Redis URL: {e}"))?;
        let store = RedisStore::connect(client.clone())
            .await
            .map_err(|e| format!("cannot connect to Redis: {}", chain(&e)))?
            .with_prefix(cli.prefix.clone());
        Ok(Backend::Redis(store, client))
    } else {
        Err("--url must start with postgres://, sqlite:// or redis://".to_owned())
    }
}

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let backend = connect(&cli).await?;
    match &cli.command {
        Command::Migrate => {
            match &backend {
                Backend::Postgres(store, _) => store.migrate().await.map_err(|e| chain(&e))?,
                Backend::Sqlite(store, _) => store.migrate().await.map_err(|e| chain(&e))?,
                Backend::Redis(..) => println!("Redis needs no migration"),
            }
            println!("migrated");
        }
        Command::Check => {
            let checked = match &backend {
                Backend::Postgres(store, _) => store.check_schema().await,
                Backend::Sqlite(store, _) => store.check_schema().await,
                Backend::Redis(store, _) => Store::get(store, &KeyHash([0; 32])).await.map(drop),
            };
            if let Err(err) = checked {
                eprintln!("not ready: {}", chain(&err));
                return Ok(ExitCode::FAILURE);
            }
            println!("schema present and current");
        }
        Command::Inspect { key, scope, body } => {
            let hash = key_hash(key, scope)?;
            let record =
                with_store(&backend, |s| Box::pin(async move { s.record(&hash).await })).await;
            match record.map_err(|e| chain(&e))? {
                None => {
                    println!("no record for this key (never used, expired, or another scope)");
                    return Ok(ExitCode::from(2));
                }
                Some(record) => print_record(&hash, &record, *body),
            }
        }
        Command::Forget { key, scope } => {
            let hash = key_hash(key, scope)?;
            let forgot = with_store(&backend, |s| Box::pin(async move { s.delete(&hash).await }))
                .await
                .map_err(|e| chain(&e))?;
            if forgot {
                println!("forgotten: {}", hash.to_hex());
            } else {
                println!("no record for this key");
                return Ok(ExitCode::from(2));
            }
        }
        Command::Sweep { batch } => {
            let batch = (*batch).max(1);
            let mut total = 0;
            loop {
                let deleted = with_store(&backend, |s| {
                    Box::pin(async move { s.sweep_batch(batch).await })
                })
                .await
                .map_err(|e| chain(&e))?;
                total += deleted;
                if deleted < u64::from(batch) {
                    break;
                }
            }
            println!("swept {total} expired records");
        }
        Command::Stats => {
            let stats = match &backend {
                Backend::Postgres(_, pool) => stats::postgres(pool).await,
                Backend::Sqlite(_, pool) => stats::sqlite(pool).await,
                Backend::Redis(_, client) => stats::redis(client, &cli.prefix).await,
            }
            .map_err(|e| format!("reading the stats failed: {e}"))?;
            println!("running {}", stats.running);
            println!("done    {}", stats.done);
            println!("expired {} (not swept yet)", stats.expired);
            match stats.oldest_running {
                Some(age) => println!("oldest running: claimed {} ago", human(age)),
                None => println!("oldest running: none"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>;

/// Run one store operation on whichever store `--url` named.
async fn with_store<T>(
    backend: &Backend,
    op: impl for<'a> Fn(&'a dyn DynOps) -> BoxFuture<'a, Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match backend {
        Backend::Postgres(store, _) => op(store).await,
        Backend::Sqlite(store, _) => op(store).await,
        Backend::Redis(store, _) => op(store).await,
    }
}

/// The store operations the commands use, object-safe.
trait DynOps {
    fn record<'a>(
        &'a self,
        key: &'a KeyHash,
    ) -> BoxFuture<'a, Result<Option<tower_idempotency::store::RecordInfo>, StoreError>>;
    fn delete<'a>(&'a self, key: &'a KeyHash) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn sweep_batch(&self, batch: u32) -> BoxFuture<'_, Result<u64, StoreError>>;
}

impl<S: Store> DynOps for S {
    fn record<'a>(
        &'a self,
        key: &'a KeyHash,
    ) -> BoxFuture<'a, Result<Option<tower_idempotency::store::RecordInfo>, StoreError>> {
        Box::pin(Store::get(self, key))
    }
    fn delete<'a>(&'a self, key: &'a KeyHash) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::forget(self, key))
    }
    fn sweep_batch(&self, batch: u32) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(Store::sweep(self, batch))
    }
}

/// The record's identity, as the layer computes it: `sha256(scope || key)`.
fn key_hash(key: &str, scope: &str) -> Result<KeyHash, String> {
    let key = IdempotencyKey::parse(key.as_bytes())
        .map_err(|e| format!("not a valid Idempotency-Key: {e}"))?;
    Ok(key.scoped_hash(&Scope::new(scope)))
}

fn print_record(hash: &KeyHash, record: &tower_idempotency::store::RecordInfo, body: bool) {
    println!("key hash   {}", hash.to_hex());
    match record.state {
        RecordState::Running => println!("state      running"),
        RecordState::Done => println!("state      done"),
        _ => println!("state      other"),
    }
    if let Some(lease) = record.lease_remaining {
        if lease.is_zero() {
            println!("lease      lapsed: the next retry takes the key over");
        } else {
            println!("lease      {} left", human(lease));
        }
    }
    println!("expires in {}", human(record.expires_in));
    if let Some(response) = &record.response {
        println!("status     {}", response.status.as_u16());
        for (name, value) in &response.headers {
            println!(
                "header     {name}: {}",
                String::from_utf8_lossy(value.as_bytes())
            );
        }
        println!("body       {} bytes", response.body.len());
        if body {
            println!();
            println!("{}", String::from_utf8_lossy(&response.body));
        }
    }
}

fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{} ms", d.as_millis()),
        1..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
