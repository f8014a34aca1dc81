//! What only the MySQL store does, against the real server at `MYSQL_URL` (MariaDB 10.11 in
//! CI): the claim's outcome travels in the insert id, the claims' reads are batched, and MySQL's
//! error numbers are sorted into the store's error kinds, from errors the server really raises
//! (a deadlock, a lock wait timeout, a value too long). The contract every store shares is in
//! `store_contract.rs`, run there at READ COMMITTED and REPEATABLE READ.
//!
//! Run with `MYSQL_URL` set (see `scripts/test.sh`).

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use axum::{body::Body, routing::post, Router};
use futures_util::future::join_all;
use http::{Request, StatusCode};
use sqlx::{mysql::MySqlPoolOptions, Connection, Executor, MySqlConnection, MySqlPool};
use tower::ServiceExt;
use tower_idempotency::{
    store::{
        mysql::MySqlStore, BatchStats, Batching, Claim, ClaimOutcome, Hold, Store, StoreError,
        StoreErrorKind,
    },
    Idempotency, KeyHash,
};
use tower_idempotency_tests::{
    contract::{
        bounded, claim_of, claimed, random_key, response, retry_of, retry_with_lease, until, DAY,
        LONG, MARGIN,
    },
    counted_orders, fresh_mysql_database, fresh_mysql_pool, Isolation,
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

/// Expire the record of `key` now, without waiting for its retention.
const EXPIRE: &str = "UPDATE idempotency_records SET expires_at = 0 WHERE `key` = ?";
/// Let the lease of the record of `key` lapse now, without waiting for it.
const LAPSE: &str = "UPDATE idempotency_records SET lease_until = 0 WHERE `key` = ?";

async fn set_to_zero(pool: &MySqlPool, statement: &'static str, key: &KeyHash) {
    let done = sqlx::query(statement)
        .bind(key.as_bytes().as_slice())
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(done.rows_affected(), 1, "{statement}");
}

/// Records in every state a claim's read tells apart: done (with the saved response), running,
/// running and bound to another body, expired, and running with a lapsed lease.
struct Records {
    done: Claim,
    running: Claim,
    bound: Claim,
    expired: Claim,
    stale: Claim,
}

async fn records(store: &MySqlStore) -> Records {
    let claim = |body| claim_of(random_key(), body, LONG, DAY);
    let records = Records {
        done: claim("done"),
        running: claim("running"),
        bound: claim("bound"),
        expired: claim("expired"),
        stale: claim("stale"),
    };
    let r = &records;
    for setup in [&r.done, &r.running, &r.bound, &r.expired, &r.stale] {
        assert_eq!(store.claim(setup).await.unwrap(), claimed(false));
    }
    let saved = store.complete(&r.done.hold(), &response()).await;
    assert!(saved.unwrap().applied());
    set_to_zero(store.pool(), EXPIRE, &r.expired.key).await;
    set_to_zero(store.pool(), LAPSE, &r.stale.key).await;
    records
}

/// One read batch holding every outcome a claim's read decides, and claims of one key that
/// differ: each is judged by its own fingerprint. The first claim finds nothing queued and runs
/// its read alone, holding the read pipeline's one slot; the rest queue meanwhile and share the
/// next read (polled in order in one task of a current-thread runtime, they are all queued
/// before the first read's task runs). What the reads leave open is claimed as before.
#[tokio::test]
async fn one_read_batch_answers_every_outcome() {
    bounded("the mixed read batch", async {
        // No gap locks: the claims the read leaves open cannot deadlock each other.
        let store = MySqlStore::new(fresh_mysql_pool(8, Isolation::ReadCommitted).await);
        store.migrate().await.unwrap();
        let Records {
            done,
            running,
            bound,
            expired,
            stale,
        } = records(&store).await;
        let twin = claim_of(random_key(), "twin", LONG, DAY);
        let rival = claim_of(random_key(), "rival", LONG, DAY);
        let claims = [
            claim_of(random_key(), "alone", LONG, DAY),
            retry_of(&done),
            claim_of(done.key, "another body", LONG, DAY),
            retry_of(&running),
            retry_of(&running),
            claim_of(bound.key, "another body", LONG, DAY),
            claim_of(expired.key, "a new request", LONG, DAY),
            retry_of(&stale),
            claim_of(random_key(), "fresh", LONG, DAY),
            twin.clone(),
            retry_of(&twin),
            rival.clone(),
            claim_of(rival.key, "another body", LONG, DAY),
        ];
        let before = store.batch_stats();
        let outcomes: Vec<ClaimOutcome> = join_all(claims.iter().map(|claim| store.claim(claim)))
            .await
            .into_iter()
            .map(|outcome| outcome.expect("claim"))
            .collect();
        let reads = store.batch_stats() - before;
        assert_eq!(
            reads,
            BatchStats {
                batches: 2,
                entries: 13
            },
            "one read alone, then one for the rest"
        );
        assert_every_outcome(&outcomes);
    })
    .await;
}

/// The outcomes of [`one_read_batch_answers_every_outcome`]'s claims, in order.
fn assert_every_outcome(outcomes: &[ClaimOutcome]) {
    let in_flight = |outcome: &ClaimOutcome| matches!(outcome, ClaimOutcome::InFlight { lease_remaining } if *lease_remaining > LONG / 2);
    assert_eq!(outcomes[0], claimed(false), "the lone claim");
    assert_eq!(
        outcomes[1],
        ClaimOutcome::Done(response()),
        "the retry replays"
    );
    assert_eq!(
        outcomes[2],
        ClaimOutcome::Mismatch,
        "another body for a done key"
    );
    assert!(
        in_flight(&outcomes[3]) && in_flight(&outcomes[4]),
        "{:?}",
        &outcomes[3..5]
    );
    assert_eq!(
        outcomes[5],
        ClaimOutcome::Mismatch,
        "another body for a running key"
    );
    assert_eq!(
        outcomes[6],
        claimed(false),
        "an expired record is claimed afresh"
    );
    assert_eq!(outcomes[7], claimed(true), "a lapsed lease is taken over");
    assert_eq!(outcomes[8], claimed(false), "a new key");
    let twins = &outcomes[9..11];
    assert!(
        twins.contains(&claimed(false)) && twins.iter().any(in_flight),
        "of two claims of one new key, one claims and the other is in flight: {twins:?}"
    );
    let rivals = &outcomes[11..13];
    assert!(
        rivals.contains(&claimed(false)) && rivals.contains(&ClaimOutcome::Mismatch),
        "of two bodies for one new key, one claims and the other is refused: {rivals:?}"
    );
}

/// Many concurrent claims over few keys, at both isolation levels, on a small pool (reads and
/// writes wait for connections): exactly one claim per key wins, the reads share batches, and
/// once the winners saved, every claim of the same round replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_claims_of_few_keys_have_one_winner_per_key() {
    for isolation in [Isolation::ReadCommitted, Isolation::RepeatableRead] {
        let store = Arc::new(MySqlStore::with_batching(
            fresh_mysql_pool(4, isolation).await,
            Batching::default(),
        ));
        store.migrate().await.unwrap();
        let keys: Vec<Claim> = (0..5)
            .map(|_| claim_of(random_key(), "hot", LONG, DAY))
            .collect();
        let claims: Vec<Claim> = (0..200).map(|i| retry_of(&keys[i % keys.len()])).collect();
        let before = store.batch_stats();
        let outcomes = bounded("200 claims", claim_at_once(&store, &claims)).await;
        let reads = store.batch_stats() - before;
        assert!(
            reads.mean_batch() > 1.0,
            "{isolation:?}: no reads shared a batch: {reads:?}"
        );
        for key in &keys {
            let winner = the_one_winner(key, &claims, &outcomes, isolation);
            let saved = store
                .complete(&Hold::new(key.key, winner.token), &response())
                .await;
            assert!(saved.unwrap().applied(), "{isolation:?}: the winner saves");
        }
        let replays = bounded("200 replays", claim_at_once(&store, &claims)).await;
        for replay in replays {
            assert_eq!(
                replay.expect("replay"),
                ClaimOutcome::Done(response()),
                "{isolation:?}"
            );
        }
    }
}

