//! Redis (feature `redis`): a fenced claim with a lease, for work that writes no database row.
//!
//! An e-mail, a call to another API, a message to another queue: work that cannot share a
//! transaction with a dedupe row. [`RedisConsumer`]'s
//! [`process_once`](crate::Consumer::process_once) claims the event, runs the work while
//! renewing the claim's lease, and marks the event done for the retention period.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency_consumer::{redis::RedisConsumer, Consumer, Outcome};
//!
//! # async fn send_receipt() -> Result<(), std::io::Error> { Ok(()) }
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let receipts = RedisConsumer::connect(client, "receipts")
//!     .await?
//!     .with_lease(Duration::from_secs(30));
//!
//! match receipts.process_once("evt_123", |_| Box::pin(send_receipt())).await? {
//!     Outcome::Processed(()) => {}             // sent now
//!     Outcome::InProgress { .. } => {}         // being sent: let the provider redeliver
//!     _ => {}                                  // sent before: acknowledge
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Data layout
//!
//! One string key per event: `<prefix>:{<hex>}`, where `<hex>` is the SHA-256 of the consumer
//! name and the event id (so any id is a safe key) and the braces are literal: they are the
//! key's Redis Cluster hash tag. Its value is the holder's token (a UUID) while the work runs,
//! expiring with the lease, then `done`, expiring after the [retention](RedisConsumer::with_retention),
//! or `parked` after [too many failures](RedisConsumer::with_max_attempts), kept until
//! replayed. Failed attempts and the last error live in the hash `<prefix>:{<hex>}:failures`, in
//! the same slot.
//!
//! # Fencing
//!
//! Each operation is one Lua script on the one key, so check and write are one step:
//!
//! - **claim**: `SET key <fresh token> NX PX <lease>`; otherwise `done` or in progress;
//! - **renew** (every third of the lease while the work runs), **complete** (`SET key done PX
//!   <retention>`) and **fail** (when the work fails or panics: count the attempt, then `DEL`,
//!   or park the event at the maximum attempts) act only if the key still holds this delivery's
//!   token.
//!
//! A holder whose lease lapsed (a pause longer than the lease, a lost connection) cannot
//! complete or release someone else's claim: it gets [`Error::LeaseLost`] and its work, if still
//! running, is cancelled. The work runs at most once as long as each run finishes, or is
//! cancelled, within its lease; pick a lease well above the work's longest run.
//!
//! # Durability
//!
//! A `done` key survives a restart or failover only as far as Redis persistence and replication
//! allow; a lost key lets a redelivery run the work again. When the work writes to a database,
//! prefer the [`postgres`](crate#guarantees) or `sqlite` modules, which commit the dedupe row
//! with the work.

use std::{
    fmt,
    future::Future,
    panic::AssertUnwindSafe,
    sync::{Arc, LazyLock},
    time::Duration,
};

use futures_util::FutureExt;
use redis::{aio::ConnectionLike, aio::ConnectionManager, Script};
use sha2::{Digest, Sha256};
use tokio::time::{Instant, MissedTickBehavior};

use crate::{time::millis, Consumer, Error, Outcome, DEFAULT_MAX_ATTEMPTS};

/// The key prefix used unless [`RedisConsumer::with_prefix`] sets another.
pub const DEFAULT_PREFIX: &str = "processed-events";

/// How long a `done` key is kept unless [`RedisConsumer::with_retention`] says otherwise: seven
/// days, longer than the redelivery window of common providers (Stripe retries for three days).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("claim.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));
static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("complete.lua")));
static FAIL: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("fail.lua")));
static REPLAY: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("replay.lua")));

/// The claim's lease unless [`RedisConsumer::with_lease`] says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Runs work at most once per event id of one consumer, with claims in Redis.
///
/// `C` is any async Redis connection that can be cloned cheaply: a
/// [`ConnectionManager`] (the default, see [`connect`](Self::connect)), a multiplexed
/// connection, or a Redis Cluster connection (every key has its own hash tag). Clones share the
/// connection.
#[derive(Clone)]
pub struct RedisConsumer<C = ConnectionManager> {
    conn: C,
    consumer: Arc<str>,
    prefix: Arc<str>,
    retention: Duration,
    lease: Duration,
    max_attempts: std::num::NonZeroU32,
}

