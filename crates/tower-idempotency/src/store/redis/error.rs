//! Redis' errors, sorted into [`StoreErrorKind`]s.

use crate::store::error::{StoreError, StoreErrorKind};

impl From<::redis::RedisError> for StoreError {
    fn from(err: ::redis::RedisError) -> Self {
        // What redis itself would retry (a dropped connection, LOADING, TRYAGAIN, CLUSTERDOWN, a
        // failover in progress) is unavailability; the rest is an error in the command.
        let kind = if err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || !matches!(err.retry_method(), ::redis::RetryMethod::NoRetry)
        {
            StoreErrorKind::Unavailable
        } else {
            StoreErrorKind::Backend
        };
        Self::new(kind, err)
    }
}
