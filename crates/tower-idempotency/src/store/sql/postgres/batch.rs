//! The PostgreSQL store's group commit: the statements that claim, save, release, renew and read
//! many keys at once, and the runners that feed them (see [`batch`](crate::store::sql::batch)).
//!
//! Each statement takes its entries as arrays, one element per entry, joined back together with
//! `unnest(..) WITH ORDINALITY`, and returns one row per entry it answered, numbered, so every
//! request gets its own outcome. Per row, the rules are exactly those of the one-key statements
//! in the parent module: the claim is decided by the primary key's conflict check, every write is
//! checked against its fencing token.

use std::{
    collections::{hash_map::Entry, HashMap},
    sync::Arc,
};

use sqlx::{
    postgres::{PgArguments, PgConnection, PgRow},
    query::Query,
    Postgres, Row, SqlStr,
};

use super::{
    queries::{take_over_sql, RELEASE},
    BatchConnection, BatchConnections, Codec, CHANNEL, CLAIM_ATTEMPTS,
};
use crate::store::sql::{
    batch::{answers_after_rounds, duplicate_of, Runner},
    millis,
    prelude::*,
};
use crate::store::{error::StoreErrorKind, record::FencingToken};

/// How often a batch statement aborted by a deadlock or a serialization failure runs again
/// before its entries are failed with [`StoreErrorKind::Conflict`].
const CONFLICT_ATTEMPTS: usize = 3;

/// The batch's entries as rows (`input`, numbered from 1 in the order bound), ending in a comma.
macro_rules! claims_input_sql {
    () => {
        r#"input AS (
    SELECT *
    FROM unnest($1::bytea[], $2::bytea[], $3::uuid[], $4::bigint[], $5::bigint[])
        WITH ORDINALITY AS i(key, fingerprint, token, lease_ms, ttl_ms, n)
),
"#
    };
}

/// The head of the claims' insert (`claimed`), up to its `FROM input`: the claiming statement
/// adds which entries insert and what happens on a conflict.
macro_rules! insert_claims_sql {
    () => {
        r#"claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        i.key, i.fingerprint, i.token, 'running', now(),
        now() + i.lease_ms * interval '1 millisecond',
        now() + i.ttl_ms * interval '1 millisecond'
    FROM input AS i
"#
    };
}

/// The claimed entries' rows (`outcome = 'claimed'`, `taken_over` as `claimed` returned it),
/// then `UNION ALL` for the rows of the entries answered by their record.
macro_rules! claimed_rows_sql {
    () => {
        r#"SELECT i.n, 'claimed' AS outcome, c.taken_over, NULL::bigint AS lease_remaining_ms,
       NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body
FROM claimed AS c
JOIN input AS i ON i.key = c.key
UNION ALL
"#
    };
}

/// Each entry of `input` answered by its record as this statement's snapshot sees it: `done`,
/// `in_flight` or `mismatch` as a claim would answer, and `again` for a record a claim may
/// overwrite (expired, or running with a lapsed lease and the same fingerprint). An entry with
/// no record has no row. The primary key is probed once per entry (`LATERAL`), never joined.
macro_rules! answers_sql {
    () => {
        r#"SELECT i.n,
       CASE WHEN e.expires_at <= now() THEN 'again'
            WHEN e.fingerprint <> i.fingerprint THEN 'mismatch'
            WHEN e.state = 'done' THEN 'done'
            WHEN e.lease_until > now() THEN 'in_flight'
            ELSE 'again' END AS outcome,
       false AS taken_over,
       greatest(0, ceil(extract(epoch FROM e.lease_until - now()) * 1000))::bigint
           AS lease_remaining_ms,
       e.status, e.headers, e.body
FROM input AS i
CROSS JOIN LATERAL (
    SELECT * FROM idempotency_records AS e WHERE e.key = i.key OFFSET 0
) AS e
"#
    };
}

