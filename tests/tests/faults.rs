//! Fault injection: the store is reached through a [`FaultProxy`] that the test turns off, cuts,
//! slows down or cuts at the `COMMIT`, with a real axum app behind the layer and real PostgreSQL,
//! MySQL (MariaDB) and Redis behind the proxy.
//!
//! | fault | expected |
//! |---|---|
//! | store down before the claim | 503 + `Retry-After`, handler not called; recovers by itself |
//! | connections cut between the work and the save | the save goes through on a new connection: replay |
//! | store down between the work and the save (standard) | answer sent unsaved; 409 inside the lease, runs again after it (the documented gap) |
//! | cut before the `COMMIT` reaches PostgreSQL | 503, work rolled back; the retry runs once |
//! | cut after the `COMMIT`, before its answer | 503, work committed with the answer; the retry replays |
//! | 2 s latency, 500 ms store timeout (standard and wait mode) | 503 within about the timeout; the pool is whole afterwards |
//! | 2 s latency from the save in the transaction on | 503 within about the timeout; the work rolls back |
//! | idle pooled connections killed by the server | the claim's read and the transaction's `BEGIN` move to a checked-out connection: 201, once |

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use fault_proxy::{CutPoint, FaultProxy};
use serde_json::json;
use sqlx::{pool::PoolOptions, MySql, Pool, Postgres};
use tokio::task::JoinHandle;
use tower_idempotency::{
    store::{
        mysql::MySqlStore, postgres::PostgresStore, redis::RedisStore, Store, TransactionalStore,
    },
    Idempotency, IdempotencyKey, IdempotencyTransaction, Mode, REPLAYED_HEADER,
};
use tower_idempotency_tests::{
    fresh_mysql_pool, fresh_postgres_pool, redis_url, unique_name, Isolation,
};

/// The lease of every test layer: short, so the tests that watch it lapse stay short.
const LEASE: Duration = Duration::from_secs(3);
/// The store timeout of the latency tests.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);
/// The latency those tests add.
const LATENCY: Duration = Duration::from_secs(2);
/// How long any request may take before the test fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

// ------------------------------------------------------------------------------------------------
// The app
// ------------------------------------------------------------------------------------------------

/// What the handlers did, and the proxy they can break from inside.
#[derive(Debug)]
struct AppState {
    executions: Mutex<HashMap<String, usize>>,
    proxy: Arc<FaultProxy>,
}

impl AppState {
    fn execute(&self, key: &IdempotencyKey) -> usize {
        let mut executions = self.executions.lock().unwrap();
        let n = executions.entry(key.as_str().to_owned()).or_default();
        *n += 1;
        *n
    }

