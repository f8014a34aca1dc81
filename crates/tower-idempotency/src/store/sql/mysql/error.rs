//! MySQL and MariaDB error numbers, sorted into [`StoreErrorKind`]s.
//!
//! The number (`MySqlDatabaseError::number`) is what tells the errors apart; the SQLSTATE is
//! only a broad class (`HY000` covers most of them). Numbers are those of MySQL 8's and
//! MariaDB 10.11's server error references; where the two databases give one number different
//! meanings, the comment says which is meant.

use sqlx::mysql::MySqlDatabaseError;

use crate::store::error::StoreErrorKind;

/// The kind of a MySQL or MariaDB error.
///
/// - Aborted over a concurrent operation, nothing written, a retry is expected to succeed:
///   [`Conflict`](StoreErrorKind::Conflict) (the layer retries a claim, then answers 503).
/// - The server cannot serve now (connections, memory, disk, read-only during a failover, a
///   lock or statement timeout, shutdown): [`Unavailable`](StoreErrorKind::Unavailable) (503).
/// - Everything else, in particular a value the schema refuses (data too long, an incorrect or
///   out-of-range value, a violated constraint) and a missing table: an error a retry will not
///   cure, [`Backend`](StoreErrorKind::Backend) (500), never reported as an outage.
pub(in crate::store) fn kind(err: &MySqlDatabaseError) -> StoreErrorKind {
    match err.number() {
        // ER_LOCK_DEADLOCK: InnoDB rolled the statement (or transaction) back to break a
        // deadlock. ER_XA_RBDEADLOCK likewise inside an XA transaction. ER_CHECKREAD (MariaDB
        // with innodb_snapshot_isolation): a row the transaction read was changed since, by a
        // lease renewal, say.
        1213 | 1614 | 1020 => StoreErrorKind::Conflict,
        // ER_LOCK_WAIT_TIMEOUT: the row stayed locked for innodb_lock_wait_timeout; the retry
        // is the client's, after Retry-After.
        1205 => StoreErrorKind::Unavailable,
        // ER_CON_COUNT_ERROR (too many connections), ER_TOO_MANY_USER_CONNECTIONS,
        // ER_TOO_MANY_CONCURRENT_TRXS, ER_OUTOFMEMORY, ER_OUT_OF_SORTMEMORY, ER_OUT_OF_RESOURCES,
        // ER_DISK_FULL, ER_RECORD_FILE_FULL (table full)
        1040 | 1203 | 1637 | 1037 | 1038 | 1041 | 1021 | 1114 => StoreErrorKind::Unavailable,
        // ER_SERVER_SHUTDOWN, ER_NORMAL_SHUTDOWN, ER_QUERY_INTERRUPTED (KILL QUERY),
        // ER_CONNECTION_KILLED (MariaDB), ER_NET_READ_ERROR, ER_NET_READ_INTERRUPTED,
        // ER_NET_ERROR_ON_WRITE, ER_NET_WRITE_INTERRUPTED, ER_ABORTING_CONNECTION
        1053 | 1077 | 1317 | 1927 | 1158 | 1159 | 1160 | 1161 | 1152 => StoreErrorKind::Unavailable,
        // ER_OPTION_PREVENTS_STATEMENT (--read-only / super_read_only, as on a replica or during
        // a failover), ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION, ER_READ_ONLY_MODE (MySQL)
        1290 | 1792 | 1836 => StoreErrorKind::Unavailable,
        // ER_QUERY_TIMEOUT (MySQL's max_execution_time), ER_STATEMENT_TIMEOUT (MariaDB's
        // max_statement_time).
        3024 | 1969 => StoreErrorKind::Unavailable,
        _ => StoreErrorKind::Backend,
    }
}
