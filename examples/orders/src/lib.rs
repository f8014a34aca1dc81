//! The reference orders API: `POST /orders` behind tower-idempotency in transactional mode.
//!
//! Run with: `cargo run --release -p orders-api` (see `src/main.rs` for the environment).
//!
//! [`app`] builds the real router on PostgreSQL, MySQL (MariaDB) or SQLite, so the integration tests drive the
//! same code the binary serves:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let db = orders_api::Db::connect(Some("postgres://postgres@127.0.0.1/orders")).await?;
//! db.migrate().await?;
//! let app = orders_api::app(db, orders_api::Config::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! | route | answer |
//! |---|---|
//! | `POST /orders` + `Idempotency-Key` | 201 with the order and `Location: /orders/{orderId}`; 400 for invalid input |
//! | `GET /orders/{orderId}` | 200 with the order, or 404 |
//! | `GET /orders?customerId=c_1` | 200 `{"orders": [...]}` (oldest first, at most 1000), 400 without `customerId` |
//! | `GET /healthz` | 200 when the database answers `SELECT 1`, 503 otherwise |
//! | `GET /metrics` | Prometheus text: `idempotency_requests_total{outcome}`, store latency, .. |
//! | `GET /openapi.json` | the OpenAPI document, generated from the code |
//! | `/admin/idempotency/...` | with `ADMIN_TOKEN` set ([`admin_routes`]): the operator routes of [`tower_idempotency::admin`] (`GET /stats`, `GET`/`DELETE /keys/{key}?scope=..`, ..) behind `Authorization: Bearer <ADMIN_TOKEN>`, 401 without |
//!
//! With [`Config::outbox`] (`OUTBOX=true`, PostgreSQL only), `POST /orders` also inserts an
//! `order.created` event into the `outbox` table, in the same transaction as the order and the
//! saved answer; a relay publishes it (see `examples/chain`).
//!
//! Every answer carries an `x-request-id` (the client's, or a new UUID), each request runs in a
//! `tower-http` trace span carrying it, and a request unanswered after [`REQUEST_TIMEOUT`] gets
//! `408` (its work still finishes and is saved for the retry).
//!
//! Errors are `application/problem+json` (RFC 9457); their `type` URIs point into
//! `examples/orders/README.md`.

use std::{str::FromStr, sync::Arc, time::Duration};

use axum::{
    middleware,
    routing::{get, post},
    Router,
};
use sqlx::{
    migrate::{Migration, MigrationType, Migrator},
    mysql::{MySql, MySqlConnectOptions, MySqlPool, MySqlPoolOptions},
    postgres::{PgConnectOptions, PgPoolOptions, Postgres},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
    ConnectOptions, Connection, PgPool, Pool, SqlSafeStr, Sqlite, SqlitePool,
};
use tokio::sync::Semaphore;
use tower_idempotency::{
    store::{
        mysql::{self, MySqlStore},
        postgres::{self, PostgresStore},
        sqlite::{self, SqliteStore},
        DynStore,
    },
    Idempotency, Sweeper, Transactional,
};

mod admin;
mod backend;
mod config;
mod openapi;
mod payment;
mod problem;
mod routes;
mod server;
mod telemetry;

pub use admin::admin_routes;
pub use backend::Order;
pub use config::{AdminToken, Config, ConfigError, ServerConfig, Settings};
pub use openapi::ApiDoc;
pub use payment::PaymentProvider;
pub use problem::{DbFault, Problem};
pub use routes::NewOrder;
pub use server::{serve, Shutdown};
pub use telemetry::{metrics_handle, REQUEST_TIMEOUT};

/// The SQLite file used when `DATABASE_URL` is not set, in the working directory.
pub const DEFAULT_SQLITE_FILE: &str = "orders.db";

/// The table the example's own migrations are tracked in, apart from the library's
/// (`_tower_idempotency_migrations`) and from any application's `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_orders_migrations";

/// How often expired idempotency records are deleted.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Connections the PostgreSQL pool keeps at most.
const PG_MAX_CONNECTIONS: u32 = 16;
/// Connections the MySQL pool keeps at most.
const MYSQL_MAX_CONNECTIONS: u32 = 16;
/// Connections the SQLite pool keeps at most (one writer at a time; readers in parallel in WAL).
const SQLITE_MAX_CONNECTIONS: u32 = 8;
/// How long a statement waits for SQLite's write lock before failing.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The database the orders and the idempotency records live in, together.
#[derive(Debug, Clone)]
pub enum Db {
    /// PostgreSQL: the default for real deployments, several instances on one database.
    Postgres(PgPool),
    /// SQLite: embedded, single node.
    Sqlite(SqlitePool),
    /// MySQL 8 or MariaDB (InnoDB): several instances on one database.
    MySql(MySqlPool),
}

