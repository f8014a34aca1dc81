//! Stripe's scheme: `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`.
//!
//! The MAC covers `"<t>.<raw body>"` under the endpoint's secret (the `whsec_...` string itself
//! is the HMAC key, as Stripe's libraries use it). Several `v1=` entries may be present (a
//! sender rotating its secret): one match is enough; other schemes (`v0=`) are ignored, as
//! Stripe's libraries do. Stripe retries a delivery with the same event, so the event's `id`
//! is the dedupe key.

use std::time::{Duration, SystemTime};

use super::{any_matches, check_age, digest, mac, SignatureError};

/// The header that carries the signature.
pub const HEADER: &str = "stripe-signature";

const FORMAT: &str = "`t=<unix seconds>,v1=<hex HMAC-SHA256>`";

/// The header value for `body` signed at `timestamp` (Unix seconds) with `secret`.
///
/// What a sender computes; the tests sign their deliveries with it.
///
/// ```
/// let header = webhooks_example::signature::stripe::sign(b"whsec_test", 1_700_000_000, br#"{"id":"evt_1"}"#);
/// assert!(header.starts_with("t=1700000000,v1="));
/// ```
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let digest = digest(secret, &[timestamp.as_bytes(), b".", body]);
    format!("t={timestamp},v1={}", hex::encode(digest))
}

/// Check `header` against `body`, the `secret` and the clock.
///
/// The timestamp is checked before the MAC is computed.
pub fn verify(
    secret: &[u8],
    header: Option<&str>,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing(HEADER))?;
    let malformed = SignatureError::Malformed {
        header: HEADER,
        format: FORMAT,
    };
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = Some(value),
            // One that is not hex matches nothing, as in Stripe's libraries; the header is
            // malformed only when no `v1` can be read.
            Some(("v1", value)) => candidates.extend(hex::decode(value).ok()),
            Some(_) => {} // other schemes (v0, ...) are ignored, as Stripe does
            None => return Err(malformed),
        }
    }
    let timestamp = timestamp.ok_or(malformed.clone())?;
    let seconds: u64 = timestamp.parse().map_err(|_| malformed.clone())?;
    if candidates.is_empty() {
        return Err(malformed);
    }
    check_age(seconds, now, tolerance)?;
    any_matches(
        &mac(secret, &[timestamp.as_bytes(), b".", body]),
        &candidates,
    )
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::signature::DEFAULT_TOLERANCE;

    // Stripe publishes the algorithm but no fixed vector. This one was computed outside this
    // code, twice (Python's hmac and `openssl dgst -sha256 -hmac`), and written here by hand:
    //   printf '%s' '1614265330.{"id":"evt_test_webhook","object":"event"}' \
    //     | openssl dgst -sha256 -hmac whsec_test_secret
    const SECRET: &[u8] = b"whsec_test_secret";
    const BODY: &[u8] = br#"{"id":"evt_test_webhook","object":"event"}"#;
    const T: u64 = 1614265330;
    const VECTOR: &str =
        "t=1614265330,v1=3c5817089d739023dd6190f70a3757e04f7a2fd8b5dab12c2e000f51970dccff";

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn the_hand_written_vector_signs_and_verifies() {
        assert_eq!(sign(SECRET, T, BODY), VECTOR);
        assert_eq!(
            verify(SECRET, Some(VECTOR), BODY, at(T + 10), DEFAULT_TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn one_matching_v1_among_several_is_enough() {
        let v1 = VECTOR.split_once(",v1=").expect("v1").1;
        let header = format!("t={T},v1={},v0=abc,v1=zz,v1={v1}", "00".repeat(32));
        assert_eq!(
            verify(SECRET, Some(&header), BODY, at(T), DEFAULT_TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn tampering_fails() {
        let other_body = verify(
            SECRET,
            Some(VECTOR),
            br#"{"id":"evt_other","object":"event"}"#,
            at(T),
            DEFAULT_TOLERANCE,
        );
        assert_eq!(other_body, Err(SignatureError::Mismatch));
        let moved = VECTOR.replace(&format!("t={T}"), &format!("t={}", T + 1));
        assert_eq!(
            verify(SECRET, Some(&moved), BODY, at(T), DEFAULT_TOLERANCE),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"other", Some(VECTOR), BODY, at(T), DEFAULT_TOLERANCE),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn old_and_future_timestamps_are_stale() {
        let late = verify(SECRET, Some(VECTOR), BODY, at(T + 301), DEFAULT_TOLERANCE);
        assert_eq!(
            late,
            Err(SignatureError::Stale {
                age_secs: 301,
                tolerance_secs: 300
            })
        );
        let early = verify(SECRET, Some(VECTOR), BODY, at(T - 301), DEFAULT_TOLERANCE);
        assert!(matches!(early, Err(SignatureError::Stale { .. })));
        assert_eq!(
            verify(SECRET, Some(VECTOR), BODY, at(T + 300), DEFAULT_TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        for header in ["", "v1=00", "t=abc,v1=00", "t=1", "t=1,v1=zz", "garbage"] {
            assert!(
                matches!(
                    verify(SECRET, Some(header), BODY, at(T), DEFAULT_TOLERANCE),
                    Err(SignatureError::Malformed { header: HEADER, .. })
                ),
                "{header:?}"
            );
        }
        assert_eq!(
            verify(SECRET, None, BODY, at(T), DEFAULT_TOLERANCE),
            Err(SignatureError::Missing(HEADER))
        );
    }
}
