//! What only the MySQL store does, against the real server at `MYSQL_URL` (MariaDB 10.11 in
//! CI): the claim's outcome travels in the insert id, and MySQL's error numbers are sorted into
//! the store's error kinds, from errors the server really raises (a deadlock, a lock wait
//! timeout, a value too long). The contract every store shares is in `store_contract.rs`, run
//! there at READ COMMITTED and REPEATABLE READ.
//!
//! Run with `MYSQL_URL` set (see `scripts/test.sh`).

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use axum::{body::Body, routing::post, Router};
use http::{Request, StatusCode};
use sqlx::{mysql::MySqlPoolOptions, Connection, Executor, MySqlConnection, MySqlPool};
use tower::ServiceExt;
use tower_idempotency::{
    store::{mysql::MySqlStore, ClaimOutcome, Store, StoreError, StoreErrorKind},
    Idempotency,
};
use tower_idempotency_tests::{
    contract::{claim_of, claimed, random_key, retry_with_lease, until, DAY, LONG, MARGIN},
    fresh_mysql_database, fresh_mysql_pool, Isolation,
};

/// A migrated store on a pool of one connection, so consecutive statements share a session.
async fn one_connection_store() -> MySqlStore {
    let store = MySqlStore::new(fresh_mysql_pool(1, Isolation::RepeatableRead).await);
    store.migrate().await.expect("migrate");
    store
}

/// The insert id that reports a takeover (2) belongs to its statement: the next claim of a new
/// key on the same connection, an `INSERT` that evaluates no `LAST_INSERT_ID(expr)`, reads 0 and
/// is a fresh claim, not a takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_does_not_leak_into_the_next_claim_on_the_connection() {
    let store = one_connection_store().await;
    let lease = Duration::from_millis(200);
    let first = claim_of(random_key(), "a", lease, DAY);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now();
    until(started + lease + MARGIN).await;
    assert_eq!(
        store.claim(&retry_with_lease(&first, LONG)).await.unwrap(),
        claimed(true)
    );
    for _ in 0..3 {
        let fresh = claim_of(random_key(), "b", LONG, DAY);
        assert_eq!(store.claim(&fresh).await.unwrap(), claimed(false));
    }
}

/// Many rounds of 20 concurrent claims of one new key each, at both isolation levels: exactly
/// one winner per key, whatever InnoDB's lock queue does (deadlock victims are retried by the
/// layer, so the store may answer one as a `Conflict`, never as a second winner).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_inserts_of_new_keys_have_one_winner_at_both_isolation_levels() {
    for isolation in [Isolation::ReadCommitted, Isolation::RepeatableRead] {
        let store = Arc::new(MySqlStore::new(fresh_mysql_pool(20, isolation).await));
        store.migrate().await.unwrap();
        for _ in 0..10 {
            let first = claim_of(random_key(), "race", LONG, DAY);
            let barrier = Arc::new(tokio::sync::Barrier::new(20));
            let attempts: Vec<_> = (0..20)
                .map(|_| {
                    let (store, barrier) = (store.clone(), barrier.clone());
                    let claim = retry_with_lease(&first, LONG);
                    tokio::spawn(async move {
                        barrier.wait().await;
                        store.claim(&claim).await
                    })
                })
                .collect();
            let mut winners = 0;
            for attempt in attempts {
                match attempt.await.unwrap() {
                    Ok(ClaimOutcome::Claimed { taken_over: false }) => winners += 1,
                    Ok(ClaimOutcome::InFlight { .. }) => {}
                    Err(err) if err.kind() == StoreErrorKind::Conflict => {}
                    other => panic!("{isolation:?}: unexpected {other:?}"),
                }
            }
            assert_eq!(winners, 1, "{isolation:?}");
        }
    }
}

/// A scratch table and two connections to the database it is in.
async fn scratch() -> (MySqlPool, MySqlConnection, MySqlConnection) {
    let options = fresh_mysql_database().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .connect_with(options.clone())
        .await
        .unwrap();
    pool.execute(
        "CREATE TABLE scratch (id INT PRIMARY KEY, n INT NOT NULL, code VARCHAR(2)) ENGINE = InnoDB",
    )
    .await
    .unwrap();
    pool.execute("INSERT INTO scratch (id, n) VALUES (1, 0), (2, 0)")
        .await
        .unwrap();
    let a = MySqlConnection::connect_with(&options).await.unwrap();
    let b = MySqlConnection::connect_with(&options).await.unwrap();
    (pool, a, b)
}

fn kind_of(err: sqlx::Error) -> StoreErrorKind {
    StoreError::from(err).kind()
}

