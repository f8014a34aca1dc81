//! What may be retried, and when: the decision both the tower service and the reqwest
//! middleware take after each attempt.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use http::{header::RETRY_AFTER, HeaderMap, StatusCode};
use rand::Rng;
use tokio::time::Instant;
use tower::retry::budget::Budget;

use crate::config::{ConfigError, RetryConfig};

/// The tracing target of this crate's events.
pub(crate) const TARGET: &str = "tower_idempotency_client";

/// A validated config and its budget, shared by every clone of a layer or middleware.
#[derive(Clone)]
pub(crate) struct Policy {
    pub(crate) config: Arc<RetryConfig>,
    budget: Arc<dyn Budget + Send + Sync>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Policy {
    pub(crate) fn new(config: RetryConfig) -> Result<Self, ConfigError> {
        let budget = config.validate()?;
        Ok(Self {
            config: Arc::new(config),
            budget,
        })
    }

    /// Start an intent. Only a keyed intent may be retried, and only it feeds the budget.
    pub(crate) fn start(&self, keyed: bool) -> Intent {
        if keyed {
            self.budget.deposit();
        }
        Intent {
            policy: self.clone(),
            keyed,
            started: Instant::now(),
            attempts: 0,
        }
    }
}

/// What one attempt produced, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// An answer, with the wait its `Retry-After` asks for.
    Answer(StatusCode, Option<Duration>),
    /// A transport failure that may have happened before or after the server did the work.
    TransientError,
    /// A failure no retry can fix (an invalid request, a closed client).
    PermanentError,
    /// No answer within the attempt's time.
    TimedOut,
}

impl Outcome {
    /// Classify an answer by its status and `Retry-After`.
    pub(crate) fn answer(status: StatusCode, headers: &HeaderMap) -> Self {
        Self::Answer(status, retry_after(headers, SystemTime::now()))
    }

    /// Whether this outcome is worth another attempt with the same key, and the least wait the
    /// server asked for.
    fn retryable(self) -> Option<Duration> {
        match self {
            // 409 with Retry-After is the server's "an attempt with this key is in flight";
            // without it, a 409 is a business conflict that a retry cannot resolve.
            Self::Answer(StatusCode::CONFLICT, Some(wait)) => Some(wait),
            Self::Answer(StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE, wait) => {
                Some(wait.unwrap_or_default())
            }
            Self::Answer(..) | Self::PermanentError => None,
            Self::TransientError | Self::TimedOut => Some(Duration::ZERO),
        }
    }
}

/// One intent's attempts: the clock, the count and the decision to go on.
#[derive(Debug)]
pub(crate) struct Intent {
    policy: Policy,
    keyed: bool,
    started: Instant,
    attempts: u32,
}

impl Intent {
    /// Count an attempt, and return how long it may take: the attempt timeout, or less if the
    /// deadline comes first.
    pub(crate) fn begin_attempt(&mut self) -> Duration {
        self.attempts += 1;
        let config = &self.policy.config;
        let left = config.deadline.saturating_sub(self.started.elapsed());
        config.attempt_timeout.min(left)
    }

    /// Attempts made so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How long to wait before the next attempt, or `None` to stop and hand `outcome` back.
    pub(crate) fn retry_after(&mut self, outcome: Outcome) -> Option<Duration> {
        if !self.keyed {
            return None;
        }
        let asked = outcome.retryable()?;
        let config = &self.policy.config;
        if self.attempts >= config.max_attempts {
            tracing::debug!(target: TARGET, attempts = self.attempts, ?outcome, "no retry: attempts used up");
            return None;
        }
        let wait = asked.max(full_jitter(
            config.base_delay,
            config.max_delay,
            self.attempts,
        ));
        if self.started.elapsed() + wait >= config.deadline {
            tracing::debug!(target: TARGET, attempts = self.attempts, ?wait, ?outcome, "no retry: the deadline would pass");
            return None;
        }
        if !self.policy.budget.withdraw() {
            tracing::debug!(target: TARGET, attempts = self.attempts, ?outcome, "no retry: the retry budget is spent");
            return None;
        }
        tracing::debug!(target: TARGET, attempts = self.attempts, ?wait, ?outcome, "retrying with the same key");
        Some(wait)
    }
}

