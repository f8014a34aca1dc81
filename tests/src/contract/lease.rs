//! Leases: takeover after a lapse, fencing of the old holder, renewal, and the expiry a takeover
//! keeps.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tower_idempotency::store::{Claim, ClaimOutcome, Fenced, Hold, Store};

use super::{
    claim_of, claimed, is_done, is_in_flight, numbered_response, race, random_key, response,
    retry_of, retry_with_lease, stranger, until, DAY, LONG, MARGIN,
};

/// A running record whose lease lapsed is taken over by a retry (`taken_over: true`, a new
/// token). The old holder is fenced out: its `renew`, `complete` and `release` are `Lost` and
/// change nothing; the new holder's answer is the one replayed. Eight keys, so a cluster spreads
/// them over its nodes.
pub async fn a_lapsed_lease_is_taken_over_and_fences_the_old_holder<S: Store>(store: S) {
    let lease = Duration::from_millis(200);
    let old: Vec<_> = (0..8)
        .map(|_| claim_of(random_key(), "a", lease, DAY))
        .collect();
    for claim in &old {
        assert_eq!(store.claim(claim).await.unwrap(), claimed(false));
        assert!(is_in_flight(&store.claim(&retry_of(claim)).await.unwrap()));
    }
    let started = Instant::now(); // every lease counts from before this

    until(started + lease + MARGIN).await;
    for (n, old) in old.iter().enumerate() {
        let new = retry_with_lease(old, LONG);
        assert_eq!(store.claim(&new).await.unwrap(), claimed(true));

        assert_eq!(store.renew(&old.hold(), LONG).await.unwrap(), Fenced::Lost);
        assert_eq!(
            store
                .complete(&old.hold(), &numbered_response(n))
                .await
                .unwrap(),
            Fenced::Lost
        );
        assert_eq!(store.release(&old.hold()).await.unwrap(), Fenced::Lost);
        assert!(
            is_in_flight(&store.claim(&retry_of(old)).await.unwrap()),
            "the old holder's writes changed nothing"
        );

        let saved = response();
        assert_eq!(
            store.complete(&new.hold(), &saved).await.unwrap(),
            Fenced::Applied
        );
        assert_eq!(
            store.claim(&retry_of(old)).await.unwrap(),
            ClaimOutcome::Done(saved)
        );
    }
}

/// 30 retries race for a record whose lease lapsed: exactly one takes it over, the others find
/// it in flight.
pub async fn concurrent_takeovers_have_exactly_one_winner<S: Store>(store: S) {
    let store = Arc::new(store);
    let lease = Duration::from_millis(100);
    let first = claim_of(random_key(), "race", lease, DAY);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now(); // the lease counts from before this
    until(started + lease + MARGIN).await;

    let claims = (0..30).map(|_| retry_with_lease(&first, LONG)).collect();
    let outcomes = race(&store, claims).await;
    assert_eq!(outcomes.iter().filter(|o| **o == claimed(true)).count(), 1);
    assert_eq!(outcomes.iter().filter(|o| is_in_flight(o)).count(), 29);
}

/// The lease of the first claim of [`taken_over`], and of a takeover that ends before
/// [`FIRST_TTL`] does.
const TAKEOVER_LEASE: Duration = Duration::from_millis(200);
/// The retention of the first claim of [`taken_over`].
const FIRST_TTL: Duration = Duration::from_secs(1);

/// A key claimed (lease [`TAKEOVER_LEASE`], retention [`FIRST_TTL`]), left to lapse, then taken
/// over with `lease` (retention asked: a day): the first claim, the takeover, and a moment before
/// the first lease and retention began.
async fn taken_over<S: Store>(store: &S, lease: Duration) -> (Claim, Claim, Instant) {
    let first = claim_of(random_key(), "a", TAKEOVER_LEASE, FIRST_TTL);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    let started = Instant::now();
    until(started + TAKEOVER_LEASE + MARGIN).await;
    let new = claim_of(first.key, "a", lease, DAY);
    assert_eq!(store.claim(&new).await.unwrap(), claimed(true));
    (first, new, started)
}

