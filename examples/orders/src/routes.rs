//! The handlers and the request bodies they accept.

use std::time::Duration;

use axum::{
    body::Bytes,
    extract::{
        rejection::{JsonRejection, PathRejection, QueryRejection},
        FromRequest, Path, Query, Request, State,
    },
    http::{header, HeaderValue, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    Json,
};
use serde::{Deserialize, Serialize};
use sqlx::Pool;
use tower_idempotency::{IdempotencyKey, IdempotencyTransaction};

use crate::{
    backend::{Backend, Order},
    payment::PaymentProvider,
    problem::Problem,
};

/// What a valid body of `POST /orders` looks like, quoted in error details.
const EXAMPLE_BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

/// The longest `customerId` accepted, in characters.
pub const MAX_CUSTOMER_ID_CHARS: usize = 255;

/// How long `GET /healthz` waits for `SELECT 1`.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// The body of `POST /orders`: `{"customerId": "c_1", "totalCents": 4000}`.
///
/// As an extractor it reads the body as JSON and validates it. A request without
/// `Content-Type` is read as JSON; one with a `Content-Type` other than `application/json` or
/// `application/*+json` (such as the `application/x-www-form-urlencoded` that `curl -d` sends by
/// default) is refused. Every refusal is a 400 [`Problem`] that says what to fix, marked
/// [`NotProcessed`](tower_idempotency::NotProcessed) so the corrected order can reuse the key.
/// Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(
    rename_all = "camelCase",
    expecting = r#"a JSON object like {"customerId": "c_1", "totalCents": 4000}"#
)]
pub struct NewOrder {
    /// Who places the order: 1 to 255 characters, not only whitespace, no control characters.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$"
    )]
    pub customer_id: String,
    /// The amount in cents: a whole number, at least 1. `4000.0` is the same number as `4000` in
    /// JSON (and in JSON Schema's `integer`), so it is accepted too.
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    #[serde(deserialize_with = "whole_number")]
    pub total_cents: i64,
}

/// An `i64` written as an integer or as a number with no fractional part (`4000.0`).
fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    struct Whole;
    impl serde::de::Visitor<'_> for Whole {
        type Value = i64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a whole number of cents")
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| E::custom(format!("{v} is too large")))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<i64, E> {
            // i64::MAX as f64 rounds up to 2^63, which is out of range: hence `<`.
            if v.fract() == 0.0 && v >= i64::MIN as f64 && v < i64::MAX as f64 {
                Ok(v as i64)
            } else {
                Err(E::invalid_type(serde::de::Unexpected::Float(v), &self))
            }
        }
    }
    deserializer.deserialize_any(Whole)
}

impl<S: Send + Sync> FromRequest<S> for NewOrder {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        // Not `Json<NewOrder>` as the extractor: it answers 415 to a body without
        // `Content-Type` (which this API reads as JSON) and refuses valid types such as
        // `application/json ;charset=utf-8`. So the type is checked here and `Json` only parses.
        let content_type = req.headers().get(header::CONTENT_TYPE).cloned();
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|err| invalid_body(err.into()))?;
        if let Some(value) = content_type.filter(|value| !is_json(value)) {
            let shown = value.to_str().unwrap_or("(not text)");
            return Err(Problem::invalid_order(format!(
                "the body must be JSON, but Content-Type is `{shown}`; send `Content-Type: application/json` and a body like {EXAMPLE_BODY}"
            )));
        }
        if body.trim_ascii().is_empty() {
            return Err(Problem::invalid_order(format!(
                "the body is empty; send a JSON object like {EXAMPLE_BODY}"
            )));
        }
        // serde reads a struct from an array too, by position (`["c_1", 4000]`): an order is an
        // object with named fields.
        if body.trim_ascii().starts_with(b"[") {
            return Err(Problem::invalid_order(format!(
                "the body is a JSON array; send a JSON object like {EXAMPLE_BODY}"
            )));
        }
        let Json(order) = Json::<NewOrder>::from_bytes(&body).map_err(invalid_body)?;
        order.validate()?;
        Ok(order)
    }
}

