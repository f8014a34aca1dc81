//! Retention: an expired record is gone, and a takeover keeps the original expiry (when its own
//! lease ends before it).

use super::*;

/// After the retention (`with_ttl`) the record is gone: the key can be claimed again, even by a
/// different request.
pub async fn expired_record_is_claimed_afresh<St: Store, F: Flavour<St>>(store: St) {
    const TTL: Duration = Duration::from_millis(500);
    let server = serve(F::layer(store).with_ttl(TTL)).await;
    let first = send(server.order("ttl-1")).await;
    // the claim happened before the answer: the record expires before `answered + TTL`
    let answered = Instant::now();
    first.assert_executed(StatusCode::CREATED, 1);
    let other = r#"{"customerId":"c_2","totalCents":1}"#;
    send(server.post_key("/orders", "ttl-1", other))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    // the passing of the retention is what is under test
    tokio::time::sleep((TTL + Duration::from_millis(300)).saturating_sub(answered.elapsed())).await;
    let second = send(server.post_key("/orders", "ttl-1", other)).await;
    second.assert_executed(StatusCode::CREATED, 2);
    send(server.post_key("/orders", "ttl-1", other))
        .await
        .assert_replay_of(&second);
    assert_eq!(server.state.executions(), 2);
}

/// A takeover of a dead holder's record keeps the original expiry (counted from the first
/// claim), not a new one from the takeover.
pub async fn takeover_keeps_the_original_expiry<St: Store, F: Flavour<St>>(store: St) {
    const DEAD_LEASE: Duration = Duration::from_millis(200);
    const ORIGINAL_TTL: Duration = Duration::from_millis(1200);
    let store = Arc::new(store);
    // the layer's own retention is a day: only the original claim's expiry can free the key (the
    // takeover's lease ends before it, so it does not move it)
    let server = serve(F::from_shared(store.clone()).with_lease(Duration::from_millis(300))).await;
    let outcome = store
        .claim(&new_claim(
            key_hash("expiry-1"),
            fingerprint("/orders", ORDER),
            DEAD_LEASE,
            ORIGINAL_TTL,
        ))
        .await
        .unwrap();
    // lease and expiry are counted from a moment before this
    let claimed_at = Instant::now();
    assert_eq!(outcome, ClaimOutcome::Claimed { taken_over: false });
    tokio::time::sleep(
        (DEAD_LEASE + Duration::from_millis(200)).saturating_sub(claimed_at.elapsed()),
    )
    .await;
    let first = send(server.order("expiry-1")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.order("expiry-1"))
        .await
        .assert_replay_of(&first);
    tokio::time::sleep(
        (ORIGINAL_TTL + Duration::from_millis(300)).saturating_sub(claimed_at.elapsed()),
    )
    .await;
    // expired with the original claim: a different request may use the key now
    let other = r#"{"customerId":"c_3","totalCents":7}"#;
    send(server.post_key("/orders", "expiry-1", other))
        .await
        .assert_executed(StatusCode::CREATED, 2);
    assert_eq!(server.state.executions(), 2);
}
