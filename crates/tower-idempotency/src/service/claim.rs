//! The claim: one atomic write in the store decides who runs the handler. In wait mode the
//! claim is tried again while the first attempt runs, up to the bound.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::bundle::Shared;
use crate::{
    config::WAIT_POLL_INTERVAL,
    fingerprint::Fingerprint,
    key::KeyHash,
    mode::Mode,
    observe::{self, Outcome},
    store::{
        bounded, Claim, ClaimOutcome, Fenced, FencingToken, Hold, Store, StoreError, StoreErrorKind,
    },
};

/// Claims tried when the store reports a conflict (serialization failure, deadlock) before
/// answering 503.
const CLAIM_TRIES: u32 = 3;

/// The claim's outcome, and the mode's run state when the mode claims inside its own
/// transaction (dropped, so rolled back, unless the outcome is `Claimed`).
pub(super) struct Claimed<R> {
    pub(super) outcome: ClaimOutcome,
    pub(super) run_state: Option<R>,
}

/// Claim once, or in wait mode keep claiming while the first attempt runs, up to the bound. A
/// conflict (nothing was written) is claimed again, up to [`CLAIM_TRIES`]; a failed claim is
/// released in the background.
pub(super) async fn claim<St: Store, M: Mode<St>>(
    layer: &Shared<St, M>,
    key: KeyHash,
    fingerprint: Fingerprint,
    token: FencingToken,
) -> Result<Claimed<M::RunState>, StoreError> {
    let config = &layer.config;
    let claim = Claim::new(key, fingerprint, token, config.lease, config.ttl);
    let deadline = config.wait.map(|wait| Instant::now() + wait);
    let (mut waited, mut conflicts) = (false, 0);
    loop {
        let claimed = bounded(
            "the claim",
            config.store_timeout,
            M::claim(&layer.store, &claim),
        );
        let (outcome, run_state) = match observe::timed(layer.store.name(), "claim", claimed).await
        {
            Err(err) if err.kind() == StoreErrorKind::Conflict && conflicts + 1 < CLAIM_TRIES => {
                conflicts += 1;
                tracing::debug!(target: "tower_idempotency", error = %observe::Chain(&err), conflicts, "the claim conflicted with a concurrent one; claiming again");
                // Boxed, as the wait below: the claim's future does not carry their room.
                Box::pin(tokio::time::sleep(Duration::from_millis(5 << conflicts))).await;
                continue;
            }
            Ok(claimed) => claimed,
            Err(err) => {
                release_failed_claim(layer, claim.hold(), &err);
                return Err(err);
            }
        };
        let now = Instant::now();
        match (outcome, deadline) {
            (ClaimOutcome::InFlight { lease_remaining }, Some(deadline)) if now < deadline => {
                drop(run_state);
                waited = true;
                let pause = (deadline - now)
                    .min(lease_remaining)
                    .min(WAIT_POLL_INTERVAL);
                Box::pin(M::wait(&layer.store, &key, pause)).await;
            }
            (outcome, _) => {
                if waited {
                    observe::record(Outcome::Waited, &"waited for the first attempt");
                }
                return Ok(Claimed { outcome, run_state });
            }
        }
    }
}

/// After a failed claim (a timeout, a cut connection), the claim may still have landed: release it,
/// fenced by our token so nothing else is touched, so that a retry need not wait for the lease to
/// lapse. In the background, because the client's 503 should not wait for a store in trouble. A
/// claim refused as [`StoreErrorKind::Full`] was never sent: there is nothing to release, and a
/// release would only join the queue that is already full.
fn release_failed_claim<St: Store, M>(layer: &Shared<St, M>, hold: Hold, err: &StoreError) {
    if err.kind() == StoreErrorKind::Full {
        return;
    }
    let store = layer.store.clone();
    let limit = layer.config.store_timeout;
    tokio::spawn(
        async move {
            match bounded("the release", limit, store.release(&hold)).await {
                Ok(Fenced::Applied) => observe::record(
                    Outcome::Released,
                    &"the failed claim had landed after all: key released",
                ),
                Ok(Fenced::Lost) => {}
                Err(err) => observe::record(
                    Outcome::StoreError,
                    &format_args!(
                        "releasing after a failed claim failed: {}; if the claim landed, the key frees when the lease lapses",
                        observe::Chain(&err)
                    ),
                ),
            }
        }
        .in_current_span(),
    );
}
