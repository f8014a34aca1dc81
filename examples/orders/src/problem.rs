//! Error answers as `application/problem+json` (RFC 9457).

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};

/// Where the problem types are documented.
const TYPE_BASE: &str =
    "https://github.com/tower-idempotency/tower-idempotency/blob/main/examples/orders/README.md#";

/// An error answer: `type`, `title`, `status` and a `detail` that says what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// The anchor of the problem type in the example's README (`invalid-order`, ...).
    pub kind: &'static str,
    /// A short, fixed summary.
    pub title: &'static str,
    /// What went wrong and what to do.
    pub detail: String,
    /// `Retry-After`, in seconds, for answers that mean "try again".
    pub retry_after: Option<u64>,
}

impl Problem {
    /// 400: the order in the body cannot be accepted.
    pub fn invalid_order(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-order",
            "Invalid order",
            detail,
        )
    }

    /// 400: the query string cannot be used.
    pub fn invalid_query(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-query",
            "Invalid query",
            detail,
        )
    }

    /// 404: nothing here.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    /// 503: the database did not answer; nothing was committed, so the request can be retried
    /// (with the same idempotency key).
    pub fn unavailable(err: &sqlx::Error) -> Self {
        tracing::error!(error = %err, "database error");
        let mut problem = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Database unavailable",
            "the database could not complete the request and nothing was saved; retry after the time in Retry-After (with the same Idempotency-Key for POST)",
        );
        problem.retry_after = Some(1);
        problem
    }

    fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "type": format!("{TYPE_BASE}{}", self.kind),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut response = (self.status, body.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
