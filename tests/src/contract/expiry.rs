//! Expiry: an expired record is absent to every request, and `sweep` deletes expired records in
//! bounded batches.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tower_idempotency::store::{ClaimOutcome, Fenced, Store};

use super::{
    claim_of, claimed, is_done, is_in_flight, race, random_key, response, retry_of, until,
    Retention, DAY, LONG, MARGIN,
};

/// After its retention a done record is gone: another request claims the key afresh (a running
/// record of its own, with a fresh expiry), the first request is now the mismatch, and the old
/// holder's token is dead.
pub async fn an_expired_record_can_be_claimed_by_another_request<S: Store>(store: S) {
    let ttl = Duration::from_millis(400);
    let first = claim_of(random_key(), "first", LONG, ttl);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now(); // the expiry counts from before this
    store.complete(&first.hold(), &response()).await.unwrap();
    assert!(is_done(&store.claim(&retry_of(&first)).await.unwrap()));
    until(started + ttl + MARGIN).await;

    let other = claim_of(first.key, "other", LONG, DAY);
    assert_eq!(store.claim(&other).await.unwrap(), claimed(false));
    assert!(is_in_flight(&store.claim(&retry_of(&other)).await.unwrap()));
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Mismatch);
    assert_eq!(
        store.complete(&first.hold(), &response()).await.unwrap(),
        Fenced::Lost
    );
}

/// 30 claims by two different requests race for a key whose running record expired: exactly
/// one claims it afresh (not a takeover); the others are in flight or a mismatch.
pub async fn concurrent_claims_of_an_expired_record_have_exactly_one_winner<S: Store>(store: S) {
    let store = Arc::new(store);
    let key = random_key();
    let ttl = Duration::from_millis(100);
    let old = claim_of(key, "old", LONG, ttl);
    assert_eq!(store.claim(&old).await.unwrap(), claimed(false));
    let started = Instant::now(); // the expiry counts from before this
    until(started + ttl + MARGIN).await;

    let claims = (0..30)
        .map(|i| claim_of(key, if i % 2 == 0 { "even" } else { "odd" }, LONG, DAY))
        .collect();
    let outcomes = race(&store, claims).await;
    assert_eq!(outcomes.iter().filter(|o| **o == claimed(false)).count(), 1);
    for outcome in &outcomes {
        assert!(
            matches!(
                outcome,
                ClaimOutcome::Claimed { taken_over: false }
                    | ClaimOutcome::InFlight { .. }
                    | ClaimOutcome::Mismatch
            ),
            "{outcome:?}"
        );
    }
}

/// `sweep(batch)` deletes at most `batch` expired records (running or done) per call and never
/// a live one; a swept running record's holder is fenced out. A store whose server expires
/// records by itself (Redis) has nothing left to sweep, with the same effect on the keys.
pub async fn sweep_deletes_only_expired_records_in_bounded_batches<S: Retention>(store: S) {
    let ttl = Duration::from_millis(100);
    let expired: Vec<_> = (0..25)
        .map(|i| claim_of(random_key(), &format!("old {i}"), LONG, ttl))
        .collect();
    for (i, claim) in expired.iter().enumerate() {
        assert_eq!(store.claim(claim).await.unwrap(), claimed(false));
        if i % 2 == 0 {
            store.complete(&claim.hold(), &response()).await.unwrap();
        }
    }
    let started = Instant::now(); // every short record expires within `ttl` of this
    let live: Vec<_> = (0..5)
        .map(|i| claim_of(random_key(), &format!("live {i}"), LONG, DAY))
        .collect();
    for claim in &live {
        assert_eq!(store.claim(claim).await.unwrap(), claimed(false));
    }
    store.complete(&live[0].hold(), &response()).await.unwrap();
    until(started + ttl + MARGIN).await;

    let mut swept = Vec::new();
    for _ in 0..5 {
        swept.push(store.sweep(10).await.unwrap());
    }
    if S::EXPIRES_BY_ITSELF {
        assert_eq!(swept, [0, 0, 0, 0, 0]);
    } else {
        assert_eq!(swept, [10, 10, 5, 0, 0]);
    }

    // The live records are untouched.
    assert!(is_done(&store.claim(&retry_of(&live[0])).await.unwrap()));
    for claim in &live[1..] {
        assert!(is_in_flight(&store.claim(&retry_of(claim)).await.unwrap()));
    }
    // A swept running record's holder is fenced out, and its key is free.
    assert_eq!(
        store
            .complete(&expired[1].hold(), &response())
            .await
            .unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store.claim(&retry_of(&expired[1])).await.unwrap(),
        claimed(false)
    );
}
