//! The OpenAPI document of the API, generated from the types it serves (`GET /openapi.json`).

use axum::Json;
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

use crate::{backend::Order, routes::NewOrder};

/// An RFC 9457 problem document, as every error of the API is sent
/// (`application/problem+json`).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)] // described, never built: `Problem` renders itself
pub(crate) struct ProblemDocument {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    kind: String,
    /// A short summary of the kind.
    title: String,
    /// The HTTP status.
    status: u16,
    /// What went wrong and what to do.
    detail: String,
}

/// `GET /orders?customerId=` answers this.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)] // described here; `routes::OrderList` is what is sent
pub(crate) struct OrderListDocument {
    orders: Vec<Order>,
}

/// Create an order, at most once per `Idempotency-Key`.
#[utoipa::path(
    post,
    path = "/orders",
    request_body = NewOrder,
    responses(
        (status = 201, description = "Created (or the replay of the first answer, with Idempotent-Replayed: true)", body = Order,
            headers(("Location" = String, description = "The new order: `/orders/{orderId}`"))),
        (status = 400, description = "The order is invalid (the detail says what to fix; the key can be reused for the corrected order)", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 422, description = "The database refused a value of the order (`order-refused`; fix it and send it again, with the same key)", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 503, description = "The database is unavailable", body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
#[allow(dead_code)]
fn create_order() {}

/// One order.
#[utoipa::path(
    get,
    path = "/orders/{orderId}",
    params(("orderId" = String, Path, description = "The order id (a UUID; any other id is a 404)")),
    responses(
        (status = 200, description = "The order", body = Order),
        (status = 404, description = "No order has this id", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 503, description = "The database is unavailable", body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
#[allow(dead_code)]
fn get_order() {}

/// The orders of one customer, oldest first (at most 1000).
#[utoipa::path(
    get,
    path = "/orders",
    params(("customerId" = String, Query, min_length = 1, pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$", description = "The customer: not empty, not only whitespace, no control characters")),
    responses(
        (status = 200, description = "The customer's orders", body = OrderListDocument),
        (status = 400, description = "`customerId` is missing or invalid", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 503, description = "The database is unavailable", body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
#[allow(dead_code)]
fn list_orders() {}

/// 200 when the database answers, 503 otherwise.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "The database answers"), (status = 503, description = "The database does not answer", body = ProblemDocument, content_type = "application/problem+json")))]
#[allow(dead_code)]
fn healthz() {}

/// The operations behind the idempotency layer.
const IDEMPOTENCY: tower_idempotency::openapi::IdempotencyDoc =
    tower_idempotency::openapi::IdempotencyDoc::paths(&["/orders"]);

/// The API's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "orders-api",
        description = "The reference orders API behind tower-idempotency."
    ),
    paths(create_order, get_order, list_orders, healthz),
    // `POST /orders` is behind the idempotency layer: its header and answers (400, 408, 409,
    // 413, 422, 500, 503) come from the library.
    modifiers(&IDEMPOTENCY),
    components(schemas(Order, NewOrder, ProblemDocument, OrderListDocument))
)]
#[derive(Debug)]
pub struct ApiDoc;

/// `GET /openapi.json`.
pub(crate) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_orders_documents_the_key_and_every_answer_of_the_layer() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let post = &doc["paths"]["/orders"]["post"];
        let key = &post["parameters"][0];
        assert_eq!(key["name"], "Idempotency-Key");
        assert_eq!(key["in"], "header");
        assert_eq!(key["required"], true);
        assert_eq!(key["schema"]["maxLength"], 255);
        for status in ["201", "400", "408", "409", "413", "422", "500", "503"] {
            assert!(
                post["responses"][status].is_object(),
                "{status} undocumented"
            );
        }
        for status in ["409", "503"] {
            assert!(
                post["responses"][status]["headers"]["Retry-After"].is_object(),
                "{status} without Retry-After"
            );
        }
        assert!(post["responses"]["201"]["headers"]["Location"].is_object());
        // The API's own 422 and the layer's, in one description.
        let refused = post["responses"]["422"]["description"].as_str().unwrap();
        assert!(refused.contains("order-refused"), "{refused}");
        assert!(refused.contains("different request"), "{refused}");
        // The GET routes are not behind the layer: no key header there.
        assert!(doc["paths"]["/orders"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["name"] != "Idempotency-Key"));
    }
}
