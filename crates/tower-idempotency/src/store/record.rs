//! What a store keeps and answers: the claim it is asked for, its outcome, the fencing token,
//! the saved response and its byte encoding, and the record as an operator sees it.

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::error::{StoreError, StoreErrorKind};
use crate::{fingerprint::Fingerprint, key::KeyHash};

/// The longest lease, retention or wait the crate works with: 100 years, far beyond any useful
/// setting, far inside the range of a timestamp and of a clock reading, and exact in milliseconds
/// as a Lua number (Redis' scripts). A longer setting is cut to it, so no clock arithmetic can
/// overflow.
pub(crate) const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A fencing token: issued by every successful claim, required by every later write.
///
/// When a holder's lease lapses and another attempt takes the key over, the new claim gets a new
/// token. The old holder's `complete`, `renew` and `release` then match no record and change
/// nothing, so a late writer can never overwrite the answer of the attempt that replaced it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(uuid::Uuid);

impl FencingToken {
    /// A fresh token, unlike every other this process or any other issues: a random base drawn
    /// once per process (a v4 UUID), XORed with a count of the tokens issued so far. Unique
    /// within the process by the count, and across processes by the base (two bases would have to
    /// agree on their first 88 bits); and with no system call per claim, where a v4 UUID costs a
    /// `getrandom` each.
    pub fn new() -> Self {
        static BASE: OnceLock<u128> = OnceLock::new();
        static ISSUED: AtomicU64 = AtomicU64::new(0);
        let base = *BASE.get_or_init(|| uuid::Uuid::new_v4().as_u128());
        let count = ISSUED.fetch_add(1, Ordering::Relaxed);
        Self(uuid::Uuid::from_u128(base ^ u128::from(count)))
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

/// A claim's hold on its key: the key's hash and the fencing token the claim wrote.
///
/// Every write after the claim ([`renew`](super::Store::renew),
/// [`complete`](super::Store::complete), [`release`](super::Store::release)) names the hold it
/// acts for, and changes the record only while the record still carries that token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hold {
    /// The record's identity.
    pub key: KeyHash,
    /// The token of the claim that holds it.
    pub token: FencingToken,
}

impl Hold {
    /// The hold of `token` on `key`.
    pub fn new(key: KeyHash, token: FencingToken) -> Self {
        Self { key, token }
    }
}

/// What the layer asks a store to claim.
///
/// Stores read the fields; the layer builds it. `#[non_exhaustive]`, so a field added later is
/// not a breaking change: build one with [`Claim::new`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Claim {
    /// `sha256(scope || 0x00 || key)` ([`IdempotencyKey::scoped_hash`](crate::IdempotencyKey::scoped_hash)): the record's identity. The raw key is never stored.
    pub key: KeyHash,
    /// The fingerprint of the request that wants the key.
    pub fingerprint: Fingerprint,
    /// The token the store must write if (and only if) this claim wins.
    pub token: FencingToken,
    /// How long the claim stays valid without a renewal.
    pub lease: Duration,
    /// How long the record is kept, counted from its creation. A takeover keeps the original
    /// expiry, unless its new lease runs past it: a record does not expire under a live holder.
    pub ttl: Duration,
}

impl Claim {
    /// A claim of `key` for `fingerprint` with `token`, holding a lease of `lease`, kept for `ttl`
    /// (each at most 100 years: a longer one is cut to that).
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
            lease: lease.min(LONGEST),
            ttl: ttl.min(LONGEST),
        }
    }

    /// The hold this claim takes on its key if it wins.
    pub fn hold(&self) -> Hold {
        Hold::new(self.key, self.token)
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
        Self::applied_if(rows > 0)
    }

    /// `Applied` when `applied`.
    pub(crate) fn applied_if(applied: bool) -> Self {
        if applied {
            Fenced::Applied
        } else {
            Fenced::Lost
        }
    }
}

