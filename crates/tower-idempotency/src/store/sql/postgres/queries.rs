//! The SQL of the PostgreSQL store, one statement per operation (the batched forms are in
//! `batch.rs`). Parameters are numbered (`$1`), and each statement's comment says what it binds.

/// The upsert of a claim (`INSERT INTO idempotency_records AS r .. ON CONFLICT`): a record
/// that expired is claimed afresh (any fingerprint, new `created_at` and expiry); one running
/// with a lapsed lease and the same fingerprint is taken over (new token and lease, original
/// `created_at` and expiry, the expiry moved to the new lease's end if that is later); any other
/// is left alone. Shared by the one-key claim
/// ([`claim_sql!`]) and the batched one ([`CLAIM_MANY`](super::batch::CLAIM_MANY)), so the two
/// decide alike.
macro_rules! take_over_sql {
    () => {
        concat!(
            take_over_set!(),
            r#"    watched     = r.watched AND r.expires_at > now(),
        created_at  = CASE WHEN r.expires_at <= now() THEN EXCLUDED.created_at ELSE r.created_at END,
        expires_at  = CASE WHEN r.expires_at <= now() THEN EXCLUDED.expires_at
                           ELSE GREATEST(r.expires_at, EXCLUDED.lease_until) END
    WHERE r.expires_at <= now()
       OR (r.state = 'running' AND r.lease_until <= now() AND r.fingerprint = EXCLUDED.fingerprint)
"#
        )
    };
}
pub(super) use take_over_sql;

/// The claim in one statement, with extra CTEs first (`$lock`), a condition on the writes
/// (`$gate`) and extra outcomes last (`$tail`), checked by the compiler.
///
/// `live` reads the record as this statement's snapshot sees it, without a lock. A live record
/// that cannot be claimed (another fingerprint, `done`, or `running` with a valid lease) answers
/// at once: those states hold until the record expires (a lease can only lapse, which the next
/// claim handles), so no lock is needed to report them. Replays, duplicates in flight and
/// mismatches are read-only statements: no transaction id, no WAL flush, no row lock that
/// concurrent replays of one hot key would queue on.
///
/// Otherwise `claimed` inserts the record, or overwrites it when it has expired (a fresh claim,
/// any fingerprint) or when it is running with a lapsed lease and the same fingerprint (a
/// takeover: new token and lease, original `created_at` and `expires_at`, the latter at least the
/// new lease's end). `created_at <> now()`
/// in its `RETURNING` tells a takeover from a fresh claim: a fresh claim writes `now()`, a
/// takeover keeps a `created_at` at least one lease older. The decision to run the handler is
/// made only here, under the primary key's conflict check, never by the unlocked read.
///
/// When that `WHERE` fails (another attempt changed the row after the snapshot), `ON CONFLICT`
/// has locked the latest version of the row, and `existing` reads it `FOR SHARE`: under READ
/// COMMITTED a locking read follows the row to its latest committed version. `existing` runs
/// only when `live` and `claimed` are empty (one-time filters), so it never touches a row this
/// statement wrote.
///
/// One case remains: a row inserted by a transaction that committed after the snapshot. `ON
/// CONFLICT` waits for it and sees it, but no read in this statement can: the statement returns
/// no row, and the caller runs it again with a fresh snapshot.
///
/// Its one use is [`CLAIM_LOCKED`] (single-commit mode); outside single-commit mode the store
/// claims with [`CLAIM_MANY`](super::batch::CLAIM_MANY), the same statement for many keys at once.
macro_rules! claim_sql {
    ($lock:literal, $gate:literal, $tail:literal) => {
        concat!(
            "\nWITH ",
            $lock,
            r#"
live AS (
    SELECT l.fingerprint, l.state, l.status, l.headers, l.body, l.lease_until
    FROM idempotency_records AS l
    WHERE l.key = $1
      AND l.expires_at > now()
      AND (l.fingerprint <> $2 OR l.state = 'done' OR l.lease_until > now())
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        $1, $2, $3, 'running', now(),
        now() + $4 * interval '1 millisecond',
        now() + $5 * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT FROM live)"#,
            $gate,
            "\n",
            take_over_sql!(),
            r#"    RETURNING r.created_at <> now() AS taken_over
),
existing AS (
    SELECT e.fingerprint, e.state, e.status, e.headers, e.body, e.lease_until
    FROM idempotency_records AS e
    WHERE e.key = $1 AND NOT EXISTS (SELECT FROM live) AND NOT EXISTS (SELECT FROM claimed)"#,
            $gate,
            r#"
    FOR SHARE
),
found AS (
    SELECT * FROM live
    UNION ALL
    SELECT * FROM existing
)
SELECT 'claimed' AS outcome, taken_over, NULL::bigint AS lease_remaining_ms,
       NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body
FROM claimed
UNION ALL
SELECT CASE WHEN fingerprint <> $2 THEN 'mismatch'
            WHEN state = 'done' THEN 'done'
            ELSE 'in_flight' END,
       false,
       greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint,
       status, headers, body
FROM found"#,
            $tail,
            "\n"
        )
    };
}

