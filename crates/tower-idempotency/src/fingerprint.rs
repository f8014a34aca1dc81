//! What makes two requests "the same request": the fingerprint a key is bound to.
//!
//! The default fingerprint is SHA-256 over the method, the path with its query, the media type of
//! `Content-Type`, the values of any headers named with
//! [`with_fingerprint_headers`](crate::Idempotency::with_fingerprint_headers), and the body.
//!
//! It covers what a handler reads:
//!
//! - The media type (`application/json`, lower-cased, without parameters such as `charset`)
//!   counts, because handlers refuse or read bodies by it: a saved 201 is not replayed to a
//!   `text/plain` retry the handler would refuse, and a saved "wrong Content-Type" 400 is not
//!   replayed to the corrected request.
//! - A JSON body (`application/json` or any `+json` type) that parses is canonicalised first
//!   (object keys sorted at every depth, no insignificant whitespace), so `{"a":1,"b":2}` and
//!   `{ "b":2, "a":1 }` are the same request. So is a body without `Content-Type` that parses as
//!   JSON, since handlers commonly read those as JSON too.
//! - Any other body is hashed as its raw bytes.

use std::fmt;

use bytes::Bytes;
use http::{header::CONTENT_TYPE, request::Parts, HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

/// The SHA-256 identity of a request's content.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The raw 32 bytes, for `bytea`/`BLOB` columns.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, for Redis and logs.
    pub fn to_hex(&self) -> String {
        crate::key::hex(&self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// Computes the [`Fingerprint`] of a request from its head and its buffered body.
///
/// Implemented for closures `Fn(&Parts, &Bytes) -> Fingerprint`. Replace the default when a field
/// that changes on every attempt (a client timestamp, a nonce) must not count:
///
/// ```
/// use tower_idempotency::{fingerprint::{canonical_json, Fingerprint}, Idempotency};
///
/// let layer = Idempotency::memory().with_fingerprint(|parts: &http::request::Parts, body: &bytes::Bytes| {
///     let mut json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
///     if let Some(obj) = json.as_object_mut() {
///         obj.remove("sentAt");
///     }
///     Fingerprint::of(&[parts.method.as_str().as_bytes(), parts.uri.path().as_bytes(), &canonical_json(&json)])
/// });
/// # let _ = layer;
/// ```
pub trait FingerprintFn: Send + Sync + 'static {
    /// The fingerprint of a request.
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint;
}

impl<F> FingerprintFn for F
where
    F: Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync + 'static,
{
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        self(parts, body)
    }
}

impl Fingerprint {
    /// SHA-256 over `fields`, each length-prefixed so that no two field lists collide by
    /// shifting bytes from one field into the next.
    pub fn of(fields: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        for field in fields {
            hasher.update((field.len() as u64).to_be_bytes());
            hasher.update(field);
        }
        Self(hasher.finalize().into())
    }
}

/// The default fingerprint: method, path and query, the chosen headers, canonical body.
#[derive(Debug, Clone, Default)]
pub struct DefaultFingerprint {
    headers: Vec<HeaderName>,
}

impl DefaultFingerprint {
    /// Also hash the values of these request headers (all values, in order).
    pub fn with_headers(headers: Vec<HeaderName>) -> Self {
        Self { headers }
    }
}

impl FingerprintFn for DefaultFingerprint {
    fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        let path = parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/");
        let mut header_bytes = Vec::new();
        for name in &self.headers {
            header_bytes.extend_from_slice(name.as_str().as_bytes());
            for value in parts.headers.get_all(name) {
                header_bytes.push(0);
                header_bytes.extend_from_slice(value.as_bytes());
            }
            header_bytes.push(b'\n');
        }
        let media_type = media_type(&parts.headers);
        let json_like = match &media_type {
            Some(essence) => is_json(essence),
            None => true,
        };
        let canonical;
        let body: &[u8] = match json_like
            .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
            .flatten()
        {
            Some(json) => {
                canonical = canonical_json(&json);
                &canonical
            }
            None => body,
        };
        // A request without Content-Type and one with an empty value are hashed apart: the
        // byte 0 cannot start a media type.
        let media_type = media_type.map_or_else(|| vec![0], String::into_bytes);
        Fingerprint::of(&[
            parts.method.as_str().as_bytes(),
            path.as_bytes(),
            &media_type,
            &header_bytes,
            body,
        ])
    }
}

/// The essence of the `Content-Type` (`type/subtype`, lower-cased, no parameters), or `None`
/// without one. A value that is not visible ASCII counts as its raw bytes, lower-cased.
fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?;
    let essence = value.as_bytes().split(|b| *b == b';').next().unwrap_or(&[]);
    Some(String::from_utf8_lossy(essence.trim_ascii()).to_ascii_lowercase())
}

/// `application/json`, or any `type/subtype+json` such as `application/merge-patch+json`.
fn is_json(essence: &str) -> bool {
    essence == "application/json" || essence.ends_with("+json")
}

