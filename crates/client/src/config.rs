//! The retry policy's settings, their defaults, and the checks that reject unusable values.

use std::{fmt, sync::Arc, time::Duration};

use http::{HeaderName, Method};
use tower::retry::budget::{Budget, TpsBudget};

use crate::{
    classify::{Classify, DefaultClassifier},
    key::{KeyMode, KeyRules, KeySource},
};

/// The header that carries the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Attempts per intent, the first one included.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// The backoff before the first retry (before jitter); it doubles on each retry.
pub const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(100);
/// The longest backoff between two attempts (before jitter); `Retry-After` may ask for longer.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(5);
/// How long one attempt may take before it counts as timed out.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an intent may take, all attempts and waits included.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// How long a deposit into the retry budget counts (tower's default).
pub const DEFAULT_BUDGET_TTL: Duration = Duration::from_secs(10);
/// Retries per second the budget allows whatever the traffic (tower's default).
pub const DEFAULT_BUDGET_MIN_PER_SEC: u32 = 10;
/// Retries allowed per intent on top of the minimum: 0.2 lets retries add at most 20 % to the
/// traffic (tower's default).
pub const DEFAULT_BUDGET_RETRY_RATIO: f32 = 0.2;
/// The methods that get a generated key: the ones RFC 9110 does not call idempotent.
pub const DEFAULT_KEYED_METHODS: [Method; 2] = [Method::POST, Method::PATCH];

/// How retries are budgeted, so that a failing server does not receive more and more retries.
#[derive(Clone)]
pub(crate) enum BudgetConfig {
    Tps {
        ttl: Duration,
        min_per_sec: u32,
        retry_ratio: f32,
    },
    Shared(Arc<dyn Budget + Send + Sync>),
}

impl fmt::Debug for BudgetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tps {
                ttl,
                min_per_sec,
                retry_ratio,
            } => f
                .debug_struct("Tps")
                .field("ttl", ttl)
                .field("min_per_sec", min_per_sec)
                .field("retry_ratio", retry_ratio)
                .finish(),
            Self::Shared(_) => f.write_str("Shared(..)"),
        }
    }
}

/// The retry policy: attempts, backoff, timeouts, deadline, budget, and which requests get a key.
///
/// Every setter takes and returns the config by value; [`RetryConfig::default`] holds the
/// `DEFAULT_*` constants of this crate. The values are checked when a layer or middleware is built
/// from the config, and a [`ConfigError`] says which one is unusable.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_client::{IdempotentRetryLayer, RetryConfig};
///
/// let config = RetryConfig::default()
///     .with_max_attempts(4)
///     .with_backoff(Duration::from_millis(50), Duration::from_secs(2))
///     .with_attempt_timeout(Duration::from_secs(5))
///     .with_deadline(Duration::from_secs(20));
/// let layer = IdempotentRetryLayer::new(config)?;
/// # Ok::<(), tower_idempotency_client::ConfigError>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct RetryConfig {
    pub(crate) max_attempts: u32,
    pub(crate) base_delay: Duration,
    pub(crate) max_delay: Duration,
    pub(crate) attempt_timeout: Duration,
    pub(crate) deadline: Duration,
    pub(crate) budget: BudgetConfig,
    pub(crate) keys: KeyRules,
    pub(crate) classifier: Arc<dyn Classify>,
}

impl fmt::Debug for RetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryConfig")
            .field("max_attempts", &self.max_attempts)
            .field("base_delay", &self.base_delay)
            .field("max_delay", &self.max_delay)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("deadline", &self.deadline)
            .field("budget", &self.budget)
            .field("key_mode", &self.keys.mode)
            .field("keyed_methods", &self.keys.methods)
            .field("header", &self.keys.header)
            .field("key_source", &self.keys.source.as_ref().map(|_| ".."))
            .field("classifier", &self.classifier)
            .finish()
    }
}