    fn executions_of(&self, key: &str) -> usize {
        self.executions
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

type AppRef = Arc<AppState>;

fn created(execution: usize) -> Response {
    (StatusCode::CREATED, Json(json!({ "execution": execution }))).into_response()
}

/// `POST /orders`: the work is counting the execution.
async fn order(State(state): State<AppRef>, key: IdempotencyKey, _: Bytes) -> Response {
    created(state.execute(&key))
}

/// `POST /cut-after-work`: the work, then every store connection is cut before the layer saves.
async fn cut_after_work(State(state): State<AppRef>, key: IdempotencyKey, _: Bytes) -> Response {
    let n = state.execute(&key);
    state.proxy.cut_all_and_wait().await;
    created(n)
}

/// `POST /down-after-work`: the work, then the store goes down before the layer saves.
async fn down_after_work(State(state): State<AppRef>, key: IdempotencyKey, _: Bytes) -> Response {
    let n = state.execute(&key);
    state.proxy.refuse();
    created(n)
}

/// The `work` table's statements in a database's dialect.
trait WorkTable: sqlx::Database {
    /// Insert one row for `key` in the layer's transaction.
    async fn insert_work(tx: IdempotencyTransaction<Self>, key: &str) -> Result<(), sqlx::Error>;
}

impl WorkTable for Postgres {
    async fn insert_work(tx: IdempotencyTransaction<Self>, key: &str) -> Result<(), sqlx::Error> {
        let mut tx = tx.begin().await?;
        sqlx::query("INSERT INTO work (idem_key) VALUES ($1)")
            .bind(key)
            .execute(&mut *tx)
            .await
            .map(drop)
    }
}

impl WorkTable for MySql {
    async fn insert_work(tx: IdempotencyTransaction<Self>, key: &str) -> Result<(), sqlx::Error> {
        let mut tx = tx.begin().await?;
        sqlx::query("INSERT INTO work (idem_key) VALUES (?)")
            .bind(key)
            .execute(&mut *tx)
            .await
            .map(drop)
    }
}

/// `POST /work` (PostgreSQL) and `POST /my-work` (MySQL), transactional mode: one row in `work`
/// per execution, in the layer's transaction.
async fn work_in_transaction<DB: WorkTable>(
    State(state): State<AppRef>,
    key: IdempotencyKey,
    tx: IdempotencyTransaction<DB>,
    _: Bytes,
) -> Response {
    let n = state.execute(&key);
    match DB::insert_work(tx, key.as_str()).await {
        Ok(()) => created(n),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// `POST /work-then-slow` and `POST /my-work-then-slow` (transactional mode): the work, then on
/// the first execution only, the store turns slow before the layer saves the answer in the
/// transaction and commits.
async fn work_then_slow<DB: WorkTable>(
    state: State<AppRef>,
    key: IdempotencyKey,
    tx: IdempotencyTransaction<DB>,
    body: Bytes,
) -> Response {
    let (app, name) = (state.0.clone(), key.as_str().to_owned());
    let response = work_in_transaction(state, key, tx, body).await;
    if app.executions_of(&name) == 1 {
        app.proxy.set_latency(LATENCY);
    }
    response
}

/// The app served on `127.0.0.1:0`; stops when dropped.
struct Server {
    addr: SocketAddr,
    state: AppRef,
    client: reqwest::Client,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<St: Store, M: Mode<St>>(
    layer: Idempotency<St, M>,
    proxy: Arc<FaultProxy>,
) -> Server {
    let state = Arc::new(AppState {
        executions: Mutex::default(),
        proxy,
    });
    let router = Router::new()
        .route("/orders", post(order))
        .route("/cut-after-work", post(cut_after_work))
        .route("/down-after-work", post(down_after_work))
        .route(Postgres::WORK, post(work_in_transaction::<Postgres>))
        .route(Postgres::WORK_THEN_SLOW, post(work_then_slow::<Postgres>))
        .route(MySql::WORK, post(work_in_transaction::<MySql>))
        .route(MySql::WORK_THEN_SLOW, post(work_then_slow::<MySql>))
        .layer(layer)
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.expect("serve the app");
    });
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    Server {
        addr,
        state,
        client,
        task,
    }
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    replayed: bool,
    retry_after: Option<u64>,
    elapsed: Duration,
    /// The problem's `type`, for an answer of the layer's own.
    problem: Option<String>,
}

impl Reply {
    /// Whether the answer is the layer's problem `name` (the last part of its `type`).
    fn is_problem(&self, name: &str) -> bool {
        self.problem.as_deref().is_some_and(|t| t.ends_with(name))
    }
}

impl Server {
    /// One first-time request on `path`, answered 201: it opens the store's connections (the
    /// batches' and the handler's), so what a test counts after it is statements only.
    async fn warm(&self, path: &str) {
        let reply = self.post(path, "warm").await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }

    async fn post(&self, path: &str, key: &str) -> Reply {
        let started = Instant::now();
        let response = self
            .client
            .post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(r#"{"item":"book"}"#)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path} with key {key} failed: {e}"));
        let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let replayed = header(REPLAYED_HEADER.as_str()).as_deref() == Some("true");
        let retry_after = header("retry-after").and_then(|v| v.parse().ok());
        let body = response.bytes().await.unwrap_or_default();
        let problem = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|problem| Some(problem.get("type")?.as_str()?.to_owned()));
        Reply {
            status,
            replayed,
            retry_after,
            elapsed: started.elapsed(),
            problem,
        }
    }

    /// Retry `key` until it gets `want` (every other answer must be one a client retries: 409 or
    /// 503), at most `tries` times, `pause` apart.
    async fn retry_until(&self, path: &str, key: &str, want: StatusCode, tries: usize) -> Reply {
        let pause = Duration::from_millis(200);
        for _ in 0..tries {
            let reply = self.post(path, key).await;
            if reply.status == want {
                return reply;
            }
            assert!(
                matches!(
                    reply.status,
                    StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
                ),
                "a retry of {key} got {reply:?}"
            );
            tokio::time::sleep(pause).await;
        }
        panic!("{key} never got {want} in {tries} tries");
    }
}

// ------------------------------------------------------------------------------------------------
// The backends, reached through the proxy
// ------------------------------------------------------------------------------------------------

/// A migrated database of its own: `direct` for the test's checks, `proxied` (through `proxy`)
/// for the layer and the handlers.
struct Proxied<DB: sqlx::Database> {
    direct: Pool<DB>,
    proxied: Pool<DB>,
    proxy: Arc<FaultProxy>,
}

/// What the tests need of a SQL database behind the proxy, in its dialect.
trait Backend: WorkTable {
    type Store: TransactionalStore<Database = Self>;
    /// The routes of [`work_in_transaction`] and [`work_then_slow`] on this database.
    const WORK: &'static str;
    const WORK_THEN_SLOW: &'static str;

    /// A fresh migrated database with a `work` table.
    async fn fresh() -> Pool<Self>;
    /// The host and port of `pool`'s server.
    fn server(pool: &Pool<Self>) -> (String, u16);
    /// `pool`'s options, reaching the same database through a proxy on `port`.
    fn through_proxy(pool: &Pool<Self>, port: u16) -> ConnectOptionsOf<Self>;
    /// The layer on `pool`.
    fn layer(pool: Pool<Self>) -> Idempotency<Self::Store>;
    /// Rows of `work` for `key`.
    async fn work_rows(pool: &Pool<Self>, key: &str) -> i64;
    /// Records with a saved answer.
    async fn saved_records(pool: &Pool<Self>) -> i64;
}

type ConnectOptionsOf<DB> = <<DB as sqlx::Database>::Connection as sqlx::Connection>::Options;

/// A proxy in front of the server at `target`.
async fn proxy_to(target: impl tokio::net::ToSocketAddrs) -> Arc<FaultProxy> {
    let target = tokio::net::lookup_host(target)
        .await
        .unwrap()
        .next()
        .unwrap();
    Arc::new(FaultProxy::start(target).await.unwrap())
}

/// The [`Backend`] of one database: the two differ in their store, routes, fresh pool, `work`
/// table and placeholder; the rest is one text.
macro_rules! backend {
    (
        $db:ty, $store:ident, layer: $layer:path, routes: ($work:literal, $work_then_slow:literal),
        pool: $pool:expr, work_table: $work_table:literal, count_work: $count_work:literal $(,)?
    ) => {
        impl Backend for $db {
            type Store = $store;
            const WORK: &'static str = $work;
            const WORK_THEN_SLOW: &'static str = $work_then_slow;

            async fn fresh() -> Pool<Self> {
                let direct = $pool;
                $store::new(direct.clone())
                    .migrate()
                    .await
                    .expect("migrate");
                sqlx::query($work_table).execute(&direct).await.unwrap();
                direct
            }

            fn server(pool: &Pool<Self>) -> (String, u16) {
                let options = pool.connect_options();
                (options.get_host().to_owned(), options.get_port())
            }

            fn through_proxy(pool: &Pool<Self>, port: u16) -> ConnectOptionsOf<Self> {
                (*pool.connect_options())
                    .clone()
                    .host("127.0.0.1")
                    .port(port)
            }

            fn layer(pool: Pool<Self>) -> Idempotency<$store> {
                $layer(pool)
            }

            async fn work_rows(pool: &Pool<Self>, key: &str) -> i64 {
                sqlx::query_scalar($count_work)
                    .bind(key)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn saved_records(pool: &Pool<Self>) -> i64 {
                sqlx::query_scalar(SAVED_RECORDS)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }
        }
    };
}

backend!(
    Postgres,
    PostgresStore,
    layer: Idempotency::postgres,
    routes: ("/work", "/work-then-slow"),
    pool: fresh_postgres_pool(4).await,
    work_table: "CREATE TABLE work (id bigserial PRIMARY KEY, idem_key text NOT NULL)",
    count_work: "SELECT count(*) FROM work WHERE idem_key = $1",
);

backend!(
    MySql,
    MySqlStore,
    layer: Idempotency::mysql,
    routes: ("/my-work", "/my-work-then-slow"),
    pool: fresh_mysql_pool(4, Isolation::RepeatableRead).await,
    work_table: "CREATE TABLE work (id BIGINT AUTO_INCREMENT PRIMARY KEY, idem_key VARCHAR(255) NOT NULL)",
    count_work: "SELECT count(*) FROM work WHERE idem_key = ?",
);

/// Records with a saved answer, in any dialect.
const SAVED_RECORDS: &str = "SELECT count(*) FROM idempotency_records WHERE state = 'done'";

impl<DB: Backend> Proxied<DB> {
    /// A fresh database, and a lazy pool of `max_connections` reaching it through a proxy.
    async fn start(max_connections: u32) -> Self {
        let direct = DB::fresh().await;
        let proxy = proxy_to(DB::server(&direct)).await;
        let proxied = PoolOptions::<DB>::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(DB::through_proxy(&direct, proxy.addr().port()));
        Self {
            direct,
            proxied,
            proxy,
        }
    }

    fn layer(&self) -> Idempotency<DB::Store> {
        DB::layer(self.proxied.clone()).with_lease(LEASE)
    }

    async fn work_rows(&self, key: &str) -> i64 {
        DB::work_rows(&self.direct, key).await
    }

    async fn saved_records(&self) -> i64 {
        DB::saved_records(&self.direct).await
    }

    /// Wait until every connection of the proxied pool is back in it, idle.
    async fn wait_pool_whole(&self, max_connections: u32) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (size, idle) = (self.proxied.size(), self.proxied.num_idle() as u32);
            assert!(
                size <= max_connections,
                "the pool grew past its bound: {size}"
            );
            if size == idle {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "connections never came back: {size} open, {idle} idle"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A Redis store under a fresh prefix, through its own proxy.
async fn redis() -> (Idempotency<RedisStore>, Arc<FaultProxy>) {
    let url = redis_url();
    let target = url.trim_start_matches("redis://").trim_end_matches('/');
    let proxy = proxy_to(target).await;
    let client = redis::Client::open(format!("redis://{}", proxy.addr())).unwrap();
    let store = RedisStore::lazy(client)
        .unwrap()
        .with_prefix(unique_name("faults"));
    (Idempotency::new(store).with_lease(LEASE), proxy)
}

// ------------------------------------------------------------------------------------------------
// The faults, written once for any store
// ------------------------------------------------------------------------------------------------

async fn store_down_before_the_claim(server: &Server, proxy: &FaultProxy) {
    proxy.refuse();
    let down = server.post("/orders", "down-1").await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE, "{down:?}");
    assert!(down.retry_after.is_some_and(|s| s >= 1), "{down:?}");
    assert_eq!(
        server.state.executions_of("down-1"),
        0,
        "the handler ran while the store was down"
    );

    proxy.restore();
    // No restart: the same app serves once the store answers again.
    let first = server
        .retry_until("/orders", "down-1", StatusCode::CREATED, 50)
        .await;
    assert!(!first.replayed);
    let again = server.post("/orders", "down-1").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed, "the retry after recovery must be a replay");
    assert_eq!(server.state.executions_of("down-1"), 1);
}

async fn cut_between_the_work_and_the_save(server: &Server, proxy: &FaultProxy) {
    let cuts = proxy.cut_connections();
    let first = server.post("/cut-after-work", "cut-1").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(
        proxy.cut_connections() > cuts,
        "the handler's cut closed no connection"
    );
    // A cut fails one batch on a connection that was idle through it: the save's (retried on a
    // new connection), or, when the save had opened a new one, this retry's claim (503, and the
    // client tries again).
    let retry = server
        .retry_until("/cut-after-work", "cut-1", StatusCode::CREATED, 3)
        .await;
    assert!(
        retry.replayed,
        "the save should have gone through on a new connection"
    );
    assert_eq!(server.state.executions_of("cut-1"), 1);
}

async fn store_down_between_the_work_and_the_save(server: &Server, proxy: &FaultProxy) {
    let started = Instant::now();
    let first = server.post("/down-after-work", "lost-save-1").await;
    // The answer is sent though it could not be saved.
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    proxy.restore();
    // Inside the lease the key is still held: no second execution.
    let mut conflicts = 0;
    while started.elapsed() + Duration::from_millis(500) < LEASE {
        let retry = server.post("/down-after-work", "lost-save-1").await;
        if started.elapsed() >= LEASE {
            break; // the lease may have lapsed while the request was in the air
        }
        assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
        assert!(retry.retry_after.is_some());
        conflicts += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(conflicts > 0, "no retry was sent inside the lease");
    assert_eq!(server.state.executions_of("lost-save-1"), 1);
    // Standard mode's documented gap: once the lease lapses, the unsaved work runs again
    // (transactional mode closes it for database work).
    let after = server
        .retry_until("/down-after-work", "lost-save-1", StatusCode::CREATED, 20)
        .await;
    assert!(!after.replayed);
    assert_eq!(server.state.executions_of("lost-save-1"), 2);
    proxy.restore();
}

async fn latency_beyond_the_store_timeout(server: &Server, proxy: &FaultProxy) -> Vec<String> {
    proxy.set_latency(LATENCY);
    let keys: Vec<String> = (0..8).map(|i| format!("slow-{i}")).collect();
    let replies =
        futures_util::future::join_all(keys.iter().map(|key| server.post("/orders", key))).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert!(reply.retry_after.is_some(), "{reply:?}");
        // About the timeout (500 ms): under the latency, which any store answer would take.
        assert!(
            reply.elapsed < LATENCY,
            "a slow store answer took {:?}",
            reply.elapsed
        );
    }
    for key in &keys {
        assert_eq!(
            server.state.executions_of(key),
            0,
            "{key} ran while its claim timed out"
        );
    }
    proxy.restore();
    keys
}

/// With `db`'s pool warmed (so the timeouts hit live connections, not only connection
/// attempts): [`latency_beyond_the_store_timeout`], then no connection leaked, every key executes
/// once, and still no connection leaked.
async fn latency_then_every_key_once<DB: Backend>(
    db: &Proxied<DB>,
    server: &Server,
    max_connections: u32,
) {
    assert_eq!(
        server.post("/orders", "warm").await.status,
        StatusCode::CREATED
    );
    let keys = latency_beyond_the_store_timeout(server, &db.proxy).await;
    db.wait_pool_whole(max_connections).await;
    after_the_latency_every_key_executes_once(server, &keys).await;
    db.wait_pool_whole(max_connections).await;
}

async fn after_the_latency_every_key_executes_once(server: &Server, keys: &[String]) {
    // A claim that landed late holds its key until it is released or its lease lapses.
    let tries = (LEASE.as_millis() / 200 + 20) as usize;
    for key in keys {
        server
            .retry_until("/orders", key, StatusCode::CREATED, tries)
            .await;
        assert_eq!(server.state.executions_of(key), 1, "{key}");
    }
}

// ------------------------------------------------------------------------------------------------
// The SQL faults, written once for PostgreSQL and MySQL
// ------------------------------------------------------------------------------------------------

async fn store_down_before_the_claim_is_503_and_recovers<DB: Backend>() {
    let db = Proxied::<DB>::start(4).await;
    let server = serve(db.layer(), db.proxy.clone()).await;
    store_down_before_the_claim(&server, &db.proxy).await;
}

async fn store_down_between_the_work_and_the_save_runs_nothing_twice_inside_the_lease<
    DB: Backend,
>() {
    let db = Proxied::<DB>::start(4).await;
    let server = serve(db.layer(), db.proxy.clone()).await;
    store_down_between_the_work_and_the_save(&server, &db.proxy).await;
}

/// The same in transactional mode, with a handler that never begins the transaction: nothing
/// rolls its work back, so its answer is sent and its key kept as in standard mode (not 503 and
/// a released key, which would let the retry do the work again).
async fn store_down_after_work_outside_the_transaction_keeps_the_answer_and_the_key<DB: Backend>() {
    let db = Proxied::<DB>::start(4).await;
    let server = serve(db.layer().transactional(), db.proxy.clone()).await;
    store_down_between_the_work_and_the_save(&server, &db.proxy).await;
}

async fn cut_between_the_work_and_the_save_is_saved_on_a_new_connection<DB: Backend>() {
    let db = Proxied::<DB>::start(4).await;
    let server = serve(db.layer(), db.proxy.clone()).await;
    cut_between_the_work_and_the_save(&server, &db.proxy).await;
    assert_eq!(db.saved_records().await, 1);
}

async fn cut_before_the_commit_rolls_back_and_the_retry_runs_once<DB: Backend>() {
    let db = Proxied::<DB>::start(4).await;
    let server = serve(db.layer().transactional(), db.proxy.clone()).await;
    db.proxy.cut_at("COMMIT", CutPoint::BeforeSending);
    let first = server.post(DB::WORK, "commit-lost").await;
    assert_eq!(
        db.proxy.triggers_fired(),
        1,
        "no COMMIT went through the proxy"
    );
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    // The record was still running under the attempt: the commit surely did not land.
    assert!(first.is_problem("StoreUnavailable"), "{first:?}");
    assert_eq!(
        db.work_rows("commit-lost").await,
        0,
        "neither: the work rolled back"
    );
    assert_eq!(db.saved_records().await, 0);

    let retry = server
        .retry_until(DB::WORK, "commit-lost", StatusCode::CREATED, 30)
        .await;
    assert!(!retry.replayed);
    assert!(server.post(DB::WORK, "commit-lost").await.replayed);
    assert_eq!(db.work_rows("commit-lost").await, 1);
    assert_eq!(db.saved_records().await, 1);
}

async fn cut_after_the_commit_keeps_both_and_the_retry_replays<DB: Backend>() {
    let db = Proxied::<DB>::start(4).await;
    let server = serve(db.layer().transactional(), db.proxy.clone()).await;
    the_cut_commit_is_unconfirmed_and_the_retry_replays(&db, &server).await;
}

/// The COMMIT lands and its acknowledgement is lost. The layer cannot know the COMMIT landed: its
/// release (fenced on a running record) or its read leaves the saved answer alone, and it answers
/// 503 saying the outcome is unknown, not that nothing was done; the retry replays.
async fn the_cut_commit_is_unconfirmed_and_the_retry_replays<DB: Backend>(
    db: &Proxied<DB>,
    server: &Server,
) {
    db.proxy.cut_at("COMMIT", CutPoint::BeforeTheAnswer);
    let first = server.post(DB::WORK, "answer-lost").await;
    assert_eq!(
        db.proxy.triggers_fired(),
        1,
        "no COMMIT went through the proxy"
    );
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert!(first.is_problem("CommitUnconfirmed"), "{first:?}");
    assert_eq!(
        db.work_rows("answer-lost").await,
        1,
        "both: the work committed"
    );
    assert_eq!(db.saved_records().await, 1, "both: with its answer");

    let retry = server.post(DB::WORK, "answer-lost").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(retry.replayed, "the retry must replay the committed answer");
    assert_eq!(db.work_rows("answer-lost").await, 1);
    assert_eq!(server.state.executions_of("answer-lost"), 1);
}

async fn latency_beyond_the_store_timeout_is_503_quickly_and_leaks_no_connection<DB: Backend>() {
    let max_connections = 4;
    let db = Proxied::<DB>::start(max_connections).await;
    let layer = db.layer().with_store_timeout(STORE_TIMEOUT);
    let server = serve(layer, db.proxy.clone()).await;
    latency_then_every_key_once(&db, &server, max_connections).await;
}

async fn latency_at_the_commit_is_503_quickly_and_the_work_rolls_back<DB: Backend>() {
    let max_connections = 4;
    let db = Proxied::<DB>::start(max_connections).await;
    let layer = db.layer().with_store_timeout(STORE_TIMEOUT).transactional();
    let server = serve(layer, db.proxy.clone()).await;
    let first = server.post(DB::WORK_THEN_SLOW, "slow-commit").await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert!(
        first.elapsed < LATENCY,
        "the slow save must time out, not wait: {:?}",
        first.elapsed
    );
    db.proxy.restore();
    db.wait_pool_whole(max_connections).await;
    assert_eq!(
        db.work_rows("slow-commit").await,
        0,
        "neither: the work rolled back"
    );
    assert_eq!(db.saved_records().await, 0);

    // Its release timed out too: the key frees when the lease lapses, then runs once.
    let tries = (LEASE.as_millis() / 200 + 20) as usize;
    let retry = server
        .retry_until(
            DB::WORK_THEN_SLOW,
            "slow-commit",
            StatusCode::CREATED,
            tries,
        )
        .await;
    assert!(!retry.replayed);
    assert_eq!(db.work_rows("slow-commit").await, 1);
    assert_eq!(db.saved_records().await, 1);
    db.wait_pool_whole(max_connections).await;
}

/// The SQL faults above as tests, once per backend (`postgres::cut_before_the_commit_..`).
macro_rules! sql_fault_tests {
    ($($backend:ident: $db:ty),+ $(,)?) => {$(
        mod $backend {
            use super::*;
            sql_fault_tests!(@each $db =>
                store_down_before_the_claim_is_503_and_recovers,
                cut_between_the_work_and_the_save_is_saved_on_a_new_connection,
                store_down_between_the_work_and_the_save_runs_nothing_twice_inside_the_lease,
                store_down_after_work_outside_the_transaction_keeps_the_answer_and_the_key,
                cut_before_the_commit_rolls_back_and_the_retry_runs_once,
                cut_after_the_commit_keeps_both_and_the_retry_replays,
                latency_beyond_the_store_timeout_is_503_quickly_and_leaks_no_connection,
                latency_at_the_commit_is_503_quickly_and_the_work_rolls_back,
            );
        }
    )+};
    (@each $db:ty => $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread")]
        async fn $test() {
            super::$test::<$db>().await;
        }
    )+};
}

sql_fault_tests!(postgres: Postgres, mysql: MySql);

// ------------------------------------------------------------------------------------------------
// PostgreSQL
// ------------------------------------------------------------------------------------------------

/// [`the_cut_commit_is_unconfirmed_and_the_retry_replays`] in single-commit mode, where the claim,
/// the work and the answer are one commit.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_single_commit_cut_after_the_commit_is_unconfirmed_and_the_retry_replays() {
    let db = Proxied::<Postgres>::start(4).await;
    let layer = db.layer().transactional_single_commit();
    let server = serve(layer, db.proxy.clone()).await;
    the_cut_commit_is_unconfirmed_and_the_retry_replays(&db, &server).await;
}

/// A transactional app on a pool of four, after one request, with every connection back idle.
async fn warm_transactional_postgres() -> (Proxied<Postgres>, Server) {
    let db = Proxied::<Postgres>::start(4).await;
    let server = serve(db.layer().transactional(), db.proxy.clone()).await;
    server.warm("/work").await;
    db.wait_pool_whole(4).await;
    (db, server)
}

/// The handler's transaction begins on an idle connection without the pool's checkout ping:
/// a first-time request in transactional mode, counted on the wire once the pool is whole
/// again, costs the claim, `BEGIN`, the handler's `INSERT`, the save, `COMMIT` and sqlx's ping
/// when the connection goes back: six round trips (seven with the checkout ping).
#[tokio::test(flavor = "multi_thread")]
async fn postgres_transaction_begins_on_an_idle_connection_without_a_ping() {
    let (db, server) = warm_transactional_postgres().await;

    let before = db.proxy.traffic();
    let first = server.post("/work", "counted").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    db.wait_pool_whole(4).await;
    let used = db.proxy.traffic().since(before);
    assert_eq!(
        used.round_trips, 6,
        "a transactional first-time request took {} round trips",
        used.round_trips
    );
    assert_eq!(db.work_rows("counted").await, 1);
}

/// An idle connection that died in the pool (its backend terminated) fails only its own
/// `BEGIN`: the transaction begins on a connection checked out as the pool's options say, and
/// the request succeeds, once.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_dead_idle_connection_does_not_fail_the_transaction() {
    let (db, server) = warm_transactional_postgres().await;
    // The handler's connection, idle in the pool since its COMMIT; the store's batch
    // connections last ran a batch statement and are left alone.
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state = 'idle' AND query = 'COMMIT'",
    )
    .fetch_all(&db.direct)
    .await
    .unwrap();
    assert!(
        !terminated.is_empty() && terminated.iter().all(|&done| done),
        "no idle handler connection to terminate: {terminated:?}"
    );

