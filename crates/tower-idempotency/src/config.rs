//! The layer's settings ([`Config`]) and their defaults.

use std::{sync::Arc, time::Duration};

use http::{HeaderName, Method};

use crate::{
    error::{RejectionResponse, DEFAULT_PROBLEM_TYPE_BASE},
    fingerprint::{DefaultFingerprint, FingerprintFn},
    key::{AuthorizationScope, KeyHash, ScopeFn},
    record::{DefaultSavePolicy, SavePolicy},
    retry_after::{Durations, RetryAfter},
};

/// The header the key is read from by default: `Idempotency-Key`.
pub const DEFAULT_HEADER_NAME: HeaderName = HeaderName::from_static("idempotency-key");
/// The largest request body buffered by default: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;
/// The largest response body saved by default: 1 MiB. A larger answer is streamed to its client
/// and saved without its body (see
/// [`with_saved_body_limit`](crate::Idempotency::with_saved_body_limit)).
pub const DEFAULT_SAVED_BODY_LIMIT: usize = 1024 * 1024;
/// How long a record is kept by default, counted from its claim: 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// How long a claim stays valid without a heartbeat by default: 30 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The methods covered by default: POST and PATCH.
pub const DEFAULT_METHODS: [Method; 2] = [Method::POST, Method::PATCH];
/// How long reading a request body may take by default: 30 seconds.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the layer waits for any one store call by default: 5 seconds.
///
/// A call that takes longer counts as the store being unavailable (see
/// [`Idempotency::with_store_timeout`](crate::Idempotency::with_store_timeout)).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// In wait mode, the longest pause between two claims when the store's notification does not
/// arrive (a store without notifications, or one that was missed).
pub const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What an [`Idempotency`](crate::Idempotency) layer was configured with; read by the service.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) header: HeaderName,
    pub(crate) required: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) saved_body_limit: usize,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) scope: Arc<dyn ScopeFn>,
    pub(crate) fingerprint: Arc<dyn FingerprintFn>,
    pub(crate) save: Arc<dyn SavePolicy>,
    pub(crate) wait: Option<Duration>,
    pub(crate) fail_open: bool,
    pub(crate) store_timeout: Duration,
    pub(crate) retry_after: RetryAfter,
    /// Refuse requests whose scope is anonymous (400 `MissingScope`).
    pub(crate) require_scope: bool,
    /// The base of the problem `type` URIs.
    pub(crate) problem_type_base: Arc<str>,
    /// The user's own refusal response, replacing the problem document.
    pub(crate) rejection_response: Option<Arc<dyn RejectionResponse>>,
    /// The header that marks a replay.
    pub(crate) replay_header: HeaderName,
    /// Shared by every clone of the layer, so the estimate learns from all of them.
    pub(crate) durations: Arc<Durations>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            header: DEFAULT_HEADER_NAME,
            required: true,
            methods: DEFAULT_METHODS.to_vec(),
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            saved_body_limit: DEFAULT_SAVED_BODY_LIMIT,
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            scope: Arc::new(AuthorizationScope),
            fingerprint: Arc::new(DefaultFingerprint::default()),
            save: Arc::new(DefaultSavePolicy),
            wait: None,
            fail_open: false,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            retry_after: RetryAfter::default(),
            require_scope: false,
            problem_type_base: Arc::from(DEFAULT_PROBLEM_TYPE_BASE),
            rejection_response: None,
            replay_header: crate::record::REPLAYED_HEADER,
            durations: Arc::default(),
        }
    }
}

impl Config {
    pub(crate) fn covers(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// How often a running claim's lease is renewed: a third of the lease, so two renewals can be
    /// lost before the lease lapses, and at most half the retention: each renewal keeps the
    /// record's expiry at or past the lease's end, so a record does not expire (and cannot be
    /// claimed afresh) under a holder that lives past a `ttl` shorter than its run.
    pub(crate) fn heartbeat(&self) -> Duration {
        (self.lease / 3)
            .min(self.ttl / 2)
            .max(Duration::from_millis(1))
    }

    /// The `Retry-After` for a duplicate of the attempt on `key`, running on `path` with
    /// `lease_remaining`: the path's recent durations less what the attempt has run, as the
    /// layer's [`RetryAfter`] policy says.
    pub(crate) fn retry_after_for(
        &self,
        key: &KeyHash,
        path: &str,
        lease_remaining: Duration,
    ) -> Duration {
        self.durations
            .retry_after(self.retry_after, key, path, lease_remaining)
    }
}
