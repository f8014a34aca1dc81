//! What the broker integrations report about one delivery, and how they settle it.

use crate::{Error, Outcome};

/// How a delivery was settled with the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// Acknowledged: the event is settled (processed now or before, or parked).
    Acked,
    /// Negatively acknowledged: the broker redelivers it.
    Requeued,
    /// Refused for good: the message carried no event id.
    Rejected,
}

/// What a broker integration did with one delivery.
#[derive(Debug)]
#[non_exhaustive]
pub struct Handled<T, E> {
    /// The event id (empty when the message carried none).
    pub event_id: String,
    /// Whether the broker says it delivered this message before.
    pub redelivered: bool,
    /// How many times the broker has delivered it, this time included, where the broker
    /// tells (JetStream does; RabbitMQ classic queues only flag redeliveries).
    pub deliveries: Option<u64>,
    /// What the consumer did: the outcome, or why the work did not commit.
    pub result: Result<Outcome<T>, Error<E>>,
    /// How the delivery was settled.
    pub settlement: Settlement,
}

/// The broker refused or lost the acknowledgement. The event's outcome stands (a committed
/// event stays committed); the broker redelivers the message, and the redelivery is a
/// duplicate.
#[derive(Debug, thiserror::Error)]
#[error("settling the delivery with the broker failed")]
pub struct SettleError(#[source] Box<dyn std::error::Error + Send + Sync>);

impl SettleError {
    pub(crate) fn new(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(err))
    }
}

/// Whether a delivery with this result is settled (acked) rather than redelivered.
pub(crate) fn settles<T, E>(result: &Result<Outcome<T>, Error<E>>) -> bool {
    match result {
        Ok(outcome) => outcome.should_ack(),
        Err(err) => !err.should_redeliver(),
    }
}
