//! Scope: the same key under another `Authorization` is another key.

use super::*;

/// The same key under different `Authorization` headers: independent executions.
pub async fn other_authorization_is_an_independent_key<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let alice = || {
        server
            .order("shared-key")
            .header("authorization", "Bearer alice")
    };
    let bob = || {
        server
            .order("shared-key")
            .header("authorization", "Bearer bob")
    };
    let first = send(alice()).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(bob()).await.assert_executed(StatusCode::CREATED, 2);
    // and without Authorization: a third scope
    send(server.order("shared-key"))
        .await
        .assert_executed(StatusCode::CREATED, 3);
    send(alice()).await.assert_replay_of(&first);
    assert_eq!(server.state.executions(), 3);
}

/// An empty `Authorization` header scopes like an absent one.
pub async fn empty_authorization_scopes_like_absent<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let first = send(server.order("empty-auth")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.order("empty-auth").header("authorization", ""))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}
