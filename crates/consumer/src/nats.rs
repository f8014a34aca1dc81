//! NATS JetStream (feature `nats`, with [`async_nats`]): acknowledge a message only after its
//! commit.
//!
//! Pull from a durable consumer with explicit acks (`AckPolicy::Explicit`, the default) and
//! hand each message to [`process_message`] (event id from the `Nats-Msg-Id` header) or
//! [`process_message_as`] (an id you read from the message). It runs the work through any
//! [`Consumer`](crate::Consumer), then settles the message:
//!
//! | result | settled with |
//! |---|---|
//! | processed, duplicate, parked (before or now) | `+ACK` after the commit |
//! | the work failed, the database failed, in progress elsewhere (Redis) | `-NAK` with a delay: JetStream redelivers it after the lease left on an event in progress, else after [`REQUEUE_PAUSE`](crate::REQUEUE_PAUSE) |
//! | no event id | `+TERM`: never redelivered |
//! | the work panicked | `-NAK` after [`REQUEUE_PAUSE`](crate::REQUEUE_PAUSE), then the panic goes on unwinding |
//!
//! Each is a double ack: it returns once the server confirmed it.
//!
//! A consumer that dies before its ack leaves the message pending: JetStream redelivers it
//! after the consumer's `ack_wait`, and the redelivery finds the event processed (and is acked)
//! or not committed (and runs the work). [`Handled::deliveries`] carries JetStream's delivery
//! count.
//!
//! # Two layers of dedupe
//!
//! JetStream's own dedupe is on the **publish** side: a message published with a
//! `Nats-Msg-Id` header that the stream saw within its `duplicate_window` (default two minutes)
//! is dropped, and the publish ack says `duplicate: true`. That stops a publisher's retry (a
//! publish whose ack was lost) from storing the event twice, cheaply and before any consumer
//! sees it. It cannot help with what happens after the stream:
//!
//! - **redeliveries**: a consumer that crashed after its commit but before its ack gets the
//!   same stored message again, by design;
//! - **duplicates outside the window**: a publisher that retries after the window (an outbox
//!   relay restarted an hour later), or two producers of one event.
//!
//! The consumer-side mark covers both, for as long as its retention. Use both: set
//! `Nats-Msg-Id` to the event id when publishing, and let the consumer dedupe on the same id.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(ledger: tower_idempotency_consumer::PgConsumer) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use futures_util::StreamExt;
//! use tower_idempotency_consumer::nats::{self, async_nats::jetstream};
//!
//! let client = nats::async_nats::connect("127.0.0.1:4222").await?;
//! let stream = jetstream::new(client).get_stream("PAYMENTS").await?;
//! let consumer: jetstream::consumer::PullConsumer = stream.get_consumer("ledger").await?;
//! let mut messages = consumer.messages().await?;
//! while let Some(message) = messages.next().await {
//!     let message = message?;
//!     let cents: i64 = std::str::from_utf8(&message.payload)?.parse()?;
//!     let handled = nats::process_message(&ledger, &message, move |tx| {
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

use std::{fmt, time::Duration};

pub use async_nats;
use async_nats::{header::NATS_MESSAGE_ID, jetstream::message::AckKind, jetstream::Message};

use crate::delivery::sealed::Sealed;
pub use crate::delivery::{
    process_message, process_message_as, BrokerMessage, Handled, SettleError, Settlement,
};

impl Sealed for Message {}

impl BrokerMessage for Message {
    const MISSING_ID: &'static str =
        "a message without an event id cannot be deduplicated: terminated";

    fn event_id(&self) -> Option<&str> {
        let headers = self.headers.as_ref()?;
        headers.get(NATS_MESSAGE_ID).map(|id| id.as_str())
    }

    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn redelivered(&self) -> bool {
        self.deliveries().is_some_and(|count| count > 1)
    }

    fn deliveries(&self) -> Option<u64> {
        let info = self.info().ok()?;
        Some(info.delivered.max(0).unsigned_abs())
    }

    // Double acks throughout: the server confirms it has the settlement, so "acked" here means
    // acked there.
    async fn settle(
        &self,
        settlement: Settlement,
        redeliver_after: Duration,
    ) -> Result<(), SettleError> {
        let kind = match settlement {
            Settlement::Acked => AckKind::Ack,
            // JetStream holds the message back for the delay itself.
            Settlement::Requeued => AckKind::Nak(Some(redeliver_after)),
            Settlement::Rejected => AckKind::Term,
        };
        self.double_ack_with(kind)
            .await
            .map_err(|err| SettleError::new(BoxedError(err)))
    }
}

/// async-nats' boxed error, as an error type of its own.
#[derive(Debug)]
struct BoxedError(async_nats::Error);

impl fmt::Display for BoxedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BoxedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}
