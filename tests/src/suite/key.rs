//! The `Idempotency-Key` header: which requests need one, and which keys are refused (400).

use super::*;

/// No key on a covered method: 400 problem+json, handler not called.
pub async fn missing_key_is_400_problem<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let reply = send(server.post("/orders", ORDER)).await;
    reply.assert_problem(StatusCode::BAD_REQUEST);
    assert_eq!(reply.retry_after_opt(), None);
    assert_eq!(server.state.executions(), 0);
}

async fn assert_key_refused(server: &TestServer, request: reqwest::RequestBuilder) {
    let before = server.state.executions();
    send(request).await.assert_problem(StatusCode::BAD_REQUEST);
    assert_eq!(server.state.executions(), before, "the handler ran");
}

/// An empty key, bare or quoted: 400.
pub async fn empty_key_is_400<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    assert_key_refused(&server, server.order("")).await;
    assert_key_refused(&server, server.order("\"\"")).await;
}

/// A key of 256 bytes: 400; 255 bytes is the longest accepted.
pub async fn key_over_255_bytes_is_400<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    assert_key_refused(&server, server.order(&"k".repeat(256))).await;
    // quoting does not count: 256 bytes inside the quotes is still too long
    assert_key_refused(&server, server.order(&format!("\"{}\"", "k".repeat(256)))).await;
    send(server.order(&"k".repeat(255)))
        .await
        .assert_executed(StatusCode::CREATED, 1);
}

/// A key with a control character (tab) or a space: 400.
pub async fn key_with_control_char_is_400<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    assert_key_refused(&server, server.order("bad\tkey")).await;
    assert_key_refused(&server, server.order("bad key")).await;
    assert_key_refused(&server, server.order("\"unclosed")).await;
}

/// Two `Idempotency-Key` headers: 400.
pub async fn two_key_headers_are_400<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let request = server.order("first").header("idempotency-key", "second");
    assert_key_refused(&server, request).await;
    // even when both name the same key
    let request = server.order("same").header("idempotency-key", "same");
    assert_key_refused(&server, request).await;
}

/// Bare `key` and quoted `"key"` name the same key: the second is a replay.
pub async fn quoted_and_bare_key_are_the_same_key<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let first = send(server.order("\"quoted-1\"")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.order("quoted-1"))
        .await
        .assert_replay_of(&first);
    send(server.order("\"quoted-1\""))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

/// GET is not covered: it passes through without a key, every time.
pub async fn get_passes_through_without_key<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    for n in 1..=2 {
        let reply = send(server.client.get(server.url("/orders"))).await;
        reply.assert_executed(StatusCode::OK, n);
    }
    // a key on GET changes nothing either
    let reply = send(
        server
            .client
            .get(server.url("/orders"))
            .header("idempotency-key", "get-1"),
    )
    .await;
    reply.assert_executed(StatusCode::OK, 3);
    assert_eq!(server.state.executions(), 3);
}

/// With `.optional()`, a request without a key runs the handler every time and is never
/// replayed; a key still works, and an invalid key is still 400.
pub async fn optional_layer_passes_keyless_requests_through<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store).optional()).await;
    for n in 1..=3 {
        send(server.post("/orders", ORDER))
            .await
            .assert_executed(StatusCode::CREATED, n);
    }
    let keyed = send(server.order("optional-1")).await;
    keyed.assert_executed(StatusCode::CREATED, 4);
    send(server.order("optional-1"))
        .await
        .assert_replay_of(&keyed);
    assert_key_refused(&server, server.order("bad key")).await;
    assert_eq!(server.state.executions(), 4);
}

/// The key is checked before the body: a missing or invalid key with a body over the limit is
/// 400, not 413.
pub async fn key_is_checked_before_the_body<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store).with_body_limit(16)).await;
    let big = format!(r#"{{"padding":"{}"}}"#, "x".repeat(100));
    send(server.post("/orders", &big))
        .await
        .assert_problem(StatusCode::BAD_REQUEST);
    send(server.post_key("/orders", "bad key", &big))
        .await
        .assert_problem(StatusCode::BAD_REQUEST);
    assert_eq!(server.state.executions(), 0);
}

/// PATCH is covered by default (no key: 400; a key: replayed); PUT and DELETE are not.
pub async fn patch_is_covered_put_is_not<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let patch = |key: Option<&str>| {
        let request = server
            .client
            .patch(server.url("/orders"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(ORDER);
        match key {
            Some(key) => request.header("idempotency-key", key),
            None => request,
        }
    };
    send(patch(None))
        .await
        .assert_problem(StatusCode::BAD_REQUEST);
    let first = send(patch(Some("patch-1"))).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(patch(Some("patch-1"))).await.assert_replay_of(&first);
    let put = || server.client.put(server.url("/orders")).body(ORDER);
    send(put()).await.assert_executed(StatusCode::CREATED, 2);
    send(put().header("idempotency-key", "put-1"))
        .await
        .assert_executed(StatusCode::CREATED, 3);
    send(put().header("idempotency-key", "put-1"))
        .await
        .assert_executed(StatusCode::CREATED, 4);
    assert_eq!(server.state.executions(), 4);
}
