//! The request flow for a covered method, top to bottom in the order of the crate docs ("What
//! happens to a request"): read the key, prepare the request (body, scope, fingerprint), claim
//! the key, then answer the claim's outcome: run the handler (claimed), 409 (in flight), 422
//! (mismatch), the saved answer (done), or on a store error 503 (fail-open: the handler).
//!
//! Each step is a call into its own file; this one only says in which order they come.

use std::{future::Future, sync::Arc};

use futures_util::FutureExt;
use http::{Request, Response};
use tracing::Instrument;

use super::{
    bundle::{Answer, Flow, RunState, SharedOf},
    claim::{claim, Claimed},
    prepare::{prepare, read_key, Prepared},
    refuse, replay,
    run::{ClaimedRun, Lease},
    unguarded,
};
use crate::{
    body::{RequestBody, ResponseBody},
    mode::Mode,
    observe::{self, Outcome, RequestRecord},
    store::{ClaimOutcome, FencingToken, Hold, StoreError},
};

/// A covered request, inside its span; its final outcome is counted when the record drops.
///
/// The steps are plain functions around one `async fn` (`guard`) where they can be: each
/// `async fn` between the response future and the handler keeps its arguments beside the future
/// it awaits, so nesting them grows the flow's one allocation and what is copied into it.
pub(super) fn handle<F: Flow>(
    inner: F::Inner,
    layer: SharedOf<F>,
    req: Request<F::ReqBody>,
    record: Arc<RequestRecord>,
) -> impl Future<Output = Answer<F>> {
    let span = record.span().clone();
    let guarded = guard::<F>(inner, layer, req, record.clone()).instrument(span);
    guarded.map(move |result| {
        if let Ok(response) = &result {
            record.status(response.status());
        }
        result
    })
}

/// Read the key, prepare the request, claim the key, answer the claim's outcome.
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
            let req = Request::from_parts(parts, RequestBody::new(body));
            return unguarded::run_unguarded::<F>(inner, &layer, req).await;
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
    match respond::<F>(&layer, prepared, token, claimed, &record) {
        Next::Answer(response) => Ok(response),
        Next::Run(run, req) => run.execute(inner, req).await,
        Next::StoreFailed(req, err) if layer.config.fail_open => {
            unguarded::fail_open::<F>(inner, &layer, req, &err, &record).await
        }
        Next::StoreFailed(_, err) => Ok(refuse::store_failed(&layer.config, &err, &record)),
    }
}

/// What the claim's outcome calls for.
enum Next<F: Flow> {
    /// The layer's own answer: 409, 422 or the saved answer.
    Answer(Response<ResponseBody<F::ResBody>>),
    /// The key is ours: the handler runs.
    Run(ClaimedRun<F>, Request<RequestBody<F::ReqBody>>),
    /// The store failed: 503, or with fail-open the handler (the request as it came).
    StoreFailed(Request<RequestBody<F::ReqBody>>, StoreError),
}

/// Answer the claim's outcome.
fn respond<F: Flow>(
    layer: &SharedOf<F>,
    prepared: Prepared,
    token: FencingToken,
    claimed: Result<Claimed<RunState<F>>, StoreError>,
    record: &Arc<RequestRecord>,
) -> Next<F> {
    match claimed {
        Ok(Claimed {
            outcome: ClaimOutcome::Claimed { taken_over },
            run_state,
        }) => {
            let hold = Hold::new(prepared.key_hash, token);
            let uri = &prepared.parts.uri;
            let lease = Lease::new::<F::Mode>(layer, hold, record.clone(), uri);
            let (run, req) = run_claimed::<F>(prepared, lease, taken_over, run_state);
            Next::Run(run, req)
        }
        Ok(Claimed {
            outcome: ClaimOutcome::InFlight { lease_remaining },
            ..
        }) => Next::Answer(refuse::in_flight(
            &layer.config,
            &prepared.key_hash,
            prepared.parts.uri.path(),
            lease_remaining,
            record,
        )),
        Ok(Claimed {
            outcome: ClaimOutcome::Mismatch,
            ..
        }) => Next::Answer(refuse::mismatch(&layer.config, record)),
        Ok(Claimed {
            outcome: ClaimOutcome::Done(saved),
            ..
        }) => Next::Answer(replay::replay(&layer.config, saved, record)),
        Err(err) => Next::StoreFailed(prepared.into_request(), err),
    }
}

/// The key is ours: the request for the handler and its [`ClaimedRun`], which a client
/// disconnect does not stop.
fn run_claimed<F: Flow>(
    prepared: Prepared,
    lease: Lease<F::Store>,
    taken_over: bool,
    claimed: Option<RunState<F>>,
) -> (ClaimedRun<F>, Request<RequestBody<F::ReqBody>>) {
    if taken_over {
        observe::record(
            Outcome::TakenOver,
            &"a lapsed lease was taken over; the handler runs again",
        );
        observe::taken_over(lease.record.route());
    } else {
        observe::record(Outcome::Claimed, &"key claimed; the handler runs");
    }
    let mut req = prepared.into_request();
    let state = F::Mode::begin_run(&lease.store, req.extensions_mut(), claimed);
    // If the client disconnects and the response future is dropped from here on, the rest of
    // the flow is handed to the runtime: the handler runs to the end and its answer is recorded.
    lease.record.finish_on_drop();
    (ClaimedRun::<F> { lease, state }, req)
}
