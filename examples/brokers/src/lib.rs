//! Consumers on real brokers that apply each event once: the event's effect and its processed
//! mark commit in one PostgreSQL transaction, and the delivery is acknowledged after the commit.
//!
//! Run with (each reads its settings from the environment, see the binaries):
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test AMQP_URL=amqp://127.0.0.1:5672/%2f QUEUE=payments \
//!     cargo run -p broker-consumers-example --bin rabbitmq-consumer
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test NATS_URL=127.0.0.1:4222 STREAM=PAYMENTS CONSUMER=ledger \
//!     cargo run -p broker-consumers-example --bin nats-consumer
//! ```
//!
//! An event is JSON, `{"id": "evt_1", "amountCents": 4000}`; its effect is one row in
//! `effects`. The table has no unique key on purpose: a second application of one event would
//! show as a second row, which is what the proof tests look for.
//!
//! Each settled delivery is reported on stdout as one line (see [`report`]), so that a test
//! (or you) can follow the stream: `settled event=evt_1 outcome=applied redelivered=false`.

use std::io::Write;

use serde::Deserialize;
use sqlx::{PgConnection, PgPool};
use tower_idempotency_consumer::{Error, Outcome, PgConsumer};

pub mod nats;
pub mod proof;
pub mod rabbitmq;

/// The consumer name the events are recorded under.
pub const CONSUMER: &str = "ledger";

/// An event as the producers publish it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The event's id: the same for every copy and redelivery of one event.
    pub id: String,
    /// The amount the event moves, in cents.
    pub amount_cents: i64,
}

/// The `id` of an event body, if it has one.
pub fn event_id(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_slice::<Id>(body)
        .ok()
        .map(|event| event.id)
}

/// Create the consumer's `processed_events` and the example's `effects` table.
pub async fn migrate(pool: &PgPool) -> Result<PgConsumer, Box<dyn std::error::Error>> {
    let consumer = PgConsumer::new(pool.clone(), CONSUMER);
    consumer.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS effects (
             event_id     text        NOT NULL,
             amount_cents bigint      NOT NULL,
             applied_at   timestamptz NOT NULL DEFAULT now()
         )",
    )
    .execute(pool)
    .await?;
    Ok(consumer)
}

/// The event's effect, in the transaction that holds its processed mark. A body that is not an
/// event fails the work: counted, and parked after the consumer's maximum attempts.
pub async fn apply(tx: &mut PgConnection, body: &[u8]) -> Result<(), sqlx::Error> {
    let event: Event = serde_json::from_slice(body)
        .map_err(|err| sqlx::Error::Decode(format!("not an event: {err}").into()))?;
    sqlx::query("INSERT INTO effects (event_id, amount_cents) VALUES ($1, $2)")
        .bind(&event.id)
        .bind(event.amount_cents)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// One line on stdout for a settled delivery:
/// `settled event=<id> outcome=<applied|duplicate|parked|failed|no-id> redelivered=<bool>`.
///
/// Printed after the acknowledgement, and flushed, so a reader sees it as soon as it is true.
pub fn report(event_id: &str, result: &Result<Outcome<()>, Error<sqlx::Error>>, redelivered: bool) {
    let outcome = match result {
        Ok(Outcome::Processed(())) => "applied",
        Ok(Outcome::Duplicate) => "duplicate",
        Ok(_) | Err(Error::Parked(_)) => "parked",
        Err(Error::MissingEventId) => "no-id",
        Err(_) => "failed",
    };
    if let Err(err) = result {
        tracing::warn!(event = event_id, error = %err, "the event's work did not commit");
    }
    let mut out = std::io::stdout().lock();
    // A closed stdout (the reader went away) must not stop the consumer.
    // The id is the message's: escaped, so that one with a line break cannot print a line of
    // its own that the proof would count.
    let _ = writeln!(
        out,
        "settled event={} outcome={outcome} redelivered={redelivered}",
        event_id.escape_debug()
    );
    let _ = out.flush();
}

/// The next delivery of a broker's stream, or `None` when the stream ended or failed, its
/// failure kept in `failed`: the loop stops taking deliveries, and those in hand still finish.
pub fn next_delivery<T, E>(item: Option<Result<T, E>>, failed: &mut Option<E>) -> Option<T> {
    match item? {
        Ok(delivery) => Some(delivery),
        Err(err) => {
            *failed = Some(err);
            None
        }
    }
}

/// The environment variable `name`, or an error that names it.
pub fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

/// The environment variable `name` as a number, `default` when it is not set, or an error that
/// names it when it does not parse.
pub fn env_number<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(value) => value
            .trim()
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a valid number")),
    }
}

/// A binary's exit: success, or the error on stderr and failure.
pub fn exit_code(result: Result<(), impl std::fmt::Display>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Log to stderr at `RUST_LOG` (default `info`), keeping stdout for [`report`] lines.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Resolves on SIGTERM or Ctrl-C: the consumers then stop taking deliveries, finish (and ack)
/// the ones they hold, and exit.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::next_delivery;

    #[test]
    fn a_failed_stream_stops_the_loop_and_keeps_its_error() {
        let mut failed = None;
        assert_eq!(next_delivery(Some(Ok::<_, &str>(7)), &mut failed), Some(7));
        assert_eq!(failed, None);
        assert_eq!(next_delivery(None::<Result<i32, &str>>, &mut failed), None);
        assert_eq!(failed, None, "an ended stream is no failure");
        assert_eq!(
            next_delivery(Some(Err::<i32, _>("closed")), &mut failed),
            None
        );
        assert_eq!(failed, Some("closed"));
    }
}
