//! A store in Redis (feature `redis`; Redis Cluster with `redis-cluster`).
//!
//! ```no_run
//! use tower_idempotency::{store::redis::{redis, RedisStore}, Idempotency};
//!
//! # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
//! let client = redis::Client::open("redis://127.0.0.1:6379").expect("a valid url");
//! let store = RedisStore::connect(client).await?.with_prefix("orders-api");
//! let layer = Idempotency::new(store);
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! # Data layout
//!
//! One record is one Redis hash at `{prefix}:{<key hex>}`, where `<key hex>` is the lower-case hex
//! of the scoped [`KeyHash`](crate::KeyHash) (the raw key is never stored) and the braces are literal: they are
//! the record's Redis Cluster hash tag. Its fields:
//!
//! | field | content |
//! |---|---|
//! | `fp` | the request fingerprint, hex |
//! | `token` | the holder's [`FencingToken`](crate::store::FencingToken), a hyphenated UUID |
//! | `state` | `running` or `done` |
//! | `lease_until` | end of the holder's lease, Unix milliseconds (server clock) |
//! | `expires_at` | end of the record's retention, Unix milliseconds (server clock) |
//! | `created_at` | the first claim, Unix milliseconds (server clock): for [`Store::stats`](crate::store::Store::stats) |
//! | `status` | the saved status code, decimal (`done` only) |
//! | `headers` | the saved headers as `name: value\n` lines (`done` only) |
//! | `body` | the saved body, raw bytes (`done` only) |
//!
//! The key carries a `PEXPIREAT` at `expires_at`, so Redis removes expired records itself and
//! [`Store::sweep`](crate::store::Store::sweep) has nothing to do. A takeover rewrites the token and the lease, and keeps
//! `expires_at` and the key's expiry (a record is kept for its TTL counted from its first claim)
//! unless its new lease runs past them: then both move to the lease's end, as after a renewal.
//!
//! # Atomicity
//!
//! `claim`, `renew`, `complete` and `release` are each one Lua script touching one key. Redis
//! runs a script to the end before any other command, so the check (fingerprint, state, lease,
//! fencing token) and the write are one step: two concurrent claims can never both win, and a
//! holder whose lease was taken over cannot write. The scripts read the time with `TIME` inside
//! the script, so every application instance is judged by the same clock; Redis 7 replicates a
//! script's effects rather than the script, which makes that deterministic on replicas (older
//! servers are switched to effect replication by the script itself). The scripts are sent by
//! SHA (`EVALSHA`) and loaded again on `NOSCRIPT`, for example after a restart or a
//! `SCRIPT FLUSH`.
//!
//! # Redis Cluster
//!
//! Every script declares its single key, and all the names of one record share the `{<key hex>}`
//! hash tag, so nothing ever crosses slots and records spread evenly over the cluster. Build the
//! store with [`RedisStore::cluster`] (feature `redis-cluster`).
//!
//! # Wait mode
//!
//! `complete` and `release` `PUBLISH` on `{prefix}:{<key hex>}:done`. With notifications enabled
//! ([`RedisStore::connect`] enables them, [`RedisStore::with_notifications`] does it for the
//! other constructors), [`Store::wait_for_change`](crate::store::Store::wait_for_change) subscribes to that channel over one pub/sub
//! connection shared by all clones of the store, opened on first use, and wakes as soon as the
//! record is completed or released, or when the holder's lease lapses. A channel is subscribed
//! while someone waits on it and unsubscribed when its last waiter returns; the connection
//! itself stays open until the last clone of the store is dropped, and is reopened on the next
//! wait if it broke. Without notifications, or when the pub/sub connection fails, it sleeps for
//! the timeout the layer gives it.
//!
//! Plain `PUBLISH` is used rather than `SPUBLISH`: in a cluster it reaches subscribers on every
//! node, so the notification connection may point at any one node. The price is that every
//! completion is broadcast over the cluster bus.
//!
//! # Durability
//!
//! Records survive a Redis restart or failover only as far as the server's persistence (RDB
//! snapshots, AOF and its `appendfsync` policy) and replication allow. A record lost that way
//! lets a retry execute again. Where that is not acceptable, use the PostgreSQL store, which also
//! offers transactional mode.
//!
//! # Layout of this module
//!
//! [`RedisStore`] (`store.rs`) sends the Lua scripts of `scripts/` through `scripts.rs`, which
//! also decodes their replies and reloads them on `NOSCRIPT`; `notifier.rs` is the pub/sub
//! connection wait mode listens on.

pub use redis;

mod error;
mod notifier;
mod scripts;
mod store;

pub use store::{RedisStore, DEFAULT_PREFIX};