/// The claim of many keys: see [`CLAIM_MANY`].
macro_rules! claim_many_sql {
    () => {
        concat!(
            "\nWITH ",
            claims_input_sql!(),
            r#"live AS (
    SELECT i.n, l.fingerprint <> i.fingerprint AS mismatch, l.state, l.status, l.headers,
           l.body, l.lease_until
    FROM input AS i
    CROSS JOIN LATERAL (
        SELECT * FROM idempotency_records AS l WHERE l.key = i.key OFFSET 0
    ) AS l
    WHERE l.expires_at > now()
      AND (l.fingerprint <> i.fingerprint OR l.state = 'done' OR l.lease_until > now())
),
"#,
            insert_claims_sql!(),
            r#"    WHERE NOT EXISTS (SELECT FROM live WHERE live.n = i.n)
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
"#,
            claimed_rows_sql!(),
            r#"SELECT n,
       CASE WHEN mismatch THEN 'mismatch' WHEN state = 'done' THEN 'done' ELSE 'in_flight' END,
       false,
       greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint,
       status, headers, body
FROM found
"#
        )
    };
}

/// Claim many keys in one statement: the one-key claim (`claim_sql!` in `queries.rs`) with
/// every entry's parameters in arrays.
///
/// `live`, `claimed` and `existing` are the one-key statement's, joined on the entry's number
/// `n`. `live` probes the primary key once per entry (a `LATERAL` subquery the planner cannot
/// turn into a join): a plan made while the table was empty or unanalysed would otherwise hash
/// the whole table on every batch, and one generic plan serves a connection for its life.
///
/// The keys of one statement are distinct (the runner sees to it), so `ON CONFLICT .. DO
/// UPDATE` never meets one row twice. The insert takes its rows in key order, so two batches
/// that share keys lock them in the same order and cannot deadlock each other.
///
/// An entry that raced with an insert committed after the snapshot returns no row, as in the
/// one-key statement; the runner claims it again in the next round.
///
/// The rounds after a batch's first run it: the first round runs [`CLAIM_NEW_MANY`], which
/// leaves to it the records a claim may overwrite.
pub(super) const CLAIM_MANY: &str = claim_many_sql!();

/// The saves of a batch as a CTE (`saved`: each response saved on its running record held with
/// its token, numbered), put in front of the first round's claims, and their rows after the
/// claims': `outcome = 'saved'`, numbered among the saves, with the record's `watched` flag in
/// `taken_over`.
macro_rules! saved_sql {
    () => {
        r#"
saved AS (
    UPDATE idempotency_records AS s
    SET state = 'done', status = u.status, headers = u.headers, body = u.body
    FROM unnest($6::bytea[], $7::uuid[], $8::integer[], $9::bytea[], $10::bytea[])
        WITH ORDINALITY AS u(key, token, status, headers, body, n)
    WHERE s.key = u.key AND s.token = u.token AND s.state = 'running'
    RETURNING u.n, s.watched
),"#
    };
    (rows) => {
        r#"UNION ALL
SELECT n, 'saved', watched, NULL::bigint, NULL::integer, NULL::bytea, NULL::bytea
FROM saved
"#
    };
}

/// The first round's claim of many keys, with CTEs before its own (`$before`) and more rows
/// after its own (`$after`), as in [`claim_many_sql!`].
///
/// The insert comes first: `ON CONFLICT DO NOTHING` claims every key that has no record, which
/// under load is nearly every claim that reaches the store (a replay, a duplicate in flight and a
/// mismatch find a record). Only the entries it did not insert read their record, by key, as
/// this statement's snapshot sees it: `done`, `in_flight` or `mismatch` answer as the live read
/// of [`CLAIM_MANY`] would. A record the claim may overwrite (expired, or running with a lapsed
/// lease and the same fingerprint) answers `again`, and so does, by returning no row, one
/// committed after the snapshot: those entries run again in the next round with [`CLAIM_MANY`],
/// whose upsert decides the takeover. Against [`CLAIM_MANY`] a new key costs one probe of the
/// key's index instead of two, and no locking read is planned; `DO NOTHING` locks no row.
macro_rules! claim_new_many_sql {
    ($before:expr, $after:expr) => {
        concat!(
            "\nWITH ",
            $before,
            "\n",
            claims_input_sql!(),
            insert_claims_sql!(),
            r#"    ORDER BY i.key
    ON CONFLICT (key) DO NOTHING
    RETURNING r.key, false AS taken_over
)
"#,
            claimed_rows_sql!(),
            answers_sql!(),
            r#"WHERE NOT EXISTS (SELECT FROM claimed WHERE claimed.key = i.key)
"#,
            $after
        )
    };
}

