//! A client that goes away mid-handler.

use super::*;

/// A client that disconnects mid-handler does not stop the handler; its answer is saved and the
/// retry replays it (no second execution).
pub async fn client_disconnect_still_records_the_answer<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    // its own client, so the aborted connection is not reused
    let request = client()
        .post(server.url("/held"))
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", "gone-1")
        .body(ORDER);
    let attempt = tokio::spawn(send(request));
    server.state.wait_entered(1).await;
    attempt.abort();
    let _ = attempt.await;
    // the server noticed the client left and dropped the request future
    server.state.wait_dropped(1).await;
    server.state.release();
    server.state.wait_finished(1).await;
    // the record is saved right after the handler finishes: poll (bounded) until not in flight
    let mut reply = send(server.post_key("/held", "gone-1", ORDER)).await;
    for _ in 0..100 {
        if reply.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        reply = send(server.post_key("/held", "gone-1", ORDER)).await;
    }
    assert_eq!(reply.status, StatusCode::CREATED, "body: {:?}", reply.body);
    assert!(reply.replayed(), "the retry ran the handler again");
    assert_eq!(reply.execution(), 1);
    assert_eq!(server.state.executions(), 1);
}