/// A random wait in `[0, min(max, base * 2^(retry - 1))]` ("full jitter"), so clients that failed
/// together do not retry together.
fn full_jitter(base: Duration, max: Duration, retry: u32) -> Duration {
    let exponent = retry.saturating_sub(1).min(31);
    let ceiling = base.saturating_mul(1 << exponent).min(max);
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

/// The wait a `Retry-After` header asks for: delta-seconds, or an HTTP date (in the past: zero).
/// An unreadable value asks for nothing.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or_default())
}

/// Whether a transport error may be temporary: somewhere in its chain of causes is an I/O error,
/// a hyper connection error (closed, cancelled, incomplete answer) or a timeout. An error with
/// none of these (an invalid URI, a refused request method) is not retried.
///
/// The key makes a retry safe even when the request reached the server and only the answer was
/// lost, which is exactly the failure this crate exists for.
pub fn is_transient(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(err) = cause {
        if err.is::<std::io::Error>() || err.is::<tokio::time::error::Elapsed>() {
            return true;
        }
        if let Some(err) = err.downcast_ref::<hyper::Error>() {
            if err.is_canceled()
                || err.is_closed()
                || err.is_incomplete_message()
                || err.is_body_write_aborted()
                || err.is_timeout()
            {
                return true;
            }
        }
        cause = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(retry_after: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(retry_after).unwrap());
        headers
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(
            retry_after(&headers("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:49:40 GMT"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:49:00 GMT"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn only_safe_outcomes_are_retryable() {
        let wait = Some(Duration::from_secs(2));
        let retryable = [
            (Outcome::Answer(StatusCode::CONFLICT, wait), wait),
            (Outcome::Answer(StatusCode::TOO_MANY_REQUESTS, wait), wait),
            (
                Outcome::Answer(StatusCode::SERVICE_UNAVAILABLE, None),
                Some(Duration::ZERO),
            ),
            (Outcome::TransientError, Some(Duration::ZERO)),
            (Outcome::TimedOut, Some(Duration::ZERO)),
        ];
        for (outcome, expected) in retryable {
            assert_eq!(outcome.retryable(), expected, "{outcome:?}");
        }
        for status in [400, 401, 403, 404, 409, 413, 422, 500, 502, 504] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(Outcome::Answer(status, None).retryable(), None, "{status}");
        }
        assert_eq!(
            Outcome::Answer(StatusCode::UNPROCESSABLE_ENTITY, wait).retryable(),
            None
        );
        assert_eq!(Outcome::PermanentError.retryable(), None);
    }

    #[test]
    fn full_jitter_stays_under_the_capped_exponential() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for retry in 1..40 {
            let ceiling = (base * 2u32.pow(retry.min(20) - 1)).min(max);
            for _ in 0..50 {
                assert!(full_jitter(base, max, retry) <= ceiling);
            }
        }
    }

    #[tokio::test]
    async fn an_unkeyed_intent_is_never_retried() {
        let policy = Policy::new(RetryConfig::default()).unwrap();
        let mut intent = policy.start(false);
        intent.begin_attempt();
        assert_eq!(intent.retry_after(Outcome::TransientError), None);
        let mut keyed = policy.start(true);
        keyed.begin_attempt();
        assert!(keyed.retry_after(Outcome::TransientError).is_some());
    }

    #[tokio::test]
    async fn attempts_stop_at_the_maximum() {
        let config = RetryConfig::default()
            .with_max_attempts(3)
            .with_backoff(Duration::ZERO, Duration::ZERO);
        let mut intent = Policy::new(config).unwrap().start(true);
        let mut attempts = 1;
        intent.begin_attempt();
        while intent.retry_after(Outcome::TimedOut).is_some() {
            intent.begin_attempt();
            attempts += 1;
        }
        assert_eq!(attempts, 3);
    }

    #[tokio::test]
    async fn a_retry_after_beyond_the_deadline_stops() {
        let config = RetryConfig::default().with_deadline(Duration::from_secs(5));
        let mut intent = Policy::new(config).unwrap().start(true);
        intent.begin_attempt();
        let outcome = Outcome::Answer(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(60)),
        );
        assert_eq!(intent.retry_after(outcome), None);
    }
}