/// The claims of a batch's first round ([`claim_new_many_sql!`]).
pub(super) const CLAIM_NEW_MANY: &str = claim_new_many_sql!("", "");

/// [`CLAIM_NEW_MANY`] with the saves of the same batch in front ([`saved_sql!`]), so a batch of
/// claims and saves is one statement and one commit. The runner never puts a claim and a save
/// of one key in one statement: the save runs, and the claim goes to the next round, which sees
/// the saved answer.
pub(super) const CLAIM_NEW_AND_COMPLETE_MANY: &str =
    claim_new_many_sql!(saved_sql!(), saved_sql!(rows));

/// The saves of [`CLAIM_NEW_AND_COMPLETE_MANY`] alone, for a round with no claim: a lone save (one
/// worker's batches hold one operation each) would otherwise run every claim CTE of that
/// statement on empty arrays.
const COMPLETE_MANY: &str = r#"
UPDATE idempotency_records AS s
SET state = 'done', status = u.status, headers = u.headers, body = u.body
FROM unnest($1::bytea[], $2::uuid[], $3::integer[], $4::bytea[], $5::bytea[])
    WITH ORDINALITY AS u(key, token, status, headers, body, n)
WHERE s.key = u.key AND s.token = u.token AND s.state = 'running'
RETURNING u.n, 'saved'::text AS outcome, s.watched AS taken_over
"#;

/// Delete many running records, each held with its token; one row per record deleted.
const RELEASE_MANY: &str = r#"
DELETE FROM idempotency_records AS r
USING unnest($1::bytea[], $2::uuid[]) AS u(key, token)
WHERE r.key = u.key AND r.token = u.token AND r.state = 'running'
RETURNING r.key, r.token, r.watched
"#;

/// Extend many leases, each of the running record held with its token, and the record's expiry
/// to the lease's end if it came sooner (a live holder's record does not expire); one row per
/// record renewed.
const RENEW_MANY: &str = r#"
UPDATE idempotency_records AS r
SET lease_until = now() + u.lease_ms * interval '1 millisecond',
    expires_at = GREATEST(r.expires_at, now() + u.lease_ms * interval '1 millisecond')
FROM unnest($1::bytea[], $2::uuid[], $3::bigint[]) AS u(key, token, lease_ms)
WHERE r.key = u.key AND r.token = u.token AND r.state = 'running'
RETURNING r.key, r.token, false AS watched
"#;

/// Notify the waiters of many watched records at once.
const NOTIFY_MANY: &str = "SELECT pg_notify($1, k) FROM unnest($2::text[]) AS k";

/// One operation of the batch of claims and saves.
#[derive(Debug)]
pub(super) enum Op {
    Claim(Claim),
    /// Save the response (status, encoded headers, body) on the record `hold` holds.
    Complete {
        hold: Hold,
        status: i32,
        headers: Vec<u8>,
        body: bytes::Bytes,
    },
}

/// What an [`Op`] answered.
#[derive(Debug)]
// Moved once per operation, as `ClaimOutcome` itself is (see its note).
#[allow(clippy::large_enum_variant)]
pub(super) enum Answer {
    Claim(ClaimOutcome),
    Fenced(Fenced),
}

/// Runs batches of claims and saves: the saves and the first round of claims in one statement
/// ([`CLAIM_NEW_AND_COMPLETE_MANY`]), or the claims alone ([`CLAIM_NEW_MANY`]) when nothing is
/// saved, or the saves alone ([`COMPLETE_MANY`]) when nothing is claimed; the claims of later
/// rounds with [`CLAIM_MANY`].
/// Each request waits on two commits of its own, the claim's and the save's, but a batch holds
/// both kinds, so a request shares each with the others' claims and saves alike.
pub(super) struct ClaimsAndSaves {
    connections: Arc<BatchConnections>,
    /// [`CLAIM_NEW_MANY`], [`CLAIM_NEW_AND_COMPLETE_MANY`], [`CLAIM_MANY`], [`COMPLETE_MANY`]
    /// and the one-key release, for the store's table.
    claim_new_many: SqlStr,
    claim_new_and_complete_many: SqlStr,
    claim_many: SqlStr,
    complete_many: SqlStr,
    release: SqlStr,
}

