//! Metrics, traces and request ids around the whole API.

use std::{sync::OnceLock, time::Duration};

use axum::{
    extract::Request,
    http::{header::CONTENT_TYPE, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Router,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower::ServiceBuilder;
use tower_http::{
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    timeout::TimeoutLayer,
    trace::TraceLayer,
};

/// A request that has not been answered after this long gets `408`. Behind the idempotency
/// layer the handler still runs to the end and its answer is saved for the retry.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Latency buckets of `idempotency_store_duration_seconds`, in seconds.
const STORE_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The process's Prometheus recorder, installed on first use (every [`crate::app`] shares it).
///
/// If another recorder was installed first (an embedding application's), this one still renders,
/// but only what was recorded through it: nothing. The binary installs nothing else.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("idempotency_store_duration_seconds".into()),
                    &STORE_BUCKETS,
                )
                .expect("the bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_ok() {
                tower_idempotency::describe_metrics();
            }
            handle
        })
        .clone()
}

/// `GET /metrics`: the Prometheus text format, rendered from the recorder (no listener of its own).
pub(crate) async fn metrics(handle: PrometheusHandle) -> Response {
    handle.run_upkeep();
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        handle.render(),
    )
        .into_response()
}

/// Wrap `router` in request ids (`x-request-id`, kept if the client sent one), an HTTP trace
/// span per request carrying that id, and the request timeout.
pub(crate) fn layers(router: Router) -> Router {
    router.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
            .layer(
                TraceLayer::new_for_http().make_span_with(|request: &Request| {
                    let request_id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    tracing::info_span!(
                        "http_request",
                        "http.request.method" = %request.method(),
                        "url.path" = request.uri().path(),
                        request_id,
                    )
                }),
            )
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(axum::middleware::map_response(timeout_as_problem))
            .layer(TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                REQUEST_TIMEOUT,
            )),
    )
}

/// The timeout's `408`, which `tower-http` sends with an empty body, as this API's problem+json.
/// A `408` with a body of its own (the idempotency layer's, for a body sent too slowly) is left
/// as it is.
async fn timeout_as_problem(response: Response) -> Response {
    if response.status() == StatusCode::REQUEST_TIMEOUT
        && !response.headers().contains_key(CONTENT_TYPE)
    {
        return crate::Problem::answer_timed_out(REQUEST_TIMEOUT).into_response();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_timeouts_408_is_a_problem_and_the_layers_own_408_is_kept() {
        let timed_out = Response::builder()
            .status(StatusCode::REQUEST_TIMEOUT)
            .body(axum::body::Body::empty())
            .unwrap();
        let answered = timeout_as_problem(timed_out).await;
        assert_eq!(answered.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(answered.headers()[CONTENT_TYPE], "application/problem+json");
        let body = axum::body::to_bytes(answered.into_body(), 64 * 1024)
            .await
            .unwrap();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["status"], 408);
        assert!(problem["detail"]
            .as_str()
            .unwrap()
            .contains("same Idempotency-Key"));

        let own = Response::builder()
            .status(StatusCode::REQUEST_TIMEOUT)
            .header(CONTENT_TYPE, "application/problem+json")
            .body(axum::body::Body::from("{\"status\":408}"))
            .unwrap();
        let kept = timeout_as_problem(own).await;
        let body = axum::body::to_bytes(kept.into_body(), 64 * 1024)
            .await
            .unwrap();
        assert_eq!(&body[..], b"{\"status\":408}");
    }
}
