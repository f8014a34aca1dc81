//! The behaviour suite: one test body per behaviour the crate docs and `crates/tower-idempotency/docs/guarantees.md` promise, written once and run against
//! every store by `tests/tests/behaviour.rs` (tower-sessions-stores' `route_tests!` idea), and
//! in every mode: each body builds its layer through a [`Flavour`] (default, transactional,
//! single-commit) and asks the mode's [`Contract`](flavour::Contract) where modes differ.
//!
//! The bodies live in one module per concern; this module holds the test app, its server and
//! client, and the list of behaviours, [`behaviour_tests!`](crate::behaviour_tests), which every
//! store expands in full. `every_behaviour_is_listed` (this crate's unit tests) fails when a
//! `pub async fn` of a concern module is in no list.
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

use crate::records::{new_claim, stored_response};
use flavour::Flavour;
use tower_idempotency::{
    fingerprint::{DefaultFingerprint, FingerprintFn},
    store::{ClaimOutcome, Fenced, Store, TransactionalStore},
    Idempotency, IdempotencyKey, IdempotencyTransaction, Mode, Scope, DEFAULT_LEASE, DEFAULT_TTL,
    REPLAYED_HEADER,
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

pub mod body;
pub mod concurrency;
pub mod disconnect;
pub mod expiry;
pub mod fingerprint;
pub mod flavour;
pub mod headers;
pub mod key;
pub mod leases;
pub mod saving;
pub mod scope;
pub mod wait;

/// Instantiate every behaviour in the calling module, one `#[tokio::test]` each, against a fresh
/// store made by `$store` (an expression, evaluated inside the test), with the layer in the
/// default mode, or in the mode named after the store:
///
/// ```ignore
/// behaviour_tests!(stores::memory_store().await); // the default mode
/// behaviour_tests!(stores::sqlite_store().await, transactional);
/// behaviour_tests!(stores::postgres_store().await, single_commit);
/// ```
///
/// Every mode runs the whole list; where a mode's contract differs, the body asks the mode's
/// [`Contract`](crate::suite::flavour::Contract). The list is every behaviour of the concern
/// modules; `every_behaviour_is_listed` checks it against their `pub async fn`s.
#[macro_export]
macro_rules! behaviour_tests {
    ($store:expr) => {
        $crate::behaviour_tests!($store, standard);
    };
    ($store:expr, standard) => {
        $crate::behaviour_tests!(@list [tests $store, Standard]);
    };
    ($store:expr, transactional) => {
        $crate::behaviour_tests!(@list [tests $store, Transactional]);
    };
    ($store:expr, single_commit) => {
        $crate::behaviour_tests!(@list [tests $store, SingleCommit]);
    };
    (@names) => {
        $crate::behaviour_tests!(@list [names])
    };
    (@list $mode:tt) => {
        $crate::behaviour_tests! {@expand $mode;
            concurrency::five_concurrent_attempts_execute_once,
            concurrency::fifty_concurrent_attempts_execute_once,
            concurrency::two_instances_execute_each_key_once,
            key::missing_key_is_400_problem,
            key::empty_key_is_400,
            key::key_over_255_bytes_is_400,
            key::key_with_control_char_is_400,
            key::two_key_headers_are_400,
            key::quoted_and_bare_key_are_the_same_key,
            key::key_is_checked_before_the_body,
            key::get_passes_through_without_key,
            key::optional_layer_passes_keyless_requests_through,
            key::patch_is_covered_put_is_not,
            body::body_over_limit_is_413_and_claims_nothing,
            body::chunked_body_over_limit_is_413_and_claims_nothing,
            fingerprint::same_key_other_body_is_422,
            fingerprint::same_key_other_path_is_422,
            fingerprint::mismatch_while_running_is_422,
            fingerprint::reordered_json_is_replayed,
            saving::handler_500_is_saved_and_replayed,
            saving::handler_429_releases_the_key,
            saving::handler_503_releases_the_key,
            saving::handler_408_and_425_release_the_key,
            saving::inner_error_releases_the_key,
            saving::panicking_handler_releases_the_key,
            saving::custom_save_policy_decides_what_is_saved,
            scope::other_authorization_is_an_independent_key,
            scope::empty_authorization_scopes_like_absent,
            expiry::expired_record_is_claimed_afresh,
            expiry::takeover_keeps_the_original_expiry,
            leases::lapsed_lease_is_taken_over_and_stale_holder_fenced,
            leases::slow_handler_is_not_taken_over_while_alive,
            leases::slow_handler_is_not_taken_over_past_the_retention,
            leases::retry_after_reflects_default_lease,
            leases::retry_after_reflects_configured_lease,
            disconnect::client_disconnect_still_records_the_answer,
            headers::replay_keeps_resource_headers_only,
            wait::wait_mode_replays_to_concurrent_attempts,
            wait::wait_mode_bound_falls_back_to_409,
        }
    };
    (@expand [names]; $($module:ident :: $name:ident),+ $(,)?) => {
        &[$(stringify!($name)),+]
    };
    (@expand [tests $store:expr, $flavour:ident]; $($module:ident :: $name:ident),+ $(,)?) => {
        $crate::bounded_tests!($store; $(
            $name => $crate::suite::$module::$name::<_, $crate::suite::flavour::$flavour>
        ),+);
    };
}

/// The behaviours [`behaviour_tests!`](crate::behaviour_tests) instantiates, by name.
pub const BEHAVIOURS: &[&str] = crate::behaviour_tests!(@names);

/// The bounds of every test here, shared with the store contract.
pub use crate::contract::{within, TEST_TIMEOUT};
pub mod store_down;
pub mod transactional;

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
    let (addr, task) = tower_idempotency_testkit::serve(app).await;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::contract::tests::public_async_fns;

    #[test]
    fn every_behaviour_is_listed() {
        let defined = public_async_fns("src/suite", &["mod.rs"]);
        let listed: BTreeSet<String> = [
            super::BEHAVIOURS,
            super::transactional::TRANSACTIONAL,
            super::transactional::TRANSACTIONAL_DEFERRED,
            super::transactional::TRANSACTIONAL_CLAIMS_FAIL,
            super::store_down::STORE_DOWN,
        ]
        .concat()
        .iter()
        .map(|n| n.to_string())
        .collect();
        assert_eq!(
            defined, listed,
            "every behaviour in src/suite/ must be in behaviour_tests!, transactional_tests! or \
             store_down_tests!"
        );
        assert!(defined.len() >= 40, "the scan found the suite: {defined:?}");
    }

    /// The behaviours of `behaviour_tests!` build their layer through their flavour, so each
    /// runs in the mode its instantiation names: a body that built `Idempotency::new(store)`
    /// would test the default mode under a single-commit name.
    #[test]
    fn every_behaviour_runs_in_its_flavours_mode() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/suite");
        let behaviours: BTreeSet<&str> = super::BEHAVIOURS.iter().copied().collect();
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            // mod.rs and flavour.rs hold no behaviour; transactional.rs and store_down.rs are
            // store-specific, with lists of their own
            if ["mod.rs", "flavour.rs", "transactional.rs", "store_down.rs"]
                .contains(&file.as_str())
            {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            for banned in ["Idempotency::new(", "Idempotency::from_shared("] {
                assert!(
                    !source.contains(banned),
                    "{file} builds a layer with {banned}..) instead of its flavour's F::layer"
                );
            }
            for line in source.lines() {
                let Some(rest) = line.strip_prefix("pub async fn ") else {
                    continue;
                };
                let name = &rest[..rest.find(['<', '(']).unwrap()];
                assert!(behaviours.contains(name), "{file}: {name} is not listed");
                assert!(
                    rest[name.len()..].starts_with("<St: Store, F: Flavour<St>>("),
                    "{file}: {name} is not generic over the flavour"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, super::BEHAVIOURS.len());
    }
}
