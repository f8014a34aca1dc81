use std::time::Duration;

/// What [`Consumer::process_once`](crate::Consumer::process_once) did with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a Duplicate is not an error, but it usually changes what the caller answers"]
pub enum Outcome<T> {
    /// The work ran and committed, with the processed mark; here is its value.
    Processed(T),
    /// The event was processed (and committed) before: the work did not run.
    Duplicate,
    /// The event failed too often and is parked: the work did not run. Acknowledge the
    /// delivery; replay the event once its cause is fixed (see
    /// [`sql`](crate::sql#attempts-and-parking)).
    Parked {
        /// How many attempts failed.
        attempts: u32,
    },
    /// Another delivery holds the claim and is running the work (Redis only): it did not run
    /// here. Redeliver later; after `lease_remaining` the claim lapses if its holder died.
    InProgress {
        /// The time left on the holder's lease.
        lease_remaining: Duration,
    },
}

impl<T> Outcome<T> {
    /// Whether the work ran for this delivery.
    pub fn is_processed(&self) -> bool {
        matches!(self, Outcome::Processed(_))
    }

    /// Whether the event had been processed before.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }

    /// Whether the delivery is settled and should be acknowledged: every outcome but
    /// [`InProgress`](Outcome::InProgress).
    pub fn should_ack(&self) -> bool {
        !matches!(self, Outcome::InProgress { .. })
    }

    /// The work's value, if it ran.
    pub fn processed(self) -> Option<T> {
        match self {
            Outcome::Processed(value) => Some(value),
            _ => None,
        }
    }
}
