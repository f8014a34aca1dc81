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
    stores::{cluster_conn, redis_cluster_store as store},
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
                store
                    .complete(&Hold::new(key, held.token), &response(n))
                    .await
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
                    .complete(&Hold::new(key, claim.token), &response(n))
                    .await
                    .unwrap(),
                Fenced::Applied
            );
        }
    }
}
