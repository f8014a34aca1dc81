//! Answers over the saved limit: streamed to the caller, and what a retry gets.

use tower_layer::Layer;

use super::*;

/// A response body fed frame by frame through a channel: a stream with no end in sight
/// until the sender is dropped (server-sent events, a large download); with a length, one that
/// announces it up front (a `Content-Length`).
struct Channel(tokio::sync::mpsc::Receiver<Bytes>, Option<u64>);

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

    fn size_hint(&self) -> http_body::SizeHint {
        self.1.map_or_else(
            http_body::SizeHint::default,
            http_body::SizeHint::with_exact,
        )
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
                .body(Channel(rx, None))
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

    the_export_replays_without_its_body(service, &runs).await;
}

/// The answer's head, which must come before any of its body is sent.
async fn head_at_once<S>(service: &S) -> S::Response
where
    S: Service<Request<Full<Bytes>>> + Clone,
    S::Error: fmt::Debug,
{
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        service.clone().oneshot(post("k", "a")),
    )
    .await
    .expect("the head comes before any of the body")
    .unwrap()
}

/// The retry of the streamed export: its status and headers (not those of the body), an empty
/// body, marked replayed and not kept; the handler did not run again.
async fn the_export_replays_without_its_body<S>(service: S, runs: &AtomicUsize)
where
    S: Service<Request<Full<Bytes>>, Response = Response<crate::body::ResponseBody<Channel>>>,
    S::Error: fmt::Debug,
{
    let retry = service.oneshot(post("k", "a")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()[&crate::REPLAYED_HEADER], "true");
    assert_eq!(retry.headers()[&crate::BODY_NOT_KEPT_HEADER], "true");
    assert_eq!(retry.headers()["location"], "/exports/1");
    assert!(retry.headers().get("content-type").is_none());
    assert_eq!(body_of(retry).await, "");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retry ran again");
}

/// A stream of server-sent events under the default saved limit (1 MiB): small events, no end
/// in sight. Its head comes at once and each event as it is sent, not after a mebibyte of them;
/// a retry gets the first answer's status and headers, as for any answer not kept.
#[tokio::test]
async fn server_sent_events_reach_their_client_as_they_are_sent() {
    let runs = Arc::new(AtomicUsize::new(0));
    let senders = Arc::new(std::sync::Mutex::new(Vec::new()));
    let service = Idempotency::memory().layer(streaming_export(runs.clone(), senders.clone()));
    let first = head_at_once(&service).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let tx = senders.lock().unwrap().pop().expect("the handler ran");
    let mut body = first.into_body();
    for n in 0..3 {
        let event = Bytes::from(format!("data: {n}\n\n"));
        tx.send(event.clone()).await.unwrap();
        let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
            .await
            .expect("each event comes as it is sent")
            .unwrap()
            .unwrap();
        assert_eq!(frame.into_data().unwrap(), event);
    }
    drop(tx);
    assert!(
        body.frame().await.is_none(),
        "the stream ends with its sender"
    );

    the_export_replays_without_its_body(service, &runs).await;
}

#[tokio::test]
async fn a_body_announced_over_the_limit_is_not_read_before_it_is_sent() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
    let handler = tower::service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let rx = rx.lock().unwrap().take().expect("the handler runs once");
        async move {
            let body = Channel(rx, Some(64 * 1024));
            Ok::<_, std::convert::Infallible>(Response::new(body))
        }
    })
    .map_request(counting(&runs));
    let service = Idempotency::memory()
        .with_saved_body_limit(1024)
        .layer(handler);
    // Not a byte of the body is sent yet: its announced length is over the limit, so the head
    // comes at once (reading its first frame before answering would wait here for ever).
    let first = head_at_once(&service).await;
    tx.send(Bytes::from(vec![b'y'; 64 * 1024])).await.unwrap();
    drop(tx);
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
