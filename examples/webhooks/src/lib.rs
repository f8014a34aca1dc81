//! A webhook receiver that checks each delivery's signature and applies each event once.
//!
//! Run with: `WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw cargo run -p webhooks-example`
//! (see `src/main.rs`).
//!
//! Payment providers sign their webhooks and redeliver them until they get a 2xx, so the same
//! event can arrive twice, out of order, or twice at the same moment. This receiver:
//!
//! 1. verifies the signature, in constant time, under its scheme's own headers
//!    ([`signature`]): [Standard Webhooks](signature::standard) on `POST /webhooks/payments`
//!    (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>`, `whsec_` secrets),
//!    and [Stripe's](signature::stripe) `Stripe-Signature: t=..,v1=..` on
//!    `POST /webhooks/stripe` when a Stripe secret is configured. A missing, wrong or stale
//!    signature (default tolerance 5 minutes) is 401 `application/problem+json`, before the
//!    event is read;
//! 2. applies the event through [`SqliteConsumer`], keyed by the **delivery id** (`webhook-id`;
//!    for Stripe, the event's `id`): the `processed_events` row and the `payments` update commit
//!    in one transaction, so a redelivery is a no-op and a failure leaves nothing behind for the
//!    redelivery to trip on;
//! 3. acknowledges as soon as that one short transaction commits: 200 `{"id", "status"}` with
//!    `applied`, `duplicate` or `ignored` (an event type it does not handle). A failure is 503,
//!    which makes the provider redeliver.
//!
//! Slow follow-up work (e-mails, calls to other services) does not belong in the request: the
//! provider would time out and redeliver. Queue it from the same transaction instead.
//!
//! [`app`] builds the real router, so the tests drive the same code the binary serves:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = webhooks_example::connect("sqlite://webhooks.db?mode=rwc").await?;
//! webhooks_example::migrate(&pool).await?;
//! let config = webhooks_example::Config::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
//! let app = webhooks_example::app(pool, config);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! | route | answer |
//! |---|---|
//! | `POST /webhooks/payments` | 200 `{"id", "status"}`; 401 bad signature; 400 not an event; 503 retry |
//! | `GET /payments/{payment_id}` | 200 with the payment's totals, or 404 |

use std::{
    fmt,
    str::FromStr,
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    routing::{get, post},
    Json, Router,
};
use serde::{Deserialize, Serialize};
use sqlx::{
    migrate::{MigrateError, Migration, MigrationType, Migrator},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
    Row, SqlSafeStr, SqliteConnection, SqlitePool,
};
use tower_idempotency_consumer::{Consumer, Error, Outcome, SqliteConsumer};

mod problem;
pub mod signature;

pub use problem::Problem;
use signature::{
    standard::{self, InvalidSecret, Secret},
    stripe, SignatureError,
};

/// The consumer name the Standard Webhooks deliveries are recorded under in `processed_events`,
/// by their `webhook-id`.
pub const CONSUMER: &str = "payments-webhook";

/// The consumer name the Stripe deliveries are recorded under, by their event's `id`: a name of
/// its own, since the two schemes' ids are not one namespace (a Standard `webhook-id` that
/// happens to equal a Stripe event's id must not make that event a duplicate).
pub const STRIPE_CONSUMER: &str = "payments-webhook-stripe";

/// A Stripe endpoint secret that is empty or blank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Stripe endpoint secret is empty: copy it from the endpoint's page in the Stripe dashboard (whsec_...)")]
pub struct EmptyStripeSecret;

/// What the receiver needs besides the database: the secrets and the clock tolerance.
#[derive(Clone)]
pub struct Config {
    standard: Arc<Secret>,
    stripe: Option<Arc<[u8]>>,
    tolerance: Duration,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("standard", &"<redacted>")
            .field("stripe", &self.stripe.as_ref().map(|_| "<redacted>"))
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

impl Config {
    /// Verify Standard Webhooks signatures with `secret` (`whsec_<base64>`), allowing
    /// [`signature::DEFAULT_TOLERANCE`] of clock skew and delivery delay.
    ///
    /// ```
    /// let config = webhooks_example::Config::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    /// assert!(config.is_ok());
    /// assert!(webhooks_example::Config::new("not-a-secret").is_err());
    /// ```
    pub fn new(secret: &str) -> Result<Self, InvalidSecret> {
        Ok(Self {
            standard: Arc::new(Secret::parse(secret)?),
            stripe: None,
            tolerance: signature::DEFAULT_TOLERANCE,
        })
    }

