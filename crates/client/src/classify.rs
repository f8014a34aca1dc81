//! Which attempts are retried: the [`Classify`] trait and the default rules.

use std::time::{Duration, SystemTime};

use http::{header::RETRY_AFTER, HeaderMap, StatusCode};

/// What a [`Classify`] says about one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Hand the answer (or error) back: no retry.
    Final,
    /// Retry with the same key, after at least `at_least` (the backoff may ask for longer).
    Retry {
        /// The least wait, such as the server's `Retry-After`.
        at_least: Duration,
        /// Why, as the `cause` label of the `idempotency_client_retries_total` counter and in
        /// the tracing events: a short, fixed string such as `"unavailable"`.
        cause: &'static str,
    },
}

impl Verdict {
    /// Retry after at least `at_least`, for `cause`.
    pub fn retry(at_least: Duration, cause: &'static str) -> Self {
        Self::Retry { at_least, cause }
    }
}

/// Decides which answers and errors are worth another attempt with the same key.
///
/// Replace [`DefaultClassifier`] with
/// [`RetryConfig::with_classifier`](crate::RetryConfig::with_classifier), for example to retry a
/// 500 from a server known to save no answer for it. Whatever the classifier says, a request
/// without a key is never retried, and attempts, deadline and budget still bound the retries.
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_idempotency_client::{Classify, DefaultClassifier, RetryConfig, Verdict};
///
/// #[derive(Debug)]
/// struct AlsoBadGateway;
///
/// impl Classify for AlsoBadGateway {
///     fn response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
///         match status {
///             StatusCode::BAD_GATEWAY => Verdict::retry(std::time::Duration::ZERO, "bad_gateway"),
///             _ => DefaultClassifier.response(status, headers),
///         }
///     }
///
///     fn error(&self, error: &(dyn std::error::Error + 'static)) -> Verdict {
///         DefaultClassifier.error(error)
///     }
/// }
///
/// let config = RetryConfig::default().with_classifier(AlsoBadGateway);
/// ```
pub trait Classify: std::fmt::Debug + Send + Sync + 'static {
    /// An answer arrived with `status` and `headers`.
    fn response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict;

    /// The attempt failed with `error` (the transport's, or the inner service's).
    fn error(&self, error: &(dyn std::error::Error + 'static)) -> Verdict;

    /// No answer within the attempt's time. Retried by default: the key makes it safe.
    fn timed_out(&self) -> Verdict {
        Verdict::retry(Duration::ZERO, "timeout")
    }
}

/// The default rules: retry transport errors and timeouts, `409` with `Retry-After` (an attempt
/// with this key is in flight), `429` and `503` (after `Retry-After` when present); hand back
/// every other answer, `2xx`, `4xx` and `5xx` alike.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
        let wait = retry_after(headers, SystemTime::now());
        match (status, wait) {
            // 409 with Retry-After is the server's "an attempt with this key is in flight";
            // without it, a 409 is a business conflict that a retry cannot resolve.
            (StatusCode::CONFLICT, Some(wait)) => Verdict::retry(wait, "in_flight"),
            (StatusCode::TOO_MANY_REQUESTS, wait) => {
                Verdict::retry(wait.unwrap_or_default(), "rate_limited")
            }
            (StatusCode::SERVICE_UNAVAILABLE, wait) => {
                Verdict::retry(wait.unwrap_or_default(), "unavailable")
            }
            _ => Verdict::Final,
        }
    }

    fn error(&self, error: &(dyn std::error::Error + 'static)) -> Verdict {
        if is_transient(error) {
            Verdict::retry(Duration::ZERO, "transport")
        } else {
            Verdict::Final
        }
    }
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
/// a hyper connection error (closed, cancelled, incomplete answer), a timeout, or (feature
/// `reqwest`) a reqwest error that says it is a connect error or a timeout. An error with
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
        #[cfg(feature = "reqwest")]
        if let Some(err) = err.downcast_ref::<reqwest::Error>() {
            if err.is_connect() || err.is_timeout() {
                return true;
            }
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
    fn only_safe_answers_are_retried_by_default() {
        let two = headers("2");
        let classify = |status: u16, headers: &HeaderMap| {
            DefaultClassifier.response(StatusCode::from_u16(status).unwrap(), headers)
        };
        assert_eq!(
            classify(409, &two),
            Verdict::retry(Duration::from_secs(2), "in_flight")
        );
        assert_eq!(
            classify(429, &two),
            Verdict::retry(Duration::from_secs(2), "rate_limited")
        );
        assert_eq!(
            classify(503, &HeaderMap::new()),
            Verdict::retry(Duration::ZERO, "unavailable")
        );
        for status in [200, 201, 400, 401, 403, 404, 409, 413, 422, 500, 502, 504] {
            assert_eq!(
                classify(status, &HeaderMap::new()),
                Verdict::Final,
                "{status}"
            );
        }
        assert_eq!(classify(422, &two), Verdict::Final);
        assert_eq!(
            DefaultClassifier.timed_out(),
            Verdict::retry(Duration::ZERO, "timeout")
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            DefaultClassifier.error(&refused),
            Verdict::retry(Duration::ZERO, "transport")
        );
        let invalid = http::Error::from(http::Method::from_bytes(b"\0").unwrap_err());
        assert_eq!(DefaultClassifier.error(&invalid), Verdict::Final);
    }
}
