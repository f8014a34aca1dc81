//! Operator tools on every store, against the real databases: `get` shows one key's record
//! (state, lease, expiry, saved answer) and `forget` deletes it whatever its state, so the next
//! request with the key runs as new; `stats` counts the records by state and names the oldest
//! running one; the `admin` router serves those verbs over HTTP. One body each, instantiated per
//! store, and through `DynStore`.

use std::time::Duration;

use axum::{body::Body, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::{
    admin,
    store::{ClaimOutcome, DynStore, Hold, RecordState, Store, StoreErrorKind, StoreStats},
    IdempotencyKey, KeyHash, Scope,
};
use tower_idempotency_tests::{
    contract::{claim_of, random_key, response, retry_of},
    stores::{
        memory_store, mysql_store, postgres_store, redis_cluster_store, redis_store, sqlite_store,
    },
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
    let age = running.age.expect("the time of the first claim");
    assert!(age < Duration::from_secs(5), "claimed {age:?} ago");

    let saved = response();
    assert!(store
        .complete(&Hold::new(key, claim.token), &saved)
        .await
        .unwrap()
        .applied());
    let done = store.get(&key).await.unwrap().expect("the done record");
    assert_eq!(done.state, RecordState::Done);
    assert_eq!(done.lease_remaining, None);
    assert_eq!(done.response.as_ref(), Some(&saved));
    assert!(
        done.age.expect("the time of the first claim") >= age,
        "the age of a record only grows"
    );

    // Forgotten: the same request runs as new, and its first holder can no longer write.
    assert!(store.forget(&key).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap(), None);
    let again = retry_of(&claim);
    assert_eq!(store.claim(&again).await.unwrap(), ClaimOutcome::claimed());

    // A running record forgotten: its holder is fenced out of saving.
    assert!(store.forget(&key).await.unwrap());
    assert!(!store
        .complete(&Hold::new(key, again.token), &saved)
        .await
        .unwrap()
        .applied());
    assert_eq!(store.get(&key).await.unwrap(), None);
}

/// Claim `key` and wait until the store's own clock has moved past the claim, so a record
/// claimed next is strictly younger (SQLite, MySQL and Redis count in milliseconds).
async fn claim_running<S: Store>(store: &S, key: KeyHash) {
    let claim = claim_of(key, "running", LEASE, TTL);
    assert_eq!(store.claim(&claim).await.unwrap(), ClaimOutcome::claimed());
    loop {
        let stats = store.stats().await.unwrap();
        if stats
            .oldest_running
            .is_some_and(|oldest| oldest.age >= Duration::from_millis(2))
        {
            break;
        }
        tokio::task::yield_now().await;
    }
}

/// A record that expired: claimed with a retention of 1 ms, then seen absent.
async fn claim_expired<S: Store>(store: &S) {
    let claim = claim_of(
        random_key(),
        "expired",
        Duration::from_millis(1),
        Duration::from_millis(1),
    );
    assert_eq!(store.claim(&claim).await.unwrap(), ClaimOutcome::claimed());
    while store.get(&claim.key).await.unwrap().is_some() {
        tokio::task::yield_now().await;
    }
}

/// A done record of `key`.
async fn save_done<S: Store>(store: &S, key: KeyHash) {
    let claim = claim_of(key, "done", LEASE, TTL);
    assert_eq!(store.claim(&claim).await.unwrap(), ClaimOutcome::claimed());
    assert!(store
        .complete(&Hold::new(key, claim.token), &response())
        .await
        .unwrap()
        .applied());
}

/// `stats` counts live records by state, expired ones until swept (none on Redis, which deletes
/// them itself), and names the running record claimed first.
async fn stats_count_by_state<S: Store>(store: S) {
    let deletes_expired_itself = store.name() == "redis";
    assert_eq!(store.stats().await.unwrap(), StoreStats::default(), "empty");

    save_done(&store, random_key()).await;
    let older = random_key();
    claim_running(&store, older).await;
    let newer = random_key();
    let newer_claim = claim_of(newer, "running", LEASE, TTL);
    assert_eq!(
        store.claim(&newer_claim).await.unwrap(),
        ClaimOutcome::claimed()
    );
    // Last, so that no later claim lets the memory store drop it early.
    claim_expired(&store).await;

    let stats = store.stats().await.unwrap();
    assert_eq!((stats.running, stats.done), (2, 1), "{stats:?}");
    assert_eq!(
        stats.expired,
        u64::from(!deletes_expired_itself),
        "{stats:?}"
    );
    let oldest = stats.oldest_running.expect("two records run");
    assert_eq!(oldest.key, older, "the first claimed, not {newer:?}");
    assert!(
        oldest.age >= Duration::from_millis(2) && oldest.age < LEASE,
        "{oldest:?}"
    );

    store.sweep(100).await.unwrap();
    assert_eq!(store.stats().await.unwrap().expired, 0, "swept");

    assert!(store.forget(&older).await.unwrap());
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.running, 1);
    assert_eq!(stats.oldest_running.map(|o| o.key), Some(newer));
    assert!(store
        .complete(&Hold::new(newer, newer_claim.token), &response())
        .await
        .unwrap()
        .applied());
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.running, stats.done, stats.oldest_running),
        (0, 2, None)
    );
}

