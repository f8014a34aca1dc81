//! [`NotProcessed`]: a handler's way to say "nothing was done, do not save this answer".

/// A response extension that tells the layer the handler did nothing: the answer is sent but not
/// saved, the key is released (in transactional mode the transaction is rolled back), and a
/// retry with the same key runs the handler again.
///
/// Mark answers that refuse a request before any work, such as a validation error: the client
/// can fix its body and retry with the same key, instead of getting 422 (the key is bound to
/// the first body) or the saved refusal again. Any other answer, 4xx and 5xx included, is saved
/// by default, because the layer cannot know whether it took effect.
///
/// Insert it in the response's extensions:
///
/// ```
/// use tower_idempotency::NotProcessed;
///
/// let mut response = http::Response::new(String::from("`amount` must be positive"));
/// *response.status_mut() = http::StatusCode::BAD_REQUEST;
/// response.extensions_mut().insert(NotProcessed);
/// # let _ = response;
/// ```
///
/// With the `axum` feature it is also a response part:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::{http::StatusCode, response::IntoResponse};
/// use tower_idempotency::NotProcessed;
///
/// async fn create_order(body: String) -> axum::response::Response {
///     if body.is_empty() {
///         return (StatusCode::BAD_REQUEST, NotProcessed, "send an order").into_response();
///     }
///     (StatusCode::CREATED, "created").into_response()
/// }
/// # }
/// ```
///
/// # Warning
///
/// Mark only answers given before any side effect. In standard mode nothing is undone: a marked
/// answer after a payment was taken lets the retry take it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotProcessed;

#[cfg(feature = "axum")]
impl axum_core::response::IntoResponseParts for NotProcessed {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut res: axum_core::response::ResponseParts,
    ) -> Result<axum_core::response::ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}
