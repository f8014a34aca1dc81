//! The SQL of the SQLite store, one statement per operation. Parameters are numbered (`?1`),
//! and the clock is SQLite's: `julianday('now')` in milliseconds since the Unix epoch.

/// Read, without taking the write lock, a live record that cannot be claimed: another
/// fingerprint, `done`, or `running` under a valid lease. Those states hold until the record
/// expires, so replays, duplicates in flight and mismatches are answered by this read alone and
/// never queue behind writers. Anything else goes to [`CLAIM`], which alone decides who runs.
pub(super) const LIVE: &str = r#"
SELECT CASE WHEN r.fingerprint <> ?2 THEN 'mismatch'
            WHEN r.state = 'done' THEN 'done'
            ELSE 'in_flight' END AS outcome,
       false AS taken_over,
       max(0, r.lease_until - clock.now) AS lease_remaining_ms,
       r.status, r.headers, r.body
FROM idempotency_records AS r,
     (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now) AS clock
WHERE r.key = ?1
  AND r.expires_at > clock.now
  AND (r.fingerprint <> ?2 OR r.state = 'done' OR r.lease_until > clock.now)
"#;

/// Claim in one statement.
///
/// The clock is read once: `clock.now` becomes `excluded.created_at`, and SQLite returns the
/// same `'now'` for every call within one step of a statement, which covers the `RETURNING`
/// clause (all changes and returned values are produced in the first step).
///
/// `DO UPDATE` always writes, so that `RETURNING` always yields the record as it stands after
/// the statement. Each column takes the claim's value when the record has expired (a fresh
/// claim, any fingerprint), the token and lease take it when the record is running with a lapsed
/// lease and the same fingerprint (a takeover, keeping `created_at` and `expires_at`), and
/// otherwise every column keeps its value. The returned token equals ours exactly when we hold
/// the key; `created_at <> now` tells a takeover from a fresh claim.
///
/// Atomic because it is one statement and SQLite runs one writer at a time: no other write can
/// fall between the decision and the claim, or between the claim and the read of the outcome.
/// The price of the single statement is that a claim that loses still rewrites its row; [`LIVE`]
/// answers the common losing cases (replays, duplicates in flight, mismatches) first without a
/// write, so this statement runs only for new, expired and lapsed records and the rare race.
pub(super) const CLAIM: &str = r#"
INSERT INTO idempotency_records AS r
    (key, fingerprint, token, state, created_at, lease_until, expires_at)
SELECT ?1, ?2, ?3, 'running', clock.now, clock.now + ?4, clock.now + ?5
FROM (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now) AS clock
WHERE true
ON CONFLICT (key) DO UPDATE SET
    fingerprint = iif(r.expires_at <= excluded.created_at, excluded.fingerprint, r.fingerprint),
    token       = iif(r.expires_at <= excluded.created_at
                      OR (r.state = 'running' AND r.lease_until <= excluded.created_at
                          AND r.fingerprint = excluded.fingerprint),
                      excluded.token, r.token),
    state       = iif(r.expires_at <= excluded.created_at, 'running', r.state),
    status      = iif(r.expires_at <= excluded.created_at, NULL, r.status),
    headers     = iif(r.expires_at <= excluded.created_at, NULL, r.headers),
    body        = iif(r.expires_at <= excluded.created_at, NULL, r.body),
    created_at  = iif(r.expires_at <= excluded.created_at, excluded.created_at, r.created_at),
    lease_until = iif(r.expires_at <= excluded.created_at
                      OR (r.state = 'running' AND r.lease_until <= excluded.created_at
                          AND r.fingerprint = excluded.fingerprint),
                      excluded.lease_until, r.lease_until),
    expires_at  = iif(r.expires_at <= excluded.created_at, excluded.expires_at, r.expires_at)
RETURNING
    CASE WHEN token = ?3 THEN 'claimed'
         WHEN fingerprint <> ?2 THEN 'mismatch'
         WHEN state = 'done' THEN 'done'
         ELSE 'in_flight' END AS outcome,
    created_at <> CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
        AS taken_over,
    max(0, lease_until - CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER))
        AS lease_remaining_ms,
    status, headers, body
"#;

/// Extend the lease of the running record held with the token.
pub(super) const RENEW: &str = r#"
UPDATE idempotency_records
SET lease_until = CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?3
WHERE key = ?1 AND token = ?2 AND state = 'running'
"#;

/// Save the response on the running record held with the token (its expiry unchanged).
pub(super) const COMPLETE: &str = r#"
UPDATE idempotency_records
SET state = 'done', status = ?3, headers = ?4, body = ?5
WHERE key = ?1 AND token = ?2 AND state = 'running'
"#;

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
        live: LIVE,
        claim: CLAIM,
        renew: RENEW,
        complete: COMPLETE,
        release: RELEASE,
        sweep: SWEEP,
        check_schema: CHECK_SCHEMA,
        get: GET,
        forget: FORGET,
        stats: STATS,
    }
}
