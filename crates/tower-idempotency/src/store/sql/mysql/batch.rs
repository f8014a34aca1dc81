//! The MySQL store's batched reads: the consistent reads of concurrent claims, which answer
//! replays, duplicates in flight and mismatches, as one `SELECT .. WHERE key IN (..)` on one
//! connection (see [`batch`](crate::store::sql::batch) and
//! [`live_many`]).
//!
//! Only the reads are batched: the claim's write reports its outcome through `LAST_INSERT_ID`,
//! one value per statement, so each claim the read leaves open runs `CLAIM` on its own, as
//! before. The first of them runs it on the read's connection, which the read hands over
//! instead of returning it to the pool (a checkout costs sqlx a ping each way), so a lone
//! request pays the same round trips as an unbatched claim.
//!
//! Each claim is judged by its own fingerprint against the row of its key, exactly as its own
//! read would judge it: claims of one key in one batch (a retry and a reused key with another
//! body) each get their own answer. A read writes nothing, so a batch has nothing to undo.

use std::collections::{HashMap, HashSet};

use sqlx::{
    mysql::{MySql, MySqlArguments, MySqlPool, MySqlRow},
    pool::PoolConnection,
    Arguments, Row, SqlStr,
};

use super::{detached, queries::live_many, Codec};
use crate::store::sql::{batch::Runner, prelude::*};

/// The most keys one read binds: a larger [`Batching::max_batch`] is cut to this for the
/// reads, well below MySQL's 65,535 parameters per statement.
const MAX_READ_KEYS: usize = 1024;

/// What a claim's read found.
#[derive(Debug)]
// Moved once per claim, as `ClaimOutcome` itself is (see its note).
#[allow(clippy::large_enum_variant)]
pub(super) enum Read {
    /// A live record answers the claim: no write.
    Answered(ClaimOutcome),
    /// Nothing answers it: the claim goes to `CLAIM`, on this connection if the read handed it
    /// over (the first such claim of each batch).
    Claimable(Option<PoolConnection<MySql>>),
}

/// Runs batches of the claims' lock-free reads ([`live_many`]).
pub(super) struct Reads {
    pool: MySqlPool,
    /// The read for 1, 2, 4 .. keys.
    statements: Vec<SqlStr>,
}

impl Reads {
    /// The reads of `table` on `pool`, and the batching they run with: `batching`, its largest
    /// batch cut to [`MAX_READ_KEYS`].
    pub(super) fn new(pool: MySqlPool, table: &TableName, batching: Batching) -> (Self, Batching) {
        let max = batching.max_batch_size().min(MAX_READ_KEYS);
        let reads = Reads {
            pool,
            statements: live_many(table, max),
        };
        (reads, batching.max_batch(max))
    }

    /// The read of `keys` (distinct), padded with the last key up to its statement's size.
    fn statement(&self, keys: &[KeyHash]) -> Result<(SqlStr, MySqlArguments), StoreError> {
        let size = keys.len().next_power_of_two();
        let statement = self
            .statements
            .get(size.trailing_zeros() as usize)
            .ok_or_else(|| StoreError::corrupt("a read batch larger than its statements"))?;
        let mut arguments = MySqlArguments::default();
        let last = keys.last().into_iter().cycle();
        for key in keys.iter().chain(last).take(size) {
            arguments
                .add(key.as_bytes().as_slice())
                .map_err(sqlx::Error::Encode)?;
        }
        Ok((statement.clone(), arguments))
    }
}

impl Runner for Reads {
    type Entry = Claim;
    type Output = Read;

    /// Reads write nothing: one that finds nothing queued runs in the request's own task (its
    /// statement still in a task of its own, see `detached`).
    const INLINE_WHEN_IDLE: bool = true;

    async fn run(&self, claims: &[Claim]) -> Result<Vec<Result<Read, StoreError>>, StoreError> {
        let mut keys = Vec::with_capacity(claims.len());
        let mut seen = HashSet::with_capacity(claims.len());
        for claim in claims {
            if seen.insert(claim.key) {
                keys.push(claim.key);
            }
        }
        let (statement, arguments) = self.statement(&keys)?;
        let pool = self.pool.clone();
        // In a task of its own, so a batch timeout or a dropped request never stops the
        // statement halfway through MySQL's protocol.
        let (rows, conn) = detached(async move {
            // An idle connection as it is, without the checkout ping (a round trip): every idle
            // connection was pinged when it went back. A read is safe to run again, so one that
            // died while idle costs its read a second try on a connection checked out as the
            // pool's options say.
            if let Some(mut conn) = pool.try_acquire() {
                let read = sqlx::query_with(statement.clone(), arguments.clone());
                if let Ok(rows) = read.fetch_all(&mut *conn).await {
                    return Ok((rows, conn));
                }
            }
            let mut conn = pool.acquire().await?;
            let rows = sqlx::query_with(statement, arguments)
                .fetch_all(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>((rows, conn))
        })
        .await?;
        answer(claims, &rows, conn)
    }
}

/// Each claim's answer from the rows of the live records of the batch's keys; the connection to
/// the first claim no row answers.
fn answer(
    claims: &[Claim],
    rows: &[MySqlRow],
    conn: PoolConnection<MySql>,
) -> Result<Vec<Result<Read, StoreError>>, StoreError> {
    let mut found = HashMap::with_capacity(rows.len());
    for row in rows {
        found.insert(sql::stored_key(row.try_get("key")?)?, row);
    }
    let mut conn = Some(conn);
    Ok(claims
        .iter()
        .map(|claim| {
            let live = match found.get(&claim.key) {
                Some(row) => judge(claim, row)?,
                None => None,
            };
            Ok(match live {
                Some(outcome) => Read::Answered(outcome),
                None => Read::Claimable(conn.take()),
            })
        })
        .collect())
}

/// What the live record in `row` answers `claim`, as the one-key read did: another fingerprint
/// is a mismatch whatever the state; with the claim's own, `done` replays and a valid lease is
/// in flight; a lapsed lease answers nothing (the claim's write takes it over).
fn judge(claim: &Claim, row: &MySqlRow) -> Result<Option<ClaimOutcome>, StoreError> {
    let fingerprint: &[u8] = row.try_get("fingerprint")?;
    if fingerprint != claim.fingerprint.as_bytes().as_slice() {
        return Ok(Some(ClaimOutcome::Mismatch));
    }
    match row.try_get::<Option<&str>, _>("outcome")? {
        Some(_) => Codec::claim_outcome(row).map(Some),
        None => Ok(None),
    }
}
