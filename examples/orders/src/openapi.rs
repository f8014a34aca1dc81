//! The OpenAPI document of the API, generated from the types it serves (`GET /openapi.json`).

use axum::Json;
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

use crate::routes::{NewOrder, Order};

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
    params(("Idempotency-Key" = String, Header, description = "One key per order: resend it on every retry")),
    responses(
        (status = 201, description = "Created (or the replay of the first answer, with Idempotent-Replayed: true)", body = Order),
        (status = 400, description = "Invalid order or missing key", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 409, description = "The first attempt with this key is still running", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 422, description = "The key was used for a different order", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 503, description = "The database is unavailable", body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
#[allow(dead_code)]
fn create_order() {}

/// One order.
#[utoipa::path(
    get,
    path = "/orders/{orderId}",
    params(("orderId" = String, Path, description = "The order id")),
    responses(
        (status = 200, body = Order),
        (status = 404, body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
#[allow(dead_code)]
fn get_order() {}

/// The orders of one customer, oldest first (at most 1000).
#[utoipa::path(
    get,
    path = "/orders",
    params(("customerId" = String, Query, description = "The customer")),
    responses(
        (status = 200, body = OrderListDocument),
        (status = 400, body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
#[allow(dead_code)]
fn list_orders() {}

/// 200 when the database answers, 503 otherwise.
#[utoipa::path(get, path = "/healthz", responses((status = 200), (status = 503)))]
#[allow(dead_code)]
fn healthz() {}

/// The API's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "orders-api",
        description = "The reference orders API behind tower-idempotency."
    ),
    paths(create_order, get_order, list_orders, healthz),
    components(schemas(Order, NewOrder, ProblemDocument, OrderListDocument))
)]
#[derive(Debug)]
pub struct ApiDoc;

/// `GET /openapi.json`.
pub(crate) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