impl ClaimsAndSaves {
    pub(super) fn new(connections: Arc<BatchConnections>, table: &TableName) -> Self {
        Self {
            connections,
            claim_new_many: table.statement(CLAIM_NEW_MANY),
            claim_new_and_complete_many: table.statement(CLAIM_NEW_AND_COMPLETE_MANY),
            claim_many: table.statement(CLAIM_MANY),
            complete_many: table.statement(COMPLETE_MANY),
            release: table.statement(RELEASE),
        }
    }
}

/// The answers of one batch while its rounds run.
struct Answers<'a> {
    ops: &'a [Op],
    answers: Vec<Option<Result<Answer, StoreError>>>,
    /// The saves not run yet (all of them, until the first round).
    saves: Vec<usize>,
    /// Hex keys of saved records a waiter watches.
    watched: Vec<String>,
}

impl<'a> Answers<'a> {
    fn new(ops: &'a [Op]) -> Self {
        let saves = (0..ops.len())
            .filter(|&i| matches!(ops[i], Op::Complete { .. }))
            .collect();
        Self {
            ops,
            answers: ops.iter().map(|_| None).collect(),
            saves,
            watched: Vec::new(),
        }
    }

    fn claim(&self, i: usize) -> Option<&'a Claim> {
        match &self.ops[i] {
            Op::Claim(claim) => Some(claim),
            Op::Complete { .. } => None,
        }
    }

    /// The claims of the next round: unanswered, the first of their key, and none of a key
    /// this round saves.
    fn round(&self) -> (Vec<usize>, HashMap<&'a KeyHash, usize>) {
        let saved: Vec<&KeyHash> = self.saves.iter().map(|&i| key_of(&self.ops[i])).collect();
        let mut first_of_key = HashMap::new();
        let round = (0..self.ops.len())
            .filter(|&i| self.answers[i].is_none())
            .filter_map(|i| self.claim(i).map(|claim| (i, claim)))
            .filter(|(_, claim)| !saved.contains(&&claim.key))
            // The first claim of each key runs; `insert` would keep the last.
            .filter(|&(i, claim)| match first_of_key.entry(&claim.key) {
                Entry::Vacant(vacant) => {
                    vacant.insert(i);
                    true
                }
                Entry::Occupied(_) => false,
            })
            .map(|(i, _)| i)
            .collect();
        (round, first_of_key)
    }

    /// Take the rows of a round's statement; a save with no row lost its token, a claim
    /// answered `again` runs in the next round.
    fn take(&mut self, rows: &[PgRow], round: &[usize]) -> Result<(), StoreError> {
        let unknown = || StoreError::corrupt("the batch returned an unknown entry");
        for row in rows {
            let n = usize::try_from(row.try_get::<i64, _>("n")? - 1).map_err(|_| unknown())?;
            let outcome: &str = row.try_get("outcome")?;
            if outcome == "again" {
                continue;
            }
            if outcome == "saved" {
                let i = *self.saves.get(n).ok_or_else(unknown)?;
                if row.try_get("taken_over")? {
                    self.watched.push(key_of(&self.ops[i]).to_hex());
                }
                self.answers[i] = Some(Ok(Answer::Fenced(Fenced::Applied)));
            } else {
                let i = *round.get(n).ok_or_else(unknown)?;
                self.answers[i] = Some(Codec::claim_outcome(row).map(Answer::Claim));
            }
        }
        for i in std::mem::take(&mut self.saves) {
            self.answers[i].get_or_insert(Ok(Answer::Fenced(Fenced::Lost)));
        }
        Ok(())
    }

    /// A later claim of a round's key with the fingerprint of the one that ran is answered from
    /// that outcome, as a duplicate arriving at the same instant would be.
    fn answer_duplicates(&mut self, first_of_key: &HashMap<&KeyHash, usize>) {
        for i in 0..self.ops.len() {
            let Some(claim) = self.claim(i).filter(|_| self.answers[i].is_none()) else {
                continue;
            };
            let Some(&first) = first_of_key.get(&claim.key) else {
                continue;
            };
            let Some(first_claim) = self.claim(first) else {
                continue;
            };
            if first_claim.fingerprint != claim.fingerprint {
                continue;
            }
            if let Some(Ok(Answer::Claim(outcome))) = &self.answers[first] {
                let duplicate = duplicate_of(outcome, first_claim);
                self.answers[i] = Some(Ok(Answer::Claim(duplicate)));
            }
        }
    }
}