async fn call(app: &Router, method: &str, uri: &str) -> (StatusCode, serde_json::Value) {
    call_with(app, method, uri, &[]).await
}

async fn call_with(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

/// The `admin` router over the store, as an operator's HTTP client meets it: stats, a record
/// by key and scope or by the key hash `stats` names, forget, sweep.
async fn admin_router_verbs(store: DynStore) {
    let app = Router::new().nest("/admin", admin::router(store.clone()));
    let (status, stats) = call(&app, "GET", "/admin/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        stats,
        serde_json::json!({"running": 0, "done": 0, "expired": 0, "oldestRunning": null})
    );

    let done = IdempotencyKey::parse(b"order-1")
        .unwrap()
        .scoped_hash(&Scope::new("Bearer alice"));
    save_done(&store, done).await;
    let running = random_key();
    claim_running(&store, running).await;

    let (status, stats) = call(&app, "GET", "/admin/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (stats["running"].as_u64(), stats["done"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );
    let hash = stats["oldestRunning"]["keyHash"].as_str().expect("{stats}");
    assert_eq!(hash, running.to_hex());
    assert!(
        stats["oldestRunning"]["ageMs"].as_u64().unwrap() >= 2,
        "{stats}"
    );

    let (status, record) = call(&app, "GET", &format!("/admin/key-hashes/{hash}")).await;
    assert_eq!(status, StatusCode::OK, "{record}");
    assert_eq!(record["state"], "running");
    let (status, record) = call(&app, "GET", "/admin/keys/order-1?scope=Bearer%20alice").await;
    assert_eq!(status, StatusCode::OK, "{record}");
    assert_eq!(
        (record["state"].as_str(), record["status"].as_u64()),
        (Some("done"), Some(201))
    );
    assert!(record.get("body").is_none(), "the body only when asked");
    let (_, record) = call(
        &app,
        "GET",
        "/admin/keys/order-1?scope=Bearer%20alice&body=true",
    )
    .await;
    assert!(
        record["body"].as_str().unwrap().starts_with("{\"id\":1}"),
        "{record}"
    );
    let (status, _) = call(&app, "GET", "/admin/keys/order-1").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another scope");
    // The scope in a header, out of the URL (and of access logs); it wins over the query.
    let scope = [("idempotency-scope", "Bearer alice")];
    let (status, record) = call_with(&app, "GET", "/admin/keys/order-1", &scope).await;
    assert_eq!(status, StatusCode::OK, "{record}");
    let (status, _) = call_with(&app, "GET", "/admin/keys/order-1?scope=Bearer+bob", &scope).await;
    assert_eq!(status, StatusCode::OK, "the header wins");

    let (status, problem) = call(&app, "GET", "/admin/key-hashes/abc").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    let (status, _) = call(&app, "DELETE", &format!("/admin/key-hashes/{hash}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(&app, "DELETE", &format!("/admin/key-hashes/{hash}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&app, "DELETE", "/admin/keys/order-1?scope=Bearer+alice").await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    claim_expired(&store).await;
    let (status, swept) = call(&app, "POST", "/admin/sweep?batch=1").await;
    assert_eq!(status, StatusCode::OK);
    let deletes_expired_itself = store.name() == "redis";
    assert_eq!(
        swept["deleted"],
        u64::from(!deletes_expired_itself),
        "{swept}"
    );
    let (_, stats) = call(&app, "GET", "/admin/stats").await;
    assert_eq!(
        stats,
        serde_json::json!({"running": 0, "done": 0, "expired": 0, "oldestRunning": null})
    );
}

/// Redis Cluster spreads keys over nodes one `SCAN` does not reach: `stats` says so, as a 501
/// from the router.
#[tokio::test(flavor = "multi_thread")]
async fn stats_on_redis_cluster_is_unsupported() {
    let store = redis_cluster_store().await;
    let err = store.stats().await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unsupported);
    let app = admin::router(DynStore::new(store));
    let (status, problem) = call(&app, "GET", "/stats").await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{problem}");
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

            #[tokio::test(flavor = "multi_thread")]
            async fn stats_count_by_state() {
                super::stats_count_by_state($store.await).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn stats_through_a_dyn_store() {
                super::stats_count_by_state(DynStore::new($store.await)).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn admin_router_verbs() {
                super::admin_router_verbs(DynStore::new($store.await)).await;
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