    /// Also receive Stripe-signed deliveries on `POST /webhooks/stripe`, verified with the
    /// endpoint's `secret` (`whsec_...`, used as Stripe's libraries use it).
    ///
    /// An empty secret (or one of blanks only) is refused: anyone can sign with it, so it would
    /// open the route to forged events.
    ///
    /// ```
    /// let config = webhooks_example::Config::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    /// assert!(config.clone().with_stripe_secret("whsec_stripe").is_ok());
    /// assert!(config.with_stripe_secret("").is_err());
    /// ```
    pub fn with_stripe_secret(
        mut self,
        secret: impl AsRef<[u8]>,
    ) -> Result<Self, EmptyStripeSecret> {
        let secret = secret.as_ref();
        if secret.iter().all(u8::is_ascii_whitespace) {
            return Err(EmptyStripeSecret);
        }
        self.stripe = Some(secret.into());
        Ok(self)
    }

    /// Accept signatures whose timestamp is at most `tolerance` away from now.
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }
}

#[derive(Clone)]
struct AppState {
    pool: SqlitePool,
    /// Standard Webhooks deliveries ([`CONSUMER`]).
    consumer: SqliteConsumer,
    /// Stripe deliveries ([`STRIPE_CONSUMER`]).
    stripe_consumer: SqliteConsumer,
    config: Config,
}

/// A payment event, as the provider posts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The provider's event id: the same for every redelivery of one event.
    pub id: String,
    /// `payment.captured`, `payment.refunded`; other types are acknowledged and ignored.
    #[serde(rename = "type")]
    pub kind: String,
    /// The payment the event is about.
    pub data: PaymentData,
}

/// The payload of a payment event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentData {
    /// The payment's id.
    pub payment_id: String,
    /// The amount captured or refunded, in cents; positive.
    pub amount_cents: i64,
}

/// A payment's totals: the sum of its events, each counted once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The payment's id.
    pub payment_id: String,
    /// The sum of its `payment.captured` events.
    pub captured_cents: i64,
    /// The sum of its `payment.refunded` events.
    pub refunded_cents: i64,
    /// How many events were applied to it.
    pub events: i64,
}

/// What the receiver did with a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The event's id.
    pub id: String,
    /// `applied`, `duplicate` (applied before), `ignored` (a type this receiver skips) or
    /// `parked` (failed too often; kept for a replay).
    pub status: String,
}

/// The router: `POST /webhooks/payments` (Standard Webhooks), `POST /webhooks/stripe` (with a
/// Stripe secret) and `GET /payments/{payment_id}`.
///
/// The database must be migrated ([`migrate`]).
pub fn app(pool: SqlitePool, config: Config) -> Router {
    let mut router = Router::new()
        .route("/webhooks/payments", post(receive_standard))
        .route("/payments/{payment_id}", get(payment));
    if config.stripe.is_some() {
        router = router.route("/webhooks/stripe", post(receive_stripe));
    }
    router.with_state(AppState {
        consumer: SqliteConsumer::new(pool.clone(), CONSUMER),
        stripe_consumer: SqliteConsumer::new(pool.clone(), STRIPE_CONSUMER),
        pool,
        config,
    })
}

/// Open the SQLite database at `url` (WAL mode, a busy timeout for concurrent deliveries).
pub async fn connect(url: &str) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
}

/// Create the consumer's `processed_events` and this example's `payments` table.
pub async fn migrate(pool: &SqlitePool) -> Result<(), MigrateError> {
    SqliteConsumer::new(pool.clone(), CONSUMER)
        .migrate()
        .await?;
    Migrator::with_migrations(vec![Migration::new(
        1,
        "payments".into(),
        MigrationType::Simple,
        include_str!("../migrations/0001_payments.sql").into_sql_str(),
        false,
    )])
    .run(pool)
    .await
}

/// A header's value, if present and visible ASCII.
fn header<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<Option<&'h str>, SignatureError> {
    headers
        .get(name)
        .map(|value| value.to_str().map_err(|_| SignatureError::Missing(name)))
        .transpose()
}

