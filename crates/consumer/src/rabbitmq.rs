//! RabbitMQ (feature `rabbitmq`, with [`lapin`]): acknowledge a delivery only after its commit.
//!
//! Consume with manual acknowledgements (`no_ack: false`, the default) and hand each delivery
//! to [`process_delivery`]. It takes the event id from the message's `message_id` property,
//! runs the work through any [`Consumer`], and then settles the delivery:
//!
//! | result | settled with |
//! |---|---|
//! | processed, duplicate, parked (before or now) | `basic.ack`, after the commit |
//! | the work failed, the database failed, in progress elsewhere (Redis) | `basic.nack` with `requeue`: RabbitMQ redelivers it (`redelivered` set) |
//! | no `message_id` | `basic.reject` without requeue (to the queue's dead-letter exchange, if any) |
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

use std::fmt;

use futures_util::future::BoxFuture;
pub use lapin;
use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions},
};

pub use crate::delivery::{Handled, SettleError, Settlement};
use crate::{
    delivery::{self, Message, Received},
    Consumer,
};

/// Run `work` for the event of `delivery` through `consumer`, then ack, requeue or reject the
/// delivery (see the [module docs](self)). The message body is kept with a failed event, for
/// [replaying](crate::sql::SqlConsumer::replay) it.
pub async fn process_delivery<C, T, E, F>(
    consumer: &C,
    delivery: &Delivery,
    work: F,
) -> Result<Handled<T, E>, SettleError>
where
    C: Consumer,
    T: Send,
    E: fmt::Display + Send,
    F: for<'c> FnOnce(&'c mut C::Context) -> BoxFuture<'c, Result<T, E>> + Send,
{
    let event_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str());
    let received = Received {
        message: delivery,
        redelivered: delivery.redelivered,
        deliveries: None,
    };
    let run = |event_id| consumer.process_once_with_payload(event_id, Some(&delivery.data), work);
    delivery::process(consumer.name(), received, event_id, run).await
}

impl Message for Delivery {
    const MISSING_ID: &'static str =
        "a delivery without message_id cannot be deduplicated: rejected";

    async fn settle(&self, settlement: Settlement) -> Result<(), SettleError> {
        match settlement {
            Settlement::Acked => self.ack(BasicAckOptions::default()).await,
            Settlement::Requeued => {
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
