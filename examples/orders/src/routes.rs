//! The handlers and the request bodies they accept.

use std::time::Duration;

use axum::{
    body::Bytes,
    extract::{
        rejection::{BytesRejection, PathRejection, QueryRejection},
        Path, Query, State,
    },
    http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    Json,
};
use serde::{Deserialize, Serialize};
use sqlx::Pool;
use tower_idempotency::{IdempotencyKey, IdempotencyTransaction};

use crate::{backend::Backend, payment::PaymentProvider, problem::Problem};

/// What a valid body of `POST /orders` looks like, quoted in error details.
const EXAMPLE_BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

/// The longest `customerId` accepted, in characters.
pub const MAX_CUSTOMER_ID_CHARS: usize = 255;

/// How long `GET /healthz` waits for `SELECT 1`.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// An order, as stored and as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    /// A UUID string chosen by the server.
    pub order_id: String,
    /// Who placed it.
    pub customer_id: String,
    /// The amount, in cents, at least 1.
    pub total_cents: i64,
    /// `pending` on creation.
    pub status: String,
}

/// The body of `POST /orders`: `{"customerId": "c_1", "totalCents": 4000}`.
///
/// Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(
    rename_all = "camelCase",
    expecting = r#"a JSON object like {"customerId": "c_1", "totalCents": 4000}"#
)]
pub struct NewOrder {
    /// Who places the order: 1 to 255 characters, not only whitespace.
    pub customer_id: String,
    /// The amount in cents: a whole number, at least 1.
    pub total_cents: i64,
}

impl NewOrder {
    /// Parse and validate a request body.
    ///
    /// The body must be JSON. A request without `Content-Type` is read as JSON; a
    /// `Content-Type` other than `application/json` or `application/*+json` (such as the
    /// `application/x-www-form-urlencoded` that `curl -d` sends by default) is refused. Every refusal is a 400 [`Problem`] that says what to fix.
    pub fn parse(content_type: Option<&HeaderValue>, body: &[u8]) -> Result<Self, Problem> {
        if let Some(value) = content_type {
            if !is_json(value) {
                let shown = value.to_str().unwrap_or("(not text)");
                return Err(Problem::invalid_order(format!(
                    "the body must be JSON, but Content-Type is `{shown}`; send `Content-Type: application/json` and a body like {EXAMPLE_BODY}"
                )));
            }
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(Problem::invalid_order(format!(
                "the body is empty; send a JSON object like {EXAMPLE_BODY}"
            )));
        }
        let order: NewOrder = serde_json::from_slice(body).map_err(|err| {
            use serde_json::error::Category;
            Problem::invalid_order(match err.classify() {
                Category::Syntax | Category::Eof | Category::Io => format!(
                    "the body is not valid JSON ({err}); send a JSON object like {EXAMPLE_BODY}"
                ),
                Category::Data => format!(
                    "the body is not a valid order: {err}; `customerId` is a string and `totalCents` a whole number of cents, like {EXAMPLE_BODY}"
                ),
            })
        })?;
        order.validate()?;
        Ok(order)
    }

    fn validate(&self) -> Result<(), Problem> {
        if self.customer_id.trim().is_empty() {
            return Err(Problem::invalid_order(
                "`customerId` is empty; send the id of the customer placing the order, like \"c_1\"",
            ));
        }
        let chars = self.customer_id.chars().count();
        if chars > MAX_CUSTOMER_ID_CHARS {
            return Err(Problem::invalid_order(format!(
                "`customerId` is {chars} characters long; the limit is {MAX_CUSTOMER_ID_CHARS}"
            )));
        }
        if let Some(position) = control_character(&self.customer_id) {
            return Err(Problem::invalid_order(format!(
                "`customerId` contains a control character (such as NUL or a line break) at character {position}; send printable text, like \"c_1\""
            )));
        }
        if self.total_cents <= 0 {
            return Err(Problem::invalid_order(format!(
                "`totalCents` is {}; it must be a whole number of cents, at least 1 (4000 is 40.00)",
                self.total_cents
            )));
        }
        Ok(())
    }
}

/// The position (counted from 1, in characters) of the first control character (C0, DEL, C1:
/// NUL, line breaks, escapes...), which neither database stores the same way and no customer
/// id needs.
fn control_character(text: &str) -> Option<usize> {
    text.chars().position(char::is_control).map(|i| i + 1)
}