/// The one claim of `key`'s that won, every other claim of it in flight (or, at REPEATABLE
/// READ, a deadlock victim, which wrote nothing and which the layer retries).
fn the_one_winner<'a>(
    key: &Claim,
    claims: &'a [Claim],
    outcomes: &[Result<ClaimOutcome, StoreError>],
    isolation: Isolation,
) -> &'a Claim {
    let mut winners = Vec::new();
    for (claim, outcome) in claims.iter().zip(outcomes) {
        if claim.key != key.key {
            continue;
        }
        match outcome {
            Ok(ClaimOutcome::Claimed { taken_over: false }) => winners.push(claim),
            Ok(ClaimOutcome::InFlight { .. }) => {}
            Err(err) if err.kind() == StoreErrorKind::Conflict => {}
            other => panic!("{isolation:?}: unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "{isolation:?}: winners of one key");
    winners[0]
}

/// Run `claims` at once, each in a task of its own released by one barrier.
async fn claim_at_once(
    store: &Arc<MySqlStore>,
    claims: &[Claim],
) -> Vec<Result<ClaimOutcome, StoreError>> {
    let start = Arc::new(tokio::sync::Barrier::new(claims.len()));
    let tasks: Vec<_> = claims
        .iter()
        .map(|claim| {
            let (store, start, claim) = (store.clone(), start.clone(), claim.clone());
            tokio::spawn(async move {
                start.wait().await;
                store.claim(&claim).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await.expect("claim task"));
    }
    outcomes
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
    let (app, runs) = counted_orders(store);
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
