//! Operator tools on every store, against the real databases: `get` shows one key's record
//! (state, lease, expiry, saved answer) and `forget` deletes it whatever its state, so the next
//! request with the key runs as new. One body, instantiated per store, and through `DynStore`.

use std::time::Duration;

use tower_idempotency::store::{ClaimOutcome, DynStore, RecordState, Store};
use tower_idempotency_tests::{
    contract::{claim_of, random_key, response, retry_of},
    stores::{memory_store, mysql_store, postgres_store, redis_store, sqlite_store},
};

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(3600);

async fn get_and_forget_one_key<S: Store>(store: S) {
    let key = random_key();
    assert_eq!(store.get(&key).await.unwrap(), None, "no record yet");
    assert!(!store.forget(&key).await.unwrap(), "nothing to forget");

    let claim = claim_of(key, "a", LEASE, TTL);
    assert_eq!(store.claim(&claim).await.unwrap(), ClaimOutcome::claimed());
    let running = store.get(&key).await.unwrap().expect("the running record");
    assert_eq!(running.state, RecordState::Running);
    let lease = running
        .lease_remaining
        .expect("a running record has a lease");
    assert!(
        lease > LEASE - Duration::from_secs(5) && lease <= LEASE,
        "{lease:?}"
    );
    assert!(running.expires_in > TTL - Duration::from_secs(5) && running.expires_in <= TTL);
    assert_eq!(running.response, None);

    let saved = response();
    assert!(store
        .complete(&key, claim.token, &saved)
        .await
        .unwrap()
        .applied());
    let done = store.get(&key).await.unwrap().expect("the done record");
    assert_eq!(done.state, RecordState::Done);
    assert_eq!(done.lease_remaining, None);
    assert_eq!(done.response.as_ref(), Some(&saved));

    // Forgotten: the same request runs as new, and its first holder can no longer write.
    assert!(store.forget(&key).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap(), None);
    let again = retry_of(&claim);
    assert_eq!(store.claim(&again).await.unwrap(), ClaimOutcome::claimed());

    // A running record forgotten: its holder is fenced out of saving.
    assert!(store.forget(&key).await.unwrap());
    assert!(!store
        .complete(&key, again.token, &saved)
        .await
        .unwrap()
        .applied());
    assert_eq!(store.get(&key).await.unwrap(), None);
}

macro_rules! operator_tests {
    ($($name:ident: $store:expr;)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn get_and_forget_one_key() {
                super::get_and_forget_one_key($store.await).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn get_and_forget_through_a_dyn_store() {
                super::get_and_forget_one_key(DynStore::new($store.await)).await;
            }
        }
    )*};
}

operator_tests! {
    memory: memory_store();
    postgres: postgres_store();
    sqlite: sqlite_store();
    mysql: mysql_store();
    redis: redis_store();
}
