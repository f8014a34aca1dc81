//! Run with: `cargo run -p tower-idempotency-admin -- --url postgres://... COMMAND`
//!
//! The operator's tool for a tower-idempotency store: PostgreSQL, SQLite (`sqlite://file.db`),
//! MySQL or MariaDB (`mysql://`), or Redis (`redis://`, with `--prefix` when the store uses
//! another key prefix). For a SQL store on another table than `idempotency_records`, pass
//! `--table`.
//!
//! ```text
//! migrate                        create or upgrade the table (SQL stores; Redis needs none)
//! check                          the schema is present and current (exit 1 with what to do)
//! inspect KEY [--scope S] [--body]
//! inspect --hash HEX [--body]    state, status, lease and expiry left; the body with --body
//! forget KEY [--scope S]
//! forget --hash HEX              delete the key's record whatever its state
//! sweep [--batch N]              delete expired records now (SQL stores)
//! stats                          records by state, the oldest running one
//! ```
//!
//! `--scope` is what the layer scoped the key by: with the default scope, the caller's
//! `Authorization` header value (`--scope "Bearer sk_live_..."`); none for anonymous callers.
//! Where that value is a credential, pass it as `IDEMPOTENCY_SCOPE` instead, out of the shell
//! history and the process list.
//! `--hash` names a record by its key hash instead, as `stats` and the layer's logs show it.
//! `inspect` and `forget` exit with 2 when there is no such record, and every command with 1 on
//! an error and with 64 on a command line that does not parse. `forget` of a record still
//! running (its lease not lapsed) warns on stderr: if its handler is still at work, a retry now
//! runs it again; `forget` of a record that cannot be read (written by another version, or
//! damaged) warns and deletes it.
//!
//! # Backends
//!
//! Each backend is a feature of this crate, all four on by default: `postgres`, `sqlite`,
//! `mysql`, `redis`. Build only what you run, for example without the MySQL driver:
//!
//! ```text
//! cargo install --path crates/admin --no-default-features --features postgres,redis
//! ```
//!
//! A URL whose backend was left out is refused with the feature to enable.
//!
//! The commands give the same answers as the library's `admin` router
//! (`tower_idempotency::admin`): both read through the store's own `get`, `forget`, `sweep` and
//! `stats`.

use std::{process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
#[cfg(feature = "mysql")]
use tower_idempotency::store::mysql::{sqlx::MySqlPool, MySqlStore};
#[cfg(feature = "postgres")]
use tower_idempotency::store::postgres::{sqlx::PgPool, PostgresStore};
#[cfg(feature = "redis")]
use tower_idempotency::store::redis::{redis, RedisStore};
#[cfg(feature = "sqlite")]
use tower_idempotency::store::sqlite::{
    sqlx::{sqlite::SqliteConnectOptions, SqlitePool},
    SqliteStore,
};
use tower_idempotency::{
    store::{DynStore, RecordInfo, RecordState, Store, StoreError, StoreStats},
    IdempotencyKey, KeyHash, Scope,
};

#[cfg(not(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
)))]
compile_error!("build at least one backend: --features postgres, sqlite, mysql or redis");

/// Operator tool for tower-idempotency stores.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The store: postgres://..., sqlite://FILE, mysql://... or redis://...
    // Its value may hold a password: `--help` must not print it.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    url: String,
    /// Redis only: the key prefix the store uses.
    #[arg(long, default_value = "idempotency")]
    prefix: String,
    /// SQL stores only: the table the store keeps its records in (`name` or `schema.name`, as
    /// the application's `with_table`).
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
    #[arg(long, default_value = "idempotency_records")]
    table: tower_idempotency::store::TableName,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the idempotency table (PostgreSQL, SQLite, MySQL).
    Migrate,
    /// Check that the schema is present and current.
    Check,
    /// Show one key's record.
    Inspect {
        #[command(flatten)]
        record: Record,
        /// Also print the saved body.
        #[arg(long)]
        body: bool,
    },
    /// Delete one key's record whatever its state: its next request runs as new.
    Forget {
        #[command(flatten)]
        record: Record,
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

/// Which record: a key and its scope, or a key hash.
#[derive(Debug, Args)]
struct Record {
    /// The Idempotency-Key, as the client sent it.
    #[arg(required_unless_present = "hash")]
    key: Option<String>,
    /// The scope: with the default scope, the caller's Authorization header value. Where it is
    /// a credential, set IDEMPOTENCY_SCOPE instead, out of the shell history and `ps`. Not used
    /// with --hash, which names the record whatever its scope.
    #[arg(
        long,
        env = "IDEMPOTENCY_SCOPE",
        default_value = "",
        hide_env_values = true
    )]
    scope: String,
    /// The record's key hash (64 hex digits), as `stats` and the layer's logs show it.
    #[arg(long, conflicts_with = "key")]
    hash: Option<String>,
}

