//! Leases: a dead holder is taken over and fenced, a live one is renewed; `Retry-After` shows the lease.

use super::*;
use tower_idempotency::store::Hold;

/// A claim whose holder died (its lease lapsed) is taken over; the dead holder's token is fenced
/// out: its `complete`, `renew` and `release` change nothing, and the replay shows the new answer.
///
/// The dead holder claims directly in the store (a committed claim with a lease, as a process of
/// a leased mode leaves it when it dies). Single-commit mode's own attempts never leave one (a
/// crash rolls the claim back), but its claim takes such a record over like the other modes; the
/// takeover stays uncommitted while the new holder runs, so the stale holder's calls wait on its
/// row lock and are fenced once it commits (see [`Contract::claim_committed_first`]).
///
/// [`Contract::claim_committed_first`]: super::flavour::Contract::claim_committed_first
pub async fn lapsed_lease_is_taken_over_and_stale_holder_fenced<St: Store, F: Flavour<St>>(
    store: St,
) {
    const DEAD_LEASE: Duration = Duration::from_millis(300);
    let contract = F::CONTRACT;
    let store = Arc::new(store);
    let server = serve(F::from_shared(store.clone())).await;
    let key = key_hash("lease-1");
    // the dead holder: claimed directly in the store, never renewed
    let dead = new_claim(key, fingerprint("/held", ORDER), DEAD_LEASE, DEFAULT_TTL);
    let stale = dead.token;
    let outcome = store.claim(&dead).await.unwrap();
    assert_eq!(outcome, ClaimOutcome::Claimed { taken_over: false });
    let claimed_at = Instant::now();
    // the layer sees the same record: in flight while the lease lasts
    send(server.post_key("/held", "lease-1", ORDER))
        .await
        .assert_in_flight();
    assert_eq!(server.state.executions(), 0);
    // time passing is what is under test here: let the lease lapse (plus a margin)
    tokio::time::sleep(
        (DEAD_LEASE + Duration::from_millis(250)).saturating_sub(claimed_at.elapsed()),
    )
    .await;
    let retry = tokio::spawn(send(server.post_key("/held", "lease-1", ORDER)));
    server.state.wait_entered(1).await;
    // while the new holder runs, the stale token can write nothing
    let stale_answer = stored_response(
        StatusCode::ACCEPTED,
        HeaderMap::new(),
        Bytes::from_static(b"{\"execution\":0,\"stale\":true}"),
    );
    let stale_calls = {
        let store = store.clone();
        let stale_answer = stale_answer.clone();
        async move {
            [
                store
                    .complete(&Hold::new(key, stale), &stale_answer)
                    .await
                    .unwrap(),
                store
                    .renew(&Hold::new(key, stale), Duration::from_secs(60))
                    .await
                    .unwrap(),
                store.release(&Hold::new(key, stale)).await.unwrap(),
            ]
        }
    };
    let stale_calls = if contract.claim_committed_first {
        // answered at once, while the new holder still runs
        let fenced = within(SIGNAL_TIMEOUT, "the stale holder's calls", stale_calls).await;
        assert_eq!(fenced, [Fenced::Lost; 3]);
        None
    } else {
        // they wait for the new holder's transaction: checked once it has committed
        Some(tokio::spawn(stale_calls))
    };
    // ... and the record is still the new holder's: a duplicate is in flight
    let duplicate = send(server.post_key("/held", "lease-1", ORDER)).await;
    contract.assert_in_flight(&duplicate, DEFAULT_LEASE);
    server.state.release();
    let new_answer = retry.await.unwrap();
    new_answer.assert_executed(StatusCode::CREATED, 1);
    if let Some(stale_calls) = stale_calls {
        let fenced = within(SIGNAL_TIMEOUT, "the stale holder's calls", stale_calls)
            .await
            .expect("the stale holder's calls panicked");
        assert_eq!(fenced, [Fenced::Lost; 3]);
    }
    // after completion too, the stale token cannot overwrite
    assert_eq!(
        store
            .complete(&Hold::new(key, stale), &stale_answer)
            .await
            .unwrap(),
        Fenced::Lost
    );
    send(server.post_key("/held", "lease-1", ORDER))
        .await
        .assert_replay_of(&new_answer);
    assert_eq!(server.state.executions(), 1);
}

