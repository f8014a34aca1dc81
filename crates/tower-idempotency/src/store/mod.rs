//! Where idempotency records live.
//!
//! A [`Store`] keeps one record per scoped key. Every method must be atomic on its own: one SQL
//! statement or one Redis script, never a read followed by a write. A store that checks whether a
//! key exists and then inserts it lets two concurrent attempts both believe they are first, which
//! is exactly the duplicate this crate exists to prevent.
//!
//! | store | feature | for |
//! |---|---|---|
//! | [`MemoryStore`] | `memory` (default) | one process: tests, single-instance services |
//! | `PostgresStore` | `postgres` | the default for real applications, transactional mode |
//! | `SqliteStore` | `sqlite` | embedded, single node, transactional mode |
//! | `MySqlStore` | `mysql` | applications on MySQL or MariaDB (InnoDB), transactional mode |
//! | `RedisStore` | `redis` | work with no database row of its own, scale-out |
//!
//! [`DynStore`] holds any of them behind one type, for a store chosen at run time.

use std::{fmt, future::Future, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::{fingerprint::Fingerprint, key::KeyHash};

mod dynamic;
pub use dynamic::{BoxFuture, DynStore, ErasedStore};

#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "memory")]
pub use memory::MemoryStore;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod batch;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use batch::{BatchStats, Batching};
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(
    feature = "memory",
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
mod waiters;

/// A fencing token: issued by every successful claim, required by every later write.
///
/// When a holder's lease lapses and another attempt takes the key over, the new claim gets a new
/// token. The old holder's `complete`, `renew` and `release` then match no record and change
/// nothing, so a late writer can never overwrite the answer of the attempt that replaced it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(uuid::Uuid);

impl FencingToken {
    /// A fresh random token.
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// The token as a UUID, for stores that keep it in a `uuid` column.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// Rebuild a token from the UUID a store kept.
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }
}

impl Default for FencingToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// What the layer asks a store to claim.
///
/// Stores read the fields; the layer builds it. `#[non_exhaustive]`, so a field added later is
/// not a breaking change: build one with [`Claim::new`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Claim {
    /// `sha256(scope || key)`: the record's identity. The raw key is never stored.
    pub key: KeyHash,
    /// The fingerprint of the request that wants the key.
    pub fingerprint: Fingerprint,
    /// The token the store must write if (and only if) this claim wins.
    pub token: FencingToken,
    /// How long the claim stays valid without a renewal.
    pub lease: Duration,
    /// How long the record is kept, counted from its creation. A takeover keeps the original expiry.
    pub ttl: Duration,
}

impl Claim {
    /// A claim of `key` for `fingerprint` with `token`, holding a lease of `lease`, kept for `ttl`.
    pub fn new(
        key: KeyHash,
        fingerprint: Fingerprint,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Self {
        Self {
            key,
            fingerprint,
            token,
            lease,
            ttl,
        }
    }
}

/// The result of one atomic claim.
///
/// `#[non_exhaustive]`: a later version may add an outcome, so a `match` outside this crate needs
/// a wildcard arm. Stores build the variants directly or through [`claimed`](Self::claimed),
/// [`taken_over`](Self::taken_over) and [`in_flight`](Self::in_flight).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
// One value per request, moved and matched at once: boxing the answer would cost an allocation
// on every replay to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
pub enum ClaimOutcome {
    /// The key is ours: it was new, its record had expired, or its holder's lease had lapsed.
    Claimed {
        /// `true` when a running record whose lease had lapsed was taken over.
        taken_over: bool,
    },
    /// Another attempt with the same fingerprint holds the key and its lease is valid.
    InFlight {
        /// Time left on the holder's lease.
        lease_remaining: Duration,
    },
    /// The key is bound to a request with a different fingerprint.
    Mismatch,
    /// The first attempt finished; here is its answer.
    Done(StoredResponse),
}

impl ClaimOutcome {
    /// The key was new (or its record had expired) and is now ours.
    pub fn claimed() -> Self {
        Self::Claimed { taken_over: false }
    }

    /// A running record whose lease had lapsed was taken over: the key is ours.
    pub fn taken_over() -> Self {
        Self::Claimed { taken_over: true }
    }