impl Record {
    /// The record's identity, as the layer computes it: `sha256(scope || 0x00 || key)`, the scope itself the
    /// SHA-256 of the caller's identity (`IdempotencyKey::scoped_hash`).
    fn key_hash(&self) -> Result<KeyHash, String> {
        if let Some(hash) = &self.hash {
            return KeyHash::from_hex(hash)
                .ok_or_else(|| "--hash is 64 hex digits, as `stats` shows it".to_owned());
        }
        let key = self.key.as_deref().unwrap_or_default();
        let key = IdempotencyKey::parse(key.as_bytes())
            .map_err(|e| format!("not a valid Idempotency-Key: {e}"))?;
        Ok(key.scoped_hash(&Scope::new(self.scope.as_str())))
    }
}

/// The store behind `--url`: the concrete one for `migrate` and `check`.
#[derive(Clone)]
enum Backend {
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    #[cfg(feature = "mysql")]
    MySql(MySqlStore),
    #[cfg(feature = "redis")]
    Redis(RedisStore),
}

impl Backend {
    /// The same store behind `DynStore`, for the verbs every store has.
    fn store(&self) -> DynStore {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(store) => DynStore::new(store.clone()),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(store) => DynStore::new(store.clone()),
            #[cfg(feature = "mysql")]
            Backend::MySql(store) => DynStore::new(store.clone()),
            #[cfg(feature = "redis")]
            Backend::Redis(store) => DynStore::new(store.clone()),
        }
    }

    async fn migrate(&self) -> Result<&'static str, StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(store) => store.migrate().await.map(|()| "migrated"),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(store) => store.migrate().await.map(|()| "migrated"),
            #[cfg(feature = "mysql")]
            Backend::MySql(store) => store.migrate().await.map(|()| "migrated"),
            #[cfg(feature = "redis")]
            Backend::Redis(_) => Ok("Redis needs no migration"),
        }
    }

    async fn check(&self) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(store) => store.check_schema().await,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(store) => store.check_schema().await,
            #[cfg(feature = "mysql")]
            Backend::MySql(store) => store.check_schema().await,
            // No schema: reaching the server and running a read script is the check.
            #[cfg(feature = "redis")]
            Backend::Redis(store) => Store::get(store, &KeyHash([0; 32])).await.map(drop),
        }
    }
}

