//! The PostgreSQL and SQLite stores against real databases: one suite, instantiated for each
//! backend by `sql_store_tests!`. Every test gets a fresh database (PostgreSQL at `DATABASE_URL`)
//! or a fresh SQLite file, and runs on a multi-thread runtime so races are real.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tower_idempotency::{
    store::{
        postgres::PostgresStore, sqlite::SqliteStore, Claim, ClaimOutcome, Fenced, FencingToken,
        Store, StoreError, StoredResponse, TransactionalStore,
    },
    Fingerprint, KeyHash,
};
use tower_idempotency_tests::{fresh_postgres_pool, fresh_sqlite_pool};

const LONG: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// What the suite needs from a backend beyond the [`Store`] traits.
trait Backend: TransactionalStore + Clone + Sized {
    /// A migrated store on a fresh database, with a pool of `connections`.
    async fn fresh(connections: u32) -> Self;
    /// Whether a table of that name exists.
    async fn table_exists(&self, name: &str) -> bool;
    /// The raw `expires_at` of a record, as text.
    async fn expires_at(&self, key: &KeyHash) -> String;
    /// The store's own `migrate`.
    fn run_migrations(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl Backend for PostgresStore {
    fn run_migrations(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.migrate()
    }

    async fn fresh(connections: u32) -> Self {
        let store = PostgresStore::new(fresh_postgres_pool(connections).await);
        store.run_migrations().await.expect("migrate");
        store
    }

    async fn table_exists(&self, name: &str) -> bool {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)",
        )
        .bind(name)
        .fetch_one(self.pool())
        .await
        .expect("query pg_tables")
    }

    async fn expires_at(&self, key: &KeyHash) -> String {
        sqlx::query_scalar("SELECT expires_at::text FROM idempotency_records WHERE key = $1")
            .bind(key.as_bytes().as_slice())
            .fetch_one(self.pool())
            .await
            .expect("read expires_at")
    }
}

impl Backend for SqliteStore {
    fn run_migrations(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.migrate()
    }

    async fn fresh(connections: u32) -> Self {
        let store = SqliteStore::new(fresh_sqlite_pool(connections).await);
        store.run_migrations().await.expect("migrate");
        store
    }

    async fn table_exists(&self, name: &str) -> bool {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        )
        .bind(name)
        .fetch_one(self.pool())
        .await
        .expect("query sqlite_master")
    }

    async fn expires_at(&self, key: &KeyHash) -> String {
        sqlx::query_scalar(
            "SELECT CAST(expires_at AS TEXT) FROM idempotency_records WHERE key = ?1",
        )
        .bind(key.as_bytes().as_slice())
        .fetch_one(self.pool())
        .await
        .expect("read expires_at")
    }
}

fn random_key() -> KeyHash {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    KeyHash(bytes)
}

fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::of(&[b"POST", b"/orders", body.as_bytes()])
}

fn claim_of(key: KeyHash, body: &str, lease: Duration, ttl: Duration) -> Claim {
    Claim {
        key,
        fingerprint: fingerprint(body),
        token: FencingToken::new(),
        lease,
        ttl,
    }
}

/// The same request again: same key and fingerprint, a new token.
fn retry_of(claim: &Claim) -> Claim {
    Claim {
        token: FencingToken::new(),
        ..claim.clone()
    }
}

/// A response with multi-valued headers (order matters), a non-UTF-8 value and a binary body.
fn response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-multi", HeaderValue::from_static("first"));
    headers.append("x-multi", HeaderValue::from_static("second: with colon"));
    headers.append("x-multi", HeaderValue::from_static("third"));
    headers.append("x-bytes", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    headers.append("location", HeaderValue::from_static("/orders/1"));
    StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body: Bytes::from_static(b"{\"id\":1}\x00\xff binary tail"),
    }
}

fn claimed(taken_over: bool) -> ClaimOutcome {
    ClaimOutcome::Claimed { taken_over }
}

fn is_in_flight(outcome: &ClaimOutcome) -> bool {
    matches!(outcome, ClaimOutcome::InFlight { .. })
}

