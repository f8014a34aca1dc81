//! What the broker integrations report about one delivery, and how they settle it.

use std::{fmt, future::Future, panic::AssertUnwindSafe, time::Duration};

use futures_util::FutureExt;

use crate::{Consumer, Error, Outcome, Work};

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
    /// tells: JetStream counts every delivery, and so do RabbitMQ quorum queues up to RabbitMQ
    /// 4.2; a RabbitMQ classic queue tells only of a first delivery (`Some(1)`), and flags the
    /// others `redelivered`.
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

/// The pause before a requeued event comes back when nothing says how long to wait: a work or a
/// database that failed gets a moment before the next attempt, so that redeliveries do not spin
/// through a queue's delivery limit (RabbitMQ's `x-delivery-limit`, JetStream's `max_deliver`)
/// in milliseconds.
pub const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

/// How long a requeued delivery should wait before it comes back: the lease left on an event in
/// progress elsewhere (its holder may yet finish it, and no redelivery can run it before), else
/// [`REQUEUE_PAUSE`].
pub(crate) fn redelivery_delay<T, E>(result: &Result<Outcome<T>, Error<E>>) -> Duration {
    match result {
        Ok(Outcome::InProgress { lease_remaining }) => {
            (*lease_remaining).max(Duration::from_millis(100))
        }
        _ => REQUEUE_PAUSE,
    }
}

/// Whether a delivery with this result is settled (acked) rather than redelivered.
pub(crate) fn settles<T, E>(result: &Result<Outcome<T>, Error<E>>) -> bool {
    match result {
        Ok(outcome) => outcome.should_ack(),
        Err(err) => !err.should_redeliver(),
    }
}

/// One broker's message: its event id, its payload, what the broker says of its delivery, and
/// how it is settled. Implemented for RabbitMQ's `Delivery` (feature `rabbitmq`) and
/// JetStream's `Message` (feature `nats`).
pub trait BrokerMessage: Sync + sealed::Sealed {
    /// What is logged when the message carries no event id.
    #[doc(hidden)]
    const MISSING_ID: &'static str;

    /// The event id the broker's message carries, if any.
    fn event_id(&self) -> Option<&str>;

    /// The payload, kept with a failed event for replaying it.
    fn payload(&self) -> &[u8];

    /// Whether the broker says it delivered this message before.
    fn redelivered(&self) -> bool;

    /// How many times the broker has delivered it, where the broker tells.
    fn deliveries(&self) -> Option<u64>;

    /// Ack, requeue or refuse the message for good, as `settlement` says; a requeued message
    /// should come back after `redeliver_after`.
    #[doc(hidden)]
    fn settle(
        &self,
        settlement: Settlement,
        redeliver_after: Duration,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;
}

pub(crate) mod sealed {
    /// Only the broker integrations of this crate are messages.
    pub trait Sealed {}
}

/// [`process_message_as`] with the event id the message carries (RabbitMQ's `message_id`
/// property, JetStream's `Nats-Msg-Id` header).
pub async fn process_message<C: Consumer, T: Send, E: fmt::Display + Send>(
    consumer: &C,
    message: &impl BrokerMessage,
    work: impl Work<C::Context, T, E>,
) -> Result<Handled<T, E>, SettleError> {
    process_message_as(consumer, message, message.event_id(), work).await
}

/// Run `work` for the event `event_id` (carried by `message`) through `consumer`, then settle
/// the message: acked once the outcome is settled (processed now or before, or parked),
/// requeued otherwise, refused for good without an event id (`None` or empty, with
/// [`Error::MissingEventId`]) or with one no store can record ([`Error::InvalidEventId`]). The
/// payload is kept with a failed event, for [replaying](crate::sql::SqlConsumer::replay) it.
///
/// A work that panics is rolled back and counted as a failed attempt, its message requeued
/// after [`REQUEUE_PAUSE`], and the panic goes on unwinding to the caller.
pub async fn process_message_as<C, T, E, M, F>(
    consumer: &C,
    message: &M,
    event_id: Option<&str>,
    work: F,
) -> Result<Handled<T, E>, SettleError>
where
    C: Consumer,
    T: Send,
    E: fmt::Display + Send,
    M: BrokerMessage,
    F: Work<C::Context, T, E>,
{
    let (event_id, result, settlement) = match event_id.filter(|id| !id.is_empty()) {
        Some(event_id) if crate::error::check_event_id::<E>(event_id).is_err() => {
            let consumer = consumer.name();
            tracing::warn!(target: "tower_idempotency_consumer", consumer, bytes = event_id.len(), "the delivery's event id cannot be recorded (over {} bytes, or a NUL character): rejected", crate::MAX_EVENT_ID_LEN);
            (
                String::new(),
                Err(Error::InvalidEventId),
                Settlement::Rejected,
            )
        }
        Some(event_id) => {
            let processing =
                consumer.process_once_with_payload(event_id, Some(message.payload()), work);
            let result = match AssertUnwindSafe(processing).catch_unwind().await {
                Ok(result) => result,
                Err(panic) => {
                    // The work's attempt was rolled back and counted as it unwound. Without a
                    // settlement the broker would hold the delivery until the channel closes
                    // (RabbitMQ) or the ack wait ends (JetStream): hand it back now (a parked
                    // event's next delivery is then acked).
                    if let Err(err) = message
                        .settle(Settlement::Requeued, crate::REQUEUE_PAUSE)
                        .await
                    {
                        tracing::warn!(target: "tower_idempotency_consumer", event_id, error = %err, "the work panicked and its delivery could not be requeued");
                    }
                    std::panic::resume_unwind(panic);
                }
            };
            let settlement = if settles(&result) {
                Settlement::Acked
            } else {
                Settlement::Requeued
            };
            (event_id.to_owned(), result, settlement)
        }
        None => {
            let consumer = consumer.name();
            tracing::warn!(target: "tower_idempotency_consumer", consumer, "{}", M::MISSING_ID);
            (
                String::new(),
                Err(Error::MissingEventId),
                Settlement::Rejected,
            )
        }
    };
    let redeliver_after = match &result {
        Ok(_) | Err(_) if settlement != Settlement::Requeued => Duration::ZERO,
        result => redelivery_delay(result),
    };
    message.settle(settlement, redeliver_after).await?;
    Ok(Handled {
        event_id,
        redelivered: message.redelivered(),
        deliveries: message.deliveries(),
        result,
        settlement,
    })
}
