//! An in-process store.

use std::{
    collections::{
        hash_map::{Entry, OccupiedEntry},
        HashMap,
    },
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::{
    record::LONGEST, waiters::lock, Claim, ClaimOutcome, Fenced, FencingToken, Hold, RecordInfo,
    Store, StoreError, StoreErrorKind, StoreStats, StoredResponse,
};
use crate::{fingerprint::Fingerprint, key::KeyHash};

/// Number of independently locked shards; a power of two so the shard is a mask of the key hash.
const SHARDS: usize = 16;
/// How often, at most, a shard that takes a new record looks for expired ones to drop (more
/// often when it is full).
const LAZY_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Idempotency records in this process's memory.
///
/// A real store for a single-process service: claims are atomic (each operation holds the lock of
/// the key's shard), leases and expiry work as in the database stores, and wait mode is woken by
/// a [`Notify`] per key. Records are lost when the process exits and are not shared between
/// processes: run several instances behind a load balancer and a retry that lands on another
/// instance executes again. Use the PostgreSQL, SQLite or Redis store there.
///
/// # Memory bound
///
/// The store holds at most [`capacity`](Self::with_capacity) records (default
/// [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY), 100,000), split evenly over 16 shards by key
/// hash. Expired records are treated as absent at once and freed as new records arrive (a shard
/// drops its expired records at most once a second, and whenever it is full), so no
/// [`Sweeper`](crate::Sweeper) is needed; [`Store::sweep`] still works.
///
/// When a new key lands in a full shard with nothing expired, the claim fails with
/// [`StoreErrorKind::Full`] and the layer answers 503 (`Retry-After`), without running the
/// handler. Records are never evicted before they expire: an evicted answer would let a retry
/// run the work twice, silently, while a refusal is visible and safe. Size the capacity for
/// your peak rate of new keys times the retention ([`with_ttl`](crate::Idempotency::with_ttl)),
/// or shorten the retention.
///
/// ```
/// use tower_idempotency::{store::MemoryStore, Idempotency};
///
/// let layer = Idempotency::new(MemoryStore::new());
/// // the same as
/// let layer = Idempotency::memory();
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>; SHARDS]>,
    per_shard: usize,
}

#[derive(Default)]
struct Shard {
    records: HashMap<KeyHash, Record>,
    /// No record expires before this (a lower bound: removals leave it as it is).
    earliest_expiry: Option<Instant>,
    /// The shard does not look for expired records before this, unless it is full.
    next_sweep: Option<Instant>,
}

impl Shard {
    /// Drop the expired records if there may be some.
    fn drop_expired(&mut self, now: Instant) -> usize {
        if self.earliest_expiry.is_none_or(|earliest| earliest > now) {
            return 0;
        }
        let before = self.records.len();
        self.records.retain(|_, r| r.expires_at > now);
        self.earliest_expiry = self.records.values().map(|r| r.expires_at).min();
        self.next_sweep = Some(now + LAZY_SWEEP_EVERY);
        before - self.records.len()
    }

    /// Whether a new record must first look for expired ones: it is time, or the shard is full.
    fn wants_room(&self, now: Instant, per_shard: usize) -> bool {
        self.records.len() >= per_shard || self.next_sweep.is_none_or(|at| at <= now)
    }

    /// Make room for one more record, dropping expired ones when it is time or when full.
    fn make_room(&mut self, now: Instant, per_shard: usize) -> Result<(), StoreError> {
        if self.wants_room(now, per_shard) {
            self.drop_expired(now);
        }
        if self.records.len() >= per_shard {
            return Err(StoreError::new(
                StoreErrorKind::Full,
                format!(
                    "the memory store holds {} unexpired records in this key's shard, its share of the capacity; raise MemoryStore::with_capacity or shorten the retention",
                    self.records.len()
                ),
            ));
        }
        Ok(())
    }
}

/// Lower `earliest` to `expires_at`, for a record that expires then.
fn note_expiry(earliest: &mut Option<Instant>, expires_at: Instant) {
    *earliest = Some(earliest.map_or(expires_at, |earliest| earliest.min(expires_at)));
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_capacity(Self::DEFAULT_CAPACITY)
    }
}

