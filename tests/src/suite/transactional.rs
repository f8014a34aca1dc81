//! Transactional mode (PostgreSQL, SQLite and MySQL): the handler's writes commit with the saved answer.
//!
//! Store-specific: instantiated per SQL store by [`transactional_tests!`](crate::transactional_tests).

use super::*;
use tower_idempotency::Transactional;

/// Instantiate every transactional behaviour in the calling module against a fresh SQL store made
/// by `$store` (an expression, evaluated inside the test); `deferred` adds the behaviours of a
/// database with deferred constraints; `claims_fail: $store` instantiates the behaviours of a
/// store whose claims fail while its database works (one never migrated).
#[macro_export]
macro_rules! transactional_tests {
    (claims_fail: $store:expr) => {
        $crate::transactional_tests!(@claims_fail [tests $store]);
    };
    ($store:expr) => {
        $crate::transactional_tests!(@list [tests $store]);
    };
    ($store:expr, deferred) => {
        $crate::transactional_tests!(@list [tests $store]);
        $crate::transactional_tests!(@deferred [tests $store]);
    };
    (@names) => {
        $crate::transactional_tests!(@list [names])
    };
    (@deferred_names) => {
        $crate::transactional_tests!(@deferred [names])
    };
    (@claims_fail_names) => {
        $crate::transactional_tests!(@claims_fail [names])
    };
    (@claims_fail $mode:tt) => {
        $crate::transactional_tests! {@expand $mode;
            transactional_fail_open_gives_the_handler_its_transaction,
        }
    };
    (@deferred $mode:tt) => {
        $crate::transactional_tests! {@expand $mode;
            transactional_failed_commit_rolls_back_and_frees_the_key,
        }
    };
    (@list $mode:tt) => {
        $crate::transactional_tests! {@expand $mode;
            transactional_commit_saves_row_and_answer,
            transactional_503_rolls_back_and_releases,
            transactional_without_begin_is_saved,
            transactional_lease_lost_rolls_back_with_409,
            transactional_panic_rolls_back_and_releases,
            transactional_large_answer_commits_with_its_row,
            transactional_connections_stay_usable_after_each_ending,
            transactional_keyless_requests_get_their_transaction,
        }
    };
    (@expand [names]; $($name:ident),+ $(,)?) => {
        &[$(stringify!($name)),+]
    };
    (@expand [tests $store:expr]; $($name:ident),+ $(,)?) => {
        $crate::bounded_tests!($store; $($name => $crate::suite::transactional::$name),+);
    };
}

/// The transactional behaviours, by name.
pub const TRANSACTIONAL: &[&str] = crate::transactional_tests!(@names);

/// The transactional behaviours of a store whose claims fail while its database works, by name.
pub const TRANSACTIONAL_CLAIMS_FAIL: &[&str] = crate::transactional_tests!(@claims_fail_names);

/// The transactional behaviours of a database with deferred constraints, by name.
pub const TRANSACTIONAL_DEFERRED: &[&str] = crate::transactional_tests!(@deferred_names);

