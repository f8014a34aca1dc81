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
use tower::{Layer, ServiceExt};
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

/// The layer over a fresh memory store and a handler that answers `status`, counting the
/// handler's runs in `runs`.
fn guarded(
    runs: &Arc<AtomicUsize>,
    status: StatusCode,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<crate::body::ResponseBody<Full<Bytes>>>,
    Error = std::convert::Infallible,
> + Clone {
    Idempotency::memory().layer(counting_service(runs.clone(), status))
}

/// For a handler's `map_request`: counts the requests that reach the handler in `runs` (the
/// layer's own answers and replays never do).
fn counting<R>(runs: &Arc<AtomicUsize>) -> impl Fn(R) -> R + Clone {
    let runs = runs.clone();
    move |request| {
        runs.fetch_add(1, Ordering::SeqCst);
        request
    }
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
    let count = Arc::default();
    let service = guarded(&count, StatusCode::CREATED);
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
    for status in [
        StatusCode::REQUEST_TIMEOUT,
        StatusCode::TOO_EARLY,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        let count = Arc::default();
        let service = guarded(&count, status);
        for _ in 0..2 {
            let response = service.clone().oneshot(post("k", "a")).await.unwrap();
            assert_eq!(response.status(), status);
            assert!(response.headers().get(&crate::REPLAYED_HEADER).is_none());
        }
        assert_eq!(count.load(Ordering::SeqCst), 2, "{status} was replayed");
    }
}

#[tokio::test]
async fn a_not_processed_answer_releases_the_key() {
    let count = Arc::new(AtomicUsize::new(0));
    let handler = tower::service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mut response = Response::new(Full::new(body.clone()));
        if body == "bad" {
            *response.status_mut() = StatusCode::BAD_REQUEST;
            response.extensions_mut().insert(NotProcessed);
        } else {
            *response.status_mut() = StatusCode::CREATED;
        }
        Ok::<_, std::convert::Infallible>(response)
    })
    .map_request(counting(&count));
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
    let count = Arc::default();
    let service = guarded(&count, StatusCode::OK);
    let get = Request::get("/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(service.oneshot(get).await.unwrap().status(), StatusCode::OK);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

mod claim_failures;
mod contract;
mod large_answers;
#[cfg(feature = "metrics")]
mod metrics;
mod slow_clients;

/// "Keep for ever", said with the longest `Duration` there is, for the retention, the lease and
/// the wait: each is cut to 100 years, and requests are served and replayed (no clock arithmetic
/// overflows into a panic).
#[tokio::test]
async fn settings_of_the_longest_duration_are_cut_to_a_century() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = Idempotency::memory()
        .with_ttl(Duration::MAX)
        .with_lease(Duration::MAX)
        .wait_for_in_flight(Duration::MAX)
        .with_store_timeout(Duration::MAX)
        .with_body_timeout(Duration::MAX)
        .layer(counting_service(runs.clone(), StatusCode::CREATED));
    let first = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()[&crate::REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "replayed, not run again");
}
