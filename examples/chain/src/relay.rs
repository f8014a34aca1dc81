//! The outbox relay: publishes the orders API's `outbox` rows to RabbitMQ, then marks them.
//!
//! One batch at a time, in one PostgreSQL transaction:
//!
//! 1. `SELECT .. FROM outbox WHERE published_at IS NULL .. FOR UPDATE SKIP LOCKED`: the oldest
//!    unpublished rows that no other relay holds (several relays share the work);
//! 2. publish each row (persistent, `mandatory`, `message_id` = the event id) on a channel in
//!    confirm mode, and wait for every publisher confirm;
//! 3. `UPDATE outbox SET published_at = now()` for the batch, and commit.
//!
//! A relay that dies before 3 commits leaves the rows unpublished, and the next run publishes
//! them again: at-least-once. A kill between the confirm and the commit is the case that
//! matters: the broker has the messages and the outbox says they were never sent, so they are
//! sent twice, and the consumer's dedupe (same `message_id`, same event) absorbs the copy. A nack
//! or a returned (unroutable) message ends the run with an error: the batch rolls back, and the
//! next run publishes it again.
//!
//! Each batch reports on stdout (flushed): `confirmed rows=N` once the broker confirmed it,
//! `marked rows=N` after the commit. For the chain's proof, [`Settings::stall_at_batch`] stops the
//! relay between the two (`stalled rows=N`) so that a SIGKILL lands exactly there.

use std::{future::Future, io::Write, time::Duration};

use broker_consumers_example::rabbitmq::open_queue;
use lapin::{
    options::{BasicPublishOptions, ConfirmSelectOptions},
    BasicProperties, Channel, Confirmation,
};
use sqlx::PgPool;

use crate::BoxError;

/// Rows published per batch unless `RELAY_BATCH` says otherwise.
pub const DEFAULT_BATCH: i64 = 25;
/// How long the relay waits when the outbox is empty, unless `RELAY_POLL_MS` says otherwise.
pub const DEFAULT_POLL: Duration = Duration::from_millis(20);

/// The relay's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The broker, e.g. `amqp://127.0.0.1:5672/%2f`.
    pub amqp_url: String,
    /// The queue the events go to (through the default exchange); declared durable if missing.
    pub queue: String,
    /// The most rows per batch.
    pub batch: i64,
    /// The wait between two looks at an empty outbox.
    pub poll: Duration,
    /// For the proof only: after the broker confirmed this (1-based, non-empty) batch, print
    /// `stalled rows=N` and wait for ever instead of marking it, so that a SIGKILL can land
    /// between the confirm and the mark. `None`: never.
    pub stall_at_batch: Option<u64>,
}

impl Settings {
    /// `AMQP_URL` (default `amqp://127.0.0.1:5672/%2f`), `QUEUE` (default `orders`),
    /// `RELAY_BATCH` (default [`DEFAULT_BATCH`]), `RELAY_POLL_MS` (default [`DEFAULT_POLL`]),
    /// `RELAY_STALL_AT_BATCH` (unset: never) from the environment.
    pub fn from_env() -> Result<Self, String> {
        fn number<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
            match std::env::var(name) {
                Err(_) => Ok(None),
                Ok(value) => value
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("{name}={value:?} is not a positive whole number")),
            }
        }
        Ok(Self {
            amqp_url: std::env::var("AMQP_URL")
                .unwrap_or_else(|_| "amqp://127.0.0.1:5672/%2f".into()),
            queue: std::env::var("QUEUE").unwrap_or_else(|_| "orders".into()),
            batch: number::<i64>("RELAY_BATCH")?
                .unwrap_or(DEFAULT_BATCH)
                .max(1),
            poll: number("RELAY_POLL_MS")?.map_or(DEFAULT_POLL, Duration::from_millis),
            stall_at_batch: number("RELAY_STALL_AT_BATCH")?,
        })
    }
}

/// One line on stdout, flushed at once (a closed stdout does not stop the relay).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Relay `pool`'s outbox to `settings.queue` until `shutdown` resolves (the batch in hand is
/// finished first), then close the connection.
pub async fn run(
    pool: PgPool,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let (connection, channel) = open_queue(&settings.amqp_url, &settings.queue).await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let (stop, mut stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    tracing::info!(queue = %settings.queue, batch = settings.batch, "relaying the outbox");
    let mut batches = 0_u64;
    while !*stopping.borrow() {
        let rows = relay_batch(&pool, &channel, &settings, batches + 1).await?;
        if rows > 0 {
            batches += 1;
            continue;
        }
        tokio::select! {
            _ = stopping.changed() => {}
            () = tokio::time::sleep(settings.poll) => {}
        }
    }
    connection.close(200, "shutting down".into()).await?;
    Ok(())
}

/// Publish and mark one batch; the rows it held (0: the outbox had nothing unpublished).
async fn relay_batch(
    pool: &PgPool,
    channel: &Channel,
    settings: &Settings,
    number: u64,
) -> Result<usize, BoxError> {
    let mut tx = pool.begin().await?;
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT event_id, kind, payload::text FROM outbox
         WHERE published_at IS NULL
         ORDER BY created_at, event_id
         LIMIT $1
         FOR UPDATE SKIP LOCKED",
    )
    .bind(settings.batch)
    .fetch_all(&mut *tx)
    .await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let mut confirms = Vec::with_capacity(rows.len());
    for (event_id, kind, payload) in &rows {
        let properties = BasicProperties::default()
            .with_message_id(event_id.as_str().into())
            .with_type(kind.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    settings.queue.as_str().into(),
                    options,
                    payload.as_bytes(),
                    properties,
                )
                .await?,
        );
    }
    for (confirm, (event_id, ..)) in confirms.into_iter().zip(&rows) {
        match confirm.await? {
            Confirmation::Ack(None) => {}
            Confirmation::Ack(Some(_)) => {
                return Err(format!("event {event_id}: no queue {} took it", settings.queue).into())
            }
            Confirmation::Nack(_) => {
                return Err(format!("event {event_id}: the broker refused it").into())
            }
            Confirmation::NotRequested => {
                return Err("the channel is not in confirm mode".into());
            }
        }
    }
    say(&format!("confirmed rows={}", rows.len()));
    if settings.stall_at_batch == Some(number) {
        say(&format!("stalled rows={}", rows.len()));
        std::future::pending::<()>().await;
    }
    let ids: Vec<&str> = rows.iter().map(|(id, ..)| id.as_str()).collect();
    sqlx::query("UPDATE outbox SET published_at = now() WHERE event_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    say(&format!("marked rows={}", rows.len()));
    Ok(rows.len())
}
