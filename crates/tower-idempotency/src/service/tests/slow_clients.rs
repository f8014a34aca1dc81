//! Slow clients and the clock: a body slower than the timeout, and the Retry-After of a duplicate.

use super::*;

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
