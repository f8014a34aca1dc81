//! An answer that was not saved: its log line, the answer the client gets instead, and the key
//! freed for a retry (token-checked). After a failed commit, whether the work landed is asked of
//! the store before the client is told that nothing was done.

use std::time::Duration;

use super::run::Lease;
use crate::{
    error::Rejection,
    mode::{Mode, SaveFailure},
    observe::{self, Outcome},
    store::{bounded, Fenced, Store, StoreError},
};

impl<St: Store> Lease<St> {
    /// The log line of an answer that was not saved, and the answer the client gets instead
    /// (`rejection`, or the handler's own when `None`). A commit that failed also frees the key,
    /// so the retry can do the work that rolled back.
    pub(super) async fn report_unsaved(
        &self,
        failure: &SaveFailure<'_>,
        rejection: Option<Rejection>,
    ) -> Option<Rejection> {
        match (failure, rejection) {
            (SaveFailure::FencedOut, Some(rejection)) => {
                self.record.finish(
                    Outcome::FencedOut,
                    &"the lease was taken over before the commit; the work was rolled back: 409",
                );
                Some(rejection)
            }
            (SaveFailure::FencedOut, None) => {
                self.record.finish(
                    Outcome::FencedOut,
                    &"the lease was taken over before the answer was saved; the answer is sent but not saved",
                );
                None
            }
            (SaveFailure::Failed(err), Some(rejection)) => {
                Some(self.release_after_failed_commit(err, rejection).await)
            }
            (SaveFailure::Failed(err), None) => {
                self.record.finish(
                    Outcome::StoreError,
                    &format_args!("saving the answer failed: {}; the answer is sent but not saved, and a retry after the lease runs the handler again", observe::Chain(*err)),
                );
                None
            }
        }
    }

    /// The commit of the handler's transaction failed: free the key, token-checked. A record
    /// still running under this attempt proves the commit did not land (in single-commit mode,
    /// where the claim was in the transaction, no record at all does). Otherwise, or if the
    /// store cannot tell, a commit cut off on its way may have landed with the answer saved, so
    /// the client is not told that nothing was done.
    async fn release_after_failed_commit(
        &self,
        err: &StoreError,
        rejection: Rejection,
    ) -> Rejection {
        if !err.is_transient() {
            self.record.finish(
                Outcome::StoreError,
                &format_args!(
                    "committing the transaction failed: {}; the work was rolled back: {}",
                    observe::Chain(err),
                    rejection.status().as_u16()
                ),
            );
            self.release("the commit failed").await;
            return rejection;
        }
        let rolled_back = self.commit_did_not_land().await;
        match rolled_back {
            Ok(with) => {
                self.record.finish(Outcome::StoreError, &format_args!("committing the transaction failed: {}; the work was rolled back, {with}: {}", observe::Chain(err), rejection.status().as_u16()));
                rejection
            }
            Err(why) => {
                self.record.finish(Outcome::StoreError, &format_args!("committing the transaction failed: {}; whether it landed is unknown ({why}): 503; a retry with the key gets the saved answer if it did, or runs once if it did not", observe::Chain(err)));
                Rejection::CommitUnconfirmed {
                    retry_after: rejection.retry_after().unwrap_or(Duration::from_secs(1)),
                }
            }
        }
    }

    /// Whether the store shows that a failed commit did not land (`Ok`, with what went with the
    /// work), or why it cannot (`Err`): the record still running under this attempt (released,
    /// token-checked), or in single-commit mode, where the claim was in the transaction, no
    /// record at all.
    async fn commit_did_not_land(&self) -> Result<&'static str, String> {
        let limit = self.config.store_timeout;
        if self.leased {
            return match self.release_hold().await {
                Ok(Fenced::Applied) => Ok("the key released"),
                Ok(Fenced::Lost) => {
                    Err("the record is no longer running under this attempt".to_owned())
                }
                Err(e) => Err(format!(
                    "releasing the key failed too: {}",
                    observe::Chain(&e)
                )),
            };
        }
        match bounded("the read", limit, self.store.get(&self.hold.key)).await {
            Ok(None) => Ok("the claim with it"),
            Ok(Some(_)) => Err("the key has a record".to_owned()),
            Err(e) => Err(format!(
                "reading the key's record failed too: {}",
                observe::Chain(&e)
            )),
        }
    }

    /// Nothing is saved: undo the mode's uncommitted work, then free the key for a retry.
    pub(super) async fn give_up<M: Mode<St>>(&self, run_state: M::RunState, why: &str) {
        M::abandon(run_state, self.config.store_timeout).await;
        self.release(why).await;
    }

    /// The store's token-checked release of this attempt's key, bounded and timed.
    async fn release_hold(&self) -> Result<Fenced, StoreError> {
        let release = self.store.release(&self.hold);
        let release = bounded("the release", self.config.store_timeout, release);
        observe::timed(self.store.name(), "release", release).await
    }

    pub(super) async fn release(&self, why: &str) {
        if !self.leased {
            // The claim was made in the rolled-back transaction: it is gone with it.
            self.record.finish(
                Outcome::Released,
                &format_args!("key released with the rollback: {why}"),
            );
            return;
        }
        match self.release_hold().await {
            Ok(Fenced::Applied) => self
                .record
                .finish(Outcome::Released, &format_args!("key released: {why}")),
            Ok(Fenced::Lost) => self.record.finish(
                Outcome::FencedOut,
                &format_args!("key not released ({why}): the lease was already taken over"),
            ),
            Err(err) => self.record.finish(
                Outcome::StoreError,
                &format_args!(
                    "releasing the key failed ({why}): {}; it frees when the lease lapses",
                    observe::Chain(&err)
                ),
            ),
        }
    }
}
