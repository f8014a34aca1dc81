//! Run queue and webhook work at most once per event id.
//!
//! Providers redeliver: a webhook whose answer was lost, a queue message whose ack timed out,
//! arrives again, sometimes while the first delivery is still running. This crate makes the
//! second delivery a no-op.
//!
//! With PostgreSQL or SQLite, a row in `processed_events` (consumer, event id, processed at)
//! is inserted **in the same transaction as the work's own writes**. Either both commit or
//! neither does: a failure, a panic or a crash before the commit leaves no row, so the next
//! delivery runs the work again, and a committed event is never run twice.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_idempotency_consumer::{Consumer, Outcome, PgConsumer};
//!
//! let pool = sqlx::PgPool::connect("postgres://postgres@localhost/app").await?;
//! let payments = PgConsumer::new(pool, "payments");
//! payments.migrate().await?; // creates processed_events if needed
//!
//! let outcome = payments
//!     .process_once("evt_123", |tx| {
//!         Box::pin(async move {
//!             sqlx::query("UPDATE accounts SET balance = balance + 40 WHERE id = 7")
//!                 .execute(&mut *tx)
//!                 .await?;
//!             Ok::<_, sqlx::Error>("credited")
//!         })
//!     })
//!     .await?;
//! match outcome {
//!     Outcome::Processed(what) => println!("{what}"),
//!     _ => println!("already applied, or parked: acknowledge and move on"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every backend has the same shape: one struct per store ([`PgConsumer`], [`SqliteConsumer`],
//! [`redis::RedisConsumer`]) implementing one trait, [`Consumer`]. The SQL consumers also mark
//! an event processed inside a transaction of your own ([`sql::SqlConsumer::claim`]), count
//! failed attempts, park an event after too many ([`sql`](crate::sql#attempts-and-parking)),
//! and sweep old marks.
//!
//! For work that writes no database row (an e-mail, a call to another API), the [`redis`]
//! module claims the event with a lease and marks it done afterwards, with fencing tokens.
//!
//! # Guarantees
//!
//! | backend | a committed event runs again | concurrent deliveries of one event |
//! |---|---|---|
//! | PostgreSQL | never | one runs; the others wait for its commit, then report [`Outcome::Duplicate`] (or run, if it rolled back) |
//! | SQLite | never | serialised by SQLite's write lock (`BEGIN IMMEDIATE`): the same |
//! | Redis | never while the key is retained | one runs; the others get [`Outcome::InProgress`] |
//!
//! What the SQL backends cannot cover: effects outside the transaction (an HTTP call made from
//! the closure happens even if the transaction then rolls back) and a commit whose answer is
//! lost (a [`Error::Database`] from the commit: the next delivery finds out, `Duplicate` if it
//! had committed). With Redis, the work runs at most once as long as it finishes within its
//! lease, which is renewed while it runs; a lost lease cancels the work and returns
//! [`Error::LeaseLost`](crate::Error).
//!
//! # Retention
//!
//! Rows are kept until swept: run [`sql::SqlConsumer::sweep`] from a scheduler, with
//! `older_than` longer than the longest redelivery window of the provider (Stripe retries for up
//! to three days). In Redis a done key expires by itself after its retention.
//!
//! # Features
//!
//! `postgres`, `sqlite`, `redis`: one per backend, none by default, so a PostgreSQL user never
//! compiles the Redis client. `rabbitmq` ([`rabbitmq`], with `lapin`) and `nats` ([`nats`],
//! with `async-nats`) acknowledge broker deliveries only after the commit.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
mod delivery;
mod error;
mod outcome;

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlx")]
pub mod sql;
#[cfg(any(feature = "sqlx", feature = "redis"))]
mod time;

use std::{fmt, future::Future};

use futures_util::future::BoxFuture;

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
pub use delivery::REQUEUE_PAUSE;
pub use error::Error;
pub use outcome::{Outcome, ParkedEvent};

#[cfg(feature = "sqlx")]
pub use sqlx;

/// How many failures of its work park an event unless the consumer's `with_max_attempts` says
/// otherwise.
pub const DEFAULT_MAX_ATTEMPTS: std::num::NonZeroU32 =
    std::num::NonZeroU32::new(5).expect("5 is not zero");

/// The longest event id a consumer records, in bytes; a longer one (or one with a NUL
/// character) is refused with [`Error::InvalidEventId`] before any store is asked, and a broker
/// delivery carrying it is rejected, not requeued. Ids of brokers and webhook senders are far
/// shorter; PostgreSQL's index could not take one much longer.
pub const MAX_EVENT_ID_LEN: usize = 1024;

/// The PostgreSQL consumer (feature `postgres`): see [`sql::postgres`].
#[cfg(feature = "postgres")]
pub type PgConsumer = sql::SqlConsumer<sqlx::Postgres>;

/// The SQLite consumer (feature `sqlite`): see [`sql::sqlite`].
#[cfg(feature = "sqlite")]
pub type SqliteConsumer = sql::SqlConsumer<sqlx::Sqlite>;

/// The work run for one event: a closure that borrows the consumer's context `C` (a transaction's
/// connection, or nothing) for as long as the future it returns runs.
///
/// Implemented for every such closure; write `|tx| Box::pin(async move { .. })`.
pub trait Work<C, T, E>: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<T, E>> + Send {}

impl<C, T, E, F> Work<C, T, E> for F where
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<T, E>> + Send
{
}

/// Runs work at most once per event id: what every backend offers.
///
/// Code that handles deliveries (a broker loop, a webhook handler) can take any `Consumer`.
pub trait Consumer: fmt::Debug + Send + Sync {
    /// What the work gets: the SQL transaction that holds the processed mark, or, in Redis,
    /// the claim.
    type Context: Send;

    /// The consumer's name (one queue handler, one webhook endpoint): events are deduplicated
    /// per name.
    fn name(&self) -> &str;

    /// Run `work` for the event unless it was processed before, is parked, or (Redis) is
    /// being processed right now.
    ///
    /// Return `Ok` from `work` to commit, `Err` to roll back: the error comes back as
    /// [`Error::Work`] (redeliver) or, on the last allowed attempt, [`Error::Parked`]
    /// (acknowledge). A panic rolls back too, counts as a failed attempt (a work that always
    /// panics is parked at the maximum attempts) and goes on unwinding. `payload`, when given, is
    /// kept with a failed event for replaying it.
    ///
    /// The closure returns a boxed future so that it may borrow the context (the shape of
    /// sqlx's `Connection::transaction`): write `|tx| Box::pin(async move { .. })` and move
    /// owned values into it.
    fn process_once_with_payload<T, E, F>(
        &self,
        event_id: &str,
        payload: Option<&[u8]>,
        work: F,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + Send
    where
        T: Send,
        E: fmt::Display + Send,
        F: Work<Self::Context, T, E>;

    /// [`process_once_with_payload`](Self::process_once_with_payload) without a payload.
    fn process_once<T, E, F>(
        &self,
        event_id: &str,
        work: F,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + Send
    where
        T: Send,
        E: fmt::Display + Send,
        F: Work<Self::Context, T, E>,
    {
        self.process_once_with_payload(event_id, None, work)
    }
}