struct Record {
    fingerprint: Fingerprint,
    token: FencingToken,
    state: State,
    /// The first claim (a takeover keeps it): for [`Store::stats`].
    claimed_at: Instant,
    expires_at: Instant,
    /// Wakes the waiters of wait mode; made by the first waiter, since most records have none.
    changed: Option<Arc<Notify>>,
}

/// `span` after `now`, `span` taken as at most [`LONGEST`]: a lease or retention of "for ever"
/// (a `Claim`'s fields are public) is not an overflow.
fn later(now: Instant, span: Duration) -> Instant {
    now + span.min(LONGEST)
}

impl Record {
    /// A running record for `claim`, claimed at `now`.
    fn claimed(claim: &Claim, now: Instant) -> Self {
        Self {
            fingerprint: claim.fingerprint,
            token: claim.token,
            state: State::Running {
                lease_until: later(now, claim.lease),
            },
            claimed_at: now,
            expires_at: later(now, claim.ttl),
            changed: None,
        }
    }

    /// What `claim` finds on this live record; a running one whose lease lapsed is taken over.
    fn claim_again(&mut self, claim: &Claim, now: Instant) -> ClaimOutcome {
        if self.fingerprint != claim.fingerprint {
            return ClaimOutcome::Mismatch;
        }
        match &self.state {
            State::Done(response) => ClaimOutcome::Done(response.clone()),
            State::Running { lease_until } if *lease_until > now => ClaimOutcome::InFlight {
                lease_remaining: *lease_until - now,
            },
            State::Running { .. } => {
                let lease_until = later(now, claim.lease);
                self.token = claim.token;
                self.state = State::Running { lease_until };
                // The new holder is live: the record does not expire before its lease, as
                // after a renewal.
                self.expires_at = self.expires_at.max(lease_until);
                ClaimOutcome::Claimed { taken_over: true }
            }
        }
    }
}

// Most records are done (a running one lives for one handler call), so the large variant is
// the common one and boxing it would add an allocation per record.
#[allow(clippy::large_enum_variant)]
enum State {
    Running { lease_until: Instant },
    Done(StoredResponse),
}

