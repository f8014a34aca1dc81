//! Single-commit mode on PostgreSQL, over real HTTP: the claim, the handler's writes and the
//! saved answer commit once; duplicates of a running attempt get 409 at once (an advisory lock,
//! never a wait on the uncommitted row); a crash rolls everything back and the retry runs at
//! once.
//!
//! The suite's app (`suite::routes`) for the behaviours that need no database work, and `/w/..`
//! routes that write a row in the idempotency transaction for the rest.

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
    store::postgres::PostgresStore, Idempotency, IdempotencyKey, IdempotencyTransaction,
};
use tower_idempotency_tests::suite::{
    self, concurrently, send, serve, serve_router, AppState, Reply, TestServer, ORDER,
};

/// No test may take longer than this, whatever hangs.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

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
            .execute(&mut **tx)
            .await
        {
            return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
        }
    }
    if what == "held" {
        writes.entered.send_modify(|n| *n += 1);
        let mut release = writes.release.subscribe();
        let _ = tokio::time::timeout(TEST_TIMEOUT, release.wait_for(|r| *r)).await;
    }
    let status = if what == "flaky" && n == 1 {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::CREATED
    };
    suite::answer(status, n, &Bytes::new())
}

async fn serve_writes(store: PostgresStore) -> (TestServer, Arc<Writes>, PgPool) {
    let pool = store.pool().clone();
    let writes = Arc::new(Writes::default());
    let router = Router::new()
        .route("/w/{what}", post(write))
        .with_state(writes.clone())
        .layer(layer(store));
    (
        serve_router(router, Arc::new(AppState::default())).await,
        writes,
        pool,
    )
}

/// Exactly one 201 that is not a replay; every other answer a replay of it or a 409.
fn assert_one_execution(replies: &[Reply]) {
    let originals: Vec<&Reply> = replies.iter().filter(|r| !r.replayed()).collect();
    let executed: Vec<&&Reply> = originals
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .collect();
    assert_eq!(executed.len(), 1, "not one execution: {replies:?}");
    for reply in replies {
        if reply.replayed() {
            reply.assert_replay_of(executed[0]);
        } else if reply.status == StatusCode::CONFLICT {
            reply.assert_in_flight();
        } else {
            assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        }
    }
}

async fn run<F: std::future::Future<Output = ()>>(name: &str, f: F) {
    suite::bounded(TEST_TIMEOUT, name, f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_attempts_execute_once() {
    run("fifty_concurrent_attempts_execute_once", async {
        let server = serve(layer(store().await)).await;
        let replies = concurrently(50, |_| server.order("seed-key")).await;
        assert_one_execution(&replies);
        assert_eq!(server.state.executions(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_execute_each_key_once() {
    run("two_instances_execute_each_key_once", async {
        let store = store().await;
        let a = serve(layer(store.clone())).await;
        let b = serve(layer(store)).await;
        for key in ["k-1", "k-2", "k-3"] {
            let replies = concurrently(20, |i| {
                if i % 2 == 0 {
                    a.order(key)
                } else {
                    b.order(key)
                }
            })
            .await;
            assert_one_execution(&replies);
        }
        assert_eq!(a.state.executions() + b.state.executions(), 3);
    })
    .await;
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

/// A duplicate of a running attempt gets 409 at once (it does not wait for the uncommitted
/// claim), with `Retry-After: 1`; after the commit it gets the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_while_running_is_409_at_once() {
    run("duplicate_while_running_is_409_at_once", async {
        let (server, writes, pool) = serve_writes(store().await).await;
        let first = tokio::spawn(send(server.post_key("/w/held", "w-held", ORDER)));
        let mut entered = writes.entered.subscribe();
        entered.wait_for(|n| *n >= 1).await.unwrap();
        let started = Instant::now();
        let duplicate = send(server.post_key("/w/held", "w-held", ORDER)).await;
        let took = started.elapsed();
        assert_eq!(duplicate.assert_in_flight(), 1);
        assert!(
            took < Duration::from_secs(2),
            "the duplicate waited {took:?}"
        );
        writes.release.send_replace(true);
        let first = first.await.unwrap();
        first.assert_executed(StatusCode::CREATED, 1);
        send(server.post_key("/w/held", "w-held", ORDER))
            .await
            .assert_replay_of(&first);
        assert_eq!(widgets(&pool).await, 1);
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
        let records: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(records, 0, "the rolled-back claim left a record");
        send(server.post_key("/w/flaky", "w-flaky", ORDER))
            .await
            .assert_executed(StatusCode::CREATED, 2);
        assert_eq!(widgets(&pool).await, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panicking_handler_rolls_back_and_the_retry_runs() {
    run("panicking_handler_rolls_back_and_the_retry_runs", async {
        let server = serve(layer(store().await)).await;
        let first = suite::try_send(server.post_key("/panic", "p-1", ORDER)).await;
        assert!(
            first.map_or(true, |r| r.status == StatusCode::INTERNAL_SERVER_ERROR),
            "a panic is a 500 or a dropped connection"
        );
        send(server.post_key("/panic", "p-1", ORDER))
            .await
            .assert_executed(StatusCode::CREATED, 2);
    })
    .await;
}

/// A crash (the database connection of the running attempt dies): claim and work roll back
/// together, and the retry runs at once, with no lease to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_rolls_back_everything_and_the_retry_runs_at_once() {
    run(
        "crash_rolls_back_everything_and_the_retry_runs_at_once",
        async {
            let (server, writes, pool) = serve_writes(store().await).await;
            let first = tokio::spawn(send(server.post_key("/w/held", "w-crash", ORDER)));
            let mut entered = writes.entered.subscribe();
            entered.wait_for(|n| *n >= 1).await.unwrap();
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
            let started = Instant::now();
            let retry = loop {
                // The server notices the dead backend only when the attempt commits; the lock and
                // the uncommitted claim are gone at once.
                let reply = send(server.post_key("/w/write", "w-crash", ORDER)).await;
                if reply.status != StatusCode::CONFLICT {
                    break reply;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "the retry kept getting 409"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            retry.assert_executed(StatusCode::CREATED, 2);
            writes.release.send_replace(true);
            let first = first.await.unwrap();
            assert_ne!(
                first.status,
                StatusCode::CREATED,
                "the crashed attempt committed"
            );
            assert_eq!(
                widgets(&pool).await,
                1,
                "the crashed attempt's row survived"
            );
            send(server.post_key("/w/write", "w-crash", ORDER))
                .await
                .assert_replay_of(&retry);
        },
    )
    .await;
}

/// Wait mode polls (an uncommitted claim cannot be watched) and replays the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_mode_replays_to_concurrent_attempts() {
    run("wait_mode_replays_to_concurrent_attempts", async {
        let server = serve(layer(store().await).wait_for_in_flight(Duration::from_secs(5))).await;
        let replies = concurrently(20, |_| server.post_key("/slow", "wait-1", ORDER)).await;
        assert_eq!(server.state.executions(), 1);
        let original = replies.iter().find(|r| !r.replayed()).expect("an original");
        original.assert_executed(StatusCode::CREATED, 1);
        assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 19);
    })
    .await;
}
