//! The SQLite store's group commit: every write of concurrent requests (claims, saves, releases,
//! renewals) in one `BEGIN IMMEDIATE .. COMMIT`, sent to SQLite's thread as one statement list
//! (see [`batch`](crate::store::sql::batch) and [`BATCH`](super::queries::BATCH)).
//!
//! SQLite runs one writer at a time, and what a write costs is mostly the commit (a journal sync)
//! and the hold of the file's write lock. sqlx runs each statement on the connection's own thread,
//! one hop there and back per statement; a batch run statement by statement would hold the write
//! lock across every hop, and every other writer (the handler's own inserts too) would wait that
//! long. So a batch is one hop: the entries of each kind go in as one JSON array, and SQLite
//! begins, writes every entry, and commits before it answers.
//!
//! Within a batch, saves, releases and renewals run before the claims, so a claim of a key saved
//! in the same batch sees the saved answer. Two claims of one key never share a round: the first
//! runs, a later one with the same fingerprint is answered as a duplicate arriving at the same
//! instant (in flight behind a fresh claim, or the first one's answer), and one with another
//! fingerprint runs in the next round, after the first one's commit.

use std::{collections::HashMap, fmt::Write as _, sync::Arc};

use sqlx::{
    sqlite::{Sqlite, SqliteRow},
    Row, SqlStr,
};

use super::{checkpoint::Checkpointer, queries::Queries, BatchConnections, Codec};
use crate::key::push_hex;
use crate::store::sql::{
    batch::{answers_after_rounds, duplicate_of, Runner},
    millis,
    prelude::*,
};
use crate::store::{
    error::StoreErrorKind,
    record::FencingToken,
    writers::{self, WriterQueue},
};

/// How many rounds a batch runs at most beyond one per entry (a claim that finds its answer
/// neither read nor written is retried; it cannot happen inside one transaction, but a bound
/// keeps a surprise from looping).
const EXTRA_ROUNDS: usize = 2;

/// One write queued for a batch.
#[derive(Debug)]
pub(super) enum Write {
    Claim(Claim),
    Complete {
        hold: Hold,
        response: StoredResponse,
    },
    Release(Hold),
    Renew {
        hold: Hold,
        lease: std::time::Duration,
    },
}

/// What a [`Write`] answered.
#[derive(Debug)]
// Moved once per write, as `ClaimOutcome` itself is (see its note).
#[allow(clippy::large_enum_variant)]
pub(super) enum Written {
    Claim(ClaimOutcome),
    Fenced(Fenced),
}

/// Runs batches of the lock-free reads that answer replays, duplicates in flight and
/// mismatches ([`LIVE_MANY`](super::queries::LIVE_MANY)): one hop to SQLite's thread for all
/// the claims that queued meanwhile, on any connection, beside the writers.
pub(super) struct Reads {
    pub(super) connections: Arc<BatchConnections>,
    pub(super) queries: Arc<Queries>,
}

impl Runner for Reads {
    type Entry = Claim;
    /// `None`: no live record answers the claim; it goes to the writes.
    type Output = Option<ClaimOutcome>;

    const INLINE_WHEN_IDLE: bool = true;

    fn failed(&self) {
        self.connections.failed();
    }

    async fn run(
        &self,
        claims: &[Claim],
    ) -> Result<Vec<Result<Option<ClaimOutcome>, StoreError>>, StoreError> {
        let mut json = String::from("{\"c\":[");
        for claim in claims {
            if !json.ends_with('[') {
                json.push(',');
            }
            json.push('{');
            push_claim_key(&mut json, claim);
            json.push('}');
        }
        json.push_str("]}");
        let mut conn = self.connections.acquire().await?;
        let rows = sqlx::query(self.queries.live_many.clone())
            .bind(json)
            .fetch_all(&mut *conn)
            .await?;
        self.connections.park(conn);
        let mut outcomes: Vec<Result<Option<ClaimOutcome>, StoreError>> =
            claims.iter().map(|_| Ok(None)).collect();
        for row in &rows {
            let n = usize::try_from(row.try_get::<i64, _>("n")?)
                .ok()
                .filter(|&n| n < outcomes.len())
                .ok_or_else(|| StoreError::corrupt("the read returned an unknown entry"))?;
            outcomes[n] = Codec::claim_outcome(row).map(Some);
        }
        Ok(outcomes)
    }
}

