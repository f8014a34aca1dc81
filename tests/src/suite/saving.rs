//! Which answers are saved (and replayed) and which release the key for a retry.

use super::*;

/// A handler's 500 is saved and replayed (it may have taken effect).
pub async fn handler_500_is_saved_and_replayed<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let first = send(server.post_key("/status/500", "s500", ORDER)).await;
    first.assert_executed(StatusCode::INTERNAL_SERVER_ERROR, 1);
    send(server.post_key("/status/500", "s500", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

async fn status_releases_the_key<St: Store, F: Flavour<St>>(store: St, status: StatusCode) {
    let server = serve(F::layer(store)).await;
    let path = format!("/status/{}", status.as_u16());
    for n in 1..=3 {
        send(server.post_key(&path, "try-again", ORDER))
            .await
            .assert_executed(status, n);
    }
    assert_eq!(server.state.executions(), 3);
}

/// A handler's 429 is not saved: the key is released and the retry runs again.
pub async fn handler_429_releases_the_key<St: Store, F: Flavour<St>>(store: St) {
    status_releases_the_key::<St, F>(store, StatusCode::TOO_MANY_REQUESTS).await;
}

/// A handler's 503 is not saved: the key is released and the retry runs again.
pub async fn handler_503_releases_the_key<St: Store, F: Flavour<St>>(store: St) {
    status_releases_the_key::<St, F>(store, StatusCode::SERVICE_UNAVAILABLE).await;
}

/// An inner service `Err` releases the key: the retry runs the service again.
pub async fn inner_error_releases_the_key<St: Store, F: Flavour<St>>(store: St) {
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = calls.clone();
        tower::service_fn(
            move |_req: http::Request<tower_idempotency::RequestBody<Body>>| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n == 1 {
                        Err("the inner service failed")
                    } else {
                        Ok(answer(StatusCode::CREATED, n, &Bytes::new()))
                    }
                }
            },
        )
    };
    let service = F::layer(store).layer(inner);
    let request = || {
        http::Request::post("/orders")
            .header("idempotency-key", "inner-err")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(ORDER))
            .unwrap()
    };
    let err = service.clone().oneshot(request()).await.unwrap_err();
    assert_eq!(err, "the inner service failed");
    let second = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert!(second.headers().get(REPLAYED_HEADER).is_none());
    // the second answer was saved: the third attempt is its replay
    let third = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(third.status(), StatusCode::CREATED);
    assert_eq!(third.headers().get(REPLAYED_HEADER).unwrap(), "true");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A panicking handler releases the key: its connection fails, the server lives on, and the
/// retry runs the handler again.
pub async fn panicking_handler_releases_the_key<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let failed = try_send(server.post_key("/panic", "panic-1", ORDER)).await;
    assert!(
        failed.is_err(),
        "the panicking attempt answered: {failed:?}"
    );
    assert_eq!(server.state.executions(), 1);
    let second = send(server.post_key("/panic", "panic-1", ORDER)).await;
    second.assert_executed(StatusCode::CREATED, 2);
    send(server.post_key("/panic", "panic-1", ORDER))
        .await
        .assert_replay_of(&second);
    assert_eq!(server.state.executions(), 2);
}

/// 408 and 425 mean "not processed" too: the key is released.
pub async fn handler_408_and_425_release_the_key<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    for (i, code) in [408u16, 425].into_iter().enumerate() {
        let path = format!("/status/{code}");
        let status = StatusCode::from_u16(code).unwrap();
        for n in 1..=2 {
            send(server.post_key(&path, &format!("released-{code}"), ORDER))
                .await
                .assert_executed(status, (2 * i + n) as u64);
        }
    }
    assert_eq!(server.state.executions(), 4);
}

/// A custom save policy replaces the default: here a 500 is released and a 429 saved.
pub async fn custom_save_policy_decides_what_is_saved<St: Store, F: Flavour<St>>(store: St) {
    let policy = |status: StatusCode| !status.is_server_error();
    let server = serve(F::layer(store).with_save_policy(policy)).await;
    for n in 1..=2 {
        send(server.post_key("/status/500", "policy-500", ORDER))
            .await
            .assert_executed(StatusCode::INTERNAL_SERVER_ERROR, n);
    }
    let first = send(server.post_key("/status/429", "policy-429", ORDER)).await;
    first.assert_executed(StatusCode::TOO_MANY_REQUESTS, 3);
    send(server.post_key("/status/429", "policy-429", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 3);
}