    /// Another attempt holds the key for `lease_remaining` more.
    pub fn in_flight(lease_remaining: Duration) -> Self {
        Self::InFlight { lease_remaining }
    }
}

/// A response as it was saved, ready to be replayed.
///
/// `#[non_exhaustive]`: build one with [`StoredResponse::new`] (and
/// [`with_trailers`](Self::with_trailers)), or from a store's columns with
/// [`from_parts`](Self::from_parts).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredResponse {
    /// The original status code.
    pub status: StatusCode,
    /// The saved headers, every value of a multi-valued header in order.
    pub headers: HeaderMap,
    /// The complete body.
    pub body: Bytes,
    /// The body's trailers (gRPC's `grpc-status` lives here); empty when it sent none.
    pub trailers: HeaderMap,
}

impl StoredResponse {
    /// A saved response with no trailers.
    pub fn new(status: StatusCode, headers: HeaderMap, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers,
            body: body.into(),
            trailers: HeaderMap::new(),
        }
    }

    /// The same response, with `trailers` sent after its body.
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = trailers;
        self
    }

    /// Encode the headers, and the trailers if there are any, the way every store keeps them:
    /// `name: value\n` lines for the headers, then (only when there are trailers) one empty line
    /// and the trailers as `name: value\n` lines.
    ///
    /// Values are written as their raw bytes: the `http` crate forbids `\r` and `\n` inside a
    /// value, so the encoding is unambiguous and keeps non-UTF-8 (obs-text) bytes intact. A
    /// response without trailers encodes exactly as before trailers were kept, so records written
    /// by earlier versions decode unchanged.
    pub fn encode_headers(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity((self.headers.len() + self.trailers.len()) * 32 + 1);
        encode_lines(&self.headers, &mut out);
        if !self.trailers.is_empty() {
            out.push(b'\n');
            encode_lines(&self.trailers, &mut out);
        }
        out
    }

    /// Decode the headers written by [`encode_headers`](Self::encode_headers) (the trailers
    /// section, if any, is left out: [`from_parts`](Self::from_parts) reads both).
    pub fn decode_headers(encoded: &[u8]) -> Result<HeaderMap, StoreError> {
        Ok(decode_sections(encoded)?.0)
    }

    /// Rebuild a response from the columns a store kept: its status, the bytes of
    /// [`encode_headers`](Self::encode_headers), and the body.
    pub fn from_parts(
        status: u16,
        encoded_headers: &[u8],
        body: Bytes,
    ) -> Result<Self, StoreError> {
        let status = StatusCode::from_u16(status)
            .map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e))?;
        let (headers, trailers) = decode_sections(encoded_headers)?;
        Ok(Self::new(status, headers, body).with_trailers(trailers))
    }
}

fn encode_lines(headers: &HeaderMap, out: &mut Vec<u8>) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
}

/// The headers, then the trailers after the first empty line (none in records without trailers).
fn decode_sections(encoded: &[u8]) -> Result<(HeaderMap, HeaderMap), StoreError> {
    let mut headers = HeaderMap::new();
    let mut trailers = HeaderMap::new();
    let mut in_trailers = false;
    let mut lines = encoded.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        if line.is_empty() {
            // The final split piece after the last `\n` is empty too; only a blank line with
            // more after it opens the trailers.
            if lines.peek().is_some() {
                in_trailers = true;
            }
            continue;
        }
        let split = line
            .windows(2)
            .position(|w| w == b": ")
            .ok_or_else(|| StoreError::corrupt("a saved header line has no separator"))?;
        let name = HeaderName::from_bytes(&line[..split])
            .map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e))?;
        let value = HeaderValue::from_bytes(&line[split + 2..])
            .map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e))?;
        if in_trailers {
            trailers.append(name, value);
        } else {
            headers.append(name, value);
        }
    }
    Ok((headers, trailers))
}

/// The result of a token-checked write (`complete`, `renew`, `release`).
///
/// `#[non_exhaustive]`: a `match` outside this crate needs a wildcard arm; [`applied`](Self::applied)
/// is the usual question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fenced {
    /// The record carried our token and was written.
    Applied,
    /// The record no longer carries our token (taken over, expired and swept, or reclaimed).
    /// Nothing was written.
    Lost,
}

