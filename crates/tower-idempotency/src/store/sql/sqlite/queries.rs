//! The SQL of the SQLite store, one statement per operation. Parameters are numbered (`?1`),
//! and the clock is SQLite's: `julianday('now')` in milliseconds since the Unix epoch.

/// The text of [`LIVE_MANY`], which [`BATCH`] runs too: the claims are the array `c` of the one
/// JSON parameter.
macro_rules! live_many {
    () => {
        r#"
SELECT 'live' AS kind, j.key AS n,
       CASE WHEN r.fingerprint <> unhex(j.value ->> 'f') THEN 'mismatch'
            WHEN r.state = 'done' THEN 'done'
            ELSE 'in_flight' END AS outcome,
       false AS taken_over,
       max(0, r.lease_until - clock.now) AS lease_remaining_ms,
       r.status, r.headers, r.body
FROM json_each(?1, '$.c') AS j
JOIN idempotency_records AS r ON r.key = unhex(j.value ->> 'k')
JOIN (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now) AS clock
WHERE r.expires_at > clock.now
  AND (r.fingerprint <> unhex(j.value ->> 'f') OR r.state = 'done' OR r.lease_until > clock.now)
"#
    };
}

/// Read, without taking the write lock, the live records that cannot be claimed: another
/// fingerprint, `done`, or `running` under a valid lease. Those states hold until the record
/// expires, so replays, duplicates in flight and mismatches are answered by this read alone and
/// never queue behind writers. Anything else goes to [`BATCH`], whose upsert alone decides who
/// runs.
///
/// Many claims at once: `?1` is a JSON object whose array `c` holds the claims (`k`ey,
/// `f`ingerprint, as hex); one row per claim answered, numbered `n` in the array.
pub(super) const LIVE_MANY: &str = live_many!();

/// A whole batch of writes (group commit) in one transaction, sent to SQLite's thread at once
/// (the statements of [`batches`]):
/// the write lock is taken and released inside one hop, never held while the store's task waits.
///
/// The one parameter, `?1`, is a JSON object with one array per kind of write (blobs as hex):
/// `s` saves (`k`ey, `t`oken, `s`tatus, `h`eaders, `b`ody), `r` releases and `n` renewals
/// (`k`, `t`, `l`ease ms), `c` claims (`k`, `f`ingerprint, `t`, `l`, `e`xpiry ms), at most one
/// claim per key. One parameter, because sqlx binds a statement list's numbered parameters
/// only while each statement's lower numbers are its own.
///
/// Saves, releases and renewals run first and return the `key` and `token` of every record
/// they changed, so a claim of a key saved in the same batch is answered the saved
/// response, as a claim arriving just after the save would be. The claims then run as
/// [`LIVE_MANY`] does: `live` rows (numbered `n` in `c`) answer the records
/// that cannot be claimed; the upsert claims the rest (the new, the expired, and the running
/// ones whose lease lapsed with the same fingerprint) and returns their keys. Everything runs in
/// one `BEGIN IMMEDIATE .. COMMIT`, one writer at a time, so no other write falls between the
/// read and the upsert.
pub(super) const BATCH: [&str; 4] = [
    r#"
UPDATE idempotency_records AS r
SET state = 'done', status = j.value ->> 's', headers = unhex(j.value ->> 'h'),
    body = unhex(j.value ->> 'b')
FROM json_each(?1, '$.s') AS j
WHERE r.key = unhex(j.value ->> 'k') AND r.token = unhex(j.value ->> 't') AND r.state = 'running'
RETURNING 'saved' AS kind, key, token;
"#,
    r#"
DELETE FROM idempotency_records
WHERE state = 'running'
  AND (key, token) IN (SELECT unhex(value ->> 'k'), unhex(value ->> 't') FROM json_each(?1, '$.r'))
RETURNING 'released' AS kind, key, token;
"#,
    r#"
UPDATE idempotency_records AS r
SET lease_until = CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
                  + (j.value ->> 'l'),
    expires_at = max(r.expires_at,
                     CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
                     + (j.value ->> 'l'))
FROM json_each(?1, '$.n') AS j
WHERE r.key = unhex(j.value ->> 'k') AND r.token = unhex(j.value ->> 't') AND r.state = 'running'
RETURNING 'renewed' AS kind, key, token;
"#,
    concat!(
        live_many!(),
        r#";
INSERT INTO idempotency_records AS r
    (key, fingerprint, token, state, created_at, lease_until, expires_at)
SELECT unhex(j.value ->> 'k'), unhex(j.value ->> 'f'), unhex(j.value ->> 't'), 'running',
       clock.now, clock.now + (j.value ->> 'l'), clock.now + (j.value ->> 'e')
FROM json_each(?1, '$.c') AS j,
     (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now) AS clock
WHERE true
"#,
        take_over_set!(),
        r#"    created_at  = iif(r.expires_at <= excluded.created_at, excluded.created_at, r.created_at),
    expires_at  = iif(r.expires_at <= excluded.created_at, excluded.expires_at,
                      max(r.expires_at, excluded.lease_until))
WHERE r.expires_at <= excluded.created_at
   OR (r.state = 'running' AND r.lease_until <= excluded.created_at
       AND r.fingerprint = excluded.fingerprint)
RETURNING 'claimed' AS kind, key,
    created_at <> CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
        AS taken_over;
"#
    ),
];

