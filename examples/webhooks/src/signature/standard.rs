//! [Standard Webhooks](https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md):
//! `webhook-id`, `webhook-timestamp` and `webhook-signature`.
//!
//! The MAC is HMAC-SHA256 under the secret's key over `"<webhook-id>.<webhook-timestamp>.<raw
//! body>"`, sent base64-encoded as `v1,<base64>`. `webhook-signature` may carry several
//! space-separated signatures (a sender rotating its secret, or other versions such as `v1a`):
//! one matching `v1` is enough, other versions are ignored. The secret is `whsec_` followed by
//! the base64 of the key. `webhook-id` is the delivery's id, the same on every retry: the
//! receiver's dedupe key.

use std::time::{Duration, SystemTime};

use base64::{engine::general_purpose::STANDARD as BASE64, Engine};

use super::{any_matches, check_age, digest, mac, SignatureError};

/// The delivery's id, the same on every retry.
pub const ID: &str = "webhook-id";
/// When the delivery was signed, in Unix seconds.
pub const TIMESTAMP: &str = "webhook-timestamp";
/// The signatures, `v1,<base64>` separated by spaces.
pub const SIGNATURE: &str = "webhook-signature";

const SIGNATURE_FORMAT: &str = "space-separated `v1,<base64 HMAC-SHA256>` entries";

/// A signing secret, `whsec_<base64 key>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A secret that is not `whsec_` followed by base64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the signing secret must be `whsec_` followed by the base64 of the key (as the sender shows it)")]
pub struct InvalidSecret;

impl Secret {
    /// Parse `whsec_<base64>`.
    ///
    /// ```
    /// use webhooks_example::signature::standard::Secret;
    /// assert!(Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
    /// assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
    /// ```
    pub fn parse(secret: &str) -> Result<Self, InvalidSecret> {
        let encoded = secret.strip_prefix("whsec_").ok_or(InvalidSecret)?;
        let key = BASE64.decode(encoded).map_err(|_| InvalidSecret)?;
        if key.is_empty() {
            return Err(InvalidSecret);
        }
        Ok(Self(key))
    }
}

/// The `webhook-signature` value for the delivery `id` of `body` signed at `timestamp`.
///
/// What a sender computes; the tests sign their deliveries with it.
pub fn sign(secret: &Secret, id: &str, timestamp: u64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let digest = digest(
        &secret.0,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    );
    format!("v1,{}", BASE64.encode(digest))
}

