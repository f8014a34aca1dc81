//! The canonical-JSON fingerprint: any bytes, as a request body.
//!
//! Properties: no panic (on any body, JSON or not); for a body that parses as JSON, the canonical
//! form is valid JSON of the same value and is idempotent (`canonical(parse(canonical(x))) ==
//! canonical(x)`); and the same JSON with its object keys in another order and other whitespace
//! has the same fingerprint.
#![no_main]

use bytes::Bytes;
use http::{header::CONTENT_TYPE, request::Parts, Request};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower_idempotency::fingerprint::{canonical_json, DefaultFingerprint, FingerprintFn};

fn json_post() -> Parts {
    Request::post("/orders")
        .header(CONTENT_TYPE, "application/json")
        .body(())
        .expect("a valid request")
        .into_parts()
        .0
}

/// `value` written with every object's keys in reverse order and with whitespace.
fn reordered(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push_str("{ ");
            for (i, (key, value)) in map.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(" : ");
                reordered(value, out);
            }
            out.push_str(" }");
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                reordered(item, out);
            }
            out.push_str(" ]");
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fuzz_target!(|data: &[u8]| {
    let fingerprint = DefaultFingerprint::default();
    let parts = json_post();
    let original = fingerprint.fingerprint(&parts, &Bytes::copy_from_slice(data));

    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let canonical = canonical_json(&value);
    let reparsed: Value =
        serde_json::from_slice(&canonical).expect("the canonical form is valid JSON");
    assert_eq!(reparsed, value, "the canonical form changed the value");
    assert_eq!(
        canonical_json(&reparsed),
        canonical,
        "the canonical form is not idempotent"
    );

    let mut other = String::new();
    reordered(&value, &mut other);
    let other_fingerprint = fingerprint.fingerprint(&parts, &Bytes::from(other.clone()));
    assert_eq!(
        other_fingerprint, original,
        "reordered keys changed the fingerprint: {other}"
    );
});
