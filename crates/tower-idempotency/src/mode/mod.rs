//! How a claimed run's answer is recorded: on its own ([`Standard`], `standard.rs`), in the
//! handler's database transaction (`Transactional`, `transactional.rs`), or with the claim too
//! in that one transaction (`SingleCommit`, PostgreSQL, `single_commit.rs`).
//!
//! Everything that differs between the modes is a method of [`Mode`], and what a mode keeps for
//! one run is its [`Mode::RunState`]; the request flow (`service/`) calls the methods and never
//! asks which mode it runs in. The default methods are the standard mode's answers.

use std::{future::Future, sync::Arc, time::Duration};

use http::Extensions;

use crate::{
    error::Rejection,
    key::KeyHash,
    store::{Claim, ClaimOutcome, Fenced, Hold, Store, StoreError, StoredResponse},
};

#[cfg(feature = "postgres")]
pub mod single_commit;
mod standard;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub mod transactional;

pub use standard::Standard;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use transactional::Transactional;

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// Why a claimed run's answer was not saved.
#[doc(hidden)]
#[derive(Debug)]
pub enum SaveFailure<'a> {
    /// The record no longer carries the run's token: the lease lapsed and another attempt took
    /// the key over.
    FencedOut,
    /// The store failed.
    Failed(&'a StoreError),
}

/// The answer a claimed run saves, as [`Mode::save_with_work`] gets it: the store, the run's
/// hold on its key, the response, and the bound on each store call.
#[doc(hidden)]
#[derive(Debug)]
pub struct Save<'a, St> {
    pub store: &'a St,
    pub hold: &'a Hold,
    pub response: &'a StoredResponse,
    pub limit: Duration,
}

/// The mode of an [`Idempotency`](crate::Idempotency) layer. Sealed: the modes are [`Standard`],
/// `Transactional` (SQL stores) and `SingleCommit` (PostgreSQL).
pub trait Mode<St: Store>: Sealed + Send + Sync + 'static {
    /// What the mode keeps for one claimed run: the handler's transaction, or nothing.
    #[doc(hidden)]
    type RunState: Send + 'static;

    /// `false` when a claim holds no lease (single commit: the claim is uncommitted until the
    /// end, so there is nothing to renew or release; a rollback undoes it).
    #[doc(hidden)]
    const LEASED: bool = true;

    /// Claim the key; a mode that claims inside the run's transaction returns the run's state
    /// too (dropped, so rolled back, unless the outcome is `Claimed`).
    #[doc(hidden)]
    fn claim(
        store: &Arc<St>,
        claim: &Claim,
    ) -> impl Future<Output = Result<(ClaimOutcome, Option<Self::RunState>), StoreError>> + Send
    {
        async move { Ok((store.claim(claim).await?, None)) }
    }

    /// Wait mode: pause until the key's record may have changed, at most `pause`.
    #[doc(hidden)]
    fn wait(store: &St, key: &KeyHash, pause: Duration) -> impl Future<Output = ()> + Send {
        store.wait_for_change(key, pause)
    }

    /// Prepare a claimed run (from the state [`claim`](Self::claim) returned, if any); may put
    /// something in the request's extensions for the handler.
    #[doc(hidden)]
    fn begin_run(
        store: &Arc<St>,
        extensions: &mut Extensions,
        claimed: Option<Self::RunState>,
    ) -> Self::RunState;

    /// Prepare a run without a claim (no key on an optional layer, or fail-open): what the
    /// handler needs in the extensions, as for [`begin_run`](Self::begin_run).
    #[doc(hidden)]
    fn begin_unguarded(store: &Arc<St>, extensions: &mut Extensions) -> Self::RunState;

    /// End a run without a claim: commit its work when `keep` (the layer would have saved its
    /// answer), else roll it back; each within `limit`. The error of a commit that failed.
    #[doc(hidden)]
    fn end_unguarded(
        run: Self::RunState,
        keep: bool,
        limit: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (run, keep, limit);
        std::future::ready(Ok(()))
    }

    /// Save the handler's response in the transaction of its work, checked against the token,
    /// and commit the two together; each store call is bounded by the save's `limit`. `None`
    /// when there is no work to save it with (standard mode, or a handler that never began its
    /// transaction): the run then saves the response on its own.
    #[doc(hidden)]
    fn save_with_work(
        run: Self::RunState,
        save: Save<'_, St>,
    ) -> impl Future<Output = Option<Result<Fenced, StoreError>>> + Send {
        let _ = (run, save);
        std::future::ready(None)
    }

    /// Undo the run's uncommitted work (the response is not saved), within `limit`.
    #[doc(hidden)]
    fn abandon(run: Self::RunState, limit: Duration) -> impl Future<Output = ()> + Send {
        let _ = (run, limit);
        std::future::ready(())
    }

    /// What the client gets when its response could not be saved: `None` for the handler's
    /// answer (its work stands, unrecorded), or the rejection to send instead (its work was
    /// rolled back with the save).
    #[doc(hidden)]
    fn unsaved(failure: &SaveFailure<'_>, retry_after: Duration) -> Option<Rejection> {
        let _ = (failure, retry_after);
        None
    }
}