fn key_of(op: &Op) -> &KeyHash {
    match op {
        Op::Complete { hold, .. } => &hold.key,
        Op::Claim(claim) => &claim.key,
    }
}

impl Runner for ClaimsAndSaves {
    type Entry = Op;
    type Output = Answer;

    /// Rounds of statements, each with at most one claim per key, until every operation is
    /// answered; the first round also runs every save. A later claim for a key with the
    /// fingerprint of the one that ran is answered from that outcome: in flight behind a fresh
    /// claim (for the whole lease), or the same in-flight, mismatch or done answer. A later claim
    /// with another fingerprint, one of a key saved in the same round, and one that raced, runs
    /// in the next round.
    ///
    /// Each round commits on its own. When a later round fails, what the earlier ones answered
    /// stands (those claims and saves are in the table) and only the operations still unanswered
    /// get the error; a failed notification after the rounds leaves every answer standing, and
    /// the waiters it would have woken find the change at their next poll.
    async fn run(&self, ops: &[Op]) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
        let mut answers = Answers::new(ops);
        let mut connection = self.connections.acquire().await?;
        let mut failed = None;
        for attempt in 0..ops.len() + CLAIM_ATTEMPTS {
            let (round, first_of_key) = answers.round();
            if round.is_empty() && answers.saves.is_empty() {
                break;
            }
            let saves = answers.saves.clone();
            let statement = || self.statement(ops, &round, &saves, attempt == 0);
            let taken = match fetch_all_retrying(&mut connection, statement).await {
                Ok(rows) => answers.take(&rows, &round),
                Err(err) => Err(err),
            };
            if let Err(err) = taken {
                failed = Some(err);
                break;
            }
            answers.answer_duplicates(&first_of_key);
        }
        let failed = match failed {
            Some(err) if answers.answers.iter().all(Option::is_none) => return Err(err),
            Some(err) => Some(err),
            None => notify(&mut connection, std::mem::take(&mut answers.watched))
                .await
                .err()
                .inspect(|err| {
                    tracing::warn!(target: "tower_idempotency", error = %err, "the batch's claims and saves are committed, but notifying their waiters failed; they find the change at their next poll");
                }),
        };
        if failed.is_some() {
            // The connection is not parked: it may be broken, and so may the idle ones.
            self.connections.failed();
        } else {
            self.connections.park(connection);
        }
        Ok(answers_after_rounds(
            answers.answers,
            failed.as_ref(),
            super::raced,
        ))
    }

    /// A claim won for a request that is gone: release it now rather than leave the key to its
    /// lease.
    fn abandoned(self: &Arc<Self>, op: Op, answer: Answer) {
        let (Op::Claim(claim), Answer::Claim(ClaimOutcome::Claimed { .. })) = (op, answer) else {
            return;
        };
        let (pool, release) = (self.connections.pool().clone(), self.release.clone());
        sql::release_abandoned(async move {
            let held = Codec::held(&claim.hold())?;
            sqlx::query_with(release, held).execute(&pool).await?;
            Ok(())
        });
    }

    fn failed(&self) {
        self.connections.failed();
    }

    fn refusable(op: &Op) -> bool {
        matches!(op, Op::Claim(_))
    }

    fn bytes(op: &Op) -> usize {
        match op {
            Op::Claim(_) => 0,
            Op::Complete { headers, body, .. } => headers.len() + body.len(),
        }
    }
}

impl ClaimsAndSaves {
    /// One round's statement: the claims `round` of `ops`, with the saves `saves` when there
    /// are any (the first round only).
    fn statement<'q>(
        &self,
        ops: &'q [Op],
        round: &[usize],
        saves: &[usize],
        first_round: bool,
    ) -> PgQuery<'q> {
        let claims = || {
            round.iter().filter_map(|&i| match &ops[i] {
                Op::Claim(claim) => Some(claim),
                Op::Complete { .. } => None,
            })
        };
        if round.is_empty() {
            return bind_saves(sqlx::query(self.complete_many.clone()), ops, saves);
        }
        let statement = match (first_round, saves.is_empty()) {
            (false, _) => self.claim_many.clone(),
            (true, true) => self.claim_new_many.clone(),
            (true, false) => self.claim_new_and_complete_many.clone(),
        };
        let mut query = sqlx::query(statement)
            .bind(claims().map(|c| c.key.0).collect::<Vec<_>>())
            .bind(claims().map(|c| c.fingerprint.0).collect::<Vec<_>>())
            .bind(claims().map(|c| c.token.as_uuid()).collect::<Vec<_>>())
            .bind(claims().map(|c| millis(c.lease)).collect::<Vec<_>>())
            .bind(claims().map(|c| millis(c.ttl)).collect::<Vec<_>>());
        if !saves.is_empty() {
            query = bind_saves(query, ops, saves);
        }
        query
    }
}

