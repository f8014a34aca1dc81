//! The [`Idempotency`] layer and its configuration.

use std::{fmt, marker::PhantomData, sync::Arc, time::Duration};

use http::{HeaderName, Method};
use tower_layer::Layer;

use crate::{
    config::Config,
    error::RejectionResponse,
    fingerprint::{DefaultFingerprint, FingerprintFn},
    key::ScopeFn,
    mode::{Mode, Standard},
    record::SavePolicy,
    retry_after::RetryAfter,
    service::IdempotencyService,
    store::{record::LONGEST, Store},
    sweeper::Sweeper,
};

/// A [`tower::Layer`](tower_layer::Layer) that makes POST and PATCH requests idempotent through
/// the `Idempotency-Key` header.
///
/// `St` is the [`Store`] the records live in; `M` is the mode: [`Standard`], or
/// [`Transactional`](crate::Transactional) after [`transactional`](Idempotency::transactional).
///
/// ```
/// use axum::{routing::post, Router};
/// use tower_idempotency::Idempotency;
///
/// async fn create_order() -> &'static str { "created" }
///
/// let app: Router = Router::new()
///     .route("/orders", post(create_order))
///     .route_layer(Idempotency::memory());
/// ```
///
/// # Defaults
///
/// | setting | default | setter |
/// |---|---|---|
/// | header | `Idempotency-Key` | [`with_header_name`](Self::with_header_name) |
/// | key required | yes (400 when missing) | [`optional`](Self::optional) |
/// | methods | POST, PATCH | [`with_methods`](Self::with_methods) |
/// | body limit | 1 MiB (413 over it) | [`with_body_limit`](Self::with_body_limit) |
/// | body read time | 30 s (408 over it) | [`with_body_timeout`](Self::with_body_timeout) |
/// | saved response body | 1 MiB (larger: streamed, saved without its body) | [`with_saved_body_limit`](Self::with_saved_body_limit) |
/// | retention | 24 h | [`with_ttl`](Self::with_ttl) |
/// | lease | 30 s, renewed every 10 s | [`with_lease`](Self::with_lease) |
/// | scope | hash of `Authorization` | [`with_scope`](Self::with_scope) |
/// | fingerprint | method, path+query, canonical body | [`with_fingerprint`](Self::with_fingerprint), [`with_fingerprint_headers`](Self::with_fingerprint_headers) |
/// | saved responses | all but 408, 425, 429, 503 | [`with_save_policy`](Self::with_save_policy) |
/// | duplicate while in flight | 409 + `Retry-After` | [`wait_for_in_flight`](Self::wait_for_in_flight) |
/// | `Retry-After` of that 409 | estimated from recent handler durations, 1 s to the lease left | [`with_retry_after`](Self::with_retry_after) |
/// | store down | 503 + `Retry-After` | [`fail_open`](Self::fail_open) |
/// | store call timeout | 5 s (then: store down) | [`with_store_timeout`](Self::with_store_timeout) |
/// | anonymous callers | share one key space | [`require_scope`](Self::require_scope) |
/// | problem `type` URIs | this crate's docs ([`DEFAULT_PROBLEM_TYPE_BASE`](crate::error::DEFAULT_PROBLEM_TYPE_BASE)) | [`with_problem_type_base`](Self::with_problem_type_base) |
/// | refusal responses | `application/problem+json` | [`with_rejection_response`](Self::with_rejection_response) |
/// | replay marker | `Idempotent-Replayed: true` | [`with_replay_header`](Self::with_replay_header) |
pub struct Idempotency<St, M = Standard> {
    pub(crate) store: Arc<St>,
    pub(crate) config: Arc<Config>,
    mode: PhantomData<fn() -> M>,
}

/// The layer under its tower-http style name ([`Idempotency`] is the same type): for code that
/// names layers `XxxLayer` (`TimeoutLayer`, `CompressionLayer`).
///
/// ```
/// use tower_idempotency::{store::MemoryStore, IdempotencyLayer};
///
/// let layer: IdempotencyLayer<MemoryStore> = IdempotencyLayer::new(MemoryStore::new());
/// # let _ = layer;
/// ```
pub type IdempotencyLayer<St, M = Standard> = Idempotency<St, M>;