impl MemoryStore {
    /// The capacity of [`new`](Self::new) and [`Idempotency::memory`](crate::Idempotency::memory):
    /// 100,000 records.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// An empty store of the default capacity.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that holds at most `capacity` records (see [the memory
    /// bound](Self#memory-bound)). The capacity is split evenly over 16 shards, so it is
    /// rounded down to a multiple of 16, and raised to 16 if lower.
    ///
    /// ```
    /// use tower_idempotency::{store::MemoryStore, Idempotency};
    ///
    /// let layer = Idempotency::new(MemoryStore::with_capacity(1_000_000));
    /// # let _ = layer;
    /// ```
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            shards: Arc::default(),
            per_shard: (capacity / SHARDS).max(1),
        }
    }

    /// The most records the store holds.
    pub fn capacity(&self) -> usize {
        self.per_shard * SHARDS
    }

    /// How many records the store holds, expired ones included until dropped.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).records.len()).sum()
    }

    /// `true` when the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &KeyHash) -> MutexGuard<'_, Shard> {
        lock(&self.shards[key.0[0] as usize & (SHARDS - 1)])
    }

    /// Apply `write` to the running record of `key` held with `token`, then wake its waiters.
    fn fenced(
        &self,
        hold: &Hold,
        write: impl FnOnce(OccupiedEntry<'_, KeyHash, Record>),
    ) -> Fenced {
        let now = Instant::now();
        let mut shard = self.shard(&hold.key);
        let record = match shard.records.entry(hold.key) {
            Entry::Occupied(record)
                if record.get().token == hold.token
                    && record.get().expires_at > now
                    && matches!(record.get().state, State::Running { .. }) =>
            {
                record
            }
            _ => return Fenced::Lost,
        };
        let changed = record.get().changed.clone();
        write(record);
        drop(shard);
        if let Some(changed) = changed {
            changed.notify_waiters();
        }
        Fenced::Applied
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(&claim.key);
        // Rarely (once a second, or when full) a new key looks for expired records first; the
        // key itself is looked up once.
        if shard.wants_room(now, self.per_shard) && !shard.records.contains_key(&claim.key) {
            shard.make_room(now, self.per_shard)?;
        }
        let Shard {
            records,
            earliest_expiry,
            ..
        } = &mut *shard;
        match records.entry(claim.key) {
            Entry::Occupied(record) if record.get().expires_at > now => {
                Ok(record.into_mut().claim_again(claim, now))
            }
            Entry::Occupied(expired) => {
                let record = Record::claimed(claim, now);
                note_expiry(earliest_expiry, record.expires_at);
                *expired.into_mut() = record;
                Ok(ClaimOutcome::Claimed { taken_over: false })
            }
            Entry::Vacant(vacant) => {
                let record = Record::claimed(claim, now);
                note_expiry(earliest_expiry, record.expires_at);
                vacant.insert(record);
                Ok(ClaimOutcome::Claimed { taken_over: false })
            }
        }
    }

    async fn renew(&self, hold: &Hold, lease: Duration) -> Result<Fenced, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(&hold.key);
        Ok(match shard.records.get_mut(&hold.key) {
            Some(Record {
                token: held,
                state: State::Running { lease_until },
                expires_at,
                ..
            }) if *held == hold.token && *expires_at > now => {
                *lease_until = later(now, lease);
                // A live holder's record does not expire: its expiry keeps up with the lease.
                *expires_at = (*expires_at).max(*lease_until);
                Fenced::Applied
            }
            _ => Fenced::Lost,
        })
    }

    async fn complete(&self, hold: &Hold, response: &StoredResponse) -> Result<Fenced, StoreError> {
        Ok(self.fenced(hold, |mut record| {
            record.get_mut().state = State::Done(response.clone());
        }))
    }

    async fn release(&self, hold: &Hold) -> Result<Fenced, StoreError> {
        Ok(self.fenced(hold, |record| {
            record.remove();
        }))
    }

    async fn sweep(&self, batch: u32) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut left = batch as usize;
        for shard in self.shards.iter() {
            if left == 0 {
                break;
            }
            let mut shard = lock(shard);
            let expired: Vec<KeyHash> = shard
                .records
                .iter()
                .filter(|(_, r)| r.expires_at <= now)
                .map(|(k, _)| *k)
                .take(left)
                .collect();
            for key in &expired {
                shard.records.remove(key);
            }
            left -= expired.len();
        }
        Ok((batch as usize - left) as u64)
    }

    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        let changed = match self.shard(key).records.get_mut(key) {
            Some(record) => record
                .changed
                .get_or_insert_with(|| Arc::new(Notify::new()))
                .clone(),
            None => return,
        };
        let notified = changed.notified();
        tokio::pin!(notified);
        // Register before looking again, so a completion between the two steps is not missed.
        notified.as_mut().enable();
        let still_running = matches!(
            self.shard(key).records.get(key),
            Some(Record { state: State::Running { .. }, changed: Some(current), .. })
                if Arc::ptr_eq(current, &changed)
        );
        if still_running {
            let _ = tokio::time::timeout(timeout, notified).await;
        }
    }

    async fn get(&self, key: &KeyHash) -> Result<Option<RecordInfo>, StoreError> {
        let now = Instant::now();
        let shard = self.shard(key);
        let Some(record) = shard.records.get(key).filter(|r| r.expires_at > now) else {
            return Ok(None);
        };
        let expires_in = record.expires_at - now;
        let info = match &record.state {
            State::Running { lease_until } => {
                RecordInfo::running(lease_until.saturating_duration_since(now), expires_in)
            }
            State::Done(response) => RecordInfo::done(response.clone(), expires_in),
        };
        Ok(Some(info.with_age(
            now.saturating_duration_since(record.claimed_at),
        )))
    }

    async fn forget(&self, key: &KeyHash) -> Result<bool, StoreError> {
        let removed = self.shard(key).records.remove(key);
        if let Some(changed) = removed.as_ref().and_then(|r| r.changed.as_ref()) {
            // Waiters claim again and find the key free.
            changed.notify_waiters();
        }
        Ok(removed.is_some())
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let now = Instant::now();
        let mut stats = StoreStats::default();
        let mut oldest: Option<(KeyHash, Instant)> = None;
        for shard in self.shards.iter() {
            for (key, record) in &lock(shard).records {
                if record.expires_at <= now {
                    stats.expired += 1;
                    continue;
                }
                match record.state {
                    State::Done(_) => stats.done += 1,
                    State::Running { .. } => {
                        stats.running += 1;
                        if oldest.is_none_or(|(_, at)| record.claimed_at < at) {
                            oldest = Some((*key, record.claimed_at));
                        }
                    }
                }
            }
        }
        Ok(match oldest {
            Some((key, at)) => stats.with_oldest_running(key, now.saturating_duration_since(at)),
            None => stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{IdempotencyKey, Scope};
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    fn claim(key: &str, body: &[u8], lease_ms: u64, ttl_ms: u64) -> Claim {
        Claim {
            key: IdempotencyKey::parse(key.as_bytes())
                .unwrap()
                .scoped_hash(&Scope::new("")),
            fingerprint: Fingerprint::of(&[body]),
            token: FencingToken::new(),
            lease: Duration::from_millis(lease_ms),
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    fn response() -> StoredResponse {
        StoredResponse::new(
            StatusCode::CREATED,
            HeaderMap::new(),
            Bytes::from_static(b"ok"),
        )
    }

    /// A claim made by hand (its fields are public) with the largest lease and retention is
    /// held as long as the longest the store keeps anything, not a panic.
    #[tokio::test]
    async fn a_claim_for_ever_is_held_for_the_longest() {
        let store = MemoryStore::new();
        let mut forever = claim("forever", b"", 0, 0);
        forever.lease = Duration::MAX;
        forever.ttl = Duration::MAX;
        let claimed = store.claim(&forever).await.unwrap();
        assert_eq!(claimed, ClaimOutcome::Claimed { taken_over: false });
        let again = store.claim(&forever).await.unwrap();
        assert!(
            matches!(again, ClaimOutcome::InFlight { lease_remaining } if lease_remaining > LONGEST / 2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn distinct_keys_stay_within_the_capacity_as_they_expire() {
        let store = MemoryStore::with_capacity(1_000);
        assert_eq!(store.capacity(), 992, "rounded down to a multiple of 16");
        let mut largest = 0;
        for i in 0..100_000 {
            // 10 ms retention, 1 ms apart: about 10 records live at any time.
            let c = claim(&format!("k{i}"), b"", 5, 10);
            assert!(
                matches!(
                    store.claim(&c).await,
                    Ok(ClaimOutcome::Claimed { taken_over: false })
                ),
                "claim {i}"
            );
            if i % 3 == 0 {
                store.complete(&c.hold(), &response()).await.unwrap();
            }
            largest = largest.max(store.len());
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert!(largest <= store.capacity(), "{largest} records held");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_store_refuses_new_keys_until_records_expire() {
        let store = MemoryStore::with_capacity(160);
        let mut refused = 0;
        for i in 0..100_000 {
            match store
                .claim(&claim(&format!("k{i}"), b"", 1_000, 60_000))
                .await
            {
                Ok(ClaimOutcome::Claimed { .. }) => {}
                Err(err) => {
                    assert_eq!(err.kind(), StoreErrorKind::Full);
                    refused += 1;
                }
                Ok(other) => panic!("{other:?}"),
            }
        }
        assert_eq!(store.len(), 160);
        assert_eq!(refused, 100_000 - 160);
        // Existing keys still answer while full.
        let first = claim("k0", b"", 1_000, 60_000);
        assert!(matches!(
            store.claim(&first).await,
            Ok(ClaimOutcome::InFlight { .. })
        ));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(
            store
                .claim(&claim("new", b"", 1_000, 60_000))
                .await
                .unwrap(),
            ClaimOutcome::Claimed { taken_over: false },
            "expired records make room"
        );
        assert_eq!(
            store.len(),
            15 * 10 + 1,
            "the full shard dropped its expired records; the others keep theirs until they take a new one"
        );
    }

    #[tokio::test]
    async fn wait_for_change_wakes_on_completion() {
        let store = MemoryStore::new();
        let c = claim("k", b"", 30_000, 60_000);
        store.claim(&c).await.unwrap();
        let waiter = store.wait_for_change(&c.key, Duration::from_secs(30));
        tokio::pin!(waiter);
        // Polled once: registered and waiting, before the completion.
        assert!(futures_util::FutureExt::now_or_never(waiter.as_mut()).is_none());
        store.complete(&c.hold(), &response()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter is woken by the completion, not by its 30 s timeout");
    }
}
