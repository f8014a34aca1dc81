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

/// A parked event, as [`SqlConsumer::parked`](crate::sql::SqlConsumer::parked) lists it and
/// `RedisConsumer::parked` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedEvent {
    /// The event's id.
    pub event_id: String,
    /// How many attempts failed.
    pub attempts: u32,
    /// The last failure's error text.
    pub last_error: Option<String>,
    /// The body of the delivery that failed last, if the consumer passed it to
    /// [`Consumer::process_once_with_payload`](crate::Consumer::process_once_with_payload).
    pub payload: Option<Vec<u8>>,
    /// When it was parked, in milliseconds since the Unix epoch, by the store's clock.
    pub parked_at_ms: i64,
}
