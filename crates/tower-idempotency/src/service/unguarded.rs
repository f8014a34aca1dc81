//! The handler without a claim: a request without a key on an [`optional`] layer, or one let
//! through by [`fail_open`] when the store failed. In a transactional mode the handler still
//! gets its transaction, and it ends as a claimed run's would: committed when the answer is
//! one the layer saves, rolled back when it is not (a 503, a
//! [`NotProcessed`](crate::NotProcessed) answer).
//!
//! [`optional`]: crate::Idempotency::optional
//! [`fail_open`]: crate::Idempotency::fail_open

use http::{HeaderMap, Request, Response};
use tower_service::Service;

use super::{
    bundle::{Answer, Flow, SharedOf},
    refuse::reject,
    save::not_to_save,
};
use crate::{
    body::{RequestBody, ResponseBody},
    error::Rejection,
    mode::Mode,
    observe::{self, Outcome, RequestRecord},
    store::StoreError,
};

/// The store failed and the layer fails open: the handler runs without a claim.
pub(super) async fn fail_open<F: Flow>(
    inner: F::Inner,
    layer: &SharedOf<F>,
    req: Request<RequestBody<F::ReqBody>>,
    err: &StoreError,
    record: &RequestRecord,
) -> Answer<F> {
    record.finish(
        Outcome::FailOpen,
        &format_args!(
            "store failed ({}); calling the handler without idempotency (fail-open)",
            observe::Chain(err)
        ),
    );
    run_unguarded::<F>(inner, layer, req).await
}

/// Call the handler unguarded; a commit of its work that fails answers 503 instead.
pub(super) async fn run_unguarded<F: Flow>(
    mut inner: F::Inner,
    layer: &SharedOf<F>,
    mut req: Request<RequestBody<F::ReqBody>>,
) -> Answer<F> {
    let run = F::Mode::begin_unguarded(&layer.store, req.extensions_mut());
    let (parts, body) = inner.call(req).await?.into_parts();
    let keep = not_to_save(&layer.config, &parts, &HeaderMap::new()).is_none();
    if let Err(err) = F::Mode::end_unguarded(run, keep, layer.config.store_timeout).await {
        return Ok(reject(&layer.config, Rejection::for_store_error(&err)));
    }
    Ok(Response::from_parts(parts, ResponseBody::inner(body)))
}
