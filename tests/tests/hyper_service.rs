//! The layer on a bare hyper service: no axum anywhere. The inner service receives hyper's own
//! `Incoming` body through [`RequestBody`], over real HTTP/1.1 connections on 127.0.0.1.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use tokio::net::{TcpListener, TcpStream};
use tower_idempotency::{store::MemoryStore, IdempotencyService, RequestBody, REPLAYED_HEADER};

/// Serve `POST /orders` with hyper alone: the handler reads the `Incoming` body the layer hands
/// on, counts its runs and answers `201` with `run N: <body>`.
async fn serve() -> (SocketAddr, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |req: Request<RequestBody<Incoming>>| {
            let runs = runs.clone();
            async move {
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .expect("the buffered body reads")
                    .to_bytes();
                // Long enough that concurrent duplicates overlap with the first attempt.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let text = format!("run {n}: {}", String::from_utf8_lossy(&body));
                let mut response = Response::new(Full::new(Bytes::from(text)));
                *response.status_mut() = StatusCode::CREATED;
                Ok::<_, Infallible>(response)
            }
        })
    };
    let service = IdempotencyService::new(handler, MemoryStore::new());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, runs)
}

/// One `POST /orders` on a fresh hyper client connection.
async fn post(addr: SocketAddr, key: &str, body: &'static str) -> (StatusCode, HeaderMap, Bytes) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::post("/orders")
        .header(http::header::HOST, addr.to_string())
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_on_a_hyper_service_replays_the_first_answer() {
    let (addr, runs) = serve().await;
    let (status, headers, body) = post(addr, "hyper-1", r#"{"total":40}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get(&REPLAYED_HEADER).is_none());
    assert_eq!(body, r#"run 1: {"total":40}"#);

    let (status, headers, replay) = post(addr, "hyper-1", r#"{"total":40}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers[&REPLAYED_HEADER], "true");
    assert_eq!(replay, body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_reused_for_another_body_is_refused_with_422() {
    let (addr, runs) = serve().await;
    let (status, _, _) = post(addr, "hyper-2", r#"{"total":40}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, body) = post(addr, "hyper-2", r#"{"total":41}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        headers[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(!body.is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_duplicates_run_the_handler_once() {
    let (addr, runs) = serve().await;
    let attempts: Vec<_> = (0..16)
        .map(|_| tokio::spawn(post(addr, "hyper-3", r#"{"total":7}"#)))
        .collect();
    let mut answers = Vec::new();
    for attempt in attempts {
        let (status, headers, body) = attempt.await.unwrap();
        match status {
            StatusCode::CREATED => answers.push(body),
            StatusCode::CONFLICT => {
                assert!(headers.contains_key(http::header::RETRY_AFTER));
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran more than once"
    );
    assert!(!answers.is_empty());
    assert!(answers.iter().all(|a| a == r#"run 1: {"total":7}"#));
}
