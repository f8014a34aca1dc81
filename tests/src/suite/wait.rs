//! Wait mode: duplicates wait for the first answer instead of a 409.

use super::*;

/// Wait mode: 20 concurrent attempts on a ~300 ms handler: one execution, 19 replays of it
/// (woken by the store's notification, or by polling every `WAIT_POLL_INTERVAL`: stores without
/// notifications, and single-commit mode, whose running claim is uncommitted).
pub async fn wait_mode_replays_to_concurrent_attempts<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store).wait_for_in_flight(Duration::from_secs(5))).await;
    let replies = concurrently(20, |_| server.post_key("/slow", "wait-1", ORDER)).await;
    assert_eq!(server.state.executions(), 1);
    let originals: Vec<&Reply> = replies.iter().filter(|r| !r.replayed()).collect();
    assert_eq!(
        originals.len(),
        1,
        "not exactly one original: {originals:?}"
    );
    let original = originals[0];
    original.assert_executed(StatusCode::CREATED, 1);
    let replays = replies
        .iter()
        .filter(|r| r.replayed())
        .inspect(|r| r.assert_replay_of(original))
        .count();
    assert_eq!(replays, 19);
}

/// Wait mode with a short bound: a duplicate of a held attempt waits, then gets 409.
pub async fn wait_mode_bound_falls_back_to_409<St: Store, F: Flavour<St>>(store: St) {
    const BOUND: Duration = Duration::from_millis(100);
    let server = serve(F::layer(store).wait_for_in_flight(BOUND)).await;
    let first = tokio::spawn(send(server.post_key("/held", "wait-2", ORDER)));
    server.state.wait_entered(1).await;
    let started = Instant::now();
    let duplicate = send(server.post_key("/held", "wait-2", ORDER)).await;
    let waited = started.elapsed();
    F::CONTRACT.assert_in_flight(&duplicate, DEFAULT_LEASE);
    assert!(
        waited >= BOUND,
        "answered 409 after {waited:?}, before the bound"
    );
    server.state.release();
    let first = first.await.unwrap();
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.post_key("/held", "wait-2", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}
