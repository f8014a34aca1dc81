//! The request flow for a covered method, top to bottom in the order of the crate docs ("What
//! happens to a request"): read the key, prepare the request (body, scope, fingerprint), claim
//! the key, then answer the claim's outcome: run the handler (claimed), 409 (in flight), 422
//! (mismatch), the saved answer (done), or on a store error 503 (fail-open: the handler).
//!
//! Each step is a call into its own file; this one only says in which order they come.

use std::sync::Arc;

use http::Request;
use tracing::Instrument;

use super::{
    claim::{claim, Claimed},
    finish_on_drop::FinishOnDrop,
    pass_through,
    prepare::{prepare, read_key, Prepared},
    refuse, replay,
    run::{ClaimedRun, Lease},
    Answer, Flow, RunState, SharedOf,
};
use crate::{
    body::RequestBody,
    mode::Mode,
    observe::{self, Outcome, RequestRecord},
    store::{ClaimOutcome, FencingToken, StoreError},
};

/// A covered request, inside its span; its final outcome is counted when the record drops.
pub(super) async fn handle<F: Flow>(
    inner: F::Inner,
    layer: SharedOf<F>,
    req: Request<F::ReqBody>,
) -> Answer<F> {
    let record = RequestRecord::new(req.method(), req.uri().path(), observe::route_of(&req));
    let span = record.span().clone();
    let result = guard::<F>(inner, layer, req, record.clone())
        .instrument(span)
        .await;
    if let Ok(response) = &result {
        record.status(response.status());
    }
    result
}

/// Read the key, prepare the request, claim the key.
async fn guard<F: Flow>(
    inner: F::Inner,
    layer: SharedOf<F>,
    req: Request<F::ReqBody>,
    record: Arc<RequestRecord>,
) -> Answer<F> {
    let (parts, body) = req.into_parts();
    let key = match read_key(&layer.config, &parts.headers) {
        Ok(Some(key)) => key,
        Ok(None) => {
            record.finish(
                Outcome::NoKey,
                &"no idempotency key: passed through unguarded",
            );
            return pass_through(inner, Request::from_parts(parts, RequestBody::new(body))).await;
        }
        Err(refusal) => return Ok(refusal.answer(&layer.config, &record)),
    };
    let prepared = match prepare(&layer.config, parts, body, key).await {
        Ok(prepared) => prepared,
        Err(refusal) => return Ok(refusal.answer(&layer.config, &record)),
    };
    record.key(&prepared.key_hash);

    let token = FencingToken::new();
    let claimed = claim(&layer, prepared.key_hash, prepared.fingerprint, token).await;
    respond::<F>(inner, layer, prepared, token, claimed, record).await
}

/// Answer the claim's outcome.
async fn respond<F: Flow>(
    inner: F::Inner,
    layer: SharedOf<F>,
    prepared: Prepared,
    token: FencingToken,
    claimed: Result<Claimed<RunState<F>>, StoreError>,
    record: Arc<RequestRecord>,
) -> Answer<F> {
    match claimed {
        Ok(Claimed {
            outcome: ClaimOutcome::Claimed { taken_over },
            run_state,
        }) => {
            let lease = Lease::new::<F::Mode>(&layer, prepared.key_hash, token, record);
            run_claimed::<F>(inner, prepared, lease, taken_over, run_state).await
        }
        Ok(Claimed {
            outcome: ClaimOutcome::InFlight { lease_remaining },
            ..
        }) => Ok(refuse::in_flight(
            &layer.config,
            &prepared,
            lease_remaining,
            &record,
        )),
        Ok(Claimed {
            outcome: ClaimOutcome::Mismatch,
            ..
        }) => Ok(refuse::mismatch(&layer.config, &record)),
        Ok(Claimed {
            outcome: ClaimOutcome::Done(saved),
            ..
        }) => Ok(replay::replay(&layer.config, saved, &record)),
        Err(err) => refuse::store_failed(inner, &layer.config, prepared, &err, &record).await,
    }
}

/// The key is ours: hand the request to the handler as a [`ClaimedRun`], which a client
/// disconnect does not stop.
async fn run_claimed<F: Flow>(
    inner: F::Inner,
    prepared: Prepared,
    lease: Lease<F::Store>,
    taken_over: bool,
    claimed: Option<RunState<F>>,
) -> Answer<F> {
    if taken_over {
        observe::record(
            Outcome::TakenOver,
            &"a lapsed lease was taken over; the handler runs again",
        );
        observe::taken_over(lease.record.route());
    } else {
        observe::record(Outcome::Claimed, &"key claimed; the handler runs");
    }
    let Prepared {
        mut parts,
        bytes,
        key,
        ..
    } = prepared;
    let path = parts.uri.path().to_owned();
    parts.extensions.insert(key);
    let state = F::Mode::begin_run(&lease.store, &mut parts.extensions, claimed);
    let req = Request::from_parts(parts, RequestBody::buffered(bytes));
    let run = ClaimedRun::<F> { lease, state, path };
    // If the client disconnects and this future is dropped, the run is handed to the runtime:
    // the handler runs to the end and its answer is recorded.
    FinishOnDrop::new(run.execute(inner, req).in_current_span()).await
}
