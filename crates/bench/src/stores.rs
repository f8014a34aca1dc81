//! The stores under test: how each one starts its servers (the bare handlers and the layer in
//! each of its modes) and cleans up after itself.
//!
//! Adding a store is a change to this file only: a [`StoreKind`] variant, its entry in
//! [`StoreKind::ALL`] and [`StoreKind::name`], and a `start_*` function returning [`Started`]
//! (its bare handler, one [`Layered`] per mode with the store's [`BatchSource`] if it batches,
//! and, if it talks to a server over TCP, the route through the counting proxy). The scenarios,
//! the tables and the chart pick it up from there.

use std::{path::PathBuf, sync::Arc, time::Duration};

use axum::{routing::post, Router};
use sqlx::{
    mysql::MySqlConnectOptions,
    postgres::{PgConnectOptions, PgSslMode},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Connection, Executor, MySqlPool, PgPool, SqlitePool,
};
use tower_idempotency::{
    store::{
        mysql::MySqlStore, postgres::PostgresStore, redis::RedisStore, sqlite::SqliteStore,
        MemoryStore,
    },
    Idempotency,
};

use crate::{handlers, wire, BoxError};

/// Records a memory store may hold in the bench: more first-time keys than a run sends.
const MEMORY_CAPACITY: usize = 20_000_000;
/// The database the PostgreSQL runs use, on the `DATABASE_URL` server.
const BENCH_DATABASE: &str = "tower_idempotency_bench";
/// Connections a PostgreSQL pool of the bench opens at most: the server's 100 are shared with
/// whatever else runs on the machine.
const MAX_PG_CONNECTIONS: usize = 64;

/// A store the bench can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// [`MemoryStore`], guarding the in-memory handler.
    Memory,
    /// [`RedisStore`] on `REDIS_URL`, guarding the in-memory handler.
    Redis,
    /// [`PostgresStore`] on `DATABASE_URL`, guarding an INSERT handler, in three modes.
    Postgres,
    /// [`SqliteStore`] on a fresh file, guarding an INSERT handler, in two modes.
    Sqlite,
    /// [`MySqlStore`] on `MYSQL_URL`, guarding an INSERT handler, in two modes.
    MySql,
}

impl StoreKind {
    /// Every store, in the order `--store all` runs them.
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Memory,
        StoreKind::Redis,
        StoreKind::Postgres,
        StoreKind::Sqlite,
        StoreKind::MySql,
    ];

    /// The name on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
            StoreKind::Sqlite => "sqlite",
            StoreKind::MySql => "mysql",
        }
    }

    /// Start the store's servers. With [`Route::Counted`], a store that talks to a server goes
    /// through a counting proxy ([`wire`]); one that does not answers `None`.
    pub async fn start(self, setup: &Setup) -> Result<Option<Started>, BoxError> {
        match (self, setup.route) {
            (StoreKind::Memory, Route::Direct) => start_memory().await.map(Some),
            (StoreKind::Redis, route) => start_redis(route).await.map(Some),
            (StoreKind::Postgres, route) => start_postgres(setup, route).await.map(Some),
            (StoreKind::Sqlite, Route::Direct) => start_sqlite().await.map(Some),
            (StoreKind::MySql, route) => start_mysql(setup, route).await.map(Some),
            (_, Route::Counted) => Ok(None),
        }
    }
}

/// How a store reaches its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Straight to the server: the timed runs.
    Direct,
    /// Through a proxy that counts round trips and statements, outside the timed runs.
    Counted,
}

/// What a store needs to know to start.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// The most workers that will drive it (sizes connection pools).
    pub workers: usize,
    /// Records written into the PostgreSQL table before the runs.
    pub preload: u64,
    /// Direct, or through the counting proxy.
    pub route: Route,
}

/// Cumulative batch statistics of a batching store: statements run for many requests at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batches {
    /// Batches run.
    pub batches: u64,
    /// Entries (claims, saves, ...) in them.
    pub entries: u64,
}