/// Hold one of the `POST /orders` permits while the request (body, handler, save) runs; a
/// request waiting for one has not had its body read.
pub(crate) async fn one_of_the_permits(
    State(permits): State<std::sync::Arc<tokio::sync::Semaphore>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let _permit = permits.acquire().await;
    next.run(req).await
}

/// `application/json`, or `application/<anything>+json`, with any parameters.
fn is_json(content_type: &HeaderValue) -> bool {
    let Ok(value) = content_type.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The handlers' state: the pool and the payment provider.
pub(crate) struct AppState<B: sqlx::Database> {
    pub(crate) pool: Pool<B>,
    pub(crate) payments: PaymentProvider,
}

impl<B: sqlx::Database> Clone for AppState<B> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            payments: self.payments,
        }
    }
}

/// `POST /orders`: authorise the payment (passing the idempotency key onward), then insert the
/// order in the idempotency transaction. The layer saves the 201 in the same transaction and
/// commits both; a crash before that leaves neither.
///
/// The transaction is begun only after the payment provider answered, so a slow provider holds
/// no database connection.
pub(crate) async fn create_order<B: Backend>(
    State(state): State<AppState<B>>,
    key: IdempotencyKey,
    tx: IdempotencyTransaction<B>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body.map_err(|err| {
        Problem::invalid_order(format!("the body could not be read ({err}); send it again"))
    })?;
    let input = NewOrder::parse(headers.get(header::CONTENT_TYPE), &body)?;

    state
        .payments
        .authorize(&key, &input.customer_id, input.total_cents)
        .await;

    let order = Order {
        order_id: uuid::Uuid::new_v4().to_string(),
        customer_id: input.customer_id,
        total_cents: input.total_cents,
        status: "pending".to_owned(),
    };
    // A failed insert is never saved: 503 (database unavailable) is a status the layer does
    // not save, and the others are marked NotProcessed. The layer then rolls the transaction
    // back and releases the key, so a retry with the same key runs afresh.
    B::insert_order(&tx, &order).await.map_err(|err| {
        let mut problem = Problem::database(&err, Problem::order_refused);
        problem.not_processed = true;
        problem
    })?;
    // `?`: the customer id is the client's text, logged escaped so it cannot forge a line.
    tracing::info!(order_id = %order.order_id, customer_id = ?order.customer_id, total_cents = order.total_cents, "order created");

    let location = format!("/orders/{}", order.order_id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(order),
    )
        .into_response())
}

