//! The one place the tests build the store contract's values ([`Claim`], [`StoredResponse`]).
//!
//! Every test goes through these helpers, so a change in how the library constructs them is a
//! change here only.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tower_idempotency::{
    store::{Claim, FencingToken, StoredResponse},
    Fingerprint, KeyHash,
};

/// A claim of `key` for the request `fingerprint`, with a fresh fencing token.
pub fn new_claim(key: KeyHash, fingerprint: Fingerprint, lease: Duration, ttl: Duration) -> Claim {
    Claim::new(key, fingerprint, FencingToken::new(), lease, ttl)
}

/// A response as a store keeps it.
pub fn stored_response(status: StatusCode, headers: HeaderMap, body: Bytes) -> StoredResponse {
    StoredResponse::new(status, headers, body)
}
