//! An admin router (`admin` feature): the operator verbs over HTTP, for any store.
//!
//! | route | answer |
//! |---|---|
//! | `GET /keys/{key}[?body=true]` with the scope in `Idempotency-Scope` (or `?scope=S`) | 200 with the record (state, lease and expiry left, status, headers; the body only with `body=true`), 404 when there is none |
//! | `DELETE /keys/{key}`, the scope as for `GET` | 204 when a record was forgotten, 404 when there was none |
//! | `GET /key-hashes/{hash}[?body=true]`, `DELETE /key-hashes/{hash}` | the same, for a record named by its key hash (64 hex digits, as `/stats` and the logs show it) |
//! | `POST /sweep?batch=N` | 200 `{"deleted": n}`: expired records deleted now |
//! | `GET /stats` | 200 `{"running": n, "done": n, "expired": n, "oldestRunning": {"keyHash": "..", "ageMs": n}}` ([`StoreStats`](crate::store::StoreStats); `oldestRunning` is `null` when nothing runs) |
//!
//! `scope` is what the layer scoped the key by (under the default scope, the caller's
//! `Authorization` value); absent means anonymous. Send it in the `Idempotency-Scope` header
//! rather than the query where it is a credential: a query string lands in access logs (the
//! header wins when both are given). Errors are `application/problem+json`: 400 for
//! an invalid key, key hash or `batch`, 501 when the store does not implement the verb (a custom
//! store without it; `stats` on Redis Cluster), 503 when the store is unavailable (a retry may
//! cure it), 500 otherwise. The answers are those of the
//! [`tower-idempotency-admin`](https://github.com/tower-idempotency/tower-idempotency/tree/main/crates/admin)
//! command line, which has the same verbs.
//!
//! # Warning
//!
//! The router has no authentication of its own: it can read saved answers and forget keys.
//! Mount it behind your own auth layer, on an internal listener.
//!
//! ```
//! use axum::Router;
//! use tower_idempotency::{admin, store::{DynStore, MemoryStore}};
//!
//! let store = DynStore::new(MemoryStore::new());
//! let app: Router = Router::new().nest("/admin/idempotency", admin::router(store));
//! // .layer(your_auth_layer)
//! # let _ = app;
//! ```

use std::collections::HashMap;

use axum::{
    extract::{FromRequestParts, Path, RawQuery, State},
    http::{request::Parts, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};

use crate::{
    key::{IdempotencyKey, KeyHash, Scope},
    store::{record::time::to_millis, DynStore, RecordState, Store, StoreError, StoreErrorKind},
    sweeper::DEFAULT_SWEEP_BATCH,
};

/// The admin routes over `store`; nest them where you like.
pub fn router(store: DynStore) -> Router {
    Router::new()
        .route("/keys/{key}", get(inspect).delete(forget))
        .route("/key-hashes/{hash}", get(inspect).delete(forget))
        .route("/sweep", post(sweep))
        .route("/stats", get(stats))
        .method_not_allowed_fallback(|| async {
            problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "this admin route does not take that method: the Allow header lists the ones it takes",
            )
        })
        .with_state(store)
}

/// The value of `name` in a query string (`%XX` and `+` decoded), if present.
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| percent_decode(value))
    })
}

fn percent_decode(text: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match bytes[i] {
            b'+' => Some(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    i += 2;
                    Some(high << 4 | low)
                }
                _ => None,
            },
            _ => None,
        };
        out.push(decoded.unwrap_or(bytes[i]));
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    crate::problem::problem_json(status, "about:blank", title, &detail.into()).into_response()
}

