//! Group commit in the SQL stores, against real databases: many requests share one statement
//! (PostgreSQL) or one transaction (SQLite), and each still gets exactly the outcome it would get
//! alone. Duplicates inside one batch, a batch mixing every outcome, a thousand requests over a
//! hundred keys through the layer (one store, and two instances on one database), and a
//! connection cut in the middle of a batch.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{body::Body, extract::State, routing::post, Router};
use fault_proxy::{CutPoint, FaultProxy};
use futures_util::future::join_all;
use http::{Request, StatusCode};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    Sqlite,
};
use tower::ServiceExt;
use tower_idempotency::{
    store::{
        postgres::PostgresStore, sqlite::SqliteStore, BatchStats, Batching, ClaimOutcome, Hold,
        Store, StoreErrorKind,
    },
    Idempotency, IdempotencyKey, IdempotencyTransaction, REPLAYED_HEADER,
};
use tower_idempotency_tests::{
    contract::{
        bounded, claim_of, claimed, random_key, response, retry_of, retry_with_lease, DAY, LONG,
    },
    fresh_postgres_database, fresh_postgres_pool, fresh_sqlite_path, fresh_sqlite_pool,
    sqlite_pool,
};

/// A fresh, migrated PostgreSQL database behind a fault proxy: the proxy, a pool that reaches
/// the database directly (to look at what the store wrote), and the options that reach it
/// through the proxy.
async fn migrated_behind_a_proxy() -> (FaultProxy, sqlx::PgPool, PgConnectOptions) {
    let options = fresh_postgres_database().await;
    let target = tokio::net::lookup_host(format!("{}:{}", options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = FaultProxy::start(target).await.unwrap();
    let direct = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.clone())
        .await
        .unwrap();
    PostgresStore::new(direct.clone()).migrate().await.unwrap();
    let through_proxy = options.host("127.0.0.1").port(proxy.addr().port());
    (proxy, direct, through_proxy)
}

/// [`migrated_behind_a_proxy`] with a store on it: the proxy, the direct pool, and a store whose
/// pool (four connections, opened on demand) and batches go through the proxy.
async fn a_store_behind_a_proxy(batching: Batching) -> (FaultProxy, sqlx::PgPool, PostgresStore) {
    let (proxy, direct, through_proxy) = migrated_behind_a_proxy().await;
    let proxied = PgPoolOptions::new()
        .max_connections(4)
        .connect_lazy_with(through_proxy);
    (
        proxy,
        direct,
        PostgresStore::with_batching(proxied, batching),
    )
}

/// A store whose batch statistics the tests read.
trait Batched: Store + Clone {
    fn batch_stats(&self) -> BatchStats;
    /// Whether a claim answered by a committed record is read outside the batch (SQLite reads
    /// replays, duplicates in flight and mismatches without the write lock).
    const READS_OUTSIDE_THE_BATCH: bool;
    /// Whether the application's pool the store was given is closed.
    fn pool_is_closed(&self) -> bool;
}

impl Batched for PostgresStore {
    fn batch_stats(&self) -> BatchStats {
        self.batch_stats()
    }
    const READS_OUTSIDE_THE_BATCH: bool = false;
    fn pool_is_closed(&self) -> bool {
        self.pool().is_closed()
    }
}

impl Batched for SqliteStore {
    fn batch_stats(&self) -> BatchStats {
        self.batch_stats()
    }
    const READS_OUTSIDE_THE_BATCH: bool = true;
    fn pool_is_closed(&self) -> bool {
        self.pool().is_closed()
    }
}

async fn postgres() -> PostgresStore {
    let store = PostgresStore::new(fresh_postgres_pool(16).await);
    store.migrate().await.expect("migrate");
    store
}

async fn sqlite() -> SqliteStore {
    let store = SqliteStore::new(fresh_sqlite_pool(8).await);
    store.migrate().await.expect("migrate");
    store
}

const SHORT: Duration = Duration::from_millis(300);

/// One batch holding every outcome a claim can have, and two pairs of entries for one key.
async fn one_batch_answers_every_outcome<S: Batched>(store: S) {
    let done = claim_of(random_key(), "done", LONG, DAY);
    let running = claim_of(random_key(), "running", LONG, DAY);
    let bound = claim_of(random_key(), "bound", LONG, DAY);
    let expired = claim_of(random_key(), "expired", SHORT / 2, SHORT);
    let stale = claim_of(random_key(), "stale", SHORT, DAY);
    for setup in [&done, &running, &bound, &expired, &stale] {
        assert_eq!(store.claim(setup).await.unwrap(), claimed(false));
    }
    let saved = response();
    assert!(store
        .complete(&done.hold(), &saved)
        .await
        .unwrap()
        .applied());
    // Sleep: the passing of the lease and of the retention is what is tested.
    tokio::time::sleep(SHORT + Duration::from_millis(200)).await;

    let fresh = claim_of(random_key(), "fresh", LONG, DAY);
    let twin = claim_of(random_key(), "twin", LONG, DAY);
    let rival = claim_of(random_key(), "rival", LONG, DAY);
    let batch = vec![
        retry_of(&done),
        retry_of(&running),
        claim_of(bound.key, "another body", LONG, DAY),
        claim_of(expired.key, "a new request", LONG, DAY),
        retry_with_lease(&stale, LONG),
        fresh.clone(),
        twin.clone(),
        retry_of(&twin),
        rival.clone(),
        claim_of(rival.key, "another body", LONG, DAY),
    ];
    let before = Batched::batch_stats(&store);
    // Polled in order in one task of a current-thread runtime: every claim is queued before
    // the batch driver runs, so they share one batch.
    let outcomes: Vec<ClaimOutcome> = join_all(batch.iter().map(|claim| store.claim(claim)))
        .await
        .into_iter()
        .map(|outcome| outcome.expect("claim"))
        .collect();
    let shared = Batched::batch_stats(&store) - before;
    assert_eq!(outcomes[0], ClaimOutcome::Done(saved));
    assert!(
        matches!(outcomes[1], ClaimOutcome::InFlight { lease_remaining } if lease_remaining > Duration::ZERO)
    );
    assert_eq!(outcomes[2], ClaimOutcome::Mismatch);
    assert_eq!(
        outcomes[3],
        claimed(false),
        "an expired record is claimed afresh"
    );
    assert_eq!(outcomes[4], claimed(true), "a lapsed lease is taken over");
    assert_eq!(outcomes[5], claimed(false));
    // Two entries for one key: one claims. On PostgreSQL the first in the batch (the order of
    // arrival); on SQLite whichever read came back first.
    let twins = [&outcomes[6], &outcomes[7]];
    let holder = twins
        .iter()
        .position(|outcome| **outcome == claimed(false))
        .expect("one of two twins claims");
    assert!(
        matches!(twins[1 - holder], ClaimOutcome::InFlight { lease_remaining } if *lease_remaining > LONG / 2),
        "the other twin is in flight behind the first: {twins:?}"
    );
    let rivals = [&outcomes[8], &outcomes[9]];
    assert!(
        rivals.contains(&&claimed(false)) && rivals.contains(&&ClaimOutcome::Mismatch),
        "of two bodies for one key, one claims and the other is refused: {rivals:?}"
    );
    if !S::READS_OUTSIDE_THE_BATCH {
        assert_eq!(holder, 0, "the first twin in the batch claims");
        assert_eq!(
            outcomes[8],
            claimed(false),
            "the first rival in the batch claims"
        );
    }
    if S::READS_OUTSIDE_THE_BATCH {
        // Each claim reads first, and its read's answer decides when it queues: the seven that
        // need the write lock (expired, stale, fresh, both twins, both rivals) share batches as
        // their reads come back. A second twin or rival whose read comes back after the first's
        // batch committed is answered by its read, without the write lock: 5 to 7, never the
        // three that a committed record answers.
        assert!((5..=7).contains(&shared.entries), "{shared:?}");
    } else {
        assert_eq!(
            shared,
            BatchStats {
                batches: 1,
                entries: 10
            },
            "the claims did not share one batch"
        );
    }

    // Fencing holds per entry: saves of one batch, one with a stale token.
    let saves = [
        fresh.hold(),
        Hold::new(twin.key, batch[6 + holder].token),
        stale.hold(),
    ];
    let answer = response();
    let fenced: Vec<_> = join_all(saves.iter().map(|hold| store.complete(hold, &answer)))
        .await
        .into_iter()
        .map(|fenced| fenced.expect("complete").applied())
        .collect();
    assert_eq!(fenced, [true, true, false], "only the holders' saves apply");
}

#[tokio::test]
async fn postgres_one_batch_answers_every_outcome() {
    bounded(
        "the mixed batch",
        one_batch_answers_every_outcome(postgres().await),
    )
    .await;
}

#[tokio::test]
async fn sqlite_one_batch_answers_every_outcome() {
    bounded(
        "the mixed batch",
        one_batch_answers_every_outcome(sqlite().await),
    )
    .await;
}

/// Claims and saves of concurrent requests share one statement on PostgreSQL. A save and a
/// retry of its key in one batch: the save runs first, and the retry is answered the saved
/// response, as a retry arriving just after the save would be. Fencing holds per save.
#[tokio::test]
async fn postgres_claims_and_saves_share_one_batch() {
    bounded("the batch of claims and saves", async {
        let store = postgres().await;
        let saving = claim_of(random_key(), "saving", LONG, DAY);
        let held = claim_of(random_key(), "held", LONG, DAY);
        for setup in [&saving, &held] {
            assert_eq!(store.claim(setup).await.unwrap(), claimed(false));
        }
        let fresh = claim_of(random_key(), "fresh", LONG, DAY);
        let answer = response();
        let retry = retry_of(&saving);
        let before = store.batch_stats();
        // One task of a current-thread runtime: every operation is queued before the batch
        // driver runs, so they share one batch.
        let (holder, stale) = (saving.hold(), Hold::new(held.key, fresh.token));
        let (saves, claims) = tokio::join!(
            join_all([
                store.complete(&holder, &answer),
                store.complete(&stale, &answer),
            ]),
            join_all([store.claim(&retry), store.claim(&fresh)]),
        );
        let shared = store.batch_stats() - before;
        let saves: Vec<bool> = saves.into_iter().map(|s| s.unwrap().applied()).collect();
        assert_eq!(saves, [true, false], "only the holder's save applies");
        assert_eq!(claims[0].as_ref().unwrap(), &ClaimOutcome::Done(answer));
        assert_eq!(claims[1].as_ref().unwrap(), &claimed(false));
        assert_eq!(
            shared,
            BatchStats {
                batches: 1,
                entries: 4
            },
            "the claims and saves did not share one batch"
        );
        assert!(
            matches!(
                store.claim(&retry_of(&held)).await.unwrap(),
                ClaimOutcome::InFlight { .. }
            ),
            "the fenced-out save left the record running"
        );
    })
    .await;
}

/// A run's save and a renewal of its lease (the heartbeat) queued at once, and two renewals
/// of one run: each gets its own answer (whether they share a batch depends on which arrives
/// first: a batch is what queued while the one before ran), the save applies, the run's renewal
/// applies or, after the save, finds the record done, and a retry replays the answer.
async fn a_run_s_save_and_renewals_at_once<S: Batched>(store: S) {
    let run = claim_of(random_key(), "run", LONG, DAY);
    assert_eq!(store.claim(&run).await.unwrap(), claimed(false));
    let other = claim_of(random_key(), "other", LONG, DAY);
    assert_eq!(store.claim(&other).await.unwrap(), claimed(false));
    let answer = response();
    let (run_hold, other_hold) = (run.hold(), other.hold());
    let (saved, renewed, twice) = tokio::join!(
        store.complete(&run_hold, &answer),
        store.renew(&run_hold, LONG),
        join_all([
            store.renew(&other_hold, LONG),
            store.renew(&other_hold, LONG),
        ]),
    );
    assert!(saved.expect("the save").applied());
    renewed.expect("the renewal is answered");
    for renewal in twice {
        assert!(renewal.expect("a renewal").applied());
    }
    assert_eq!(
        store.claim(&retry_of(&run)).await.unwrap(),
        ClaimOutcome::Done(answer)
    );
}

#[tokio::test]
async fn postgres_a_run_s_save_and_renewals_at_once() {
    bounded(
        "the save and the renewals",
        a_run_s_save_and_renewals_at_once(postgres().await),
    )
    .await;
}

#[tokio::test]
async fn sqlite_a_run_s_save_and_renewals_at_once() {
    bounded(
        "the save and the renewals",
        a_run_s_save_and_renewals_at_once(sqlite().await),
    )
    .await;
}

/// Executions of the handler, by key.
#[derive(Clone, Default)]
struct Executions(Arc<Mutex<HashMap<String, usize>>>);

async fn create(State(executions): State<Executions>, key: IdempotencyKey) -> (StatusCode, String) {
    let mut executions = executions.0.lock().unwrap();
    *executions.entry(key.as_str().to_owned()).or_default() += 1;
    (StatusCode::CREATED, format!("order for {}", key.as_str()))
}

fn app<S: Store>(store: S, executions: Executions) -> Router {
    Router::new()
        .route("/orders", post(create))
        .route_layer(Idempotency::new(store))
        .with_state(executions)
}

/// 1,000 concurrent requests over 100 keys, spread over `apps` (instances on one database):
/// exactly one execution per key, and every other request is a replay of that answer or 409.
async fn a_thousand_requests_over_a_hundred_keys<S: Batched>(stores: Vec<S>) {
    let executions = Executions::default();
    let apps: Vec<Router> = stores
        .iter()
        .map(|store| app(store.clone(), executions.clone()))
        .collect();
    let before: Vec<BatchStats> = stores.iter().map(Batched::batch_stats).collect();
    assert_eq!(
        a_thousand_requests(apps).await,
        100,
        "one first answer per key"
    );
    let executions = executions.0.lock().unwrap();
    assert_eq!(executions.len(), 100, "every key ran");
    assert!(
        executions.values().all(|&n| n == 1),
        "a key ran twice: {executions:?}"
    );
    let shared: Vec<BatchStats> = stores
        .iter()
        .zip(before)
        .map(|(store, before)| Batched::batch_stats(store) - before)
        .collect();
    assert!(
        shared.iter().any(|stats| stats.mean_batch() > 1.0),
        "no operations shared a batch: {shared:?}"
    );
}

/// 1,000 concurrent requests over 100 keys, spread over `apps`: each answer is 201 with its
/// key's body, or 409. Returns how many 201s were first answers (not replays).
async fn a_thousand_requests(apps: Vec<Router>) -> usize {
    let start = Arc::new(tokio::sync::Barrier::new(1000));
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            let start = start.clone();
            tokio::spawn(async move {
                let key = format!("key-{}", i % 100);
                let request = Request::post("/orders")
                    .header("idempotency-key", &key)
                    .header("content-type", "application/json")
                    .body(Body::from(r#"{"totalCents": 4000}"#))
                    .unwrap();
                start.wait().await;
                let response = app.oneshot(request).await.unwrap();
                let replayed = response.headers().contains_key(REPLAYED_HEADER);
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .unwrap();
                (key, status, replayed, body)
            })
        })
        .collect();
    let mut first_answers = 0;
    for task in tasks {
        let (key, status, replayed, body) = task.await.unwrap();
        match status {
            StatusCode::CREATED => {
                assert_eq!(body, format!("order for {key}"), "an answer of another key");
                if !replayed {
                    first_answers += 1;
                }
            }
            StatusCode::CONFLICT => {}
            other => panic!("{key}: unexpected {other}: {body:?}"),
        }
    }
    first_answers
}

/// The handler of transactional mode: the order is written in the layer's transaction.
async fn create_in_transaction(
    tx: IdempotencyTransaction<Sqlite>,
    key: IdempotencyKey,
) -> Result<(StatusCode, String), (StatusCode, String)> {
    let failed = |err: sqlx::Error| (StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    let mut tx = tx.begin().await.map_err(failed)?;
    sqlx::query("INSERT INTO orders (key) VALUES (?1)")
        .bind(key.as_str())
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    Ok((StatusCode::CREATED, format!("order for {}", key.as_str())))
}

/// 1,000 concurrent requests over 100 keys in transactional mode, spread over `stores`
/// (instances on one SQLite file): one order per key, and transactions that found the next
/// one waiting handed it the write lock.
async fn sqlite_transactions_over_a_hundred_keys(stores: Vec<SqliteStore>) {
    let pool = stores[0].pool().clone();
    sqlx::query("CREATE TABLE orders (key TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let apps = stores
        .iter()
        .map(|store| {
            Router::new()
                .route("/orders", post(create_in_transaction))
                .route_layer(Idempotency::new(store.clone()).transactional())
        })
        .collect();
    assert_eq!(
        a_thousand_requests(apps).await,
        100,
        "one first answer per key"
    );
    let orders: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, count(*) FROM orders GROUP BY key")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(orders.len(), 100, "every key ran");
    assert!(
        orders.iter().all(|(_, n)| *n == 1),
        "a key ran twice: {orders:?}"
    );
    let handed_over: u64 = stores
        .iter()
        .map(SqliteStore::transactions_handed_over)
        .sum();
    assert!(handed_over > 0, "no transaction was handed the write lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_transactions_hand_the_write_lock_on_and_run_each_key_once() {
    bounded(
        "1,000 transactional requests",
        sqlite_transactions_over_a_hundred_keys(vec![sqlite().await]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_two_instances_share_one_file_in_transactional_mode() {
    let path = fresh_sqlite_path("two_instances");
    let first = SqliteStore::new(sqlite_pool(&path, 8, Duration::from_secs(10)).await);
    first.migrate().await.expect("migrate");
    // A second instance: its own pool, its own writer queue, the same file.
    let second = SqliteStore::new(sqlite_pool(&path, 8, Duration::from_secs(10)).await);
    bounded(
        "1,000 transactional requests on two instances",
        sqlite_transactions_over_a_hundred_keys(vec![first, second]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_thousand_requests_over_a_hundred_keys() {
    bounded(
        "1,000 requests",
        a_thousand_requests_over_a_hundred_keys(vec![postgres().await]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_instances_share_one_database() {
    let pool = fresh_postgres_pool(16).await;
    let first = PostgresStore::new(pool.clone());
    first.migrate().await.expect("migrate");
    // A second instance: its own pool and its own batches, on the same database.
    let second = PostgresStore::new(
        PgPoolOptions::new()
            .max_connections(16)
            .connect_with(pool.connect_options().as_ref().clone())
            .await
            .unwrap(),
    );
    bounded(
        "1,000 requests on two instances",
        a_thousand_requests_over_a_hundred_keys(vec![first, second]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_thousand_requests_over_a_hundred_keys() {
    bounded(
        "1,000 requests",
        a_thousand_requests_over_a_hundred_keys(vec![sqlite().await]),
    )
    .await;
}

/// A connection cut after the batch's claim reached the database and before its answer came
/// back: every request in the batch gets a transient error (the layer's 503), none is told it
/// holds the key, and the keys the database did claim are free again once their lease passes.
#[tokio::test]
async fn postgres_a_connection_cut_mid_batch_fails_every_entry_and_holds_no_key_past_its_lease() {
    let (proxy, direct, through_proxy) = migrated_behind_a_proxy().await;
    let proxied = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(through_proxy);
    let store = PostgresStore::new(proxied);
    let claims: Vec<_> = (0..20)
        .map(|n| claim_of(random_key(), &format!("cut {n}"), SHORT, DAY))
        .collect();
    // The first key's bytes travel in the batch's parameters.
    proxy.cut_at(claims[0].key.0.to_vec(), CutPoint::BeforeTheAnswer);
    let outcomes = bounded(
        "the cut batch",
        join_all(claims.iter().map(|claim| store.claim(claim))),
    )
    .await;
    assert_eq!(proxy.triggers_fired(), 1, "the cut never happened");
    for outcome in &outcomes {
        let err = outcome
            .as_ref()
            .expect_err("no entry of a cut batch may claim");
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err:?}");
        assert!(err.is_transient());
    }
    // One statement, so all or nothing: if it committed before the cut, the keys are held, by
    // nobody, for one lease.
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE state = 'running'")
            .fetch_one(&direct)
            .await
            .unwrap();
    assert!(
        held == 0 || held == 20,
        "a batch half applied: {held} of 20"
    );
    let lapsed = Instant::now() + SHORT + Duration::from_millis(100);
    tokio::time::sleep_until(lapsed.into()).await;
    for claim in &claims {
        assert_eq!(
            store
                .claim(&retry_of(claim))
                .await
                .expect("claim after the lease"),
            claimed(held == 20),
            "the key must be free once its lease has passed"
        );
    }
}

/// A batch whose connection's packets are lost hangs in the database; the requests queued
/// behind it wait for it. Each gets 503 with `Retry-After` at the layer's store timeout, none
/// runs its handler, and none leaves a claim behind: once the network is back, every key runs,
/// exactly once (a leaked claim would answer 409 until its lease passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_requests_queued_behind_a_hung_batch_get_503_and_leave_no_claim() {
    let batch_timeout = Duration::from_millis(600);
    let (proxy, direct, store) =
        a_store_behind_a_proxy(Batching::default().timeout(batch_timeout)).await;
    let executions = Executions::default();
    let app = Router::new()
        .route("/orders", post(create))
        .route_layer(Idempotency::new(store).with_store_timeout(Duration::from_millis(300)))
        .with_state(executions.clone());
    let send = |key: String| {
        let app = app.clone();
        async move {
            let request = Request::post("/orders")
                .header("idempotency-key", &key)
                .body(Body::empty())
                .unwrap();
            app.oneshot(request).await.unwrap()
        }
    };
    // One request first, so that the batches' connection is open and the hang is in the
    // database's conversation, not in the connection's handshake.
    assert_eq!(send("warm".into()).await.status(), StatusCode::CREATED);
    proxy.black_hole();
    let cut = tokio::time::Instant::now();
    let keys: Vec<String> = (0..8).map(|n| format!("hung-{n}")).collect();
    let answers = bounded("the requests behind the hung batch", async {
        join_all(keys.iter().cloned().map(send)).await
    })
    .await;
    for answer in &answers {
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(answer.headers().contains_key("retry-after"));
    }
    assert_eq!(executions.0.lock().unwrap().len(), 1, "a handler ran");
    proxy.restore();
    // Counted once the hung batch is past its timeout and abandoned: a statement of it that
    // still reached the database would have written its claims by then.
    tokio::time::sleep_until(cut + batch_timeout * 2).await;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE state = 'running'")
            .fetch_one(&direct)
            .await
            .unwrap();
    assert_eq!(held, 0, "a claim was left behind");
    bounded("the retries", async {
        for key in &keys {
            loop {
                match send(key.clone()).await.status() {
                    StatusCode::CREATED => break,
                    // The first retries may still meet the cut connections of the black hole.
                    StatusCode::SERVICE_UNAVAILABLE => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("{key}: {other}, so a claim was left behind"),
                }
            }
        }
    })
    .await;
    let executions = executions.0.lock().unwrap();
    assert_eq!(executions.len(), keys.len() + 1);
    assert!(executions.values().all(|&n| n == 1), "{executions:?}");
}

/// Twenty claims of one key in one batch cost one statement, not twenty: the first claims, the
/// rest are answered as duplicates of it (in flight), and twenty retries of the saved answer
/// likewise share one read. Counted on the wire, through a proxy.
#[tokio::test]
async fn postgres_many_claims_of_one_key_share_one_statement() {
    let (proxy, _, through_proxy) = migrated_behind_a_proxy().await;
    let proxied = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(through_proxy);
    let store = PostgresStore::new(proxied);
    // Opens the batch connection, so the counts below are statements only.
    let warm = claim_of(random_key(), "warm", LONG, DAY);
    assert_eq!(store.claim(&warm).await.unwrap(), claimed(false));

    let hot = claim_of(random_key(), "hot", LONG, DAY);
    let claims: Vec<_> = (0..20).map(|_| retry_of(&hot)).collect();
    let before = proxy.traffic();
    let outcomes = bounded("twenty claims of one key", async {
        join_all(claims.iter().map(|claim| store.claim(claim))).await
    })
    .await;
    let used = proxy.traffic().since(before);
    let claimed_once = outcomes
        .iter()
        .filter(|outcome| *outcome.as_ref().unwrap() == claimed(false))
        .count();
    assert_eq!(claimed_once, 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|outcome| matches!(
        outcome.as_ref().unwrap(),
        ClaimOutcome::Claimed { .. } | ClaimOutcome::InFlight { .. }
    )));
    // One statement (its connection is kept for the next batch, unpinged); one per claim
    // would be 20.
    assert!(
        used.round_trips <= 4,
        "twenty claims of one key took {} round trips",
        used.round_trips
    );

    let holder = &claims[outcomes
        .iter()
        .position(|outcome| *outcome.as_ref().unwrap() == claimed(false))
        .unwrap()];
    let answer = response();
    assert!(store
        .complete(&holder.hold(), &answer)
        .await
        .unwrap()
        .applied());
    let before = proxy.traffic();
    let replays = bounded("twenty replays of one key", async {
        join_all(claims.iter().map(|claim| store.claim(claim))).await
    })
    .await;
    let used = proxy.traffic().since(before);
    for replay in replays {
        assert_eq!(replay.unwrap(), ClaimOutcome::Done(answer.clone()));
    }
    assert!(
        used.round_trips <= 4,
        "twenty replays of one key took {} round trips",
        used.round_trips
    );
}

/// A batch's connection goes to the next batch without the ping sqlx sends when a connection
/// goes back to its pool: ten claims and their saves one after another, each its own batch,
/// cost twenty round trips, not forty. Counted on the wire, through a proxy.
#[tokio::test]
async fn postgres_back_to_back_batches_reuse_their_connection_unpinged() {
    let (proxy, _, store) = a_store_behind_a_proxy(Batching::default()).await;
    // Opens the batch connection, so the counts below are statements only.
    let warm = claim_of(random_key(), "warm", LONG, DAY);
    assert_eq!(store.claim(&warm).await.unwrap(), claimed(false));

    let before = proxy.traffic();
    claims_and_saves_one_after_another(&store, 10).await;
    let used = proxy.traffic().since(before);
    assert!(
        used.round_trips <= 22,
        "ten claims and ten saves, one batch each, took {} round trips",
        used.round_trips
    );
}

/// `close` closes the batches' own connections: PostgreSQL sees them go, a claim after it is
/// refused as unavailable (503), and the application's pool is left open.
#[tokio::test]
async fn postgres_close_closes_the_batch_connections_and_leaves_the_pool_open() {
    let store = postgres().await;
    a_claim_before_close(&store).await;
    let batch_connections = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND query LIKE '%un' || 'nest($1%'",
        )
        .fetch_one(store.pool())
        .await
        .expect("count the batch connections")
    };
    // Split in two above, so that this count's own text is not a batch statement's.
    assert!(
        batch_connections().await > 0,
        "the claim ran on no batch connection"
    );
    bounded("close", store.close()).await;
    bounded("the batch connections going", async {
        while batch_connections().await > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    a_claim_after_close_is_refused_and_the_pool_stays_open(&store).await;
}

/// `n` fresh keys claimed and saved one after another, each claim and save a batch of its own.
async fn claims_and_saves_one_after_another<S: Batched>(store: &S, n: usize) {
    for n in 0..n {
        let claim = claim_of(random_key(), &format!("one after another {n}"), LONG, DAY);
        assert_eq!(
            bounded("a claim", store.claim(&claim)).await.unwrap(),
            claimed(false)
        );
        let saved = bounded("a save", store.complete(&claim.hold(), &response())).await;
        assert!(saved.unwrap().applied());
    }
}

async fn a_claim_before_close<S: Batched>(store: &S) {
    let first = claim_of(random_key(), "before", LONG, DAY);
    assert_eq!(
        store.claim(&first).await.expect("a claim before close"),
        claimed(false)
    );
}

/// A claim after `close` is refused as unavailable (503), and the application's pool is open.
async fn a_claim_after_close_is_refused_and_the_pool_stays_open<S: Batched>(store: &S) {
    let after = claim_of(random_key(), "after", LONG, DAY);
    let refused = store.claim(&after).await.expect_err("a claim after close");
    assert_eq!(refused.kind(), StoreErrorKind::Unavailable, "{refused}");
    assert!(
        !store.pool_is_closed(),
        "the application's pool is the application's"
    );
}

/// A cut network leaves every idle batch connection dead. The first batch after the cut finds
/// one and fails (503 for its requests); the batches after it ping the connections that were
/// idle since and open live ones, so one outage costs one failed batch, not one per pooled
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_after_a_cut_one_batch_fails_and_the_next_ones_reconnect() {
    let (proxy, _, store) = a_store_behind_a_proxy(Batching::default().pipeline(4)).await;
    for _ in 0..20 {
        if proxy.open_connections() >= 3 {
            break;
        }
        let claims: Vec<_> = (0..64)
            .map(|n| claim_of(random_key(), &format!("warm {n}"), LONG, DAY))
            .collect();
        for outcome in bounded("warm-up", join_all(claims.iter().map(|c| store.claim(c)))).await {
            outcome.expect("a claim before the cut");
        }
    }
    let idle = proxy.open_connections();
    // Two dead connections are enough to tell: without the pings, each fails a batch.
    assert!(idle >= 2, "only {idle} batch connections opened");

    proxy.cut_all_and_wait().await;
    let mut failed = 0;
    for n in 0..idle + 2 {
        let claim = claim_of(random_key(), &format!("after the cut {n}"), LONG, DAY);
        match bounded("a claim after the cut", store.claim(&claim)).await {
            Ok(outcome) => assert_eq!(outcome, claimed(false)),
            Err(err) => {
                assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err:?}");
                failed += 1;
            }
        }
    }
    assert!(
        failed <= 1,
        "{failed} claims failed after one cut, with {idle} connections idle at the cut"
    );
}

/// `close` closes the SQLite batches' own connections: a claim after it is refused as
/// unavailable (503), and the application's pool is left open.
#[tokio::test]
async fn sqlite_close_closes_the_batch_connections_and_leaves_the_pool_open() {
    let store = sqlite().await;
    a_claim_before_close(&store).await;
    bounded("close", store.close()).await;
    a_claim_after_close_is_refused_and_the_pool_stays_open(&store).await;
}

/// The batches' connections do not checkpoint the WAL in their `COMMIT` (it would hold the
/// writer queue through the disk's `fsync`); the store checkpoints it itself, so the log stays
/// small even when the store is the file's only writer. Three thousand claims and saves one
/// after another (six thousand commits, each a few pages) would leave a log of tens of
/// megabytes without a checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_wal_stays_bounded_when_the_store_is_its_only_writer() {
    let path = tower_idempotency_tests::fresh_sqlite_path("wal");
    let pool = tower_idempotency_tests::sqlite_pool(&path, 4, Duration::from_secs(10)).await;
    let store = SqliteStore::new(pool);
    store.migrate().await.expect("migrate");
    claims_and_saves_one_after_another(&store, 3_000).await;
    let mut wal = path.into_os_string();
    wal.push("-wal");
    let size = std::fs::metadata(&wal).expect("the WAL file").len();
    assert!(
        size < 8 * 1024 * 1024,
        "the WAL grew to {size} bytes over 6,000 commits"
    );
}

/// A SQLite write batch that times out while its `BEGIN IMMEDIATE` waits for another writer
/// must not leave its connection inside that transaction: the statement list stops at the first
/// result nobody reads, and a connection back in the pool with the transaction open would hold
/// the file's write lock from every other writer (the application's, other processes') until
/// something happened to reuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_write_batch_that_times_out_leaves_the_write_lock_free() {
    use sqlx::{sqlite::SqliteConnectOptions, ConnectOptions, Connection};
    let path = tower_idempotency_tests::fresh_sqlite_path("timed_out_batch");
    let pool = tower_idempotency_tests::sqlite_pool(&path, 4, Duration::from_secs(10)).await;
    let store = SqliteStore::with_batching(pool, Batching::default().timeout(SHORT));
    store.migrate().await.expect("migrate");
    let writer_options = SqliteConnectOptions::new()
        .filename(&path)
        .busy_timeout(Duration::from_millis(500));
    let other_writer = || writer_options.connect();
    // A first claim opens the batches' connection, so the one below waits on the lock itself.
    let warm_up = claim_of(random_key(), "first", LONG, DAY);
    assert_eq!(store.claim(&warm_up).await.unwrap(), claimed(false));

    let mut holder = other_writer().await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let claim = claim_of(random_key(), "behind a held lock", LONG, DAY);
    let refused = bounded("the timed-out claim", store.claim(&claim)).await;
    assert_eq!(
        refused
            .expect_err("the lock is held past the batch's timeout")
            .kind(),
        StoreErrorKind::Unavailable
    );
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    holder.close().await.unwrap();

    // The abandoned `BEGIN IMMEDIATE` takes the lock at its busy handler's next try once the
    // lock is free (within 100 ms); what matters is that it lets it go again. Over a second and
    // a half, another writer gets the lock within its busy timeout every time. Sleep: the time
    // that passes between the attempts is what gives the abandoned statement its chance.
    for attempt in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut writer = other_writer().await.unwrap();
        let began = sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut writer).await;
        assert!(
            began.is_ok(),
            "attempt {attempt}: the write lock is still held: {began:?}"
        );
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut writer)
            .await
            .unwrap();
        writer.close().await.unwrap();
    }
    // And the store still claims.
    assert_eq!(
        store.claim(&retry_of(&claim)).await.expect("a claim after"),
        claimed(false)
    );
}

/// A PostgreSQL batch runs in rounds, each its own statement that commits on its own: one claim
/// per key a round, so a second body for a key waits for the next round. When the connection is
/// cut in a later round, what the earlier rounds committed stands: those claims are answered as
/// claimed (their requests hold the keys and run), and only the entries still unanswered get
/// 503. Were they all refused, the committed claims would be held by nobody until their leases
/// passed, and their own retries would meet them as in flight.
#[tokio::test]
async fn postgres_a_batch_cut_in_a_later_round_keeps_what_the_earlier_rounds_committed() {
    bounded("the batch cut in its second round", async {
        let (proxy, _direct, store) = a_store_behind_a_proxy(Batching::default()).await;
        let fresh = claim_of(random_key(), "fresh", LONG, DAY);
        let first = claim_of(random_key(), "first body", LONG, DAY);
        let second = claim_of(first.key, "second body", LONG, DAY);
        // Only the second round's statement carries the second body's fingerprint.
        proxy.cut_at(second.fingerprint.0.to_vec(), CutPoint::BeforeSending);
        let batch = [&fresh, &first, &second];
        let outcomes = join_all(batch.iter().map(|claim| store.claim(claim))).await;
        assert_eq!(proxy.triggers_fired(), 1, "the cut never happened");
        assert_eq!(
            outcomes[0].as_ref().ok(),
            Some(&claimed(false)),
            "{outcomes:?}"
        );
        assert_eq!(
            outcomes[1].as_ref().ok(),
            Some(&claimed(false)),
            "{outcomes:?}"
        );
        let refused = outcomes[2].as_ref().expect_err("the cut round's entry");
        assert_eq!(refused.kind(), StoreErrorKind::Unavailable, "{refused:?}");

        // The claims answered are held by their requests, and the refused one, retried, meets
        // the first body's claim.
        let answer = response();
        for holder in [&fresh, &first] {
            let saved = store.complete(&holder.hold(), &answer).await.expect("save");
            assert!(saved.applied(), "the holder's save applies");
        }
        assert_eq!(
            store.claim(&retry_of(&second)).await.expect("the retry"),
            ClaimOutcome::Mismatch
        );
    })
    .await;
}

/// A release that committed keeps its answer when the notification of its waiters fails after
/// it: the record is gone, so the release is `Applied`, not a store error (the waiters find the
/// change at their next poll).
#[tokio::test]
async fn postgres_a_release_committed_before_its_notification_failed_is_applied() {
    let (proxy, direct, store) = a_store_behind_a_proxy(Batching::default()).await;
    let claim = claim_of(random_key(), "watched", LONG, DAY);
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
    // A waiter would have marked it: the release then notifies.
    sqlx::query("UPDATE idempotency_records SET watched = true WHERE key = $1")
        .bind(claim.key.0.to_vec())
        .execute(&direct)
        .await
        .unwrap();
    proxy.cut_at("pg_notify", CutPoint::BeforeSending);
    let released = bounded("the release", store.release(&claim.hold())).await;
    assert_eq!(proxy.triggers_fired(), 1, "no notification was sent");
    assert_eq!(
        released.expect("the committed release keeps its answer"),
        tower_idempotency::store::Fenced::Applied
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE key = $1")
        .bind(claim.key.0.to_vec())
        .fetch_one(&direct)
        .await
        .unwrap();
    assert_eq!(left, 0, "the release committed");
}
