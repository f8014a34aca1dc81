//! The fingerprint: the same key with another request is 422; the same request, however written, is replayed.

use super::*;

/// The same key with another body: 422, never a replay, never a second execution.
pub async fn same_key_other_body_is_422<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let first = send(server.order("body-1")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    let other = r#"{"customerId":"c_1","totalCents":9999}"#;
    send(server.post_key("/orders", "body-1", other))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(server.state.executions(), 1);
    // the original request still replays
    send(server.order("body-1")).await.assert_replay_of(&first);
}

/// The same key on another path (or query): 422.
pub async fn same_key_other_path_is_422<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    send(server.order("path-1"))
        .await
        .assert_executed(StatusCode::CREATED, 1);
    send(server.post_key("/other", "path-1", ORDER))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    send(server.post_key("/orders?dry_run=true", "path-1", ORDER))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(server.state.executions(), 1);
}

/// A different request with a key whose first attempt is still running: 422, not 409, where the
/// running claim is committed; in single-commit mode the running fingerprint is not committed
/// yet, so the lock answers 409 (`Retry-After: 1`), and 422 once the first answer commits.
pub async fn mismatch_while_running_is_422<St: Store, F: Flavour<St>>(store: St) {
    let contract = F::CONTRACT;
    let server = serve(F::layer(store)).await;
    let first = tokio::spawn(send(server.post_key("/held", "running-1", ORDER)));
    server.state.wait_entered(1).await;
    let other = r#"{"other":true}"#;
    let reply = send(server.post_key("/held", "running-1", other)).await;
    match contract.mismatch_while_running() {
        StatusCode::CONFLICT => {
            contract.assert_in_flight(&reply, DEFAULT_LEASE);
        }
        status => reply.assert_problem(status),
    }
    server.state.release();
    first.await.unwrap().assert_executed(StatusCode::CREATED, 1);
    // once the first answer is saved, every mode refuses the other request with 422
    send(server.post_key("/held", "running-1", other))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(server.state.executions(), 1);
}

/// The same JSON with its keys reordered and other whitespace: the same request, replayed.
pub async fn reordered_json_is_replayed<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let first = send(server.post_key(
        "/orders",
        "json-1",
        r#"{"customerId":"c_1","items":[{"sku":"a","qty":1}],"totalCents":4000}"#,
    ))
    .await;
    first.assert_executed(StatusCode::CREATED, 1);
    let reordered = "{ \"totalCents\" : 4000,\n  \"items\": [ { \"qty\": 1, \"sku\": \"a\" } ],\n  \"customerId\": \"c_1\" }";
    send(server.post_key("/orders", "json-1", reordered))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}
