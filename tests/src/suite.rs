//! The behaviour suite: one test body per behaviour of `DESIGN.md`, written once and run against
//! every store by `tests/tests/behaviour.rs` (tower-sessions-stores' `route_tests!` idea).
//!
//! Every body takes a fresh store, puts the layer in front of a real axum app served on
//! `127.0.0.1:0`, and talks to it over real sockets with reqwest. The app counts handler
//! executions, and its slow handler is held in flight by a signal the test releases, so no test
//! synchronises with sleeps where a signal exists. Sleeps remain only where the passing of time
//! is itself under test (a lease that must lapse, a fixed-duration workload).
//!
//! Every wait is bounded: requests carry a timeout, signals are awaited with [`SIGNAL_TIMEOUT`],
//! polling loops have a count.

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    extract::{Path, Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::watch,
    task::JoinHandle,
};
use tower::{Layer, ServiceExt};
use tower_idempotency::{
    fingerprint::{DefaultFingerprint, FingerprintFn},
    store::{Claim, ClaimOutcome, Fenced, FencingToken, Store, StoredResponse, TransactionalStore},
    Idempotency, IdempotencyKey, IdempotencyTransaction, Mode, Scope, DEFAULT_TTL, REPLAYED_HEADER,
};

/// How long any request may take before the test fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a test waits for a signal from the app before it fails.
pub const SIGNAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The `Date` the test handlers set; a replay must not carry it.
pub const HANDLER_DATE: &str = "Sun, 06 Nov 1994 08:49:37 GMT";
/// The JSON body of an ordinary test request.
pub const ORDER: &str = r#"{"customerId":"c_1","totalCents":4000}"#;
/// How long the fixed-duration handler (`POST /slow`) takes.
pub const SLOW_HANDLER: Duration = Duration::from_millis(300);

// ------------------------------------------------------------------------------------------------
// The test app
// ------------------------------------------------------------------------------------------------

/// What the handlers of one app instance observed, and the signals the test controls.
#[derive(Debug)]
pub struct AppState {
    executions: AtomicUsize,
    per_key: Mutex<HashMap<String, usize>>,
    /// How many handlers of `/held` have started.
    entered: watch::Sender<usize>,
    /// How many handlers of `/held` have finished.
    finished: watch::Sender<usize>,
    /// `true` once the test releases the handlers of `/held`.
    release: watch::Sender<bool>,
    /// How many request futures the server dropped before they answered (a client gone).
    dropped: watch::Sender<usize>,
}

impl Default for AppState {
    fn default() -> Self {
        Self {
            executions: AtomicUsize::new(0),
            per_key: Mutex::new(HashMap::new()),
            entered: watch::channel(0).0,
            finished: watch::channel(0).0,
            release: watch::channel(false).0,
            dropped: watch::channel(0).0,
        }
    }
}

impl AppState {
    /// Count one handler execution (for `key`, when the request had one); returns its number,
    /// starting at 1.
    pub fn execute(&self, key: Option<&IdempotencyKey>) -> usize {
        if let Some(key) = key {
            *self
                .per_key
                .lock()
                .unwrap()
                .entry(key.as_str().to_owned())
                .or_default() += 1;
        }
        self.executions.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// How many times any handler of this instance ran.
    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    /// How many times a handler of this instance ran for `key`.
    pub fn executions_of(&self, key: &str) -> usize {
        self.per_key.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Let every held handler (`POST /held`) answer, now and later.
    pub fn release(&self) {
        self.release.send_replace(true);
    }

    /// Wait until `n` held handlers have started.
    pub async fn wait_entered(&self, n: usize) {
        wait_count(&self.entered, n, "held handlers to start").await;
    }

    /// Wait until `n` held handlers have finished.
    pub async fn wait_finished(&self, n: usize) {
        wait_count(&self.finished, n, "held handlers to finish").await;
    }

    /// Wait until the server has dropped `n` unanswered request futures.
    pub async fn wait_dropped(&self, n: usize) {
        wait_count(&self.dropped, n, "the server to drop a request").await;
    }

    async fn hold(&self) {
        let mut release = self.release.subscribe();
        self.entered.send_modify(|n| *n += 1);
        tokio::time::timeout(SIGNAL_TIMEOUT, release.wait_for(|released| *released))
            .await
            .expect("the test never released the held handler")
            .expect("the release signal is alive");
    }
}

async fn wait_count(tx: &watch::Sender<usize>, n: usize, what: &str) {
    let mut rx = tx.subscribe();
    tokio::time::timeout(SIGNAL_TIMEOUT, rx.wait_for(|count| *count >= n))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {n} {what}"))
        .expect("the signal is alive");
}

type AppRef = Arc<AppState>;

/// The answer every counting handler gives: `status` with a JSON body naming the execution and
/// echoing the request, and the headers the replay tests look at: `Location`, two `Link` values,
/// `Set-Cookie`, a handler-set `Date`, and a hop-by-hop header named in `Connection`.
pub fn answer(status: StatusCode, execution: usize, request: &Bytes) -> Response {
    let request = serde_json::from_slice::<Value>(request)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(request).into_owned()));
    let mut response = (
        status,
        Json(json!({ "execution": execution, "request": request })),
    )
        .into_response();
    let headers = response.headers_mut();
    let location = HeaderValue::from_str(&format!("/orders/{execution}")).unwrap();
    headers.insert(header::LOCATION, location);
    headers.append(
        header::LINK,
        HeaderValue::from_static("</orders>; rel=\"collection\""),
    );
    headers.append(
        header::LINK,
        HeaderValue::from_static("</customers/c_1>; rel=\"customer\""),
    );
    headers.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=s3cr3t; HttpOnly"),
    );
    headers.insert(header::DATE, HeaderValue::from_static(HANDLER_DATE));
    headers.insert(header::CONNECTION, HeaderValue::from_static("x-hop"));
    headers.insert("x-hop", HeaderValue::from_static("1"));
    response
}