/// A `widgets` table the transactional handlers write to, for each SQL database.
pub trait Widgets: sqlx::Database {
    /// Create the table.
    fn create_table(pool: &sqlx::Pool<Self>) -> impl Future<Output = ()> + Send;
    /// Insert one row in the handler's idempotency transaction.
    fn insert(
        tx: &IdempotencyTransaction<Self>,
        note: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Insert, in the handler's idempotency transaction, a row whose foreign key is checked only
    /// at `COMMIT` (a deferred constraint) and has no parent: the statement succeeds, the
    /// `COMMIT` fails. `None` where the database has no deferred constraints (MySQL).
    fn insert_orphan(
        tx: &IdempotencyTransaction<Self>,
    ) -> Option<impl Future<Output = Result<(), sqlx::Error>> + Send>;
    /// How many rows the table holds (committed ones).
    fn count(pool: &sqlx::Pool<Self>) -> impl Future<Output = i64> + Send;
    /// Simulate a takeover of every running record behind the holder's back: a new token and a
    /// lapsed lease, as if another attempt had claimed it (the library's documented schema).
    fn steal_running(pool: &sqlx::Pool<Self>) -> impl Future<Output = ()> + Send;
}

const CREATE_WIDGETS: &str = "CREATE TABLE widgets (note TEXT NOT NULL)";

/// Parents and children whose foreign key is checked at `COMMIT` (PostgreSQL, SQLite; sqlx
/// turns SQLite's foreign keys on).
const CREATE_DEFERRED: &str = "CREATE TABLE parents (id INTEGER PRIMARY KEY); \
    CREATE TABLE children (parent INTEGER NOT NULL \
    REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)";

/// A child without a parent: accepted until the `COMMIT`.
const INSERT_ORPHAN: &str = "INSERT INTO children (parent) VALUES (42)";

/// [`Widgets::insert_orphan`] for a database with deferred constraints.
async fn insert_orphan_in<DB: sqlx::Database>(
    tx: IdempotencyTransaction<DB>,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let mut tx = tx.begin().await?;
    sqlx::raw_sql(INSERT_ORPHAN).execute(&mut *tx).await?;
    Ok(())
}

/// The [`Widgets`] of one database: the three differ only in the insert's placeholder, the
/// take-over statement and whether constraints can be deferred.
macro_rules! widgets {
    ($db:ty, insert: $insert:literal, steal: $steal:literal, deferred: $deferred:literal) => {
        impl Widgets for $db {
            async fn create_table(pool: &sqlx::Pool<Self>) {
                sqlx::query(CREATE_WIDGETS).execute(pool).await.unwrap();
                if $deferred {
                    sqlx::raw_sql(CREATE_DEFERRED).execute(pool).await.unwrap();
                }
            }

            fn insert_orphan(
                tx: &IdempotencyTransaction<Self>,
            ) -> Option<impl Future<Output = Result<(), sqlx::Error>> + Send> {
                $deferred.then(|| insert_orphan_in(tx.clone()))
            }

            async fn insert(
                tx: &IdempotencyTransaction<Self>,
                note: &str,
            ) -> Result<(), sqlx::Error> {
                let mut tx = tx.begin().await?;
                sqlx::query($insert).bind(note).execute(&mut *tx).await?;
                Ok(())
            }

            async fn count(pool: &sqlx::Pool<Self>) -> i64 {
                sqlx::query_scalar("SELECT count(*) FROM widgets")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn steal_running(pool: &sqlx::Pool<Self>) {
                let stolen = sqlx::query($steal).execute(pool).await.unwrap();
                assert_eq!(stolen.rows_affected(), 1);
            }
        }
    };
}

widgets!(
    sqlx::Postgres,
    insert: "INSERT INTO widgets (note) VALUES ($1)",
    steal: "UPDATE idempotency_records SET token = gen_random_uuid(), \
        lease_until = now() - interval '1 second' WHERE state = 'running'",
    deferred: true
);

widgets!(
    sqlx::Sqlite,
    insert: "INSERT INTO widgets (note) VALUES (?)",
    steal: "UPDATE idempotency_records SET token = randomblob(16), lease_until = 0 \
        WHERE state = 'running'",
    deferred: true
);

// MySQL checks foreign keys at once: it has no deferred constraints.
widgets!(
    sqlx::MySql,
    insert: "INSERT INTO widgets (note) VALUES (?)",
    steal: "UPDATE idempotency_records SET token = UNHEX(REPLACE(UUID(), '-', '')), \
        lease_until = 0 WHERE state = 'running'",
    deferred: false
);

/// How long the first run of `POST /tx/stolen` works before its record is taken over.
const STOLEN_RUN: Duration = Duration::from_millis(1_200);

/// `POST /tx/flaky`: writes a row in the transaction; answers 503 on its first execution and 201
/// after. `POST /tx/write`: writes a row, 201. `POST /tx/none`: never begins the transaction, 201.
/// `POST /tx/panic`: writes a row, then panics on its first execution; 201 after.
/// `POST /tx/stolen`: on its first execution, its record is taken over behind its back before
/// it writes its row; 201. `POST /tx/orphan`: on its first execution, also writes a row that
/// fails the `COMMIT` ([`Widgets::insert_orphan`]); 201.
fn tx_routes<DB: Widgets>(state: AppRef, pool: sqlx::Pool<DB>) -> Router {
    async fn write<DB: Widgets>(
        State((state, pool)): State<(AppRef, sqlx::Pool<DB>)>,
        tx: IdempotencyTransaction<DB>,
        Path(what): Path<String>,
        key: Option<IdempotencyKey>,
        body: Bytes,
    ) -> Response {
        let n = state.execute(key.as_ref());
        if what == "none" {
            return answer(StatusCode::CREATED, n, &body);
        }
        if what == "stolen" && n == 1 {
            // A handler that takes a while: what the 409's Retry-After estimates from.
            tokio::time::sleep(STOLEN_RUN).await;
            DB::steal_running(&pool).await;
        }
        if what == "orphan" && n == 1 {
            if let Some(orphan) = DB::insert_orphan(&tx) {
                if let Err(err) = orphan.await {
                    return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
                }
            }
        }
        let note = key.as_ref().map_or("without a key", IdempotencyKey::as_str);
        if let Err(err) = DB::insert(&tx, note).await {
            return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
        }
        if what == "panic" && n == 1 {
            panic!("POST /tx/panic panics after its write (on purpose)");
        }
        let status = if what == "flaky" && n == 1 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::CREATED
        };
        answer(status, n, &body)
    }
    Router::new()
        .route("/tx/{what}", post(write::<DB>))
        .with_state((state, pool))
}

async fn serve_transactional<St>(store: St) -> (TestServer, sqlx::Pool<St::Database>)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    serve_layer(Idempotency::new(store).transactional()).await
}