fn store_failed(err: &StoreError) -> Response {
    tracing::error!(target: "tower_idempotency", error = %crate::observe::Chain(err), "admin: store operation failed");
    let status = if err.is_transient() {
        StatusCode::SERVICE_UNAVAILABLE
    } else if err.kind() == StoreErrorKind::Unsupported {
        StatusCode::NOT_IMPLEMENTED
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    problem(
        status,
        format!("the store failed: {err}; the cause is in the server's log"),
    )
}

/// The header an operator sends the scope in, kept out of URLs and their logs.
pub const SCOPE_HEADER: &str = "idempotency-scope";

/// The record's identity, as the layer computes it; the detail of a 400 when the key is invalid.
/// The scope comes from the [`SCOPE_HEADER`], else the `scope` query parameter.
fn key_hash(key: &str, headers: &HeaderMap, query: Option<&str>) -> Result<KeyHash, String> {
    let parsed = IdempotencyKey::parse(key.as_bytes())
        .map_err(|reason| format!("not a valid Idempotency-Key: {reason}"))?;
    let hash = match headers.get(SCOPE_HEADER) {
        Some(scope) => parsed.scoped_hash(&Scope::new(scope.as_bytes())),
        None => parsed.scoped_hash(&Scope::new(query_value(query, "scope").unwrap_or_default())),
    };
    Ok(hash)
}

/// The record a route names: `/keys/{key}`, with its scope, or `/key-hashes/{hash}`. A key or
/// hash that is not valid is answered with a 400.
struct Record(KeyHash);

impl<S: Send + Sync> FromRequestParts<S> for Record {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let hash = match params.get("key") {
            Some(key) => key_hash(key, &parts.headers, parts.uri.query()),
            None => parse_hash(params.get("hash").map_or("", String::as_str)).map_err(String::from),
        };
        hash.map(Self)
            .map_err(|detail| problem(StatusCode::BAD_REQUEST, detail))
    }
}

/// A key hash in a path: 64 hex digits; the detail of a 400 otherwise.
fn parse_hash(text: &str) -> Result<KeyHash, &'static str> {
    KeyHash::from_hex(text).ok_or("not a key hash: 64 hex digits, as /stats and the logs show it")
}

async fn inspect(
    State(store): State<DynStore>,
    Record(hash): Record,
    RawQuery(query): RawQuery,
) -> Response {
    let with_body = query_value(query.as_deref(), "body").is_some_and(|v| v == "true");
    let record = match store.get(&hash).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            return problem(
                StatusCode::NOT_FOUND,
                "no record for this key: never used, expired, or used under another scope",
            )
        }
        Err(err) => return store_failed(&err),
    };
    let state = match record.state {
        RecordState::Running => "running",
        _ => "done",
    };
    let mut answer = serde_json::json!({
        "keyHash": hash.to_hex(),
        "state": state,
        "expiresInMs": to_millis(record.expires_in),
    });
    if let Some(lease) = record.lease_remaining {
        answer["leaseRemainingMs"] = to_millis(lease).into();
    }
    if let Some(age) = record.age {
        answer["claimedMsAgo"] = to_millis(age).into();
    }
    if let Some(response) = &record.response {
        answer["status"] = response.status.as_u16().into();
        answer["headers"] = response
            .headers
            .iter()
            .map(|(name, value)| {
                serde_json::json!([name.as_str(), String::from_utf8_lossy(value.as_bytes())])
            })
            .collect();
        answer["bodyBytes"] = response.body.len().into();
        if with_body {
            answer["body"] = String::from_utf8_lossy(&response.body).into_owned().into();
        }
    }
    Json(answer).into_response()
}

async fn forget(State(store): State<DynStore>, Record(hash): Record) -> Response {
    match store.forget(&hash).await {
        Ok(true) => {
            tracing::warn!(target: "tower_idempotency", key_hash = %hash, "admin: key forgotten");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => problem(StatusCode::NOT_FOUND, "no record for this key"),
        Err(err) => store_failed(&err),
    }
}

async fn sweep(State(store): State<DynStore>, RawQuery(query): RawQuery) -> Response {
    let batch = match query_value(query.as_deref(), "batch") {
        None => DEFAULT_SWEEP_BATCH,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "`batch` is a whole number of records per statement, from 1 to 4294967295",
                )
            }
        },
    };
    let mut deleted = 0;
    loop {
        match store.sweep(batch).await {
            Ok(n) => {
                deleted += n;
                if n < u64::from(batch) {
                    break;
                }
            }
            Err(err) => return store_failed(&err),
        }
    }
    Json(serde_json::json!({ "deleted": deleted })).into_response()
}

