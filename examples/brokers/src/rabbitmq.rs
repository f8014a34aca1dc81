//! The RabbitMQ consumer: manual acks, a bounded prefetch, each delivery in its own task.

use std::future::Future;

use futures_util::StreamExt;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tower_idempotency_consumer::rabbitmq::{
    self,
    lapin::{
        options::{BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions},
        types::FieldTable,
        Channel, Connection, ConnectionProperties,
    },
};

use crate::{apply, env, migrate, next_delivery, report, shutdown_signal};

/// Where the consumer reads from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The broker, e.g. `amqp://127.0.0.1:5672/%2f`.
    pub amqp_url: String,
    /// The queue; declared (durable) if missing.
    pub queue: String,
    /// How many unacknowledged deliveries the broker hands out at once (and so how many run
    /// concurrently).
    pub prefetch: u16,
}

impl Settings {
    /// `AMQP_URL` (default `amqp://127.0.0.1:5672/%2f`), `QUEUE` (default `payments`) and
    /// `PREFETCH` (default 32) from the environment.
    pub fn from_env() -> Result<Self, String> {
        let prefetch = std::env::var("PREFETCH").unwrap_or_else(|_| "32".into());
        Ok(Self {
            amqp_url: std::env::var("AMQP_URL")
                .unwrap_or_else(|_| "amqp://127.0.0.1:5672/%2f".into()),
            queue: std::env::var("QUEUE").unwrap_or_else(|_| "payments".into()),
            // 0 would be RabbitMQ's "no limit": deliveries in hand without bound.
            prefetch: prefetch
                .parse()
                .ok()
                .filter(|n: &u16| *n > 0)
                .ok_or_else(|| format!("PREFETCH={prefetch:?} is not a number from 1 to 65535"))?,
        })
    }
}

/// The consumer binary's whole run: [`Settings::from_env`], the pool on `DATABASE_URL`
/// (required), then [`run`] until SIGTERM or Ctrl-C.
pub async fn run_from_env() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = env("DATABASE_URL")?;
    let settings = Settings::from_env()?;
    let pool = PgPool::connect(&database_url)
        .await
        .map_err(|err| format!("cannot reach DATABASE_URL: {err}"))?;
    run(pool, settings, shutdown_signal()).await
}

/// A connection to the broker at `amqp_url` and a channel on which `queue` is declared
/// (durable, no arguments): the consumer's declaration, which a publisher repeats so that nothing
/// it publishes before the consumer first starts is unroutable.
pub async fn open_queue(
    amqp_url: &str,
    queue: &str,
) -> Result<(Connection, Channel), Box<dyn std::error::Error + Send + Sync>> {
    let connection = Connection::connect(amqp_url, ConnectionProperties::default())
        .await
        .map_err(|err| format!("cannot reach RabbitMQ at AMQP_URL: {err}"))?;
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await?;
    Ok((connection, channel))
}

/// Consume `settings.queue` until `shutdown` resolves, applying each event once on `pool`;
/// then finish the deliveries in hand and close the connection.
pub async fn run(
    pool: PgPool,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Box<dyn std::error::Error>> {
    let consumer = migrate(&pool).await?;
    let (connection, channel) = open_queue(&settings.amqp_url, &settings.queue)
        .await
        .map_err(|err| -> Box<dyn std::error::Error> { err })?;
    channel
        .basic_qos(settings.prefetch, BasicQosOptions::default())
        .await?;
    // Manual acknowledgements (`no_ack: false`): a delivery stays the broker's until acked.
    let mut deliveries = channel
        .basic_consume(
            settings.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    tracing::info!(queue = %settings.queue, prefetch = settings.prefetch, "consuming");

    let mut in_hand = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    // A failed stream (the connection closed) ends the loop, not the deliveries in hand: they
    // finish and are acked before the error is returned.
    let mut failed = None;
    loop {
        let delivery = tokio::select! {
            () = &mut shutdown => break,
            delivery = deliveries.next() => delivery,
        };
        let Some(delivery) = next_delivery(delivery, &mut failed) else {
            break;
        };
        let consumer = consumer.clone();
        in_hand.spawn(async move {
            let body = delivery.data.clone();
            let handled = rabbitmq::process_delivery(&consumer, &delivery, move |tx| {
                Box::pin(async move { apply(tx, &body).await })
            })
            .await;
            match handled {
                Ok(handled) => report(&handled.event_id, &handled.result, handled.redelivered),
                // Not acked: the broker redelivers it, and the redelivery is a duplicate.
                Err(err) => tracing::warn!(error = %err, "acknowledging a delivery failed"),
            }
        });
        // Reap finished tasks as we go, so the set holds only the deliveries in hand.
        while in_hand.try_join_next().is_some() {}
    }
    tracing::info!(
        in_hand = in_hand.len(),
        "stopping: finishing the deliveries in hand"
    );
    while in_hand.join_next().await.is_some() {}
    if let Some(err) = failed {
        return Err(err.into());
    }
    connection.close(200, "shutting down".into()).await?;
    Ok(())
}