async fn create(State(state): State<AppRef>, key: Option<IdempotencyKey>, body: Bytes) -> Response {
    let n = state.execute(key.as_ref());
    answer(StatusCode::CREATED, n, &body)
}

async fn list(State(state): State<AppRef>) -> Response {
    let n = state.execute(None);
    (StatusCode::OK, Json(json!({ "execution": n }))).into_response()
}

async fn held(State(state): State<AppRef>, key: Option<IdempotencyKey>, body: Bytes) -> Response {
    let n = state.execute(key.as_ref());
    state.hold().await;
    let response = answer(StatusCode::CREATED, n, &body);
    state.finished.send_modify(|n| *n += 1);
    response
}

async fn slow(State(state): State<AppRef>, key: Option<IdempotencyKey>, body: Bytes) -> Response {
    let n = state.execute(key.as_ref());
    tokio::time::sleep(SLOW_HANDLER).await;
    answer(StatusCode::CREATED, n, &body)
}

async fn status(
    State(state): State<AppRef>,
    Path(code): Path<u16>,
    key: Option<IdempotencyKey>,
    body: Bytes,
) -> Response {
    let n = state.execute(key.as_ref());
    answer(StatusCode::from_u16(code).unwrap(), n, &body)
}

async fn panicky(
    State(state): State<AppRef>,
    key: Option<IdempotencyKey>,
    body: Bytes,
) -> Response {
    let n = state.execute(key.as_ref());
    if n == 1 {
        panic!("the first attempt of POST /panic panics (on purpose)");
    }
    answer(StatusCode::CREATED, n, &body)
}

/// Counts request futures that the server drops before they answer (the client went away).
async fn track_drops(State(state): State<AppRef>, req: Request, next: Next) -> Response {
    struct Guard(Option<AppRef>);
    impl Drop for Guard {
        fn drop(&mut self) {
            if let Some(state) = self.0.take() {
                state.dropped.send_modify(|n| *n += 1);
            }
        }
    }
    let mut guard = Guard(Some(state));
    let response = next.run(req).await;
    guard.0 = None;
    response
}

/// The routes of the test app, without the idempotency layer.
///
/// | route | handler |
/// |---|---|
/// | `POST`, `PATCH`, `PUT /orders`; `GET /orders` | 201 at once (`GET`: 200) |
/// | `POST /held` | 201 once the test calls [`AppState::release`] |
/// | `POST /slow` | 201 after [`SLOW_HANDLER`] |
/// | `POST /status/{code}` | answers `code` |
/// | `POST /panic` | panics on its first execution, 201 after |
pub fn routes(state: AppRef) -> Router {
    Router::new()
        .route("/orders", post(create).get(list).patch(create).put(create))
        .route("/other", post(create))
        .route("/held", post(held))
        .route("/slow", post(slow))
        .route("/status/{code}", post(status))
        .route("/panic", post(panicky))
        .with_state(state)
}

/// One app instance served on `127.0.0.1:0`; the server stops when this is dropped.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    /// What the handlers observed.
    pub state: AppRef,
    client: reqwest::Client,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A reqwest client that never uses a proxy and never waits longer than [`REQUEST_TIMEOUT`].
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("build the reqwest client")
}

/// Serve the test app behind `layer`.
pub async fn serve<St: Store, M: Mode<St>>(layer: Idempotency<St, M>) -> TestServer {
    let state = AppRef::default();
    serve_router(routes(state.clone()).layer(layer), state).await
}

/// Serve `router` (already layered) with the drop tracker of `state` outermost.
pub async fn serve_router(router: Router, state: AppRef) -> TestServer {
    let app = router.layer(middleware::from_fn_with_state(state.clone(), track_drops));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .await
            .expect("serve the test app");
    });
    TestServer {
        addr,
        state,
        client: client(),
        task,
    }
}

impl TestServer {
    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A POST of `body` as JSON to `path`, with no key.
    pub fn post(&self, path: &str, body: &str) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.to_owned())
    }

    /// A POST of `body` as JSON to `path` with `Idempotency-Key: key`.
    pub fn post_key(&self, path: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
        self.post(path, body).header("idempotency-key", key)
    }

    /// The ordinary request: `POST /orders` with [`ORDER`] and `key`.
    pub fn order(&self, key: &str) -> reqwest::RequestBuilder {
        self.post_key("/orders", key, ORDER)
    }
}