/// The exit status of a command line that does not parse (sysexits' `EX_USAGE`).
const USAGE: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Exit 2 means "no such record" here, so a command line that does not parse exits
        // with 64 (EX_USAGE) instead of clap's 2; --help and --version still exit 0.
        Err(err) => {
            let usage = err.use_stderr();
            let _ = err.print();
            return if usage {
                ExitCode::from(USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The URL schemes, the feature of this crate that reads each, and whether it is built in.
const SCHEMES: &[(&[&str], &str, bool)] = &[
    (
        &["postgres:", "postgresql:"],
        "postgres",
        cfg!(feature = "postgres"),
    ),
    (&["sqlite:"], "sqlite", cfg!(feature = "sqlite")),
    (&["mysql:", "mariadb:"], "mysql", cfg!(feature = "mysql")),
    (&["redis:", "rediss:"], "redis", cfg!(feature = "redis")),
];

async fn connect(cli: &Cli) -> Result<Backend, String> {
    let url = cli.url.as_str();
    let Some((_, feature, built)) = SCHEMES
        .iter()
        .find(|(schemes, ..)| schemes.iter().any(|s| url.starts_with(s)))
    else {
        return Err(
            "--url must start with postgres://, sqlite://, mysql:// or redis://".to_owned(),
        );
    };
    if !built {
        return Err(format!(
            "this build has no {feature} backend: rebuild with `--features {feature}`"
        ));
    }
    match *feature {
        #[cfg(feature = "postgres")]
        "postgres" => {
            let pool = PgPool::connect(url)
                .await
                .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
            Ok(Backend::Postgres(
                PostgresStore::new(pool).with_table(cli.table.clone()),
            ))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let options: SqliteConnectOptions = url
                .parse()
                .map_err(|e| format!("invalid SQLite URL: {e}"))?;
            // `migrate` makes the database file when there is none (a first install); every
            // other verb reads one that exists.
            let creates = matches!(cli.command, Command::Migrate);
            let pool = SqlitePool::connect_with(options.create_if_missing(creates))
                .await
                .map_err(|e| {
                    let hint = if creates {
                        ""
                    } else {
                        " (`migrate` makes a new database file)"
                    };
                    format!("cannot open SQLite: {e}{hint}")
                })?;
            Ok(Backend::Sqlite(
                SqliteStore::new(pool).with_table(cli.table.clone()),
            ))
        }
        #[cfg(feature = "mysql")]
        "mysql" => {
            // sqlx reads `mysql://` only; MariaDB users often write `mariadb://`.
            let url = url.replacen("mariadb:", "mysql:", 1);
            let pool = MySqlPool::connect(&url)
                .await
                .map_err(|e| format!("cannot connect to MySQL: {e}"))?;
            Ok(Backend::MySql(
                MySqlStore::new(pool).with_table(cli.table.clone()),
            ))
        }
        #[cfg(feature = "redis")]
        "redis" => {
            let client = redis::Client::open(url).map_err(|e| format!("invalid Redis URL: {e}"))?;
            let store = RedisStore::connect(client)
                .await
                .map_err(|e| format!("cannot connect to Redis: {}", chain(&e)))?
                .with_prefix(cli.prefix.clone());
            Ok(Backend::Redis(store))
        }
        _ => unreachable!("every built scheme has its arm"),
    }
}

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let backend = connect(&cli).await?;
    let store = backend.store();
    match &cli.command {
        Command::Migrate => {
            let done = backend.migrate().await.map_err(|e| chain(&e))?;
            println!("{done}");
        }
        Command::Check => {
            if let Err(err) = backend.check().await {
                eprintln!("not ready: {}", chain(&err));
                return Ok(ExitCode::FAILURE);
            }
            println!("schema present and current");
        }
        Command::Inspect { record, body } => {
            let hash = record.key_hash()?;
            match store.get(&hash).await.map_err(|e| chain(&e))? {
                None => {
                    println!("no record for this key (never used, expired, or another scope)");
                    return Ok(ExitCode::from(2));
                }
                Some(record) => print_record(&hash, &record, *body),
            }
        }
        Command::Forget { record } => {
            let hash = record.key_hash()?;
            // The read is for the warning only: a record it cannot decode is the one that most
            // needs forgetting.
            match store.get(&hash).await {
                Ok(before) => {
                    if let Some(lease) = before.and_then(|record| record.lease_remaining) {
                        if !lease.is_zero() {
                            eprintln!("warning: the record was running, {} left on its lease: if its handler is still at work, a retry now runs it again", human(lease));
                        }
                    }
                }
                Err(err) => eprintln!(
                    "warning: the record could not be read ({}): forgetting it anyway",
                    chain(&err)
                ),
            }
            if store.forget(&hash).await.map_err(|e| chain(&e))? {
                println!("forgotten: {hash}");
            } else {
                println!("no record for this key");
                return Ok(ExitCode::from(2));
            }
        }
        #[cfg(feature = "redis")]
        Command::Sweep { .. } if matches!(backend, Backend::Redis(_)) => {
            println!("swept 0 expired records: Redis deletes them itself");
        }
        Command::Sweep { batch } => {
            let batch = (*batch).max(1);
            let mut total = 0;
            loop {
                let deleted = store.sweep(batch).await.map_err(|e| chain(&e))?;
                total += deleted;
                if deleted < u64::from(batch) {
                    break;
                }
            }
            println!("swept {total} expired records");
        }
        Command::Stats => {
            let stats = store
                .stats()
                .await
                .map_err(|e| format!("reading the stats failed: {}", chain(&e)))?;
            print_stats(&stats);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_stats(stats: &StoreStats) {
    println!("running {}", stats.running);
    println!("done    {}", stats.done);
    println!("expired {} (not swept yet)", stats.expired);
    match &stats.oldest_running {
        Some(oldest) => println!(
            "oldest running: {}, claimed {} ago",
            oldest.key,
            human(oldest.age)
        ),
        None => println!("oldest running: none"),
    }
}

fn print_record(hash: &KeyHash, record: &RecordInfo, body: bool) {
    println!("key hash   {hash}");
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
    if let Some(age) = record.age {
        println!("claimed    {} ago", human(age));
    }
    println!("expires in {}", human(record.expires_in));
    if let Some(response) = &record.response {
        println!("status     {}", response.status.as_u16());
        for (name, value) in &response.headers {
            println!("header     {name}: {}", printable(value.as_bytes()));
        }
        println!("body       {} bytes", response.body.len());
        if body {
            println!();
            println!("{}", printable(&response.body));
        }
    }
}

/// Saved bytes as text for the operator's terminal: a saved answer can echo what a client sent,
/// so control characters (an escape sequence would drive the terminal) are written escaped, as
/// `\u{1b}`; line breaks and tabs stay.
fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
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

#[cfg(test)]
mod tests {
    #[test]
    fn saved_bytes_print_without_driving_the_terminal() {
        let saved = b"a\x1b[2Jb\n\tc\xc2\x9b\x07";
        assert_eq!(super::printable(saved), "a\\u{1b}[2Jb\n\tc\\u{9b}\\u{7}");
    }
}