/// The canonical form of a JSON value: object keys sorted (by their UTF-8 bytes) at every depth,
/// no whitespace. Sorted explicitly, so the result does not depend on whether serde_json's
/// `preserve_order` feature is enabled somewhere in the build.
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &serde_json::Value, out: &mut Vec<u8>) {
    // Serialising a scalar Value into a Vec cannot fail.
    serde_json::to_writer(&mut *out, value).expect("a JSON scalar always serialises");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn parts(method: &str, uri: &str, content_type: Option<&str>) -> Parts {
        let mut builder = http::Request::builder().method(method).uri(uri);
        if let Some(ct) = content_type {
            builder = builder.header(CONTENT_TYPE, ct);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn fp(method: &str, uri: &str, ct: Option<&str>, body: &str) -> Fingerprint {
        DefaultFingerprint::default()
            .fingerprint(&parts(method, uri, ct), &Bytes::from(body.to_owned()))
    }

    #[test]
    fn json_key_order_and_whitespace_do_not_matter() {
        let a = fp(
            "POST",
            "/orders",
            Some("application/json"),
            r#"{"a":1,"b":2}"#,
        );
        let b = fp(
            "POST",
            "/orders",
            Some("application/json; charset=utf-8"),
            "{ \"b\":2,\n \"a\":1 }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn plus_json_types_are_canonicalised() {
        let a = fp(
            "PATCH",
            "/x",
            Some("application/merge-patch+json"),
            r#"{"a":1,"b":2}"#,
        );
        let b = fp(
            "PATCH",
            "/x",
            Some("application/merge-patch+json"),
            r#"{"b":2,"a":1}"#,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn non_json_bodies_are_raw_bytes() {
        let a = fp("POST", "/x", Some("text/plain"), r#"{"a":1,"b":2}"#);
        let b = fp("POST", "/x", Some("text/plain"), r#"{"b":2,"a":1}"#);
        assert_ne!(a, b);
    }

    #[test]
    fn invalid_json_falls_back_to_raw_bytes() {
        let a = fp("POST", "/x", Some("application/json"), "{not json");
        let b = fp("POST", "/x", Some("application/json"), "{not json");
        let c = fp("POST", "/x", Some("application/json"), "{not  json");
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn re_serialised_json_without_content_type_matches() {
        let a = fp(
            "POST",
            "/orders",
            None,
            r#"{"customerId":"c_1","totalCents":40}"#,
        );
        let b = fp(
            "POST",
            "/orders",
            None,
            "{\n  \"totalCents\": 40,\n  \"customerId\": \"c_1\"\n}",
        );
        assert_eq!(a, b);
        // Not JSON: raw bytes, as before.
        assert_ne!(
            fp("POST", "/x", None, "a=1&b=2"),
            fp("POST", "/x", None, "b=2&a=1")
        );
    }

    #[test]
    fn the_media_type_counts_but_not_its_parameters_or_case() {
        let body = r#"{"a":1}"#;
        let json = fp("POST", "/x", Some("application/json"), body);
        assert_ne!(json, fp("POST", "/x", Some("text/plain"), body));
        assert_ne!(json, fp("POST", "/x", None, body));
        assert_ne!(
            json,
            fp("POST", "/x", Some("application/merge-patch+json"), body)
        );
        assert_eq!(
            json,
            fp("POST", "/x", Some("Application/JSON ; charset=UTF-8"), body)
        );
        assert_ne!(
            fp("POST", "/x", Some(""), ""),
            fp("POST", "/x", None, ""),
            "an empty Content-Type is not an absent one"
        );
    }

    #[test]
    fn method_path_and_query_count() {
        let base = fp("POST", "/orders?x=1", None, "");
        assert_ne!(base, fp("PATCH", "/orders?x=1", None, ""));
        assert_ne!(base, fp("POST", "/orders?x=2", None, ""));
        assert_ne!(base, fp("POST", "/other?x=1", None, ""));
    }

    #[test]
    fn configured_headers_count() {
        let fingerprint =
            DefaultFingerprint::with_headers(vec![HeaderName::from_static("x-account")]);
        let mut a = parts("POST", "/x", None);
        let mut b = parts("POST", "/x", None);
        a.headers.insert("x-account", "1".parse().unwrap());
        b.headers.insert("x-account", "2".parse().unwrap());
        assert_ne!(
            fingerprint.fingerprint(&a, &Bytes::new()),
            fingerprint.fingerprint(&b, &Bytes::new())
        );
    }

    #[test]
    fn canonical_form_is_sorted_and_compact() {
        let value = json!({"b": [1, {"d": null, "c": "x"}], "a": true});
        assert_eq!(
            canonical_json(&value),
            br#"{"a":true,"b":[1,{"c":"x","d":null}]}"#
        );
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z\\\\\"é ]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-zA-Z_]{1,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Serialise with object keys in reverse order and random-ish whitespace.
    fn scrambled(value: &Value, indent: bool) -> String {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.reverse();
                let inner: Vec<String> = entries
                    .into_iter()
                    .map(|(k, v)| {
                        format!("{} : {}", Value::String(k.clone()), scrambled(v, !indent))
                    })
                    .collect();
                if indent {
                    format!("{{\n  {}\n}}", inner.join(",\n  "))
                } else {
                    format!("{{ {} }}", inner.join(" , "))
                }
            }
            Value::Array(items) => {
                let inner: Vec<String> = items.iter().map(|v| scrambled(v, !indent)).collect();
                format!("[ {} ]", inner.join(" ,\t"))
            }
            scalar => scalar.to_string(),
        }
    }

    proptest! {
        #[test]
        fn invariant_under_key_order_and_whitespace(value in arb_json(), indent in any::<bool>()) {
            let compact = serde_json::to_string(&value).unwrap();
            let other = scrambled(&value, indent);
            prop_assert_eq!(
                fp("POST", "/p", Some("application/json"), &compact),
                fp("POST", "/p", Some("application/json"), &other)
            );
        }

        #[test]
        fn different_values_differ(a in arb_json(), b in arb_json()) {
            prop_assume!(a != b);
            let a = serde_json::to_string(&a).unwrap();
            let b = serde_json::to_string(&b).unwrap();
            prop_assert_ne!(
                fp("POST", "/p", Some("application/json"), &a),
                fp("POST", "/p", Some("application/json"), &b)
            );
        }
    }
}
