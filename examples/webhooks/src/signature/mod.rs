//! Webhook signature schemes, each under its own headers:
//!
//! - [`standard`]: [Standard Webhooks](https://www.standardwebhooks.com/) — `webhook-id`,
//!   `webhook-timestamp`, `webhook-signature: v1,<base64>` (several, space-separated), `whsec_`
//!   secrets; the delivery id is `webhook-id`.
//! - [`stripe`]: Stripe's `Stripe-Signature: t=<unix seconds>,v1=<hex>`; the delivery id is the
//!   event's `id`.
//!
//! Both sign the timestamp with the body, so an old request cannot be replayed once it is
//! older than the tolerance, and both compare MACs in constant time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub mod standard;
pub mod stripe;

/// How far a signature's timestamp may be from the receiver's clock unless configured otherwise
/// (both schemes recommend five minutes).
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

type HmacSha256 = Hmac<Sha256>;

/// Why a request's signature was refused. Every variant is answered with 401.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header the scheme needs is missing (or not visible ASCII).
    #[error("the {0} header is missing")]
    Missing(&'static str),
    /// A header is not in the scheme's format.
    #[error("the {header} header is not {format}")]
    Malformed {
        /// The header.
        header: &'static str,
        /// Its expected format.
        format: &'static str,
    },
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

/// Refuse `timestamp` (Unix seconds) when it is further than `tolerance` from `now`.
fn check_age(timestamp: u64, now: SystemTime, tolerance: Duration) -> Result<(), SignatureError> {
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let age_secs = now.abs_diff(timestamp);
    if age_secs > tolerance.as_secs() {
        return Err(SignatureError::Stale {
            age_secs,
            tolerance_secs: tolerance.as_secs(),
        });
    }
    Ok(())
}

/// HMAC-SHA256 over the parts, in order.
fn mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes keys of any length: this cannot fail.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// The HMAC-SHA256 over the parts, in order: what a sender sends.
fn digest(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    mac(key, parts).finalize().into_bytes().to_vec()
}

/// Whether one of `candidates` is the MAC, each compared in constant time (`verify_slice`).
fn any_matches(mac: &HmacSha256, candidates: &[Vec<u8>]) -> Result<(), SignatureError> {
    if candidates
        .iter()
        .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
    {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}