/// A handler that runs longer than the lease is not taken over while it lives (the heartbeat
/// renews it; in single-commit mode, which has no lease, the advisory lock of its live
/// transaction): duplicates get 409 throughout, and it executes once.
pub async fn slow_handler_is_not_taken_over_while_alive<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store).with_lease(SLOW_LEASE)).await;
    let first = held_past_three_leases_runs_once::<St, F>(&server).await;
    send(server.post_key("/held", "slow-1", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

/// A handler that outlives the retention too (a `ttl` shorter than its run) is not taken over
/// while it lives either: its record does not expire under a live holder. (In a leased mode its
/// answer is then kept for a lease from its last renewal; in single-commit mode, whose record
/// commits with the answer, the retention has passed by then.)
pub async fn slow_handler_is_not_taken_over_past_the_retention<St: Store, F: Flavour<St>>(
    store: St,
) {
    let layer = F::layer(store)
        .with_lease(SLOW_LEASE)
        .with_ttl(SLOW_LEASE / 4);
    let server = serve(layer).await;
    let first = held_past_three_leases_runs_once::<St, F>(&server).await;
    if F::CONTRACT.leased {
        send(server.post_key("/held", "slow-1", ORDER))
            .await
            .assert_replay_of(&first);
        assert_eq!(server.state.executions(), 1);
    }
}

const SLOW_LEASE: Duration = Duration::from_millis(400);

/// `POST /held` held for three leases: duplicates get 409 throughout, and it executes once; its
/// answer.
async fn held_past_three_leases_runs_once<St: Store, F: Flavour<St>>(server: &TestServer) -> Reply {
    const LEASE: Duration = SLOW_LEASE;
    let first = tokio::spawn(send(server.post_key("/held", "slow-1", ORDER)));
    server.state.wait_entered(1).await;
    let started = Instant::now();
    // duplicates across three leases (~1.2 s): the lapse of time is under test
    let mut duplicates = 0;
    while started.elapsed() < LEASE * 3 && duplicates < 40 {
        let duplicate = send(server.post_key("/held", "slow-1", ORDER)).await;
        F::CONTRACT.assert_in_flight(&duplicate, LEASE);
        duplicates += 1;
        tokio::time::sleep(LEASE / 4).await;
    }
    assert!(duplicates >= 4);
    assert_eq!(
        server.state.executions(),
        1,
        "the live holder was taken over"
    );
    server.state.release();
    let first = first.await.unwrap();
    first.assert_executed(StatusCode::CREATED, 1);
    first
}

async fn retry_after_while_held(server: &TestServer, key: &str) -> u64 {
    let first = tokio::spawn(send(server.post_key("/held", key, ORDER)));
    server.state.wait_entered(1).await;
    let retry_after = send(server.post_key("/held", key, ORDER))
        .await
        .assert_in_flight();
    server.state.release();
    first.await.unwrap().assert_executed(StatusCode::CREATED, 1);
    retry_after
}

/// The 409's `Retry-After` never goes beyond the time left on the default 30 s lease (here a
/// fixed `Retry-After` of an hour is capped by it); in single-commit mode, which has no lease to
/// estimate from, it is 1 s.
pub async fn retry_after_reflects_default_lease<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(
        F::layer(store).with_retry_after(tower_idempotency::RetryAfter::Fixed(
            Duration::from_secs(3600),
        )),
    )
    .await;
    let retry_after = retry_after_while_held(&server, "retry-default").await;
    let expected = F::CONTRACT.retry_after(25..=30);
    assert!(
        expected.contains(&retry_after),
        "Retry-After {retry_after} is not {expected:?} (the time left on a fresh 30 s lease)"
    );
}

/// The 409's `Retry-After` never goes beyond the time left on a configured lease (5 s); 1 s in
/// single-commit mode, which ignores the lease.
pub async fn retry_after_reflects_configured_lease<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(
        F::layer(store)
            .with_lease(Duration::from_secs(5))
            .with_retry_after(tower_idempotency::RetryAfter::Fixed(Duration::from_secs(
                3600,
            ))),
    )
    .await;
    let retry_after = retry_after_while_held(&server, "retry-5s").await;
    let expected = F::CONTRACT.retry_after(3..=5);
    assert!(
        expected.contains(&retry_after),
        "Retry-After {retry_after} is not {expected:?} (the time left on a fresh 5 s lease)"
    );
}