impl Batches {
    /// The statistics between `earlier` and `self`.
    pub fn since(self, earlier: Batches) -> Batches {
        Batches {
            batches: self.batches.saturating_sub(earlier.batches),
            entries: self.entries.saturating_sub(earlier.entries),
        }
    }

    /// Add `other`'s counts.
    pub fn add(&mut self, other: Batches) {
        self.batches += other.batches;
        self.entries += other.entries;
    }

    /// Entries per batch, if any batch ran.
    pub fn mean_size(self) -> Option<f64> {
        (self.batches > 0).then(|| self.entries as f64 / self.batches as f64)
    }
}

/// Reads a store's [`Batches`] at any time.
pub type BatchSource = Arc<dyn Fn() -> Batches + Send + Sync>;

/// The batch statistics of a PostgreSQL store.
fn postgres_batches(store: &PostgresStore) -> Option<BatchSource> {
    let store = store.clone();
    Some(Arc::new(move || batches(store.batch_stats())))
}

/// The batch statistics of a SQLite store.
fn sqlite_batches(store: &SqliteStore) -> Option<BatchSource> {
    let store = store.clone();
    Some(Arc::new(move || batches(store.batch_stats())))
}

fn batches(stats: tower_idempotency::store::BatchStats) -> Batches {
    Batches {
        batches: stats.batches,
        entries: stats.entries,
    }
}

/// One bare handler: the reference of a ratio.
#[derive(Debug, Clone)]
pub struct Bare {
    /// Its row name: `bare`, or what it adds (`bare + 1 Redis write`).
    pub name: &'static str,
    /// Its URL.
    pub url: String,
}

impl Bare {
    /// The handler alone, at `url`: the row named `bare`.
    fn handler_alone(url: String) -> Self {
        Self { name: "bare", url }
    }
}

/// The layer in one mode, and where its batch statistics are read.
#[derive(Clone)]
pub struct Layered {
    /// The store and mode, as the tables show it: `postgres (standard)`, `memory`.
    pub label: &'static str,
    /// Its URL.
    pub url: String,
    /// The store's batch statistics, if it batches.
    pub batches: Option<BatchSource>,
}

/// A started store: its servers, and what [`stop`](Started::stop) cleans up.
pub struct Started {
    /// The store's name (the bare rows' store column).
    pub store: &'static str,
    /// The bare handlers, the first one the reference of every ratio.
    pub bare: Vec<Bare>,
    /// The layer in each mode.
    pub layered: Vec<Layered>,
    /// The counting proxy's counts, when started through it.
    pub wire: Option<wire::Counter>,
    resources: Resources,
}

/// What a started store leaves behind.
enum Resources {
    None,
    /// The pool, and the stores whose batch connections are closed with it.
    Postgres(PgPool, Vec<PostgresStore>),
    /// Each file's pool and path.
    Sqlite(Vec<(SqlitePool, PathBuf)>),
    MySql(MySqlPool),
}

