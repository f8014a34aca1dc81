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
//! - A JSON body holding a number that a 64-bit float cannot tell from its neighbours (more
//!   than 15 digits, an integer beyond the 64-bit ones, an exponent of 100 or more, unless the
//!   number is written as the float's shortest form, as JavaScript writes
//!   `0.30000000000000004`) is hashed as its raw bytes instead: canonicalised,
//!   `{"amount":1.000000000000000001}` and `{"amount":1}` would be the same request, and a
//!   handler that reads decimals exactly would see two. Two such bodies are the same request
//!   only byte for byte.
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
            Some(essence) => is_json(essence.as_bytes()),
            None => true,
        };
        // Only a body with a float (or an integer past 64 bits) is read again for its digits.
        let canonical = json_like
            .then(|| canonical_form(body))
            .flatten()
            .filter(|(_, floats)| !floats || !has_inexact_number(body))
            .map(|(canonical, _)| canonical);
        let body: &[u8] = canonical.as_deref().unwrap_or(body);
        // A request without Content-Type and one with an empty value are hashed apart: the
        // byte 0 cannot start a media type.
        let media_type = media_type.as_ref().map_or(&[0][..], MediaType::as_bytes);
        Fingerprint::of(&[
            parts.method.as_str().as_bytes(),
            path.as_bytes(),
            media_type,
            &header_bytes,
            body,
        ])
    }
}

/// The essence of the `Content-Type` (`type/subtype`, lower-cased, no parameters), or `None`
/// without one. A value that is not visible ASCII counts as its raw bytes, lower-cased.
fn media_type(headers: &HeaderMap) -> Option<MediaType> {
    let value = headers.get(CONTENT_TYPE)?;
    let essence = value.as_bytes().split(|b| *b == b';').next().unwrap_or(&[]);
    let essence = essence.trim_ascii();
    let mut short = [0; SHORT_MEDIA_TYPE];
    Some(match short.get_mut(..essence.len()) {
        // ASCII is its own UTF-8, and lower-cases byte by byte: no `String` needed.
        Some(copy) if essence.is_ascii() => {
            copy.copy_from_slice(essence);
            copy.make_ascii_lowercase();
            MediaType::Short(short, essence.len())
        }
        _ => MediaType::Long(String::from_utf8_lossy(essence).to_ascii_lowercase()),
    })
}

/// The longest media type lower-cased on the stack; real ones are far shorter.
const SHORT_MEDIA_TYPE: usize = 64;

/// A lower-cased media type: the bytes [`media_type`] hashes.
enum MediaType {
    Short([u8; SHORT_MEDIA_TYPE], usize),
    Long(String),
}

impl MediaType {
    fn as_bytes(&self) -> &[u8] {
        match self {
            MediaType::Short(bytes, len) => &bytes[..*len],
            MediaType::Long(text) => text.as_bytes(),
        }
    }
}

/// `application/json`, or any `type/subtype+json` such as `application/merge-patch+json`.
fn is_json(essence: &[u8]) -> bool {
    essence == b"application/json" || essence.ends_with(b"+json")
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
                write_scalar(key, out);
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

fn write_scalar<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Serialising a scalar into a Vec cannot fail.
    serde_json::to_writer(&mut *out, value).expect("a JSON scalar always serialises");
}

/// A string as [`write_scalar`] writes it. One borrowed from the body had no escapes there, and
/// the parser refuses raw control characters, so it holds nothing the serialiser would escape:
/// its canonical form is its own bytes in quotes, copied without a second scan.
// The variant is what matters here, so the `Cow` itself is taken.
#[allow(clippy::ptr_arg)]
fn write_string(text: &std::borrow::Cow<'_, str>, out: &mut Vec<u8>) {
    match text {
        std::borrow::Cow::Borrowed(raw) => {
            debug_assert!(
                !raw.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20),
                "a borrowed string holds nothing to escape"
            );
            out.push(b'"');
            out.extend_from_slice(raw.as_bytes());
            out.push(b'"');
        }
        std::borrow::Cow::Owned(text) => write_scalar(text.as_str(), out),
    }
}

