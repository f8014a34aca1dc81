#![doc = include_str!("../README.md")]
//!
//! # What happens to a request
//!
//! For a covered method (POST and PATCH by default):
//!
//! 1. The key is read from `Idempotency-Key`, bare (`abc`) or quoted (`"abc"`). Missing: 400
//!    (or pass-through with [`optional`](Idempotency::optional)). Invalid: 400.
//! 2. The body is buffered up to the limit (1 MiB): larger is 413, slower than the body timeout
//!    (30 s) is 408, and nothing is claimed.
//! 3. The request is fingerprinted: method, path and query, the media type of `Content-Type`,
//!    canonical JSON body.
//! 4. The key is scoped to the caller (a hash of `Authorization` by default) and claimed in the
//!    store in one atomic step. Then exactly one of:
//!    - **claimed**: the handler runs; a heartbeat renews the lease meanwhile; its answer is
//!      saved, checked against the claim's fencing token;
//!    - **in flight**: 409 with `Retry-After` (or, in wait mode, wait for the first answer);
//!    - **mismatch**: the key was used for a different request: 422;
//!    - **done**: the saved status, headers and body are replayed with `Idempotent-Replayed: true`.
//! 5. A handler error or panic, a status that means "try again" (408, 425, 429, 503, or a
//!    `grpc-status` of UNAVAILABLE, RESOURCE_EXHAUSTED or ABORTED), or an answer marked
//!    [`NotProcessed`] releases the key. A client that disconnects does not stop the handler: its
//!    answer is still saved for the retry. A store that cannot be reached gives 503 (fail
//!    closed).
//!
//! Every status the layer answers with, and its headers and body: [the table
//! above](#what-the-layer-answers).
//!
//! # Stores
//!
//! | store | feature | constructor |
//! |---|---|---|
//! | [`MemoryStore`](store::MemoryStore) | `memory` (default) | [`Idempotency::memory`] |
//! | `PostgresStore` | `postgres` | `Idempotency::postgres(pool)` |
//! | `SqliteStore` | `sqlite` | `Idempotency::sqlite(pool)` |
//! | `MySqlStore` | `mysql` | `Idempotency::mysql(pool)` (MySQL 8, MariaDB) |
//! | `RedisStore` | `redis` | `Idempotency::redis(..)` |
//!
//! With PostgreSQL, SQLite and MySQL, [transactional mode](transaction) commits the handler's writes
//! and the saved answer together. What is promised, and where it ends: [`guarantees`].
//!
//! # Features
//!
//! Listed in the [install table](#install) above; every item that needs one says so in these docs.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[macro_use]
mod cfg;

#[cfg(feature = "admin")]
pub mod admin;
mod body;
mod compile_checks;
mod config;
cfg_any_store! {
    mod constructors;
}
pub mod error;
#[cfg(feature = "axum")]
mod extract;
#[doc = include_str!("../docs/guarantees.md")]
pub mod guarantees {}
pub mod fingerprint;
pub mod key;
mod layer;
mod mode;
mod not_processed;
mod observe;
#[cfg(feature = "utoipa")]
pub mod openapi;
mod problem;
mod record;
mod retry_after;
mod service;
pub mod store;
pub mod sweeper;
mod timeout;

pub use body::{BoxError, RequestBody, ResponseBody};
pub use config::{
    DEFAULT_BODY_LIMIT, DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_NAME, DEFAULT_LEASE, DEFAULT_METHODS,
    DEFAULT_SAVED_BODY_LIMIT, DEFAULT_STORE_TIMEOUT, DEFAULT_TTL, WAIT_POLL_INTERVAL,
};
pub use error::{Rejection, RejectionResponse};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyHash, Scope};
pub use layer::{Idempotency, IdempotencyLayer};
#[cfg(feature = "postgres")]
pub use mode::single_commit;
#[cfg(feature = "postgres")]
pub use mode::single_commit::SingleCommit;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use mode::transactional as transaction;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use mode::transactional::{IdempotencyTransaction, Transactional};
pub use mode::{Mode, Standard};
pub use not_processed::NotProcessed;
#[cfg(feature = "metrics")]
pub use observe::describe_metrics;
pub use observe::UNKNOWN_ROUTE;
pub use record::{DefaultSavePolicy, SavePolicy, BODY_NOT_KEPT_HEADER, REPLAYED_HEADER};
pub use retry_after::RetryAfter;
pub use service::{IdempotencyService, ResponseFuture};
pub use sweeper::Sweeper;
