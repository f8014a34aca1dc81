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
//! use tower_idempotency_consumer::{postgres, Outcome};
//!
//! let pool = sqlx::PgPool::connect("postgres://postgres@localhost/app").await?;
//! postgres::migrate(&pool).await?; // creates processed_events if needed
//!
//! let outcome = postgres::process_once(&pool, "payments", "evt_123", |tx| {
//!     Box::pin(async move {
//!         sqlx::query("UPDATE accounts SET balance = balance + 40 WHERE id = 7")
//!             .execute(&mut **tx)
//!             .await?;
//!         Ok::<_, sqlx::Error>("credited")
//!     })
//! })
//! .await?;
//! match outcome {
//!     Outcome::Processed(what) => println!("{what}"),
//!     Outcome::Duplicate => println!("already applied: acknowledge and move on"),
//! }
//! # Ok(())
//! # }
//! ```
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
//! | Redis | never while the key is retained | one runs; the others get [`redis::RedisOutcome::InProgress`] |
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
//! Rows are kept until swept: run `sweep(pool, older_than, batch)` from a scheduler, with
//! `older_than` longer than the longest redelivery window of the provider (Stripe retries for up
//! to three days). In Redis a done key expires by itself after its retention.
//!
//! # Features
//!
//! `postgres`, `sqlite`, `redis`: one per backend, none by default, so a PostgreSQL user never
//! compiles the Redis client.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod outcome;

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use error::Error;
pub use outcome::Outcome;

#[cfg(feature = "sqlx")]
pub use sqlx;
