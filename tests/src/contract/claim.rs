//! Claiming: one winner under contention, the lease left in flight, a key bound to its request.

use std::{sync::Arc, time::Duration, time::Instant};

use tower_idempotency::store::{ClaimOutcome, Fenced, Store};

use super::{
    claim_of, claimed, is_done, race, random_key, response, retry_of, until, DAY, LONG, MARGIN,
};

/// 50 attempts with one key, released at once by a barrier: exactly one is claimed, the others
/// are in flight with (nearly) the whole lease left. Four keys, so a cluster spreads them over
/// its nodes.
pub async fn concurrent_claims_have_exactly_one_winner<S: Store>(store: S) {
    let store = Arc::new(store);
    for _ in 0..4 {
        let first = claim_of(random_key(), "race", LONG, DAY);
        let claims = (0..50).map(|_| retry_of(&first)).collect();
        let mut winners = 0;
        for outcome in race(&store, claims).await {
            match outcome {
                ClaimOutcome::Claimed { taken_over: false } => winners += 1,
                // A little over the lease is the store's clock, not a bug: PostgreSQL's `now()`
                // is the start of the losing statement, which may predate the winner's.
                ClaimOutcome::InFlight { lease_remaining } => assert!(
                    lease_remaining > Duration::from_secs(50)
                        && lease_remaining <= LONG + Duration::from_secs(1),
                    "{lease_remaining:?}"
                ),
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert_eq!(winners, 1);
    }
}

/// `InFlight` reports the time left on the holder's lease.
pub async fn in_flight_reports_the_lease_left<S: Store>(store: S) {
    let lease = Duration::from_secs(30);
    let claim = claim_of(random_key(), "a", lease, DAY);
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
    let ClaimOutcome::InFlight { lease_remaining } = store.claim(&retry_of(&claim)).await.unwrap()
    else {
        panic!("expected in flight");
    };
    assert!(lease_remaining <= lease, "{lease_remaining:?}");
    assert!(
        lease_remaining > Duration::from_secs(25),
        "{lease_remaining:?}"
    );
}

/// Another fingerprint is a mismatch while the record runs, after its lease lapsed (and is not
/// a takeover then), and once it is done.
pub async fn a_different_fingerprint_is_a_mismatch_in_every_state<S: Store>(store: S) {
    let lease = Duration::from_millis(200);
    let first = claim_of(random_key(), "first", lease, DAY);
    let other = claim_of(first.key, "other", LONG, DAY);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now(); // the lease counts from before this

    // Running, lease valid.
    assert_eq!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch);

    // Running, lease lapsed: still bound to the first request, and not taken over.
    until(started + lease + MARGIN).await;
    assert_eq!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch);
    assert_eq!(
        store.renew(&first.hold(), LONG).await.unwrap(),
        Fenced::Applied,
        "a mismatched claim must not take the record over"
    );

    // Done.
    assert_eq!(
        store.complete(&first.hold(), &response()).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch);
    assert!(is_done(&store.claim(&retry_of(&first)).await.unwrap()));
}
