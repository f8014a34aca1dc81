//! A key whose answer is saved: the saved status, headers, body and trailers, plus
//! `{replay_header}: true` (`Idempotent-Replayed: true` by default).

use http::{HeaderValue, Response};

use crate::{
    body::ResponseBody,
    config::Config,
    observe::{Outcome, RequestRecord},
    store::StoredResponse,
};

/// The replay of `saved`.
pub(super) fn replay<B>(
    config: &Config,
    saved: StoredResponse,
    record: &RequestRecord,
) -> Response<ResponseBody<B>> {
    record.finish(Outcome::Replayed, &"replaying the saved answer");
    let mut response = Response::new(ResponseBody::with_trailers(saved.body, saved.trailers));
    *response.status_mut() = saved.status;
    *response.headers_mut() = saved.headers;
    response.headers_mut().insert(
        config.replay_header.clone(),
        HeaderValue::from_static("true"),
    );
    response
}