/// Check the three headers against `body`, the secret and the clock; returns the delivery id.
///
/// The timestamp is checked before the MAC is computed.
pub fn verify<'h>(
    secret: &Secret,
    id: Option<&'h str>,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<&'h str, SignatureError> {
    let id = id
        .filter(|id| !id.is_empty())
        .ok_or(SignatureError::Missing(ID))?;
    let timestamp = timestamp.ok_or(SignatureError::Missing(TIMESTAMP))?;
    let signature = signature.ok_or(SignatureError::Missing(SIGNATURE))?;
    let seconds: u64 = timestamp.parse().map_err(|_| SignatureError::Malformed {
        header: TIMESTAMP,
        format: "Unix seconds",
    })?;
    let malformed = SignatureError::Malformed {
        header: SIGNATURE,
        format: SIGNATURE_FORMAT,
    };
    // An entry this receiver cannot read (another version, bad base64) matches nothing, as in
    // the reference libraries; the header is malformed only when no `v1` entry can be read.
    let candidates: Vec<Vec<u8>> = signature
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, value)| BASE64.decode(value).ok())
        .collect();
    if candidates.is_empty() {
        return Err(malformed);
    }
    check_age(seconds, now, tolerance)?;
    let mac = mac(
        &secret.0,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    );
    any_matches(&mac, &candidates)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::signature::DEFAULT_TOLERANCE;

    // The example of the Standard Webhooks specification, written here by hand.
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TIMESTAMP: u64 = 1614265330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn secret() -> Secret {
        Secret::parse(SPEC_SECRET).expect("the spec's secret parses")
    }

    fn check(signature: &str, body: &[u8], now: u64) -> Result<&'static str, SignatureError> {
        verify(
            &secret(),
            Some(SPEC_ID),
            Some(&SPEC_TIMESTAMP.to_string()),
            Some(signature),
            body,
            at(now),
            DEFAULT_TOLERANCE,
        )
    }

    #[test]
    fn the_specification_example_signs_and_verifies() {
        assert_eq!(
            sign(&secret(), SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY),
            SPEC_SIGNATURE
        );
        assert_eq!(
            check(SPEC_SIGNATURE, SPEC_BODY, SPEC_TIMESTAMP),
            Ok(SPEC_ID)
        );
    }

    #[test]
    fn one_matching_v1_among_several_signatures_is_enough() {
        let other = sign(
            &Secret::parse("whsec_b2xkIHNlY3JldA==").expect("secret"),
            SPEC_ID,
            SPEC_TIMESTAMP,
            SPEC_BODY,
        );
        let header = format!("{other} v1a,bm90IGEgdjEgc2lnbmF0dXJl {SPEC_SIGNATURE}");
        assert_eq!(check(&header, SPEC_BODY, SPEC_TIMESTAMP + 10), Ok(SPEC_ID));
        // An entry that cannot be read is no match, not a refusal of the others.
        let header = format!("v1,not*base64 junk {SPEC_SIGNATURE}");
        assert_eq!(check(&header, SPEC_BODY, SPEC_TIMESTAMP + 10), Ok(SPEC_ID));
        assert_eq!(
            check(&other, SPEC_BODY, SPEC_TIMESTAMP),
            Err(SignatureError::Mismatch),
            "the rotated-out secret alone does not verify"
        );
    }

    #[test]
    fn tampering_with_body_id_or_timestamp_fails() {
        assert_eq!(
            check(SPEC_SIGNATURE, br#"{"test": 2432232315}"#, SPEC_TIMESTAMP),
            Err(SignatureError::Mismatch)
        );
        let other_id = verify(
            &secret(),
            Some("msg_other"),
            Some(&SPEC_TIMESTAMP.to_string()),
            Some(SPEC_SIGNATURE),
            SPEC_BODY,
            at(SPEC_TIMESTAMP),
            DEFAULT_TOLERANCE,
        );
        assert_eq!(other_id, Err(SignatureError::Mismatch));
        let other_time = verify(
            &secret(),
            Some(SPEC_ID),
            Some(&(SPEC_TIMESTAMP + 1).to_string()),
            Some(SPEC_SIGNATURE),
            SPEC_BODY,
            at(SPEC_TIMESTAMP),
            DEFAULT_TOLERANCE,
        );
        assert_eq!(other_time, Err(SignatureError::Mismatch));
    }

    #[test]
    fn the_tolerance_bounds_both_directions() {
        assert!(matches!(
            check(SPEC_SIGNATURE, SPEC_BODY, SPEC_TIMESTAMP + 301),
            Err(SignatureError::Stale { age_secs: 301, .. })
        ));
        assert!(matches!(
            check(SPEC_SIGNATURE, SPEC_BODY, SPEC_TIMESTAMP - 301),
            Err(SignatureError::Stale { .. })
        ));
        assert_eq!(
            check(SPEC_SIGNATURE, SPEC_BODY, SPEC_TIMESTAMP + 300),
            Ok(SPEC_ID)
        );
    }

    #[test]
    fn missing_and_malformed_headers_are_refused() {
        let now = at(SPEC_TIMESTAMP);
        let t = SPEC_TIMESTAMP.to_string();
        let refuse = |id, timestamp, signature| {
            verify(
                &secret(),
                id,
                timestamp,
                signature,
                SPEC_BODY,
                now,
                DEFAULT_TOLERANCE,
            )
        };
        assert_eq!(
            refuse(None, Some(&t), Some(SPEC_SIGNATURE)),
            Err(SignatureError::Missing(ID))
        );
        assert_eq!(
            refuse(Some(""), Some(&t), Some(SPEC_SIGNATURE)),
            Err(SignatureError::Missing(ID))
        );
        assert_eq!(
            refuse(Some(SPEC_ID), None, Some(SPEC_SIGNATURE)),
            Err(SignatureError::Missing(TIMESTAMP))
        );
        assert_eq!(
            refuse(Some(SPEC_ID), Some(&t), None),
            Err(SignatureError::Missing(SIGNATURE))
        );
        assert!(matches!(
            refuse(Some(SPEC_ID), Some("yesterday"), Some(SPEC_SIGNATURE)),
            Err(SignatureError::Malformed {
                header: TIMESTAMP,
                ..
            })
        ));
        for signature in ["", "g0hM9SsE", "v1,not base64!", "v2,AAAA", "t=1,v1=00"] {
            assert!(
                matches!(
                    refuse(Some(SPEC_ID), Some(&t), Some(signature)),
                    Err(SignatureError::Malformed {
                        header: SIGNATURE,
                        ..
                    })
                ),
                "{signature:?}"
            );
        }
        assert_eq!(Secret::parse("whsec_"), Err(InvalidSecret));
        assert_eq!(Secret::parse("whsec_***"), Err(InvalidSecret));
    }
}