async fn serve_layer<St>(
    layer: Idempotency<St, Transactional>,
) -> (TestServer, sqlx::Pool<St::Database>)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let pool = layer.store().pool().clone();
    <St::Database as Widgets>::create_table(&pool).await;
    let state = AppRef::default();
    let router = tx_routes::<St::Database>(state.clone(), pool.clone()).layer(layer);
    (serve_router(router, state).await, pool)
}

/// Transactional mode on an optional layer: a request without a key runs unguarded, and its
/// handler still gets its transaction, ended as a claimed run's would be: committed with its
/// 201, rolled back with its 503. Nothing is saved, so each request runs.
pub async fn transactional_keyless_requests_get_their_transaction<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_layer(Idempotency::new(store).transactional().optional()).await;
    send(server.post("/tx/flaky", ORDER))
        .await
        .assert_executed(StatusCode::SERVICE_UNAVAILABLE, 1);
    assert_eq!(
        <St::Database as Widgets>::count(&pool).await,
        0,
        "the 503's row was committed"
    );
    send(server.post("/tx/write", ORDER))
        .await
        .assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post("/tx/write", ORDER))
        .await
        .assert_executed(StatusCode::CREATED, 3);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 2);
}

/// Transactional mode with `.fail_open()`, on a store whose claims fail while its database
/// works (`store` was never migrated: its table is missing): every request runs unguarded, and
/// its handler still gets its transaction, committed with its 201 and rolled back with its 503.
pub async fn transactional_fail_open_gives_the_handler_its_transaction<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_layer(Idempotency::new(store).transactional().fail_open()).await;
    send(server.post_key("/tx/flaky", "tx-open", ORDER))
        .await
        .assert_executed(StatusCode::SERVICE_UNAVAILABLE, 1);
    assert_eq!(
        <St::Database as Widgets>::count(&pool).await,
        0,
        "the 503's row was committed"
    );
    send(server.post_key("/tx/write", "tx-open", ORDER))
        .await
        .assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    // Nothing could be claimed or saved: the same key runs again.
    send(server.post_key("/tx/write", "tx-open", ORDER))
        .await
        .assert_executed(StatusCode::CREATED, 3);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 2);
}

/// Transactional mode: the handler's row and the saved answer commit together; the retry
/// replays and there is one row.
pub async fn transactional_commit_saves_row_and_answer<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let first = send(server.post_key("/tx/write", "tx-1", ORDER)).await;
    first.assert_executed(StatusCode::CREATED, 1);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/write", "tx-1", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    assert_eq!(server.state.executions(), 1);
}

/// Transactional mode: a 503 rolls the handler's row back and releases the key; the retry runs
/// again, commits its row, and is replayed after.
pub async fn transactional_503_rolls_back_and_releases<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    send(server.post_key("/tx/flaky", "tx-2", ORDER))
        .await
        .assert_executed(StatusCode::SERVICE_UNAVAILABLE, 1);
    assert_eq!(
        <St::Database as Widgets>::count(&pool).await,
        0,
        "the 503's row was committed"
    );
    let second = send(server.post_key("/tx/flaky", "tx-2", ORDER)).await;
    second.assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/flaky", "tx-2", ORDER))
        .await
        .assert_replay_of(&second);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    assert_eq!(server.state.executions(), 2);
}

/// Transactional mode: a handler that never begins the transaction still has its answer saved.
pub async fn transactional_without_begin_is_saved<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let first = send(server.post_key("/tx/none", "tx-3", ORDER)).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.post_key("/tx/none", "tx-3", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 0);
    assert_eq!(server.state.executions(), 1);
}

