//! The answers the layer gives itself, as `application/problem+json` (RFC 9457).
//!
//! One [`Rejection`] variant per refusal; the crate docs list [every status the layer answers
//! with](crate#what-the-layer-answers), with its headers and body.
//!
//! Every rejection is logged as a `tracing` event under the target `tower_idempotency`.
//!
//! # Your own error format
//!
//! The answers are yours to shape, per layer:
//!
//! - [`with_problem_type_base`](crate::Idempotency::with_problem_type_base): the problem `type`
//!   is `{base}{name}` ([`Rejection::name`]), pointing into your API's documentation instead of
//!   this crate's;
//! - [`with_rejection_response`](crate::Idempotency::with_rejection_response): a function from
//!   [`Rejection`] to the whole response, for an API with its own error envelope;
//! - [`with_replay_header`](crate::Idempotency::with_replay_header): the name of the header that
//!   marks a replay (`Idempotent-Replayed` by default).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::{
    key::KeyError,
    store::{StoreError, StoreErrorKind},
};

/// How long a client is told to wait when the store is unavailable.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The default base of the problem `type` URIs: each rejection is documented under its anchor
/// in this crate's documentation. Change it with
/// [`with_problem_type_base`](crate::Idempotency::with_problem_type_base).
pub const DEFAULT_PROBLEM_TYPE_BASE: &str =
    "https://docs.rs/tower-idempotency/latest/tower_idempotency/error/enum.Rejection.html#variant.";

/// Why the layer answered a request itself instead of calling the handler (or instead of the
/// handler's answer).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400: the request has no idempotency key and the layer requires one.
    MissingKey {
        /// The header the key is read from.
        header: String,
    },
    /// 400: the key header is present but unusable.
    InvalidKey {
        /// The header the key is read from.
        header: String,
        /// What is wrong with it.
        reason: KeyError,
    },
    /// 400: the request body could not be read.
    UnreadableBody,
    /// 400: the layer [requires a scope](crate::Idempotency::require_scope) and the request
    /// carries no caller identity (by default: no `Authorization`), so its key would share one
    /// key space with every other anonymous caller. Nothing was read or claimed.
    MissingScope,
    /// 413: the body is larger than the layer buffers. Nothing was claimed.
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// 408: the request body did not arrive within the layer's body timeout. Nothing was
    /// claimed.
    BodyTimeout {
        /// The timeout.
        timeout: Duration,
    },
    /// 409: another attempt with this key is running.
    InFlight {
        /// When to retry: an estimate of when the running attempt finishes (see
        /// [`RetryAfter`](crate::RetryAfter)), never beyond its lease.
        retry_after: Duration,
    },
    /// 409: transactional mode only. This attempt lost its lease to a retry while the handler ran,
    /// so its work was rolled back.
    LeaseLost {
        /// When to retry.
        retry_after: Duration,
    },
    /// 422: the key was first used with a different method, path or body.
    KeyReused,
    /// 503: the idempotency store could not be reached, so the handler was not called.
    StoreUnavailable {
        /// When to retry.
        retry_after: Duration,
    },
    /// 503: transactional and single-commit modes only. The handler ran and its transaction's commit failed in a
    /// way that leaves open whether it landed (the connection broke while the commit was on its
    /// way), and the record is no longer running under this attempt. A retry with the same key
    /// gets the saved answer if the commit landed, or runs the handler once if it did not.
    CommitUnconfirmed {
        /// When to retry.
        retry_after: Duration,
    },
    /// 503: the idempotency store is at a limit of its own: it holds as many records as it may
    /// (a [`MemoryStore`](crate::store::MemoryStore) at its capacity), or a SQL store's queue
    /// of claims is full (`Batching::queue`). The handler was not called.
    StoreFull {
        /// When to retry.
        retry_after: Duration,
    },
    /// 500: the idempotency store answered with an error that a retry will not fix (a
    /// missing table, a corrupt record), so the handler was not called. The cause is logged,
    /// never sent to the client.
    StoreFailed,
}

impl Rejection {
    /// The answer to a store error: 503 for what a retry can cure, 500 for what needs an
    /// operator.
    pub(crate) fn for_store_error(err: &StoreError) -> Self {
        match err.kind() {
            StoreErrorKind::Full => Rejection::StoreFull {
                retry_after: STORE_RETRY_AFTER,
            },
            _ if err.is_transient() => Rejection::StoreUnavailable {
                retry_after: STORE_RETRY_AFTER,
            },
            _ => Rejection::StoreFailed,
        }
    }

    /// The status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::MissingKey { .. }
            | Rejection::InvalidKey { .. }
            | Rejection::MissingScope
            | Rejection::UnreadableBody => StatusCode::BAD_REQUEST,
            Rejection::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Rejection::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::InFlight { .. } | Rejection::LeaseLost { .. } => StatusCode::CONFLICT,
            Rejection::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::StoreUnavailable { .. }
            | Rejection::CommitUnconfirmed { .. }
            | Rejection::StoreFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::StoreFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short, fixed summary (the problem's `title`).
    pub fn title(&self) -> &'static str {
        self.name_and_title().1
    }

