//! Error answers as `application/problem+json` (RFC 9457).

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use tower_idempotency::{error::problem_json, NotProcessed};

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
    /// The request was refused before any work: the answer carries
    /// [`NotProcessed`](tower_idempotency::NotProcessed), so the idempotency layer does not save
    /// it and a corrected request can reuse the key.
    pub not_processed: bool,
}

/// Whose fault a database error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbFault {
    /// The input: invalid bytes or values (PostgreSQL SQLSTATE class 22), a constraint
    /// (class 23; SQLite CONSTRAINT, MISMATCH, TOOBIG, RANGE).
    Input,
    /// The database could not be reached or was busy: connection, pool, timeout, lock.
    Unavailable,
    /// Anything else: a bug or a broken schema.
    Server,
}

impl DbFault {
    /// Classify a sqlx error.
    pub fn of(err: &sqlx::Error) -> Self {
        match err {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => DbFault::Unavailable,
            sqlx::Error::Database(db) => {
                if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                    mysql_fault(my.number())
                } else if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                    let code = pg.code();
                    if code.starts_with("22") || code.starts_with("23") {
                        DbFault::Input
                    } else if ["08", "40", "53", "57"].iter().any(|c| code.starts_with(c))
                        || code == "55P03"
                    {
                        DbFault::Unavailable
                    } else {
                        DbFault::Server
                    }
                } else {
                    // SQLite: a numeric result code; the primary code is the low byte.
                    let code = db.code().and_then(|c| c.parse::<u32>().ok()).unwrap_or(0);
                    match code & 0xff {
                        18 | 19 | 20 | 25 => DbFault::Input,
                        5 | 6 | 7 | 10 | 13 | 14 | 15 => DbFault::Unavailable,
                        _ => DbFault::Server,
                    }
                }
            }
            _ => DbFault::Server,
        }
    }
}

/// A MySQL or MariaDB error number, sorted as the idempotency store sorts it (deadlocks, lock
/// wait timeouts, connection limits, a full disk, read-only and shutdown are outages); a value
/// the schema refuses is the client's input.
fn mysql_fault(number: u16) -> DbFault {
    match number {
        // data too long, incorrect value, out of range, truncated, NULL in NOT NULL, duplicate
        // key, foreign key, CHECK (MySQL 3819, MariaDB 4025)
        1406 | 1366 | 1264 | 1292 | 1048 | 1062 | 1452 | 3819 | 4025 => DbFault::Input,
        1213
        | 1205
        | 1040
        | 1203
        | 1637
        | 1037
        | 1038
        | 1041
        | 1021
        | 1114
        | 1053
        | 1077
        | 1317
        | 1927
        | 1158..=1161
        | 1152
        | 1290
        | 1792
        | 1836
        | 3024
        | 1969 => DbFault::Unavailable,
        _ => DbFault::Server,
    }
}

impl Problem {
    /// 400: the order in the body cannot be accepted. Not saved by the idempotency layer: the
    /// corrected order can be sent with the same key.
    pub fn invalid_order(detail: impl Into<String>) -> Self {
        let mut problem = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-order",
            "Invalid order",
            detail,
        );
        problem.not_processed = true;
        problem
    }

    /// The answer to a database error, by whose fault it is: `input` (a 4xx that says what to
    /// fix) for errors caused by the request, 503 when the database is unavailable, 500
    /// otherwise. The error is logged (escaped), never sent.
    pub fn database(err: &sqlx::Error, input: impl FnOnce() -> Problem) -> Self {
        match DbFault::of(err) {
            DbFault::Input => {
                tracing::info!(error = ?err.to_string(), "the database refused the input");
                input()
            }
            DbFault::Unavailable => Self::unavailable(err),
            DbFault::Server => {
                tracing::error!(error = ?err.to_string(), "database error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "Internal error",
                    "the server could not complete the request and nothing was saved; the cause is in its log",
                )
            }
        }
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

    /// 422: the database refused the order (a value it cannot store). Not saved by the
    /// idempotency layer (the transaction is rolled back): the corrected order can be sent with
    /// the same key.
    pub fn order_refused() -> Self {
        let mut problem = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "order-refused",
            "Order refused",
            "the database refused a value of this order; check `customerId` (text without control characters) and `totalCents`, then send it again",
        );
        problem.not_processed = true;
        problem
    }

    /// 404: nothing here.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    /// 408: the request was not answered within `limit`. Its work may still finish (behind the
    /// idempotency layer it runs to the end and its answer is saved), so the retry uses the same
    /// key.
    pub fn answer_timed_out(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request-timeout",
            "Request timeout",
            format!(
                "the request was not answered within {} s; its work may still finish: retry with the same Idempotency-Key (for POST) to get its answer",
                limit.as_secs()
            ),
        )
    }

    /// 405: the route exists, but not for this method.
    pub fn method_not_allowed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            detail,
        )
    }

    /// 503: the database did not answer; nothing was committed, so the request can be retried
    /// (with the same idempotency key).
    pub fn unavailable(err: &sqlx::Error) -> Self {
        tracing::error!(error = ?err.to_string(), "database unavailable");
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
            not_processed: false,
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let type_uri = format!("{TYPE_BASE}{}", self.kind);
        let mut response =
            problem_json(self.status, &type_uri, self.title, &self.detail).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.not_processed {
            response.extensions_mut().insert(NotProcessed);
        }
        response
    }
}
