//! Redis' errors, sorted into [`StoreErrorKind`]s.

use crate::store::error::{StoreError, StoreErrorKind};

/// Server refusals that pass on their own, which redis does not retry: a script or module
/// running too long (`BUSY`), too few replicas to accept writes (`NOREPLICAS`), memory full until
/// keys expire or are evicted (`OOM`).
const REFUSED_FOR_NOW: [&str; 3] = ["BUSY", "NOREPLICAS", "OOM"];

impl From<::redis::RedisError> for StoreError {
    fn from(err: ::redis::RedisError) -> Self {
        // What redis itself would retry (a dropped connection, LOADING, TRYAGAIN, CLUSTERDOWN, a
        // failover in progress) is unavailability; the rest is an error in the command.
        let kind = if err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || !matches!(err.retry_method(), ::redis::RetryMethod::NoRetry)
            || err
                .code()
                .is_some_and(|code| REFUSED_FOR_NOW.contains(&code))
        {
            StoreErrorKind::Unavailable
        } else {
            StoreErrorKind::Backend
        };
        Self::new(kind, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error redis-rs makes of a server's error reply, `-{reply}`.
    fn server_error(reply: &str) -> ::redis::RedisError {
        match ::redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()) {
            Ok(::redis::Value::ServerError(err)) => err.into(),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn refusals_that_pass_on_their_own_are_unavailability() {
        for reply in [
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "NOREPLICAS Not enough good replicas to write.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        ] {
            let err = StoreError::from(server_error(reply));
            assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{reply}");
        }
    }

    #[test]
    fn errors_in_the_command_are_backend_errors() {
        for reply in [
            "ERR wrong number of arguments for 'hset' command",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ] {
            let err = StoreError::from(server_error(reply));
            assert_eq!(err.kind(), StoreErrorKind::Backend, "{reply}");
        }
    }
}