impl Fenced {
    /// `true` when the write was applied.
    pub fn applied(self) -> bool {
        matches!(self, Fenced::Applied)
    }

    /// `Applied` when `rows` (the number of records a token-checked statement touched) is non-zero.
    pub fn from_rows(rows: u64) -> Self {
        if rows > 0 {
            Fenced::Applied
        } else {
            Fenced::Lost
        }
    }
}

/// Where a record is in its life, as [`Store::get`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// An attempt holds the key (or held it, when the lease has lapsed).
    Running,
    /// The answer is saved and replayed to retries.
    Done,
}

/// One record as an operator sees it: what [`Store::get`] returns. Times are left by the
/// store's clock, so they do not depend on the caller's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// Running or done.
    pub state: RecordState,
    /// Running records: the lease time left (zero once lapsed: the next retry takes the key
    /// over). `None` for done records.
    pub lease_remaining: Option<Duration>,
    /// The time left before the record expires and the key is free for any request.
    pub expires_in: Duration,
    /// Done records: the saved answer.
    pub response: Option<StoredResponse>,
}

impl RecordInfo {
    /// A running record.
    pub fn running(lease_remaining: Duration, expires_in: Duration) -> Self {
        Self {
            state: RecordState::Running,
            lease_remaining: Some(lease_remaining),
            expires_in,
            response: None,
        }
    }

    /// A done record with its saved answer.
    pub fn done(response: StoredResponse, expires_in: Duration) -> Self {
        Self {
            state: RecordState::Done,
            lease_remaining: None,
            expires_in,
            response: Some(response),
        }
    }
}

/// The records of a store by state, as [`Store::stats`] counts them by the store's clock: what an
/// operator looks at first (a growing `running` count or an old running record means stuck
/// handlers, a large `expired` count a sweeper that does not keep up).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Live records an attempt holds or held (lapsed leases included: the next retry takes
    /// those over).
    pub running: u64,
    /// Live records with a saved answer.
    pub done: u64,
    /// Records past their expiry that are still stored, waiting for the sweeper (always 0 on
    /// Redis, which deletes them itself).
    pub expired: u64,
    /// The live running record claimed longest ago, if any.
    pub oldest_running: Option<OldestRunning>,
}

/// The live running record claimed longest ago: see [`StoreStats::oldest_running`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OldestRunning {
    /// Its key hash (`KeyHash::to_hex` is what logs and the admin tools show).
    pub key: KeyHash,
    /// How long ago it was first claimed (a takeover keeps the first claim's time).
    pub age: Duration,
}

impl StoreStats {
    /// Counts, with no oldest running record.
    pub fn new(running: u64, done: u64, expired: u64) -> Self {
        Self {
            running,
            done,
            expired,
            oldest_running: None,
        }
    }

    /// The oldest running record: `key`, first claimed `age` ago.
    pub fn with_oldest_running(mut self, key: KeyHash, age: Duration) -> Self {
        self.oldest_running = Some(OldestRunning { key, age });
        self
    }
}

