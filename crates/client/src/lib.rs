//! The client side of `Idempotency-Key`: one key per intent, reused by every attempt, and
//! retries that are safe because of it.
//!
//! A client that times out cannot tell "never arrived" from "done, but the answer was lost".
//! Retrying with a *new* key (or none) then does the work twice; retrying with the *same* key
//! lets a server running [tower-idempotency] replay its first answer. This crate makes the
//! key once per intent (or keeps the caller's) and retries only what is safe for a keyed
//! request:
//!
//! | outcome of an attempt | retried? |
//! |---|---|
//! | connect error, connection closed or reset, incomplete answer | yes, with backoff |
//! | no answer within the attempt timeout | yes, with backoff |
//! | `409` with `Retry-After` (an attempt with this key is in flight) | yes, after `Retry-After` |
//! | `429`, `503` | yes, after `Retry-After` if present, else with backoff |
//! | any other answer (`2xx`, `400`, `409` without `Retry-After`, `422`, `5xx`, ...) | no: returned as is |
//! | any request without a key ([`KeyMode::CallerProvided`], or a method not keyed) | never |
//!
//! Backoff is exponential with full jitter, capped; an intent has a most number of attempts
//! and an overall deadline; and a retry budget ([`tower::retry::budget::TpsBudget`]) caps
//! retries to a share of the traffic, so a failing server is not flooded by them.
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_idempotency_client::{Attempts, IdempotentRetryLayer, RetryConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let hyper_client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let mut client = ServiceBuilder::new()
//!     .layer(IdempotentRetryLayer::new(RetryConfig::default())?)
//!     .service(hyper_client);
//!
//! let request = http::Request::post("http://127.0.0.1:3000/orders")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(r#"{"customerId":"c_1","totalCents":4000}"#)))?;
//! let response = client.ready().await?.call(request).await?;
//! let attempts = response.extensions().get::<Attempts>().unwrap();
//! println!("{} after {} attempt(s), key {:?}", response.status(), attempts.count, attempts.key);
//! # Ok(())
//! # }
//! ```
//!
//! With the `reqwest` feature, [`IdempotentRetryMiddleware`] applies the same policy to a
//! [reqwest-middleware](https://docs.rs/reqwest-middleware) client. Both front ends run one
//! retry core, [backon](https://docs.rs/backon)'s retry loop with this crate's waits (full
//! jitter over backon's exponential schedule, at least `Retry-After`, within the deadline and
//! the budget): the same attempts, waits, budget and counters.
//!
//! # Pluggable
//!
//! - which answers and errors are retried: a [`Classify`] ([`RetryConfig::with_classifier`]);
//! - the header: [`RetryConfig::with_header_name`];
//! - where the key comes from: the request's own header (set by you, for example from an outbox
//!   row, so that a restarted process retries with the same key), a [`KeySource`]
//!   ([`RetryConfig::with_key_source`]), or a generated UUID ([`KeyMode`]).
//!
//! # Observed
//!
//! `tracing` events under the target `tower_idempotency_client` (a retry at `info` with its
//! cause and wait, a budget refusal at `warn`), and with the `metrics` feature the counters
//! `idempotency_client_attempts_total`, `idempotency_client_retries_total{cause}` and
//! `idempotency_client_budget_refusals_total`.
//!
//! [tower-idempotency]: https://docs.rs/tower-idempotency
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod classify;
mod config;
mod error;
mod future;
mod key;
mod layer;
mod policy;
#[cfg(feature = "reqwest")]
mod reqwest;
mod service;

pub use classify::{is_transient, Classify, DefaultClassifier, Verdict};
pub use config::{
    ConfigError, RetryConfig, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_BASE_DELAY,
    DEFAULT_BUDGET_MIN_PER_SEC, DEFAULT_BUDGET_RETRY_RATIO, DEFAULT_BUDGET_TTL, DEFAULT_DEADLINE,
    DEFAULT_KEYED_METHODS, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_DELAY, IDEMPOTENCY_KEY,
};
pub use error::{BoxError, Error};
pub use future::ResponseFuture;
pub use key::{KeyMode, KeySource};
pub use layer::IdempotentRetryLayer;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use reqwest::IdempotentRetryMiddleware;
pub use service::{Attempts, IdempotentRetry};
