//! How a claimed run's answer is recorded: on its own ([`Standard`]), in the handler's database
//! transaction ([`Transactional`](crate::Transactional)), or with the claim too in that one
//! transaction (`SingleCommit`, PostgreSQL).
//!
//! Everything that differs between the modes is a method of [`Mode`]; the request flow
//! (`service/`) calls them and never asks which mode it runs in.

use std::{future::Future, sync::Arc, time::Duration};

use http::Extensions;

use crate::{
    error::Rejection,
    key::KeyHash,
    store::{Claim, ClaimOutcome, Fenced, FencingToken, Store, StoreError, StoredResponse},
};

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

/// The mode of an [`Idempotency`](crate::Idempotency) layer. Sealed: the modes are [`Standard`],
/// [`Transactional`](crate::Transactional) and (PostgreSQL) `SingleCommit`.
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

    /// Save the handler's response in the transaction of its work, checked against `token`,
    /// and commit the two together; each store call is bounded by `limit`. `None` when there is
    /// no work to save it with (standard mode, or a handler that never began its transaction):
    /// the run then saves the response on its own.
    #[doc(hidden)]
    fn save_with_work(
        store: &St,
        run: Self::RunState,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
        limit: Duration,
    ) -> impl Future<Output = Option<Result<Fenced, StoreError>>> + Send;

    /// Undo the run's uncommitted work (the response is not saved), within `limit`.
    #[doc(hidden)]
    fn abandon(run: Self::RunState, limit: Duration) -> impl Future<Output = ()> + Send;

    /// What the client gets when its response could not be saved: `None` for the handler's
    /// answer (its work stands, unrecorded), or the rejection to send instead (its work was
    /// rolled back with the save).
    #[doc(hidden)]
    fn unsaved(failure: &SaveFailure<'_>, lease: Duration) -> Option<Rejection>;
}

/// The default mode: the response is saved with one store write after the handler answers.
///
/// The handler's own side effects are not covered by that write: if the process dies between
/// the handler's work and the save, a retry after the lease runs the handler again. Use
/// [`Transactional`](crate::Transactional) mode to close that gap for database work.
#[derive(Debug, Clone, Copy, Default)]
pub struct Standard;

impl Sealed for Standard {}

impl<St: Store> Mode<St> for Standard {
    type RunState = ();

    fn begin_run(_: &Arc<St>, _: &mut Extensions, _: Option<()>) -> Self::RunState {}

    async fn save_with_work(
        _: &St,
        (): (),
        _: &KeyHash,
        _: FencingToken,
        _: &StoredResponse,
        _: Duration,
    ) -> Option<Result<Fenced, StoreError>> {
        None
    }

    async fn abandon((): (), _: Duration) {}

    /// The work is done and cannot be undone: the client gets its answer.
    fn unsaved(_: &SaveFailure<'_>, _: Duration) -> Option<Rejection> {
        None
    }
}
