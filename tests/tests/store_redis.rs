//! What only the Redis store does, against a real server at `REDIS_URL`, each test under its own
//! key prefix: key expiry, script reloading, pub/sub waiting, key names, corrupt records. The
//! store contract every store shares is in `store_contract.rs`.

use std::time::{Duration, Instant};

use tower_idempotency::store::{
    redis::{redis, RedisStore},
    ClaimOutcome, Fenced, Hold, Store, StoreErrorKind,
};
use tower_idempotency_tests::{
    contract::{
        claim_of, claimed, fingerprint, is_in_flight, random_key, response, retry_of, DAY, LONG,
    },
    redis_client,
    stores::redis_store as store,
    unique_name,
};

/// A plain connection for inspecting keys.
async fn raw() -> redis::aio::MultiplexedConnection {
    redis_client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
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
async fn a_takeover_extends_the_key_pttl_only_to_its_lease() {
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

    // The lapse under test. A lease that ends before the expiry leaves it as it was.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store
            .claim(&claim_of(key, "a", Duration::from_secs(1), DAY))
            .await
            .unwrap(),
        ClaimOutcome::Claimed { taken_over: true }
    );
    let after = pttl(&mut conn, &name).await;
    assert!(
        after > 0 && after <= before - 250,
        "a takeover whose lease ends first must not extend the expiry: {before} -> {after}"
    );
    let expires_after: i64 = redis::cmd("HGET")
        .arg(&name)
        .arg("expires_at")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(expires_after, expires_at);

    // A lease that runs past it moves the expiry, and the key's own expiry, to its end: the
    // record does not expire (nor is it evicted) under a live holder.
    let key = random_key();
    let name = store.record_key(&key);
    let short = Duration::from_millis(200);
    store
        .claim(&claim_of(key, "a", short, Duration::from_secs(1)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: true }
    );
    let after = pttl(&mut conn, &name).await;
    assert!(after > 59_000 && after <= 60_000, "pttl {after}");
    let (lease_until, expires_at): (i64, i64) = redis::cmd("HMGET")
        .arg(&name)
        .arg("lease_until")
        .arg("expires_at")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(expires_at, lease_until);
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
        .complete(&Hold::new(key, first.token), &response())
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

/// Polls (every 10 ms, for 5 s at most) until `channel`'s subscriber count satisfies `wanted`.
async fn until_subscribers(
    conn: &mut redis::aio::MultiplexedConnection,
    channel: &str,
    wanted: impl Fn(i64) -> bool,
    what: &str,
) {
    let polled = async {
        loop {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut *conn)
                .await
                .unwrap();
            if wanted(n) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), polled)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 5 s"));
}

/// Empty the server's script cache, as a restart or a failover does.
async fn flush_scripts(conn: &mut redis::aio::MultiplexedConnection) {
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripts_are_reloaded_after_script_flush() {
    let store = store().await;
    let mut conn = raw().await;
    let key = random_key();
    let first = claim_of(key, "a", LONG, DAY);
    store.claim(&first).await.unwrap();

    flush_scripts(&mut conn).await;
    assert_eq!(
        store
            .renew(&Hold::new(key, first.token), LONG)
            .await
            .unwrap(),
        Fenced::Applied
    );
    flush_scripts(&mut conn).await;
    assert!(matches!(
        store.claim(&claim_of(key, "a", LONG, DAY)).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    flush_scripts(&mut conn).await;
    assert_eq!(
        store
            .complete(&Hold::new(key, first.token), &response())
            .await
            .unwrap(),
        Fenced::Applied
    );
    flush_scripts(&mut conn).await;
    let other = random_key();
    let claim = claim_of(other, "a", LONG, DAY);
    assert_eq!(
        store.claim(&claim).await.unwrap(),
        ClaimOutcome::Claimed { taken_over: false }
    );
    flush_scripts(&mut conn).await;
    assert_eq!(
        store.release(&Hold::new(other, claim.token)).await.unwrap(),
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
            store
                .complete(&Hold::new(key, held.token), &response())
                .await
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

    // Each waiter on a pub/sub connection of its own (as ten instances would be), so that the
    // channel's subscriber count says when every one of them is subscribed.
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let store = store.clone().with_notifications(redis_client());
            tokio::spawn(async move {
                let started = Instant::now();
                store.wait_for_change(&key, Duration::from_secs(10)).await;
                started.elapsed()
            })
        })
        .collect();
    // Release once every waiter is subscribed: the subscription count is the signal.
    let channel = store.channel(&key);
    until_subscribers(&mut conn, &channel, |n| n == 10, "the waiters subscribe").await;
    assert_eq!(
        store.release(&Hold::new(key, held.token)).await.unwrap(),
        Fenced::Applied
    );
    for waiter in waiters {
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    }

    // The last waiter's unsubscribe runs in the background; it must happen.
    until_subscribers(
        &mut conn,
        &channel,
        |n| n == 0,
        "the channel is unsubscribed once nobody waits",
    )
    .await;
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
    store
        .complete(&Hold::new(key, held.token), &response())
        .await
        .unwrap();
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

/// The kind of error a claim of a new key meets when the key's record is the hash `fields`
/// (expiring in a minute), written behind the store's back.
async fn claim_over_hash(store: &RedisStore, fields: &[(&str, &str)]) -> StoreErrorKind {
    let mut conn = raw().await;
    let key = random_key();
    let mut hset = redis::cmd("HSET");
    hset.arg(store.record_key(&key));
    for (field, value) in fields {
        hset.arg(*field).arg(*value);
    }
    hset.query_async::<()>(&mut conn).await.unwrap();
    expire_soon(&mut conn, &store.record_key(&key)).await;
    let err = store
        .claim(&claim_of(key, "a", LONG, DAY))
        .await
        .unwrap_err();
    err.kind()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupt_record_is_an_error_not_a_panic() {
    let store = store().await;
    let fp = fingerprint("a").to_hex();
    let far = (i64::MAX / 2).to_string();

    let bogus_state = [
        ("fp", fp.as_str()),
        ("state", "bogus"),
        ("expires_at", &far),
    ];
    assert_eq!(
        claim_over_hash(&store, &bogus_state).await,
        StoreErrorKind::Corrupt
    );
    let bad_status = [
        ("fp", fp.as_str()),
        ("state", "done"),
        ("expires_at", &far),
        ("status", "not a number"),
    ];
    assert_eq!(
        claim_over_hash(&store, &bad_status).await,
        StoreErrorKind::Corrupt
    );

    // Not even a hash: the script fails with WRONGTYPE.
    let mut conn = raw().await;
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

/// A Redis Cluster client sends a call again when the connection drops before its answer (up to
/// sixteen times), so a claim can reach the server twice. Sent again with its own token, it is
/// answered claimed, not in flight behind itself (which would answer its request 409 and leave
/// the key held for a lease by nobody). Another request's claim is still in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_sent_twice_is_answered_as_once() {
    let store = store().await;
    let claim = claim_of(random_key(), "sent twice", LONG, DAY);
    for attempt in ["the claim", "the same claim again"] {
        assert_eq!(
            store.claim(&claim).await.unwrap(),
            claimed(false),
            "{attempt}"
        );
    }
    let retry = store.claim(&retry_of(&claim)).await.unwrap();
    assert!(
        is_in_flight(&retry),
        "another request's claim (another token) is in flight: {retry:?}"
    );
    let saved = response();
    assert_eq!(
        store.complete(&claim.hold(), &saved).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.claim(&claim).await.unwrap(),
        ClaimOutcome::Done(saved),
        "once saved, the same claim is answered the saved response"
    );
}