/// Runs batches of writes in one transaction each.
pub(super) struct Writes {
    pub(super) connections: Arc<BatchConnections>,
    pub(super) checkpoints: Arc<Checkpointer>,
    /// The store's statements, for its table.
    pub(super) queries: Arc<Queries>,
    /// The batch's statement list for each set of kinds of write ([`batches`](super::queries::batches)).
    pub(super) batches: Vec<SqlStr>,
    pub(super) writers: WriterQueue<Sqlite>,
    /// Called with the key of every applied save or release once it is committed.
    pub(super) announce: Arc<dyn Fn(&KeyHash) + Send + Sync>,
}

impl Runner for Writes {
    type Entry = Write;
    type Output = Written;

    /// Rounds of [`BATCH`](super::queries::BATCH) until every write is answered: the first
    /// holds every save, release and renewal and the first claim of each key. Each round is a
    /// transaction of its own: a failed round writes nothing, and what the rounds before it
    /// committed stands (only the writes still unanswered get the error).
    async fn run(&self, writes: &[Write]) -> Result<Vec<Result<Written, StoreError>>, StoreError> {
        let mut answers: Vec<Option<Written>> = writes.iter().map(|_| None).collect();
        let mut fenced_done = false;
        let mut failed = None;
        for _ in 0..writes.len() + EXTRA_ROUNDS {
            let round = Round::of(writes, &answers, !fenced_done);
            if round.is_empty() {
                break;
            }
            let answered = match self.run_round(&round).await {
                Ok(rows) => round.answer(writes, &rows, &mut answers),
                Err(err) => Err(err),
            };
            if let Err(err) = answered {
                failed = Some(err);
                break;
            }
            fenced_done = true;
        }
        if let Some(err) = failed.take_if(|_| answers.iter().all(Option::is_none)) {
            return Err(err);
        }
        if failed.is_some() {
            self.connections.failed();
        }
        for (write, answer) in writes.iter().zip(&answers) {
            if let (
                Write::Complete { hold, .. } | Write::Release(hold),
                Some(Written::Fenced(Fenced::Applied)),
            ) = (write, answer)
            {
                (self.announce)(&hold.key);
            }
        }
        let left = || {
            StoreError::new(
                StoreErrorKind::Backend,
                "a batched write was left unanswered",
            )
        };
        Ok(answers_after_rounds(
            answers.into_iter().map(|answer| answer.map(Ok)),
            failed.as_ref(),
            left,
        ))
    }

    fn failed(&self) {
        self.connections.failed();
    }

    fn refusable(write: &Write) -> bool {
        matches!(write, Write::Claim(_))
    }

    /// A saved body travels as hex in the batch's JSON: two bytes a byte.
    fn bytes(write: &Write) -> usize {
        match write {
            Write::Complete { response, .. } => 2 * response.body.len(),
            _ => 0,
        }
    }

    /// A claim won for a request that is gone: release it now rather than leave the key to its
    /// lease.
    fn abandoned(self: &Arc<Self>, write: Write, written: Written) {
        let (Write::Claim(claim), Written::Claim(ClaimOutcome::Claimed { .. })) = (write, written)
        else {
            return;
        };
        let writes = self.clone();
        // On the batches' own connections, free while the writer queue is held: never waiting
        // on the application's pool with the queue held.
        sql::release_abandoned(async move {
            let turn = writes.writers.turn().await;
            let held = Codec::held(&claim.hold())?;
            let mut conn = writes.connections.acquire().await?;
            sqlx::query_with(writes.queries.release.clone(), held)
                .execute(&mut *conn)
                .await?;
            writes.connections.park(conn);
            // A commit as a batch's: it counts toward the next checkpoint, and the next writer
            // goes on.
            writes.checkpoints.committed();
            drop(turn);
            writers::yield_to_next_writer().await;
            Ok(())
        });
    }
}

