//! The store contract: what every [`Store`] must do, written once, generic over `S: Store`, and
//! run against every backend by [`store_contract_tests!`](crate::store_contract_tests)
//! (`tests/tests/store_contract.rs`).
//!
//! The bodies call the store directly (no HTTP): atomic claims under contention, takeover and
//! fencing, expiry, mismatch, renew, release, sweep and replay. Leases and expiry are judged by
//! the store's own clock; the tests use short leases and retentions and sleep only past a lease
//! or an expiry, which is the passing of time under test.
//!
//! Backend files (`store_sql.rs`, `store_redis.rs`, `store_redis_cluster.rs`) keep only what is
//! specific to their backend.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tower_idempotency::{
    store::{Claim, ClaimOutcome, FencingToken, MemoryStore, Store, StoredResponse},
    Fingerprint, KeyHash,
};

use crate::records::{new_claim, stored_response};

mod claim;
mod expiry;
mod lease;
mod replay;

pub use claim::*;
pub use expiry::*;
pub use lease::*;
pub use replay::*;

/// Instantiate the whole contract in the calling module, one `#[tokio::test]` per contract test,
/// each on a fresh store made by `$store` (an expression, evaluated inside the test).
///
/// The list below is the contract: every backend expands all of it, and
/// `every_contract_test_is_listed` (this crate's unit tests) fails when a `pub async fn` of
/// `src/contract/` is missing from it.
#[macro_export]
macro_rules! store_contract_tests {
    ($store:expr) => {
        $crate::store_contract_tests!(@list [tests $store]);
    };
    (@names) => {
        $crate::store_contract_tests!(@list [names])
    };
    (@list $mode:tt) => {
        $crate::store_contract_tests! {@expand $mode;
            concurrent_claims_have_exactly_one_winner,
            in_flight_reports_the_lease_left,
            a_different_fingerprint_is_a_mismatch_in_every_state,
            a_lapsed_lease_is_taken_over_and_fences_the_old_holder,
            concurrent_takeovers_have_exactly_one_winner,
            a_takeover_keeps_the_original_expiry,
            a_takeover_does_not_expire_under_its_holder,
            renew_extends_the_lease,
            an_expired_record_can_be_claimed_by_another_request,
            concurrent_claims_of_an_expired_record_have_exactly_one_winner,
            sweep_deletes_only_expired_records_in_bounded_batches,
            complete_then_claim_replays_the_response,
            empty_response_round_trips,
            many_keys_complete_and_replay_independently,
            release_then_claim_again,
        }
    };
    (@expand [names]; $($name:ident),+ $(,)?) => {
        &[$(stringify!($name)),+]
    };
    (@expand [tests $store:expr]; $($name:ident),+ $(,)?) => {
        $crate::bounded_tests!($store; $($name => $crate::contract::$name),+);
    };
}

/// The names of the contract tests, as [`store_contract_tests!`](crate::store_contract_tests)
/// instantiates them.
pub const CONTRACT_TESTS: &[&str] = crate::store_contract_tests!(@names);

/// How a backend frees expired records: the one point where the contract lets stores differ.
pub trait Retention: Store {
    /// `true` when the server deletes expired records by itself (Redis key expiry), so
    /// [`Store::sweep`] has nothing left to delete.
    const EXPIRES_BY_ITSELF: bool;
}

impl Retention for MemoryStore {
    const EXPIRES_BY_ITSELF: bool = false;
}

impl Retention for tower_idempotency::store::postgres::PostgresStore {
    const EXPIRES_BY_ITSELF: bool = false;
}

impl Retention for tower_idempotency::store::sqlite::SqliteStore {
    const EXPIRES_BY_ITSELF: bool = false;
}

impl Retention for tower_idempotency::store::mysql::MySqlStore {
    const EXPIRES_BY_ITSELF: bool = false;
}

impl Retention for tower_idempotency::store::redis::RedisStore {
    const EXPIRES_BY_ITSELF: bool = true;
}

/// No test of this crate's lists may take longer than this, whatever hangs.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// A lease or retention that never runs out during a test.
pub const LONG: Duration = Duration::from_secs(60);
/// The retention of records that must outlive the test.
pub const DAY: Duration = Duration::from_secs(24 * 3600);
/// How far past a lease or an expiry a test waits, so the store's clock has passed it too.
pub const MARGIN: Duration = Duration::from_millis(100);

/// Run a test, failing it with its name when it does not finish in [`TEST_TIMEOUT`].
pub async fn bounded<T>(what: &str, test: impl Future<Output = T>) -> T {
    within(TEST_TIMEOUT, what, test).await
}

