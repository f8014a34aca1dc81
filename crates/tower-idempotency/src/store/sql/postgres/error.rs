//! PostgreSQL's SQLSTATE codes, sorted into [`StoreErrorKind`]s.

use sqlx::postgres::PgDatabaseError;

use crate::store::error::StoreErrorKind;

/// The kind of a PostgreSQL error, from its SQLSTATE.
pub(in crate::store) fn kind(err: &PgDatabaseError) -> StoreErrorKind {
    match err.code() {
        // serialization_failure, deadlock_detected
        "40001" | "40P01" => StoreErrorKind::Conflict,
        // connection exceptions (class 08), insufficient resources (class 53), operator
        // intervention (class 57: query_canceled by statement_timeout, admin_shutdown,
        // cannot_connect_now...), lock_not_available (lock_timeout)
        c if c.starts_with("08") || c.starts_with("53") || c.starts_with("57") => {
            StoreErrorKind::Unavailable
        }
        "55P03" => StoreErrorKind::Unavailable,
        _ => StoreErrorKind::Backend,
    }
}
