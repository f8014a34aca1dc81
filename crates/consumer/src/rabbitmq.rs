//! RabbitMQ (feature `rabbitmq`, with [`lapin`]): acknowledge a delivery only after its commit.
//!
//! Consume with manual acknowledgements (`no_ack: false`, the default) and hand each delivery
//! to [`process_delivery`]. It takes the event id from the message's `message_id` property,
//! runs the work through any [`Consumer`](crate::Consumer), and then settles the delivery:
//!
//! | result | settled with |
//! |---|---|
//! | processed, duplicate, parked (before or now) | `basic.ack`, after the commit |
//! | the work failed, the database failed, in progress elsewhere (Redis) | after a pause of [`REQUEUE_PAUSE`](crate::REQUEUE_PAUSE), `basic.nack` with `requeue`: RabbitMQ redelivers it (`redelivered` set) |
//! | no `message_id` | `basic.reject` without requeue (to the queue's dead-letter exchange, if any) |
//! | the work panicked | `basic.nack` with `requeue` after the same pause, then the panic goes on unwinding |
//!
//! [`Handled`] reports what happened, including the broker's `redelivered` flag.
//!
//! The ack follows the commit, so a consumer that dies between the two leaves the delivery
//! unacknowledged: RabbitMQ redelivers it when the channel closes, and the redelivery finds the
//! event processed ([`Outcome::Duplicate`](crate::Outcome::Duplicate)) and is acked without running the work. A consumer
//! that dies before the commit leaves nothing: the redelivery runs the work. Either way the
//! work's effect happens once.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(ledger: tower_idempotency_consumer::PgConsumer) -> Result<(), Box<dyn std::error::Error>> {
//! use futures_util::StreamExt;
//! use tower_idempotency_consumer::rabbitmq::{self, lapin};
//! use lapin::{options::*, types::FieldTable, Connection, ConnectionProperties};
//!
//! let connection = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
//! let channel = connection.create_channel().await?;
//! channel.basic_qos(32, BasicQosOptions::default()).await?;
//! let mut deliveries = channel
//!     .basic_consume("payments".into(), "ledger".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! while let Some(delivery) = deliveries.next().await {
//!     let delivery = delivery?;
//!     let cents: i64 = std::str::from_utf8(&delivery.data)?.parse()?;
//!     let handled = rabbitmq::process_delivery(&ledger, &delivery, move |tx| {
//!         Box::pin(async move {
//!             sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = 7")
//!                 .bind(cents)
//!                 .execute(&mut *tx)
//!                 .await
//!         })
//!     })
//!     .await?;
//!     println!("{}: {:?}", handled.event_id, handled.settlement);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Poison messages: a work that keeps failing is parked after the consumer's maximum attempts
//! and acked from then on. A process that crashes on a message (so that no failure is ever
//! recorded) is bounded by the queue, not by this crate: use a quorum queue with
//! `x-delivery-limit` and a dead-letter exchange.

pub use lapin;
use std::time::Duration;

use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions},
    types::AMQPValue,
};

use crate::delivery::sealed::Sealed;
pub use crate::delivery::{
    process_message as process_delivery, BrokerMessage, Handled, SettleError, Settlement,
};

impl Sealed for Delivery {}

impl BrokerMessage for Delivery {
    const MISSING_ID: &'static str =
        "a delivery without message_id cannot be deduplicated: rejected";

    fn event_id(&self) -> Option<&str> {
        let id = self.properties.message_id().as_ref()?;
        Some(id.as_str())
    }

    fn payload(&self) -> &[u8] {
        &self.data
    }

    fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// A delivery not flagged redelivered is the first, whatever its headers say (a
    /// republished or dead-lettered message may carry an old count). A redelivery from a quorum
    /// queue counts its earlier deliveries in `x-delivery-count` (up to RabbitMQ 4.2; from 4.3
    /// that header counts only failed deliveries, and a requeue is not one of them); a classic
    /// queue only flags redeliveries.
    fn deliveries(&self) -> Option<u64> {
        if !self.redelivered {
            return Some(1);
        }
        let headers = self.properties.headers().as_ref()?;
        let (_, earlier) = headers
            .into_iter()
            .find(|(name, _)| name.as_str() == "x-delivery-count")?;
        Some(whole_number(earlier)?.saturating_add(1))
    }

    async fn settle(
        &self,
        settlement: Settlement,
        redeliver_after: Duration,
    ) -> Result<(), SettleError> {
        match settlement {
            Settlement::Acked => self.ack(BasicAckOptions::default()).await,
            Settlement::Requeued => {
                // RabbitMQ redelivers a requeued message at once: the pause is taken here, up to
                // `REQUEUE_PAUSE`, holding the delivery (and its prefetch slot) meanwhile.
                tokio::time::sleep(redeliver_after.min(crate::REQUEUE_PAUSE)).await;
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                self.nack(requeue).await
            }
            Settlement::Rejected => self.reject(BasicRejectOptions { requeue: false }).await,
        }
        .map(drop)
        .map_err(SettleError::new)
    }
}

/// A header's value as a count, whichever integer type the broker chose.
fn whole_number(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::ShortShortUInt(n) => Some(n.into()),
        AMQPValue::ShortUInt(n) => Some(n.into()),
        AMQPValue::LongUInt(n) => Some(n.into()),
        AMQPValue::ShortShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongLongInt(n) => u64::try_from(n).ok(),
        _ => None,
    }
}
