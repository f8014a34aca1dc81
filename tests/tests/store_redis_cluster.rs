//! The Redis store through a real Redis Cluster at `REDIS_CLUSTER_URLS` (comma-separated node
//! URLs; `scripts/redis-cluster.sh` starts one on 127.0.0.1:7001-7003).

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tower_idempotency::{
    store::{
        redis::{redis, RedisStore},
        Claim, ClaimOutcome, Fenced, FencingToken, Store, StoredResponse,
    },
    Fingerprint, KeyHash,
};
use tower_idempotency_tests::unique_name;

const LONG: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn cluster_urls() -> Vec<String> {
    let urls = std::env::var("REDIS_CLUSTER_URLS").expect(
        "REDIS_CLUSTER_URLS is not set: run scripts/redis-cluster.sh and export \
         REDIS_CLUSTER_URLS=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003",
    );
    let urls: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(!urls.is_empty(), "REDIS_CLUSTER_URLS holds no URL");
    urls
}

async fn cluster_conn() -> redis::cluster_async::ClusterConnection {
    let urls = cluster_urls();
    redis::cluster::ClusterClient::new(urls.clone())
        .unwrap_or_else(|e| panic!("REDIS_CLUSTER_URLS={urls:?} is not valid: {e}"))
        .get_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot reach the cluster at REDIS_CLUSTER_URLS={urls:?}: {e}"))
}

/// A cluster store under a prefix of its own, notified through the first node.
async fn store() -> RedisStore {
    let first = cluster_urls().remove(0);
    RedisStore::cluster(cluster_conn().await)
        .with_prefix(unique_name("tidem"))
        .with_notifications(redis::Client::open(first).expect("a valid node URL"))
}

fn random_key() -> KeyHash {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    KeyHash(bytes)
}

fn claim_of(key: KeyHash, body: &str, lease: Duration) -> Claim {
    Claim::new(
        key,
        Fingerprint::of(&[b"POST", b"/orders", body.as_bytes()]),
        FencingToken::new(),
        lease,
        DAY,
    )
}

fn response(n: usize) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("x-multi", HeaderValue::from_static("one"));
    headers.append("x-multi", HeaderValue::from_static("two"));
    headers.append("x-n", HeaderValue::from(n));
    StoredResponse::new(
        StatusCode::CREATED,
        headers,
        Bytes::from(format!("order {n}\0")),
    )
}

/// The cluster slot of a Redis key, as the server computes it.
async fn slot_of(conn: &mut redis::cluster_async::ClusterConnection, name: &str) -> i64 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(name)
        .query_async(conn)
        .await
        .expect("CLUSTER KEYSLOT")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_fifty_concurrent_claims_have_exactly_one_winner_per_key() {
    let store = store().await;
    // Several keys, each raced by 50 claims.
    for _ in 0..4 {
        let key = random_key();
        let start = Arc::new(tokio::sync::Barrier::new(50));
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let store = store.clone();
                let start = Arc::clone(&start);
                tokio::spawn(async move {
                    start.wait().await;
                    store.claim(&claim_of(key, "same", LONG)).await
                })
            })
            .collect();
        let (mut claimed, mut in_flight) = (0, 0);
        for task in tasks {
            match task.await.expect("task").expect("claim") {
                ClaimOutcome::Claimed { taken_over: false } => claimed += 1,
                ClaimOutcome::InFlight { .. } => in_flight += 1,
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert_eq!((claimed, in_flight), (1, 49));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_complete_and_replay_over_many_slots() {
    let store = store().await;
    let mut conn = cluster_conn().await;
    let keys: Vec<KeyHash> = (0..64).map(|_| random_key()).collect();
    let mut slots = HashSet::new();
    for (n, key) in keys.iter().enumerate() {
        let claim = claim_of(*key, "order", LONG);
        assert_eq!(
            store.claim(&claim).await.unwrap(),
            ClaimOutcome::Claimed { taken_over: false }
        );
        assert_eq!(
            store
                .complete(key, claim.token, &response(n))
                .await
                .unwrap(),
            Fenced::Applied
        );
        let name = store.record_key(key);
        let slot = slot_of(&mut conn, &name).await;
        // The record and its channel hash by the {key hex} tag alone.
        assert_eq!(slot_of(&mut conn, &store.channel(key)).await, slot);
        assert_eq!(
            slot_of(&mut conn, &format!("{{{}}}", key.to_hex())).await,
            slot
        );
        slots.insert(slot);
    }
    assert!(
        slots.len() > 32,
        "64 keys should land in many slots, got {}",
        slots.len()
    );
    for (n, key) in keys.iter().enumerate() {
        assert_eq!(
            store.claim(&claim_of(*key, "order", LONG)).await.unwrap(),
            ClaimOutcome::Done(response(n))
        );
        assert_eq!(
            store.claim(&claim_of(*key, "other", LONG)).await.unwrap(),
            ClaimOutcome::Mismatch
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_takeover_fences_the_old_token() {
    let store = store().await;
    let lease = Duration::from_millis(200);
    let keys: Vec<KeyHash> = (0..16).map(|_| random_key()).collect();
    let mut old = Vec::new();
    for key in &keys {
        let claim = claim_of(*key, "a", lease);
        assert_eq!(
            store.claim(&claim).await.unwrap(),
            ClaimOutcome::Claimed { taken_over: false }
        );
        old.push(claim.token);
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // the lapse under test
    for (n, (key, old)) in keys.iter().zip(old).enumerate() {
        let new = claim_of(*key, "a", LONG);
        assert_eq!(
            store.claim(&new).await.unwrap(),
            ClaimOutcome::Claimed { taken_over: true }
        );
        assert_eq!(
            store.complete(key, old, &response(n)).await.unwrap(),
            Fenced::Lost
        );
        assert_eq!(store.renew(key, old, LONG).await.unwrap(), Fenced::Lost);
        assert_eq!(store.release(key, old).await.unwrap(), Fenced::Lost);
        assert_eq!(
            store.complete(key, new.token, &response(n)).await.unwrap(),
            Fenced::Applied
        );
        assert_eq!(
            store.claim(&claim_of(*key, "a", LONG)).await.unwrap(),
            ClaimOutcome::Done(response(n))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_wait_for_change_wakes_on_keys_of_every_node() {
    let store = store().await;
    let keys: Vec<KeyHash> = (0..8).map(|_| random_key()).collect();
    for (n, key) in keys.iter().enumerate() {
        let held = claim_of(*key, "a", LONG);
        store.claim(&held).await.unwrap();
        let completer = {
            let store = store.clone();
            let key = *key;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                store.complete(&key, held.token, &response(n)).await
            })
        };
        let started = Instant::now();
        store.wait_for_change(key, Duration::from_secs(10)).await;
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
        assert_eq!(completer.await.unwrap().unwrap(), Fenced::Applied);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_scripts_are_reloaded_after_script_flush_on_every_node() {
    let store = store().await;
    let mut conn = cluster_conn().await;
    for round in 0..3 {
        // SCRIPT FLUSH goes to every node of the cluster.
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async::<()>(&mut conn)
            .await
            .expect("SCRIPT FLUSH");
        for n in 0..16 {
            let key = random_key();
            let claim = claim_of(key, "a", LONG);
            assert_eq!(
                store.claim(&claim).await.unwrap(),
                ClaimOutcome::Claimed { taken_over: false },
                "round {round}, key {n}"
            );
            assert_eq!(
                store
                    .complete(&key, claim.token, &response(n))
                    .await
                    .unwrap(),
                Fenced::Applied
            );
        }
    }
}
