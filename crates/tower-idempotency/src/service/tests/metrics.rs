//! The metrics the flow records: one final outcome per guarded request.

use super::*;

use crate::observe::recorded::Recorded;

/// Five guarded requests (saved, replayed, mismatch, rejected without a key, released) and a
/// GET, which is not guarded.
async fn five_guarded_requests_and_a_get() {
    let created = guarded(&Arc::default(), StatusCode::CREATED);
    let limited = guarded(&Arc::default(), StatusCode::TOO_MANY_REQUESTS);
    created.clone().oneshot(post("k", "a")).await.unwrap();
    created.clone().oneshot(post("k", "a")).await.unwrap();
    created.clone().oneshot(post("k", "b")).await.unwrap();
    let no_key = Request::post("/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    created.clone().oneshot(no_key).await.unwrap();
    limited.clone().oneshot(post("k", "a")).await.unwrap();
    // Not a covered method: not a guarded request, not counted.
    let get = Request::get("/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    created.clone().oneshot(get).await.unwrap();
}

#[test]
fn every_guarded_request_counts_exactly_one_final_outcome() {
    let recorded = Recorded::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    ::metrics::with_local_recorder(&recorded, || {
        runtime.block_on(five_guarded_requests_and_a_get())
    });
    let total = "idempotency_requests_total{outcome=";
    // No router matched these requests: the route is unknown, never the raw path.
    let route = "http.route=unknown";
    assert_eq!(recorded.get(&format!("{total}saved,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}replayed,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}mismatch,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}rejected,{route}}}")), 1);
    assert_eq!(recorded.get(&format!("{total}released,{route}}}")), 1);
    assert_eq!(
        recorded.sum(total),
        5,
        "one final outcome per guarded request"
    );
    assert_eq!(
        recorded.get("idempotency_store_duration_seconds{op=claim,store=memory}"),
        4
    );
    assert_eq!(
        recorded.get("idempotency_store_duration_seconds{op=complete,store=memory}"),
        1
    );
    assert_eq!(
        recorded.get("idempotency_store_duration_seconds{op=release,store=memory}"),
        1
    );
}