impl Started {
    /// Empty the tables or remove the file the store used, and close its pool.
    pub async fn stop(self) -> Result<(), BoxError> {
        match self.resources {
            Resources::None => {}
            Resources::Postgres(pool, stores) => {
                pool.execute("TRUNCATE bench_orders, idempotency_records")
                    .await?;
                // The stores outlive the group in its servers' tasks: without this, each worker
                // count would leave its batch connections open, and 128 workers would find
                // PostgreSQL's max_connections reached.
                for store in stores {
                    store.close().await;
                }
                pool.close().await;
            }
            Resources::MySql(pool) => {
                pool.execute("TRUNCATE bench_orders").await?;
                pool.execute("TRUNCATE idempotency_records").await?;
                pool.close().await;
            }
            Resources::Sqlite(files) => {
                for (pool, path) in files {
                    pool.close().await;
                    for suffix in ["", "-wal", "-shm"] {
                        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A layered server in `label`'s mode, with no batch statistics.
fn layered(label: &'static str, url: String) -> Layered {
    Layered {
        label,
        url,
        batches: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Each store
// ---------------------------------------------------------------------------------------------

async fn start_memory() -> Result<Started, BoxError> {
    let app = || Router::new().route("/orders", post(handlers::memory_create));
    let orders = handlers::Orders::default();
    let bare = handlers::serve(app().with_state(orders.clone())).await?;
    // Room for every key of a run: past its capacity a memory store answers 503, which costs
    // less than a claim and would flatter the first-time ratio.
    let store = MemoryStore::with_capacity(MEMORY_CAPACITY);
    let layer = Idempotency::new(store).with_ttl(handlers::RECORD_TTL);
    let url = handlers::serve(app().route_layer(layer).with_state(orders)).await?;
    Ok(Started {
        store: "memory",
        bare: vec![Bare::handler_alone(bare)],
        layered: vec![layered("memory", url)],
        wire: None,
        resources: Resources::None,
    })
}

/// The `redis` group also has a second bare row, the same handler plus one Redis `SET` (the
/// fair bare for a layer that adds Redis round trips).
async fn start_redis(route: Route) -> Result<Started, BoxError> {
    let url = std::env::var("REDIS_URL").map_err(|_| {
        "REDIS_URL is not set: export REDIS_URL=redis://127.0.0.1:6379 (or skip with --store)"
    })?;
    let mut client = redis::Client::open(url.as_str())?;
    let mut wire = None;
    if route == Route::Counted {
        let info = client.get_connection_info().clone();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            return Err("the bench counts Redis round trips over plain TCP only".into());
        };
        let counter = wire::Counter::start(upstream(&host, port).await?).await?;
        let proxied = redis::ConnectionAddr::Tcp("127.0.0.1".into(), counter.addr().port());
        client = redis::Client::open(info.set_addr(proxied))?;
        wire = Some(counter);
    }
    let prefix = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let manager = redis::aio::ConnectionManager::new(client.clone()).await?;
    let store = RedisStore::connect(client)
        .await?
        .with_prefix(prefix.clone());
    let app = || Router::new().route("/orders", post(handlers::memory_create));
    let orders = handlers::Orders::default();
    let bare = handlers::serve(app().with_state(orders.clone())).await?;
    let bare_write = handlers::serve(
        Router::new()
            .route("/orders", post(handlers::redis_create))
            .with_state((orders.clone(), manager, Arc::from(prefix.as_str()))),
    )
    .await?;
    let layer = Idempotency::new(store).with_ttl(handlers::RECORD_TTL);
    let url = handlers::serve(app().route_layer(layer).with_state(orders)).await?;
    Ok(Started {
        store: "redis",
        bare: vec![
            Bare::handler_alone(bare),
            Bare {
                name: "bare + 1 Redis write",
                url: bare_write,
            },
        ],
        layered: vec![layered("redis", url)],
        wire,
        resources: Resources::None,
    })
}

/// Transactional mode (the INSERT in the idempotency transaction), standard mode (the INSERT on
/// the pool, as in the bare handler) and single-commit mode (claim, INSERT and saved answer in
/// one transaction), on [`BENCH_DATABASE`].
async fn start_postgres(setup: &Setup, route: Route) -> Result<Started, BoxError> {
    let (pool, wire) = bench_database(setup.workers, route).await?;
    pool.execute("TRUNCATE bench_orders, idempotency_records")
        .await?;
    if setup.preload > 0 && route == Route::Direct {
        preload(&pool, setup.preload).await?;
    }
    let on_pool = || {
        Router::new()
            .route("/orders", post(handlers::pg_create))
            .with_state(pool.clone())
    };
    let in_tx = || Router::new().route("/orders", post(handlers::pg_create_tx));
    // One store per mode, as an application would have.
    let stores: [PostgresStore; 3] = std::array::from_fn(|_| PostgresStore::new(pool.clone()));
    let layer = |i: usize| Idempotency::new(stores[i].clone()).with_ttl(handlers::RECORD_TTL);
    let bare = handlers::serve(on_pool()).await?;
    let transactional = handlers::serve(in_tx().route_layer(layer(0).transactional())).await?;
    let standard = handlers::serve(on_pool().route_layer(layer(1))).await?;
    let single_commit =
        handlers::serve(in_tx().route_layer(layer(2).transactional_single_commit())).await?;
    let mode = |i: usize, label, url| Layered {
        label,
        url,
        batches: postgres_batches(&stores[i]),
    };
    Ok(Started {
        store: "postgres",
        bare: vec![Bare::handler_alone(bare)],
        layered: vec![
            mode(0, "postgres (transactional)", transactional),
            mode(1, "postgres (standard)", standard),
            mode(2, "postgres (single commit)", single_commit),
        ],
        wire,
        resources: Resources::Postgres(pool, stores.to_vec()),
    })
}

/// Transactional and standard mode on a fresh SQLite file (WAL) in the temp dir, and standard
/// mode with the store on a second file (the records' writes then take another file's write
/// lock than the handler's `INSERT`); the files are removed afterwards.
async fn start_sqlite() -> Result<Started, BoxError> {
    let (pool, path) = bench_sqlite_file().await?;
    let (records_pool, records_path) = bench_sqlite_file().await?;
    let stores = [
        SqliteStore::new(pool.clone()),
        SqliteStore::new(pool.clone()),
        SqliteStore::new(records_pool.clone()),
    ];
    let layer = |i: usize| Idempotency::new(stores[i].clone()).with_ttl(handlers::RECORD_TTL);
    let on_pool = || {
        Router::new()
            .route("/orders", post(handlers::sqlite_create))
            .with_state(pool.clone())
    };
    let bare = handlers::serve(on_pool()).await?;
    let transactional = handlers::serve(
        Router::new()
            .route("/orders", post(handlers::sqlite_create_tx))
            .route_layer(layer(0).transactional()),
    )
    .await?;
    let standard = handlers::serve(on_pool().route_layer(layer(1))).await?;
    let standard_own_file = handlers::serve(on_pool().route_layer(layer(2))).await?;
    let mode = |i: usize, label, url| Layered {
        label,
        url,
        batches: sqlite_batches(&stores[i]),
    };
    Ok(Started {
        store: "sqlite",
        bare: vec![Bare::handler_alone(bare)],
        layered: vec![
            mode(0, "sqlite (transactional)", transactional),
            mode(1, "sqlite (standard)", standard),
            mode(2, "sqlite (standard, own file)", standard_own_file),
        ],
        wire: None,
        resources: Resources::Sqlite(vec![(pool, path), (records_pool, records_path)]),
    })
}

/// Transactional mode (the INSERT in the idempotency transaction) and standard mode (the INSERT
/// on the pool, as in the bare handler), on [`BENCH_DATABASE`] of the `MYSQL_URL` server.
async fn start_mysql(setup: &Setup, route: Route) -> Result<Started, BoxError> {
    let (pool, wire) = bench_mysql_database(setup.workers, route).await?;
    pool.execute("TRUNCATE bench_orders").await?;
    pool.execute("TRUNCATE idempotency_records").await?;
    let on_pool = || {
        Router::new()
            .route("/orders", post(handlers::mysql_create))
            .with_state(pool.clone())
    };
    let stores: [MySqlStore; 2] = std::array::from_fn(|_| MySqlStore::new(pool.clone()));
    let layer = |i: usize| Idempotency::new(stores[i].clone()).with_ttl(handlers::RECORD_TTL);
    let bare = handlers::serve(on_pool()).await?;
    let transactional = handlers::serve(
        Router::new()
            .route("/orders", post(handlers::mysql_create_tx))
            .route_layer(layer(0).transactional()),
    )
    .await?;
    let standard = handlers::serve(on_pool().route_layer(layer(1))).await?;
    Ok(Started {
        store: "mysql",
        bare: vec![Bare::handler_alone(bare)],
        layered: vec![
            layered("mysql (transactional)", transactional),
            layered("mysql (standard)", standard),
        ],
        wire,
        resources: Resources::MySql(pool),
    })
}

// ---------------------------------------------------------------------------------------------
// Databases
// ---------------------------------------------------------------------------------------------

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

/// The pool the workers share on a server's bench database: as many connections as workers and
/// some for the store (warmed up front); through the counting proxy, as many as it expects.
async fn workers_pool<DB: sqlx::Database>(
    opts: <DB::Connection as sqlx::Connection>::Options,
    workers: usize,
    route: Route,
) -> Result<sqlx::Pool<DB>, BoxError> {
    let pool = match route {
        Route::Direct => {
            let max = (workers + 8).min(MAX_PG_CONNECTIONS) as u32;
            sqlx::pool::PoolOptions::<DB>::new()
                .max_connections(max)
                .min_connections(max.min(16))
        }
        Route::Counted => sqlx::pool::PoolOptions::<DB>::new()
            .max_connections(wire::connections(workers).min(MAX_PG_CONNECTIONS) as u32),
    };
    Ok(pool.connect_with(opts).await?)
}

/// The address of a store's server, for the counting proxy.
async fn upstream(host: &str, port: u16) -> Result<std::net::SocketAddr, BoxError> {
    Ok(tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| format!("cannot resolve {host}:{port}"))?)
}

/// A pool on [`BENCH_DATABASE`] (created if missing), migrated, with the `bench_orders` table;
/// with [`Route::Counted`], through a counting proxy, whose counter comes with it.
async fn bench_database(
    workers: usize,
    route: Route,
) -> Result<(PgPool, Option<wire::Counter>), BoxError> {
    let url = std::env::var("DATABASE_URL").map_err(|_| {
        "DATABASE_URL is not set: export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test (or skip with --store)"
    })?;
    let opts: PgConnectOptions = url.parse()?;
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
    let opts = opts.database(BENCH_DATABASE);
    let (opts, counter) = match route {
        Route::Direct => (opts, None),
        Route::Counted => {
            let upstream = upstream(opts.get_host(), opts.get_port()).await?;
            let counter = wire::Counter::start_postgres(upstream).await?;
            let port = counter.addr().port();
            let opts = opts
                .host("127.0.0.1")
                .port(port)
                .ssl_mode(PgSslMode::Disable);
            (opts, Some(counter))
        }
    };
    let pool = workers_pool(opts, workers, route).await?;
    PostgresStore::new(pool.clone()).migrate().await?;
    pool.execute(
        "CREATE TABLE IF NOT EXISTS bench_orders (
            id          bigserial PRIMARY KEY,
            customer_id text      NOT NULL,
            total_cents bigint    NOT NULL
        )",
    )
    .await?;
    Ok((pool, counter))
}

/// A pool on [`BENCH_DATABASE`] of the `MYSQL_URL` server (created if missing), migrated, with
/// the `bench_orders` table; with [`Route::Counted`], through a counting proxy (round trips).
async fn bench_mysql_database(
    workers: usize,
    route: Route,
) -> Result<(MySqlPool, Option<wire::Counter>), BoxError> {
    let url = std::env::var("MYSQL_URL").map_err(|_| {
        "MYSQL_URL is not set: export MYSQL_URL=mysql://root@127.0.0.1:3306/test (or skip with --store)"
    })?;
    let opts: MySqlConnectOptions = url.parse()?;
    let mut admin = sqlx::MySqlConnection::connect_with(&opts).await?;
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE IF NOT EXISTS `{BENCH_DATABASE}`"
        )))
        .await?;
    admin.close().await?;
    let opts = opts.database(BENCH_DATABASE);
    let (opts, counter) = match route {
        Route::Direct => (opts, None),
        Route::Counted => {
            let upstream = upstream(opts.get_host(), opts.get_port()).await?;
            let counter = wire::Counter::start(upstream).await?;
            let port = counter.addr().port();
            (opts.host("127.0.0.1").port(port), Some(counter))
        }
    };
    let pool = workers_pool(opts, workers, route).await?;
    MySqlStore::new(pool.clone()).migrate().await?;
    pool.execute(
        "CREATE TABLE IF NOT EXISTS bench_orders (
            id          BIGINT       AUTO_INCREMENT PRIMARY KEY,
            customer_id VARCHAR(255) NOT NULL,
            total_cents BIGINT       NOT NULL
        ) ENGINE = InnoDB",
    )
    .await?;
    Ok((pool, counter))
}