    /// What went wrong and what to do (the problem's `detail`).
    pub fn detail(&self) -> String {
        // Every "retry after" in a detail is the `Retry-After` header's whole seconds.
        let secs = self.retry_after().map_or(0, retry_after_secs);
        match self {
            Rejection::MissingKey { header } => format!(
                "this endpoint requires an `{header}` header; generate one unique key (for example a UUID) per operation and send the same key on every retry of it"
            ),
            // The reason says what to do: no second piece of advice.
            Rejection::InvalidKey {
                header,
                reason: reason @ KeyError::Multiple,
            } => format!("the `{header}` header is invalid: {reason}"),
            Rejection::InvalidKey { header, reason } => format!(
                "the `{header}` header is invalid: {reason}; send one key of 1 to 255 visible ASCII characters, bare or as a quoted string"
            ),
            Rejection::MissingScope => "this endpoint keeps idempotency keys per caller and this request does not say who the caller is; send your credentials (for example the `Authorization` header) with the request, and the same ones on every retry".to_owned(),
            Rejection::UnreadableBody => {
                "the request body could not be read; send the request again".to_owned()
            }
            Rejection::BodyTooLarge { limit } => format!(
                "the request body is larger than {limit} bytes, the most this endpoint accepts with an idempotency key; nothing was processed; send a smaller body"
            ),
            Rejection::BodyTimeout { timeout } => format!(
                "the request body was not received within {} s; nothing was processed; send the request again (with the same idempotency key)",
                retry_after_secs(*timeout)
            ),
            Rejection::InFlight { .. } => format!(
                "a request with this idempotency key is still being processed; retry after {secs} s to get its result"
            ),
            Rejection::LeaseLost { .. } => format!(
                "this attempt took too long and a retry with the same idempotency key took over; nothing was committed; retry after {secs} s to get the result"
            ),
            Rejection::KeyReused => "this idempotency key was already used for a different request (its method, path, query, Content-Type or body); use a new key for a new operation, or resend the original request unchanged".to_owned(),
            Rejection::StoreUnavailable { .. } => format!(
                "the request was not processed because idempotency could not be guaranteed right now; retry with the same key after {secs} s"
            ),
            Rejection::CommitUnconfirmed { .. } => format!(
                "the request was processed, but the database connection broke while its result was being committed, so whether it took effect is unknown; retry with the same key after {secs} s: the retry returns the result if it took effect, or processes the request once if it did not (do not retry with a new key)"
            ),
            Rejection::StoreFull { .. } => format!(
                "the request was not processed because the idempotency store is at its limit (it holds as many records as it may, or more requests are waiting for it than it queues); retry with the same key after {secs} s"
            ),
            Rejection::StoreFailed => "the request was not processed because the idempotency store answered with an error; the cause is in the server's log; retrying will not help until it is fixed".to_owned(),
        }
    }

    /// The variant's name (`"KeyReused"`, `"InFlight"`..): a stable code for an error envelope
    /// of your own, and the last part of the problem `type` URI.
    pub fn name(&self) -> &'static str {
        self.name_and_title().0
    }

    /// The variant's fixed strings, one row per variant: its name and its title.
    fn name_and_title(&self) -> (&'static str, &'static str) {
        match self {
            Rejection::MissingKey { .. } => ("MissingKey", "Idempotency key missing"),
            Rejection::InvalidKey { .. } => ("InvalidKey", "Idempotency key invalid"),
            Rejection::MissingScope => ("MissingScope", "Caller not identified"),
            Rejection::UnreadableBody => ("UnreadableBody", "Request body unreadable"),
            Rejection::BodyTooLarge { .. } => ("BodyTooLarge", "Request body too large"),
            Rejection::BodyTimeout { .. } => ("BodyTimeout", "Request body too slow"),
            Rejection::InFlight { .. } => ("InFlight", "Request in progress"),
            Rejection::LeaseLost { .. } => ("LeaseLost", "Request superseded"),
            Rejection::KeyReused => ("KeyReused", "Idempotency key reused"),
            Rejection::StoreUnavailable { .. } => {
                ("StoreUnavailable", "Idempotency store unavailable")
            }
            Rejection::CommitUnconfirmed { .. } => ("CommitUnconfirmed", "Outcome unconfirmed"),
            Rejection::StoreFull { .. } => ("StoreFull", "Idempotency store full"),
            Rejection::StoreFailed => ("StoreFailed", "Idempotency store error"),
        }
    }

    /// The problem's `type` URI under the default base, a link to this variant's documentation:
    /// [`DEFAULT_PROBLEM_TYPE_BASE`] followed by [`name`](Self::name).
    pub fn type_uri(&self) -> String {
        self.type_uri_under(DEFAULT_PROBLEM_TYPE_BASE)
    }

    /// The problem's `type` URI under `base`: `base` followed by [`name`](Self::name).
    ///
    /// ```
    /// use tower_idempotency::Rejection;
    /// assert_eq!(
    ///     Rejection::KeyReused.type_uri_under("https://api.example.com/problems#"),
    ///     "https://api.example.com/problems#KeyReused"
    /// );
    /// ```
    pub fn type_uri_under(&self, base: &str) -> String {
        format!("{base}{}", self.name())
    }

    /// The `Retry-After` this answer carries, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::InFlight { retry_after }
            | Rejection::LeaseLost { retry_after }
            | Rejection::StoreUnavailable { retry_after }
            | Rejection::CommitUnconfirmed { retry_after }
            | Rejection::StoreFull { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// The `application/problem+json` response, with the `type` under the default base.
    pub fn to_response(&self) -> Response<Full<Bytes>> {
        self.problem_response(DEFAULT_PROBLEM_TYPE_BASE)
    }

    /// The `application/problem+json` response, with the `type` under `base` (see
    /// [`type_uri_under`](Self::type_uri_under)), and `Retry-After` when the rejection has one.
    pub fn problem_response(&self, base: &str) -> Response<Full<Bytes>> {
        let (type_uri, detail) = (self.type_uri_under(base), self.detail());
        let mut response = problem_json(self.status(), &type_uri, self.title(), &detail);
        self.add_retry_after(response.headers_mut());
        response
    }

    /// `Retry-After` in `headers` when this rejection has one and `headers` lacks it.
    fn add_retry_after(&self, headers: &mut http::HeaderMap) {
        if let Some(after) = self.retry_after() {
            if !headers.contains_key(header::RETRY_AFTER) {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after_secs(after)),
                );
            }
        }
    }
}

