//! The PostgreSQL store's group commit: the statements that claim, save, release and renew many
//! keys at once, and the runners that feed them (see [`batch`](crate::store::sql::batch)).
//!
//! Each statement takes its entries as arrays, one element per entry, joined back together with
//! `unnest(..) WITH ORDINALITY`, and returns one row per entry it answered, numbered, so every
//! request gets its own outcome. Per row, the rules are exactly those of the one-key statements
//! in the parent module: the claim is decided by the primary key's conflict check, every write is
//! checked against its fencing token.

use std::{collections::HashMap, sync::Arc};

use sqlx::{postgres::PgPool, Row, SqlStr};

use super::{
    queries::{take_over_sql, RELEASE},
    Codec, CHANNEL, CLAIM_ATTEMPTS,
};
use crate::store::sql::TableName;
use crate::{
    key::KeyHash,
    store::{
        sql::{self, batch::Runner, millis},
        Claim, ClaimOutcome, Fenced, FencingToken, StoreError, StoreErrorKind,
    },
};

/// How often a batch statement aborted by a deadlock or a serialization failure runs again
/// before its entries are failed with [`StoreErrorKind::Conflict`].
const CONFLICT_ATTEMPTS: usize = 3;

/// Claim many keys in one statement: the one-key claim (`claim_sql!` in `queries.rs`) with every entry's parameters in
/// arrays.
///
/// `live`, `claimed` and `existing` are the one-key statement's, joined on the entry's number
/// `n`. `live` probes the primary key once per entry (a `LATERAL` subquery the planner cannot
/// turn into a join): a plan made while the table was empty or unanalysed would otherwise hash
/// the whole table on every batch, and one generic plan serves a connection for its life. The keys of one statement are distinct (the runner sees to it), so `ON CONFLICT .. DO
/// UPDATE` never meets one row twice. The insert takes its rows in key order, so two batches
/// that share keys lock them in the same order and cannot deadlock each other.
///
/// An entry that raced with an insert committed after the snapshot returns no row, as in the
/// one-key statement; the runner claims it again in the next round.
pub(super) const CLAIM_MANY: &str = concat!(
    r#"
WITH input AS (
    SELECT *
    FROM unnest($1::bytea[], $2::bytea[], $3::uuid[], $4::bigint[], $5::bigint[])
        WITH ORDINALITY AS i(key, fingerprint, token, lease_ms, ttl_ms, n)
),
live AS (
    SELECT i.n, l.fingerprint <> i.fingerprint AS mismatch, l.state, l.status, l.headers,
           l.body, l.lease_until
    FROM input AS i
    CROSS JOIN LATERAL (
        SELECT * FROM idempotency_records AS l WHERE l.key = i.key OFFSET 0
    ) AS l
    WHERE l.expires_at > now()
      AND (l.fingerprint <> i.fingerprint OR l.state = 'done' OR l.lease_until > now())
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        i.key, i.fingerprint, i.token, 'running', now(),
        now() + i.lease_ms * interval '1 millisecond',
        now() + i.ttl_ms * interval '1 millisecond'
    FROM input AS i
    WHERE NOT EXISTS (SELECT FROM live WHERE live.n = i.n)
    ORDER BY i.key
"#,
    take_over_sql!(),
    r#"    RETURNING r.key, r.created_at <> now() AS taken_over
),
existing AS (
    SELECT i.n, e.fingerprint <> i.fingerprint AS mismatch, e.state, e.status, e.headers,
           e.body, e.lease_until
    FROM input AS i
    JOIN idempotency_records AS e ON e.key = i.key
    WHERE NOT EXISTS (SELECT FROM live WHERE live.n = i.n)
      AND NOT EXISTS (SELECT FROM claimed WHERE claimed.key = i.key)
    FOR SHARE OF e
),
found AS (
    SELECT * FROM live
    UNION ALL
    SELECT * FROM existing
)
SELECT i.n, 'claimed' AS outcome, c.taken_over, NULL::bigint AS lease_remaining_ms,
       NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body
FROM claimed AS c
JOIN input AS i ON i.key = c.key
UNION ALL
SELECT n,
       CASE WHEN mismatch THEN 'mismatch' WHEN state = 'done' THEN 'done' ELSE 'in_flight' END,
       false,
       greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint,
       status, headers, body
FROM found
"#
);

/// Save many responses, each on its running record held with its token; one row per record
/// saved, telling whether a waiter watches it.
const COMPLETE_MANY: &str = r#"
UPDATE idempotency_records AS r
SET state = 'done', status = u.status, headers = u.headers, body = u.body
FROM unnest($1::bytea[], $2::uuid[], $3::integer[], $4::bytea[], $5::bytea[])
    AS u(key, token, status, headers, body)
WHERE r.key = u.key AND r.token = u.token AND r.state = 'running'
RETURNING r.key, r.token, r.watched
"#;

