//! An in-process store.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::{Claim, ClaimOutcome, Fenced, FencingToken, Store, StoreError, StoredResponse};
use crate::{fingerprint::Fingerprint, key::KeyHash};

/// Number of independently locked shards; a power of two so the shard is a mask of the key hash.
const SHARDS: usize = 16;

/// Idempotency records in this process's memory.
///
/// A real store for a single-process service: claims are atomic (each operation holds the lock of
/// the key's shard), leases and expiry work as in the database stores, and wait mode is woken by
/// a [`Notify`] per key. Records are lost when the process exits and are not shared between
/// processes: run several instances behind a load balancer and a retry that lands on another
/// instance executes again. Use the PostgreSQL, SQLite or Redis store there.
///
/// Expired records are treated as absent at once and freed by [`Store::sweep`]; run a
/// [`Sweeper`](crate::Sweeper) so a long-running process does not keep them.
///
/// ```
/// use tower_idempotency::{store::MemoryStore, Idempotency};
///
/// let layer = Idempotency::new(MemoryStore::new());
/// // the same as
/// let layer = Idempotency::memory();
/// # let _ = layer;
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    shards: Arc<[Mutex<HashMap<KeyHash, Record>>; SHARDS]>,
}

struct Record {
    fingerprint: Fingerprint,
    token: FencingToken,
    state: State,
    expires_at: Instant,
    changed: Arc<Notify>,
}

// Most records are done (a running one lives for one handler call), so the large variant is
// the common one and boxing it would add an allocation per record.
#[allow(clippy::large_enum_variant)]
enum State {
    Running { lease_until: Instant },
    Done(StoredResponse),
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records the store holds, expired ones included until swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// `true` when the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &KeyHash) -> MutexGuard<'_, HashMap<KeyHash, Record>> {
        lock(&self.shards[key.0[0] as usize & (SHARDS - 1)])
    }

    /// Apply `write` to the running record of `key` held with `token`, then wake its waiters.
    fn fenced(
        &self,
        key: &KeyHash,
        token: FencingToken,
        write: impl FnOnce(&mut HashMap<KeyHash, Record>) -> bool,
    ) -> Fenced {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let changed = match shard.get(key) {
            Some(r)
                if r.token == token
                    && r.expires_at > now
                    && matches!(r.state, State::Running { .. }) =>
            {
                r.changed.clone()
            }
            _ => return Fenced::Lost,
        };
        let applied = write(&mut shard);
        drop(shard);
        changed.notify_waiters();
        Fenced::from_rows(applied as u64)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a record half-written (every write is a single
    // insert or field assignment), so a poisoned lock is safe to keep using.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
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
        let fresh = |expires_at| Record {
            fingerprint: claim.fingerprint,
            token: claim.token,
            state: State::Running {
                lease_until: now + claim.lease,
            },
            expires_at,
            changed: Arc::new(Notify::new()),
        };
        let Some(record) = shard.get_mut(&claim.key).filter(|r| r.expires_at > now) else {
            shard.insert(claim.key, fresh(now + claim.ttl));
            return Ok(ClaimOutcome::Claimed { taken_over: false });
        };
        if record.fingerprint != claim.fingerprint {
            return Ok(ClaimOutcome::Mismatch);
        }
        Ok(match &record.state {
            State::Done(response) => ClaimOutcome::Done(response.clone()),
            State::Running { lease_until } if *lease_until > now => ClaimOutcome::InFlight {
                lease_remaining: *lease_until - now,
            },
            State::Running { .. } => {
                record.token = claim.token;
                record.state = State::Running {
                    lease_until: now + claim.lease,
                };
                ClaimOutcome::Claimed { taken_over: true }
            }
        })
    }

    async fn renew(
        &self,
        key: &KeyHash,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Fenced, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        Ok(match shard.get_mut(key) {
            Some(Record {
                token: held,
                state: State::Running { lease_until },
                expires_at,
                ..
            }) if *held == token && *expires_at > now => {
                *lease_until = now + lease;
                Fenced::Applied
            }
            _ => Fenced::Lost,
        })
    }

    async fn complete(
        &self,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<Fenced, StoreError> {
        Ok(self.fenced(key, token, |shard| {
            shard
                .get_mut(key)
                .map(|r| r.state = State::Done(response.clone()))
                .is_some()
        }))
    }

    async fn release(&self, key: &KeyHash, token: FencingToken) -> Result<Fenced, StoreError> {
        Ok(self.fenced(key, token, |shard| shard.remove(key).is_some()))
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
                .iter()
                .filter(|(_, r)| r.expires_at <= now)
                .map(|(k, _)| *k)
                .take(left)
                .collect();
            for key in &expired {
                shard.remove(key);
            }
            left -= expired.len();
        }
        Ok((batch as usize - left) as u64)
    }

    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        let changed = match self.shard(key).get(key) {
            Some(record) => record.changed.clone(),
            None => return,
        };
        let notified = changed.notified();
        tokio::pin!(notified);
        // Register before looking again, so a completion between the two steps is not missed.
        notified.as_mut().enable();
        let still_running = matches!(
            self.shard(key).get(key),
            Some(Record { state: State::Running { .. }, changed: current, .. })
                if Arc::ptr_eq(current, &changed)
        );
        if still_running {
            let _ = tokio::time::timeout(timeout, notified).await;
        }
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

    #[tokio::test]
    async fn wait_for_change_wakes_on_completion() {
        let store = MemoryStore::new();
        let c = claim("k", b"", 30_000, 60_000);
        store.claim(&c).await.unwrap();
        let waiter = {
            let store = store.clone();
            let key = c.key;
            tokio::spawn(async move { store.wait_for_change(&key, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        store.complete(&c.key, c.token, &response()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter is woken by the completion, not by its 30 s timeout")
            .unwrap();
    }
}