async fn receive_standard(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Ack>, Problem> {
    let verified = (|| {
        let id = header(&headers, standard::ID)?;
        let timestamp = header(&headers, standard::TIMESTAMP)?;
        let signature = header(&headers, standard::SIGNATURE)?;
        standard::verify(
            &state.config.standard,
            id,
            timestamp,
            signature,
            &body,
            SystemTime::now(),
            state.config.tolerance,
        )
        .map(str::to_owned)
    })();
    let delivery_id = verified.map_err(|err| Problem::unauthorized(&err, Scheme::Standard))?;
    apply_delivery(&state.consumer, Some(delivery_id), &body).await
}

async fn receive_stripe(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Ack>, Problem> {
    let Some(secret) = &state.config.stripe else {
        // The route exists only with a Stripe secret.
        return Err(Problem::unauthorized(
            &SignatureError::Mismatch,
            Scheme::Stripe,
        ));
    };
    header(&headers, stripe::HEADER)
        .and_then(|value| {
            stripe::verify(
                secret,
                value,
                &body,
                SystemTime::now(),
                state.config.tolerance,
            )
        })
        .map_err(|err| Problem::unauthorized(&err, Scheme::Stripe))?;
    // Stripe retries a delivery with the same event: its id is the dedupe key.
    apply_delivery(&state.stripe_consumer, None, &body).await
}

/// Which signature scheme a refusal is about: its answer names the scheme's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Standard Webhooks.
    Standard,
    /// Stripe.
    Stripe,
}

/// Parse the verified body and apply it once per delivery id of `consumer` (`delivery_id`, or
/// the event's `id` when the scheme has no delivery id of its own).
async fn apply_delivery(
    consumer: &SqliteConsumer,
    delivery_id: Option<String>,
    body: &Bytes,
) -> Result<Json<Ack>, Problem> {
    let event: Event = serde_json::from_slice(body).map_err(|err| {
        Problem::invalid_event(format!(
            "the body is not a payment event ({err}); expected \
             {{\"id\", \"type\", \"data\": {{\"payment_id\", \"amount_cents\"}}}}"
        ))
    })?;
    if event.id.is_empty() || event.data.payment_id.is_empty() || event.data.amount_cents <= 0 {
        return Err(Problem::invalid_event(
            "`id` and `data.payment_id` must not be empty and `data.amount_cents` must be positive",
        ));
    }

    let id = event.id.clone();
    let delivery_id = delivery_id.unwrap_or_else(|| id.clone());
    // The closure owns the event: its future may only borrow the transaction.
    let outcome = consumer
        .process_once_with_payload(&delivery_id, Some(body), move |tx| {
            Box::pin(async move { apply(tx, &event).await })
        })
        .await;
    let status = match outcome {
        Ok(Outcome::Processed(true)) => "applied",
        Ok(Outcome::Processed(false)) => "ignored",
        Ok(Outcome::Duplicate) => "duplicate",
        // Failed too often: acknowledged, kept for a replay (`SqliteConsumer::replay`).
        Ok(_) | Err(Error::Parked(_)) => "parked",
        // No redelivery mends an id the consumer cannot key by (over 1,024 bytes, a NUL): a
        // 503 would have the sender retry it for its whole window.
        Err(err @ (Error::MissingEventId | Error::InvalidEventId)) => {
            return Err(Problem::invalid_event(format!(
                "the delivery's id cannot be used to deduplicate it ({err}); send ids of at most \
                 1,024 bytes without NUL"
            )))
        }
        Err(Error::Work(err)) => return Err(Problem::unavailable(&err)),
        Err(err) => return Err(Problem::unavailable(&err)),
    };
    tracing::info!(event_id = %id, delivery_id = %delivery_id, status, "webhook delivery");
    Ok(Json(Ack {
        id,
        status: status.into(),
    }))
}

/// The event's effect, in the transaction that records it: `true` if it changed a payment.
async fn apply(tx: &mut SqliteConnection, event: &Event) -> Result<bool, sqlx::Error> {
    let (captured, refunded) = match event.kind.as_str() {
        "payment.captured" => (event.data.amount_cents, 0),
        "payment.refunded" => (0, event.data.amount_cents),
        _ => return Ok(false),
    };
    sqlx::query(
        "INSERT INTO payments (payment_id, captured_cents, refunded_cents, events)
         VALUES ($1, $2, $3, 1)
         ON CONFLICT (payment_id) DO UPDATE SET
             captured_cents = captured_cents + excluded.captured_cents,
             refunded_cents = refunded_cents + excluded.refunded_cents,
             events = events + 1",
    )
    .bind(&event.data.payment_id)
    .bind(captured)
    .bind(refunded)
    .execute(&mut *tx)
    .await?;
    Ok(true)
}

async fn payment(
    State(state): State<AppState>,
    Path(payment_id): Path<String>,
) -> Result<Json<Payment>, Problem> {
    let row = sqlx::query(
        "SELECT captured_cents, refunded_cents, events FROM payments WHERE payment_id = $1",
    )
    .bind(&payment_id)
    .fetch_optional(&state.pool)
    .await
    .map_err(|err| Problem::unavailable(&err))?;
    let found = row
        .map(|row| {
            Ok::<_, sqlx::Error>(Payment {
                payment_id: payment_id.clone(),
                captured_cents: row.try_get("captured_cents")?,
                refunded_cents: row.try_get("refunded_cents")?,
                events: row.try_get("events")?,
            })
        })
        .transpose()
        .map_err(|err| Problem::unavailable(&err))?;
    found.map(Json).ok_or_else(|| Problem {
        status: StatusCode::NOT_FOUND,
        kind: "not-found",
        title: "Not found",
        detail: format!("no event has been applied to payment {payment_id}"),
    })
}