/// The 400 for a body `Json` cannot read. The detail quotes serde's message (the source, without
/// axum's preamble), such as "missing field `totalCents` at line 1 column 21".
fn invalid_body(rejection: JsonRejection) -> Problem {
    let cause = std::error::Error::source(&rejection)
        .map_or_else(|| rejection.body_text(), ToString::to_string);
    Problem::invalid_order(match rejection {
        JsonRejection::JsonSyntaxError(_) => format!(
            "the body is not valid JSON ({cause}); send a JSON object like {EXAMPLE_BODY}"
        ),
        JsonRejection::JsonDataError(_) => format!(
            "the body is not a valid order: {cause}; `customerId` is a string and `totalCents` a whole number of cents, like {EXAMPLE_BODY}"
        ),
        JsonRejection::BytesRejection(err) => {
            format!("the body could not be read ({err}); send it again")
        }
        // `from_bytes` never checks the Content-Type (`NewOrder` does); this arm also covers
        // variants a later axum may add.
        _ => format!(
            "the body cannot be read as JSON ({cause}); send `Content-Type: application/json` and a body like {EXAMPLE_BODY}"
        ),
    })
}

impl NewOrder {
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

/// `application/json`, or `application/<anything>+json`, with any parameters (and the optional
/// whitespace RFC 9110 allows before them).
fn is_json(content_type: &HeaderValue) -> bool {
    let Ok(value) = content_type.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The handlers' state: the pool, the payment provider, and whether orders write an outbox event.
pub(crate) struct AppState<B: sqlx::Database> {
    pub(crate) pool: Pool<B>,
    pub(crate) payments: PaymentProvider,
    pub(crate) outbox: bool,
}

impl<B: sqlx::Database> Clone for AppState<B> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            payments: self.payments,
            outbox: self.outbox,
        }
    }
}

