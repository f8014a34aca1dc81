//! The Redis store against a real server at `REDIS_URL`, each test under its own key prefix.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tower_idempotency::{
    store::{
        redis::{redis, RedisStore},
        Claim, ClaimOutcome, Fenced, FencingToken, Store, StoreErrorKind, StoredResponse,
    },
    Fingerprint, KeyHash,
};
use tower_idempotency_tests::{redis_client, unique_name};

const LONG: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// A store on `REDIS_URL` (with notifications) under a prefix of its own.
async fn store() -> RedisStore {
    RedisStore::connect(redis_client())
        .await
        .unwrap_or_else(|e| panic!("cannot reach redis at REDIS_URL: {e}"))
        .with_prefix(unique_name("tidem"))
}

/// A plain connection for inspecting keys.
async fn raw() -> redis::aio::MultiplexedConnection {
    redis_client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
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
    Claim::new(key, fingerprint(body), FencingToken::new(), lease, ttl)
}

fn response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-multi", HeaderValue::from_static("one"));
    headers.append("x-multi", HeaderValue::from_static("two: with colon"));
    headers.append("set-cookie", HeaderValue::from_static("a=1"));
    headers.append("x-multi", HeaderValue::from_static("three"));
    headers.append("x-bytes", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    StoredResponse::new(
        StatusCode::CREATED,
        headers,
        Bytes::from_static(b"{\"id\":42}\x00\xff binary tail"),
    )
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

/// Hand-written test records must not outlive the test run.
async fn expire_soon(conn: &mut redis::aio::MultiplexedConnection, key: &str) {
    redis::cmd("PEXPIRE")
        .arg(key)
        .arg(60_000)
        .query_async::<()>(conn)
        .await
        .expect("PEXPIRE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_claims_have_exactly_one_winner() {
    let store = store().await;
    let key = random_key();
    let start = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let store = store.clone();
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                start.wait().await;
                store.claim(&claim_of(key, "same", LONG, DAY)).await
            })
        })
        .collect();
    let (mut claimed, mut in_flight) = (0, 0);
    for task in tasks {
        match task.await.expect("task").expect("claim") {
            ClaimOutcome::Claimed { taken_over: false } => claimed += 1,
            ClaimOutcome::InFlight { lease_remaining } => {
                assert!(lease_remaining > Duration::ZERO && lease_remaining <= LONG);
                in_flight += 1;
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!((claimed, in_flight), (1, 49));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_then_claim_replays_the_identical_response() {
    let store = store().await;
    let key = random_key();
    let first = claim_of(key, "order", LONG, DAY);
    assert_eq!(
        store.claim(&first).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: false }
    );
    let saved = response();
    assert_eq!(
        store.complete(&key, first.token, &saved).await.unwrap(),
        Fenced::Applied
    );

    let ClaimOutcome::Done(replayed) = store
        .claim(&claim_of(key, "order", LONG, DAY))
        .await
        .unwrap()
    else {
        panic!("expected a replay");
    };
    assert_eq!(replayed, saved);
    assert_eq!(replayed.status, StatusCode::CREATED);
    let multi: Vec<_> = replayed.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["one", "two: with colon", "three"]);
    assert_eq!(replayed.body, saved.body);

    // A second complete with the same token finds the record done: nothing is overwritten.
    let mut other = saved.clone();
    other.status = StatusCode::INTERNAL_SERVER_ERROR;
    assert_eq!(
        store.complete(&key, first.token, &other).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store
            .claim(&claim_of(key, "order", LONG, DAY))
            .await
            .unwrap(),
        ClaimOutcome::Done(saved)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_fingerprint_is_a_mismatch_whatever_the_state() {
    let store = store().await;

    // running, lease valid
    let key = random_key();
    store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap();
    assert_eq!(
        store.claim(&claim_of(key, "b", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Mismatch
    );

    // running, lease lapsed: no takeover for another request
    let key = random_key();
    store
        .claim(&claim_of(key, "a", Duration::from_millis(50), DAY))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // the lapse under test
    assert_eq!(
        store.claim(&claim_of(key, "b", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    assert_eq!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: true }
    );

    // done
    let key = random_key();
    let first = claim_of(key, "a", LONG, DAY);
    store.claim(&first).await.unwrap();
    store
        .complete(&key, first.token, &response())
        .await
        .unwrap();
    assert_eq!(
        store.claim(&claim_of(key, "b", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lapsed_lease_is_taken_over_and_the_old_token_is_fenced() {
    let store = store().await;
    let key = random_key();
    let old = claim_of(key, "a", Duration::from_millis(200), DAY);
    assert_eq!(
        store.claim(&old).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: false }
    );
    let new = claim_of(key, "a", LONG, DAY);
    assert!(matches!(
        store.claim(&new).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    tokio::time::sleep(Duration::from_millis(300)).await; // the lapse under test
    assert_eq!(
        store.claim(&new).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: true }
    );

    assert_eq!(
        store.complete(&key, old.token, &response()).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store.renew(&key, old.token, LONG).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(store.release(&key, old.token).await.unwrap(), Fenced::Lost);

    assert_eq!(
        store.complete(&key, new.token, &response()).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Done(response())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_keeps_the_original_expiry() {
    let store = store().await;
    let mut conn = raw().await;
    let key = random_key();
    let name = store.record_key(&key);
    let ttl = Duration::from_secs(30);
    store
        .claim(&claim_of(key, "a", Duration::from_millis(200), ttl))
        .await
        .unwrap();
    let before = pttl(&mut conn, &name).await;
    assert!(before > 29_000 && before <= 30_000, "pttl {before}");
    let expires_at: i64 = redis::cmd("HGET")
        .arg(&name)
        .arg("expires_at")
        .query_async(&mut conn)
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(300)).await; // the lapse under test
    assert_eq!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: true }
    );
    let after = pttl(&mut conn, &name).await;
    assert!(
        after > 0 && after <= before - 250,
        "a takeover must not extend the expiry: {before} -> {after}"
    );
    let expires_after: i64 = redis::cmd("HGET")
        .arg(&name)
        .arg("expires_at")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(expires_after, expires_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_extends_the_lease() {
    let store = store().await;
    let key = random_key();
    let held = claim_of(key, "a", Duration::from_millis(300), DAY);
    store.claim(&held).await.unwrap();

    assert_eq!(
        store.renew(&key, FencingToken::new(), LONG).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store.renew(&key, held.token, LONG).await.unwrap(),
        Fenced::Applied
    );
    match store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap() {
        ClaimOutcome::InFlight { lease_remaining } => {
            assert!(
                lease_remaining > Duration::from_secs(50),
                "{lease_remaining:?}"
            )
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(400)).await; // past the original lease
    assert!(matches!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_then_claim_again() {
    let store = store().await;
    let mut conn = raw().await;
    let key = random_key();
    let first = claim_of(key, "a", LONG, DAY);
    store.claim(&first).await.unwrap();

    assert_eq!(
        store.release(&key, FencingToken::new()).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store.release(&key, first.token).await.unwrap(),
        Fenced::Applied
    );
    assert!(!exists(&mut conn, &store.record_key(&key)).await);

    let second = claim_of(key, "a", LONG, DAY);
    assert_eq!(
        store.claim(&second).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: false }
    );
    assert_eq!(
        store.release(&key, first.token).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store
            .complete(&key, first.token, &response())
            .await
            .unwrap(),
        Fenced::Lost
    );
    // A done record cannot be released.
    store
        .complete(&key, second.token, &response())
        .await
        .unwrap();
    assert_eq!(
        store.release(&key, second.token).await.unwrap(),
        Fenced::Lost
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_removes_the_record() {
    let store = store().await;
    let mut conn = raw().await;
    let key = random_key();
    let name = store.record_key(&key);
    let first = claim_of(key, "a", LONG, Duration::from_millis(300));
    store.claim(&first).await.unwrap();
    let ttl = pttl(&mut conn, &name).await;
    assert!(ttl > 0 && ttl <= 300, "pttl {ttl}");
    store
        .complete(&key, first.token, &response())
        .await
        .unwrap();
    assert!(
        pttl(&mut conn, &name).await > 0,
        "complete keeps the expiry"
    );

    tokio::time::sleep(Duration::from_millis(450)).await; // the expiry under test
    assert!(!exists(&mut conn, &name).await);
    assert_eq!(pttl(&mut conn, &name).await, -2);
    assert_eq!(store.sweep(1000).await.unwrap(), 0);
    assert_eq!(
        store.claim(&claim_of(key, "b", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: false }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripts_are_reloaded_after_script_flush() {
    let store = store().await;
    let mut conn = raw().await;
    let key = random_key();
    let first = claim_of(key, "a", LONG, DAY);
    store.claim(&first).await.unwrap();

    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store.renew(&key, first.token, LONG).await.unwrap(),
        Fenced::Applied
    );
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert!(matches!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store
            .complete(&key, first.token, &response())
            .await
            .unwrap(),
        Fenced::Applied
    );
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let other = random_key();
    let claim = claim_of(other, "a", LONG, DAY);
    assert_eq!(
        store.claim(&claim).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: false }
    );
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store.release(&other, claim.token).await.unwrap(),
        Fenced::Applied
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_for_change_wakes_promptly_after_complete() {
    let store = store().await;
    let key = random_key();
    let held = claim_of(key, "a", LONG, DAY);
    store.claim(&held).await.unwrap();

    let completer = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store.complete(&key, held.token, &response()).await
        })
    };
    let started = Instant::now();
    store.wait_for_change(&key, Duration::from_secs(10)).await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    assert_eq!(completer.await.unwrap().unwrap(), Fenced::Applied);
    assert!(matches!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_for_change_wakes_every_waiter_on_release_and_unsubscribes() {
    let store = store().await;
    let mut conn = raw().await;
    let key = random_key();
    let held = claim_of(key, "a", LONG, DAY);
    store.claim(&held).await.unwrap();

    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                store.wait_for_change(&key, Duration::from_secs(10)).await;
                started.elapsed()
            })
        })
        .collect();
    // Release once every waiter is subscribed: the subscription count is the signal.
    let channel = store.channel(&key);
    let subscribed = async {
        loop {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await
                .unwrap();
            if n > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), subscribed)
        .await
        .expect("the waiters subscribe");
    assert_eq!(
        store.release(&key, held.token).await.unwrap(),
        Fenced::Applied
    );
    for waiter in waiters {
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    }

    // The last waiter's unsubscribe runs in the background; it must happen.
    let unsubscribed = async {
        loop {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await
                .unwrap();
            if n == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), unsubscribed)
        .await
        .expect("the channel is unsubscribed once nobody waits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_for_change_returns_at_once_or_at_lease_lapse() {
    let store = store().await;

    // No record: nothing to wait for.
    let started = Instant::now();
    store
        .wait_for_change(&random_key(), Duration::from_secs(10))
        .await;
    assert!(started.elapsed() < Duration::from_secs(5));

    // Done already.
    let key = random_key();
    let held = claim_of(key, "a", LONG, DAY);
    store.claim(&held).await.unwrap();
    store.complete(&key, held.token, &response()).await.unwrap();
    let started = Instant::now();
    store.wait_for_change(&key, Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(5));

    // Running with a short lease: wakes when the lease lapses, and the key can be taken over.
    let key = random_key();
    store
        .claim(&claim_of(key, "a", Duration::from_millis(300), DAY))
        .await
        .unwrap();
    let started = Instant::now();
    store.wait_for_change(&key, Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: true }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_notifications_wait_sleeps_for_the_timeout() {
    let manager = redis_client()
        .get_connection_manager()
        .await
        .expect("connect to redis");
    let store = RedisStore::new(manager).with_prefix(unique_name("tidem"));
    let key = random_key();
    store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap();
    let started = Instant::now();
    store
        .wait_for_change(&key, Duration::from_millis(200))
        .await;
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_names_carry_the_hash_tag() {
    let prefix = unique_name("tidem");
    let store = RedisStore::connect(redis_client())
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    assert_eq!(store.prefix(), prefix);
    let key = random_key();
    let name = store.record_key(&key);
    assert_eq!(name, format!("{prefix}:{{{}}}", key.to_hex()));
    assert!(store.channel(&key).starts_with(&name));

    store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap();
    let mut conn = raw().await;
    assert!(exists(&mut conn, &name).await);
    let state: String = redis::cmd("HGET")
        .arg(&name)
        .arg("state")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(state, "running");

    let default = RedisStore::new(redis_client().get_connection_manager().await.unwrap());
    assert_eq!(
        default.record_key(&key),
        format!("idempotency:{{{}}}", key.to_hex())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupt_record_is_an_error_not_a_panic() {
    let store = store().await;
    let mut conn = raw().await;

    let key = random_key();
    redis::cmd("HSET")
        .arg(store.record_key(&key))
        .arg("fp")
        .arg(fingerprint("a").to_hex())
        .arg("state")
        .arg("bogus")
        .arg("expires_at")
        .arg(i64::MAX / 2)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    expire_soon(&mut conn, &store.record_key(&key)).await;
    let err = store
        .claim(&claim_of(key, "a", LONG, DAY))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);

    let key = random_key();
    redis::cmd("HSET")
        .arg(store.record_key(&key))
        .arg("fp")
        .arg(fingerprint("a").to_hex())
        .arg("state")
        .arg("done")
        .arg("expires_at")
        .arg(i64::MAX / 2)
        .arg("status")
        .arg("not a number")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    expire_soon(&mut conn, &store.record_key(&key)).await;
    let err = store
        .claim(&claim_of(key, "a", LONG, DAY))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);

    // Not even a hash: the script fails with WRONGTYPE.
    let key = random_key();
    redis::cmd("SET")
        .arg(store.record_key(&key))
        .arg("not a hash")
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let err = store
        .claim(&claim_of(key, "a", LONG, DAY))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_unavailable() {
    let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
    let err = RedisStore::connect(client).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable);
}