/// `GET /orders/{orderId}`: the order, or 404. An id that is not a UUID cannot name an order,
/// so it is a 404 too, without asking the database.
pub(crate) async fn get_order<B: Backend>(
    State(state): State<AppState<B>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Order>, Problem> {
    let not_found = || {
        Problem::not_found(
            "no order has this id; use the orderId (or the Location header) from the answer to POST /orders",
        )
    };
    let Ok(Path(raw)) = path else {
        return Err(not_found());
    };
    let Ok(id) = uuid::Uuid::parse_str(&raw) else {
        return Err(not_found());
    };
    B::find_order(&state.pool, &id.to_string())
        .await
        .map_err(|err| {
            Problem::database(&err, || {
                Problem::not_found("no order has this id; use the orderId from POST /orders")
            })
        })?
        .map(Json)
        .ok_or_else(not_found)
}

/// The query of `GET /orders`.
#[derive(Debug, Deserialize)]
pub(crate) struct ListParams {
    #[serde(rename = "customerId")]
    customer_id: Option<String>,
}

/// The answer of `GET /orders?customerId=`.
#[derive(Debug, Serialize)]
pub(crate) struct OrderList {
    orders: Vec<Order>,
}

/// `GET /orders?customerId=c_1`: the customer's orders, oldest first (at most 1000).
pub(crate) async fn list_orders<B: Backend>(
    State(state): State<AppState<B>>,
    query: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<OrderList>, Problem> {
    let Query(params) = query.map_err(|err| {
        Problem::invalid_query(format!(
            "the query string cannot be read ({err}); use ?customerId=c_1"
        ))
    })?;
    let customer_id = params
        .customer_id
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| {
            Problem::invalid_query(
                "`customerId` is missing; list the orders of one customer with ?customerId=c_1",
            )
        })?;
    if let Some(position) = control_character(&customer_id) {
        return Err(Problem::invalid_query(format!(
            "`customerId` contains a control character (such as NUL or a line break) at character {position}; no customer id has one"
        )));
    }
    let orders = B::orders_of(&state.pool, &customer_id)
        .await
        .map_err(|err| {
            Problem::database(&err, || {
                Problem::invalid_query("the database refused this `customerId`; use the id of a customer, like ?customerId=c_1")
            })
        })?;
    Ok(Json(OrderList { orders }))
}

/// `GET /healthz`: 200 when the database answers `SELECT 1` within 2 s, 503 otherwise.
pub(crate) async fn healthz<B: Backend>(State(state): State<AppState<B>>) -> Response {
    match tokio::time::timeout(HEALTH_TIMEOUT, B::ping(&state.pool)).await {
        Ok(Ok(())) => Json(serde_json::json!({ "status": "ok" })).into_response(),
        Ok(Err(err)) => Problem::unavailable(&err).into_response(),
        Err(_) => Problem::unavailable(&sqlx::Error::PoolTimedOut).into_response(),
    }
}

/// Any other route: 404 with the list of routes.
pub(crate) async fn not_found(method: Method, uri: Uri) -> Problem {
    Problem::not_found(format!(
        "there is no route for {method} {}; the routes are POST /orders, GET /orders/{{orderId}}, GET /orders?customerId=..., GET /healthz",
        uri.path()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json() -> HeaderValue {
        HeaderValue::from_static("application/json")
    }

    fn parse(ct: Option<&str>, body: &str) -> Result<NewOrder, Problem> {
        let ct = ct.map(|v| HeaderValue::from_str(v).unwrap());
        NewOrder::parse(ct.as_ref(), body.as_bytes())
    }

    #[test]
    fn a_valid_order_parses_with_or_without_content_type() {
        let expected = NewOrder {
            customer_id: "c_1".into(),
            total_cents: 4000,
        };
        assert_eq!(
            NewOrder::parse(Some(&json()), EXAMPLE_BODY.as_bytes()).unwrap(),
            expected
        );
        assert_eq!(parse(None, EXAMPLE_BODY).unwrap(), expected);
        assert_eq!(
            parse(Some("application/merge+json; charset=utf-8"), EXAMPLE_BODY).unwrap(),
            expected
        );
    }

    #[test]
    fn invalid_bodies_say_what_to_fix() {
        let cases = [
            (Some("application/json"), "", "empty"),
            (Some("application/json"), "{", "not valid JSON"),
            (Some("application/json"), "[1]", "customerId"),
            (
                Some("application/json"),
                r#"{"totalCents": 4000}"#,
                "missing field `customerId`",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1"}"#,
                "missing field `totalCents`",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "totalCents": "40"}"#,
                "invalid type",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "totalCents": 40.5}"#,
                "invalid type",
            ),
            (
                Some("application/json"),
                r#"{"customerId": 7, "totalCents": 40}"#,
                "invalid type",
            ),
            (
                Some("application/json"),
                r#"{"customerId": " ", "totalCents": 40}"#,
                "`customerId` is empty",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "totalCents": 0}"#,
                "`totalCents` is 0",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "totalCents": -5}"#,
                "`totalCents` is -5",
            ),
            (
                Some("text/plain"),
                EXAMPLE_BODY,
                "Content-Type is `text/plain`",
            ),
        ];
        for (ct, body, needle) in cases {
            let problem = parse(ct, body).unwrap_err();
            assert_eq!(problem.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(
                problem.detail.contains(needle),
                "{body}: {:?} lacks {needle:?}",
                problem.detail
            );
        }
        for bad in [
            "a\u{0}b",
            "\u{0}",
            "c_1\nFORGED log line",
            "tab\there",
            "\u{7f}",
            "a\u{85}b",
        ] {
            let body = serde_json::json!({"customerId": bad, "totalCents": 1}).to_string();
            let problem = parse(None, &body).unwrap_err();
            assert_eq!(problem.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert!(problem.not_processed, "{bad:?}");
            assert!(problem.detail.contains("control character"), "{bad:?}");
        }
        let long = format!(
            r#"{{"customerId": "{}", "totalCents": 1}}"#,
            "x".repeat(256)
        );
        assert!(parse(None, &long)
            .unwrap_err()
            .detail
            .contains("256 characters"));
    }
}
