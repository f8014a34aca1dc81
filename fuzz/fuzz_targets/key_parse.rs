//! `Idempotency-Key` parsing: any bytes, as a header value.
//!
//! Properties: no panic; an accepted key is 1 to 255 visible ASCII bytes; its quoted form parses
//! to the same key; reading it from a header map agrees with parsing the value; two values are
//! refused.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tower_idempotency::{
    key::{KeyError, MAX_KEY_LEN},
    IdempotencyKey,
};

/// The draft's sf-string form of `key`.
fn quoted(key: &str) -> Vec<u8> {
    let mut out = vec![b'"'];
    for b in key.bytes() {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
    out
}

fuzz_target!(|data: &[u8]| {
    let parsed = IdempotencyKey::parse(data);
    if let Ok(key) = &parsed {
        let text = key.as_str();
        assert!(!text.is_empty() && text.len() <= MAX_KEY_LEN, "{text:?}");
        assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{text:?}");
        let again = IdempotencyKey::parse(&quoted(text)).expect("the quoted form of a key parses");
        assert_eq!(&again, key);
    }

    let name = HeaderName::from_static("idempotency-key");
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(name.clone(), value.clone());
    let from_headers = IdempotencyKey::from_headers(&headers, &name);
    match (&parsed, &from_headers) {
        (Ok(a), Ok(Some(b))) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        other => panic!("parse and from_headers disagree: {other:?}"),
    }
    headers.append(name.clone(), value);
    assert!(matches!(
        IdempotencyKey::from_headers(&headers, &name),
        Err(KeyError::Multiple)
    ));
});