/// Builds the whole response of a refusal, for an API with its own error format (see
/// [`with_rejection_response`](crate::Idempotency::with_rejection_response)).
///
/// Implemented for closures `Fn(&Rejection) -> http::Response<Bytes>`.
pub trait RejectionResponse: Send + Sync + 'static {
    /// The response to `rejection`. Its status is yours to choose; keep
    /// [`Rejection::status`] unless your clients expect otherwise, since the client side of
    /// this crate (and most others) retries 409 and 503 and nothing else.
    fn response(&self, rejection: &Rejection) -> Response<Bytes>;
}

impl<F> RejectionResponse for F
where
    F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
{
    fn response(&self, rejection: &Rejection) -> Response<Bytes> {
        self(rejection)
    }
}

/// The answer the layer sends for `rejection`: the user's own response if the layer has one
/// (`custom`), else the problem document under `problem_type_base`. `Retry-After` is added when
/// the rejection has one and the response lacks it, so clients keep retrying correctly.
pub(crate) fn render(
    problem_type_base: &str,
    custom: Option<&dyn RejectionResponse>,
    rejection: Rejection,
) -> Response<Full<Bytes>> {
    let response = match custom {
        Some(custom) => {
            let mut response = custom.response(&rejection).map(Full::new);
            rejection.add_retry_after(response.headers_mut());
            response
        }
        None => rejection.problem_response(problem_type_base),
    };
    tracing::debug!(
        target: "tower_idempotency",
        status = response.status().as_u16(),
        title = rejection.title(),
        "request answered by the idempotency layer"
    );
    response
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status(), self.detail())
    }
}

impl std::error::Error for Rejection {}

/// Whole seconds, rounded up, at least 1 (RFC 9110 delta-seconds).
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(feature = "axum")]
impl axum_core::response::IntoResponse for Rejection {
    fn into_response(self) -> axum_core::response::Response {
        self.to_response().map(axum_core::body::Body::new)
    }
}

#[cfg(feature = "axum")]
pub use crate::extract::MissingExtension;
pub use crate::problem::{problem_json, PROBLEM_JSON};

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn an_invalid_key_detail_gives_one_piece_of_advice() {
        let twice = Rejection::InvalidKey {
            header: "Idempotency-Key".to_owned(),
            reason: KeyError::Multiple,
        };
        assert_eq!(
            twice.detail(),
            "the `Idempotency-Key` header is invalid: the header appears more than once; send exactly one key"
        );
        let empty = Rejection::InvalidKey {
            header: "Idempotency-Key".to_owned(),
            reason: KeyError::Empty,
        };
        assert!(empty.detail().ends_with("bare or as a quoted string"));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(29_500)), 30);
    }

    #[tokio::test]
    async fn rejections_are_problem_json() {
        let rejection = Rejection::InFlight {
            retry_after: Duration::from_millis(2500),
        };
        let response = rejection.to_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["status"], 409);
        assert_eq!(json["title"], "Request in progress");
        assert!(json["detail"].as_str().unwrap().contains("retry after 3 s"));
        assert!(json["type"]
            .as_str()
            .unwrap()
            .ends_with("#variant.InFlight"));
    }
}