/// Run `f` with a bound; panics with `what` when it does not finish in `limit`.
pub async fn within<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// One `#[tokio::test]` per `name => body`, each running `body(store)` on a store `$store` makes
/// (an expression, evaluated inside the test), bounded by [`TEST_TIMEOUT`]: the expansion the
/// crate's test lists share.
#[doc(hidden)]
#[macro_export]
macro_rules! bounded_tests {
    ($store:expr; $($name:ident => $body:path),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store = $store;
                $crate::contract::bounded(stringify!($name), $body(store)).await;
            }
        )+
    };
}

/// A key no other test uses.
pub fn random_key() -> KeyHash {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    KeyHash(bytes)
}

/// The fingerprint of `POST /orders` with `body`.
pub fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::of(&[b"POST", b"/orders", body.as_bytes()])
}

/// A claim of `key` by the request with `body`.
pub fn claim_of(key: KeyHash, body: &str, lease: Duration, ttl: Duration) -> Claim {
    new_claim(key, fingerprint(body), lease, ttl)
}

/// The same request again (same key and fingerprint, a new token), with its own lease.
pub fn retry_with_lease(claim: &Claim, lease: Duration) -> Claim {
    new_claim(claim.key, claim.fingerprint, lease, claim.ttl)
}

/// The same request again: same key, fingerprint, lease and retention; a new token.
pub fn retry_of(claim: &Claim) -> Claim {
    retry_with_lease(claim, claim.lease)
}

/// A token no claim was given.
pub fn stranger() -> FencingToken {
    FencingToken::new()
}

/// A response with a multi-valued header interleaved with others (order matters), a header
/// value with a colon, a non-UTF-8 value and a binary body.
pub fn response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-multi", HeaderValue::from_static("first"));
    headers.append("x-multi", HeaderValue::from_static("second: with colon"));
    headers.append("set-cookie", HeaderValue::from_static("a=1"));
    headers.append("x-multi", HeaderValue::from_static("third"));
    headers.append("x-bytes", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    headers.append("location", HeaderValue::from_static("/orders/1"));
    stored_response(
        StatusCode::CREATED,
        headers,
        Bytes::from_static(b"{\"id\":1}\x00\xff binary tail"),
    )
}

/// A response that tells key number `n` apart from the others.
pub fn numbered_response(n: usize) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("x-multi", HeaderValue::from_static("one"));
    headers.append("x-multi", HeaderValue::from_static("two"));
    headers.append("x-n", HeaderValue::from(n));
    stored_response(
        StatusCode::CREATED,
        headers,
        Bytes::from(format!("order {n}\0")),
    )
}

/// `Claimed`, fresh (`false`) or by takeover (`true`).
pub fn claimed(taken_over: bool) -> ClaimOutcome {
    ClaimOutcome::Claimed { taken_over }
}

/// Whether another attempt holds the key.
pub fn is_in_flight(outcome: &ClaimOutcome) -> bool {
    matches!(outcome, ClaimOutcome::InFlight { .. })
}

/// Whether the key holds a saved answer.
pub fn is_done(outcome: &ClaimOutcome) -> bool {
    matches!(outcome, ClaimOutcome::Done(_))
}

/// Sleep until `at`: the passing of a lease or a retention is what the test is about.
pub async fn until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

/// Run `claims` at once on `store`: every task waits on one barrier, then claims.
pub async fn race<S: Store>(store: &std::sync::Arc<S>, claims: Vec<Claim>) -> Vec<ClaimOutcome> {
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(claims.len()));
    let tasks: Vec<_> = claims
        .into_iter()
        .map(|claim| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                store.claim(&claim).await.expect("claim")
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await.expect("claim task"));
    }
    outcomes
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;

    /// The names of the top-level `pub async fn`s in the `.rs` files of `dir` (relative to the
    /// crate), except the files in `skip`.
    pub(crate) fn public_async_fns(dir: &str, skip: &[&str]) -> BTreeSet<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut names = BTreeSet::new();
        for entry in std::fs::read_dir(&dir).expect("read the suite directory") {
            let path = entry.unwrap().path();
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.extension().is_none_or(|e| e != "rs") || skip.contains(&file.as_str()) {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            for line in source.lines() {
                if let Some(rest) = line.strip_prefix("pub async fn ") {
                    let end = rest.find(['<', '(']).expect("a function signature");
                    names.insert(rest[..end].to_owned());
                }
            }
        }
        names
    }

    #[test]
    fn every_contract_test_is_listed() {
        let defined = public_async_fns("src/contract", &["mod.rs"]);
        let listed: BTreeSet<String> = super::CONTRACT_TESTS
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            defined, listed,
            "every contract test in src/contract/ must be in the list of store_contract_tests!"
        );
        assert!(
            defined.len() >= 10,
            "the scan found the contract: {defined:?}"
        );
    }
}