async fn stats(State(store): State<DynStore>) -> Response {
    let stats = match store.stats().await {
        Ok(stats) => stats,
        Err(err) => return store_failed(&err),
    };
    let oldest = stats.oldest_running.map(
        |oldest| serde_json::json!({ "keyHash": oldest.key.to_hex(), "ageMs": to_millis(oldest.age) }),
    );
    Json(serde_json::json!({
        "running": stats.running,
        "done": stats.done,
        "expired": stats.expired,
        "oldestRunning": oldest,
    }))
    .into_response()
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use http::{HeaderMap, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::{
        fingerprint::Fingerprint,
        store::{Claim, FencingToken, MemoryStore, StoredResponse},
    };

    async fn call(app: &Router, method: &str, uri: &str) -> (StatusCode, serde_json::Value) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// A claim of `key` (no scope unless `scope`) for `lease` and `ttl`.
    fn claim_of(key: &[u8], scope: &str, lease: u64, ttl: u64) -> Claim {
        Claim::new(
            IdempotencyKey::parse(key)
                .unwrap()
                .scoped_hash(&Scope::new(scope)),
            Fingerprint::of(&[b"POST", b"/orders"]),
            FencingToken::new(),
            Duration::from_secs(lease),
            Duration::from_secs(ttl),
        )
    }

    #[tokio::test]
    async fn inspect_and_forget_over_http() {
        let store = DynStore::new(MemoryStore::new());
        let claim = claim_of(b"k-1", "Bearer a b", 30, 3600);
        store.claim(&claim).await.unwrap();
        let saved = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "{\"id\":1}");
        store.complete(&claim.hold(), &saved).await.unwrap();
        let app = router(store);

        let (status, _) = call(&app, "GET", "/keys/k-1").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "another scope");
        let (status, record) = call(&app, "GET", "/keys/k-1?scope=Bearer+a%20b").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(record["state"], "done");
        assert_eq!(record["status"], 201);
        assert!(record.get("body").is_none(), "the body only when asked");
        let (_, with_body) = call(&app, "GET", "/keys/k-1?scope=Bearer+a%20b&body=true").await;
        assert_eq!(with_body["body"], "{\"id\":1}");

        let (status, problem) = call(&app, "GET", "/keys/%20").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        let (status, _) = call(&app, "DELETE", "/keys/k-1?scope=Bearer+a%20b").await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (status, _) = call(&app, "DELETE", "/keys/k-1?scope=Bearer+a%20b").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_method_a_route_does_not_take_is_405_problem_json() {
        let app = router(DynStore::new(MemoryStore::new()));
        for (method, path) in [("GET", "/sweep"), ("PUT", "/stats"), ("POST", "/keys/k-1")] {
            let (status, problem) = call(&app, method, path).await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert_eq!(problem["status"], 405, "{method} {path}: {problem}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sweep_over_http_deletes_what_expired() {
        let store = DynStore::new(MemoryStore::new());
        store.claim(&claim_of(b"k-1", "", 30, 3600)).await.unwrap();
        store.claim(&claim_of(b"k-2", "", 1, 2)).await.unwrap();
        let app = router(store);
        let (status, swept) = call(&app, "POST", "/sweep?batch=10").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(swept["deleted"], 0, "nothing expired yet");
        tokio::time::advance(Duration::from_secs(3)).await;
        let (status, swept) = call(&app, "POST", "/sweep?batch=10").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(swept["deleted"], 1, "the expired record, not the live one");
        let (status, _) = call(&app, "POST", "/sweep?batch=zero").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}
