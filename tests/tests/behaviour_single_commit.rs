//! Single-commit mode on PostgreSQL, over real HTTP: the claim, the handler's writes and the
//! saved answer commit once; duplicates of a running attempt get 409 at once (an advisory lock,
//! never a wait on the uncommitted row); a crash rolls everything back and the retry runs at
//! once.
//!
//! The behaviours that need no database work (concurrency, two instances, 409 and its
//! `Retry-After: 1`, wait mode, panics, leases, ...) are the whole behaviour suite, run in this
//! mode by `behaviour.rs` (`modes::single_commit_postgres`). This file holds what needs the
//! handler's own writes: `/w/..` routes that write a row in the idempotency transaction, and the
//! crash test.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    Router,
};
use bytes::Bytes;
use sqlx::PgPool;
use tokio::sync::watch;
use tower_idempotency::{
    store::postgres::PostgresStore, Idempotency, IdempotencyKey, IdempotencyTransaction, RetryAfter,
};
use tower_idempotency_tests::suite::{self, send, serve_router, AppState, TestServer, ORDER};

async fn store() -> PostgresStore {
    let store = PostgresStore::new(tower_idempotency_tests::fresh_postgres_pool(16).await);
    store.migrate().await.expect("migrate the fresh database");
    sqlx::query("CREATE TABLE widgets (id bigserial PRIMARY KEY, note text NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create widgets");
    store
}

fn layer(store: PostgresStore) -> Idempotency<PostgresStore, tower_idempotency::SingleCommit> {
    Idempotency::new(store).transactional_single_commit()
}

