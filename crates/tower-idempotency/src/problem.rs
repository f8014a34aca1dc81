//! The one `application/problem+json` (RFC 9457) builder: the layer's refusals, the operator
//! routes and the extractors' rejections all answer through it.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An `application/problem+json` response: `status`, and a body with `type`, `title`, `status`
/// and `detail`, the way the layer writes its own refusals. For answers of your own that should
/// look like the layer's: a [`with_rejection_response`](crate::Idempotency::with_rejection_response)
/// envelope, an API's own errors.
///
/// ```
/// use http::StatusCode;
/// use tower_idempotency::error::problem_json;
///
/// let response = problem_json(StatusCode::NOT_FOUND, "about:blank", "Not found", "no such order");
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
pub fn problem_json(
    status: StatusCode,
    type_uri: &str,
    title: &str,
    detail: &str,
) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "type": type_uri,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}