/// Delete many running records, each held with its token; one row per record deleted.
const RELEASE_MANY: &str = r#"
DELETE FROM idempotency_records AS r
USING unnest($1::bytea[], $2::uuid[]) AS u(key, token)
WHERE r.key = u.key AND r.token = u.token AND r.state = 'running'
RETURNING r.key, r.token, r.watched
"#;

/// Extend many leases, each of the running record held with its token; one row per record
/// renewed.
const RENEW_MANY: &str = r#"
UPDATE idempotency_records AS r
SET lease_until = now() + u.lease_ms * interval '1 millisecond'
FROM unnest($1::bytea[], $2::uuid[], $3::bigint[]) AS u(key, token, lease_ms)
WHERE r.key = u.key AND r.token = u.token AND r.state = 'running'
RETURNING r.key, r.token, false AS watched
"#;

/// Notify the waiters of many watched records at once.
const NOTIFY_MANY: &str = "SELECT pg_notify($1, k) FROM unnest($2::text[]) AS k";

/// Runs batches of claims.
pub(super) struct Claims {
    pool: PgPool,
    /// [`CLAIM_MANY`] and the one-key release, for the store's table.
    claim_many: SqlStr,
    release: SqlStr,
}

impl Claims {
    pub(super) fn new(pool: PgPool, table: &TableName) -> Self {
        Self {
            pool,
            claim_many: table.statement(CLAIM_MANY),
            release: table.statement(RELEASE),
        }
    }
}

impl Runner for Claims {
    type Entry = Claim;
    type Output = ClaimOutcome;

    /// Rounds of [`CLAIM_MANY`], each with at most one entry per key, until every entry is
    /// answered. A later entry for a key with the fingerprint of the one that ran is answered
    /// from that outcome, as a duplicate arriving at the same instant would be: in flight behind
    /// a fresh claim (for the whole lease), or the same in-flight, mismatch or done answer. A
    /// later entry with another fingerprint, and one that raced, runs in the next round.
    async fn run(
        &self,
        claims: &[Claim],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        let mut outcomes: Vec<Option<Result<ClaimOutcome, StoreError>>> =
            claims.iter().map(|_| None).collect();
        for _ in 0..claims.len() + CLAIM_ATTEMPTS {
            let mut first_of_key: HashMap<&KeyHash, usize> = HashMap::new();
            let round: Vec<usize> = (0..claims.len())
                .filter(|&i| outcomes[i].is_none())
                .filter(|&i| first_of_key.insert(&claims[i].key, i).is_none())
                .collect();
            if round.is_empty() {
                break;
            }
            let rows = retry_conflicts(|| self.claim_many(claims, &round)).await?;
            for row in &rows {
                let n: i64 = row.try_get("n")?;
                let index = usize::try_from(n - 1)
                    .ok()
                    .and_then(|n| round.get(n))
                    .ok_or_else(|| StoreError::corrupt("the claim returned an unknown entry"))?;
                outcomes[*index] = Some(Codec::claim_outcome(row));
            }
            for i in 0..claims.len() {
                if outcomes[i].is_some() {
                    continue;
                }
                let Some(&first) = first_of_key.get(&claims[i].key) else {
                    continue;
                };
                if claims[first].fingerprint != claims[i].fingerprint {
                    continue;
                }
                if let Some(Ok(outcome)) = &outcomes[first] {
                    outcomes[i] = Some(Ok(duplicate_of(outcome, &claims[first])));
                }
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Err(super::raced())))
            .collect())
    }

    /// A claim won for a request that is gone: release it now rather than leave the key to its
    /// lease.
    fn abandoned(self: &Arc<Self>, claim: Claim, outcome: ClaimOutcome) {
        if !matches!(outcome, ClaimOutcome::Claimed { .. }) {
            return;
        }
        let (pool, release) = (self.pool.clone(), self.release.clone());
        sql::release_abandoned(async move {
            let held = Codec::held(&claim.key, claim.token)?;
            sqlx::query_with(release, held).execute(&pool).await?;
            Ok(())
        });
    }
}

/// What a duplicate of `first` (same key, same fingerprint, same batch) is answered.
fn duplicate_of(outcome: &ClaimOutcome, first: &Claim) -> ClaimOutcome {
    match outcome {
        ClaimOutcome::Claimed { .. } => ClaimOutcome::in_flight(first.lease),
        other => other.clone(),
    }
}

/// One round of [`CLAIM_MANY`] over the entries `round` of `claims`.
impl Claims {
    async fn claim_many(
        &self,
        claims: &[Claim],
        round: &[usize],
    ) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
        let picked = || round.iter().map(|&i| &claims[i]);
        let rows = sqlx::query(self.claim_many.clone())
            .bind(picked().map(|c| c.key.0).collect::<Vec<_>>())
            .bind(picked().map(|c| c.fingerprint.0).collect::<Vec<_>>())
            .bind(picked().map(|c| c.token.as_uuid()).collect::<Vec<_>>())
            .bind(picked().map(|c| millis(c.lease)).collect::<Vec<_>>())
            .bind(picked().map(|c| millis(c.ttl)).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows)
    }
}