impl Writes {
    /// One round in one transaction, on one connection, in one hop; a round that fails is rolled
    /// back (or its connection closed), so nothing of it stays.
    async fn run_round(&self, round: &Round) -> Result<Vec<SqliteRow>, StoreError> {
        let turn = self.writers.turn().await;
        let ran = self.run_round_on_turn(round).await;
        drop(turn);
        writers::yield_to_next_writer().await;
        ran
    }

    /// The round itself, while [`run_round`](Self::run_round) holds the writer queue.
    async fn run_round_on_turn(&self, round: &Round) -> Result<Vec<SqliteRow>, StoreError> {
        let mut conn = self.connections.acquire().await?;
        conn.transaction_begun();
        let rows = sqlx::query(self.batches[round.kinds].clone())
            .bind(&round.json)
            .fetch_all(&mut *conn)
            .await;
        match rows {
            Ok(rows) => {
                conn.transaction_ended();
                self.connections.park(conn);
                self.checkpoints.committed();
                Ok(rows)
            }
            Err(err) => {
                // The statement list stopped part way, inside its transaction; a connection
                // that cannot roll it back is closed, which does.
                if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_ok() {
                    conn.transaction_ended();
                    self.connections.park(conn);
                }
                Err(err.into())
            }
        }
    }
}

/// The entries of one round: each kind's JSON array, and which write each element is.
struct Round {
    /// The batch's one parameter: `{"s": saves, "r": releases, "n": renewals, "c": claims}`.
    json: String,
    /// Which of those arrays hold entries (bit 0 saves .. bit 3 claims).
    kinds: usize,
    /// The writes behind the claims' array, in its order.
    claims: Vec<usize>,
    /// The first claim of each key in this round.
    first_of_key: HashMap<KeyHash, usize>,
    /// The token-checked writes of this round, by their array (0 saves, 1 releases, 2
    /// renewals), key and token: a run's save and renewal, or two renewals, may share a batch.
    fenced: HashMap<(usize, KeyHash, FencingToken), Vec<usize>>,
}

impl Round {
    /// The unanswered writes: every save, release and renewal when `with_fenced`, and the first
    /// unanswered claim of each key.
    fn of(writes: &[Write], answers: &[Option<Written>], with_fenced: bool) -> Self {
        let mut arrays: [String; 4] = Default::default();
        let mut round = Round {
            json: String::new(),
            kinds: 0,
            claims: Vec::new(),
            first_of_key: HashMap::new(),
            fenced: HashMap::new(),
        };
        for (i, write) in writes.iter().enumerate() {
            if answers[i].is_some() {
                continue;
            }
            let (array, hold) = match write {
                Write::Claim(claim) => {
                    if round.first_of_key.contains_key(&claim.key) {
                        continue;
                    }
                    round.first_of_key.insert(claim.key, i);
                    round.claims.push(i);
                    (3, claim.hold())
                }
                _ if !with_fenced => continue,
                Write::Complete { hold, .. } => (0, *hold),
                Write::Release(hold) => (1, *hold),
                Write::Renew { hold, .. } => (2, *hold),
            };
            if array != 3 {
                round
                    .fenced
                    .entry((array, hold.key, hold.token))
                    .or_default()
                    .push(i);
            }
            round.kinds |= 1 << array;
            let out = &mut arrays[array];
            out.push(if out.is_empty() { '[' } else { ',' });
            push_entry(out, write);
        }
        for (name, mut array) in ["s", "r", "n", "c"].into_iter().zip(arrays) {
            array.push_str(if array.is_empty() { "[]" } else { "]" });
            round
                .json
                .push(if round.json.is_empty() { '{' } else { ',' });
            let _ = write!(round.json, "\"{name}\":{array}");
        }
        round.json.push('}');
        round
    }

    fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.fenced.is_empty()
    }

    /// Answer the writes of this round from its rows. A token-checked write with no row did not
    /// apply.
    fn answer(
        &self,
        writes: &[Write],
        rows: &[SqliteRow],
        answers: &mut [Option<Written>],
    ) -> Result<(), StoreError> {
        let unknown = || StoreError::corrupt("the batch returned an unknown entry");
        for &i in self.fenced.values().flatten() {
            answers[i] = Some(Written::Fenced(Fenced::Lost));
        }
        for row in rows {
            let kind: &str = row.try_get("kind")?;
            match kind {
                "live" => {
                    let n = usize::try_from(row.try_get::<i64, _>("n")?).map_err(|_| unknown())?;
                    let i = *self.claims.get(n).ok_or_else(unknown)?;
                    answers[i] = Some(Written::Claim(Codec::claim_outcome(row)?));
                }
                "claimed" => {
                    let i = *self.first_of_key.get(&key_of(row)?).ok_or_else(unknown)?;
                    let taken_over = row.try_get("taken_over")?;
                    answers[i] = Some(Written::Claim(ClaimOutcome::Claimed { taken_over }));
                }
                fenced => {
                    let array = match fenced {
                        "saved" => 0,
                        "released" => 1,
                        _ => 2,
                    };
                    let token = FencingToken::from_uuid(row.try_get("token")?);
                    let writes = self
                        .fenced
                        .get(&(array, key_of(row)?, token))
                        .ok_or_else(unknown)?;
                    for &i in writes {
                        answers[i] = Some(Written::Fenced(Fenced::Applied));
                    }
                }
            }
        }
        self.answer_duplicates(writes, answers);
        Ok(())
    }

    /// A later claim of a round's key with the first one's fingerprint is answered from the
    /// first one's outcome, as a duplicate arriving at the same instant would be.
    fn answer_duplicates(&self, writes: &[Write], answers: &mut [Option<Written>]) {
        for (i, write) in writes.iter().enumerate() {
            let Write::Claim(claim) = write else { continue };
            if answers[i].is_some() {
                continue;
            }
            let Some(&first) = self.first_of_key.get(&claim.key) else {
                continue;
            };
            let (Write::Claim(first_claim), Some(Written::Claim(outcome))) =
                (&writes[first], &answers[first])
            else {
                continue;
            };
            if first_claim.fingerprint == claim.fingerprint {
                answers[i] = Some(Written::Claim(duplicate_of(outcome, first_claim)));
            }
        }
    }
}

fn key_of(row: &SqliteRow) -> Result<KeyHash, StoreError> {
    sql::stored_key(row.try_get("key")?)
}

/// `"name":"<hex of bytes>"`.
fn hex_field(out: &mut String, name: &str, bytes: &[u8]) {
    let _ = write!(out, "\"{name}\":\"");
    push_hex(out, bytes);
    out.push('"');
}

/// A claim's key and fingerprint, the fields the read and the batch's claims share.
fn push_claim_key(out: &mut String, claim: &Claim) {
    hex_field(out, "k", claim.key.as_bytes());
    out.push(',');
    hex_field(out, "f", claim.fingerprint.as_bytes());
}

/// The key and the token of a write on a held record.
fn push_hold(out: &mut String, hold: &Hold) {
    hex_field(out, "k", hold.key.as_bytes());
    out.push(',');
    hex_field(out, "t", hold.token.as_uuid().as_bytes());
}

/// `write` as one JSON object of [`BATCH`](super::queries::BATCH)'s arrays: blobs as hex,
/// numbers as numbers; nothing else, so nothing needs escaping.
fn push_entry(out: &mut String, write: &Write) {
    out.push('{');
    match write {
        Write::Claim(claim) => {
            push_claim_key(out, claim);
            out.push(',');
            hex_field(out, "t", claim.token.as_uuid().as_bytes());
            let _ = write!(
                out,
                ",\"l\":{},\"e\":{}",
                millis(claim.lease),
                millis(claim.ttl)
            );
        }
        Write::Complete { hold, response } => {
            push_hold(out, hold);
            let _ = write!(out, ",\"s\":{},", response.status.as_u16());
            hex_field(out, "h", &response.encode_headers());
            out.push(',');
            hex_field(out, "b", &response.body);
        }
        Write::Release(hold) => push_hold(out, hold),
        Write::Renew { hold, lease } => {
            push_hold(out, hold);
            let _ = write!(out, ",\"l\":{}", millis(*lease));
        }
    }
    out.push('}');
}