/// A takeover keeps the expiry counted from the first claim, and so does `complete`: the record
/// is gone at the original expiry, not a retention after the takeover.
pub async fn a_takeover_keeps_the_original_expiry<S: Store>(store: S) {
    // The takeover asks for a day; the record must keep its original expiry (its new lease
    // ends before that).
    let (first, new, started) = taken_over(&store, TAKEOVER_LEASE).await;
    assert_eq!(
        store.complete(&new.hold(), &response()).await.unwrap(),
        Fenced::Applied
    );
    assert!(is_done(&store.claim(&retry_of(&first)).await.unwrap()));

    until(started + FIRST_TTL + MARGIN).await;
    let other = claim_of(first.key, "other", LONG, DAY);
    assert_eq!(
        store.claim(&other).await.unwrap(),
        claimed(false),
        "the record expired at the first claim's expiry"
    );
}

/// A takeover whose new lease runs past the original expiry moves the expiry with it, as a
/// renewal does: the record does not expire under its live holder, so another request (another
/// body too) finds it in flight, not expired and free to claim afresh.
pub async fn a_takeover_does_not_expire_under_its_holder<S: Store>(store: S) {
    let (first, new, started) = taken_over(&store, LONG).await;

    until(started + FIRST_TTL + MARGIN).await;
    assert!(
        is_in_flight(&store.claim(&retry_of(&first)).await.unwrap()),
        "the taken-over record outlives its original expiry while its lease runs"
    );
    let other = claim_of(first.key, "other", LONG, DAY);
    assert_eq!(
        store.claim(&other).await.unwrap(),
        ClaimOutcome::Mismatch,
        "another body finds the live record, not an expired one"
    );
    assert_eq!(
        store.complete(&new.hold(), &response()).await.unwrap(),
        Fenced::Applied
    );
}

/// `renew` extends the lease from now, only with the holder's token and only while the record
/// runs; without another renewal the lease lapses in turn.
pub async fn renew_extends_the_lease<S: Store>(store: S) {
    let lease = Duration::from_millis(300);
    let claim = claim_of(random_key(), "a", lease, DAY);
    let started = Instant::now();
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));

    assert_eq!(
        store
            .renew(&Hold::new(claim.key, stranger()), LONG)
            .await
            .unwrap(),
        Fenced::Lost,
        "a stranger's token renews nothing"
    );
    until(started + Duration::from_millis(150)).await;
    assert_eq!(
        store.renew(&claim.hold(), lease).await.unwrap(),
        Fenced::Applied
    );
    // Past the first lease (300 ms), well within the renewed one (450 ms and more).
    until(started + Duration::from_millis(350)).await;
    let outcome = store.claim(&retry_of(&claim)).await.unwrap();
    assert!(
        is_in_flight(&outcome),
        "renewed lease still held: {outcome:?}"
    );

    // A long renewal shows in the lease left.
    assert_eq!(
        store.renew(&claim.hold(), LONG).await.unwrap(),
        Fenced::Applied
    );
    match store.claim(&retry_of(&claim)).await.unwrap() {
        ClaimOutcome::InFlight { lease_remaining } => assert!(
            lease_remaining > Duration::from_secs(50),
            "{lease_remaining:?}"
        ),
        other => panic!("expected in flight, got {other:?}"),
    }
    // Shortened again, the lease lapses in turn and a retry takes over.
    assert_eq!(
        store.renew(&claim.hold(), lease).await.unwrap(),
        Fenced::Applied
    );
    let shortened = Instant::now(); // the lease counts from before this
    until(shortened + lease + MARGIN).await;
    assert_eq!(store.claim(&retry_of(&claim)).await.unwrap(), claimed(true));

    // Renewing a record that is not running is refused.
    let other = claim_of(random_key(), "b", LONG, DAY);
    store.claim(&other).await.unwrap();
    store.complete(&other.hold(), &response()).await.unwrap();
    assert_eq!(
        store.renew(&other.hold(), LONG).await.unwrap(),
        Fenced::Lost
    );
}