/// Where a record is in its life, as [`Store::get`](crate::store::Store::get) sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// An attempt holds the key (or held it, when the lease has lapsed).
    Running,
    /// The answer is saved and replayed to retries.
    Done,
}

/// One record as an operator sees it: what [`Store::get`](crate::store::Store::get) returns. Times are left by the
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
    /// How long ago the key was first claimed, by the store's clock (a take-over keeps the
    /// first claim's time). `None` where the store does not know it: Redis records written
    /// before 0.2 did not keep it.
    pub age: Option<Duration>,
}

impl RecordInfo {
    /// A running record.
    pub fn running(lease_remaining: Duration, expires_in: Duration) -> Self {
        Self {
            state: RecordState::Running,
            lease_remaining: Some(lease_remaining),
            expires_in,
            response: None,
            age: None,
        }
    }

    /// A done record with its saved answer.
    pub fn done(response: StoredResponse, expires_in: Duration) -> Self {
        Self {
            state: RecordState::Done,
            lease_remaining: None,
            expires_in,
            response: Some(response),
            age: None,
        }
    }

    /// The same record, first claimed `age` ago.
    pub fn with_age(mut self, age: Duration) -> Self {
        self.age = Some(age);
        self
    }
}

/// The records of a store by state, as [`Store::stats`](super::Store::stats) counts them by the
/// store's clock: what an operator looks at first (a growing `running` count or an old running
/// record means stuck handlers, a large `expired` count a sweeper that does not keep up).
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
    /// The live running record claimed longest ago, if any. Like `running`, it includes a
    /// record whose holder died (its lease lapsed) and that no retry has taken over yet: such
    /// a record blocks nothing, and ages until its expiry.
    pub oldest_running: Option<OldestRunning>,
}

/// The live running record claimed longest ago: see [`StoreStats::oldest_running`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OldestRunning {
    /// Its key hash ([`KeyHash::to_hex`] is what logs and the admin tools show).
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

/// Durations in whole milliseconds, as every store writes leases and retention and reads the time
/// left on them: the crate's one conversion each way.
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis",
    feature = "admin"
))]
pub(crate) mod time {
    use std::time::Duration;

    /// [`LONGEST`](super::LONGEST) in milliseconds: the longest lease or retention a store writes.
    pub(crate) const MAX_MILLIS: u64 = super::LONGEST.as_millis() as u64;

    /// `duration` in whole milliseconds, at most [`MAX_MILLIS`].
    pub(crate) fn to_millis(duration: Duration) -> u64 {
        u64::try_from(duration.as_millis())
            .unwrap_or(MAX_MILLIS)
            .min(MAX_MILLIS)
    }

    /// The milliseconds a store reported (time left on a lease, or before expiry) as a duration; a
    /// negative count, a time already past, is zero.
    #[cfg(any(
        feature = "postgres",
        feature = "sqlite",
        feature = "mysql",
        feature = "redis"
    ))]
    pub(crate) fn from_millis(ms: i64) -> Duration {
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn durations_are_whole_milliseconds_within_bounds() {
            assert_eq!(to_millis(Duration::from_micros(1500)), 1);
            assert_eq!(to_millis(Duration::from_secs(30)), 30_000);
            assert_eq!(to_millis(Duration::MAX), MAX_MILLIS);
        }

        #[cfg(any(
            feature = "postgres",
            feature = "sqlite",
            feature = "mysql",
            feature = "redis"
        ))]
        #[test]
        fn a_negative_count_is_a_time_already_past() {
            assert_eq!(from_millis(-5), Duration::ZERO);
            assert_eq!(from_millis(1500), Duration::from_millis(1500));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_tokens_issued_at_once_on_many_threads_are_all_different() {
        // The threads start issuing together, so their issues overlap.
        let start = std::sync::Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    (0..10_000).map(|_| FencingToken::new()).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for thread in threads {
            for token in thread.join().unwrap() {
                assert!(seen.insert(token), "a token was issued twice");
            }
        }
        assert_eq!(seen.len(), 40_000);
    }

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