/// Bind the saves `saves` of `ops` as the next five parameters: [`CLAIM_NEW_AND_COMPLETE_MANY`]'s `$6`
/// to `$10`, [`COMPLETE_MANY`]'s `$1` to `$5`.
fn bind_saves<'q>(query: PgQuery<'q>, ops: &'q [Op], saves: &[usize]) -> PgQuery<'q> {
    let (mut keys, mut tokens, mut statuses, mut headers, mut bodies) =
        (vec![], vec![], vec![], vec![], vec![]);
    for &i in saves {
        if let Op::Complete {
            hold,
            status,
            headers: encoded,
            body,
        } = &ops[i]
        {
            keys.push(hold.key.0);
            tokens.push(hold.token.as_uuid());
            statuses.push(*status);
            headers.push(encoded.as_slice());
            bodies.push(body.as_ref());
        }
    }
    query
        .bind(keys)
        .bind(tokens)
        .bind(statuses)
        .bind(headers)
        .bind(bodies)
}

/// A batch statement with its arrays bound.
type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// Tell the waiters of the `watched` records (hex keys) that they changed.
async fn notify(connection: &mut PgConnection, watched: Vec<String>) -> Result<(), StoreError> {
    if !watched.is_empty() {
        sqlx::query(NOTIFY_MANY)
            .bind(CHANNEL)
            .bind(watched)
            .execute(connection)
            .await?;
    }
    Ok(())
}

