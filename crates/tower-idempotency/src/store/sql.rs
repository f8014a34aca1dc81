//! What the PostgreSQL and SQLite stores share: per-key wake-ups for wait mode and the
//! conversions between the layer's types and the SQL columns.

use std::time::Duration;

use bytes::Bytes;
use sqlx::{
    migrate::{Migration, MigrationType, Migrator},
    SqlSafeStr,
};

use super::{StoreError, StoreErrorKind, StoredResponse};
use crate::key::KeyHash;

/// The per-key wake-ups of the SQL stores.
pub(super) type Waiters = super::waiters::Waiters<KeyHash>;

/// The table the stores' migrations are tracked in, apart from the application's own.
const MIGRATIONS_TABLE: &str = "_tower_idempotency_migrations";

/// A migrator over a store's embedded migrations, `(version, description, SQL)` in order,
/// tracked in [`MIGRATIONS_TABLE`].
pub(super) fn migrator(migrations: &[(i64, &'static str, &'static str)]) -> Migrator {
    let migrations = migrations
        .iter()
        .map(|&(version, description, sql)| {
            let sql = sql.into_sql_str();
            Migration::new(
                version,
                description.into(),
                MigrationType::Simple,
                sql,
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The longest lease or retention the store writes: 100 years, far beyond any useful setting
/// and far inside the range of a timestamp.
pub(super) const MAX_MILLIS: i64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// A duration in whole milliseconds for the SQL, at least 1 (a zero lease would make a claim
/// indistinguishable from a takeover) and at most [`MAX_MILLIS`].
pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .clamp(1, MAX_MILLIS)
}

/// The lease left, from the milliseconds the claim computed.
pub(super) fn remaining(ms: Option<i64>) -> Duration {
    Duration::from_millis(ms.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(0))
}

/// The saved response of a `done` record.
pub(super) fn saved_response(
    status: Option<i32>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<StoredResponse, StoreError> {
    let (Some(status), Some(headers), Some(body)) = (status, headers, body) else {
        return Err(StoreError::corrupt("a done record has no saved response"));
    };
    let status = u16::try_from(status).map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e))?;
    StoredResponse::from_parts(status, &headers, Bytes::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_are_clamped() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::from_secs(30)), 30_000);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }

    #[test]
    fn remaining_is_never_negative() {
        assert_eq!(remaining(Some(-5)), Duration::ZERO);
        assert_eq!(remaining(None), Duration::ZERO);
        assert_eq!(remaining(Some(1500)), Duration::from_millis(1500));
    }

    #[test]
    fn a_done_record_without_a_response_is_corrupt() {
        let err = saved_response(None, Some(vec![]), Some(vec![])).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        let err = saved_response(Some(-1), Some(vec![]), Some(vec![])).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        let ok = saved_response(Some(201), Some(b"x-a: 1\n".to_vec()), Some(b"hi".to_vec()));
        assert_eq!(ok.unwrap().status, http::StatusCode::CREATED);
    }
}
