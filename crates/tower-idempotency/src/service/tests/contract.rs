//! The user's error contract: a `type` base of their own, their own envelope, their own
//! replay header; and the defaults unchanged without them.

use super::*;

async fn json_of<B: Body<Data = Bytes>>(response: Response<B>) -> serde_json::Value
where
    B::Error: fmt::Debug,
{
    serde_json::from_slice(&body_of(response).await).unwrap()
}

#[tokio::test]
async fn the_problem_type_base_is_the_users() {
    let count = Arc::new(AtomicUsize::new(0));
    let service = Idempotency::memory()
        .with_problem_type_base("https://api.example.com/problems#")
        .layer(counting_service(count.clone(), StatusCode::CREATED));
    let missing = Request::post("/orders").body(Full::default()).unwrap();
    let response = service.clone().oneshot(missing).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let problem = json_of(response).await;
    assert_eq!(
        problem["type"],
        "https://api.example.com/problems#MissingKey"
    );

    let default = Idempotency::memory().layer(counting_service(count, StatusCode::CREATED));
    let missing = Request::post("/orders").body(Full::default()).unwrap();
    let problem = json_of(default.oneshot(missing).await.unwrap()).await;
    assert_eq!(
        problem["type"],
        format!("{}MissingKey", crate::error::DEFAULT_PROBLEM_TYPE_BASE)
    );
}

#[tokio::test]
async fn a_whole_refusal_can_be_the_users_envelope_and_keeps_retry_after() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (gate, started) = (gate.clone(), started.clone());
        tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            let (gate, started) = (gate.clone(), started.clone());
            async move {
                started.notify_one();
                gate.notified().await;
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("done"))))
            }
        })
    };
    let service = Idempotency::memory()
        .with_rejection_response(|rejection: &Rejection| {
            let body = serde_json::json!({
                "error": { "code": rejection.name(), "message": rejection.detail() }
            });
            Response::builder()
                .status(rejection.status())
                .header("content-type", "application/json")
                .body(Bytes::from(body.to_string()))
                .unwrap()
        })
        .layer(handler);
    let first = tokio::spawn(service.clone().oneshot(post("k", "a")));
    started.notified().await;
    let duplicate = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    assert_eq!(duplicate.headers()["content-type"], "application/json");
    assert!(duplicate.headers().contains_key(http::header::RETRY_AFTER));
    let envelope = json_of(duplicate).await;
    assert_eq!(envelope["error"]["code"], "InFlight");
    gate.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    // A refusal without a retry delay gets no Retry-After.
    let reused = service.clone().oneshot(post("k", "b")).await.unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(!reused.headers().contains_key(http::header::RETRY_AFTER));
    assert_eq!(json_of(reused).await["error"]["code"], "KeyReused");
}

#[tokio::test]
async fn the_replay_header_is_named_by_the_user() {
    let count = Arc::new(AtomicUsize::new(0));
    let service = Idempotency::memory()
        .with_replay_header(http::HeaderName::from_static("x-replayed"))
        .layer(counting_service(count, StatusCode::CREATED));
    let first = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert!(first.headers().get("x-replayed").is_none());
    let retry = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(retry.headers()["x-replayed"], "true");
    assert!(retry.headers().get(&crate::REPLAYED_HEADER).is_none());
}

#[tokio::test]
async fn require_scope_refuses_anonymous_callers_before_reading_the_body() {
    let count = Arc::new(AtomicUsize::new(0));
    let service = Idempotency::memory()
        .with_body_limit(4)
        .require_scope()
        .layer(counting_service(count.clone(), StatusCode::CREATED));
    // Over the body limit too: the scope is checked first, so no 413.
    let anonymous = service
        .clone()
        .oneshot(post("k", "too long"))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);
    let problem = json_of(anonymous).await;
    assert_eq!(problem["title"], "Caller not identified");
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("Authorization"));
    let status_as = |authorization: &'static str| {
        let request = Request::post("/orders")
            .header("idempotency-key", "k")
            .header("authorization", authorization)
            .body(Full::new(Bytes::from("a")))
            .unwrap();
        let service = service.clone();
        async move { service.oneshot(request).await.unwrap().status() }
    };
    assert_eq!(status_as("").await, StatusCode::BAD_REQUEST);
    assert_eq!(count.load(Ordering::SeqCst), 0);

    assert_eq!(status_as("Bearer alice").await, StatusCode::CREATED);
    assert_eq!(count.load(Ordering::SeqCst), 1);

    // Without the setting, anonymous callers are served (and share one key space).
    let open = Idempotency::memory().layer(counting_service(count.clone(), StatusCode::CREATED));
    assert_eq!(
        open.oneshot(post("k", "a")).await.unwrap().status(),
        StatusCode::CREATED
    );
}
