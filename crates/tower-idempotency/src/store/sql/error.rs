//! sqlx's errors, sorted into [`StoreErrorKind`]s: the kinds every SQL store shares (a lost
//! connection, a closed pool, a row that does not decode), then each database's own codes
//! (`postgres/error.rs`, `sqlite/error.rs`, `mysql/error.rs`).

use crate::store::error::{StoreError, StoreErrorKind};

/// The kind of a database error, by the database that raised it.
fn database_error_kind(err: &dyn sqlx::error::DatabaseError) -> StoreErrorKind {
    #[cfg(feature = "mysql")]
    if let Some(my) = err.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return super::mysql::error::kind(my);
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = err.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return super::postgres::error::kind(pg);
    }
    #[cfg(feature = "sqlite")]
    if err
        .try_downcast_ref::<sqlx::sqlite::SqliteError>()
        .is_some()
    {
        return super::sqlite::error::kind(err);
    }
    let _ = err;
    StoreErrorKind::Backend
}

#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        let kind = match &err {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            // A protocol error leaves the connection unusable; a new one is expected to work.
            | sqlx::Error::Protocol(_) => StoreErrorKind::Unavailable,
            sqlx::Error::Database(db) => database_error_kind(db.as_ref()),
            sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } => StoreErrorKind::Corrupt,
            sqlx::Error::Migrate(_) => StoreErrorKind::Migration,
            _ => StoreErrorKind::Backend,
        };
        Self::new(kind, err)
    }
}