/// Whether the JSON text `body` holds a number that parses to a float standing for more than
/// one literal: with more than 15 digits (what a 64-bit float holds exactly), an integer past
/// `i64`/`u64` (parsed as a float), or an exponent of 100 or more (near the float's limits),
/// and not the shortest writing of the float it parses to ([`round_trips`]). Numbers inside
/// strings do not count; text that is not JSON may answer either way, since it is hashed raw
/// anyway.
fn has_inexact_number(body: &[u8]) -> bool {
    let mut at = 0;
    let mut in_string = false;
    while let Some(&byte) = body.get(at) {
        match (in_string, byte) {
            (true, b'\\') => at += 1,
            (true, b'"') => in_string = false,
            (false, b'"') => in_string = true,
            (false, b'-' | b'0'..=b'9') => {
                let (inexact, end) = number_at(body, at);
                if inexact {
                    return true;
                }
                at = end;
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    false
}

/// The number literal starting at `start`: whether a float cannot hold it exactly, and where it
/// ends.
fn number_at(body: &[u8], start: usize) -> (bool, usize) {
    let mut at = start;
    let negative = body.get(at) == Some(&b'-');
    at += usize::from(negative);
    let digits = |at: &mut usize| {
        let from = *at;
        while body.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        &body[from..*at]
    };
    let whole = digits(&mut at);
    let mut fraction: &[u8] = &[];
    if body.get(at) == Some(&b'.') {
        at += 1;
        fraction = digits(&mut at);
    }
    let mut exponent = None;
    if matches!(body.get(at), Some(b'e' | b'E')) {
        at += 1;
        at += usize::from(matches!(body.get(at), Some(b'+' | b'-')));
        exponent = Some(digits(&mut at));
    }
    if fraction.is_empty() && exponent.is_none() {
        // serde_json reads an integer as u64 or i64 when it fits, else as a float.
        let limit: &[u8] = if negative {
            b"9223372036854775808"
        } else {
            b"18446744073709551615"
        };
        let fits = whole.len() < limit.len() || (whole.len() == limit.len() && whole <= limit);
        return (!fits && !round_trips(&body[start..at]), at);
    }
    // Every digit written counts, zeros too: `0.000..04` is as far from the float's normal
    // range as `4e-324`. Fifteen digits and an exponent of two digits stay well inside it, where
    // a float tells every such literal from its neighbours; anything longer is checked.
    let exponent_digits = exponent.map_or(0, |e| e.iter().skip_while(|&&d| d == b'0').count());
    let suspect = whole.len() + fraction.len() > 15 || exponent_digits > 2;
    (suspect && !round_trips(&body[start..at]), at)
}

/// Whether the number `literal` has the value of the float serde_json parses it to, written
/// with the fewest digits that parse back to it (Rust's `{:e}`), as JavaScript and most
/// serialisers write floats: then no literal of another value parses to the same float, and
/// the canonical form loses nothing. `0.30000000000000004` does; `1.000000000000000001` (parsed as `1`) does not.
fn round_trips(literal: &[u8]) -> bool {
    // Parsed as the canonical form parses it: serde_json's reading of a long literal may be
    // an ulp off the nearest float, and then the literal does not round-trip.
    match serde_json::from_slice::<f64>(literal).ok() {
        Some(float) if float.is_finite() => {
            decimal(literal) == decimal(format!("{float:e}").as_bytes())
        }
        _ => false,
    }
}

/// A number literal's value as its sign, its significant digits and the power of ten of the
/// first of them: `0.0120` and `1.2e-2` are both `(false, "12", -2)`; zero has no digits.
fn decimal(literal: &[u8]) -> (bool, Vec<u8>, i64) {
    let negative = literal.first() == Some(&b'-');
    let unsigned = &literal[usize::from(negative)..];
    let (mantissa, exponent) = match unsigned.iter().position(|b| matches!(b, b'e' | b'E')) {
        Some(e) => {
            let power = std::str::from_utf8(&unsigned[e + 1..])
                .ok()
                .and_then(|text| text.parse::<i64>().ok());
            (&unsigned[..e], power.unwrap_or(i64::MAX))
        }
        None => (unsigned, 0),
    };
    let point = mantissa
        .iter()
        .position(|&b| b == b'.')
        .unwrap_or(mantissa.len());
    let digits: Vec<u8> = mantissa
        .iter()
        .copied()
        .filter(u8::is_ascii_digit)
        .collect();
    let Some(first) = digits.iter().position(|&d| d != b'0') else {
        return (negative, Vec::new(), 0);
    };
    let last = digits.iter().rposition(|&d| d != b'0').unwrap_or(first);
    let power = i64::try_from(point)
        .unwrap_or(i64::MAX)
        .saturating_sub(1)
        .saturating_sub(i64::try_from(first).unwrap_or(i64::MAX))
        .saturating_add(exponent);
    (negative, digits[first..=last].to_vec(), power)
}

/// The canonical form alone, for the tests that hold it against [`canonical_json`].
#[cfg(test)]
pub(crate) fn canonical_bytes(body: &[u8]) -> Option<Vec<u8>> {
    canonical_form(body).map(|(canonical, _)| canonical)
}

/// The canonical form of a JSON document, or `None` when `body` is not JSON: the bytes
/// [`canonical_json`] gives for its parsed value, written while parsing, without building the
/// value (a tree of maps and strings) first.
/// With it, whether a number of the document was parsed as a float.
fn canonical_form(body: &[u8]) -> Option<(Vec<u8>, bool)> {
    use serde::de::DeserializeSeed;
    let mut out = Vec::with_capacity(body.len());
    let floats = std::cell::Cell::new(false);
    // Checked as UTF-8 once here, the parser's strings are not checked again one by one (JSON
    // is UTF-8: a body that is not could not parse anyway).
    let mut parser = serde_json::Deserializer::from_str(std::str::from_utf8(body).ok()?);
    Canonical(&mut out, &floats).deserialize(&mut parser).ok()?;
    parser.end().ok()?;
    Some((out, floats.get()))
}

/// Writes the canonical form of the value being parsed into its buffer, and notes in its flag
/// when a number came as a float.
struct Canonical<'o>(&'o mut Vec<u8>, &'o std::cell::Cell<bool>);

impl<'de> serde::de::DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, parser: D) -> Result<(), D::Error> {
        parser.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Canonical<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        write_scalar(&v, self.0);
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        write_scalar(&v, self.0);
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        write_scalar(&v, self.0);
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.1.set(true);
        // As `Value` does: a float that is not finite has no JSON form but `null`.
        write_scalar(&serde_json::Number::from_f64(v), self.0);
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        write_scalar(v, self.0);
        Ok(())
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<(), E> {
        write_string(&std::borrow::Cow::Borrowed(v), self.0);
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            let mark = self.0.len();
            if !first {
                self.0.push(b',');
            }
            if seq
                .next_element_seed(Canonical(&mut *self.0, self.1))?
                .is_none()
            {
                self.0.truncate(mark);
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Members whose names arrive in strictly increasing order are already in canonical
        // order: they are written in place, with no scratch buffer (most bodies come from code
        // that writes a fixed order, often sorted). The first name out of order, or one member
        // more than `sorted` holds, moves them to the general way below.
        let out = &mut *self.0;
        let start = out.len();
        let mut sorted: [Option<Member<'de>>; SORTED_MEMBERS] = [const { None }; SORTED_MEMBERS];
        let mut count: usize = 0;
        out.push(b'{');
        let pending = loop {
            let Some(key) = map.next_key_seed(MemberName)? else {
                out.push(b'}');
                return Ok(());
            };
            let in_order = match count.checked_sub(1).map(|last| &sorted[last]) {
                None => true,
                Some(Some((last, _))) => last.as_bytes() < key.as_bytes(),
                Some(None) => false,
            };
            if !in_order || count == SORTED_MEMBERS {
                break key;
            }
            if count > 0 {
                out.push(b',');
            }
            write_string(&key, out);
            out.push(b':');
            let value_start = out.len();
            map.next_value_seed(Canonical(&mut *out, self.1))?;
            sorted[count] = Some((key, value_start..out.len()));
            count += 1;
        };
        let (members, scratch) = rest_of_object(map, sorted, count, out, start, pending, self.1)?;
        write_object(out, members, &scratch);
        Ok(())
    }
}

/// The general way for an object whose names are not in order: the members written in place
/// (`sorted`, from `start` in `out`) move to one scratch buffer, and the rest of the object is
/// read into it, from `pending` (the name out of order) on.
fn rest_of_object<'de, A: serde::de::MapAccess<'de>>(
    mut map: A,
    sorted: [Option<Member<'de>>; SORTED_MEMBERS],
    count: usize,
    out: &mut Vec<u8>,
    start: usize,
    pending: std::borrow::Cow<'de, str>,
    floats: &std::cell::Cell<bool>,
) -> Result<(Vec<Member<'de>>, Vec<u8>), A::Error> {
    // Each value is written to one scratch buffer; the members are then put in key order.
    let mut scratch = Vec::new();
    let mut members: Vec<Member<'de>> = Vec::with_capacity(count + 1);
    for (key, range) in sorted.into_iter().flatten() {
        let at = scratch.len();
        scratch.extend_from_slice(&out[range]);
        members.push((key, at..scratch.len()));
    }
    out.truncate(start);
    let mut next = Some(pending);
    loop {
        let key = match next.take() {
            Some(key) => key,
            None => match map.next_key_seed(MemberName)? {
                Some(key) => key,
                None => break,
            },
        };
        let start = scratch.len();
        map.next_value_seed(Canonical(&mut scratch, floats))?;
        members.push((key, start..scratch.len()));
    }
    Ok((members, scratch))
}

/// `members` (their values in `scratch`) as a canonical object in `out`: in name order, and of
/// repeated names only the last.
fn write_object(out: &mut Vec<u8>, mut members: Vec<Member<'_>>, scratch: &[u8]) {
    // Stable, so that of repeated names the last stays last: it wins, as in `Value`.
    members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push(b'{');
    let mut first = true;
    for (i, (key, value)) in members.iter().enumerate() {
        if members.get(i + 1).is_some_and(|next| next.0 == *key) {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        write_string(key, out);
        out.push(b':');
        out.extend_from_slice(&scratch[value.clone()]);
    }
    out.push(b'}');
}

/// An object member: its name, and where its canonical value was written.
type Member<'de> = (std::borrow::Cow<'de, str>, std::ops::Range<usize>);

/// Members of one object written in place before the general way takes over.
const SORTED_MEMBERS: usize = 16;

/// An object member's name, borrowed from the body when it has no escapes.
struct MemberName;

impl<'de> serde::de::DeserializeSeed<'de> for MemberName {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, parser: D) -> Result<Self::Value, D::Error> {
        parser.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for MemberName {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object member name")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v.to_owned()))
    }
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
        let json = Some("application/json");
        let utf8 = Some("application/json; charset=utf-8");
        let a = fp("POST", "/orders", json, r#"{"a":1,"b":2}"#);
        let b = fp("POST", "/orders", utf8, "{ \"b\":2,\n \"a\":1 }");
        assert_eq!(a, b);
    }

    #[test]
    fn plus_json_types_are_canonicalised() {
        let merge_patch = Some("application/merge-patch+json");
        let a = fp("PATCH", "/x", merge_patch, r#"{"a":1,"b":2}"#);
        let b = fp("PATCH", "/x", merge_patch, r#"{"b":2,"a":1}"#);
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
    fn json_that_is_not_utf8_is_its_raw_bytes() {
        let parts = parts("POST", "/x", Some("application/json"));
        let of = |body: &'static [u8]| {
            DefaultFingerprint::default().fingerprint(&parts, &Bytes::from_static(body))
        };
        assert_eq!(canonical_bytes(b"{\"a\": \"\xff\"}"), None);
        assert_eq!(
            canonical_bytes(b"{\"a\": \"\xc3\xa9\"}").as_deref(),
            Some(&b"{\"a\":\"\xc3\xa9\"}"[..])
        );
        assert_ne!(of(b"{\"a\": \"\xff\"}"), of(b"{\"a\":\"\xff\"}"));
        assert_eq!(of(b"{\"a\": \"\xc3\xa9\"}"), of(b"{\"a\":\"\xc3\xa9\"}"));
    }

    #[test]
    fn re_serialised_json_without_content_type_matches() {
        let compact = r#"{"customerId":"c_1","totalCents":40}"#;
        let pretty = "{\n  \"totalCents\": 40,\n  \"customerId\": \"c_1\"\n}";
        assert_eq!(
            fp("POST", "/orders", None, compact),
            fp("POST", "/orders", None, pretty)
        );
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

    /// Scalars the JSON generator above leaves out: floats, large and negative numbers, escapes.
    fn arb_json_wide() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            arb_json().prop_map(|v| v.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| f.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            Just("1e400".to_owned()),
            Just("-0.0".to_owned()),
            Just("12345678901234567890123".to_owned()),
            Just(r#""\u00e9\n\ud83d\ude00\/""#.to_owned()),
            // Raw (unescaped) text the parser lends: DEL, non-ASCII, `/`, in values and names.
            Just("\"a\u{7f}é😀/<>\"".to_owned()),
            Just("{ \"é\u{7f}😀\" : \"z\", \"a/b\" : 1 }".to_owned()),
        ];
        leaf.prop_recursive(3, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[ {} ]", items.join(" , "))),
                prop::collection::vec(("[a-c]{1,2}", inner), 0..5).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\" : {v}"))
                        .collect();
                    format!("{{ {} }}", members.join(" ,\n"))
                }),
            ]
        })
    }

    #[test]
    fn numbers_a_float_cannot_hold_exactly_are_compared_byte_for_byte() {
        // 4e-324 written out: below the float's range, it parses to 5e-324.
        let tiny = format!("[0.{}4]", "0".repeat(323));
        let json = |body| fp("POST", "/p", Some("application/json"), body);
        for (a, b) in [
            (
                r#"{"a":18446744073709551616}"#,
                r#"{"a":18446744073709551617}"#,
            ),
            (
                r#"{"a":-9999999999999999999}"#,
                r#"{"a":-9999999999999999998}"#,
            ),
            (r#"{"x":0.1}"#, r#"{"x":0.10000000000000000001}"#),
            (r#"{"x":1}"#, r#"{"x":1.000000000000000001}"#),
            (r#"{"x":1e400}"#, r#"{"x":1e401}"#),
            // Written out without an exponent, as far below the float's normal range.
            (r#"[5e-324]"#, tiny.as_str()),
            (r#"[1e-400]"#, r#"[2e-400]"#),
        ] {
            assert_ne!(json(a), json(b), "{a} and {b}");
        }
        // Such a body is hashed raw: only the same bytes are the same request.
        assert_ne!(
            json(r#"{"a":1.0000000000000001,"b":1}"#),
            json(r#"{"b":1,"a":1.0000000000000001}"#)
        );
        // Every other number is still canonicalised, and digits in strings are text.
        for (a, b) in [
            // The shortest writing of a float, as JavaScript writes `0.1 + 0.2`.
            (
                r#"{"a":0.30000000000000004,"b":1}"#,
                r#"{ "b": 1, "a": 0.30000000000000004 }"#,
            ),
            (
                r#"[0.7999999999999999,2.220446049250313e-16]"#,
                r#"[ 0.7999999999999999, 2.220446049250313E-16 ]"#,
            ),
            (r#"{"a":0.1,"b":-12.5e3}"#, r#"{ "b": -12.5e3, "a": 0.1 }"#),
            (
                r#"{"a":18446744073709551615}"#,
                r#"{ "a": 18446744073709551615 }"#,
            ),
            (
                r#"{"a":-922337203685477580}"#,
                r#"{ "a": -922337203685477580 }"#,
            ),
            (
                r#"{"a":1.5,"s":"123456789012345678901"}"#,
                r#"{"s":"123456789012345678901","a":1.5}"#,
            ),
            (
                r#"{"a":"\"","n":12345678901234.6}"#,
                r#"{"n":12345678901234.6,"a":"\""}"#,
            ),
            (
                r#"{"a":1000000000000000000000.0}"#,
                r#"{ "a":1000000000000000000000.0}"#,
            ),
        ] {
            assert_eq!(json(a), json(b), "{a} and {b}");
        }
    }

    #[test]
    fn the_streaming_form_is_the_form_of_the_parsed_value() {
        for text in [
            r#"{"b":1,"a":2,"b":3}"#,
            r#"{"k\u0041":1,"kA":2}"#,
            "[]",
            "{}",
            " [ 1 , [ ] , { } ] ",
            "1.5e3",
            "\"x\"",
            "[1,]",
            "{\"a\":1} x",
            "",
        ] {
            let parsed = serde_json::from_slice::<Value>(text.as_bytes()).ok();
            assert_eq!(
                canonical_bytes(text.as_bytes()),
                parsed.as_ref().map(canonical_json),
                "{text}"
            );
        }
    }

    #[test]
    fn objects_written_in_place_then_sorted_match_the_value_form() {
        let members = |names: &mut dyn Iterator<Item = usize>| {
            let members: Vec<String> = names
                .map(|i| format!("\"k{i:02}\":{{\"z\":{i},\"a\":[{i}]}}"))
                .collect();
            format!("{{{}}}", members.join(","))
        };
        for text in [
            members(&mut (0..16)),
            members(&mut (0..17)),
            members(&mut (0..40)),
            members(&mut (0..10).chain(5..8)),
            members(&mut (0..3).chain([1, 20, 2])),
            members(&mut (0..16).rev()),
        ] {
            let parsed = serde_json::from_slice::<Value>(text.as_bytes()).ok();
            assert!(parsed.is_some(), "{text}");
            assert_eq!(
                canonical_bytes(text.as_bytes()),
                parsed.as_ref().map(canonical_json),
                "{text}"
            );
        }
    }

    proptest! {
        #[test]
        fn streaming_canonical_form_matches_the_value_form(text in arb_json_wide()) {
            let parsed = serde_json::from_slice::<Value>(text.as_bytes()).ok();
            prop_assert_eq!(canonical_bytes(text.as_bytes()), parsed.as_ref().map(canonical_json));
        }

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