/// Sleep until `at` (the behaviour under test is the passing of a lease or a retention).
async fn until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

// ---------------------------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------------------------

async fn concurrent_claims_have_exactly_one_winner<B: Backend>() {
    let store = Arc::new(B::fresh(10).await);
    let claim = claim_of(random_key(), "race", LONG, DAY);
    let start = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (store, start, claim) = (store.clone(), start.clone(), retry_of(&claim));
            tokio::spawn(async move {
                start.wait().await;
                store.claim(&claim).await.expect("claim")
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        match task.await.unwrap() {
            ClaimOutcome::Claimed { taken_over: false } => winners += 1,
            ClaimOutcome::InFlight { lease_remaining } => {
                assert!(
                    lease_remaining > Duration::from_secs(50),
                    "{lease_remaining:?}"
                );
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(winners, 1);
}

async fn concurrent_takeovers_have_exactly_one_winner<B: Backend>() {
    let store = Arc::new(B::fresh(10).await);
    let first = claim_of(random_key(), "race", Duration::from_millis(100), DAY);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now(); // the claim's lease and expiry count from before this
    until(started + Duration::from_millis(200)).await;
    let start = Arc::new(tokio::sync::Barrier::new(30));
    let tasks: Vec<_> = (0..30)
        .map(|_| {
            let (store, start, mut claim) = (store.clone(), start.clone(), retry_of(&first));
            claim.lease = LONG;
            tokio::spawn(async move {
                start.wait().await;
                store.claim(&claim).await.expect("claim")
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    assert_eq!(outcomes.iter().filter(|o| **o == claimed(true)).count(), 1);
    assert_eq!(outcomes.iter().filter(|o| is_in_flight(o)).count(), 29);
}

async fn concurrent_claims_of_an_expired_record_have_exactly_one_winner<B: Backend>() {
    let store = Arc::new(B::fresh(10).await);
    let key = random_key();
    let old = claim_of(key, "old", LONG, Duration::from_millis(100));
    assert_eq!(store.claim(&old).await.unwrap(), claimed(false));
    let started = Instant::now(); // the claim's lease and expiry count from before this
    until(started + Duration::from_millis(200)).await;
    let start = Arc::new(tokio::sync::Barrier::new(30));
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let (store, start) = (store.clone(), start.clone());
            // Two different requests race for the expired key.
            let claim = claim_of(key, if i % 2 == 0 { "even" } else { "odd" }, LONG, DAY);
            tokio::spawn(async move {
                start.wait().await;
                store.claim(&claim).await.expect("claim")
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    assert_eq!(outcomes.iter().filter(|o| **o == claimed(false)).count(), 1);
    for outcome in &outcomes {
        assert!(
            matches!(
                outcome,
                ClaimOutcome::Claimed { taken_over: false }
                    | ClaimOutcome::InFlight { .. }
                    | ClaimOutcome::Mismatch
            ),
            "{outcome:?}"
        );
    }
}

async fn complete_then_claim_replays_the_response<B: Backend>() {
    let store = B::fresh(2).await;
    let claim = claim_of(random_key(), "a", LONG, DAY);
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
    let saved = response();
    assert_eq!(
        store
            .complete(&claim.key, claim.token, &saved)
            .await
            .unwrap(),
        Fenced::Applied
    );
    let ClaimOutcome::Done(replayed) = store.claim(&retry_of(&claim)).await.unwrap() else {
        panic!("expected a replay");
    };
    assert_eq!(replayed, saved);
    let multi: Vec<_> = replayed.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["first", "second: with colon", "third"]);
    let names: Vec<_> = replayed.headers.keys().map(|n| n.as_str()).collect();
    assert_eq!(
        names,
        ["content-type", "x-multi", "x-bytes", "location"],
        "header order is kept"
    );
    // A second complete, even with the right token, changes nothing: the record is done.
    assert_eq!(
        store
            .complete(&claim.key, claim.token, &saved)
            .await
            .unwrap(),
        Fenced::Lost
    );
}

async fn empty_response_round_trips<B: Backend>() {
    let store = B::fresh(2).await;
    let claim = claim_of(random_key(), "a", LONG, DAY);
    store.claim(&claim).await.unwrap();
    let saved = StoredResponse {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        headers: HeaderMap::new(),
        body: Bytes::new(),
    };
    store
        .complete(&claim.key, claim.token, &saved)
        .await
        .unwrap();
    assert_eq!(
        store.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(saved)
    );
}

async fn a_different_fingerprint_is_a_mismatch_in_every_state<B: Backend>() {
    let store = B::fresh(2).await;
    let lease = Duration::from_millis(200);
    let first = claim_of(random_key(), "first", lease, DAY);
    let other = claim_of(first.key, "other", LONG, DAY);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now(); // the claim's lease and expiry count from before this

    // Running, lease valid.
    assert_eq!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch);

    // Running, lease lapsed: still bound to the first request, and not taken over.
    until(started + lease + Duration::from_millis(100)).await;
    assert_eq!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch);
    assert_eq!(
        store.renew(&first.key, first.token, LONG).await.unwrap(),
        Fenced::Applied,
        "a mismatched claim must not take the record over"
    );

    // Done.
    store
        .complete(&first.key, first.token, &response())
        .await
        .unwrap();
    assert_eq!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch);
    assert!(matches!(
        store.claim(&retry_of(&first)).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
}

async fn an_expired_record_can_be_claimed_by_another_request<B: Backend>() {
    let store = B::fresh(2).await;
    let ttl = Duration::from_millis(200);
    let first = claim_of(random_key(), "first", LONG, ttl);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now(); // the claim's lease and expiry count from before this
    store
        .complete(&first.key, first.token, &response())
        .await
        .unwrap();
    until(started + ttl + Duration::from_millis(100)).await;

    let other = claim_of(first.key, "other", LONG, DAY);
    assert_eq!(store.claim(&other).await.unwrap(), claimed(false));
    // The new record is the other request's, running, with a fresh expiry.
    assert!(is_in_flight(&store.claim(&retry_of(&other)).await.unwrap()));
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Mismatch);
    // The old holder's token is dead.
    assert_eq!(
        store
            .complete(&first.key, first.token, &response())
            .await
            .unwrap(),
        Fenced::Lost
    );
}

async fn a_lapsed_lease_is_taken_over_and_fences_the_old_holder<B: Backend>() {
    let store = B::fresh(2).await;
    let lease = Duration::from_millis(200);
    let old = claim_of(random_key(), "a", lease, DAY);
    assert_eq!(store.claim(&old).await.unwrap(), claimed(false));
    let started = Instant::now(); // the claim's lease and expiry count from before this
    let expiry = store.expires_at(&old.key).await;
    assert!(is_in_flight(&store.claim(&retry_of(&old)).await.unwrap()));

    until(started + lease + Duration::from_millis(100)).await;
    let new = Claim {
        lease: LONG,
        ..retry_of(&old)
    };
    assert_eq!(store.claim(&new).await.unwrap(), claimed(true));
    assert_eq!(
        store.expires_at(&old.key).await,
        expiry,
        "a takeover keeps the expiry"
    );

    assert_eq!(
        store.renew(&old.key, old.token, LONG).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store
            .complete(&old.key, old.token, &response())
            .await
            .unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store.release(&old.key, old.token).await.unwrap(),
        Fenced::Lost
    );
    assert!(is_in_flight(&store.claim(&retry_of(&old)).await.unwrap()));

    let saved = response();
    assert_eq!(
        store.complete(&new.key, new.token, &saved).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.claim(&retry_of(&old)).await.unwrap(),
        ClaimOutcome::Done(saved)
    );
    assert_eq!(
        store.expires_at(&old.key).await,
        expiry,
        "complete keeps the expiry"
    );
}

async fn renew_extends_the_lease<B: Backend>() {
    let store = B::fresh(2).await;
    let lease = Duration::from_millis(300);
    let claim = claim_of(random_key(), "a", lease, DAY);
    let started = Instant::now();
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
    until(started + Duration::from_millis(150)).await;
    assert_eq!(
        store.renew(&claim.key, claim.token, lease).await.unwrap(),
        Fenced::Applied
    );
    let renewed = Instant::now();
    until(started + Duration::from_millis(350)).await;
    let outcome = store.claim(&retry_of(&claim)).await.unwrap();
    assert!(
        is_in_flight(&outcome),
        "renewed lease still held: {outcome:?}"
    );
    // Without another renewal the lease lapses in turn.
    until(renewed + lease + Duration::from_millis(100)).await;
    assert_eq!(store.claim(&retry_of(&claim)).await.unwrap(), claimed(true));
    // Renewing a record that is not running is refused.
    let other = claim_of(random_key(), "b", LONG, DAY);
    store.claim(&other).await.unwrap();
    store
        .complete(&other.key, other.token, &response())
        .await
        .unwrap();
    assert_eq!(
        store.renew(&other.key, other.token, LONG).await.unwrap(),
        Fenced::Lost
    );
}

async fn in_flight_reports_the_lease_left<B: Backend>() {
    let store = B::fresh(2).await;
    let claim = claim_of(random_key(), "a", Duration::from_secs(30), DAY);
    store.claim(&claim).await.unwrap();
    let ClaimOutcome::InFlight { lease_remaining } = store.claim(&retry_of(&claim)).await.unwrap()
    else {
        panic!("expected in flight");
    };
    assert!(
        lease_remaining <= Duration::from_secs(30),
        "{lease_remaining:?}"
    );
    assert!(
        lease_remaining > Duration::from_secs(25),
        "{lease_remaining:?}"
    );
}

async fn release_then_claim_again<B: Backend>() {
    let store = B::fresh(2).await;
    let first = claim_of(random_key(), "a", LONG, DAY);
    store.claim(&first).await.unwrap();
    assert_eq!(
        store
            .release(&first.key, FencingToken::new())
            .await
            .unwrap(),
        Fenced::Lost,
        "a stranger's token releases nothing"
    );
    assert_eq!(
        store.release(&first.key, first.token).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.release(&first.key, first.token).await.unwrap(),
        Fenced::Lost
    );
    // The key is free, even for a different request.
    let second = claim_of(first.key, "b", LONG, DAY);
    assert_eq!(store.claim(&second).await.unwrap(), claimed(false));
    // A done record cannot be released.
    store
        .complete(&second.key, second.token, &response())
        .await
        .unwrap();
    assert_eq!(
        store.release(&second.key, second.token).await.unwrap(),
        Fenced::Lost
    );
}

async fn sweep_deletes_only_expired_records_in_bounded_batches<B: Backend>() {
    let store = B::fresh(4).await;
    let short = Duration::from_millis(100);
    let expired: Vec<_> = (0..25)
        .map(|i| claim_of(random_key(), &format!("old {i}"), LONG, short))
        .collect();
    for (i, claim) in expired.iter().enumerate() {
        store.claim(claim).await.unwrap();
        if i % 2 == 0 {
            store
                .complete(&claim.key, claim.token, &response())
                .await
                .unwrap();
        }
    }
    let started = Instant::now(); // every short record expires within `short` of this
    let live: Vec<_> = (0..5)
        .map(|i| claim_of(random_key(), &format!("live {i}"), LONG, DAY))
        .collect();
    for claim in &live {
        store.claim(claim).await.unwrap();
    }
    store
        .complete(&live[0].key, live[0].token, &response())
        .await
        .unwrap();
    until(started + short + Duration::from_millis(100)).await;

    assert_eq!(store.sweep(10).await.unwrap(), 10);
    assert_eq!(store.sweep(10).await.unwrap(), 10);
    assert_eq!(store.sweep(10).await.unwrap(), 5);
    assert_eq!(store.sweep(10).await.unwrap(), 0);

    // The live records are untouched.
    assert!(matches!(
        store.claim(&retry_of(&live[0])).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
    for claim in &live[1..] {
        assert!(is_in_flight(&store.claim(&retry_of(claim)).await.unwrap()));
    }
    // A swept running record's holder is fenced out.
    assert_eq!(
        store
            .complete(&expired[1].key, expired[1].token, &response())
            .await
            .unwrap(),
        Fenced::Lost
    );
}

async fn complete_in_a_rolled_back_transaction_leaves_the_record_running<B: Backend>() {
    let store = B::fresh(2).await;
    let claim = claim_of(random_key(), "a", LONG, DAY);
    store.claim(&claim).await.unwrap();

    let mut tx = store.pool().begin().await.unwrap();
    assert_eq!(
        store
            .complete_in(&mut tx, &claim.key, claim.token, &response())
            .await
            .unwrap(),
        Fenced::Applied
    );
    tx.rollback().await.unwrap();
    assert!(is_in_flight(&store.claim(&retry_of(&claim)).await.unwrap()));

    // Committed, the same write is the saved answer.
    let mut tx = store.pool().begin().await.unwrap();
    let saved = response();
    assert_eq!(
        store
            .complete_in(&mut tx, &claim.key, claim.token, &saved)
            .await
            .unwrap(),
        Fenced::Applied
    );
    tx.commit().await.unwrap();
    assert_eq!(
        store.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(saved)
    );
}

async fn complete_in_with_a_stale_token_is_lost<B: Backend>() {
    let store = B::fresh(2).await;
    let lease = Duration::from_millis(200);
    let old = claim_of(random_key(), "a", lease, DAY);
    store.claim(&old).await.unwrap();
    let started = Instant::now(); // the claim's lease and expiry count from before this
    until(started + lease + Duration::from_millis(100)).await;
    let new = Claim {
        lease: LONG,
        ..retry_of(&old)
    };
    assert_eq!(store.claim(&new).await.unwrap(), claimed(true));

    let mut tx = store.pool().begin().await.unwrap();
    assert_eq!(
        store
            .complete_in(&mut tx, &old.key, old.token, &response())
            .await
            .unwrap(),
        Fenced::Lost
    );
    tx.rollback().await.unwrap();
    assert!(is_in_flight(&store.claim(&retry_of(&old)).await.unwrap()));
}

async fn wait_for_change_wakes_on_complete_and_release<B: Backend>() {
    let store = B::fresh(4).await;
    // The first wait starts the store's notification machinery (PostgreSQL: its listener).
    store
        .wait_for_change(&random_key(), Duration::from_millis(300))
        .await;

    for release in [false, true] {
        let claim = claim_of(random_key(), "a", LONG, DAY);
        store.claim(&claim).await.unwrap();
        let waiter = tokio::spawn({
            let store = store.clone();
            async move {
                let started = Instant::now();
                store
                    .wait_for_change(&claim.key, Duration::from_secs(10))
                    .await;
                started.elapsed()
            }
        });
        // Give the waiter time to register: the change must happen while it waits.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let fenced = if release {
            store.release(&claim.key, claim.token).await.unwrap()
        } else {
            store
                .complete(&claim.key, claim.token, &response())
                .await
                .unwrap()
        };
        assert_eq!(fenced, Fenced::Applied);
        let waited = waiter.await.unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "release={release}: woke after {waited:?}"
        );
    }
}

async fn wait_for_change_is_bounded_by_its_timeout<B: Backend>() {
    let store = B::fresh(2).await;
    // A running record that nobody completes: the wait lasts its timeout, no more. (A key with
    // no running record may return at once: there is nothing to wait for.)
    let claim = claim_of(random_key(), "a", LONG, DAY);
    store.claim(&claim).await.unwrap();
    let started = Instant::now();
    store
        .wait_for_change(&claim.key, Duration::from_millis(300))
        .await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
}

async fn migrate_twice_uses_its_own_tracking_table<B: Backend>() {
    let store = B::fresh(4).await; // migrated once already
    store.run_migrations().await.expect("second migrate");
    // Concurrent migrations (several instances starting at once) all succeed.
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.run_migrations().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().expect("concurrent migrate");
    }
    assert!(store.table_exists("idempotency_records").await);
    assert!(store.table_exists("_tower_idempotency_migrations").await);
    assert!(!store.table_exists("_sqlx_migrations").await);
}

async fn concurrent_first_migrations_succeed<B: Backend>() {
    // A fresh database, migrated by several "instances" at once from the start.
    let store = B::fresh(4).await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.run_migrations().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().expect("concurrent migrate");
    }
}

// ---------------------------------------------------------------------------------------------
// Instantiation
// ---------------------------------------------------------------------------------------------

macro_rules! sql_store_tests {
    ($backend:ident: $store:ty => $($test:ident),+ $(,)?) => {
        mod $backend {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test::<$store>().await;
                }
            )+
        }
    };
}

macro_rules! suite {
    ($($backend:ident: $store:ty),+ $(,)?) => {
        $(
            sql_store_tests!($backend: $store =>
                concurrent_claims_have_exactly_one_winner,
                concurrent_takeovers_have_exactly_one_winner,
                concurrent_claims_of_an_expired_record_have_exactly_one_winner,
                complete_then_claim_replays_the_response,
                empty_response_round_trips,
                a_different_fingerprint_is_a_mismatch_in_every_state,
                an_expired_record_can_be_claimed_by_another_request,
                a_lapsed_lease_is_taken_over_and_fences_the_old_holder,
                renew_extends_the_lease,
                in_flight_reports_the_lease_left,
                release_then_claim_again,
                sweep_deletes_only_expired_records_in_bounded_batches,
                complete_in_a_rolled_back_transaction_leaves_the_record_running,
                complete_in_with_a_stale_token_is_lost,
                wait_for_change_wakes_on_complete_and_release,
                wait_for_change_is_bounded_by_its_timeout,
                migrate_twice_uses_its_own_tracking_table,
                concurrent_first_migrations_succeed,
            );
        )+
    };
}

suite!(postgres: PostgresStore, sqlite: SqliteStore);

// ---------------------------------------------------------------------------------------------
// PostgreSQL only
// ---------------------------------------------------------------------------------------------

/// Another process's `complete` (another store, another pool, same database) wakes a waiter:
/// the notification goes through the database, not through this store's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_wait_for_change_wakes_on_another_instance_s_complete() {
    let here = PostgresStore::fresh(2).await;
    let there = PostgresStore::new(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(here.pool().connect_options().as_ref().clone())
            .await
            .unwrap(),
    );
    here.wait_for_change(&random_key(), Duration::from_millis(300))
        .await;

    let claim = claim_of(random_key(), "a", LONG, DAY);
    there.claim(&claim).await.unwrap();
    let waiter = tokio::spawn({
        let here = here.clone();
        let key = claim.key;
        async move {
            let started = Instant::now();
            here.wait_for_change(&key, Duration::from_secs(10)).await;
            started.elapsed()
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Completed inside a transaction: the notification goes out on commit, not before.
    let mut tx = there.pool().begin().await.unwrap();
    let fenced = there
        .complete_in(&mut tx, &claim.key, claim.token, &response())
        .await
        .unwrap();
    assert_eq!(fenced, Fenced::Applied);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "no notification before the commit");
    tx.commit().await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    assert!(matches!(
        here.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
}

/// A listener that cannot connect never makes waiting fail or spin: each wait lasts its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_wait_for_change_without_a_database_sleeps_the_timeout() {
    // Nothing listens on port 1.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let store = PostgresStore::new(pool);
    for _ in 0..3 {
        let started = Instant::now();
        store
            .wait_for_change(&random_key(), Duration::from_millis(200))
            .await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
    }
    // Operations report the database as unavailable, without its text.
    let err = store
        .claim(&claim_of(random_key(), "a", LONG, DAY))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        tower_idempotency::store::StoreErrorKind::Unavailable
    );
    assert_eq!(err.to_string(), "idempotency store unavailable");
}