impl Db {
    /// Connect to `url` (`postgres://...`, `mysql://...` or `sqlite://...`), or, when `None`, open (and create if
    /// missing) the SQLite file [`DEFAULT_SQLITE_FILE`] in the working directory.
    ///
    /// SQLite is opened in WAL mode with a busy timeout, so readers do not block the writer.
    pub async fn connect(url: Option<&str>) -> Result<Self, sqlx::Error> {
        let sqlite = |opts: SqliteConnectOptions| {
            opts.create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
        };
        match url {
            None => {
                let opts = sqlite(SqliteConnectOptions::new().filename(DEFAULT_SQLITE_FILE));
                Ok(Db::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(SQLITE_MAX_CONNECTIONS)
                        .connect_with(opts)
                        .await?,
                ))
            }
            Some(url) if url.starts_with("sqlite:") => {
                let opts = sqlite(SqliteConnectOptions::from_str(url)?);
                Ok(Db::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(SQLITE_MAX_CONNECTIONS)
                        .connect_with(opts)
                        .await?,
                ))
            }
            Some(url) if url.starts_with("postgres:") || url.starts_with("postgresql:") => {
                let opts = PgConnectOptions::from_str(url)?;
                // One direct connection first: a refused or misconfigured server is reported as
                // its own error, not as a pool timeout.
                opts.connect().await?.close().await?;
                Ok(Db::Postgres(
                    PgPoolOptions::new()
                        .max_connections(PG_MAX_CONNECTIONS)
                        .acquire_timeout(Duration::from_secs(5))
                        .connect_with(opts)
                        .await?,
                ))
            }
            Some(url) if url.starts_with("mysql:") => {
                let opts = MySqlConnectOptions::from_str(url)?;
                // As for PostgreSQL: a refused server is its own error, not a pool timeout.
                opts.connect().await?.close().await?;
                Ok(Db::MySql(
                    MySqlPoolOptions::new()
                        .max_connections(MYSQL_MAX_CONNECTIONS)
                        .acquire_timeout(Duration::from_secs(5))
                        .connect_with(opts)
                        .await?,
                ))
            }
            Some(_) => Err(sqlx::Error::Configuration(
                "DATABASE_URL must start with postgres://, mysql:// or sqlite://".into(),
            )),
        }
    }

    /// Create or upgrade the tables: the library's `idempotency_records` (tracked in
    /// `_tower_idempotency_migrations`), then the example's `orders`, and on PostgreSQL its
    /// `outbox` (tracked in [`MIGRATIONS_TABLE`]). Safe to run on every start, from several
    /// instances at once: the example's migrations run the way the store runs its own.
    pub async fn migrate(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        match self {
            Db::Postgres(pool) => {
                PostgresStore::new(pool.clone()).migrate().await?;
                let orders = migrator(&[
                    (
                        "orders",
                        include_str!("../migrations/postgres/0001_orders.sql"),
                    ),
                    (
                        "outbox",
                        include_str!("../migrations/postgres/0002_outbox.sql"),
                    ),
                ]);
                postgres::run_migrator(pool, orders).await?;
            }
            Db::Sqlite(pool) => {
                SqliteStore::new(pool.clone()).migrate().await?;
                let orders = migrator(&[(
                    "orders",
                    include_str!("../migrations/sqlite/0001_orders.sql"),
                )]);
                sqlite::run_migrator(pool, orders).await?;
            }
            Db::MySql(pool) => {
                MySqlStore::new(pool.clone()).migrate().await?;
                let orders = migrator(&[(
                    "orders",
                    include_str!("../migrations/mysql/0001_orders.sql"),
                )]);
                mysql::run_migrator(pool, orders).await?;
            }
        }
        Ok(())
    }

    /// Close the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        match self {
            Db::Postgres(pool) => pool.close().await,
            Db::Sqlite(pool) => pool.close().await,
            Db::MySql(pool) => pool.close().await,
        }
    }

    /// The idempotency store on this database, its type chosen at run time.
    ///
    /// Enough for everything but transactional mode, which needs the concrete store (the
    /// handler's transaction has that database's type): [`app`] builds that one per database.
    pub fn idempotency_store(&self) -> DynStore {
        match self {
            Db::Postgres(pool) => DynStore::new(PostgresStore::new(pool.clone())),
            Db::Sqlite(pool) => DynStore::new(SqliteStore::new(pool.clone())),
            Db::MySql(pool) => DynStore::new(MySqlStore::new(pool.clone())),
        }
    }

    /// `"postgres"`, `"sqlite"` or `"mysql"`, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "postgres",
            Db::Sqlite(_) => "sqlite",
            Db::MySql(_) => "mysql",
        }
    }
}

