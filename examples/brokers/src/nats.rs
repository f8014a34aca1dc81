//! The NATS JetStream consumer: a durable pull consumer with explicit acks, each message in its
//! own task.

use std::{future::Future, time::Duration};

use futures_util::StreamExt;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tower_idempotency_consumer::nats::{
    self,
    async_nats::{self, header::NATS_MESSAGE_ID, jetstream, HeaderMap},
};

use crate::{apply, event_id, migrate, next_delivery, report};

/// Where the consumer reads from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The server, e.g. `127.0.0.1:4222`.
    pub nats_url: String,
    /// The stream; it must exist (the producers own it).
    pub stream: String,
    /// The durable consumer's name; created on the stream if missing.
    pub consumer: String,
    /// How long JetStream waits for an ack before it redelivers a message.
    pub ack_wait: Duration,
    /// How many unacknowledged messages JetStream hands out at once.
    pub max_ack_pending: i64,
}

/// Consume until `shutdown` resolves, applying each event once on `pool`; then finish the
/// messages in hand.
///
/// The event id is the body's `id`, not the `Nats-Msg-Id` header: a producer sets that header
/// per publish attempt for the stream's own dedupe window, and a copy of the event republished
/// later (or by another producer) may carry another one, or none.
pub async fn run(
    pool: PgPool,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Box<dyn std::error::Error>> {
    let ledger = migrate(&pool).await?;
    let client = async_nats::connect(&settings.nats_url)
        .await
        .map_err(|err| format!("cannot reach NATS at NATS_URL: {err}"))?;
    let stream = jetstream::new(client)
        .get_stream(&settings.stream)
        .await
        .map_err(|err| format!("cannot open the stream STREAM={}: {err}", settings.stream))?;
    let consumer = stream
        .get_or_create_consumer(
            &settings.consumer,
            jetstream::consumer::pull::Config {
                durable_name: Some(settings.consumer.clone()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: settings.ack_wait,
                max_ack_pending: settings.max_ack_pending,
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer.messages().await?;
    tracing::info!(stream = %settings.stream, consumer = %settings.consumer, "consuming");

    let mut in_hand = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    // A failed stream ends the loop, not the messages in hand: they finish and are acked before
    // the error is returned.
    let mut failed = None;
    loop {
        let message = tokio::select! {
            () = &mut shutdown => break,
            message = messages.next() => message,
        };
        let Some(message) = next_delivery(message, &mut failed) else {
            break;
        };
        let ledger = ledger.clone();
        in_hand.spawn(async move {
            let body = message.payload.to_vec();
            let event_id = event_id_or_msg_id(&body, message.headers.as_ref());
            let handled =
                nats::process_message_as(&ledger, &message, event_id.as_deref(), move |tx| {
                    Box::pin(async move { apply(tx, &body).await })
                })
                .await;
            match handled {
                Ok(handled) => report(&handled.event_id, &handled.result, handled.redelivered),
                // Not acked: JetStream redelivers it after ack_wait, as a duplicate.
                Err(err) => tracing::warn!(error = %err, "acknowledging a message failed"),
            }
        });
        while in_hand.try_join_next().is_some() {}
    }
    tracing::info!(
        in_hand = in_hand.len(),
        "stopping: finishing the messages in hand"
    );
    while in_hand.join_next().await.is_some() {}
    match failed {
        Some(err) => Err(err.into()),
        None => Ok(()),
    }
}

/// The body's `id` (when it is not empty), else the `Nats-Msg-Id` the producer set: a body that
/// is not an event still has an id to count its failures by, and is parked, not dropped.
pub fn event_id_or_msg_id(body: &[u8], headers: Option<&HeaderMap>) -> Option<String> {
    event_id(body)
        .filter(|id| !id.is_empty())
        .or_else(|| Some(headers?.get(NATS_MESSAGE_ID)?.as_str().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_id_comes_first_then_the_message_id() {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, "msg-7");
        let event = br#"{"id":"evt_1","amount_cents":5}"#;
        assert_eq!(
            event_id_or_msg_id(event, Some(&headers)).as_deref(),
            Some("evt_1")
        );
        assert_eq!(
            event_id_or_msg_id(b"not an event", Some(&headers)).as_deref(),
            Some("msg-7"),
            "a body that is not an event is counted and parked by its message id"
        );
        assert_eq!(
            event_id_or_msg_id(br#"{"id":""}"#, Some(&headers)).as_deref(),
            Some("msg-7"),
            "an empty id in the body is no id"
        );
        assert_eq!(event_id_or_msg_id(b"not an event", None), None);
        assert_eq!(
            event_id_or_msg_id(b"not an event", Some(&HeaderMap::new())),
            None
        );
    }
}
