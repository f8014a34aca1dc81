//! The body limit: 413, and nothing claimed.

use super::*;

/// A body over the limit (declared by `Content-Length`): 413, and the key is not claimed.
pub async fn body_over_limit_is_413_and_claims_nothing<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store).with_body_limit(64)).await;
    let big = format!(r#"{{"padding":"{}"}}"#, "x".repeat(100));
    send(server.post_key("/orders", "big-1", &big))
        .await
        .assert_problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(server.state.executions(), 0);
    // not claimed: the same key with a small body runs the handler, no 409 or 422
    send(server.order("big-1"))
        .await
        .assert_executed(StatusCode::CREATED, 1);
    // exactly the limit is accepted
    let at_limit = format!(r#"{{"padding":"{}"}}"#, "x".repeat(50));
    assert_eq!(at_limit.len(), 64);
    send(server.post_key("/orders", "big-2", &at_limit))
        .await
        .assert_executed(StatusCode::CREATED, 2);
}

/// A chunked body (no `Content-Length`) that grows over the limit: 413, nothing claimed.
pub async fn chunked_body_over_limit_is_413_and_claims_nothing<St: Store, F: Flavour<St>>(
    store: St,
) {
    let server = serve(F::layer(store).with_body_limit(64)).await;
    let chunk = "x".repeat(40);
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: chunked-1\r\n\
         content-type: text/plain\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         {len:x}\r\n{chunk}\r\n{len:x}\r\n{chunk}\r\n{len:x}\r\n{chunk}\r\n0\r\n\r\n",
        len = chunk.len()
    );
    let raw = raw_http(server.addr(), request.as_bytes()).await;
    let status_line = raw.lines().next().unwrap_or_default();
    assert!(
        status_line.starts_with("HTTP/1.1 413"),
        "expected 413, got {raw:?}"
    );
    assert_eq!(server.state.executions(), 0);
    send(server.post_key("/orders", "chunked-1", ORDER))
        .await
        .assert_executed(StatusCode::CREATED, 1);
}
