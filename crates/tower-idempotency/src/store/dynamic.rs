//! [`DynStore`]: a store chosen at run time, behind one type.

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use super::{
    Claim, ClaimOutcome, Fenced, Hold, RecordInfo, Store, StoreError, StoreStats, StoredResponse,
};
use crate::key::KeyHash;

/// A boxed, `Send` future: what [`ErasedStore`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the fenced writes of [`ErasedStore`] return.
pub type FencedFuture<'a> = BoxFuture<'a, Result<Fenced, StoreError>>;

/// The dyn-compatible form of [`Store`]: the same operations (named `dyn_*`, so that both traits
/// can be in scope), returning boxed futures.
///
/// Implemented for every [`Store`]; you never implement it yourself. Use it through
/// [`DynStore`].
pub trait ErasedStore: fmt::Debug + Send + Sync + 'static {
    /// [`Store::name`].
    fn dyn_name(&self) -> &'static str;
    /// [`Store::claim`].
    fn dyn_claim<'a>(&'a self, claim: &'a Claim)
        -> BoxFuture<'a, Result<ClaimOutcome, StoreError>>;
    /// [`Store::renew`].
    fn dyn_renew<'a>(&'a self, hold: &'a Hold, lease: Duration) -> FencedFuture<'a>;
    /// [`Store::complete`].
    fn dyn_complete<'a>(&'a self, hold: &'a Hold, response: &'a StoredResponse)
        -> FencedFuture<'a>;
    /// [`Store::release`].
    fn dyn_release<'a>(&'a self, hold: &'a Hold) -> FencedFuture<'a>;
    /// [`Store::sweep`].
    fn dyn_sweep(&self, batch: u32) -> BoxFuture<'_, Result<u64, StoreError>>;
    /// [`Store::wait_for_change`].
    fn dyn_wait_for_change<'a>(&'a self, key: &'a KeyHash, timeout: Duration) -> BoxFuture<'a, ()>;
    /// [`Store::get`].
    fn dyn_get<'a>(
        &'a self,
        key: &'a KeyHash,
    ) -> BoxFuture<'a, Result<Option<RecordInfo>, StoreError>>;
    /// [`Store::forget`].
    fn dyn_forget<'a>(&'a self, key: &'a KeyHash) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// [`Store::stats`].
    fn dyn_stats(&self) -> BoxFuture<'_, Result<StoreStats, StoreError>>;
}

impl<S: Store> ErasedStore for S {
    fn dyn_name(&self) -> &'static str {
        Store::name(self)
    }

    fn dyn_claim<'a>(
        &'a self,
        claim: &'a Claim,
    ) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(Store::claim(self, claim))
    }

    fn dyn_renew<'a>(&'a self, hold: &'a Hold, lease: Duration) -> FencedFuture<'a> {
        Box::pin(Store::renew(self, hold, lease))
    }

    fn dyn_complete<'a>(
        &'a self,
        hold: &'a Hold,
        response: &'a StoredResponse,
    ) -> FencedFuture<'a> {
        Box::pin(Store::complete(self, hold, response))
    }

    fn dyn_release<'a>(&'a self, hold: &'a Hold) -> FencedFuture<'a> {
        Box::pin(Store::release(self, hold))
    }

    fn dyn_sweep(&self, batch: u32) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(Store::sweep(self, batch))
    }

    fn dyn_wait_for_change<'a>(&'a self, key: &'a KeyHash, timeout: Duration) -> BoxFuture<'a, ()> {
        Box::pin(Store::wait_for_change(self, key, timeout))
    }

    fn dyn_get<'a>(
        &'a self,
        key: &'a KeyHash,
    ) -> BoxFuture<'a, Result<Option<RecordInfo>, StoreError>> {
        Box::pin(Store::get(self, key))
    }

    fn dyn_forget<'a>(&'a self, key: &'a KeyHash) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::forget(self, key))
    }

    fn dyn_stats(&self) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(Store::stats(self))
    }
}

/// Any [`Store`], chosen at run time: `Idempotency<DynStore>` is one type whichever backend the
/// configuration picked.
///
/// Each operation costs one extra allocation (the boxed future), small next to a network round
/// trip. Transactional mode needs the concrete SQL store (`Idempotency::postgres(pool)` or
/// `::sqlite(pool)`), since the handler's transaction has that database's type.
///
/// ```
/// use tower_idempotency::{store::{DynStore, MemoryStore}, Idempotency};
///
/// # fn postgres_store() -> MemoryStore { MemoryStore::new() }
/// let use_postgres = std::env::var_os("DATABASE_URL").is_some();
/// let store = if use_postgres {
///     DynStore::new(postgres_store()) // e.g. PostgresStore::new(pool)
/// } else {
///     DynStore::new(MemoryStore::new())
/// };
/// let layer = Idempotency::new(store);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct DynStore(Arc<dyn ErasedStore>);

