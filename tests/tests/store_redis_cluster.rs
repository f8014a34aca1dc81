//! The Redis store through a real Redis Cluster at `REDIS_CLUSTER_URLS` (comma-separated node
//! URLs; `scripts/redis-cluster.sh` starts one on 127.0.0.1:7001-7003).

//!
//! What only the cluster does: slots, scripts on every node, pub/sub across nodes. The store
//! contract every store shares (claims, takeover and fencing, replay over many keys) runs on the
//! cluster from `store_contract.rs`.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use tower_idempotency::{
    store::{redis::redis, ClaimOutcome, Fenced, Hold, Store},
    KeyHash,
};
use tower_idempotency_tests::{
    contract::{numbered_response as response, random_key, DAY, LONG},
    records::new_claim,
    stores::{cluster_conn, cluster_urls, redis_cluster_store as store},
};

fn claim_of(key: KeyHash, body: &str, lease: Duration) -> tower_idempotency::store::Claim {
    new_claim(
        key,
        tower_idempotency_tests::contract::fingerprint(body),
        lease,
        DAY,
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
async fn cluster_records_and_channels_hash_by_their_tag_over_many_slots() {
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
            store.complete(&claim.hold(), &response(n)).await.unwrap(),
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
}

/// Each master's slot ranges, from `CLUSTER SLOTS`: (first slot, last slot, the master's
/// `host:port`).
async fn masters(conn: &mut redis::cluster_async::ClusterConnection) -> Vec<(i64, i64, String)> {
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .expect("CLUSTER SLOTS");
    ranges
        .iter()
        .map(|range| {
            let field = |i: usize| -> i64 { redis::from_redis_value_ref(&range[i]).unwrap() };
            let master: Vec<redis::Value> = redis::from_redis_value_ref(&range[2]).unwrap();
            let host: String = redis::from_redis_value_ref(&master[0]).unwrap();
            let port: i64 = redis::from_redis_value_ref(&master[1]).unwrap();
            (field(0), field(1), format!("{host}:{port}"))
        })
        .collect()
}

/// Completions published on every node wake a waiter subscribed through the first node: one
/// key on each master, each waiter released once its subscription is seen there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_wait_for_change_wakes_on_keys_of_every_node() {
    let store = store().await;
    let mut conn = cluster_conn().await;
    let masters = masters(&mut conn).await;
    let nodes: HashSet<&str> = masters.iter().map(|(_, _, node)| node.as_str()).collect();
    let mut keys = Vec::new();
    let mut covered = HashSet::new();
    for _ in 0..1_000 {
        let key = random_key();
        let slot = slot_of(&mut conn, &store.record_key(&key)).await;
        let (_, _, node) = masters
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .expect("every slot has a master");
        if covered.insert(node.as_str()) {
            keys.push(key);
        }
        if covered == nodes {
            break;
        }
    }
    assert_eq!(covered, nodes, "a key on every master");
    let first = cluster_urls().remove(0);
    let mut subscriptions = redis::Client::open(first)
        .expect("a valid node URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the first node");

    for (n, key) in keys.iter().enumerate() {
        let held = claim_of(*key, "a", LONG);
        store.claim(&held).await.unwrap();
        let waiter = {
            let store = store.clone();
            let key = *key;
            tokio::spawn(async move {
                let started = Instant::now();
                store.wait_for_change(&key, Duration::from_secs(10)).await;
                started.elapsed()
            })
        };
        let channel = store.channel(key);
        let subscribed = async {
            loop {
                let (_, n): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query_async(&mut subscriptions)
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
            .expect("the waiter subscribes within 5 s");
        assert_eq!(
            store
                .complete(&Hold::new(*key, held.token), &response(n))
                .await
                .unwrap(),
            Fenced::Applied
        );
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
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
                    .complete(&Hold::new(key, claim.token), &response(n))
                    .await
                    .unwrap(),
                Fenced::Applied
            );
        }
    }
}