/// The claim of [`claim_sql!`] inside the handler's transaction, for single-commit mode: the claim is gated by a
/// transaction-scoped advisory lock on `$6` (the key hash's first eight bytes), taken without
/// waiting. The lock is the "running" marker: it is held until the transaction commits or rolls
/// back, and the uncommitted row is invisible to others. When another transaction holds it, the
/// statement answers `in_flight` (unless a committed record answers first) and writes nothing,
/// so a duplicate never waits on the uncommitted row.
pub(super) const CLAIM_LOCKED: &str = claim_sql!(
    "lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($6) AS held),",
    " AND (SELECT held FROM lock)",
    "
UNION ALL
SELECT 'in_flight', false, NULL, NULL, NULL, NULL
WHERE NOT (SELECT held FROM lock) AND NOT EXISTS (SELECT FROM live)"
);

/// Save the response on the running record held with the token (its expiry unchanged); one row
/// if the token matched, telling whether a waiter watches the record.
pub(super) const COMPLETE: &str = r#"
UPDATE idempotency_records
SET state = 'done', status = $3, headers = $4, body = $5
WHERE key = $1 AND token = $2 AND state = 'running'
RETURNING watched
"#;

/// Delete the running record held with the token; one row if the token matched, telling
/// whether a waiter watches the record.
pub(super) const RELEASE: &str = r#"
DELETE FROM idempotency_records
WHERE key = $1 AND token = $2 AND state = 'running'
RETURNING watched
"#;

/// Announce a change of a watched record to the waiters (of every instance). Inside a
/// transaction the notification goes out when it commits.
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// Mark the running record of a key as watched, so its completion or release notifies; `true`
/// when the record is still running and watched (wait for the notification), `false` when it is
/// no longer running (it changed already: claim again).
///
/// The update skips a record already watched, so a crowd of waiters on one hot key reads instead
/// of queueing on the row lock. It locks a row it updates: a completion under way finishes
/// first, and the update then finds it done and returns `false`.
pub(super) const WATCH: &str = r#"
WITH marked AS (
    UPDATE idempotency_records
    SET watched = true
    WHERE key = $1 AND state = 'running' AND NOT watched
    RETURNING 1
)
SELECT EXISTS (SELECT FROM marked)
    OR EXISTS (
        SELECT FROM idempotency_records
        WHERE key = $1 AND state = 'running' AND watched
    )
"#;

/// Delete up to `$1` expired records, skipping rows another statement holds.
pub(super) const SWEEP: &str = r#"
DELETE FROM idempotency_records
WHERE key IN (
    SELECT key FROM idempotency_records
    WHERE expires_at <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
"#;

/// Reads every column this version uses, and no row: fails when the table or a column is missing.
pub(super) const CHECK_SCHEMA: &str =
    "SELECT key, fingerprint, token, state, status, headers, body, created_at, lease_until, expires_at, watched FROM idempotency_records WHERE false";

/// Operators' read of one live record ([`Store::get`]), its times left by the database's clock.
pub(super) const GET: &str = r#"
SELECT state, status, headers, body,
    GREATEST(0, EXTRACT(EPOCH FROM (lease_until - now())) * 1000)::bigint AS lease_ms,
    GREATEST(0, EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::bigint AS expires_ms,
    GREATEST(0, EXTRACT(EPOCH FROM (now() - created_at)) * 1000)::bigint AS age_ms
FROM idempotency_records
WHERE key = $1 AND expires_at > now()
"#;

/// Operators' delete of one record, whatever its state ([`Store::forget`]).
pub(super) const FORGET: &str = "DELETE FROM idempotency_records WHERE key = $1";

/// Operators' counts by state and the oldest running record (`Store::stats`): one scan.
pub(super) const STATS: &str = r#"
SELECT counts.running, counts.done, counts.expired, oldest.key,
    (EXTRACT(EPOCH FROM (now() - oldest.created_at)) * 1000)::bigint
FROM (
    SELECT count(*) FILTER (WHERE state = 'running' AND expires_at > now()) AS running,
        count(*) FILTER (WHERE state = 'done' AND expires_at > now()) AS done,
        count(*) FILTER (WHERE expires_at <= now()) AS expired
    FROM idempotency_records
) AS counts
LEFT JOIN (
    SELECT key, created_at FROM idempotency_records
    WHERE state = 'running' AND expires_at > now()
    ORDER BY created_at, key
    LIMIT 1
) AS oldest ON true
"#;

statements! {
    /// The store's statements for its table (the batched ones are in `batch.rs`).
    struct Queries {
        claim_locked: CLAIM_LOCKED,
        complete: COMPLETE,
        watch: WATCH,
    }
}