impl<C> fmt::Debug for RedisConsumer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConsumer")
            .field("consumer", &self.consumer)
            .field("prefix", &self.prefix)
            .field("retention", &self.retention)
            .field("lease", &self.lease)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl RedisConsumer<ConnectionManager> {
    /// Open a [`ConnectionManager`] on `client` and a consumer named `consumer` over it.
    pub async fn connect(
        client: redis::Client,
        consumer: impl Into<Arc<str>>,
    ) -> redis::RedisResult<Self> {
        Ok(Self::new(client.get_connection_manager().await?, consumer))
    }
}

impl<C> RedisConsumer<C>
where
    C: ConnectionLike + Clone + Send,
{
    /// A consumer named `consumer` (one queue handler, one webhook endpoint) over `conn`, with
    /// the [`DEFAULT_PREFIX`], [`DEFAULT_RETENTION`] and [`DEFAULT_LEASE`].
    pub fn new(conn: C, consumer: impl Into<Arc<str>>) -> Self {
        Self {
            conn,
            consumer: consumer.into(),
            prefix: DEFAULT_PREFIX.into(),
            retention: DEFAULT_RETENTION,
            lease: DEFAULT_LEASE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Park an event after `max_attempts` failures of its work instead of
    /// [`DEFAULT_MAX_ATTEMPTS`]: deliveries then report [`Outcome::Parked`] without running it
    /// until [`replay`](Self::replay). A parked event and its failures (the payload, the last
    /// error) do not expire, as the SQL consumers' parked rows outlive their sweeps, so an event
    /// acknowledged at the broker as parked stays on record (under an `allkeys-*` eviction
    /// policy Redis may still evict it: use `noeviction` or a `volatile-*` one). (Parked events are found by id, with
    /// [`parked`](Self::parked), and each is logged as a warning when parked; Redis keeps no
    /// list of them.)
    pub fn with_max_attempts(mut self, max_attempts: std::num::NonZeroU32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The key of the failures hash of `event_id` (attempts, last error), in the event key's
    /// hash slot.
    fn failures_key(&self, event_id: &str) -> String {
        format!("{}:failures", self.key(event_id))
    }

    /// Forget a parked event so that its next delivery runs the work with fresh attempts;
    /// `false` if it was not parked.
    pub async fn replay(&self, event_id: &str) -> redis::RedisResult<bool> {
        let replayed: i64 = REPLAY
            .key(self.key(event_id))
            .key(self.failures_key(event_id))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(replayed == 1)
    }

    /// The parked event `event_id`, with its failed attempts, its last error and the payload
    /// its last delivery carried ([`Consumer::process_once_with_payload`]); `None` if it is not
    /// parked.
    pub async fn parked(&self, event_id: &str) -> redis::RedisResult<Option<crate::ParkedEvent>> {
        let (state, (attempts, last_error, payload, parked_at)): (Option<String>, FailuresFields) =
            redis::pipe()
                .atomic()
                .get(self.key(event_id))
                .cmd("HMGET")
                .arg(self.failures_key(event_id))
                .arg("attempts")
                .arg("last_error")
                .arg("payload")
                .arg("parked_at")
                .query_async(&mut self.conn.clone())
                .await?;
        Ok(
            (state.as_deref() == Some("parked")).then(|| crate::ParkedEvent {
                event_id: event_id.to_owned(),
                attempts: attempts.unwrap_or_default(),
                last_error,
                payload,
                parked_at_ms: parked_at.unwrap_or_default(),
            }),
        )
    }

    /// Hold a claim for `lease` (renewed every third of it while the work runs) instead of
    /// [`DEFAULT_LEASE`]. A holder that dies blocks redeliveries for at most one lease.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_idempotency_consumer::redis::RedisConsumer;
    /// # fn run(conn: redis::aio::ConnectionManager) {
    /// let consumer = RedisConsumer::new(conn, "receipts").with_lease(Duration::from_secs(10));
    /// # }
    /// ```
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Put this consumer's keys under `prefix` instead of [`DEFAULT_PREFIX`].
    ///
    /// ```
    /// # use tower_idempotency_consumer::redis::RedisConsumer;
    /// # fn run(conn: redis::aio::ConnectionManager) {
    /// let consumer = RedisConsumer::new(conn, "receipts").with_prefix("shop");
    /// assert!(consumer.key("evt_1").starts_with("shop:{"));
    /// # }
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Keep a `done` event for `retention` instead of [`DEFAULT_RETENTION`].
    ///
    /// # Warning
    ///
    /// A redelivery after the retention runs the work again: keep it longer than the provider's
    /// redelivery window.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The Redis key of `event_id` for this consumer (see [data layout](self#data-layout)).
    pub fn key(&self, event_id: &str) -> String {
        let mut hash = Sha256::new();
        // Length-prefixed, so that ("ab", "c") and ("a", "bc") never share a key.
        hash.update((self.consumer.len() as u64).to_be_bytes());
        hash.update(self.consumer.as_bytes());
        hash.update(event_id.as_bytes());
        let hex: String = hash
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        format!("{}:{{{hex}}}", self.prefix)
    }

    /// [`Consumer::process_once`] on Redis.
    ///
    /// The claim holds for the lease and is renewed every third of it while `work` runs. When
    /// `work` returns `Ok`, the event is marked done for the retention period; when it returns
    /// `Err` ([`Error::Work`]) the failure is counted and the claim released so that a
    /// redelivery runs it again, or, at the maximum attempts, the event is parked
    /// ([`Error::Parked`]); a panic counts as a failed attempt too (freeing the claim) and goes
    /// on unwinding. A claim lost while the work runs cancels the work, and an `Err` returned
    /// after the claim was taken over is not counted: both are [`Error::LeaseLost`].
    ///
    /// If Redis fails after the work succeeded ([`Error::Redis`]), the event is not marked done:
    /// once the lease lapses a redelivery runs the work again.
    async fn run_once<T, E, Fut>(
        &self,
        event_id: &str,
        payload: Option<&[u8]>,
        work: impl FnOnce() -> Fut,
    ) -> Result<Outcome<T>, Error<E>>
    where
        E: fmt::Display,
        Fut: Future<Output = Result<T, E>>,
    {
        crate::error::check_event_id(event_id)?;
        let held = Held {
            key: self.key(event_id),
            failures: self.failures_key(event_id),
            token: uuid::Uuid::new_v4().to_string(),
            lease_ms: millis(self.lease).max(1),
            event_id,
            payload,
        };
        let mut conn = self.conn.clone();

        let claimed_at = Instant::now();
        let (outcome, remaining_ms): (String, i64) = CLAIM
            .key(&held.key)
            .key(&held.failures)
            .arg(&held.token)
            .arg(held.lease_ms)
            .invoke_async(&mut conn)
            .await?;
        match outcome.as_str() {
            "claimed" => {}
            "done" => return Ok(Outcome::Duplicate),
            "parked" => {
                return Ok(Outcome::Parked {
                    attempts: u32::try_from(remaining_ms.max(0)).unwrap_or(u32::MAX),
                })
            }
            _ => {
                return Ok(Outcome::InProgress {
                    lease_remaining: Duration::from_millis(remaining_ms.max(0).unsigned_abs()),
                })
            }
        }

        // Made only now that the claim is this delivery's: nothing of the work runs for a
        // duplicate, an event in progress elsewhere or a parked one.
        let work = AssertUnwindSafe(work()).catch_unwind();
        match self.renewing(&mut conn, &held, claimed_at, work).await? {
            Ok(Ok(value)) => self.complete(&mut conn, &held, value).await,
            Ok(Err(err)) => Err(self.fail(&mut conn, &held, err).await),
            Err(panic) => {
                // Counted like a failure (which frees the claim), so that a work that always
                // panics is parked at the maximum attempts; then the panic goes on.
                let why = crate::error::panicked(&*panic);
                let _ = self.fail(&mut conn, &held, why).await;
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Run `work` to its end while renewing the claim every third of the lease. A claim found
    /// lost, or not renewed before its lease ran out, drops (cancels) the work:
    /// [`Error::LeaseLost`].
    async fn renewing<F: Future, E>(
        &self,
        conn: &mut C,
        held: &Held<'_>,
        claimed_at: Instant,
        work: F,
    ) -> Result<F::Output, Error<E>> {
        let lease = Duration::from_millis(held.lease_ms);
        let mut held_until = claimed_at + lease;
        let period = Duration::from_millis((held.lease_ms / 3).max(1));
        let mut renewals = tokio::time::interval_at(claimed_at + period, period);
        renewals.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                biased;
                finished = &mut work => return Ok(finished),
                // Not renewed in time (Redis failing over, say): the key may be another
                // delivery's from now on. Dropping `work` cancels it.
                () = tokio::time::sleep_until(held_until) => return Err(Error::LeaseLost),
                _ = renewals.tick() => {
                    let sent = Instant::now();
                    let mut renew = RENEW.key(&held.key);
                    renew.arg(&held.token).arg(held.lease_ms);
                    let renewing = renew.invoke_async::<i64>(conn);
                    let Ok(renewed) = tokio::time::timeout_at(held_until, renewing).await else {
                        return Err(Error::LeaseLost);
                    };
                    match renewed {
                        Ok(1) => held_until = sent + lease,
                        // Dropping `work` here cancels it: another delivery may hold the claim.
                        Ok(_) => return Err(Error::LeaseLost),
                        Err(err) => tracing::warn!(
                            target: "tower_idempotency_consumer",
                            consumer = &*self.consumer, event_id = held.event_id, error = %err,
                            "lease renewal failed; trying again",
                        ),
                    }
                }
            }
        }
    }

    /// Mark the event done for the retention, if the claim is still this delivery's.
    async fn complete<T, E>(
        &self,
        conn: &mut C,
        held: &Held<'_>,
        value: T,
    ) -> Result<Outcome<T>, Error<E>> {
        let completed: i64 = COMPLETE
            .key(&held.key)
            .arg(&held.token)
            .arg(millis(self.retention).max(1))
            .invoke_async(conn)
            .await?;
        if completed == 1 {
            Ok(Outcome::Processed(value))
        } else {
            Err(Error::LeaseLost)
        }
    }

    /// Count the failed attempt and release the claim (or park the event at the maximum
    /// attempts); the error to report.
    async fn fail<E: fmt::Display>(&self, conn: &mut C, held: &Held<'_>, err: E) -> Error<E> {
        let failed: redis::RedisResult<(String, i64)> = FAIL
            .key(&held.key)
            .key(&held.failures)
            .arg(&held.token)
            .arg(self.max_attempts.get())
            .arg(millis(self.retention).max(1))
            .arg(err.to_string())
            .arg(held.payload.unwrap_or_default())
            .invoke_async(conn)
            .await;
        match failed {
            Ok((status, attempts)) if status == "parked" => {
                tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.consumer, event_id = held.event_id, attempts, error = %err, "the event is parked: its deliveries are acknowledged and skipped until it is replayed; RedisConsumer::parked shows it");
                Error::Parked(err)
            }
            // The claim lapsed while the work ran: not counted, as no attempt of this holder's
            // can be recorded on a claim it no longer holds.
            Ok((status, _)) if status == "lost" => {
                tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.consumer, event_id = held.event_id, error = %err, "the work failed after its claim was taken over: not counted");
                Error::LeaseLost
            }
            Ok(_) => Error::Work(err),
            Err(record) => {
                // The lease lapses by itself: the redelivery only waits longer.
                tracing::warn!(target: "tower_idempotency_consumer", consumer = &*self.consumer, event_id = held.event_id, error = %record, "recording a failed attempt failed");
                Error::Work(err)
            }
        }
    }
}

/// The failures hash's `attempts`, `last_error`, `payload` and `parked_at`.
type FailuresFields = (Option<u32>, Option<String>, Option<Vec<u8>>, Option<i64>);

/// One delivery's claim: the event's keys, the token that fences it and the lease.
struct Held<'a> {
    key: String,
    failures: String,
    token: String,
    lease_ms: u64,
    event_id: &'a str,
    /// Kept with the event if it is parked, for [`RedisConsumer::parked`].
    payload: Option<&'a [u8]>,
}

impl<C> Consumer for RedisConsumer<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    /// Nothing: the work shares no transaction with the claim.
    type Context = ();

    fn name(&self) -> &str {
        &self.consumer
    }

    async fn process_once_with_payload<T, E, F>(
        &self,
        event_id: &str,
        payload: Option<&[u8]>,
        work: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Send,
        E: fmt::Display + Send,
        F: crate::Work<(), T, E>,
    {
        let mut context = ();
        self.run_once(event_id, payload, || work(&mut context))
            .await
    }
}
