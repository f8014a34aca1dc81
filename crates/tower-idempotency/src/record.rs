//! Recording a handler's response, and replaying it.

use http::{header, response::Parts, HeaderMap, HeaderName, StatusCode};

/// The header added to every replayed response by default (rename it with
/// [`with_replay_header`](crate::Idempotency::with_replay_header)).
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Marks the saved stand-in of an answer whose body was over the saved-body limit (see
/// [`with_saved_body_limit`](crate::Idempotency::with_saved_body_limit)): a retry gets the
/// first answer's status and headers, an empty body, and `Idempotent-Body-Not-Kept: true`.
pub const BODY_NOT_KEPT_HEADER: HeaderName = HeaderName::from_static("idempotent-body-not-kept");

/// The headers that describe a body, dropped from the stand-in of a body that was not kept.
pub(crate) const BODY_HEADERS: [HeaderName; 7] = [
    header::CONTENT_LENGTH,
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::ETAG,
    header::LAST_MODIFIED,
    header::ACCEPT_RANGES,
];

/// Decides whether a handler's response is saved (and replayed to retries) or the key is released
/// (and a retry runs the handler again).
///
/// Implemented for closures `Fn(StatusCode) -> bool`.
pub trait SavePolicy: Send + Sync + 'static {
    /// `true` to save a response with this status.
    fn should_save(&self, status: StatusCode) -> bool;

    /// `true` to save this whole response: its head (status, headers, extensions) and its
    /// trailers (empty when it has none). The layer asks this one; the default asks
    /// [`should_save`](Self::should_save) with the status alone. Override it to look at headers
    /// or trailers too, as [`DefaultSavePolicy`] does for gRPC's `grpc-status`.
    fn should_save_response(&self, head: &Parts, trailers: &HeaderMap) -> bool {
        let _ = trailers;
        self.should_save(head.status)
    }
}

impl<F> SavePolicy for F
where
    F: Fn(StatusCode) -> bool + Send + Sync + 'static,
{
    fn should_save(&self, status: StatusCode) -> bool {
        self(status)
    }
}

/// Saves every response, 4xx and 5xx included (a 500 may have taken effect), except the statuses
/// that by definition mean "not processed, try again": 408, 425, 429 and 503, and gRPC answers
/// whose `grpc-status` (in the trailers, or the headers of a trailers-only answer) is
/// `UNAVAILABLE` (14), `RESOURCE_EXHAUSTED` (8) or `ABORTED` (10). For those the key is released,
/// so a rate limiter or load shedder inside the layer does not pin a key to "try again later" for
/// the whole retention.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultSavePolicy;

impl SavePolicy for DefaultSavePolicy {
    fn should_save(&self, status: StatusCode) -> bool {
        !is_retryable_status(status)
    }

    fn should_save_response(&self, head: &Parts, trailers: &HeaderMap) -> bool {
        self.should_save(head.status)
            && !is_retryable_grpc(&head.headers)
            && !is_retryable_grpc(trailers)
    }
}

/// The gRPC status codes that mean "not done, try again": RESOURCE_EXHAUSTED (8), ABORTED (10)
/// and UNAVAILABLE (14).
const RETRYABLE_GRPC_STATUSES: [&[u8]; 3] = [b"8", b"10", b"14"];

/// Named once: a lookup by `&str` parses and hashes the name on every response.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

fn is_retryable_grpc(map: &HeaderMap) -> bool {
    map.get(&GRPC_STATUS)
        .is_some_and(|code| RETRYABLE_GRPC_STATUSES.contains(&code.as_bytes().trim_ascii()))
}

/// Headers that describe one connection or one moment, not the resource: never replayed.
const NOT_SAVED: [HeaderName; 10] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::DATE,
    header::SET_COOKIE,
];

/// Whether an answer is a stream of server-sent events (`Content-Type: text/event-stream`),
/// which has no end to wait for before it is sent.
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.as_bytes().split(|b| *b == b';').next())
        .is_some_and(|essence| {
            essence
                .trim_ascii()
                .eq_ignore_ascii_case(b"text/event-stream")
        })
}

/// The headers of `response` worth replaying: all but hop-by-hop headers (the fixed list and any
/// named in `Connection`), `Date` and `Set-Cookie`. Multi-valued headers keep every value, in order.
pub(crate) fn saved_headers(headers: &HeaderMap) -> HeaderMap {
    let named_in_connection: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    // Room for two more: a replay adds its marker header and the server its `Content-Length`,
    // and a map cloned from this one (the memory store's replays) keeps its table, so neither
    // insert rehashes it.
    let mut saved = HeaderMap::with_capacity(headers.len() + 2);
    for (name, value) in headers {
        if !NOT_SAVED.contains(name) && !named_in_connection.contains(name) {
            saved.append(name.clone(), value.clone());
        }
    }
    saved
}

/// `true` for the statuses that mean "not processed, try again": 408, 425, 429 and 503.
pub(crate) fn is_retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 425 | 429 | 503)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn hop_by_hop_date_and_cookies_are_not_saved() {
        let mut headers = HeaderMap::new();
        headers.append(header::CONTENT_TYPE, "application/json".parse().unwrap());
        headers.append(header::LOCATION, "/orders/1".parse().unwrap());
        headers.append(
            header::DATE,
            "Sun, 29 Nov 2026 10:00:00 GMT".parse().unwrap(),
        );
        headers.append(header::SET_COOKIE, "session=secret".parse().unwrap());
        headers.append(header::CONNECTION, "close, x-trace-hop".parse().unwrap());
        headers.append("x-trace-hop", "1".parse().unwrap());
        headers.append(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.append("link", "<a>".parse().unwrap());
        headers.append("link", "<b>".parse().unwrap());
        let saved = saved_headers(&headers);
        let names: Vec<&str> = saved.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "location", "link"]);
        let links: Vec<_> = saved.get_all("link").iter().collect();
        assert_eq!(links, ["<a>", "<b>"]);
    }

    #[test]
    fn default_policy_releases_grpc_try_again_codes_in_headers_or_trailers() {
        let grpc = |code: &'static str| {
            let mut map = HeaderMap::new();
            map.insert("grpc-status", HeaderValue::from_static(code));
            map
        };
        let head = |headers: HeaderMap| {
            let mut head = http::Response::new(()).into_parts().0;
            head.headers = headers;
            head
        };
        let none = HeaderMap::new();
        for code in ["8", "10", "14"] {
            assert!(!DefaultSavePolicy.should_save_response(&head(none.clone()), &grpc(code)));
            assert!(!DefaultSavePolicy.should_save_response(&head(grpc(code)), &none));
        }
        for code in ["0", "3", "5", "13"] {
            assert!(DefaultSavePolicy.should_save_response(&head(none.clone()), &grpc(code)));
        }
        // A closure policy sees the status only, and keeps deciding by it.
        let policy = |status: StatusCode| status.is_success();
        assert!(policy.should_save_response(&head(grpc("14")), &grpc("14")));
    }

    #[test]
    fn default_policy_releases_only_try_again_statuses() {
        for code in [408, 425, 429, 503] {
            assert!(!DefaultSavePolicy.should_save(StatusCode::from_u16(code).unwrap()));
        }
        for code in [200, 201, 400, 404, 409, 422, 500, 502] {
            assert!(DefaultSavePolicy.should_save(StatusCode::from_u16(code).unwrap()));
        }
    }
}
