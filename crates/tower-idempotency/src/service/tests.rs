//! The flow's unit tests: the service over the memory store.

use std::{
    fmt,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_service::Service;

use super::*;
use crate::{
    body::RequestBody, error::Rejection, not_processed::NotProcessed, store::MemoryStore,
    Idempotency,
};

impl<S, St, M> IdempotencyService<S, St, M> {
    fn from_layer(inner: S, layer: Idempotency<St, M>) -> Self {
        Self::from_parts(inner, layer.store.clone(), layer.config.clone())
    }
}

fn counting_service(
    count: Arc<AtomicUsize>,
    status: StatusCode,
) -> impl Service<
    Request<RequestBody<Full<Bytes>>>,
    Response = Response<Full<Bytes>>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut response = Response::new(Full::new(Bytes::from(format!("run {n}"))));
            *response.status_mut() = status;
            Ok(response)
        }
    })
}

fn post(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn body_of<B: Body<Data = Bytes>>(response: Response<B>) -> Bytes
where
    B::Error: fmt::Debug,
{
    response.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn a_retry_replays_instead_of_running_again() {
    let count = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyService::new(
        counting_service(count.clone(), StatusCode::CREATED),
        MemoryStore::new(),
    );
    let first = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get(&crate::REPLAYED_HEADER).is_none());
    assert_eq!(body_of(first).await, "run 1");

    let retry = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()[&crate::REPLAYED_HEADER], "true");
    assert_eq!(body_of(retry).await, "run 1");

    let reused = service.clone().oneshot(post("k", "b")).await.unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn try_again_statuses_release_the_key() {
    let count = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyService::new(
        counting_service(count.clone(), StatusCode::TOO_MANY_REQUESTS),
        MemoryStore::new(),
    );
    for _ in 0..2 {
        let response = service.clone().oneshot(post("k", "a")).await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_not_processed_answer_releases_the_key() {
    let count = Arc::new(AtomicUsize::new(0));
    let handler = {
        let count = count.clone();
        tower::service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let mut response = Response::new(Full::new(body.clone()));
                if body == "bad" {
                    *response.status_mut() = StatusCode::BAD_REQUEST;
                    response.extensions_mut().insert(NotProcessed);
                } else {
                    *response.status_mut() = StatusCode::CREATED;
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    let service = IdempotencyService::new(handler, MemoryStore::new());
    let refused = service.clone().oneshot(post("k", "bad")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    // The corrected body with the same key runs (no 422), and is then saved as usual.
    let fixed = service.clone().oneshot(post("k", "good")).await.unwrap();
    assert_eq!(fixed.status(), StatusCode::CREATED);
    let retry = service.clone().oneshot(post("k", "good")).await.unwrap();
    assert_eq!(retry.headers()[&crate::REPLAYED_HEADER], "true");
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

/// A request body that sends its first bytes, then stalls for ever (a slow client).
struct StallingBody {
    first: Option<Bytes>,
    stalls: bool,
}

impl Body for StallingBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.first.take() {
            Some(bytes) => Poll::Ready(Some(Ok(http_body::Frame::data(bytes)))),
            None if self.stalls => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_slower_than_the_timeout_gets_408_and_claims_nothing() {
    let count = Arc::new(AtomicUsize::new(0));
    let handler = {
        let count = count.clone();
        tower::service_fn(move |_req: Request<RequestBody<StallingBody>>| {
            count.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new()))) }
        })
    };
    let layer = Idempotency::new(MemoryStore::new()).with_body_timeout(Duration::from_secs(5));
    let store = layer.store().clone();
    let service = IdempotencyService::from_layer(handler, layer);
    let req = Request::post("/orders")
        .header("idempotency-key", "k")
        .body(StallingBody {
            first: Some(Bytes::from_static(b"{\"a\":")),
            stalls: true,
        })
        .unwrap();
    let started = Instant::now();
    let response = service.clone().oneshot(req).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(
        response.headers()[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(store.is_empty(), "nothing was claimed");
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn retry_after_of_a_duplicate_estimates_the_time_left() {
    let handler = tower::service_fn(|_req: Request<RequestBody<Full<Bytes>>>| async {
        tokio::time::sleep(Duration::from_secs(4)).await;
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let service = IdempotencyService::from_layer(handler, Idempotency::new(MemoryStore::new()));
    // Teach the estimate: a few attempts of 4 s each.
    for i in 0..20 {
        service
            .clone()
            .oneshot(post(&format!("warm{i}"), ""))
            .await
            .unwrap();
    }
    let first = tokio::spawn(service.clone().oneshot(post("k", "")));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let duplicate = service.clone().oneshot(post("k", "")).await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    // About 2.5 s left of a 4 s attempt, not the 30 s lease.
    assert_eq!(duplicate.headers()[http::header::RETRY_AFTER], "3");
    first.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_full_memory_store_answers_503_store_full() {
    let count = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyService::new(
        counting_service(count.clone(), StatusCode::CREATED),
        MemoryStore::with_capacity(16),
    );
    let mut full = None;
    for i in 0..200 {
        let response = service
            .clone()
            .oneshot(post(&format!("k{i}"), ""))
            .await
            .unwrap();
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            full = Some(response);
            break;
        }
    }
    let full = full.expect("a store of 16 records fills up");
    assert!(full.headers().contains_key(http::header::RETRY_AFTER));
    let json: serde_json::Value = serde_json::from_slice(&body_of(full).await).unwrap();
    assert_eq!(json["title"], "Idempotency store full");
    assert!(count.load(Ordering::SeqCst) <= 16);
}

#[tokio::test]
async fn uncovered_methods_pass_through_without_a_key() {
    let count = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyService::new(
        counting_service(count.clone(), StatusCode::OK),
        MemoryStore::new(),
    );
    let get = Request::get("/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(service.oneshot(get).await.unwrap().status(), StatusCode::OK);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[cfg(feature = "metrics")]
use crate::observe::recorded::Recorded;

/// Five guarded requests (saved, replayed, mismatch, rejected without a key, released) and a
/// GET, which is not guarded.
#[cfg(feature = "metrics")]
async fn five_guarded_requests_and_a_get() {
    let created = IdempotencyService::new(
        counting_service(Arc::new(AtomicUsize::new(0)), StatusCode::CREATED),
        MemoryStore::new(),
    );
    let limited = IdempotencyService::new(
        counting_service(Arc::new(AtomicUsize::new(0)), StatusCode::TOO_MANY_REQUESTS),
        MemoryStore::new(),
    );
    created.clone().oneshot(post("k", "a")).await.unwrap();
    created.clone().oneshot(post("k", "a")).await.unwrap();
    created.clone().oneshot(post("k", "b")).await.unwrap();
    let no_key = Request::post("/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    created.clone().oneshot(no_key).await.unwrap();
    limited.clone().oneshot(post("k", "a")).await.unwrap();
    // Not a covered method: not a guarded request, not counted.
    let get = Request::get("/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    created.clone().oneshot(get).await.unwrap();
}

#[cfg(feature = "metrics")]
#[test]
fn every_guarded_request_counts_exactly_one_final_outcome() {
    let recorded = Recorded::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorded, || {
        runtime.block_on(five_guarded_requests_and_a_get())
    });
    let total = "idempotency_requests_total{outcome=";
    // No router matched these requests: the route is unknown, never the raw path.
    let route = "http.route=unknown";
    assert_eq!(recorded.get(&format!("{total}saved,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}replayed,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}mismatch,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}rejected,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}released,{route}}}")), 1);
    assert_eq!(
        recorded.sum(total),
        5,
        "one final outcome per guarded request"
    );
    assert_eq!(
        recorded.get("idempotency_store_duration_seconds{op=claim,store=memory}"),
        4
    );
    assert_eq!(
        recorded.get("idempotency_store_duration_seconds{op=complete,store=memory}"),
        1
    );
    assert_eq!(
        recorded.get("idempotency_store_duration_seconds{op=release,store=memory}"),
        1
    );
}

/// The user's error contract: a `type` base of their own, their own envelope, their own
/// replay header; and the defaults unchanged without them.
mod contract {
    use tower_layer::Layer;

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
        let empty_auth = Request::post("/orders")
            .header("idempotency-key", "k")
            .header("authorization", "")
            .body(Full::new(Bytes::from("a")))
            .unwrap();
        assert_eq!(
            service.clone().oneshot(empty_auth).await.unwrap().status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(count.load(Ordering::SeqCst), 0);

        let alice = Request::post("/orders")
            .header("idempotency-key", "k")
            .header("authorization", "Bearer alice")
            .body(Full::new(Bytes::from("a")))
            .unwrap();
        assert_eq!(
            service.clone().oneshot(alice).await.unwrap().status(),
            StatusCode::CREATED
        );
        assert_eq!(count.load(Ordering::SeqCst), 1);

        // Without the setting, anonymous callers are served (and share one key space).
        let open =
            Idempotency::memory().layer(counting_service(count.clone(), StatusCode::CREATED));
        assert_eq!(
            open.oneshot(post("k", "a")).await.unwrap().status(),
            StatusCode::CREATED
        );
    }

    /// A response body fed frame by frame through a channel: a stream with no end in sight
    /// until the sender is dropped (server-sent events, a large download).
    struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
        }
    }

    /// A handler that answers 201 with a body streamed from a channel, whose sender it puts in
    /// `senders`; `runs` counts its calls.
    fn streaming_export(
        runs: Arc<AtomicUsize>,
        senders: Arc<std::sync::Mutex<Vec<tokio::sync::mpsc::Sender<Bytes>>>>,
    ) -> impl Service<
        Request<RequestBody<Full<Bytes>>>,
        Response = Response<Channel>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
           + Send
           + 'static {
        tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            runs.fetch_add(1, Ordering::SeqCst);
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            senders.lock().unwrap().push(tx);
            async move {
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .header("location", "/exports/1")
                    .header("content-type", "text/event-stream")
                    .body(Channel(rx))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    }

    #[tokio::test]
    async fn an_answer_over_the_saved_limit_is_streamed_and_a_retry_gets_its_status_and_headers() {
        let runs = Arc::new(AtomicUsize::new(0));
        let senders = Arc::new(std::sync::Mutex::new(Vec::new()));
        let service = Idempotency::memory()
            .with_saved_body_limit(1024)
            .layer(streaming_export(runs.clone(), senders.clone()));
        let first = tokio::spawn(service.clone().oneshot(post("k", "a")));
        tokio::task::yield_now().await;
        let tx = loop {
            if let Some(tx) = senders.lock().unwrap().pop() {
                break tx;
            }
            tokio::task::yield_now().await;
        };
        // 3 KiB, then the stream stays open: the answer must not wait for its end.
        for _ in 0..3 {
            tx.send(Bytes::from(vec![b'x'; 1024])).await.unwrap();
        }
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let mut body = first.into_body();
        let mut received = 0;
        while received < 3 * 1024 {
            let frame = body.frame().await.unwrap().unwrap();
            received += frame.into_data().unwrap().len();
        }
        tx.send(Bytes::from_static(b"last")).await.unwrap();
        drop(tx);
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(
            received + rest.len(),
            3 * 1024 + 4,
            "the client gets every byte"
        );

        let retry = service.clone().oneshot(post("k", "a")).await.unwrap();
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert_eq!(retry.headers()[&crate::REPLAYED_HEADER], "true");
        assert_eq!(retry.headers()[&crate::BODY_NOT_KEPT_HEADER], "true");
        assert_eq!(retry.headers()["location"], "/exports/1");
        assert!(retry.headers().get("content-type").is_none());
        assert_eq!(body_of(retry).await, "");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the retry did not run again"
        );
    }

    #[tokio::test]
    async fn a_body_announced_over_the_limit_is_not_read_before_it_is_sent() {
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let runs = runs.clone();
            tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                        vec![b'y'; 64 * 1024],
                    ))))
                }
            })
        };
        let service = Idempotency::memory()
            .with_saved_body_limit(1024)
            .layer(handler);
        let first = service.clone().oneshot(post("k", "a")).await.unwrap();
        assert_eq!(body_of(first).await.len(), 64 * 1024);
        let retry = service.clone().oneshot(post("k", "a")).await.unwrap();
        assert_eq!(retry.status(), StatusCode::OK);
        assert_eq!(retry.headers()[&crate::BODY_NOT_KEPT_HEADER], "true");
        assert_eq!(body_of(retry).await, "");
        // Within the limit, the body is saved whole as before.
        let small = Idempotency::memory().layer(counting_service(runs.clone(), StatusCode::OK));
        small.clone().oneshot(post("s", "a")).await.unwrap();
        let replay = small.oneshot(post("s", "a")).await.unwrap();
        assert!(replay.headers().get(&crate::BODY_NOT_KEPT_HEADER).is_none());
        assert_eq!(body_of(replay).await, "run 2");
    }
}