    let reply = server.post("/work", "after-the-kill").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert!(!reply.replayed);
    assert_eq!(db.work_rows("after-the-kill").await, 1);
    assert_eq!(server.state.executions_of("after-the-kill"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_latency_in_wait_mode_is_503_quickly() {
    let max_connections = 4;
    let db = Proxied::<Postgres>::start(max_connections).await;
    let layer = db
        .layer()
        .with_store_timeout(STORE_TIMEOUT)
        .wait_for_in_flight(Duration::from_secs(10));
    let server = serve(layer, db.proxy.clone()).await;
    latency_then_every_key_once(&db, &server, max_connections).await;
}

// ------------------------------------------------------------------------------------------------
// MySQL (MariaDB)
// ------------------------------------------------------------------------------------------------

/// Connections that died idle in the pool (killed by the server) fail only their own first
/// statement: the claim's read runs again on a connection checked out as the pool's options
/// say, the handler's transaction begins on one, and the request succeeds, once.
#[tokio::test(flavor = "multi_thread")]
async fn mysql_dead_idle_connections_do_not_fail_the_claim_or_the_transaction() {
    let db = Proxied::<MySql>::start(4).await;
    let server = serve(db.layer().transactional(), db.proxy.clone()).await;
    server.warm(MySql::WORK).await;
    db.wait_pool_whole(4).await;
    let idle = "SELECT id FROM information_schema.processlist
                WHERE db = DATABASE() AND command = 'Sleep' AND id <> CONNECTION_ID()";
    // One connection for the look and the kills, so it never kills itself.
    let mut admin = db.direct.acquire().await.unwrap();
    let ids: Vec<i64> = sqlx::query_scalar(idle)
        .fetch_all(&mut *admin)
        .await
        .unwrap();
    assert!(!ids.is_empty(), "no idle connection to kill");
    for id in &ids {
        sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
            .execute(&mut *admin)
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<i64> = sqlx::query_scalar(idle)
            .fetch_all(&mut *admin)
            .await
            .unwrap();
        if !left.iter().any(|id| ids.contains(id)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "killed connections stayed: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let reply = server.post(MySql::WORK, "after-the-kill").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert!(!reply.replayed);
    assert_eq!(db.work_rows("after-the-kill").await, 1);
    assert_eq!(server.state.executions_of("after-the-kill"), 1);
}

// ------------------------------------------------------------------------------------------------
// Redis
// ------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn redis_store_down_before_the_claim_is_503_and_recovers() {
    let (layer, proxy) = redis().await;
    let server = serve(layer, proxy.clone()).await;
    store_down_before_the_claim(&server, &proxy).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_cut_between_the_work_and_the_save_is_saved_on_a_new_connection() {
    let (layer, proxy) = redis().await;
    let server = serve(layer, proxy.clone()).await;
    cut_between_the_work_and_the_save(&server, &proxy).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_store_down_between_the_work_and_the_save_runs_nothing_twice_inside_the_lease() {
    let (layer, proxy) = redis().await;
    let server = serve(layer, proxy.clone()).await;
    store_down_between_the_work_and_the_save(&server, &proxy).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_latency_beyond_the_store_timeout_is_503_quickly() {
    let (layer, proxy) = redis().await;
    let server = serve(layer.with_store_timeout(STORE_TIMEOUT), proxy.clone()).await;
    assert_eq!(
        server.post("/orders", "warm").await.status,
        StatusCode::CREATED
    );
    let keys = latency_beyond_the_store_timeout(&server, &proxy).await;
    after_the_latency_every_key_executes_once(&server, &keys).await;
}