/// The example's migrations, `(name, sql)` as versions 1, 2, .. in order, tracked in their own
/// table.
fn migrator(files: &[(&'static str, &'static str)]) -> Migrator {
    let migrations = files
        .iter()
        .zip(1..)
        .map(|(&(name, sql), version)| {
            Migration::new(
                version,
                name.into(),
                MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The orders API on `db`: the routes, behind the idempotency layer in transactional mode with
/// the lease and retention of `config`.
///
/// The tables must exist: call [`Db::migrate`] first.
///
/// # Panics
///
/// With [`Config::outbox`] on a database other than PostgreSQL, which has no outbox table
/// ([`Settings::from_env`] refuses that combination with an error).
pub fn app(db: Db, config: Config) -> Router {
    assert!(
        !config.outbox || matches!(db, Db::Postgres(_)),
        "the outbox (OUTBOX=true) needs PostgreSQL; this database is {}",
        db.kind()
    );
    match db {
        Db::Postgres(pool) => postgres_app(pool, &config),
        Db::Sqlite(pool) => sqlite_app(pool, &config),
        Db::MySql(pool) => mysql_app(pool, &config),
    }
}

/// The orders API on PostgreSQL.
fn postgres_app(pool: Pool<Postgres>, config: &Config) -> Router {
    let idempotency = Idempotency::postgres(pool.clone())
        .with_lease(config.lease)
        .with_ttl(config.ttl)
        .with_body_timeout(config.body_timeout)
        .transactional();
    router(pool, idempotency, config)
}

/// The orders API on SQLite.
fn sqlite_app(pool: Pool<Sqlite>, config: &Config) -> Router {
    let idempotency = Idempotency::sqlite(pool.clone())
        .with_lease(config.lease)
        .with_ttl(config.ttl)
        .with_body_timeout(config.body_timeout)
        .transactional();
    router(pool, idempotency, config)
}

/// The orders API on MySQL or MariaDB.
fn mysql_app(pool: Pool<MySql>, config: &Config) -> Router {
    let idempotency = Idempotency::mysql(pool.clone())
        .with_lease(config.lease)
        .with_ttl(config.ttl)
        .with_body_timeout(config.body_timeout)
        .transactional();
    router(pool, idempotency, config)
}

/// Start the background task that deletes expired idempotency records every [`SWEEP_EVERY`],
/// and sets the record gauges (`idempotency_records`, `idempotency_oldest_running_seconds`) after
/// each round. It stops when the returned [`Sweeper`] is dropped.
pub fn sweeper(db: &Db) -> Sweeper {
    Sweeper::spawn_with_stats(
        Arc::new(db.idempotency_store()),
        SWEEP_EVERY,
        tower_idempotency::sweeper::DEFAULT_SWEEP_BATCH,
    )
}

/// One router for either database: only the SQL behind [`backend::Backend`] differs.
fn router<B: backend::Backend>(
    pool: Pool<B>,
    idempotency: Idempotency<B::Store, Transactional>,
    config: &Config,
) -> Router {
    // Outside the idempotency layer: a request waiting here has not had its body read yet, so
    // memory for bodies is bounded by the permits.
    let order_permits = Arc::new(Semaphore::new(config.max_in_flight_orders));
    let state = routes::AppState {
        pool,
        payments: PaymentProvider::new(config.payment_latency),
        outbox: config.outbox,
    };
    let metrics = telemetry::metrics_handle();
    let routes = Router::new()
        .route(
            "/orders",
            post(routes::create_order::<B>)
                .route_layer(idempotency)
                .route_layer(middleware::from_fn_with_state(
                    order_permits,
                    routes::one_of_the_permits,
                ))
                .get(routes::list_orders::<B>),
        )
        .route("/orders/{order_id}", get(routes::get_order::<B>))
        .route("/healthz", get(routes::healthz::<B>))
        .route("/openapi.json", get(openapi::document))
        .route("/metrics", get(move || telemetry::metrics(metrics.clone())))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(state);
    telemetry::layers(routes)
}
