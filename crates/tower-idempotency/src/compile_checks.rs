//! Compile-time guarantees: the types users hand to a server are `Send + Sync` (or `Send`, for
//! futures and bodies) for every parameter that is. axum's `Router::layer` and `route_layer`, and
//! hyper's executors, need them; a change that broke one would fail here, in this crate's own
//! build, instead of in a user's.
//!
//! The checks are generic where the types are: `IdempotencyService<S, St, M>` is checked for every
//! `S: Send + Sync`, every store and every mode, not for one instance.

#![allow(dead_code)]

use crate::{
    body::{RequestBody, ResponseBody},
    layer::Idempotency,
    mode::Mode,
    service::{IdempotencyService, ResponseFuture},
    store::{DynStore, Store},
    sweeper::Sweeper,
};

const fn assert_send_sync<T: Send + Sync>() {}

const fn assert_send<T: Send>() {}

/// The layer, for every store and mode: axum clones it into every route.
const fn layer<St: Store, M: Mode<St>>() {
    assert_send_sync::<Idempotency<St, M>>();
}

/// The service, for every inner service that is `Send + Sync` itself.
const fn service<S: Send + Sync, St: Store, M: Mode<St>>() {
    assert_send_sync::<IdempotencyService<S, St, M>>();
}

/// The response future, whatever the body and error: servers poll it on any thread.
const fn future<B, E>() {
    assert_send::<ResponseFuture<B, E>>();
}

/// The bodies, for every inner body that is `Send`.
const fn bodies<B: Send>() {
    assert_send::<RequestBody<B>>();
    assert_send::<ResponseBody<B>>();
}

const _: () = {
    assert_send_sync::<DynStore>();
    assert_send_sync::<Sweeper>();
    #[cfg(feature = "memory")]
    assert_send_sync::<crate::store::MemoryStore>();
    #[cfg(feature = "postgres")]
    assert_send_sync::<crate::store::postgres::PostgresStore>();
    #[cfg(feature = "sqlite")]
    assert_send_sync::<crate::store::sqlite::SqliteStore>();
    #[cfg(feature = "mysql")]
    assert_send_sync::<crate::store::mysql::MySqlStore>();
    #[cfg(feature = "redis")]
    assert_send_sync::<crate::store::redis::RedisStore>();
    // The handler's transaction: an extractor, cloned into the handler.
    #[cfg(feature = "postgres")]
    assert_send_sync::<crate::mode::transactional::IdempotencyTransaction<sqlx::Postgres>>();
    #[cfg(feature = "sqlite")]
    assert_send_sync::<crate::mode::transactional::IdempotencyTransaction<sqlx::Sqlite>>();
    #[cfg(feature = "mysql")]
    assert_send_sync::<crate::mode::transactional::IdempotencyTransaction<sqlx::MySql>>();
};