/// A response read in full.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// `true` when the response carries `Idempotent-Replayed: true`.
    pub fn replayed(&self) -> bool {
        match self.headers.get(REPLAYED_HEADER) {
            None => false,
            Some(v) if v == "true" => true,
            Some(v) => panic!("Idempotent-Replayed has an unexpected value {v:?}"),
        }
    }

    /// `Retry-After` in seconds; panics when it is missing or not delta-seconds.
    pub fn retry_after(&self) -> u64 {
        let value = self
            .headers
            .get(header::RETRY_AFTER)
            .unwrap_or_else(|| panic!("no Retry-After on {} {:?}", self.status, self.body));
        value
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("Retry-After {value:?} is not whole seconds"))
    }

    /// `Retry-After`, if present.
    pub fn retry_after_opt(&self) -> Option<u64> {
        self.headers
            .get(header::RETRY_AFTER)
            .map(|_| self.retry_after())
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body {:?} is not JSON: {e}", self.body))
    }

    /// The `execution` number a counting handler put in the body.
    pub fn execution(&self) -> u64 {
        self.json()["execution"]
            .as_u64()
            .unwrap_or_else(|| panic!("no execution in {:?}", self.body))
    }

    /// Assert a problem+json answer of the layer with `status` (RFC 9457 fields present).
    pub fn assert_problem(&self, status: StatusCode) {
        assert_eq!(self.status, status, "body: {:?}", self.body);
        assert_eq!(
            self.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json"
        );
        let problem = self.json();
        assert!(problem["type"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(problem["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert_eq!(problem["status"], status.as_u16());
        assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()));
        assert!(!self.replayed());
    }

    /// Assert a 409 "in flight" with a `Retry-After` of at least 1 s; returns it.
    pub fn assert_in_flight(&self) -> u64 {
        self.assert_problem(StatusCode::CONFLICT);
        let retry_after = self.retry_after();
        assert!(retry_after >= 1, "Retry-After {retry_after} < 1");
        retry_after
    }

    /// Assert the first, executed answer: `status`, not replayed, `execution` as given.
    pub fn assert_executed(&self, status: StatusCode, execution: u64) {
        assert_eq!(self.status, status, "body: {:?}", self.body);
        assert!(!self.replayed(), "expected an execution, got a replay");
        assert_eq!(self.execution(), execution);
    }

    /// Assert a replay of `original`: same status and body, `Idempotent-Replayed: true`.
    pub fn assert_replay_of(&self, original: &Reply) {
        assert_eq!(self.status, original.status, "body: {:?}", self.body);
        assert!(self.replayed(), "expected a replay, got {:?}", self.headers);
        assert_eq!(self.body, original.body);
    }
}

/// Send `request` and read the whole response; panics on a transport error.
pub async fn send(request: reqwest::RequestBuilder) -> Reply {
    try_send(request)
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

/// Send `request` and read the whole response.
pub async fn try_send(request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// Send the requests built by `make(i)` for `i` in `0..n` at once: every task waits on one
/// barrier, then sends. Returns the replies in the order of `i`.
pub async fn concurrently(n: usize, make: impl Fn(usize) -> reqwest::RequestBuilder) -> Vec<Reply> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let request = make(i);
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                send(request).await
            })
        })
        .collect();
    let mut replies = Vec::with_capacity(n);
    for task in tasks {
        replies.push(task.await.expect("a request task panicked"));
    }
    replies
}

/// The hash the layer keeps for `key` under the default scope with no `Authorization`.
pub fn key_hash(key: &str) -> tower_idempotency::KeyHash {
    IdempotencyKey::parse(key.as_bytes())
        .expect("a valid key")
        .scoped_hash(&Scope::new(b""))
}

/// The default fingerprint of `POST {path}` with the JSON `body`, as the layer computes it.
pub fn fingerprint(path: &str, body: &str) -> tower_idempotency::Fingerprint {
    let (parts, ()) = http::Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(())
        .unwrap()
        .into_parts();
    DefaultFingerprint::default().fingerprint(&parts, &Bytes::copy_from_slice(body.as_bytes()))
}

// ------------------------------------------------------------------------------------------------
// Concurrency
// ------------------------------------------------------------------------------------------------