/// `POST /orders`: authorise the payment (passing the idempotency key onward), then insert the
/// order (and, with the outbox, its `order.created` event) in the idempotency transaction. The
/// layer saves the 201 in the same transaction and commits them all; a crash before that leaves
/// none.
///
/// The transaction is begun only after the payment provider answered, so a slow provider holds
/// no database connection.
pub(crate) async fn create_order<B: Backend>(
    State(state): State<AppState<B>>,
    key: IdempotencyKey,
    tx: IdempotencyTransaction<B>,
    input: NewOrder,
) -> Result<Response, Problem> {
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
    B::insert_order(&tx, &order, state.outbox)
        .await
        .map_err(|err| {
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

/// A route with another method: 405 (axum adds the route's `Allow` header).
pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> Problem {
    Problem::method_not_allowed(format!(
        "{} does not take {method}; the methods it takes are in the Allow header. The routes are POST /orders, GET /orders/{{orderId}}, GET /orders?customerId=..., GET /healthz",
        uri.path()
    ))
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
    use axum::body::Body;

    use super::*;

    /// `NewOrder` extracted from a `POST /orders` with this `Content-Type` and body.
    async fn extract(
        content_type: Option<&str>,
        body: impl Into<Body>,
    ) -> Result<NewOrder, Problem> {
        let mut request = Request::post("/orders");
        if let Some(value) = content_type {
            request = request.header(header::CONTENT_TYPE, value);
        }
        NewOrder::from_request(request.body(body.into()).unwrap(), &()).await
    }

    async fn parse(content_type: Option<&str>, body: &str) -> Result<NewOrder, Problem> {
        extract(content_type, body.to_owned()).await
    }

    #[tokio::test]
    async fn a_valid_order_parses_with_or_without_content_type() {
        let expected = NewOrder {
            customer_id: "c_1".into(),
            total_cents: 4000,
        };
        for content_type in [
            None,
            Some("application/json"),
            Some("Application/JSON"),
            Some("application/merge+json; charset=utf-8"),
            // Valid (RFC 9110 allows whitespace before `;`), though axum's `Json` refuses it.
            Some("application/json ;charset=utf-8"),
        ] {
            assert_eq!(
                parse(content_type, EXAMPLE_BODY).await.unwrap(),
                expected,
                "{content_type:?}"
            );
        }
        let as_float = r#"{"customerId": "c_1", "totalCents": 4000.0}"#;
        assert_eq!(
            parse(None, as_float).await.unwrap(),
            expected,
            "4000.0 is 4000"
        );
        let with_extra = r#"{"customerId": "c_1", "totalCents": 4000, "note": "gift"}"#;
        assert_eq!(
            parse(None, with_extra).await.unwrap(),
            expected,
            "unknown fields are ignored"
        );
    }

    #[tokio::test]
    async fn invalid_bodies_say_what_to_fix() {
        let cases = [
            (Some("application/json"), "", "empty"),
            (Some("application/json"), " \n\t", "empty"),
            (Some("application/json"), "{", "not valid JSON"),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "#,
                "not valid JSON",
            ),
            (
                Some("application/json"),
                &format!("{EXAMPLE_BODY} x"),
                "trailing characters",
            ),
            (Some("application/json"), "[1]", "a JSON array"),
            (
                Some("application/json"),
                r#" ["c_1", 4000]"#,
                "a JSON array",
            ),
            (
                Some("application/json"),
                r#"{"totalCents": 4000}"#,
                "not a valid order: missing field `customerId` at line 1",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1"}"#,
                "not a valid order: missing field `totalCents` at line 1",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "totalCents": "40"}"#,
                "totalCents: invalid type",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "totalCents": 40.5}"#,
                "totalCents: invalid type",
            ),
            (
                Some("application/json"),
                r#"{"customerId": "c_1", "totalCents": 1e300}"#,
                "totalCents: invalid type",
            ),
            (
                Some("application/json"),
                r#"{"customerId": 7, "totalCents": 40}"#,
                "customerId: invalid type",
            ),
            (
                Some("application/json"),
                r#"{"customerId": null, "totalCents": 40}"#,
                "customerId: invalid type: null",
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
            (
                Some("application/x-www-form-urlencoded"),
                EXAMPLE_BODY,
                "send `Content-Type: application/json`",
            ),
            (Some("application/json5"), EXAMPLE_BODY, "Content-Type"),
        ];
        for (ct, body, needle) in cases {
            let problem = parse(ct, body).await.unwrap_err();
            assert_eq!(problem.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(problem.not_processed, "{body}: the key is released");
            assert!(
                problem.detail.contains(needle),
                "{body}: {:?} lacks {needle:?}",
                problem.detail
            );
            assert!(
                !problem.detail.contains("Failed to"),
                "{body}: axum's preamble leaked: {:?}",
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
            let problem = parse(None, &body).await.unwrap_err();
            assert_eq!(problem.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert!(problem.not_processed, "{bad:?}");
            assert!(problem.detail.contains("control character"), "{bad:?}");
        }
        let long = format!(
            r#"{{"customerId": "{}", "totalCents": 1}}"#,
            "x".repeat(256)
        );
        assert!(parse(None, &long)
            .await
            .unwrap_err()
            .detail
            .contains("256 characters"));
    }

    #[tokio::test]
    async fn a_body_that_cannot_be_read_is_a_400() {
        // Over axum's default 2 MiB body limit: `Bytes` refuses it (the layer's own limit
        // answers 413 before this in the real router).
        let too_long = " ".repeat(2 * 1024 * 1024 + 1);
        let problem = extract(Some("application/json"), too_long)
            .await
            .unwrap_err();
        assert_eq!(problem.status, StatusCode::BAD_REQUEST);
        assert!(problem.not_processed);
        assert!(
            problem.detail.starts_with("the body could not be read (")
                && problem.detail.ends_with("); send it again"),
            "{:?}",
            problem.detail
        );
    }

    #[test]
    fn every_json_rejection_is_an_invalid_order() {
        // `NewOrder` checks the Content-Type itself, so `from_bytes` never answers this; should
        // it, it is the same 400, not axum's 415.
        let missing = invalid_body(JsonRejection::MissingJsonContentType(Default::default()));
        assert_eq!(missing.status, StatusCode::BAD_REQUEST);
        assert!(missing.not_processed);
        assert!(missing.detail.contains("Content-Type: application/json"));
    }
}