/// [`BATCH`]'s statements for the kinds of write a batch holds (bit `i` set: `BATCH[i]` is in),
/// in order, inside `BEGIN IMMEDIATE .. COMMIT`, written for `table`: a batch runs no statement
/// for a kind it does not hold.
pub(super) fn batches(table: &crate::store::sql::TableName) -> Vec<sqlx::SqlStr> {
    (0..1usize << BATCH.len())
        .map(|kinds| {
            let mut sql = String::from("BEGIN IMMEDIATE;");
            for (i, statement) in BATCH.iter().enumerate() {
                if kinds & (1 << i) != 0 {
                    sql.push_str(statement);
                }
            }
            sql.push_str("COMMIT;");
            table.statement_text(sql)
        })
        .collect()
}

/// The text of [`COMPLETE`], then, for the two statement lists that commit the handler's
/// transaction with it, the check that it saved one record and the `COMMIT`. `abs` of the smallest
/// integer is SQLite's documented integer-overflow error: the check fails the list before the
/// `COMMIT` unless the save changed one record.
macro_rules! complete {
    () => {
        r#"
UPDATE idempotency_records
SET state = 'done', status = ?3, headers = ?4, body = ?5
WHERE key = ?1 AND token = ?2 AND state = 'running'
"#
    };
    (checked and committed) => {
        concat!(
            complete!(),
            r#"RETURNING 1;
SELECT abs(CASE WHEN changes() = 1 THEN 0 ELSE -9223372036854775807 - 1 END);
COMMIT;
"#
        )
    };
}

/// Save the response on the running record held with the token (its expiry unchanged).
pub(super) const COMPLETE: &str = complete!();

/// [`COMPLETE`], then the check that it saved one record, the `COMMIT`, and a `BEGIN`, as one
/// statement list (see `SqliteStore::complete_and_commit`); binds as [`COMPLETE`] does, all in
/// its first statement.
pub(super) const COMPLETE_AND_COMMIT: &str = concat!(complete!(checked and committed), "BEGIN;\n");

/// [`COMPLETE_AND_COMMIT`] for a transaction that hands the write lock on to the next one in
/// the writer queue (see `store::writers`): after the `COMMIT`, a row that tells the save is
/// committed, then `BEGIN IMMEDIATE`, which takes the write lock again for the next transaction.
/// Should another process take the file's lock between the two, the `BEGIN` fails after the
/// committed row, and the save stands.
pub(super) const COMPLETE_AND_HAND_OVER: &str = concat!(
    complete!(checked and committed),
    "SELECT 1;\nBEGIN IMMEDIATE;\n"
);

/// The message of [`COMPLETE_AND_COMMIT`]'s check when the save changed nothing.
pub(super) const FENCED_OUT: &str = "integer overflow";

/// Delete the running record held with the token.
pub(super) const RELEASE: &str = r#"
DELETE FROM idempotency_records
WHERE key = ?1 AND token = ?2 AND state = 'running'
"#;

/// Delete up to `?1` expired records.
pub(super) const SWEEP: &str = r#"
DELETE FROM idempotency_records
WHERE key IN (
    SELECT key FROM idempotency_records
    WHERE expires_at <= CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
    LIMIT ?1
)
"#;

/// Reads every column this version uses, and no row: fails when the table or a column is missing.
pub(super) const CHECK_SCHEMA: &str =
    "SELECT key, fingerprint, token, state, status, headers, body, created_at, lease_until, expires_at FROM idempotency_records WHERE false";

/// Operators' read of one live record ([`Store::get`]), its times left by the database's clock.
pub(super) const GET: &str = r#"
SELECT state, status, headers, body,
    max(0, lease_until - CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)) AS lease_ms,
    max(0, expires_at - CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)) AS expires_ms,
    max(0, CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) - created_at) AS age_ms
FROM idempotency_records
WHERE key = ?1 AND expires_at > CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
"#;

/// Operators' delete of one record, whatever its state ([`Store::forget`]).
pub(super) const FORGET: &str = "DELETE FROM idempotency_records WHERE key = ?1";

/// Operators' counts by state and the oldest running record (`Store::stats`): one scan.
pub(super) const STATS: &str = r#"
WITH clock AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now),
oldest AS (
    SELECT r.key, r.created_at FROM idempotency_records AS r, clock
    WHERE r.state = 'running' AND r.expires_at > clock.now
    ORDER BY r.created_at, r.key
    LIMIT 1
)
SELECT count(CASE WHEN r.state = 'running' AND r.expires_at > clock.now THEN 1 END),
    count(CASE WHEN r.state = 'done' AND r.expires_at > clock.now THEN 1 END),
    count(CASE WHEN r.expires_at <= clock.now THEN 1 END),
    (SELECT key FROM oldest),
    max(clock.now) - (SELECT created_at FROM oldest)
FROM clock LEFT JOIN idempotency_records AS r ON 1
"#;

statements! {
    /// The store's statements for its table.
    struct Queries {
        live_many: LIVE_MANY,
        complete: COMPLETE,
        complete_and_commit: COMPLETE_AND_COMMIT,
        complete_and_hand_over: COMPLETE_AND_HAND_OVER,
        release: RELEASE,
    }
}