/// Transactional mode: a holder whose record was taken over while it ran cannot commit: its row
/// is rolled back and its client gets 409 with `Retry-After`; the retry does the work once.
pub async fn transactional_lease_lost_rolls_back_with_409<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let lost = send(server.post_key("/tx/stolen", "tx-4", ORDER)).await;
    // When the new holder's answer may be ready, estimated as for a duplicate in flight from
    // the path's recent runs (this one's 1.2 s and its database work: 2 s, rounded up; 3 on a
    // slow machine), not 1 s for want of an estimate, nor the whole 30 s lease.
    let retry_after = lost.assert_in_flight();
    assert!((2..=3).contains(&retry_after), "{lost:?}");
    assert_eq!(server.state.executions(), 1);
    assert_eq!(
        <St::Database as Widgets>::count(&pool).await,
        0,
        "the fenced-out holder committed its row"
    );
    // the lease of the (simulated) new holder has lapsed: the retry takes over and commits once
    let retry = send(server.post_key("/tx/stolen", "tx-4", ORDER)).await;
    retry.assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/stolen", "tx-4", ORDER))
        .await
        .assert_replay_of(&retry);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    assert_eq!(server.state.executions(), 2);
}

/// Transactional mode: a handler that panics after its write has the write rolled back and the
/// key released; the retry does the work once.
pub async fn transactional_panic_rolls_back_and_releases<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let failed = try_send(server.post_key("/tx/panic", "tx-5", ORDER)).await;
    assert!(
        failed.is_err(),
        "the panicking attempt answered: {failed:?}"
    );
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 0);
    let retry = send(server.post_key("/tx/panic", "tx-5", ORDER)).await;
    retry.assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/panic", "tx-5", ORDER))
        .await
        .assert_replay_of(&retry);
    assert_eq!(server.state.executions(), 2);
}

/// Transactional mode: a large answer (over 100 KiB) is saved in the handler's transaction,
/// commits with its row and is replayed.
pub async fn transactional_large_answer_commits_with_its_row<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let large = format!(
        r#"{{"customerId":"c_1","note":"{}"}}"#,
        "x".repeat(100 * 1024)
    );
    let first = send(server.post_key("/tx/write", "tx-large", &large)).await;
    first.assert_executed(StatusCode::CREATED, 1);
    assert!(
        first.body.len() > 100 * 1024,
        "the answer echoes the request"
    );
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/write", "tx-large", &large))
        .await
        .assert_replay_of(&first);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
}

/// Transactional mode: after a fenced-out save (rolled back) and many commits in a row, every
/// connection the pool hands out still begins, saves and commits: no transaction is left open
/// or counted wrong on a connection that went back to the pool.
pub async fn transactional_connections_stay_usable_after_each_ending<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    const KEYS: usize = 12;
    let (server, pool) = serve_transactional(store).await;
    send(server.post_key("/tx/stolen", "tx-seq-stolen", ORDER))
        .await
        .assert_in_flight();
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 0);
    for i in 0..KEYS {
        let key = format!("tx-seq-{i}");
        let first = send(server.post_key("/tx/write", &key, ORDER)).await;
        first.assert_executed(StatusCode::CREATED, i as u64 + 2);
        send(server.post_key("/tx/write", &key, ORDER))
            .await
            .assert_replay_of(&first);
    }
    let burst =
        (0..KEYS).map(|i| send(server.post_key("/tx/write", &format!("tx-burst-{i}"), ORDER)));
    for reply in futures_util::future::join_all(burst).await {
        assert_eq!(reply.status, StatusCode::CREATED, "body: {:?}", reply.body);
    }
    assert_eq!(
        <St::Database as Widgets>::count(&pool).await,
        2 * KEYS as i64,
        "every committed answer has its row, and no other row"
    );
}

/// Transactional mode, where constraints can be deferred (PostgreSQL, SQLite): a `COMMIT` that
/// fails after the save applied rolls the row and the answer back together, answers an error,
/// and frees the key; the retry runs again on the same pool and commits once.
pub async fn transactional_failed_commit_rolls_back_and_frees_the_key<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let failed = send(server.post_key("/tx/orphan", "tx-orphan", ORDER)).await;
    assert!(
        failed.status.is_server_error(),
        "a failed COMMIT answered {}: {:?}",
        failed.status,
        failed.body
    );
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 0);
    let retry = send(server.post_key("/tx/orphan", "tx-orphan", ORDER)).await;
    retry.assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/orphan", "tx-orphan", ORDER))
        .await
        .assert_replay_of(&retry);
}
