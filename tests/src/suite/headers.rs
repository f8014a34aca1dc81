//! Which headers a replay carries.

use super::*;

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a [u8]> {
    headers.get_all(name).iter().map(|v| v.as_bytes()).collect()
}

/// The replay carries `Content-Type`, `Location` and every `Link` value in order; not
/// `Set-Cookie`, the handler's `Date`, or a hop-by-hop header named in `Connection`.
pub async fn replay_keeps_resource_headers_only<St: Store, F: Flavour<St>>(store: St) {
    let server = serve(F::layer(store)).await;
    let first = send(server.order("headers-1")).await;
    first.assert_executed(StatusCode::CREATED, 1);
    // the original carries everything the handler set
    assert_eq!(values(&first.headers, "location"), [b"/orders/1"]);
    assert_eq!(
        values(&first.headers, "link"),
        [
            &b"</orders>; rel=\"collection\""[..],
            &b"</customers/c_1>; rel=\"customer\""[..]
        ]
    );
    assert_eq!(
        values(&first.headers, "set-cookie"),
        [b"session=s3cr3t; HttpOnly"]
    );
    assert_eq!(values(&first.headers, "date"), [HANDLER_DATE.as_bytes()]);
    assert_eq!(values(&first.headers, "x-hop"), [b"1"]);

    let replay = send(server.order("headers-1")).await;
    replay.assert_replay_of(&first);
    assert_eq!(
        values(&replay.headers, "content-type"),
        [b"application/json"]
    );
    assert_eq!(values(&replay.headers, "location"), [b"/orders/1"]);
    assert_eq!(
        values(&replay.headers, "link"),
        values(&first.headers, "link")
    );
    assert!(
        replay.headers.get("set-cookie").is_none(),
        "Set-Cookie replayed"
    );
    assert!(replay.headers.get("x-hop").is_none(), "hop-by-hop replayed");
    assert!(
        values(&replay.headers, "date")
            .iter()
            .all(|d| *d != HANDLER_DATE.as_bytes()),
        "the handler's Date was replayed"
    );
    assert!(
        values(&replay.headers, "connection")
            .iter()
            .all(|c| !String::from_utf8_lossy(c).contains("x-hop")),
        "Connection replayed"
    );
    assert_eq!(server.state.executions(), 1);
}