/// One execution; the first answer is a 201; every other answer a replay of it or a 409.
fn assert_single_execution(replies: &[Reply], executions: usize) {
    assert_eq!(executions, 1, "the handler ran {executions} times");
    let executed: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(executed.len(), 1, "answers not replayed: {executed:?}");
    let original = executed[0];
    for reply in replies {
        if std::ptr::eq(reply, original) {
            continue;
        }
        match reply.status {
            StatusCode::CREATED => reply.assert_replay_of(original),
            StatusCode::CONFLICT => {
                reply.assert_in_flight();
            }
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
}

async fn concurrent_attempts(store: impl Store, n: usize) {
    let server = serve(Idempotency::new(store)).await;
    let replies = concurrently(n, |_| server.order("seed-key")).await;
    assert_single_execution(&replies, server.state.executions());
    assert!(replies
        .iter()
        .all(|r| r.status == StatusCode::CONFLICT || r.execution() == 1));
    // once settled, every retry is a replay
    let original = replies
        .iter()
        .find(|r| r.status == StatusCode::CREATED && !r.replayed())
        .unwrap();
    send(server.order("seed-key"))
        .await
        .assert_replay_of(original);
    assert_eq!(server.state.executions(), 1);
}

/// 5 concurrent attempts with one key: one execution; the others replay it or get 409.
pub async fn five_concurrent_attempts_execute_once(store: impl Store) {
    concurrent_attempts(store, 5).await;
}

/// 50 concurrent attempts with one key: one execution; the others replay it or get 409.
pub async fn fifty_concurrent_attempts_execute_once(store: impl Store) {
    concurrent_attempts(store, 50).await;
}

/// Two app instances sharing one store, hit at once with the same keys: one execution per key.
pub async fn two_instances_execute_each_key_once(store: impl Store) {
    const KEYS: usize = 10;
    const ATTEMPTS_PER_INSTANCE: usize = 3;
    let layer = Idempotency::new(store);
    let a = serve(layer.clone()).await;
    let b = serve(layer).await;
    let per_key = 2 * ATTEMPTS_PER_INSTANCE;
    let replies = concurrently(KEYS * per_key, |i| {
        let key = format!("two-instances-{}", i / per_key);
        if i % 2 == 0 {
            a.order(&key)
        } else {
            b.order(&key)
        }
    })
    .await;
    for key in 0..KEYS {
        let name = format!("two-instances-{key}");
        let executions = a.state.executions_of(&name) + b.state.executions_of(&name);
        let replies = &replies[key * per_key..(key + 1) * per_key];
        assert_single_execution(replies, executions);
    }
    assert_eq!(a.state.executions() + b.state.executions(), KEYS);
}

// ------------------------------------------------------------------------------------------------
// Statuses: the key
// ------------------------------------------------------------------------------------------------

/// No key on a covered method: 400 problem+json, handler not called.
pub async fn missing_key_is_400_problem(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
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
pub async fn empty_key_is_400(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    assert_key_refused(&server, server.order("")).await;
    assert_key_refused(&server, server.order("\"\"")).await;
}

/// A key of 256 bytes: 400; 255 bytes is the longest accepted.
pub async fn key_over_255_bytes_is_400(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    assert_key_refused(&server, server.order(&"k".repeat(256))).await;
    // quoting does not count: 256 bytes inside the quotes is still too long
    assert_key_refused(&server, server.order(&format!("\"{}\"", "k".repeat(256)))).await;
    send(server.order(&"k".repeat(255)))
        .await
        .assert_executed(StatusCode::CREATED, 1);
}

/// A key with a control character (tab) or a space: 400.
pub async fn key_with_control_char_is_400(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    assert_key_refused(&server, server.order("bad\tkey")).await;
    assert_key_refused(&server, server.order("bad key")).await;
    assert_key_refused(&server, server.order("\"unclosed")).await;
}

/// Two `Idempotency-Key` headers: 400.
pub async fn two_key_headers_are_400(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let request = server.order("first").header("idempotency-key", "second");
    assert_key_refused(&server, request).await;
    // even when both name the same key
    let request = server.order("same").header("idempotency-key", "same");
    assert_key_refused(&server, request).await;
}

/// Bare `key` and quoted `"key"` name the same key: the second is a replay.
pub async fn quoted_and_bare_key_are_the_same_key(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
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

// ------------------------------------------------------------------------------------------------
// Statuses: the body and the fingerprint
// ------------------------------------------------------------------------------------------------

/// A body over the limit (declared by `Content-Length`): 413, and the key is not claimed.
pub async fn body_over_limit_is_413_and_claims_nothing(store: impl Store) {
    let server = serve(Idempotency::new(store).with_body_limit(64)).await;
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
pub async fn chunked_body_over_limit_is_413_and_claims_nothing(store: impl Store) {
    let server = serve(Idempotency::new(store).with_body_limit(64)).await;
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

/// Write `request` on a fresh connection and read until the server closes it.
pub async fn raw_http(addr: SocketAddr, request: &[u8]) -> String {
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut out = Vec::new();
        // the server may close while we still write or read: take what arrived
        let _ = stream.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .expect("raw HTTP exchange timed out")
}

/// The same key with another body: 422, never a replay, never a second execution.
pub async fn same_key_other_body_is_422(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let first = send(server.order("body-1")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    let other = r#"{"customerId":"c_1","totalCents":9999}"#;
    send(server.post_key("/orders", "body-1", other))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(server.state.executions(), 1);
    // the original request still replays
    send(server.order("body-1")).await.assert_replay_of(&first);
}

/// The same key on another path (or query): 422.
pub async fn same_key_other_path_is_422(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    send(server.order("path-1"))
        .await
        .assert_executed(StatusCode::CREATED, 1);
    send(server.post_key("/other", "path-1", ORDER))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    send(server.post_key("/orders?dry_run=true", "path-1", ORDER))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(server.state.executions(), 1);
}

/// A different request with a key whose first attempt is still running: 422, not 409.
pub async fn mismatch_while_running_is_422(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let first = tokio::spawn(send(server.post_key("/held", "running-1", ORDER)));
    server.state.wait_entered(1).await;
    send(server.post_key("/held", "running-1", r#"{"other":true}"#))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    server.state.release();
    first.await.unwrap().assert_executed(StatusCode::CREATED, 1);
    assert_eq!(server.state.executions(), 1);
}

/// The same JSON with its keys reordered and other whitespace: the same request, replayed.
pub async fn reordered_json_is_replayed(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let first = send(server.post_key(
        "/orders",
        "json-1",
        r#"{"customerId":"c_1","items":[{"sku":"a","qty":1}],"totalCents":4000}"#,
    ))
    .await;
    first.assert_executed(StatusCode::CREATED, 1);
    let reordered = "{ \"totalCents\" : 4000,\n  \"items\": [ { \"qty\": 1, \"sku\": \"a\" } ],\n  \"customerId\": \"c_1\" }";
    send(server.post_key("/orders", "json-1", reordered))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

/// GET is not covered: it passes through without a key, every time.
pub async fn get_passes_through_without_key(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
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

// ------------------------------------------------------------------------------------------------
// Which answers are saved
// ------------------------------------------------------------------------------------------------

/// A handler's 500 is saved and replayed (it may have taken effect).
pub async fn handler_500_is_saved_and_replayed(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let first = send(server.post_key("/status/500", "s500", ORDER)).await;
    first.assert_executed(StatusCode::INTERNAL_SERVER_ERROR, 1);
    send(server.post_key("/status/500", "s500", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

async fn status_releases_the_key(store: impl Store, status: StatusCode) {
    let server = serve(Idempotency::new(store)).await;
    let path = format!("/status/{}", status.as_u16());
    for n in 1..=3 {
        send(server.post_key(&path, "try-again", ORDER))
            .await
            .assert_executed(status, n);
    }
    assert_eq!(server.state.executions(), 3);
}

/// A handler's 429 is not saved: the key is released and the retry runs again.
pub async fn handler_429_releases_the_key(store: impl Store) {
    status_releases_the_key(store, StatusCode::TOO_MANY_REQUESTS).await;
}

/// A handler's 503 is not saved: the key is released and the retry runs again.
pub async fn handler_503_releases_the_key(store: impl Store) {
    status_releases_the_key(store, StatusCode::SERVICE_UNAVAILABLE).await;
}

/// An inner service `Err` releases the key: the retry runs the service again.
pub async fn inner_error_releases_the_key(store: impl Store) {
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = calls.clone();
        tower::service_fn(move |_req: http::Request<Body>| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == 1 {
                    Err("the inner service failed")
                } else {
                    Ok(answer(StatusCode::CREATED, n, &Bytes::new()))
                }
            }
        })
    };
    let service = Idempotency::new(store).layer(inner);
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
pub async fn panicking_handler_releases_the_key(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
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

// ------------------------------------------------------------------------------------------------
// Scope
// ------------------------------------------------------------------------------------------------

/// The same key under different `Authorization` headers: independent executions.
pub async fn other_authorization_is_an_independent_key(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
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
pub async fn empty_authorization_scopes_like_absent(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let first = send(server.order("empty-auth")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.order("empty-auth").header("authorization", ""))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

/// With `.optional()`, a request without a key runs the handler every time and is never
/// replayed; a key still works, and an invalid key is still 400.
pub async fn optional_layer_passes_keyless_requests_through(store: impl Store) {
    let server = serve(Idempotency::new(store).optional()).await;
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
pub async fn key_is_checked_before_the_body(store: impl Store) {
    let server = serve(Idempotency::new(store).with_body_limit(16)).await;
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
pub async fn patch_is_covered_put_is_not(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
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

/// 408 and 425 mean "not processed" too: the key is released.
pub async fn handler_408_and_425_release_the_key(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
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
pub async fn custom_save_policy_decides_what_is_saved(store: impl Store) {
    let policy = |status: StatusCode| !status.is_server_error();
    let server = serve(Idempotency::new(store).with_save_policy(policy)).await;
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

/// After the retention (`with_ttl`) the record is gone: the key can be claimed again, even by a
/// different request.
pub async fn expired_record_is_claimed_afresh(store: impl Store) {
    const TTL: Duration = Duration::from_millis(500);
    let server = serve(Idempotency::new(store).with_ttl(TTL)).await;
    let first = send(server.order("ttl-1")).await;
    // the claim happened before the answer: the record expires before `answered + TTL`
    let answered = Instant::now();
    first.assert_executed(StatusCode::CREATED, 1);
    let other = r#"{"customerId":"c_2","totalCents":1}"#;
    send(server.post_key("/orders", "ttl-1", other))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY);
    // the passing of the retention is what is under test
    tokio::time::sleep((TTL + Duration::from_millis(300)).saturating_sub(answered.elapsed())).await;
    let second = send(server.post_key("/orders", "ttl-1", other)).await;
    second.assert_executed(StatusCode::CREATED, 2);
    send(server.post_key("/orders", "ttl-1", other))
        .await
        .assert_replay_of(&second);
    assert_eq!(server.state.executions(), 2);
}

/// A takeover of a dead holder's record keeps the original expiry (counted from the first
/// claim), not a new one from the takeover.
pub async fn takeover_keeps_the_original_expiry(store: impl Store) {
    const DEAD_LEASE: Duration = Duration::from_millis(200);
    const ORIGINAL_TTL: Duration = Duration::from_millis(1200);
    let store = Arc::new(store);
    // the layer's own retention is a day: only the original claim's expiry can free the key
    let server = serve(Idempotency::from_shared(store.clone())).await;
    let outcome = store
        .claim(&Claim {
            key: key_hash("expiry-1"),
            fingerprint: fingerprint("/orders", ORDER),
            token: FencingToken::new(),
            lease: DEAD_LEASE,
            ttl: ORIGINAL_TTL,
        })
        .await
        .unwrap();
    // lease and expiry are counted from a moment before this
    let claimed_at = Instant::now();
    assert_eq!(outcome, ClaimOutcome::Claimed { taken_over: false });
    tokio::time::sleep(
        (DEAD_LEASE + Duration::from_millis(200)).saturating_sub(claimed_at.elapsed()),
    )
    .await;
    let first = send(server.order("expiry-1")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.order("expiry-1"))
        .await
        .assert_replay_of(&first);
    tokio::time::sleep(
        (ORIGINAL_TTL + Duration::from_millis(300)).saturating_sub(claimed_at.elapsed()),
    )
    .await;
    // expired with the original claim: a different request may use the key now
    let other = r#"{"customerId":"c_3","totalCents":7}"#;
    send(server.post_key("/orders", "expiry-1", other))
        .await
        .assert_executed(StatusCode::CREATED, 2);
    assert_eq!(server.state.executions(), 2);
}

// ------------------------------------------------------------------------------------------------
// Leases
// ------------------------------------------------------------------------------------------------

/// A claim whose holder died (its lease lapsed) is taken over; the dead holder's token is fenced
/// out: its `complete`, `renew` and `release` change nothing, and the replay shows the new answer.
pub async fn lapsed_lease_is_taken_over_and_stale_holder_fenced(store: impl Store) {
    const DEAD_LEASE: Duration = Duration::from_millis(300);
    let store = Arc::new(store);
    let server = serve(Idempotency::from_shared(store.clone())).await;
    let key = key_hash("lease-1");
    let stale = FencingToken::new();
    // the dead holder: claimed directly in the store, never renewed
    let outcome = store
        .claim(&Claim {
            key,
            fingerprint: fingerprint("/held", ORDER),
            token: stale,
            lease: DEAD_LEASE,
            ttl: DEFAULT_TTL,
        })
        .await
        .unwrap();
    assert_eq!(outcome, ClaimOutcome::Claimed { taken_over: false });
    let claimed_at = Instant::now();
    // the layer sees the same record: in flight while the lease lasts
    send(server.post_key("/held", "lease-1", ORDER))
        .await
        .assert_in_flight();
    assert_eq!(server.state.executions(), 0);
    // time passing is what is under test here: let the lease lapse (plus a margin)
    tokio::time::sleep(
        (DEAD_LEASE + Duration::from_millis(250)).saturating_sub(claimed_at.elapsed()),
    )
    .await;
    let retry = tokio::spawn(send(server.post_key("/held", "lease-1", ORDER)));
    server.state.wait_entered(1).await;
    // while the new holder runs, the stale token can write nothing
    let stale_answer = StoredResponse {
        status: StatusCode::ACCEPTED,
        headers: HeaderMap::new(),
        body: Bytes::from_static(b"{\"execution\":0,\"stale\":true}"),
    };
    assert_eq!(
        store.complete(&key, stale, &stale_answer).await.unwrap(),
        Fenced::Lost
    );
    assert_eq!(
        store
            .renew(&key, stale, Duration::from_secs(60))
            .await
            .unwrap(),
        Fenced::Lost
    );
    assert_eq!(store.release(&key, stale).await.unwrap(), Fenced::Lost);
    // ... and the record is still the new holder's: a duplicate is in flight
    send(server.post_key("/held", "lease-1", ORDER))
        .await
        .assert_in_flight();
    server.state.release();
    let new_answer = retry.await.unwrap();
    new_answer.assert_executed(StatusCode::CREATED, 1);
    // after completion too, the stale token cannot overwrite
    assert_eq!(
        store.complete(&key, stale, &stale_answer).await.unwrap(),
        Fenced::Lost
    );
    send(server.post_key("/held", "lease-1", ORDER))
        .await
        .assert_replay_of(&new_answer);
    assert_eq!(server.state.executions(), 1);
}

/// A handler that runs longer than the lease is not taken over while it lives (the heartbeat
/// renews it): duplicates get 409 throughout, and it executes once.
pub async fn slow_handler_is_not_taken_over_while_alive(store: impl Store) {
    const LEASE: Duration = Duration::from_millis(400);
    let server = serve(Idempotency::new(store).with_lease(LEASE)).await;
    let first = tokio::spawn(send(server.post_key("/held", "slow-1", ORDER)));
    server.state.wait_entered(1).await;
    let started = Instant::now();
    // duplicates across three leases (~1.2 s): the lapse of time is under test
    let mut duplicates = 0;
    while started.elapsed() < LEASE * 3 && duplicates < 40 {
        send(server.post_key("/held", "slow-1", ORDER))
            .await
            .assert_in_flight();
        duplicates += 1;
        tokio::time::sleep(LEASE / 4).await;
    }
    assert!(duplicates >= 4);
    assert_eq!(
        server.state.executions(),
        1,
        "the live holder was taken over"
    );
    server.state.release();
    let first = first.await.unwrap();
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.post_key("/held", "slow-1", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

async fn retry_after_while_held(server: &TestServer, key: &str) -> u64 {
    let first = tokio::spawn(send(server.post_key("/held", key, ORDER)));
    server.state.wait_entered(1).await;
    let retry_after = send(server.post_key("/held", key, ORDER))
        .await
        .assert_in_flight();
    server.state.release();
    first.await.unwrap().assert_executed(StatusCode::CREATED, 1);
    retry_after
}

/// The 409's `Retry-After` never goes beyond the time left on the default 30 s lease (here a
/// fixed `Retry-After` of an hour is capped by it).
pub async fn retry_after_reflects_default_lease(store: impl Store) {
    let server = serve(Idempotency::new(store).with_retry_after(
        tower_idempotency::RetryAfter::Fixed(Duration::from_secs(3600)),
    ))
    .await;
    let retry_after = retry_after_while_held(&server, "retry-default").await;
    assert!(
        (25..=30).contains(&retry_after),
        "Retry-After {retry_after} is not the time left on a fresh 30 s lease"
    );
}

/// The 409's `Retry-After` never goes beyond the time left on a configured lease (5 s).
pub async fn retry_after_reflects_configured_lease(store: impl Store) {
    let server = serve(
        Idempotency::new(store)
            .with_lease(Duration::from_secs(5))
            .with_retry_after(tower_idempotency::RetryAfter::Fixed(Duration::from_secs(
                3600,
            ))),
    )
    .await;
    let retry_after = retry_after_while_held(&server, "retry-5s").await;
    assert!(
        (3..=5).contains(&retry_after),
        "Retry-After {retry_after} is not the time left on a fresh 5 s lease"
    );
}

// ------------------------------------------------------------------------------------------------
// Client disconnect
// ------------------------------------------------------------------------------------------------

/// A client that disconnects mid-handler does not stop the handler; its answer is saved and the
/// retry replays it (no second execution).
pub async fn client_disconnect_still_records_the_answer(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    // its own client, so the aborted connection is not reused
    let request = client()
        .post(server.url("/held"))
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", "gone-1")
        .body(ORDER);
    let attempt = tokio::spawn(send(request));
    server.state.wait_entered(1).await;
    attempt.abort();
    let _ = attempt.await;
    // the server noticed the client left and dropped the request future
    server.state.wait_dropped(1).await;
    server.state.release();
    server.state.wait_finished(1).await;
    // the record is saved right after the handler finishes: poll (bounded) until not in flight
    let mut reply = send(server.post_key("/held", "gone-1", ORDER)).await;
    for _ in 0..100 {
        if reply.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        reply = send(server.post_key("/held", "gone-1", ORDER)).await;
    }
    assert_eq!(reply.status, StatusCode::CREATED, "body: {:?}", reply.body);
    assert!(reply.replayed(), "the retry ran the handler again");
    assert_eq!(reply.execution(), 1);
    assert_eq!(server.state.executions(), 1);
}

// ------------------------------------------------------------------------------------------------
// Replayed headers
// ------------------------------------------------------------------------------------------------

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a [u8]> {
    headers.get_all(name).iter().map(|v| v.as_bytes()).collect()
}

/// The replay carries `Content-Type`, `Location` and every `Link` value in order; not
/// `Set-Cookie`, the handler's `Date`, or a hop-by-hop header named in `Connection`.
pub async fn replay_keeps_resource_headers_only(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let first = send(server.order("headers-1")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    // the original carries everything the handler set
    assert_eq!(values(&first.headers, "location"), [b"/orders/1"]);
    assert_eq!(
        values(&first.headers, "link"),
        [
            &b"</orders>; rel=\"collection\""[..],
            &b"</customers/c_1>; rel=\"customer\""[..]
        ]
    );
    assert_eq!(
        values(&first.headers, "set-cookie"),
        [b"session=s3cr3t; HttpOnly"]
    );
    assert_eq!(values(&first.headers, "date"), [HANDLER_DATE.as_bytes()]);
    assert_eq!(values(&first.headers, "x-hop"), [b"1"]);

    let replay = send(server.order("headers-1")).await;
    replay.assert_replay_of(&first);
    assert_eq!(
        values(&replay.headers, "content-type"),
        [b"application/json"]
    );
    assert_eq!(values(&replay.headers, "location"), [b"/orders/1"]);
    assert_eq!(
        values(&replay.headers, "link"),
        values(&first.headers, "link")
    );
    assert!(
        replay.headers.get("set-cookie").is_none(),
        "Set-Cookie replayed"
    );
    assert!(replay.headers.get("x-hop").is_none(), "hop-by-hop replayed");
    assert!(
        values(&replay.headers, "date")
            .iter()
            .all(|d| *d != HANDLER_DATE.as_bytes()),
        "the handler's Date was replayed"
    );
    assert!(
        values(&replay.headers, "connection")
            .iter()
            .all(|c| !String::from_utf8_lossy(c).contains("x-hop")),
        "Connection replayed"
    );
    assert_eq!(server.state.executions(), 1);
}

// ------------------------------------------------------------------------------------------------
// Wait mode
// ------------------------------------------------------------------------------------------------

/// Wait mode: 20 concurrent attempts on a ~300 ms handler: one execution, 19 replays of it.
pub async fn wait_mode_replays_to_concurrent_attempts(store: impl Store) {
    let server = serve(Idempotency::new(store).wait_for_in_flight(Duration::from_secs(5))).await;
    let replies = concurrently(20, |_| server.post_key("/slow", "wait-1", ORDER)).await;
    assert_eq!(server.state.executions(), 1);
    let originals: Vec<&Reply> = replies.iter().filter(|r| !r.replayed()).collect();
    assert_eq!(
        originals.len(),
        1,
        "not exactly one original: {originals:?}"
    );
    let original = originals[0];
    original.assert_executed(StatusCode::CREATED, 1);
    let replays = replies
        .iter()
        .filter(|r| r.replayed())
        .inspect(|r| r.assert_replay_of(original))
        .count();
    assert_eq!(replays, 19);
}

/// Wait mode with a short bound: a duplicate of a held attempt waits, then gets 409.
pub async fn wait_mode_bound_falls_back_to_409(store: impl Store) {
    const BOUND: Duration = Duration::from_millis(100);
    let server = serve(Idempotency::new(store).wait_for_in_flight(BOUND)).await;
    let first = tokio::spawn(send(server.post_key("/held", "wait-2", ORDER)));
    server.state.wait_entered(1).await;
    let started = Instant::now();
    let duplicate = send(server.post_key("/held", "wait-2", ORDER)).await;
    let waited = started.elapsed();
    duplicate.assert_in_flight();
    assert!(
        waited >= BOUND,
        "answered 409 after {waited:?}, before the bound"
    );
    server.state.release();
    let first = first.await.unwrap();
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.post_key("/held", "wait-2", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(server.state.executions(), 1);
}

// ------------------------------------------------------------------------------------------------
// Store down (store-specific: instantiated by hand, not by the macro)
// ------------------------------------------------------------------------------------------------

/// With an unreachable store (fail closed, the default): 503 with `Retry-After`, handler not
/// called.
pub async fn store_down_fails_closed(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let reply = send(server.order("down-1")).await;
    reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(reply.retry_after() >= 1);
    assert_eq!(server.state.executions(), 0);
}

/// With an unreachable store and `.fail_open()`: the handler is called (without idempotency).
pub async fn store_down_fail_open_calls_the_handler(store: impl Store) {
    let server = serve(Idempotency::new(store).fail_open()).await;
    send(server.order("down-2"))
        .await
        .assert_executed(StatusCode::CREATED, 1);
    send(server.order("down-2"))
        .await
        .assert_executed(StatusCode::CREATED, 2);
}

/// A TCP proxy on `127.0.0.1:0` to `target`, to take a store "down" under a live client.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Start proxying to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = {
            let tasks = tasks.clone();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    tasks.lock().unwrap().push(task);
                }
            })
        };
        Self {
            addr,
            tasks,
            accept,
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Close the listening port and every proxied connection.
    pub async fn shutdown(self) {
        self.accept.abort();
        let _ = self.accept.await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap());
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
    }
}

/// Run `f` with a bound; panics with `what` when it does not finish in `limit`.
pub async fn bounded<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

// ------------------------------------------------------------------------------------------------
// Transactional mode (PostgreSQL and SQLite: instantiated by hand, not by the macro)
// ------------------------------------------------------------------------------------------------

/// A `widgets` table the transactional handlers write to, for each SQL database.
pub trait Widgets: sqlx::Database {
    /// Create the table.
    fn create_table(pool: &sqlx::Pool<Self>) -> impl Future<Output = ()> + Send;
    /// Insert one row in the handler's idempotency transaction.
    fn insert(
        tx: &IdempotencyTransaction<Self>,
        note: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// How many rows the table holds (committed ones).
    fn count(pool: &sqlx::Pool<Self>) -> impl Future<Output = i64> + Send;
    /// Simulate a takeover of every running record behind the holder's back: a new token and a
    /// lapsed lease, as if another attempt had claimed it (the library's documented schema).
    fn steal_running(pool: &sqlx::Pool<Self>) -> impl Future<Output = ()> + Send;
}

const CREATE_WIDGETS: &str = "CREATE TABLE widgets (note TEXT NOT NULL)";

impl Widgets for sqlx::Postgres {
    async fn create_table(pool: &sqlx::PgPool) {
        sqlx::query(CREATE_WIDGETS).execute(pool).await.unwrap();
    }

    async fn insert(tx: &IdempotencyTransaction<Self>, note: &str) -> Result<(), sqlx::Error> {
        let mut tx = tx.begin().await?;
        sqlx::query("INSERT INTO widgets (note) VALUES ($1)")
            .bind(note)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn count(pool: &sqlx::PgPool) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM widgets")
            .fetch_one(pool)
            .await
            .unwrap()
    }

    async fn steal_running(pool: &sqlx::PgPool) {
        let stolen = sqlx::query(
            "UPDATE idempotency_records SET token = gen_random_uuid(), \
             lease_until = now() - interval '1 second' WHERE state = 'running'",
        )
        .execute(pool)
        .await
        .unwrap();
        assert_eq!(stolen.rows_affected(), 1);
    }
}

impl Widgets for sqlx::Sqlite {
    async fn create_table(pool: &sqlx::SqlitePool) {
        sqlx::query(CREATE_WIDGETS).execute(pool).await.unwrap();
    }

    async fn insert(tx: &IdempotencyTransaction<Self>, note: &str) -> Result<(), sqlx::Error> {
        let mut tx = tx.begin().await?;
        sqlx::query("INSERT INTO widgets (note) VALUES (?)")
            .bind(note)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn count(pool: &sqlx::SqlitePool) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM widgets")
            .fetch_one(pool)
            .await
            .unwrap()
    }

    async fn steal_running(pool: &sqlx::SqlitePool) {
        let stolen = sqlx::query(
            "UPDATE idempotency_records SET token = randomblob(16), lease_until = 0 \
             WHERE state = 'running'",
        )
        .execute(pool)
        .await
        .unwrap();
        assert_eq!(stolen.rows_affected(), 1);
    }
}

/// `POST /tx/flaky`: writes a row in the transaction; answers 503 on its first execution and 201
/// after. `POST /tx/write`: writes a row, 201. `POST /tx/none`: never begins the transaction, 201.
/// `POST /tx/panic`: writes a row, then panics on its first execution; 201 after.
/// `POST /tx/stolen`: on its first execution, its record is taken over behind its back before
/// it writes its row; 201.
fn tx_routes<DB: Widgets>(state: AppRef, pool: sqlx::Pool<DB>) -> Router {
    async fn write<DB: Widgets>(
        State((state, pool)): State<(AppRef, sqlx::Pool<DB>)>,
        tx: IdempotencyTransaction<DB>,
        Path(what): Path<String>,
        key: IdempotencyKey,
        body: Bytes,
    ) -> Response {
        let n = state.execute(Some(&key));
        if what == "none" {
            return answer(StatusCode::CREATED, n, &body);
        }
        if what == "stolen" && n == 1 {
            DB::steal_running(&pool).await;
        }
        if let Err(err) = DB::insert(&tx, key.as_str()).await {
            return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
        }
        if what == "panic" && n == 1 {
            panic!("POST /tx/panic panics after its write (on purpose)");
        }
        let status = if what == "flaky" && n == 1 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::CREATED
        };
        answer(status, n, &body)
    }
    Router::new()
        .route("/tx/{what}", post(write::<DB>))
        .with_state((state, pool))
}

async fn serve_transactional<St>(store: St) -> (TestServer, sqlx::Pool<St::Database>)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let pool = store.pool().clone();
    <St::Database as Widgets>::create_table(&pool).await;
    let state = AppRef::default();
    let router = tx_routes::<St::Database>(state.clone(), pool.clone())
        .layer(Idempotency::new(store).transactional());
    (serve_router(router, state).await, pool)
}

/// Transactional mode: the handler's row and the saved answer commit together; the retry
/// replays and there is one row.
pub async fn transactional_commit_saves_row_and_answer<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let first = send(server.post_key("/tx/write", "tx-1", ORDER)).await;
    first.assert_executed(StatusCode::CREATED, 1);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/write", "tx-1", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    assert_eq!(server.state.executions(), 1);
}

/// Transactional mode: a 503 rolls the handler's row back and releases the key; the retry runs
/// again, commits its row, and is replayed after.
pub async fn transactional_503_rolls_back_and_releases<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    send(server.post_key("/tx/flaky", "tx-2", ORDER))
        .await
        .assert_executed(StatusCode::SERVICE_UNAVAILABLE, 1);
    assert_eq!(
        <St::Database as Widgets>::count(&pool).await,
        0,
        "the 503's row was committed"
    );
    let second = send(server.post_key("/tx/flaky", "tx-2", ORDER)).await;
    second.assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/flaky", "tx-2", ORDER))
        .await
        .assert_replay_of(&second);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    assert_eq!(server.state.executions(), 2);
}

/// Transactional mode: a handler that never begins the transaction still has its answer saved.
pub async fn transactional_without_begin_is_saved<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let first = send(server.post_key("/tx/none", "tx-3", ORDER)).await;
    first.assert_executed(StatusCode::CREATED, 1);
    send(server.post_key("/tx/none", "tx-3", ORDER))
        .await
        .assert_replay_of(&first);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 0);
    assert_eq!(server.state.executions(), 1);
}

/// Transactional mode: a holder whose record was taken over while it ran cannot commit: its row
/// is rolled back and its client gets 409 with `Retry-After`; the retry does the work once.
pub async fn transactional_lease_lost_rolls_back_with_409<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let lost = send(server.post_key("/tx/stolen", "tx-4", ORDER)).await;
    lost.assert_in_flight();
    assert_eq!(server.state.executions(), 1);
    assert_eq!(
        <St::Database as Widgets>::count(&pool).await,
        0,
        "the fenced-out holder committed its row"
    );
    // the lease of the (simulated) new holder has lapsed: the retry takes over and commits once
    let retry = send(server.post_key("/tx/stolen", "tx-4", ORDER)).await;
    retry.assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/stolen", "tx-4", ORDER))
        .await
        .assert_replay_of(&retry);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    assert_eq!(server.state.executions(), 2);
}

/// Transactional mode: a handler that panics after its write has the write rolled back and the
/// key released; the retry does the work once.
pub async fn transactional_panic_rolls_back_and_releases<St>(store: St)
where
    St: TransactionalStore,
    St::Database: Widgets,
{
    let (server, pool) = serve_transactional(store).await;
    let failed = try_send(server.post_key("/tx/panic", "tx-5", ORDER)).await;
    assert!(
        failed.is_err(),
        "the panicking attempt answered: {failed:?}"
    );
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 0);
    let retry = send(server.post_key("/tx/panic", "tx-5", ORDER)).await;
    retry.assert_executed(StatusCode::CREATED, 2);
    assert_eq!(<St::Database as Widgets>::count(&pool).await, 1);
    send(server.post_key("/tx/panic", "tx-5", ORDER))
        .await
        .assert_replay_of(&retry);
    assert_eq!(server.state.executions(), 2);
}
