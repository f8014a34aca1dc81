//! What the broker integrations report about one delivery, and how they settle it.

use std::future::Future;

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

/// One broker's message, as the broker integrations settle it.
pub(crate) trait Message: Sync {
    /// What is logged when the message carries no event id.
    const MISSING_ID: &'static str;

    /// Ack, requeue or refuse the message for good, as `settlement` says.
    fn settle(
        &self,
        settlement: Settlement,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;
}

/// What a broker says of one delivery of a message.
pub(crate) struct Received<'a, M> {
    pub(crate) message: &'a M,
    pub(crate) redelivered: bool,
    pub(crate) deliveries: Option<u64>,
}

/// Run the event `event_id` of `consumer` (named `consumer`) with `run`, then settle the
/// message: acked once the outcome is settled, requeued otherwise, refused without an event id.
/// The broker integrations' one flow.
pub(crate) async fn process<'a, T, E, M, Run>(
    consumer: &str,
    received: Received<'_, M>,
    event_id: Option<&'a str>,
    run: impl FnOnce(&'a str) -> Run,
) -> Result<Handled<T, E>, SettleError>
where
    M: Message,
    Run: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let (event_id, result, settlement) = match event_id {
        Some(event_id) => {
            let result = run(event_id).await;
            let settlement = if settles(&result) {
                Settlement::Acked
            } else {
                Settlement::Requeued
            };
            (event_id.to_owned(), result, settlement)
        }
        None => {
            tracing::warn!(target: "tower_idempotency_consumer", consumer, "{}", M::MISSING_ID);
            (
                String::new(),
                Err(Error::MissingEventId),
                Settlement::Rejected,
            )
        }
    };
    received.message.settle(settlement).await?;
    Ok(Handled {
        event_id,
        redelivered: received.redelivered,
        deliveries: received.deliveries,
        result,
        settlement,
    })
}