/// A backend that keeps idempotency records.
///
/// # Atomicity
///
/// Each method is one atomic operation in the backend: one SQL statement (a CTE counts as one) or
/// one Lua script. In particular [`claim`](Store::claim) must decide between the four outcomes and
/// write the claim in the same step: `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE stale RETURNING`
/// in SQL, a single script in Redis. Never read then write.
///
/// # Time
///
/// Leases and expiry are judged by the store's own clock (the database's `now()`, Redis' `TIME`),
/// so several application instances with skewed clocks agree on who holds a key.
///
/// # Example
///
/// ```
/// use tower_idempotency::store::{MemoryStore, Store};
///
/// # tokio_test_like::run(async {
/// let store = MemoryStore::new();
/// assert_eq!(store.sweep(1000).await.unwrap(), 0);
/// # });
/// # mod tokio_test_like { pub fn run<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f) } }
/// ```
pub trait Store: fmt::Debug + Send + Sync + 'static {
    /// A short name for metrics and logs: the `store` label of
    /// `idempotency_store_duration_seconds`. The built-in stores answer `memory`, `postgres`,
    /// `sqlite` and `redis`; the default is `custom`.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Claim `claim.key` for `claim.fingerprint`, atomically.
    ///
    /// - no record, or an expired one: write a `running` record with `claim.token`, lease and
    ///   expiry; return [`ClaimOutcome::Claimed`].
    /// - a record with another fingerprint (any state, not expired): [`ClaimOutcome::Mismatch`].
    /// - `running`, same fingerprint, lease lapsed: take it over (new token, new lease, original
    ///   expiry); `Claimed { taken_over: true }`.
    /// - `running`, same fingerprint, lease valid: [`ClaimOutcome::InFlight`] with the time left.
    /// - `done`, same fingerprint: [`ClaimOutcome::Done`] with the saved response.
    fn claim(&self, claim: &Claim)
        -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Extend the lease of a running record held with `token` to `lease` from now.
    fn renew(
        &self,
        key: &KeyHash,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Save `response` on the running record held with `token` and mark it done.
    /// The record keeps its expiry.
    fn complete(
        &self,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Delete the running record held with `token`, so a retry can claim the key afresh.
    fn release(
        &self,
        key: &KeyHash,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Delete up to `batch` expired records; return how many were deleted.
    ///
    /// Bounded so that a backlog of millions is cleared in short steps without a long lock.
    fn sweep(&self, batch: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Wait until the record of `key` may have changed (completed, released, or its lease lapsed),
    /// or until `timeout` passes, whichever is first. Used by wait mode between two claims.
    ///
    /// Stores with a notification channel (memory: `Notify`, PostgreSQL: `LISTEN`, Redis:
    /// pub/sub) wake early; the default sleeps for `timeout`, which the layer bounds to a short
    /// poll interval. A spurious early return is harmless: the layer claims again.
    fn wait_for_change(&self, key: &KeyHash, timeout: Duration) -> impl Future<Output = ()> + Send {
        let _ = key;
        tokio::time::sleep(timeout)
    }

    /// Operators: the live record of `key`, `None` when there is none (or it expired). Reads
    /// only. Every built-in store implements it; the default answers
    /// [`StoreErrorKind::Unsupported`].
    fn get(
        &self,
        key: &KeyHash,
    ) -> impl Future<Output = Result<Option<RecordInfo>, StoreError>> + Send {
        let _ = key;
        async { Err(StoreError::unsupported("get")) }
    }

    /// Operators: delete the record of `key` whatever its state, so the next request with the
    /// key runs as new (a stuck key, an erasure request). `true` when there was one.
    ///
    /// # Warning
    ///
    /// Forgetting a done record lets a retry of its request run again; forgetting a running one
    /// lets a duplicate run beside its holder, whose answer is then not saved (it is fenced
    /// out). Forget only what you know is safe to redo. The default answers
    /// [`StoreErrorKind::Unsupported`].
    fn forget(&self, key: &KeyHash) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = key;
        async { Err(StoreError::unsupported("forget")) }
    }

    /// Operators: the records by state and the oldest running one ([`StoreStats`]). Reads
    /// only, but visits every record (a table scan in SQL, a `SCAN` in Redis): for a dashboard
    /// or a command line, not for every request. Every built-in store implements it (Redis
    /// Cluster excepted); the default answers [`StoreErrorKind::Unsupported`].
    fn stats(&self) -> impl Future<Output = Result<StoreStats, StoreError>> + Send {
        async { Err(StoreError::unsupported("stats")) }
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
/// A store whose records live in a SQL database, so the handler's writes and the saved response
/// can commit in one transaction (transactional mode).
///
/// The layer claims the key with [`Store::claim`] (committed on its own, so the claim is visible
/// to other attempts at once), then hands the handler a lazily-begun transaction. When the handler
/// answers, [`complete_in`](TransactionalStore::complete_in) saves the response inside that
/// transaction, token-checked, and the layer commits. If the token check fails the layer rolls
/// back, so a holder that lost its lease cannot commit its work.
pub trait TransactionalStore: Store {
    /// The sqlx database.
    type Database: sqlx::Database;

    /// The pool transactions are begun from.
    fn pool(&self) -> &sqlx::Pool<Self::Database>;

    /// The statement that begins the handler's transaction (`BEGIN` when `None`).
    #[doc(hidden)]
    const BEGIN: Option<&'static str> = None;

    /// The in-process queue of this store's writers, if it has one: the handler's transaction
    /// holds it from its begin to its commit or rollback.
    #[doc(hidden)]
    fn writer_queue(&self) -> Option<std::sync::Arc<tokio::sync::Mutex<()>>> {
        None
    }

    /// [`Store::complete`], inside the handler's transaction.
    fn complete_in(
        &self,
        tx: &mut sqlx::Transaction<'static, Self::Database>,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;
}

/// What went wrong in a store.
///
/// Unless fail-open is enabled, the layer answers `503 Service Unavailable` with `Retry-After`
/// for the kinds a retry can cure ([`Unavailable`](StoreErrorKind::Unavailable),
/// [`Conflict`](StoreErrorKind::Conflict) after the layer's own retries, and
/// [`Full`](StoreErrorKind::Full)), and `500 Internal Server Error` for the others, which need
/// an operator. It never shows the source's text to the client; the log carries it.
#[derive(Debug, thiserror::Error)]
#[error("idempotency store {kind}")]
pub struct StoreError {
    kind: StoreErrorKind,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The kind of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend could not be reached or did not answer in time.
    Unavailable,
    /// The backend answered with an error that a retry will not cure (a missing table, a
    /// constraint, a bug).
    Backend,
    /// The backend aborted the operation over a conflict with a concurrent one (a
    /// serialization failure or a deadlock): nothing was written, and the same operation
    /// retried is expected to succeed. The layer retries a claim a few times before answering
    /// 503.
    Conflict,
    /// The store holds as many records as it may (see
    /// [`MemoryStore::with_capacity`](crate::store::MemoryStore::with_capacity)).
    Full,
    /// A saved record could not be decoded.
    Corrupt,
    /// Running the store's migrations failed.
    Migration,
    /// The store does not implement this operation (a custom store without
    /// [`Store::get`], [`Store::forget`] or [`Store::stats`]; `stats` on Redis Cluster).
    Unsupported,
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Backend => "backend error",
            StoreErrorKind::Conflict => "conflict with a concurrent operation",
            StoreErrorKind::Full => "full",
            StoreErrorKind::Corrupt => "record corrupt",
            StoreErrorKind::Migration => "migration failed",
            StoreErrorKind::Unsupported => "operation not supported",
        })
    }
}

impl StoreError {
    /// An error of `kind` caused by `source`.
    pub fn new(
        kind: StoreErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// The store does not implement `operation`.
    pub fn unsupported(operation: &'static str) -> Self {
        Self::new(StoreErrorKind::Unsupported, operation)
    }

    /// A record could not be decoded.
    pub fn corrupt(what: &'static str) -> Self {
        Self::new(StoreErrorKind::Corrupt, what)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The same failure, for each of the operations that shared a failed batch: the kind, and
    /// the source's text.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn for_each_entry(&self) -> Self {
        match &self.source {
            Some(source) => Self::new(self.kind, source.to_string()),
            None => Self {
                kind: self.kind,
                source: None,
            },
        }
    }

    /// `true` for the kinds a later retry can cure (the layer answers 503 with `Retry-After`):
    /// [`Unavailable`](StoreErrorKind::Unavailable), [`Conflict`](StoreErrorKind::Conflict) and
    /// [`Full`](StoreErrorKind::Full).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Unavailable | StoreErrorKind::Conflict | StoreErrorKind::Full
        )
    }
}

/// The kind of a database error, from its SQLSTATE (PostgreSQL) or result code (SQLite).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn database_error_kind(err: &dyn sqlx::error::DatabaseError) -> StoreErrorKind {
    #[cfg(feature = "mysql")]
    if let Some(my) = err.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql::error::kind(my);
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = err.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return match pg.code() {
            // serialization_failure, deadlock_detected
            "40001" | "40P01" => StoreErrorKind::Conflict,
            // connection exceptions (class 08), insufficient resources (class 53), operator
            // intervention (class 57: query_canceled by statement_timeout, admin_shutdown,
            // cannot_connect_now...), lock_not_available (lock_timeout)
            c if c.starts_with("08") || c.starts_with("53") || c.starts_with("57") => {
                StoreErrorKind::Unavailable
            }
            "55P03" => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Backend,
        };
    }
    #[cfg(feature = "sqlite")]
    if err
        .try_downcast_ref::<sqlx::sqlite::SqliteError>()
        .is_some()
    {
        // SQLite reports its (extended) result code as a number; the primary code is the low
        // byte.
        let code = err.code().and_then(|c| c.parse::<u32>().ok()).unwrap_or(0);
        return match code & 0xff {
            // BUSY, LOCKED: another connection holds the lock past the busy timeout.
            5 | 6 => StoreErrorKind::Conflict,
            // NOMEM, IOERR, FULL (disk), CANTOPEN, PROTOCOL
            7 | 10 | 13 | 14 | 15 => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Backend,
        };
    }
    let _ = err;
    StoreErrorKind::Backend
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        let kind = match &err {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            // A protocol error leaves the connection unusable; a new one is expected to work.
            | sqlx::Error::Protocol(_) => StoreErrorKind::Unavailable,
            sqlx::Error::Database(db) => database_error_kind(db.as_ref()),
            sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } => StoreErrorKind::Corrupt,
            sqlx::Error::Migrate(_) => StoreErrorKind::Migration,
            _ => StoreErrorKind::Backend,
        };
        Self::new(kind, err)
    }
}

