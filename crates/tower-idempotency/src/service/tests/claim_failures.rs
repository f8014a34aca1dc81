//! A claim that fails: what the layer releases afterwards.

use super::*;

/// A store whose claims all fail with `kind`, counting the releases asked of it.
#[derive(Debug)]
struct ClaimsFail {
    kind: crate::store::StoreErrorKind,
    releases: Arc<AtomicUsize>,
}

impl crate::store::Store for ClaimsFail {
    async fn claim(
        &self,
        _: &crate::store::Claim,
    ) -> Result<crate::store::ClaimOutcome, crate::store::StoreError> {
        Err(crate::store::StoreError::new(self.kind, "refused"))
    }
    async fn renew(
        &self,
        _: &crate::store::Hold,
        _: Duration,
    ) -> Result<crate::store::Fenced, crate::store::StoreError> {
        unimplemented!("no claim is ever held")
    }
    async fn complete(
        &self,
        _: &crate::store::Hold,
        _: &crate::store::StoredResponse,
    ) -> Result<crate::store::Fenced, crate::store::StoreError> {
        unimplemented!("no claim is ever held")
    }
    async fn release(
        &self,
        _: &crate::store::Hold,
    ) -> Result<crate::store::Fenced, crate::store::StoreError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(crate::store::Fenced::Lost)
    }
    async fn sweep(&self, _: u32) -> Result<u64, crate::store::StoreError> {
        Ok(0)
    }
}

/// A claim that failed may still have landed, so it is released in the background; one refused
/// as `Full` was never sent, and joins no queue with a release.
#[tokio::test]
async fn a_claim_refused_as_full_is_not_released_but_a_failed_one_is() {
    use crate::store::StoreErrorKind;
    for (kind, released) in [(StoreErrorKind::Unavailable, 1), (StoreErrorKind::Full, 0)] {
        let releases = Arc::new(AtomicUsize::new(0));
        let store = ClaimsFail {
            kind,
            releases: releases.clone(),
        };
        let runs = Arc::default();
        let service =
            Idempotency::new(store).layer(counting_service(Arc::clone(&runs), StatusCode::OK));
        let response = service.oneshot(post("k", "a")).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{kind:?}"
        );
        // The release is a task of its own: the same turns of this (current-thread) runtime
        // that let the `Unavailable` case's release run would let a `Full` one run too.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(releases.load(Ordering::SeqCst), released, "{kind:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}
