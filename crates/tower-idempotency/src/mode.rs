//! How an attempt's answer is recorded: on its own ([`Standard`]), in the handler's database
//! transaction ([`Transactional`](crate::Transactional)), or with the claim too in that one
//! transaction (`SingleCommit`, PostgreSQL).

use std::{future::Future, sync::Arc, time::Duration};

use http::Extensions;

use crate::{
    key::KeyHash,
    store::{Claim, ClaimOutcome, Fenced, FencingToken, Store, StoreError, StoredResponse},
    timeout::bounded,
};

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// The mode of an [`Idempotency`](crate::Idempotency) layer. Sealed: the modes are [`Standard`],
/// [`Transactional`](crate::Transactional) and (PostgreSQL) `SingleCommit`.
pub trait Mode<St: Store>: Sealed + Send + Sync + 'static {
    /// Per-attempt state, created after a successful claim.
    #[doc(hidden)]
    type Attempt: Send + 'static;

    /// `true` when the handler's work commits with the saved response.
    #[doc(hidden)]
    const TRANSACTIONAL: bool;

    /// `false` when a claim holds no lease (single commit: the claim is uncommitted until the
    /// end, so there is nothing to renew or release; a rollback undoes it).
    #[doc(hidden)]
    const LEASED: bool = true;

    /// Claim the key; a mode that claims inside the attempt's transaction returns the attempt
    /// too (dropped, so rolled back, unless the outcome is `Claimed`).
    #[doc(hidden)]
    fn claim(
        store: &Arc<St>,
        claim: &Claim,
    ) -> impl Future<Output = Result<(ClaimOutcome, Option<Self::Attempt>), StoreError>> + Send
    {
        async move { Ok((store.claim(claim).await?, None)) }
    }

    /// Wait mode: pause until the key's record may have changed, at most `pause`.
    #[doc(hidden)]
    fn wait(store: &St, key: &KeyHash, pause: Duration) -> impl Future<Output = ()> + Send {
        store.wait_for_change(key, pause)
    }

    /// Prepare an attempt (from the one [`claim`](Self::claim) returned, if any); may put
    /// something in the request's extensions for the handler.
    #[doc(hidden)]
    fn start(
        store: &Arc<St>,
        extensions: &mut Extensions,
        claimed: Option<Self::Attempt>,
    ) -> Self::Attempt;

    /// Save the handler's response for `key` if the record still carries `token`; each store
    /// call is bounded by `limit` (the store timeout).
    #[doc(hidden)]
    fn finish(
        store: &St,
        attempt: Self::Attempt,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
        limit: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Undo the attempt's uncommitted work (the response is not saved), within `limit`.
    #[doc(hidden)]
    fn abandon(attempt: Self::Attempt, limit: Duration) -> impl Future<Output = ()> + Send;
}

/// The default mode: the response is saved with one store write after the handler answers.
///
/// The handler's own side effects are not covered by that write: if the process dies between
/// the handler's work and the save, a retry after the lease runs the handler again. Use
/// [`Transactional`](crate::Transactional) mode to close that gap for database work.
#[derive(Debug, Clone, Copy, Default)]
pub struct Standard;

impl Sealed for Standard {}

/// Attempts at saving a response before giving up; a failed save leaves the work done but
/// unrecorded, so it is worth a few quick retries.
const COMPLETE_ATTEMPTS: u32 = 3;

impl<St: Store> Mode<St> for Standard {
    type Attempt = ();
    const TRANSACTIONAL: bool = false;

    fn start(_: &Arc<St>, _: &mut Extensions, _: Option<()>) -> Self::Attempt {}

    async fn finish(
        store: &St,
        (): (),
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
        limit: Duration,
    ) -> Result<Fenced, StoreError> {
        let mut attempt = 1;
        loop {
            let saved = bounded("the save", limit, store.complete(key, token, response));
            match saved.await {
                Err(err) if attempt < COMPLETE_ATTEMPTS => {
                    tracing::warn!(target: "tower_idempotency", key = %key, error = %crate::observe::Chain(&err), attempt, "saving the response failed; retrying");
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn abandon((): (), _: Duration) {}
}
