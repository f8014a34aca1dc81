//! The heartbeat of a claimed run: the lease is renewed while the handler runs.

use std::convert::Infallible;

use tokio::time::Instant;

use super::run::Lease;
use crate::{
    observe::{self, Outcome},
    store::{Fenced, Store},
    timeout::bounded,
};

/// Renew the lease every third of it, forever; the caller drops this when the work ends.
pub(super) async fn renew_forever<St: Store>(run: &Lease<St>) -> Infallible {
    let period = run.config.heartbeat();
    let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let renew = run.store.renew(&run.key, run.token, run.config.lease);
        let renew = bounded("the renewal", run.config.store_timeout, renew);
        match observe::timed(run.store.name(), "renew", renew).await {
            Ok(Fenced::Applied) => observe::renewed(),
            Ok(Fenced::Lost) => {
                observe::record(
                    Outcome::FencedOut,
                    &"the lease was lost while the handler ran; its answer will not be saved",
                );
                return std::future::pending().await;
            }
            Err(err) => observe::record(
                Outcome::StoreError,
                &format_args!(
                    "renewing the lease failed: {}; trying again next beat",
                    observe::Chain(&err)
                ),
            ),
        }
    }
}
