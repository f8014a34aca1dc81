//! Saving and replaying: `complete` then `claim` gives the saved answer back byte for byte;
//! `release` frees the key.

use http::{HeaderMap, StatusCode};
use tower_idempotency::store::{ClaimOutcome, Fenced, Hold, Store};

use super::{
    claim_of, claimed, numbered_response, random_key, response, retry_of, stranger, DAY, LONG,
};
use crate::records::stored_response;

/// A saved response is replayed as it was: status, every value of a multi-valued header in
/// order, header order, non-UTF-8 values, a binary body. A second `complete`, even with the
/// holder's token, finds the record done and overwrites nothing.
pub async fn complete_then_claim_replays_the_response<S: Store>(store: S) {
    let claim = claim_of(random_key(), "a", LONG, DAY);
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
    let saved = response();
    assert_eq!(
        store.complete(&claim.hold(), &saved).await.unwrap(),
        Fenced::Applied
    );
    let ClaimOutcome::Done(replayed) = store.claim(&retry_of(&claim)).await.unwrap() else {
        panic!("expected a replay");
    };
    assert_eq!(replayed, saved);
    assert_eq!(replayed.status, StatusCode::CREATED);
    assert_eq!(replayed.body, saved.body);
    let multi: Vec<_> = replayed.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["first", "second: with colon", "third"]);
    let names: Vec<_> = replayed.headers.keys().map(|n| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "content-type",
            "x-multi",
            "set-cookie",
            "x-bytes",
            "location"
        ],
        "header order is kept"
    );
    assert_eq!(replayed.headers["x-bytes"].as_bytes(), b"caf\xe9");

    let mut other = saved.clone();
    other.status = StatusCode::INTERNAL_SERVER_ERROR;
    assert_eq!(
        store.complete(&claim.hold(), &other).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(saved)
    );
}

/// A response with no headers and an empty body round-trips.
pub async fn empty_response_round_trips<S: Store>(store: S) {
    let claim = claim_of(random_key(), "a", LONG, DAY);
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
    let saved = stored_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        HeaderMap::new(),
        Default::default(),
    );
    assert_eq!(
        store.complete(&claim.hold(), &saved).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(saved)
    );
}

/// 64 keys (many cluster slots) each keep their own answer and their own request.
pub async fn many_keys_complete_and_replay_independently<S: Store>(store: S) {
    let claims: Vec<_> = (0..64)
        .map(|_| claim_of(random_key(), "order", LONG, DAY))
        .collect();
    for (n, claim) in claims.iter().enumerate() {
        assert_eq!(store.claim(claim).await.unwrap(), claimed(false));
        assert_eq!(
            store
                .complete(&claim.hold(), &numbered_response(n))
                .await
                .unwrap(),
            Fenced::Applied
        );
    }
    for (n, claim) in claims.iter().enumerate() {
        assert_eq!(
            store.claim(&retry_of(claim)).await.unwrap(),
            ClaimOutcome::Done(numbered_response(n))
        );
        assert_eq!(
            store
                .claim(&claim_of(claim.key, "other", LONG, DAY))
                .await
                .unwrap(),
            ClaimOutcome::Mismatch
        );
    }
}

/// `release` deletes a running record held with the token, and nothing else: a stranger's token
/// or a second release is `Lost`, a done record cannot be released. The released key is free,
/// even for another request, and the released holder's `complete` is `Lost`.
pub async fn release_then_claim_again<S: Store>(store: S) {
    let first = claim_of(random_key(), "a", LONG, DAY);
    assert_eq!(store.claim(&first).await.unwrap(), claimed(false));
    assert_eq!(
        store
            .release(&Hold::new(first.key, stranger()))
            .await
            .unwrap(),
        Fenced::Lost,
        "a stranger's token releases nothing"
    );
    assert_eq!(store.release(&first.hold()).await.unwrap(), Fenced::Applied);
    assert_eq!(store.release(&first.hold()).await.unwrap(), Fenced::Lost);

    let second = claim_of(first.key, "b", LONG, DAY);
    assert_eq!(store.claim(&second).await.unwrap(), claimed(false));
    assert_eq!(
        store.complete(&first.hold(), &response()).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store.complete(&second.hold(), &response()).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.release(&second.hold()).await.unwrap(),
        Fenced::Lost,
        "a done record cannot be released"
    );
}
