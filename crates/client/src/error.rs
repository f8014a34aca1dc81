//! The error an intent ends with when no attempt brought an answer.

use std::time::Duration;

/// A boxed error from the wrapped client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an intent ended without an answer. An intent that got an answer, even a 503 after the
/// last attempt, returns that answer instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The last attempt did not answer in time (the attempt timeout, or the deadline's rest).
    #[error("no answer within {timeout:?} on attempt {attempts}; the server may still have done the work, so retry later with the same Idempotency-Key")]
    Timeout {
        /// Attempts made.
        attempts: u32,
        /// The time the last attempt had.
        timeout: Duration,
    },
    /// The wrapped client failed on the last attempt.
    #[error("the request failed on attempt {attempts}")]
    Transport {
        /// Attempts made.
        attempts: u32,
        /// The wrapped client's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Attempts made before giving up (0 if the client was not ready to send the first).
    pub fn attempts(&self) -> u32 {
        match self {
            Self::Timeout { attempts, .. } | Self::Transport { attempts, .. } => *attempts,
        }
    }

    /// Whether the last attempt timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }
}