/// A real deadlock (1213): two transactions lock two rows in opposite orders. InnoDB rolls one
/// back; that error is a `Conflict` (retried), not an outage and not a bug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_is_a_conflict() {
    let (_pool, mut a, mut b) = scratch().await;
    a.execute("BEGIN").await.unwrap();
    b.execute("BEGIN").await.unwrap();
    a.execute("UPDATE scratch SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    b.execute("UPDATE scratch SET n = n + 1 WHERE id = 2")
        .await
        .unwrap();
    let (first, second) = tokio::join!(
        a.execute("UPDATE scratch SET n = n + 1 WHERE id = 2"),
        async {
            // Let A queue for row 2 first, so B's request closes the cycle.
            tokio::time::sleep(Duration::from_millis(200)).await;
            b.execute("UPDATE scratch SET n = n + 1 WHERE id = 1").await
        }
    );
    let victim = match (first, second) {
        (Err(err), Ok(_)) | (Ok(_), Err(err)) => err,
        other => panic!("expected one deadlock victim, got {other:?}"),
    };
    let number = victim
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|e| e.number());
    assert_eq!(number, Some(1213), "{victim}");
    assert_eq!(kind_of(victim), StoreErrorKind::Conflict);
    assert!(StoreError::new(StoreErrorKind::Conflict, "x").is_transient());
}

/// A real lock wait timeout (1205): the row stays locked past `innodb_lock_wait_timeout`. The
/// database is busy, not broken: `Unavailable` (503 with Retry-After).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_wait_timeout_is_unavailable() {
    let (_pool, mut a, mut b) = scratch().await;
    a.execute("BEGIN").await.unwrap();
    a.execute("UPDATE scratch SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    b.execute("SET SESSION innodb_lock_wait_timeout = 1")
        .await
        .unwrap();
    let err = b
        .execute("UPDATE scratch SET n = n + 1 WHERE id = 1")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("1205"), "{err}");
    assert_eq!(kind_of(err), StoreErrorKind::Unavailable);
}

/// Values the schema refuses (strict mode: data too long 1406, an incorrect integer 1366, out
/// of range 1264, a NULL in a NOT NULL column 1048) are errors in the request, never an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_values_are_backend_errors_not_outages() {
    let (pool, _a, _b) = scratch().await;
    for (statement, number) in [
        (
            "INSERT INTO scratch (id, n, code) VALUES (10, 0, 'too long')",
            "1406",
        ),
        ("INSERT INTO scratch (id, n) VALUES (11, 'abc')", "1366"),
        (
            "INSERT INTO scratch (id, n) VALUES (12, 99999999999)",
            "1264",
        ),
        ("INSERT INTO scratch (id, n) VALUES (13, NULL)", "1048"),
    ] {
        let err = pool.execute(statement).await.unwrap_err();
        assert!(err.to_string().contains(number), "{statement}: {err}");
        let err = StoreError::from(err);
        assert_eq!(err.kind(), StoreErrorKind::Backend, "{statement}");
        assert!(!err.is_transient(), "{statement}");
    }
}

/// Through the layer: a claim that meets a row locked past the lock wait timeout answers 503
/// with Retry-After, and the handler does not run. The record is expired (so the claim must
/// write it) and another transaction holds it `FOR UPDATE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_record_past_the_lock_wait_timeout_is_a_503() {
    let options = fresh_mysql_database().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION innodb_lock_wait_timeout = 1")
                    .await?;
                Ok(())
            })
        })
        .connect_with(options.clone())
        .await
        .unwrap();
    let store = MySqlStore::new(pool.clone());
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/orders",
            post({
                let runs = runs.clone();
                move || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    StatusCode::CREATED
                }
            }),
        )
        .layer(Idempotency::new(store));
    let post_key = || {
        Request::post("/orders")
            .header("idempotency-key", "locked-1")
            .body(Body::from("{}"))
            .unwrap()
    };
    let first = app.clone().oneshot(post_key()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    pool.execute("UPDATE idempotency_records SET expires_at = 0")
        .await
        .unwrap();
    let mut holder = MySqlConnection::connect_with(&options).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute("SELECT * FROM idempotency_records FOR UPDATE")
        .await
        .unwrap();

    let locked = app.clone().oneshot(post_key()).await.unwrap();
    assert_eq!(locked.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(locked.headers().contains_key("retry-after"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran");

    holder.execute("ROLLBACK").await.unwrap();
    let after = app.clone().oneshot(post_key()).await.unwrap();
    assert_eq!(after.status(), StatusCode::CREATED);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the expired record is claimed afresh"
    );
}

/// A store whose table was never created answers an error no retry cures: 500, no Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_table_is_a_500_not_a_503() {
    let store = MySqlStore::new(fresh_mysql_pool(2, Isolation::RepeatableRead).await);
    let app = Router::new()
        .route("/orders", post(|| async { StatusCode::CREATED }))
        .layer(Idempotency::new(store));
    let request = Request::post("/orders")
        .header("idempotency-key", "k")
        .body(Body::from("{}"))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!response.headers().contains_key("retry-after"));
}