#[cfg(feature = "redis")]
impl From<::redis::RedisError> for StoreError {
    fn from(err: ::redis::RedisError) -> Self {
        // What redis itself would retry (a dropped connection, LOADING, TRYAGAIN, CLUSTERDOWN, a
        // failover in progress) is unavailability; the rest is an error in the command.
        let kind = if err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || !matches!(err.retry_method(), ::redis::RetryMethod::NoRetry)
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

    #[test]
    fn headers_round_trip_with_multiple_values_in_order() {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("one"));
        headers.append("x-multi", HeaderValue::from_static("two: with colon"));
        headers.append("x-bytes", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let saved = StoredResponse::new(StatusCode::CREATED, headers, Bytes::from_static(b"{}"));
        let decoded = StoredResponse::decode_headers(&saved.encode_headers()).unwrap();
        assert_eq!(decoded, saved.headers);
        let multi: Vec<_> = decoded.get_all("x-multi").iter().collect();
        assert_eq!(multi, ["one", "two: with colon"]);
    }

    #[test]
    fn corrupt_headers_are_an_error_not_a_panic() {
        let err = StoredResponse::decode_headers(b"no separator here\n").unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    }

    #[test]
    fn trailers_round_trip_and_old_records_decode_unchanged() {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/grpc"));
        let mut trailers = HeaderMap::new();
        trailers.append("grpc-status", HeaderValue::from_static("0"));
        trailers.append("grpc-message", HeaderValue::from_static("ok: fine"));
        let saved = StoredResponse::new(StatusCode::OK, headers.clone(), Bytes::new())
            .with_trailers(trailers.clone());
        let encoded = saved.encode_headers();
        let decoded = StoredResponse::from_parts(200, &encoded, Bytes::new()).unwrap();
        assert_eq!(decoded, saved);

        // Trailers with no headers at all still land in the trailers.
        let only_trailers = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new())
            .with_trailers(trailers);
        let decoded =
            StoredResponse::from_parts(200, &only_trailers.encode_headers(), Bytes::new()).unwrap();
        assert_eq!(decoded, only_trailers);

        // A record written before trailers were kept: header lines only.
        let old = b"content-type: application/json\nlocation: /orders/1\n";
        let decoded = StoredResponse::from_parts(201, old, Bytes::new()).unwrap();
        assert_eq!(decoded.headers.len(), 2);
        assert!(decoded.trailers.is_empty());
        let no_trailers =
            StoredResponse::new(StatusCode::CREATED, decoded.headers.clone(), Bytes::new());
        assert_eq!(no_trailers.encode_headers(), old.to_vec());
    }
}
