//! The `Webhook-Signature` header: `t=<unix seconds>,v1=<hex HMAC-SHA256>`, Stripe's scheme.
//!
//! The MAC covers `"<t>.<raw body>"`, so neither the body nor the timestamp can be changed
//! without the secret, and an old request cannot be replayed once it is older than the
//! tolerance. Several `v1=` entries may be present (a sender rotating its secret): one match is
//! enough.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The header that carries the signature.
pub const HEADER: &str = "webhook-signature";

/// How far a signature's timestamp may be from the receiver's clock unless configured otherwise.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

type HmacSha256 = Hmac<Sha256>;

/// Why a request's signature was refused. Every variant is answered with 401.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Webhook-Signature` header.
    #[error("the Webhook-Signature header is missing")]
    Missing,
    /// The header is not `t=<unix seconds>,v1=<hex>`.
    #[error("the Webhook-Signature header is not `t=<unix seconds>,v1=<hex HMAC-SHA256>`")]
    Malformed,
    /// The timestamp is further from now than the tolerance.
    #[error("the signature's timestamp is {age_secs} s away from the receiver's clock, more than the {tolerance_secs} s allowed")]
    Stale {
        /// How far the timestamp is from now, in seconds.
        age_secs: u64,
        /// The tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// No `v1` signature matches the body and timestamp under the secret.
    #[error("no v1 signature matches the body and timestamp under the shared secret")]
    Mismatch,
}

/// The header value for `body` signed at `timestamp` (Unix seconds) with `secret`.
///
/// What a sender computes; the tests sign their deliveries with it.
///
/// ```
/// let header = webhooks_example::signature::sign(b"secret", 1_700_000_000, br#"{"id":"evt_1"}"#);
/// assert!(header.starts_with("t=1700000000,v1="));
/// ```
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = keyed(secret);
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// Check `header` against `body`, the `secret` and the clock.
///
/// The timestamp is checked before the MAC is computed, and the MAC is compared in constant
/// time (`verify_slice`), so the answer's timing says nothing about how much of a guess matched.
pub fn verify(
    secret: &[u8],
    header: Option<&str>,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = Some(value),
            Some(("v1", value)) => {
                candidates.push(hex::decode(value).map_err(|_| SignatureError::Malformed)?)
            }
            Some(_) => {} // other schemes (v0, ...) are ignored, as Stripe does
            None => return Err(SignatureError::Malformed),
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    let seconds: u64 = timestamp.parse().map_err(|_| SignatureError::Malformed)?;
    if candidates.is_empty() {
        return Err(SignatureError::Malformed);
    }

    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let age_secs = now.abs_diff(seconds);
    if age_secs > tolerance.as_secs() {
        return Err(SignatureError::Stale {
            age_secs,
            tolerance_secs: tolerance.as_secs(),
        });
    }

    let mut mac = keyed(secret);
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    if candidates
        .iter()
        .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
    {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

fn keyed(secret: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length: this cannot fail.
    HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"whsec_test";
    const BODY: &[u8] = br#"{"id":"evt_1"}"#;
    const T: u64 = 1_700_000_000;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_fresh_signature_verifies() {
        let header = sign(SECRET, T, BODY);
        assert_eq!(
            verify(SECRET, Some(&header), BODY, at(T + 10), DEFAULT_TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn one_matching_v1_among_several_is_enough() {
        let good = sign(SECRET, T, BODY);
        let v1 = good.split_once(",v1=").expect("v1").1;
        let header = format!("t={T},v1={},v0=abc,v1={v1}", "00".repeat(32));
        assert_eq!(
            verify(SECRET, Some(&header), BODY, at(T), DEFAULT_TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn tampering_fails() {
        let header = sign(SECRET, T, BODY);
        let other_body = verify(
            SECRET,
            Some(&header),
            br#"{"id":"evt_2"}"#,
            at(T),
            DEFAULT_TOLERANCE,
        );
        assert_eq!(other_body, Err(SignatureError::Mismatch));
        let moved = header.replace(&format!("t={T}"), &format!("t={}", T + 1));
        assert_eq!(
            verify(SECRET, Some(&moved), BODY, at(T), DEFAULT_TOLERANCE),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"other", Some(&header), BODY, at(T), DEFAULT_TOLERANCE),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn old_and_future_timestamps_are_stale() {
        let header = sign(SECRET, T, BODY);
        let late = verify(SECRET, Some(&header), BODY, at(T + 301), DEFAULT_TOLERANCE);
        assert_eq!(
            late,
            Err(SignatureError::Stale {
                age_secs: 301,
                tolerance_secs: 300
            })
        );
        let early = verify(SECRET, Some(&header), BODY, at(T - 301), DEFAULT_TOLERANCE);
        assert!(matches!(early, Err(SignatureError::Stale { .. })));
        assert_eq!(
            verify(SECRET, Some(&header), BODY, at(T + 300), DEFAULT_TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        for header in ["", "v1=00", "t=abc,v1=00", "t=1", "t=1,v1=zz", "garbage"] {
            assert_eq!(
                verify(SECRET, Some(header), BODY, at(T), DEFAULT_TOLERANCE),
                Err(SignatureError::Malformed),
                "{header:?}"
            );
        }
        assert_eq!(
            verify(SECRET, None, BODY, at(T), DEFAULT_TOLERANCE),
            Err(SignatureError::Missing)
        );
    }
}
