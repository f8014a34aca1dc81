//! The axum side: the [`IdempotencyKey`] extractor, and [`MissingExtension`], the rejection of
//! the layer's extractors when the layer is not there.

use http::StatusCode;

use axum_core::extract::FromRequestParts;
use http::request::Parts;

use crate::key::IdempotencyKey;

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = MissingExtension;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<IdempotencyKey>()
            .cloned()
            .ok_or(MissingExtension {
                what: "idempotency key",
                hint: "is the handler behind the Idempotency layer, on a covered method? with an optional layer, extract Option<IdempotencyKey>",
            })
    }
}

impl<S: Send + Sync> axum_core::extract::OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<IdempotencyKey>().cloned())
    }
}

/// Rejection of the [`IdempotencyKey`](crate::IdempotencyKey) and `IdempotencyTransaction`
/// extractors when the request carries no such value: the handler is not behind the layer (or
/// not behind a transactional one), or the method is not covered. It answers 500, since it is a
/// wiring mistake in the server, not in the request.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no {what} in the request extensions: {hint}")]
pub struct MissingExtension {
    pub(crate) what: &'static str,
    pub(crate) hint: &'static str,
}

impl axum_core::response::IntoResponse for MissingExtension {
    fn into_response(self) -> axum_core::response::Response {
        tracing::error!(target: "tower_idempotency", "{self}");
        let detail = self.to_string();
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        crate::problem::problem_json(status, "about:blank", "Server misconfigured", &detail)
            .map(axum_core::body::Body::new)
    }
}
