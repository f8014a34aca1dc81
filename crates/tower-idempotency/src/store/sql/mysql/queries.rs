//! The SQL of the MySQL store, one statement per operation.
//!
//! MySQL numbers its `?` parameters by position, so each statement's comment gives the order
//! it binds them in. Every statement is valid on MySQL 8 and on MariaDB 10.11; where the two
//! differ, the comment says which form is used and why.

use sqlx::SqlStr;

use crate::{
    key,
    store::{
        record::{Hold, StoredResponse},
        sql::TableName,
    },
};

/// The database's clock in milliseconds since the Unix epoch.
///
/// `UTC_TIMESTAMP(6)` does not depend on the session's `time_zone`, and `TIMESTAMPDIFF`
/// between two `DATETIME`s is plain arithmetic, so every connection and every instance agrees
/// (`UNIX_TIMESTAMP(NOW(6))` would go through the session's time zone, which is ambiguous in the
/// hour a daylight-saving zone repeats). MySQL and MariaDB evaluate it once per statement.
macro_rules! now_ms {
    () => {
        "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED)"
    };
}

/// Read, without a lock, the live records of many claims' keys at once: the read half of a
/// claim, batched (see [`batch`](super::batch)). A live record that cannot be claimed (another
/// fingerprint, `done`, or `running` under a valid lease) answers its claim alone: those states
/// hold until the record expires (a lease can only lapse, which [`CLAIM`] handles), so replays,
/// duplicates in flight and mismatches need this consistent read only, no row lock that replays
/// of a hot key would queue on, no write.
///
/// The statement is this text followed by one `?` per key and `)` ([`live_many`]): it binds the
/// keys. One row per live record, with its `key` and `fingerprint`, which the store compares
/// with each claim's own (claims of one key may differ); `outcome` is `done`, `in_flight` (a
/// valid lease) or NULL (a lapsed lease: claimable by the same fingerprint), with the other
/// columns as [`sql::Codec::claim_outcome`] reads them.
///
/// [`sql::Codec::claim_outcome`]: crate::store::sql::Codec::claim_outcome
const LIVE_MANY: &str = concat!(
    r#"
SELECT r.`key`, r.fingerprint,
       CASE WHEN r.state = 'done' THEN 'done'
            WHEN r.lease_until > clock.now THEN 'in_flight' END AS outcome,
       GREATEST(0, r.lease_until - clock.now) AS lease_remaining_ms,
       r.status, r.headers, r.body
FROM idempotency_records AS r,
     (SELECT "#,
    now_ms!(),
    r#" AS now) AS clock
WHERE r.expires_at > clock.now
  AND r.`key` IN ("#
);

/// [`LIVE_MANY`] for `table`, for 1, 2, 4 .. keys up to the first power of two of at least
/// `max_keys`: the store pads a read's keys up to the next of these sizes by repeating one, so
/// a connection prepares a handful of statements, not one per batch size.
pub(super) fn live_many(table: &TableName, max_keys: usize) -> Vec<SqlStr> {
    let sizes = max_keys.max(1).next_power_of_two().trailing_zeros();
    (0..=sizes)
        .map(|size| {
            let keys = 1_usize << size;
            let mut sql = String::with_capacity(LIVE_MANY.len() + 3 * keys);
            sql.push_str(LIVE_MANY);
            for n in 0..keys {
                sql.push_str(if n == 0 { "?" } else { ", ?" });
            }
            sql.push(')');
            table.statement_text(sql)
        })
        .collect()
}

/// The claim: one `INSERT .. ON DUPLICATE KEY UPDATE` that decides every outcome under the
/// primary key's row lock and reports it in the statement's OK packet. The file explains the
/// statement and why it is atomic under InnoDB; the module docs show it.
///
/// Binds 1 key, 2 fingerprint, 3 token, 4 lease and 5 retention in milliseconds (the order of
/// `sql::Codec::claim`). The insert id it returns decodes as [`Code`](super::Code).
pub(super) const CLAIM: &str = include_str!("claim.sql");

/// Extend the lease of the running record held with the token, and the record's expiry to the
/// lease's end if it came sooner (a live holder's record does not expire). MySQL assigns left
/// to right, so `expires_at` sees the new `lease_until` (MariaDB too, unless its
/// `SIMULTANEOUS_ASSIGNMENT` mode is on: then it catches up at the next renewal).
///
/// Binds 1 lease in milliseconds, 2 key, 3 token (`sql::Codec::renew_set_first`). sqlx asks
/// for found rows (`CLIENT_FOUND_ROWS`), so a renewal that writes the same `lease_until` still
/// counts its row.
pub(super) const RENEW: &str = concat!(
    "
UPDATE idempotency_records
SET lease_until = ",
    now_ms!(),
    " + ?,
    expires_at = GREATEST(expires_at, lease_until)
WHERE `key` = ? AND token = ? AND state = 'running'
"
);

/// Save the response on the running record held with the token (its expiry unchanged).
///
/// Binds 1 status, 2 headers, 3 body, 4 key, 5 token (`sql::Codec::complete_set_first`).
pub(super) const COMPLETE: &str = "
UPDATE idempotency_records
SET state = 'done', status = ?, headers = ?, body = ?
WHERE `key` = ? AND token = ? AND state = 'running'
";

/// [`COMPLETE`] as one text statement with its values written in, for the save inside the
/// handler's transaction: a text statement needs no prepare, so a save the layer stops waiting
/// for (its store timeout drops the transaction) leaves sqlx's connection able to roll back and
/// return to the pool; a prepared statement dropped while it is being prepared does not (see
/// `detached`). Every value is the layer's own bytes written as a hex literal, and the status a
/// number: no text from a request reaches the statement.
pub(super) fn complete_text(table: &TableName, hold: &Hold, response: &StoredResponse) -> String {
    let headers = response.encode_headers();
    let capacity = 160 + table.as_str().len() + 2 * (headers.len() + response.body.len());
    let mut sql = String::with_capacity(capacity);
    sql.push_str("UPDATE ");
    sql.push_str(table.as_str());
    sql.push_str(" SET state = 'done', status = ");
    sql.push_str(&response.status.as_u16().to_string());
    sql.push_str(", headers = ");
    push_hex(&mut sql, &headers);
    sql.push_str(", body = ");
    push_hex(&mut sql, &response.body);
    sql.push_str(" WHERE `key` = ");
    push_hex(&mut sql, hold.key.as_bytes());
    sql.push_str(" AND token = ");
    push_hex(&mut sql, hold.token.as_uuid().as_bytes());
    sql.push_str(" AND state = 'running'");
    sql
}

/// `bytes` as a MySQL hex literal, `X'..'` (`X''` is the empty string, a valid empty body).
fn push_hex(sql: &mut String, bytes: &[u8]) {
    sql.push_str("X'");
    key::push_hex(sql, bytes);
    sql.push('\'');
}

/// Delete the running record held with the token.
///
/// Binds 1 key, 2 token (`sql::Codec::held`).
pub(super) const RELEASE: &str = "
DELETE FROM idempotency_records
WHERE `key` = ? AND token = ? AND state = 'running'
";

/// Operators' read of one live record (`Store::get`), its times left by the database's clock.
///
/// Binds 1 key.
pub(super) const GET: &str = concat!(
    "
SELECT r.state, r.status, r.headers, r.body,
    GREATEST(0, r.lease_until - clock.now) AS lease_ms,
    GREATEST(0, r.expires_at - clock.now) AS expires_ms,
    GREATEST(0, clock.now - r.created_at) AS age_ms
FROM idempotency_records AS r, (SELECT ",
    now_ms!(),
    " AS now) AS clock
WHERE r.`key` = ? AND r.expires_at > clock.now
"
);

/// Operators' delete of one record, whatever its state (`Store::forget`). Binds 1 key.
pub(super) const FORGET: &str = "DELETE FROM idempotency_records WHERE `key` = ?";

/// Operators' counts by state and the oldest running record (`Store::stats`): one scan. Binds
/// nothing.
pub(super) const STATS: &str = concat!(
    "
WITH clock AS (SELECT ",
    now_ms!(),
    " AS now),
oldest AS (
    SELECT r.`key`, r.created_at FROM idempotency_records AS r, clock
    WHERE r.state = 'running' AND r.expires_at > clock.now
    ORDER BY r.created_at, r.`key`
    LIMIT 1
)
SELECT COUNT(CASE WHEN r.state = 'running' AND r.expires_at > clock.now THEN 1 END),
    COUNT(CASE WHEN r.state = 'done' AND r.expires_at > clock.now THEN 1 END),
    COUNT(CASE WHEN r.expires_at <= clock.now THEN 1 END),
    (SELECT `key` FROM oldest),
    MAX(clock.now) - (SELECT created_at FROM oldest)
FROM clock LEFT JOIN idempotency_records AS r ON TRUE
"
);

/// Reads every column this version uses, and no row: fails when the table or a column is missing.
pub(super) const CHECK_SCHEMA: &str = "SELECT `key`, fingerprint, token, state, status, headers, \
     body, created_at, lease_until, expires_at FROM idempotency_records WHERE FALSE";

/// Delete up to `?` expired records, oldest first, through the `expires_at` index.
///
/// One bounded statement: under REPEATABLE READ it locks the index range it scans (expired
/// entries, which no claim inserts into: a new record expires in the future), under READ
/// COMMITTED only the rows it deletes.
pub(super) const SWEEP: &str = concat!(
    "
DELETE FROM idempotency_records
WHERE expires_at <= ",
    now_ms!(),
    "
ORDER BY expires_at
LIMIT ?
"
);

statements! {
    /// The store's statements for its table.
    struct Queries {
        claim: CLAIM,
        renew: RENEW,
        complete: COMPLETE,
        release: RELEASE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{key::KeyHash, store::FencingToken};

    #[test]
    fn the_read_comes_in_powers_of_two_keys_for_its_table() {
        let table = TableName::new("billing.keys").unwrap();
        let reads = live_many(&table, 100);
        let placeholders: Vec<usize> = reads
            .iter()
            .map(|sql| sql.as_str().matches('?').count())
            .collect();
        assert_eq!(placeholders, [1, 2, 4, 8, 16, 32, 64, 128]);
        assert!(
            reads[1].as_str().ends_with("r.`key` IN (?, ?)"),
            "{}",
            reads[1].as_str()
        );
        assert!(reads
            .iter()
            .all(|sql| sql.as_str().contains("FROM billing.keys AS r")));
        assert_eq!(live_many(&TableName::default(), 1).len(), 1);
    }

    #[test]
    fn the_text_save_writes_every_value_as_a_literal() {
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            bytes::Bytes::from_static(b"\x00'\\;"),
        );
        let token = FencingToken::from_uuid(uuid::Uuid::from_bytes([0xab; 16]));
        let hold = Hold::new(KeyHash([1; 32]), token);
        let sql = complete_text(&TableName::default(), &hold, &response);
        assert!(sql.starts_with("UPDATE idempotency_records SET"), "{sql}");
        assert!(
            sql.contains("status = 201, headers = X'', body = X'00275c3b'"),
            "{sql}"
        );
        assert!(
            sql.contains(&format!("`key` = X'{}'", "01".repeat(32))),
            "{sql}"
        );
        assert!(
            sql.contains(&format!("token = X'{}'", "ab".repeat(16))),
            "{sql}"
        );
    }
}
