//! Wait mode on PostgreSQL: a completion notifies only records someone waits on, and the wake-up
//! reaches a waiter of another instance well before the layer's 100 ms poll.
//!
//! Two stores on one fresh database, each with its own pool and its own listener, stand for two
//! application instances.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use sqlx::postgres::{PgListener, PgPoolOptions};
use tower_idempotency::{
    store::{
        postgres::PostgresStore, Claim, ClaimOutcome, Fenced, FencingToken, Store, StoredResponse,
    },
    Fingerprint, KeyHash,
};
use tower_idempotency_tests::{
    fresh_postgres_pool,
    stores::{postgres_watched, start_postgres_waiter},
};

/// Far longer than any wake-up: a waiter that returns before it was woken by a notification.
const WAIT: Duration = Duration::from_secs(10);
/// The layer's poll interval in wait mode; a notification must beat it comfortably.
const POLL: Duration = tower_idempotency::WAIT_POLL_INTERVAL;

/// Two migrated stores on one fresh database: two instances of an application.
async fn two_instances() -> (PostgresStore, PostgresStore) {
    let a = PostgresStore::new(fresh_postgres_pool(4).await);
    a.migrate().await.expect("migrate");
    let pool_b = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(a.pool().connect_options().as_ref().clone())
        .await
        .expect("a second pool on the same database");
    (a, PostgresStore::new(pool_b))
}

fn claim() -> Claim {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    Claim::new(
        KeyHash(key),
        Fingerprint::of(&[b"POST", b"/orders", b"{}"]),
        FencingToken::new(),
        Duration::from_secs(30),
        Duration::from_secs(600),
    )
}

fn response() -> StoredResponse {
    StoredResponse::new(
        StatusCode::CREATED,
        HeaderMap::new(),
        Bytes::from_static(b"{}"),
    )
}

/// Wake-ups of a waiter on instance B by completions (or releases) on instance A, in turn.
async fn wake_ups(release: bool) -> Vec<Duration> {
    let (a, b) = two_instances().await;
    let mut took = Vec::new();
    for _ in 0..5 {
        let claim = claim();
        assert_eq!(
            a.claim(&claim).await.unwrap(),
            ClaimOutcome::Claimed { taken_over: false }
        );
        let waiter = start_postgres_waiter(&b, &a, claim.key, WAIT).await;
        let changed = Instant::now();
        let fenced = if release {
            a.release(&claim.hold()).await.unwrap()
        } else {
            a.complete(&claim.hold(), &response()).await.unwrap()
        };
        assert_eq!(fenced, Fenced::Applied);
        let woke = waiter.await.unwrap();
        took.push(woke.saturating_duration_since(changed));
    }
    took.sort();
    took
}

/// The median of the sorted wake-ups is well under the poll interval (a notification woke it,
/// not the poll), and every waiter woke well within its wait.
fn assert_woken_fast(took: &[Duration], after: &str) {
    eprintln!("wake-up after {after}, sorted: {took:?}");
    assert!(
        took[2] < POLL / 2,
        "median wake-up {:?} is not well under the {POLL:?} poll",
        took[2]
    );
    assert!(took[4] < WAIT / 2, "a waiter was not woken: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completion_wakes_a_waiter_of_another_instance_fast() {
    assert_woken_fast(&wake_ups(false).await, "complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_wakes_a_waiter_of_another_instance_fast() {
    assert_woken_fast(&wake_ups(true).await, "release");
}

/// A record that changed before the waiter marked it: the wait returns at once, it does not
/// wait for a notification that was never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_on_a_finished_record_returns_at_once() {
    let (a, b) = two_instances().await;
    let claim = claim();
    a.claim(&claim).await.unwrap();
    a.complete(&claim.hold(), &response()).await.unwrap();
    // The first wait starts the listener; the record is done, so it returns without waiting.
    let started = Instant::now();
    b.wait_for_change(&claim.key, WAIT).await;
    assert!(
        started.elapsed() < WAIT / 2,
        "waited {:?} on a done record",
        started.elapsed()
    );
    assert!(
        !postgres_watched(&a, &claim.key).await,
        "a done record was marked"
    );
}

/// Without a waiter, completions and releases send no notification; with one, they do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_watched_records_notify() {
    let (a, b) = two_instances().await;
    let mut listener = PgListener::connect_with(a.pool()).await.unwrap();
    listener.listen("tower_idempotency").await.unwrap();

    for release in [false, true] {
        let unwatched = claim();
        a.claim(&unwatched).await.unwrap();
        if release {
            a.release(&unwatched.hold()).await.unwrap();
        } else {
            a.complete(&unwatched.hold(), &response()).await.unwrap();
        }
    }
    // A watched record next: notifications arrive in commit order, so if the first one is this
    // key's, the two unwatched records sent none.
    let watched_claim = claim();
    a.claim(&watched_claim).await.unwrap();
    let waiter = start_postgres_waiter(&b, &a, watched_claim.key, WAIT).await;
    a.complete(&watched_claim.hold(), &response())
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, listener.recv())
        .await
        .expect("no notification for the watched record")
        .unwrap();
    assert_eq!(first.payload(), watched_claim.key.to_hex());
    waiter.await.unwrap();
}