impl Default for RetryConfig {
    /// [`DEFAULT_MAX_ATTEMPTS`] attempts, backoff from [`DEFAULT_BASE_DELAY`] up to
    /// [`DEFAULT_MAX_DELAY`], [`DEFAULT_ATTEMPT_TIMEOUT`] per attempt, [`DEFAULT_DEADLINE`] per
    /// intent, tower's default budget, UUID v4 keys on [`DEFAULT_KEYED_METHODS`].
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base_delay: DEFAULT_BASE_DELAY,
            max_delay: DEFAULT_MAX_DELAY,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            deadline: DEFAULT_DEADLINE,
            budget: BudgetConfig::Tps {
                ttl: DEFAULT_BUDGET_TTL,
                min_per_sec: DEFAULT_BUDGET_MIN_PER_SEC,
                retry_ratio: DEFAULT_BUDGET_RETRY_RATIO,
            },
            keys: KeyRules {
                mode: KeyMode::default(),
                methods: DEFAULT_KEYED_METHODS.to_vec(),
                header: IDEMPOTENCY_KEY,
                source: None,
            },
            classifier: Arc::new(DefaultClassifier),
        }
    }
}

impl RetryConfig {
    /// The most attempts per intent, the first included: 1 turns retries off. At least 1.
    ///
    /// ```
    /// # use tower_idempotency_client::RetryConfig;
    /// let config = RetryConfig::default().with_max_attempts(3);
    /// ```
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Exponential backoff with full jitter: before retry `n` (1-based) the client waits a random
    /// time between zero and `min(max, base * 2^(n-1))`. `base` must not exceed `max`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_idempotency_client::RetryConfig;
    /// let config = RetryConfig::default()
    ///     .with_backoff(Duration::from_millis(20), Duration::from_secs(1));
    /// ```
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_delay = base;
        self.max_delay = max;
        self
    }

    /// How long one attempt may take; a slower attempt is abandoned and counts as a timeout,
    /// which is retried (the key makes that safe even if the server did the work). Not zero.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_idempotency_client::RetryConfig;
    /// let config = RetryConfig::default().with_attempt_timeout(Duration::from_secs(3));
    /// ```
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long an intent may take, all attempts and waits included. No retry starts that could
    /// not begin before the deadline, and the last attempt is cut off at the deadline. Not zero.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_idempotency_client::RetryConfig;
    /// let config = RetryConfig::default().with_deadline(Duration::from_secs(60));
    /// ```
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// A [`TpsBudget`]: each intent deposits, each retry withdraws. `ttl` (1 to 60 s) is how long
    /// a deposit counts, `min_per_sec` the retries per second allowed whatever the traffic, and
    /// `retry_ratio` (0 to 1000) the retries allowed per intent on top: 0.2 means retries add at
    /// most 20 % to the traffic. Every service made from one layer shares one budget.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_idempotency_client::RetryConfig;
    /// let config = RetryConfig::default().with_budget(Duration::from_secs(10), 1, 0.1);
    /// ```
    pub fn with_budget(mut self, ttl: Duration, min_per_sec: u32, retry_ratio: f32) -> Self {
        self.budget = BudgetConfig::Tps {
            ttl,
            min_per_sec,
            retry_ratio,
        };
        self
    }

    /// A budget of your own, for example one [`TpsBudget`] shared by several clients.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tower::retry::budget::TpsBudget;
    /// # use tower_idempotency_client::RetryConfig;
    /// let shared = Arc::new(TpsBudget::default());
    /// let config = RetryConfig::default().with_shared_budget(shared.clone());
    /// ```
    pub fn with_shared_budget(mut self, budget: Arc<dyn Budget + Send + Sync>) -> Self {
        self.budget = BudgetConfig::Shared(budget);
        self
    }

    /// Which requests get a generated key ([`KeyMode::UuidV4`] by default).
    ///
    /// # Warning
    ///
    /// With [`KeyMode::CallerProvided`], a request without a key is sent exactly once: retrying
    /// it could run its work twice.
    ///
    /// ```
    /// # use tower_idempotency_client::{KeyMode, RetryConfig};
    /// let config = RetryConfig::default().with_key_mode(KeyMode::UuidV7);
    /// ```
    pub fn with_key_mode(mut self, mode: KeyMode) -> Self {
        self.keys.mode = mode;
        self
    }

    /// The methods that get a generated key ([`DEFAULT_KEYED_METHODS`] by default). Requests of
    /// other methods are retried only if the caller keyed them.
    ///
    /// ```
    /// # use http::Method;
    /// # use tower_idempotency_client::RetryConfig;
    /// let config = RetryConfig::default().with_keyed_methods([Method::POST, Method::PATCH, Method::DELETE]);
    /// ```
    pub fn with_keyed_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.keys.methods = methods.into_iter().collect();
        self
    }

    /// Send the key under `header` instead of [`IDEMPOTENCY_KEY`] (for a server that reads
    /// another name, such as `X-Idempotency-Key`).
    ///
    /// ```
    /// # use tower_idempotency_client::RetryConfig;
    /// let config = RetryConfig::default()
    ///     .with_header_name(http::HeaderName::from_static("x-idempotency-key"));
    /// ```
    pub fn with_header_name(mut self, header: HeaderName) -> Self {
        self.keys.header = header;
        self
    }

    /// Take the key of a request that carries none from `source` instead of generating one
    /// (see [`KeySource`]): a key per intent that survives a restart of the process.
    pub fn with_key_source(mut self, source: impl KeySource) -> Self {
        self.keys.source = Some(Arc::new(source));
        self
    }

    /// Decide with `classifier` which answers and errors are retried, instead of
    /// [`DefaultClassifier`] (see [`Classify`]).
    ///
    /// # Warning
    ///
    /// Retry only what the server answers the same way for the same key: an answer it saved
    /// (a replayed `500`, say) comes back on every retry.
    pub fn with_classifier(mut self, classifier: impl Classify) -> Self {
        self.classifier = Arc::new(classifier);
        self
    }

    /// Check every value, and make the budget.
    pub(crate) fn validate(&self) -> Result<Arc<dyn Budget + Send + Sync>, ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        if self.base_delay > self.max_delay {
            return Err(ConfigError::BackoffBaseAboveMax {
                base: self.base_delay,
                max: self.max_delay,
            });
        }
        if self.attempt_timeout.is_zero() {
            return Err(ConfigError::ZeroAttemptTimeout);
        }
        if self.deadline.is_zero() {
            return Err(ConfigError::ZeroDeadline);
        }
        match &self.budget {
            BudgetConfig::Shared(budget) => Ok(budget.clone()),
            BudgetConfig::Tps {
                ttl,
                min_per_sec,
                retry_ratio,
            } => {
                let ttl_ok = (Duration::from_secs(1)..=Duration::from_secs(60)).contains(ttl);
                // NaN fails the range check too.
                let ratio_ok = (0.0..=1000.0).contains(retry_ratio);
                if !ttl_ok || !ratio_ok || *min_per_sec >= i32::MAX as u32 {
                    return Err(ConfigError::InvalidBudget {
                        ttl: *ttl,
                        min_per_sec: *min_per_sec,
                        retry_ratio: *retry_ratio,
                    });
                }
                Ok(Arc::new(TpsBudget::new(*ttl, *min_per_sec, *retry_ratio)))
            }
        }
    }
}