impl DynStore {
    /// Erase the type of `store`.
    pub fn new(store: impl Store) -> Self {
        Self(Arc::new(store))
    }

    /// A store already shared behind an `Arc`.
    pub fn from_arc(store: Arc<dyn ErasedStore>) -> Self {
        Self(store)
    }
}

impl fmt::Debug for DynStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DynStore").field(&self.0).finish()
    }
}

impl Store for DynStore {
    fn name(&self) -> &'static str {
        self.0.dyn_name()
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        self.0.dyn_claim(claim).await
    }

    async fn renew(&self, hold: &Hold, lease: Duration) -> Result<Fenced, StoreError> {
        self.0.dyn_renew(hold, lease).await
    }

    async fn complete(&self, hold: &Hold, response: &StoredResponse) -> Result<Fenced, StoreError> {
        self.0.dyn_complete(hold, response).await
    }

    async fn release(&self, hold: &Hold) -> Result<Fenced, StoreError> {
        self.0.dyn_release(hold).await
    }

    async fn sweep(&self, batch: u32) -> Result<u64, StoreError> {
        self.0.dyn_sweep(batch).await
    }

    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        self.0.dyn_wait_for_change(key, timeout).await
    }

    async fn get(&self, key: &KeyHash) -> Result<Option<RecordInfo>, StoreError> {
        self.0.dyn_get(key).await
    }

    async fn forget(&self, key: &KeyHash) -> Result<bool, StoreError> {
        self.0.dyn_forget(key).await
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        self.0.dyn_stats().await
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    use super::*;
    use crate::{
        fingerprint::Fingerprint,
        key::IdempotencyKey,
        store::{FencingToken, MemoryStore},
    };

    /// A claim of one key and request: each attempt at it claims with a token of its own.
    fn attempt() -> Claim {
        let key = IdempotencyKey::parse(b"k")
            .unwrap()
            .scoped_hash(&crate::key::Scope::new("s"));
        Claim::new(
            key,
            Fingerprint::of(&[b"POST", b"/orders"]),
            FencingToken::new(),
            Duration::from_secs(30),
            Duration::from_secs(60),
        )
    }

    fn saved() -> StoredResponse {
        StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), Bytes::from("ok"))
    }

    #[tokio::test]
    async fn a_dyn_store_forwards_every_write() {
        let store = DynStore::new(MemoryStore::new());
        let claim = attempt();
        assert_eq!(store.claim(&claim).await.unwrap(), ClaimOutcome::claimed());
        assert!(store
            .renew(&claim.hold(), Duration::from_secs(30))
            .await
            .unwrap()
            .applied());
        assert!(store
            .complete(&claim.hold(), &saved())
            .await
            .unwrap()
            .applied());
        let retry = attempt();
        assert_eq!(
            store.claim(&retry).await.unwrap(),
            ClaimOutcome::Done(saved())
        );
        assert!(!store.release(&retry.hold()).await.unwrap().applied());
        assert_eq!(store.sweep(10).await.unwrap(), 0);
        assert!(format!("{store:?}").starts_with("DynStore(MemoryStore"));
        assert_eq!(store.name(), "memory");
    }

    /// The operators' reads and the wait, which have defaults a missing forward would fall back
    /// to (unsupported; a sleep of the whole timeout).
    #[tokio::test(start_paused = true)]
    async fn a_dyn_store_forwards_the_reads_and_the_wait() {
        let store = DynStore::new(MemoryStore::new());
        let claim = attempt();
        store.claim(&claim).await.unwrap();
        store.complete(&claim.hold(), &saved()).await.unwrap();
        let info = store.get(&claim.key).await.unwrap().expect("the record");
        assert_eq!(info.response, Some(saved()));
        assert_eq!(store.stats().await.unwrap().done, 1);
        let started = tokio::time::Instant::now();
        store
            .wait_for_change(&claim.key, Duration::from_secs(60))
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the done record ends the wait"
        );
        assert!(store.forget(&claim.key).await.unwrap());
        assert!(store.get(&claim.key).await.unwrap().is_none());
    }
}