/// Run `statement` again while the database aborts it over a conflict with a concurrent one.
async fn retry_conflicts<T, F>(mut statement: impl FnMut() -> F) -> Result<T, StoreError>
where
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 1;
    loop {
        match statement().await {
            Err(err) if err.kind() == StoreErrorKind::Conflict && attempt < CONFLICT_ATTEMPTS => {
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// One token-checked write of a held record.
#[derive(Debug)]
pub(super) struct Write {
    pub(super) key: KeyHash,
    pub(super) token: FencingToken,
    pub(super) change: Change,
}

/// What a [`Write`] does to the record.
#[derive(Debug)]
pub(super) enum Change {
    /// Save the response: status, encoded headers, body.
    Complete {
        status: i32,
        headers: Vec<u8>,
        body: bytes::Bytes,
    },
    /// Delete the record.
    Release,
    /// Extend the lease by this many milliseconds from now.
    Renew { lease_ms: i64 },
}

/// Which statement a [`Writes`] runner runs; every entry of its batches is of that kind.
#[derive(Debug, Clone, Copy)]
pub(super) enum WriteKind {
    Complete,
    Release,
    Renew,
}

/// Runs batches of token-checked writes of one kind, then notifies the waiters of the records
/// that were watched.
pub(super) struct Writes {
    pool: PgPool,
    kind: WriteKind,
    /// The statement of `kind`, for the store's table.
    statement: SqlStr,
}

impl Runner for Writes {
    type Entry = Write;
    type Output = Fenced;

    async fn run(&self, writes: &[Write]) -> Result<Vec<Result<Fenced, StoreError>>, StoreError> {
        let rows = retry_conflicts(|| self.write_many(writes)).await?;
        let mut applied: HashMap<([u8; 32], uuid::Uuid), bool> = HashMap::new();
        for row in &rows {
            let key: Vec<u8> = row.try_get("key")?;
            let key: [u8; 32] = key
                .try_into()
                .map_err(|_| StoreError::corrupt("a record's key is not 32 bytes"))?;
            applied.insert((key, row.try_get("token")?), row.try_get("watched")?);
        }
        let watched: Vec<String> = writes
            .iter()
            .filter(|w| applied.get(&(w.key.0, w.token.as_uuid())) == Some(&true))
            .map(|w| w.key.to_hex())
            .collect();
        if !watched.is_empty() {
            sqlx::query(NOTIFY_MANY)
                .bind(CHANNEL)
                .bind(watched)
                .execute(&self.pool)
                .await?;
        }
        Ok(writes
            .iter()
            .map(|w| {
                Ok(Fenced::applied_if(
                    applied.contains_key(&(w.key.0, w.token.as_uuid())),
                ))
            })
            .collect())
    }
}

impl Writes {
    pub(super) fn new(pool: PgPool, kind: WriteKind, table: &TableName) -> Self {
        let template = match kind {
            WriteKind::Complete => COMPLETE_MANY,
            WriteKind::Release => RELEASE_MANY,
            WriteKind::Renew => RENEW_MANY,
        };
        Self {
            pool,
            kind,
            statement: table.statement(template),
        }
    }

    async fn write_many(&self, writes: &[Write]) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
        let keys = || writes.iter().map(|w| w.key.0).collect::<Vec<_>>();
        let tokens = || writes.iter().map(|w| w.token.as_uuid()).collect::<Vec<_>>();
        let query = match self.kind {
            WriteKind::Complete => {
                let (mut statuses, mut headers, mut bodies) = (Vec::new(), Vec::new(), Vec::new());
                for write in writes {
                    let (status, encoded, body) = match &write.change {
                        Change::Complete {
                            status,
                            headers,
                            body,
                        } => (*status, headers.as_slice(), body.as_ref()),
                        // Never queued here: a batcher runs one kind; a stray entry saves nothing.
                        _ => (0, &[][..], &[][..]),
                    };
                    statuses.push(status);
                    headers.push(encoded);
                    bodies.push(body);
                }
                sqlx::query(self.statement.clone())
                    .bind(keys())
                    .bind(tokens())
                    .bind(statuses)
                    .bind(headers)
                    .bind(bodies)
                    .fetch_all(&self.pool)
                    .await
            }
            WriteKind::Release => {
                sqlx::query(self.statement.clone())
                    .bind(keys())
                    .bind(tokens())
                    .fetch_all(&self.pool)
                    .await
            }
            WriteKind::Renew => {
                let leases: Vec<i64> = writes
                    .iter()
                    .map(|w| match w.change {
                        Change::Renew { lease_ms } => lease_ms,
                        _ => 1,
                    })
                    .collect();
                sqlx::query(self.statement.clone())
                    .bind(keys())
                    .bind(tokens())
                    .bind(leases)
                    .fetch_all(&self.pool)
                    .await
            }
        };
        Ok(query?)
    }
}