impl<St: Store> Idempotency<St> {
    /// A layer over `store` with the defaults listed above.
    pub fn new(store: St) -> Self {
        Self::from_shared(Arc::new(store))
    }

    /// A layer over a store shared with other code (for example a [`Sweeper`]).
    pub fn from_shared(store: Arc<St>) -> Self {
        Self {
            store,
            config: Arc::new(Config::default()),
            mode: PhantomData,
        }
    }
}

impl<St: Store, M> Idempotency<St, M> {
    fn map_config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<St> {
        &self.store
    }

    /// Read the key from `header` instead of `Idempotency-Key`.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_header_name(http::HeaderName::from_static("x-request-key"));
    /// # let _ = layer;
    /// ```
    pub fn with_header_name(self, header: HeaderName) -> Self {
        self.map_config(|c| c.header = header)
    }

    /// Let requests without a key through untouched (by default they get 400).
    ///
    /// An invalid key is still refused with 400.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory().optional();
    /// # let _ = layer;
    /// ```
    pub fn optional(self) -> Self {
        self.map_config(|c| c.required = false)
    }

    /// Cover these methods instead of POST and PATCH. Other methods pass through untouched.
    ///
    /// ```
    /// use http::Method;
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_methods([Method::POST, Method::PUT, Method::PATCH, Method::DELETE]);
    /// # let _ = layer;
    /// ```
    pub fn with_methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.map_config(|c| c.methods = methods)
    }

    /// Buffer request bodies up to `limit` bytes (default 1 MiB). A larger body gets 413 and
    /// nothing is claimed.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory().with_body_limit(64 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn with_body_limit(self, limit: usize) -> Self {
        self.map_config(|c| c.body_limit = limit)
    }

    /// Save response bodies up to `limit` bytes (default
    /// [`DEFAULT_SAVED_BODY_LIMIT`](crate::DEFAULT_SAVED_BODY_LIMIT), 1 MiB); the layer never
    /// holds more of a response than that and one frame.
    ///
    /// An answer whose body is larger (a big download), and any stream of server-sent events
    /// (`Content-Type: text/event-stream`, whose client waits for each event as it comes), is
    /// streamed to its client as the handler produces it, and saved without its body: a retry
    /// with the same key gets the first answer's status and headers (its `Location`, say),
    /// minus the headers that describe the body (`Content-Length`, `Content-Type`,
    /// `Content-Encoding`, `Content-Range`, `ETag`, `Last-Modified`, `Accept-Ranges`), an empty
    /// body, `Idempotent-Body-Not-Kept: true` and the replay header. The request is not run
    /// again. A body that announces its size (`Content-Length`) over the limit is not read
    /// before it is streamed. The save policy sees such an answer without trailers.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory().with_saved_body_limit(256 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn with_saved_body_limit(self, limit: usize) -> Self {
        self.map_config(|c| c.saved_body_limit = limit)
    }

    /// Give up reading a request body after `timeout` (default 30 s) and answer 408 Request
    /// Timeout; nothing is claimed, so the client can send the request again with the same key.
    ///
    /// This bounds what a client that sends its body slowly (or stops half-way) can hold: the
    /// buffer and the task. Servers should also bound the time to read the request head (see
    /// hyper's `header_read_timeout`). A zero `timeout` is raised to 1 ms.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = tower_idempotency::Idempotency::memory().with_body_timeout(Duration::from_secs(10));
    /// # let _ = layer;
    /// ```
    pub fn with_body_timeout(self, timeout: Duration) -> Self {
        self.map_config(|c| c.body_timeout = timeout.clamp(Duration::from_millis(1), LONGEST))
    }

    /// Keep records for `ttl` after their claim (default 24 h). A key can be reused for a
    /// different request only after this. A zero `ttl` is raised to 1 ms, and one over 100 years cut to that.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = tower_idempotency::Idempotency::memory().with_ttl(Duration::from_secs(3600));
    /// # let _ = layer;
    /// ```
    pub fn with_ttl(self, ttl: Duration) -> Self {
        self.map_config(|c| c.ttl = ttl.clamp(Duration::from_millis(1), LONGEST))
    }

    /// How long a claim stays valid without a heartbeat (default 30 s). The layer renews it every
    /// `lease / 3` while the handler runs, so a slow handler is never taken over while it lives;
    /// if its process dies, a retry can take the key over once the lease lapses. A lease under
    /// 3 ms is raised to 3 ms (a third of it is the heartbeat period), and one over 100 years cut
    /// to that.
    ///
    /// # Warning
    ///
    /// A lease shorter than a few round trips to the store risks a takeover of a live handler
    /// whenever the store is slow: the work then runs twice (transactional mode rolls the loser
    /// back). Keep it at seconds, not milliseconds, in production.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = tower_idempotency::Idempotency::memory().with_lease(Duration::from_secs(10));
    /// # let _ = layer;
    /// ```
    pub fn with_lease(self, lease: Duration) -> Self {
        self.map_config(|c| c.lease = lease.clamp(Duration::from_millis(3), LONGEST))
    }

    /// Choose the scope keys are namespaced by (default: a hash of `Authorization`).
    ///
    /// # Warning
    ///
    /// A scope that does not identify the caller lets one caller replay another's response by
    /// guessing its key.
    ///
    /// ```
    /// use tower_idempotency::Scope;
    /// let layer = tower_idempotency::Idempotency::memory().with_scope(|parts: &http::request::Parts| {
    ///     Scope::new(parts.headers.get("x-tenant-id").map(|v| v.as_bytes()).unwrap_or_default())
    /// });
    /// # let _ = layer;
    /// ```
    pub fn with_scope(self, scope: impl ScopeFn) -> Self {
        let scope = Arc::new(scope);
        self.map_config(|c| c.scope = scope)
    }

    /// Replace the fingerprint function (see [`FingerprintFn`]).
    pub fn with_fingerprint(self, fingerprint: impl FingerprintFn) -> Self {
        let fingerprint = Arc::new(fingerprint);
        self.map_config(|c| c.fingerprint = fingerprint)
    }

    /// Use the default fingerprint, and also hash the values of these request headers.
    ///
    /// ```
    /// use http::HeaderName;
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_fingerprint_headers([HeaderName::from_static("x-account-id")]);
    /// # let _ = layer;
    /// ```
    pub fn with_fingerprint_headers(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.with_fingerprint(DefaultFingerprint::with_headers(
            headers.into_iter().collect(),
        ))
    }

    /// Decide which handler statuses are saved and replayed. A status that is not saved
    /// releases the key, so the retry runs the handler again.
    ///
    /// The default saves every status but 408, 425, 429 and 503 (see [`DefaultSavePolicy`](crate::DefaultSavePolicy)).
    ///
    /// ```
    /// use http::StatusCode;
    /// // also let clients retry after a 500
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_save_policy(|status: StatusCode| !status.is_server_error() && status != StatusCode::TOO_MANY_REQUESTS);
    /// # let _ = layer;
    /// ```
    pub fn with_save_policy(self, policy: impl SavePolicy) -> Self {
        let policy = Arc::new(policy);
        self.map_config(|c| c.save = policy)
    }

    /// Make a duplicate that arrives while the first attempt runs wait up to `max` for it and
    /// replay its answer, instead of getting 409 at once. After `max` (at most 100 years), it gets
    /// 409 with `Retry-After`.
    ///
    /// Stores with notifications (memory, PostgreSQL, Redis) wake the waiter when the first
    /// attempt completes; otherwise it polls every [`WAIT_POLL_INTERVAL`](crate::WAIT_POLL_INTERVAL).
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = tower_idempotency::Idempotency::memory().wait_for_in_flight(Duration::from_secs(5));
    /// # let _ = layer;
    /// ```
    pub fn wait_for_in_flight(self, max: Duration) -> Self {
        self.map_config(|c| c.wait = Some(max.min(LONGEST)))
    }

    /// Choose the `Retry-After` of the 409 a duplicate gets while the first attempt runs
    /// (default [`RetryAfter::Estimate`]: when the running attempt should finish, judged from
    /// recent handler durations on the same path). Always at least 1 s, never beyond the lease
    /// left.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::RetryAfter;
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_retry_after(RetryAfter::Fixed(Duration::from_secs(2)));
    /// # let _ = layer;
    /// ```
    pub fn with_retry_after(self, retry_after: RetryAfter) -> Self {
        self.map_config(|c| c.retry_after = retry_after)
    }

    /// When the store cannot be reached, call the handler anyway (logging a warning) instead of
    /// answering 503. The handler still gets the request's key (the
    /// [`IdempotencyKey`](crate::IdempotencyKey) extractor works), so it can pass the key on to
    /// a downstream API that deduplicates by it.
    ///
    /// # Warning
    ///
    /// While the store is down, retries are not deduplicated: a retry of a request that was
    /// processed runs again. Enable this only for handlers where a duplicate is cheaper than an
    /// outage.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory().fail_open();
    /// # let _ = layer;
    /// ```
    pub fn fail_open(self) -> Self {
        self.map_config(|c| c.fail_open = true)
    }

    /// Give up on any one store call after `timeout` (default [`DEFAULT_STORE_TIMEOUT`](crate::DEFAULT_STORE_TIMEOUT), 5 s) and
    /// treat the store as unavailable, instead of letting requests hang on a store that stopped
    /// answering (a black-holed network, a database stuck on a lock, a saturated pool).
    ///
    /// Each claim (every claim of [wait mode](Self::wait_for_in_flight) too), renewal, save,
    /// release, and in transactional mode the save-and-commit, is bounded on its own:
    ///
    /// - a claim that times out answers `503` with `Retry-After` (fail closed; or calls the
    ///   handler with [`fail_open`](Self::fail_open)); the handler is not called. The layer then
    ///   releases the key in the background in case the claim did land, so a retry need not wait
    ///   for the lease;
    /// - a renewal that times out is tried again at the next heartbeat;
    /// - a save that times out is tried again, like any failed save; in transactional mode the
    ///   transaction is dropped (rolled back) unless its commit already landed, the key is
    ///   released, and the client gets `503`: the retry finds either the saved answer or a free
    ///   key, never half of the work.
    ///
    /// A timed-out SQL call gives its pooled connection back (sqlx tests it on release), so
    /// repeated timeouts do not drain the pool. Keep the timeout well under the lease, and above
    /// the store's normal worst case. A zero `timeout` is raised to 1 ms.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_store_timeout(Duration::from_millis(500));
    /// # let _ = layer;
    /// ```
    pub fn with_store_timeout(self, timeout: Duration) -> Self {
        self.map_config(|c| c.store_timeout = timeout.clamp(Duration::from_millis(1), LONGEST))
    }

    /// Start a background task that deletes expired records every `every`, in batches of
    /// [`DEFAULT_SWEEP_BATCH`](crate::sweeper::DEFAULT_SWEEP_BATCH). The task stops when the
    /// returned [`Sweeper`] is dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let layer = tower_idempotency::Idempotency::memory();
    /// let sweeper = layer.sweep_every(Duration::from_secs(60));
    /// # drop(sweeper);
    /// # }
    /// ```
    pub fn sweep_every(&self, every: Duration) -> Sweeper {
        Sweeper::spawn(
            self.store.clone(),
            every,
            crate::sweeper::DEFAULT_SWEEP_BATCH,
        )
    }

    /// Refuse requests that carry no caller identity (the scope is
    /// [anonymous](crate::Scope::is_anonymous): by default, no `Authorization` header) with a
    /// 400 [`MissingScope`](crate::Rejection::MissingScope), before their body is read.
    ///
    /// Without it, every anonymous caller shares one key space: one can replay another's answer
    /// by sending the same key. Use it where every caller should be identified; choose how with
    /// [`with_scope`](Self::with_scope): a scope that returns `Scope::new("")` for an
    /// unidentified request is refused too.
    ///
    /// ```
    /// use tower_idempotency::{Idempotency, Scope};
    ///
    /// // Scoped by API key header; requests without one get 400.
    /// let layer = Idempotency::memory()
    ///     .with_scope(|parts: &http::request::Parts| {
    ///         Scope::new(parts.headers.get("x-api-key").map(|v| v.as_bytes()).unwrap_or_default())
    ///     })
    ///     .require_scope();
    /// # let _ = layer;
    /// ```
    pub fn require_scope(self) -> Self {
        self.map_config(|c| c.require_scope = true)
    }

    /// Name the problem `type` URIs of refusals `{base}{name}` (see
    /// [`Rejection::name`](crate::Rejection::name)) instead of links into this crate's
    /// documentation, so they point at your API's own error pages.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_problem_type_base("https://api.example.com/errors/idempotency#");
    /// // a reused key is then `"type": "https://api.example.com/errors/idempotency#KeyReused"`
    /// # let _ = layer;
    /// ```
    pub fn with_problem_type_base(self, base: impl Into<String>) -> Self {
        let base: Arc<str> = Arc::from(base.into());
        self.map_config(|c| c.problem_type_base = base)
    }

    /// Build the whole response of every refusal with `response`, for an API with its own error
    /// envelope. The [`Rejection`](crate::Rejection) gives the status, a stable
    /// [`name`](crate::Rejection::name), the title, the detail and the retry delay; the layer
    /// adds `Retry-After` when the rejection has one and your response lacks it.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_idempotency::{Idempotency, Rejection};
    ///
    /// let layer = Idempotency::memory().with_rejection_response(|rejection: &Rejection| {
    ///     let body = serde_json::json!({
    ///         "error": { "code": rejection.name(), "message": rejection.detail() }
    ///     });
    ///     http::Response::builder()
    ///         .status(rejection.status())
    ///         .header("content-type", "application/json")
    ///         .body(Bytes::from(body.to_string()))
    ///         .unwrap()
    /// });
    /// # let _ = layer;
    /// ```
    pub fn with_rejection_response(self, response: impl RejectionResponse) -> Self {
        let response: Arc<dyn RejectionResponse> = Arc::new(response);
        self.map_config(|c| c.rejection_response = Some(response))
    }

    /// Mark replayed answers with `header: true` instead of `Idempotent-Replayed: true`.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory()
    ///     .with_replay_header(http::HeaderName::from_static("x-idempotent-replay"));
    /// # let _ = layer;
    /// ```
    pub fn with_replay_header(self, header: HeaderName) -> Self {
        self.map_config(|c| c.replay_header = header)
    }

    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
    pub(crate) fn into_mode<M2>(self) -> Idempotency<St, M2> {
        Idempotency {
            store: self.store,
            config: self.config,
            mode: PhantomData,
        }
    }
}

impl<St, M> Clone for Idempotency<St, M> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            config: self.config.clone(),
            mode: PhantomData,
        }
    }
}

impl<St: fmt::Debug, M> fmt::Debug for Idempotency<St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("Idempotency")
            .field("store", &self.store)
            .field("mode", &std::any::type_name::<M>())
            .field("header", &c.header)
            .field("required", &c.required)
            .field("methods", &c.methods)
            .field("body_limit", &c.body_limit)
            .field("body_timeout", &c.body_timeout)
            .field("saved_body_limit", &c.saved_body_limit)
            .field("ttl", &c.ttl)
            .field("lease", &c.lease)
            .field("wait", &c.wait)
            .field("fail_open", &c.fail_open)
            .field("store_timeout", &c.store_timeout)
            .field("retry_after", &c.retry_after)
            .field("require_scope", &c.require_scope)
            .field("problem_type_base", &c.problem_type_base)
            .field("rejection_response", &c.rejection_response.is_some())
            .field("replay_header", &c.replay_header)
            .finish_non_exhaustive()
    }
}

impl<S, St: Store, M: Mode<St>> Layer<S> for Idempotency<St, M> {
    type Service = IdempotencyService<S, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::from_parts(inner, self.store.clone(), self.config.clone())
    }
}