async fn widgets(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM widgets")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What the `/w` handlers share with the test.
#[derive(Debug)]
struct Writes {
    executions: AtomicUsize,
    /// How many `/w/held` handlers have written their row.
    entered: watch::Sender<usize>,
    /// `true` once the test lets `/w/held` answer.
    release: watch::Sender<bool>,
}

impl Default for Writes {
    fn default() -> Self {
        Self {
            executions: AtomicUsize::new(0),
            entered: watch::channel(0).0,
            release: watch::channel(false).0,
        }
    }
}

/// `POST /w/write`: a row in the transaction, 201. `POST /w/flaky`: a row, then 503 on its
/// first execution (201 after). `POST /w/held`: a row, then 201 once the test releases it.
async fn write(
    State(writes): State<Arc<Writes>>,
    tx: IdempotencyTransaction<sqlx::Postgres>,
    Path(what): Path<String>,
    key: IdempotencyKey,
) -> Response {
    let n = writes.executions.fetch_add(1, Ordering::SeqCst) + 1;
    {
        let mut tx = match tx.begin().await {
            Ok(tx) => tx,
            Err(err) => {
                return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response()
            }
        };
        if let Err(err) = sqlx::query("INSERT INTO widgets (note) VALUES ($1)")
            .bind(key.as_str())
            .execute(&mut *tx)
            .await
        {
            return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
        }
    }
    if what == "held" {
        writes.entered.send_modify(|n| *n += 1);
        let mut release = writes.release.subscribe();
        let _ = tokio::time::timeout(suite::SIGNAL_TIMEOUT, release.wait_for(|r| *r)).await;
    }
    let status = if what == "flaky" && n == 1 {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::CREATED
    };
    suite::answer(status, n, &Bytes::new())
}

async fn serve_writes(store: PostgresStore) -> (TestServer, Arc<Writes>, PgPool) {
    serve_writes_through(layer(store.clone()), store.pool().clone()).await
}

/// The `/w` handlers behind `layer`, a single-commit layer on `pool`'s database.
async fn serve_writes_through(
    layer: Idempotency<PostgresStore, tower_idempotency::SingleCommit>,
    pool: PgPool,
) -> (TestServer, Arc<Writes>, PgPool) {
    let writes = Arc::new(Writes::default());
    let router = Router::new()
        .route("/w/{what}", post(write))
        .with_state(writes.clone())
        .layer(layer);
    (
        serve_router(router, Arc::new(AppState::default())).await,
        writes,
        pool,
    )
}

async fn run<F: std::future::Future<Output = ()>>(name: &str, f: F) {
    tower_idempotency_tests::contract::bounded(name, f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_saves_row_and_answer_once() {
    run("commit_saves_row_and_answer_once", async {
        let (server, writes, pool) = serve_writes(store().await).await;
        let first = send(server.post_key("/w/write", "w-1", ORDER)).await;
        first.assert_executed(StatusCode::CREATED, 1);
        assert_eq!(widgets(&pool).await, 1);
        send(server.post_key("/w/write", "w-1", ORDER))
            .await
            .assert_replay_of(&first);
        send(server.post_key("/w/write", "w-1", r#"{"other":true}"#))
            .await
            .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(widgets(&pool).await, 1);
        assert_eq!(writes.executions.load(Ordering::SeqCst), 1);
        // Nothing of the attempt is left running: no record in state `running`.
        let running: i64 =
            sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE state = 'running'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(running, 0);
    })
    .await;
}

/// A 503 is not saved: the claim and the row roll back together, and the retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn not_saved_status_rolls_back_claim_and_work() {
    run("not_saved_status_rolls_back_claim_and_work", async {
        let (server, _writes, pool) = serve_writes(store().await).await;
        let first = send(server.post_key("/w/flaky", "w-flaky", ORDER)).await;
        assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(widgets(&pool).await, 0);
        assert_eq!(
            records(&pool).await,
            0,
            "the rolled-back claim left a record"
        );
        send(server.post_key("/w/flaky", "w-flaky", ORDER))
            .await
            .assert_executed(StatusCode::CREATED, 2);
        assert_eq!(widgets(&pool).await, 1);
    })
    .await;
}

/// How many records the idempotency table holds, committed ones.
async fn records(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The advisory locks granted in this database: one per running single-commit attempt.
async fn advisory_locks(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = \
         (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Wait (bounded) until `n` `/w/held` handlers have written their row.
async fn wait_entered(writes: &Writes, n: usize) {
    let mut entered = writes.entered.subscribe();
    tokio::time::timeout(suite::SIGNAL_TIMEOUT, entered.wait_for(|e| *e >= n))
        .await
        .unwrap_or_else(|_| panic!("{n} held handlers never started"))
        .expect("the signal is alive");
}

/// The crash test. The running attempt's transaction dies mid-handler (its database connection
/// is killed, as when the process dies): a duplicate meanwhile got 409 at once; the claim and
/// the work roll back together, leaving no record and no row; the retry of the same request
/// runs at once (no lease to wait for) while the crashed handler is still there, and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_rolls_back_everything_and_the_retry_runs_at_once() {
    run(
        "crash_rolls_back_everything_and_the_retry_runs_at_once",
        async {
            let (server, writes, pool) = serve_writes(store().await).await;
            let first = tokio::spawn(send(server.post_key("/w/held", "w-crash", ORDER)));
            wait_entered(&writes, 1).await;
            // A duplicate of the running attempt (its claim and row uncommitted): 409 at once,
            // `Retry-After: 1`, never a wait on the uncommitted row.
            let started = Instant::now();
            let duplicate = send(server.post_key("/w/held", "w-crash", ORDER)).await;
            assert_eq!(duplicate.assert_in_flight(), 1);
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "the duplicate waited {:?}",
                started.elapsed()
            );
            // The backend holding the key's advisory lock is the running attempt's: kill it.
            let killed: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_locks \
                 WHERE locktype = 'advisory' AND granted AND database = \
                 (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            assert_eq!(killed, [true]);
            // The backend exits asynchronously; PostgreSQL gives no signal: poll (bounded) until
            // its transaction, and with it the lock, is gone.
            let mut polls = 0;
            while advisory_locks(&pool).await > 0 {
                polls += 1;
                assert!(polls < 250, "the killed backend kept its advisory lock");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // No record and no work are left.
            assert_eq!(records(&pool).await, 0, "the crashed claim left a record");
            assert_eq!(
                widgets(&pool).await,
                0,
                "the crashed attempt's row survived"
            );
            // The retry (the same request) claims at once: it is in its handler while the crashed
            // attempt's handler still waits, well within any lease.
            let retry = tokio::spawn(send(server.post_key("/w/held", "w-crash", ORDER)));
            wait_entered(&writes, 2).await;
            writes.release.send_replace(true);
            let first = first.await.unwrap();
            assert_ne!(
                first.status,
                StatusCode::CREATED,
                "the crashed attempt answered as if committed: {first:?}"
            );
            assert!(!first.replayed());
            let retry = retry.await.unwrap();
            retry.assert_executed(StatusCode::CREATED, 2);
            assert_eq!(widgets(&pool).await, 1, "the retry's row, once");
            send(server.post_key("/w/held", "w-crash", ORDER))
                .await
                .assert_replay_of(&retry);
            assert_eq!(writes.executions.load(Ordering::SeqCst), 2);
        },
    )
    .await;
}

/// A replay, a mismatch and a duplicate of a finished request are answered by a read that
/// opens no transaction: with every connection of the application's pool held elsewhere, they
/// still answer at once, and concurrent ones share the store's read statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_from_committed_records_need_no_transaction() {
    run(
        "answers_from_committed_records_need_no_transaction",
        async {
            let store = store().await;
            let (server, writes, pool) = serve_writes(store.clone()).await;
            let first = send(server.post_key("/w/write", "w-read", ORDER)).await;
            first.assert_executed(StatusCode::CREATED, 1);

            let mut held = Vec::new();
            for _ in 0..pool.options().get_max_connections() {
                held.push(
                    pool.acquire()
                        .await
                        .expect("a connection of the application's pool"),
                );
            }
            let before = store.batch_stats();
            let replays = futures_util::future::join_all(
                (0..8).map(|_| send(server.post_key("/w/write", "w-read", ORDER))),
            )
            .await;
            for replay in &replays {
                replay.assert_replay_of(&first);
            }
            send(server.post_key("/w/write", "w-read", r#"{"other":true}"#))
                .await
                .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
            let read = store.batch_stats() - before;
            assert_eq!(read.entries, 9, "every answer was read: {read:?}");
            drop(held);

            assert_eq!(writes.executions.load(Ordering::SeqCst), 1);
            assert_eq!(widgets(&pool).await, 1);
        },
    )
    .await;
}

/// A key running under another instance's lease (standard mode on the same table) is in flight
/// for single-commit mode too, answered from the committed record's lease, and once saved it is
/// replayed: the read before the transaction answers both without claiming.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_under_another_modes_lease_is_in_flight_until_its_answer_is_replayed() {
    run(
        "a_key_under_another_modes_lease_is_in_flight_until_its_answer_is_replayed",
        async {
            const LEASE: Duration = Duration::from_secs(30);
            let store = store().await;
            // A fixed Retry-After longer than the lease: the answer is capped by the lease the
            // read found left.
            let single_commit =
                layer(store.clone()).with_retry_after(RetryAfter::Fixed(LEASE * 10));
            let (single_commit, writes, _pool) =
                serve_writes_through(single_commit, store.pool().clone()).await;
            let entered = Arc::new(tokio::sync::Notify::new());
            let release = Arc::new(tokio::sync::Notify::new());
            let held = {
                let (entered, release) = (entered.clone(), release.clone());
                move || async move {
                    entered.notify_one();
                    release.notified().await;
                    suite::answer(StatusCode::CREATED, 1, &Bytes::new())
                }
            };
            let standard = Router::new()
                .route("/w/{what}", post(held))
                .layer(Idempotency::new(store).with_lease(LEASE));
            let standard = serve_router(standard, Arc::new(AppState::default())).await;

            let first = tokio::spawn(send(standard.post_key("/w/write", "w-lease", ORDER)));
            tokio::time::timeout(suite::SIGNAL_TIMEOUT, entered.notified())
                .await
                .expect("the standard-mode handler never started");
            let retry_after = send(single_commit.post_key("/w/write", "w-lease", ORDER))
                .await
                .assert_in_flight();
            assert!(
                retry_after > LEASE.as_secs() / 2 && retry_after <= LEASE.as_secs(),
                "Retry-After {retry_after} is not the running record's lease"
            );

            release.notify_one();
            let first = first.await.expect("the standard-mode request");
            first.assert_executed(StatusCode::CREATED, 1);
            send(single_commit.post_key("/w/write", "w-lease", ORDER))
                .await
                .assert_replay_of(&first);
            assert_eq!(writes.executions.load(Ordering::SeqCst), 0);
        },
    )
    .await;
}
