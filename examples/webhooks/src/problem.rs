//! Error answers as `application/problem+json` (RFC 9457).

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};

use tower_idempotency::error::problem_json;

use crate::{signature::SignatureError, Scheme};

/// An error answer: `type`, `title`, `status` and a `detail` that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// The problem type's short name, appended to `urn:webhooks-example:`.
    pub kind: &'static str,
    /// A short, fixed summary.
    pub title: &'static str,
    /// What went wrong and what to do.
    pub detail: String,
}

impl Problem {
    /// 401: the signature is missing, malformed, stale or wrong. Nothing was applied.
    pub fn unauthorized(err: &SignatureError, scheme: Scheme) -> Self {
        tracing::warn!(error = %err, ?scheme, "refused a webhook delivery");
        let how = match scheme {
            Scheme::Standard => {
                "sign \"<webhook-id>.<webhook-timestamp>.<raw body>\" with HMAC-SHA256 under the \
                 base64-decoded key of the whsec_ secret and send the webhook-id, \
                 webhook-timestamp (current Unix seconds) and `webhook-signature: v1,<base64>` \
                 headers"
            }
            Scheme::Stripe => {
                "sign \"<t>.<raw body>\" with HMAC-SHA256 under the endpoint secret and send \
                 `Stripe-Signature: t=<unix seconds>,v1=<hex>` with a current timestamp"
            }
        };
        Self {
            status: StatusCode::UNAUTHORIZED,
            kind: "invalid-signature",
            title: "Invalid webhook signature",
            detail: format!("{err}; {how}"),
        }
    }

    /// 400: the signed body is not an event this receiver understands. Redelivering the same
    /// body will not help.
    pub fn invalid_event(detail: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid-event",
            title: "Invalid event",
            detail: detail.into(),
        }
    }

    /// 503: the database failed; nothing was committed, so the sender should redeliver.
    pub fn unavailable(err: &dyn std::error::Error) -> Self {
        tracing::error!(error = %err, "applying an event failed");
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "unavailable",
            title: "Event not applied",
            detail: "the event could not be applied and nothing was recorded; redeliver it later"
                .into(),
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let type_uri = format!("urn:webhooks-example:{}", self.kind);
        let mut response =
            problem_json(self.status, &type_uri, self.title, &self.detail).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