/// Run the statement `query` makes, again while the database aborts it over a conflict with a
/// concurrent one (nothing was written; the connection stays usable).
async fn fetch_all_retrying<'q>(
    connection: &mut BatchConnection,
    query: impl Fn() -> PgQuery<'q>,
) -> Result<Vec<PgRow>, StoreError> {
    let mut attempt = 1;
    loop {
        match query()
            .fetch_all(&mut **connection)
            .await
            .map_err(StoreError::from)
        {
            Err(err) if err.kind() == StoreErrorKind::Conflict && attempt < CONFLICT_ATTEMPTS => {
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// What many claims would be answered by the records as they are committed, without claiming:
/// [`answers_sql!`] over the entries' keys and fingerprints.
const READ_MANY: &str = concat!(
    r#"
WITH input AS (
    SELECT *
    FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS i(key, fingerprint, n)
)
"#,
    answers_sql!(),
    "WHERE e.expires_at > now()\n"
);

/// Runs batches of reads (single-commit mode's look before it begins a transaction): each
/// claim's answer from a committed record (replay, mismatch, in flight), or `None` where only a
/// claim can answer (no record, an expired one, a lapsed lease). A read holds no lock and
/// commits nothing, so it needs no undoing and a lone one runs in its request's task.
pub(super) struct Reads {
    connections: Arc<BatchConnections>,
    /// [`READ_MANY`] for the store's table.
    statement: SqlStr,
}

impl Reads {
    pub(super) fn new(connections: Arc<BatchConnections>, table: &TableName) -> Self {
        Self {
            connections,
            statement: table.statement(READ_MANY),
        }
    }
}

impl Runner for Reads {
    type Entry = Claim;
    type Output = Option<ClaimOutcome>;
    const INLINE_WHEN_IDLE: bool = true;

    async fn run(
        &self,
        claims: &[Claim],
    ) -> Result<Vec<Result<Option<ClaimOutcome>, StoreError>>, StoreError> {
        let mut connection = self.connections.acquire().await?;
        let rows = sqlx::query(self.statement.clone())
            .bind(claims.iter().map(|c| c.key.0).collect::<Vec<_>>())
            .bind(claims.iter().map(|c| c.fingerprint.0).collect::<Vec<_>>())
            .fetch_all(&mut *connection)
            .await?;
        self.connections.park(connection);
        let mut answers: Vec<Option<ClaimOutcome>> = vec![None; claims.len()];
        for row in &rows {
            let n = usize::try_from(row.try_get::<i64, _>("n")? - 1).ok();
            let answer = n
                .and_then(|n| answers.get_mut(n))
                .ok_or_else(|| StoreError::corrupt("the batch returned an unknown entry"))?;
            if row.try_get::<&str, _>("outcome")? != "again" {
                *answer = Some(Codec::claim_outcome(row)?);
            }
        }
        Ok(answers.into_iter().map(Ok).collect())
    }

    fn failed(&self) {
        self.connections.failed();
    }
}

/// One token-checked write of a held record.
#[derive(Debug)]
pub(super) struct Write {
    /// The record, and the token it must still carry.
    pub(super) hold: Hold,
    pub(super) change: Change,
}

/// What a [`Write`] does to the record.
#[derive(Debug)]
pub(super) enum Change {
    /// Delete the record.
    Release,
    /// Extend the lease by this many milliseconds from now.
    Renew { lease_ms: i64 },
}

/// Which statement a [`Writes`] runner runs; every entry of its batches is of that kind.
#[derive(Debug, Clone, Copy)]
pub(super) enum WriteKind {
    Release,
    Renew,
}

/// Runs batches of token-checked writes of one kind, then notifies the waiters of the records
/// that were watched.
pub(super) struct Writes {
    connections: Arc<BatchConnections>,
    kind: WriteKind,
    /// The statement of `kind`, for the store's table.
    statement: SqlStr,
}

impl Runner for Writes {
    type Entry = Write;
    type Output = Fenced;

    async fn run(&self, writes: &[Write]) -> Result<Vec<Result<Fenced, StoreError>>, StoreError> {
        let mut connection = self.connections.acquire().await?;
        let rows = fetch_all_retrying(&mut connection, || self.write_many(writes)).await?;
        let mut applied: HashMap<Hold, bool> = HashMap::new();
        for row in &rows {
            let key = sql::stored_key(row.try_get("key")?)?;
            let token = FencingToken::from_uuid(row.try_get("token")?);
            applied.insert(Hold::new(key, token), row.try_get("watched")?);
        }
        let watched: Vec<String> = writes
            .iter()
            .filter(|w| applied.get(&w.hold) == Some(&true))
            .map(|w| w.hold.key.to_hex())
            .collect();
        // The writes are committed (autocommit): a failed notification does not undo them, so
        // each write keeps its answer, as the claims and saves do.
        match notify(&mut connection, watched).await {
            Ok(()) => self.connections.park(connection),
            Err(err) => {
                tracing::warn!(target: "tower_idempotency", error = %err, "the batch's releases or renewals are committed, but notifying their waiters failed; they find the change at their next poll");
                self.connections.failed();
            }
        }
        Ok(writes
            .iter()
            .map(|w| Ok(Fenced::applied_if(applied.contains_key(&w.hold))))
            .collect())
    }

    fn failed(&self) {
        self.connections.failed();
    }

    /// Releases and renewals of claims already made.
    fn refusable(_: &Write) -> bool {
        false
    }
}

impl Writes {
    pub(super) fn new(
        connections: Arc<BatchConnections>,
        kind: WriteKind,
        table: &TableName,
    ) -> Self {
        let template = match kind {
            WriteKind::Release => RELEASE_MANY,
            WriteKind::Renew => RENEW_MANY,
        };
        Self {
            connections,
            kind,
            statement: table.statement(template),
        }
    }

    fn write_many<'q>(&self, writes: &'q [Write]) -> PgQuery<'q> {
        let query = sqlx::query(self.statement.clone())
            .bind(writes.iter().map(|w| w.hold.key.0).collect::<Vec<_>>())
            .bind(
                writes
                    .iter()
                    .map(|w| w.hold.token.as_uuid())
                    .collect::<Vec<_>>(),
            );
        match self.kind {
            WriteKind::Release => query,
            WriteKind::Renew => query.bind(
                writes
                    .iter()
                    .map(|w| match w.change {
                        Change::Renew { lease_ms } => lease_ms,
                        // Never queued here: a batcher runs one kind of write.
                        Change::Release => 1,
                    })
                    .collect::<Vec<_>>(),
            ),
        }
    }
}