/// A [`RetryConfig`] value that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `with_max_attempts(0)`.
    #[error("max attempts is 0; use 1 to send each request once, or more to allow retries")]
    ZeroAttempts,
    /// The backoff's base is above its cap.
    #[error("the backoff base ({base:?}) is above its maximum ({max:?}); pass a base at most the maximum")]
    BackoffBaseAboveMax {
        /// The base delay given.
        base: Duration,
        /// The maximum delay given.
        max: Duration,
    },
    /// A zero per-attempt timeout.
    #[error("the attempt timeout is zero; give each attempt time to answer, like 10 s")]
    ZeroAttemptTimeout,
    /// A zero overall deadline.
    #[error("the deadline is zero; give each intent time for its attempts, like 30 s")]
    ZeroDeadline,
    /// Budget values that tower's `TpsBudget` does not accept.
    #[error("the retry budget (ttl {ttl:?}, {min_per_sec} per second, ratio {retry_ratio}) is invalid; the ttl must be 1 to 60 s and the ratio 0 to 1000")]
    InvalidBudget {
        /// The ttl given.
        ttl: Duration,
        /// The minimum retries per second given.
        min_per_sec: u32,
        /// The ratio given.
        retry_ratio: f32,
    },
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};
    use uuid::Uuid;

    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        RetryConfig::default().validate().unwrap();
    }

    #[test]
    fn unusable_values_are_named() {
        let cases = [
            (
                RetryConfig::default().with_max_attempts(0),
                ConfigError::ZeroAttempts,
            ),
            (
                RetryConfig::default().with_backoff(Duration::from_secs(2), Duration::from_secs(1)),
                ConfigError::BackoffBaseAboveMax {
                    base: Duration::from_secs(2),
                    max: Duration::from_secs(1),
                },
            ),
            (
                RetryConfig::default().with_attempt_timeout(Duration::ZERO),
                ConfigError::ZeroAttemptTimeout,
            ),
            (
                RetryConfig::default().with_deadline(Duration::ZERO),
                ConfigError::ZeroDeadline,
            ),
            (
                RetryConfig::default().with_budget(Duration::from_secs(61), 1, 0.1),
                ConfigError::InvalidBudget {
                    ttl: Duration::from_secs(61),
                    min_per_sec: 1,
                    retry_ratio: 0.1,
                },
            ),
        ];
        for (config, expected) in cases {
            assert_eq!(config.validate().err(), Some(expected));
        }
        assert!(matches!(
            RetryConfig::default()
                .with_budget(Duration::from_secs(1), 1, f32::NAN)
                .validate(),
            Err(ConfigError::InvalidBudget { .. })
        ));
    }

    // The key settings, as the retry loops apply them (`KeyRules::ensure_key`).

    fn key_of(config: &RetryConfig, method: Method, headers: &mut HeaderMap) -> Option<Uuid> {
        config
            .keys
            .ensure_key(&method, headers)
            .map(|v| Uuid::parse_str(v.to_str().unwrap()).unwrap())
    }

    #[test]
    fn keyed_methods_get_a_fresh_uuid_each() {
        let config = RetryConfig::default();
        let mut first = HeaderMap::new();
        let mut second = HeaderMap::new();
        let a = key_of(&config, Method::POST, &mut first).unwrap();
        let b = key_of(&config, Method::PATCH, &mut second).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.get_version_num(), 4);
        assert_eq!(first[IDEMPOTENCY_KEY], a.to_string());
    }

    #[test]
    fn v7_keys_when_asked() {
        let config = RetryConfig::default().with_key_mode(KeyMode::UuidV7);
        let key = key_of(&config, Method::POST, &mut HeaderMap::new()).unwrap();
        assert_eq!(key.get_version_num(), 7);
    }

    #[test]
    fn the_callers_key_is_kept() {
        let config = RetryConfig::default();
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("order-42"));
        assert_eq!(
            config.keys.ensure_key(&Method::GET, &mut headers).unwrap(),
            "order-42"
        );
        assert_eq!(headers.get_all(IDEMPOTENCY_KEY).iter().count(), 1);
    }

    #[test]
    fn another_header_name_and_a_key_source() {
        let config = RetryConfig::default()
            .with_header_name(http::HeaderName::from_static("x-request-key"))
            .with_key_source(|_: &Method, headers: &HeaderMap| {
                let row = headers.get("x-outbox-id")?.to_str().ok()?;
                HeaderValue::from_str(&format!("outbox-{row}")).ok()
            });
        let mut headers = HeaderMap::new();
        headers.insert("x-outbox-id", HeaderValue::from_static("42"));
        assert_eq!(
            config.keys.ensure_key(&Method::POST, &mut headers).unwrap(),
            "outbox-42"
        );
        assert_eq!(headers["x-request-key"], "outbox-42");
        assert!(headers.get(IDEMPOTENCY_KEY).is_none());
        // The same row after a restart: the same key.
        let mut again = HeaderMap::new();
        again.insert("x-outbox-id", HeaderValue::from_static("42"));
        assert_eq!(
            config.keys.ensure_key(&Method::POST, &mut again).unwrap(),
            "outbox-42"
        );
        // No row: unkeyed, sent once.
        assert_eq!(
            config.keys.ensure_key(&Method::POST, &mut HeaderMap::new()),
            None
        );
    }

    #[test]
    fn no_key_for_other_methods_or_when_the_caller_provides_them() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            RetryConfig::default()
                .keys
                .ensure_key(&Method::GET, &mut headers),
            None
        );
        let caller = RetryConfig::default().with_key_mode(KeyMode::CallerProvided);
        assert_eq!(caller.keys.ensure_key(&Method::POST, &mut headers), None);
        assert!(headers.is_empty());
    }
}
