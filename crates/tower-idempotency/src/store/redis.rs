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
//! of the scoped [`KeyHash`] (the raw key is never stored) and the braces are literal: they are
//! the record's Redis Cluster hash tag. Its fields:
//!
//! | field | content |
//! |---|---|
//! | `fp` | the request fingerprint, hex |
//! | `token` | the holder's [`FencingToken`], a hyphenated UUID |
//! | `state` | `running` or `done` |
//! | `lease_until` | end of the holder's lease, Unix milliseconds (server clock) |
//! | `expires_at` | end of the record's retention, Unix milliseconds (server clock) |
//! | `status` | the saved status code, decimal (`done` only) |
//! | `headers` | the saved headers as `name: value\n` lines (`done` only) |
//! | `body` | the saved body, raw bytes (`done` only) |
//!
//! The key carries a `PEXPIREAT` at `expires_at`, so Redis removes expired records itself and
//! [`Store::sweep`] has nothing to do. A takeover rewrites the token and the lease but neither
//! `expires_at` nor the key's expiry: a record is kept for its TTL counted from its first claim.
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
//! other constructors), [`Store::wait_for_change`] subscribes to that channel over one pub/sub
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

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, LazyLock, Mutex, MutexGuard},
    time::Duration,
};

use bytes::Bytes;
use futures_util::StreamExt;
pub use redis;
use redis::{
    aio::ConnectionManager, ErrorKind, RedisResult, Script, ScriptInvocation, ServerErrorKind,
    Value,
};
use tokio::{
    sync::{oneshot, Notify},
    time::Instant,
};

use super::{Claim, ClaimOutcome, Fenced, FencingToken, Store, StoreError, StoredResponse};
use crate::key::KeyHash;

/// The key prefix used unless [`RedisStore::with_prefix`] sets another.
pub const DEFAULT_PREFIX: &str = "idempotency";

/// How long [`RedisStore::lazy`] waits for a connection before the request fails.
const LAZY_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest lease or TTL sent to Redis, in milliseconds (about 285 years). Longer durations
/// are clamped so that the server's arithmetic stays exact.
const MAX_MILLIS: u64 = 1 << 53;

/// Stands in for a wait timeout too large to add to the clock (about 30 years).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The script prologue: effect replication on servers older than 7 (a no-op on 7), and `now`.
macro_rules! prologue {
    () => {
        r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"#
    };
}

/// KEYS[1] record; ARGV: fingerprint, token, lease ms, ttl ms.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prologue!(),
        r#"
local rec = redis.call('HMGET', KEYS[1], 'fp', 'state', 'lease_until', 'expires_at',
  'status', 'headers', 'body')
local fp, state, lease_until, expires_at = rec[1], rec[2], tonumber(rec[3]), tonumber(rec[4])
if (fp or state or rec[3] or rec[4]) and not (expires_at and expires_at <= now) then
  if not fp or not expires_at then return {'corrupt'} end
  if fp ~= ARGV[1] then return {'mismatch'} end
  if state == 'done' then return {'done', rec[5], rec[6], rec[7]} end
  if state ~= 'running' or not lease_until then return {'corrupt'} end
  if lease_until > now then return {'inflight', lease_until - now} end
  redis.call('HSET', KEYS[1], 'token', ARGV[2], 'lease_until', now + tonumber(ARGV[3]))
  return {'claimed', 1}
end
local exp = now + tonumber(ARGV[4])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'token', ARGV[2], 'state', 'running',
  'lease_until', now + tonumber(ARGV[3]), 'expires_at', exp)
redis.call('PEXPIREAT', KEYS[1], exp)
return {'claimed', 0}
"#
    ))
});

/// KEYS[1] record; ARGV: token, lease ms.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prologue!(),
        r#"
local rec = redis.call('HMGET', KEYS[1], 'token', 'state')
if rec[1] ~= ARGV[1] or rec[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
return 1
"#
    ))
});

/// KEYS[1] record; ARGV: token, status, headers, body, channel.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local rec = redis.call('HMGET', KEYS[1], 'token', 'state')
if rec[1] ~= ARGV[1] or rec[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4])
redis.call('PUBLISH', ARGV[5], 'done')
return 1
"#,
    )
});

/// KEYS[1] record; ARGV: token, channel.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local rec = redis.call('HMGET', KEYS[1], 'token', 'state')
if rec[1] ~= ARGV[1] or rec[2] ~= 'running' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
"#,
    )
});

/// KEYS[1] record. Read-only: the lease time left of a running record, 0 for anything else.
static PEEK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prologue!(),
        r#"
local rec = redis.call('HMGET', KEYS[1], 'state', 'lease_until')
local lease_until = tonumber(rec[2])
if rec[1] ~= 'running' or not lease_until or lease_until <= now then return 0 end
return lease_until - now
"#
    ))
});

/// The connection the scripts run on.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

/// How many times a script is sent when the server keeps answering `NOSCRIPT`.
const NOSCRIPT_ATTEMPTS: usize = 3;

impl Connection {
    /// `EVALSHA`, with `SCRIPT LOAD` and a retry on `NOSCRIPT` (done by [`ScriptInvocation`]).
    ///
    /// A `SCRIPT FLUSH` (or a failover to a node that never saw the script) between the load and
    /// the retry makes that retry fail with `NOSCRIPT` too, so the whole exchange is repeated a
    /// few times. Running a script twice is impossible: `NOSCRIPT` means it did not run.
    async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> RedisResult<Value> {
        let mut attempt = 1;
        loop {
            let result = match self {
                Connection::Single(conn) => invocation.invoke_async(&mut conn.clone()).await,
                #[cfg(feature = "redis-cluster")]
                Connection::Cluster(conn) => invocation.invoke_async(&mut conn.clone()).await,
            };
            match result {
                Err(err)
                    if attempt < NOSCRIPT_ATTEMPTS
                        && err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}

/// Idempotency records in Redis or Redis Cluster, one hash per key.
///
/// See the [module docs](self) for the data layout, atomicity, cluster safety and durability.
/// Clones share the connection and the notification connection.
///
/// ```no_run
/// use tower_idempotency::store::redis::{redis, RedisStore};
///
/// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
/// let client = redis::Client::open("redis://127.0.0.1:6379").expect("a valid url");
/// // connection manager and wait-mode notifications from one client
/// let store = RedisStore::connect(client.clone()).await?;
///
/// // or from a connection manager the application already has
/// let manager = client.get_connection_manager().await?;
/// let store = RedisStore::new(manager).with_notifications(client);
/// # let _ = store;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: Arc<str>,
    notifier: Option<Arc<Notifier>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.conn {
            Connection::Single(_) => "single",
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("mode", &mode)
            .field("prefix", &self.prefix)
            .field("notifications", &self.notifier.is_some())
            .finish()
    }
}

impl RedisStore {
    /// A store over `manager`, with the [`DEFAULT_PREFIX`].
    ///
    /// Wait mode polls (sleeps for the layer's interval) until
    /// [`with_notifications`](Self::with_notifications) gives it a pub/sub connection.
    pub fn new(manager: ConnectionManager) -> Self {
        Self::from_connection(Connection::Single(manager))
    }

    /// Open a connection manager on `client` and a store over it, with wait-mode notifications
    /// on the same server.
    ///
    /// Fails with [`StoreErrorKind::Unavailable`](super::StoreErrorKind::Unavailable) when the server cannot be reached.
    pub async fn connect(client: redis::Client) -> Result<Self, StoreError> {
        let manager = client.get_connection_manager().await?;
        Ok(Self::new(manager).with_notifications(client))
    }

    /// A store on `client` that connects on first use, with wait-mode notifications: the
    /// application starts even while Redis is down (its requests then get 503, or run unguarded
    /// with [`fail_open`](crate::Idempotency::fail_open)), and the store connects once Redis is
    /// back.
    ///
    /// ```
    /// use tower_idempotency::store::redis::{redis, RedisStore};
    ///
    /// # fn run() -> Result<(), tower_idempotency::store::StoreError> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379").expect("a valid url");
    /// let store = RedisStore::lazy(client)?;
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    pub fn lazy(client: redis::Client) -> Result<Self, StoreError> {
        // Few, short connection attempts: while Redis is down a request should get its 503
        // (or run, fail-open) in about a second, not after the default retry schedule.
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(Some(LAZY_CONNECT_TIMEOUT));
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        Ok(Self::new(manager).with_notifications(client))
    }

    /// A store over a Redis Cluster connection (feature `redis-cluster`).
    ///
    /// Wait-mode notifications need a plain client on any one node of the cluster:
    ///
    /// ```no_run
    /// use tower_idempotency::store::redis::{redis, RedisStore};
    ///
    /// # async fn run() -> redis::RedisResult<()> {
    /// let nodes = ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"];
    /// let conn = redis::cluster::ClusterClient::new(nodes.to_vec())?
    ///     .get_async_connection()
    ///     .await?;
    /// let store = RedisStore::cluster(conn)
    ///     .with_notifications(redis::Client::open(nodes[0])?);
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-cluster")]
    pub fn cluster(conn: redis::cluster_async::ClusterConnection) -> Self {
        Self::from_connection(Connection::Cluster(conn))
    }

    fn from_connection(conn: Connection) -> Self {
        Self {
            conn,
            prefix: Arc::from(DEFAULT_PREFIX),
            notifier: None,
        }
    }

    /// Put the records under `prefix` instead of [`DEFAULT_PREFIX`]: `{prefix}:{<key hex>}`.
    ///
    /// Give each application (or environment) sharing a server its own prefix.
    ///
    /// # Warning
    ///
    /// Keep `{` and `}` out of the prefix: Redis Cluster would take the prefix's braces as the
    /// hash tag and put every record in one slot (still correct, but on a single node).
    ///
    /// ```no_run
    /// # use tower_idempotency::store::redis::RedisStore;
    /// # fn f(store: RedisStore) {
    /// let store = store.with_prefix("payments-api");
    /// # }
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// Wake wait mode through pub/sub on `client` (one connection, opened on first use, shared
    /// by the clones of this store).
    ///
    /// In a cluster, `client` may point at any node: completions are published cluster-wide.
    ///
    /// ```no_run
    /// # use tower_idempotency::store::redis::{redis, RedisStore};
    /// # fn f(store: RedisStore) -> redis::RedisResult<()> {
    /// let store = store.with_notifications(redis::Client::open("redis://127.0.0.1:6379")?);
    /// # Ok(()) }
    /// ```
    pub fn with_notifications(mut self, client: redis::Client) -> Self {
        self.notifier = Some(Arc::new(Notifier::new(client)));
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of the record of `key`: `{prefix}:{<key hex>}`, braces included.
    pub fn record_key(&self, key: &KeyHash) -> String {
        format!("{}:{{{}}}", self.prefix, key.to_hex())
    }

    /// The channel `complete` and `release` publish on: the record key followed by `:done`.
    pub fn channel(&self, key: &KeyHash) -> String {
        format!("{}:{{{}}}:done", self.prefix, key.to_hex())
    }

    /// Whether a one-key script that answers 1 or 0 changed the record.
    async fn fenced(&self, invocation: &ScriptInvocation<'_>) -> Result<Fenced, StoreError> {
        match self.conn.invoke(invocation).await? {
            Value::Int(n) => Ok(Fenced::from_rows(u64::from(n > 0))),
            _ => Err(StoreError::corrupt("unexpected reply from a redis script")),
        }
    }

    /// The lease time left of the record of `key`, zero when it is not running under a valid
    /// lease (absent, done, or lapsed).
    async fn lease_remaining(&self, key: &KeyHash) -> Result<Duration, StoreError> {
        let invocation = PEEK.key(self.record_key(key));
        match self.conn.invoke(&invocation).await? {
            Value::Int(ms) => Ok(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            _ => Err(StoreError::corrupt("unexpected reply from a redis script")),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .min(MAX_MILLIS)
}

/// The bytes of a string-like reply.
fn bytes_of(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        _ => None,
    }
}

/// An integer reply, or a string-like reply holding one.
fn int_of(value: Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(n),
        other => std::str::from_utf8(&bytes_of(other)?).ok()?.parse().ok(),
    }
}

/// Decode the claim script's reply.
fn claim_outcome(reply: Value) -> Result<ClaimOutcome, StoreError> {
    const UNEXPECTED: &str = "unexpected reply from the redis claim script";
    let Value::Array(items) = reply else {
        return Err(StoreError::corrupt(UNEXPECTED));
    };
    let mut items = items.into_iter();
    let tag = items
        .next()
        .and_then(bytes_of)
        .ok_or_else(|| StoreError::corrupt(UNEXPECTED))?;
    let mut next_int = || {
        items
            .next()
            .and_then(int_of)
            .ok_or_else(|| StoreError::corrupt(UNEXPECTED))
    };
    match tag.as_slice() {
        b"claimed" => Ok(ClaimOutcome::Claimed {
            taken_over: next_int()? != 0,
        }),
        b"inflight" => Ok(ClaimOutcome::InFlight {
            lease_remaining: Duration::from_millis(u64::try_from(next_int()?).unwrap_or(0)),
        }),
        b"mismatch" => Ok(ClaimOutcome::Mismatch),
        b"done" => {
            let status = next_int()
                .ok()
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| StoreError::corrupt("a saved redis record has no valid status"))?;
            let headers = items.next().and_then(bytes_of).unwrap_or_default();
            let body = items.next().and_then(bytes_of).unwrap_or_default();
            Ok(ClaimOutcome::Done(StoredResponse::from_parts(
                status,
                &headers,
                Bytes::from(body),
            )?))
        }
        b"corrupt" => Err(StoreError::corrupt(
            "a redis record lacks its fingerprint, state, lease or expiry",
        )),
        _ => Err(StoreError::corrupt(UNEXPECTED)),
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        let mut invocation = CLAIM.key(self.record_key(&claim.key));
        invocation
            .arg(claim.fingerprint.to_hex())
            .arg(claim.token.to_string())
            .arg(millis(claim.lease))
            .arg(millis(claim.ttl).max(1));
        claim_outcome(self.conn.invoke(&invocation).await?)
    }

    async fn renew(
        &self,
        key: &KeyHash,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Fenced, StoreError> {
        let mut invocation = RENEW.key(self.record_key(key));
        invocation.arg(token.to_string()).arg(millis(lease));
        self.fenced(&invocation).await
    }

    async fn complete(
        &self,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<Fenced, StoreError> {
        let mut invocation = COMPLETE.key(self.record_key(key));
        invocation
            .arg(token.to_string())
            .arg(response.status.as_u16())
            .arg(response.encode_headers())
            .arg(response.body.as_ref())
            .arg(self.channel(key));
        self.fenced(&invocation).await
    }

    async fn release(&self, key: &KeyHash, token: FencingToken) -> Result<Fenced, StoreError> {
        let mut invocation = RELEASE.key(self.record_key(key));
        invocation.arg(token.to_string()).arg(self.channel(key));
        self.fenced(&invocation).await
    }

    /// Always `Ok(0)`: every record carries a `PEXPIREAT` at its expiry and Redis deletes it
    /// itself, so there is nothing to sweep.
    async fn sweep(&self, _batch: u32) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// With notifications: subscribe to the record's channel, then wake on its `complete` or
    /// `release`, when the holder's lease lapses, or at `timeout`, whichever is first. Returns
    /// at once when the record is already absent, done or lapsed. Without notifications, or on
    /// any pub/sub failure, sleep for `timeout`.
    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        let now = Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or(now + FAR_FUTURE);
        let Some(notifier) = &self.notifier else {
            tokio::time::sleep_until(deadline).await;
            return;
        };
        let channel = self.channel(key);
        let registration = Notifier::register(notifier, &channel);
        let notified = registration.notify.notified();
        tokio::pin!(notified);
        // From here on a `notify_waiters` reaches this waiter even before it is polled.
        notified.as_mut().enable();

        match tokio::time::timeout_at(deadline, notifier.subscribe(&channel)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::debug!(target: "tower_idempotency::store::redis", error = %err,
                    "pub/sub subscribe failed; waiting without notifications");
                tokio::time::sleep_until(deadline).await;
                return;
            }
            Err(_) => return,
        }
        // Subscribed: any completion from now on is delivered. Check what happened before.
        let wake_at = match self.lease_remaining(key).await {
            Ok(remaining) if remaining.is_zero() => return,
            Ok(remaining) => Instant::now()
                .checked_add(remaining)
                .map_or(deadline, |lapse| lapse.min(deadline)),
            Err(_) => deadline,
        };
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
        // `notified`, then `registration` (unsubscribing the last waiter) drop here.
    }
}

impl crate::Idempotency<RedisStore> {
    /// A layer over a [`RedisStore`] on `client`, under the default prefix, connecting on first
    /// use (see [`RedisStore::lazy`]), with wait-mode notifications.
    ///
    /// ```
    /// use tower_idempotency::{store::redis::redis, Idempotency};
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let layer = Idempotency::redis(client)?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn redis(client: redis::Client) -> Result<Self, StoreError> {
        Ok(Self::new(RedisStore::lazy(client)?))
    }
}

/// Wait-mode notifications: one pub/sub connection, a [`Notify`] per channel with waiters.
struct Notifier {
    client: redis::Client,
    waiters: Arc<Mutex<HashMap<String, Waiters>>>,
    /// The live connection. Also serialises `SUBSCRIBE` and `UNSUBSCRIBE`, so that an
    /// unsubscribe for a channel that lost its last waiter cannot overtake a new subscribe.
    link: tokio::sync::Mutex<Option<Link>>,
}

struct Waiters {
    notify: Arc<Notify>,
    count: usize,
}

/// A pub/sub connection and the task dispatching its messages.
struct Link {
    sink: redis::aio::PubSubSink,
    /// Dropping it stops the dispatch task, which drops the stream and closes the connection.
    _stop: oneshot::Sender<()>,
}

/// One waiter's interest in a channel; the channel is unsubscribed when the last one drops.
struct Registration {
    notifier: Arc<Notifier>,
    channel: String,
    notify: Arc<Notify>,
}

fn lock(waiters: &Mutex<HashMap<String, Waiters>>) -> MutexGuard<'_, HashMap<String, Waiters>> {
    // The map stays consistent whatever panicked while holding the lock.
    waiters
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Notifier {
    fn new(client: redis::Client) -> Self {
        Self {
            client,
            waiters: Arc::default(),
            link: tokio::sync::Mutex::new(None),
        }
    }

    fn register(this: &Arc<Self>, channel: &str) -> Registration {
        let mut waiters = lock(&this.waiters);
        let entry = waiters
            .entry(channel.to_owned())
            .or_insert_with(|| Waiters {
                notify: Arc::new(Notify::new()),
                count: 0,
            });
        entry.count += 1;
        Registration {
            notifier: Arc::clone(this),
            channel: channel.to_owned(),
            notify: Arc::clone(&entry.notify),
        }
    }

    /// Subscribe to `channel`, opening the connection if there is none (or it died).
    async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        let mut link = self.link.lock().await;
        let mut retried = false;
        loop {
            let current = match link.as_mut() {
                Some(current) => current,
                None => link.insert(self.open().await?),
            };
            match current.sink.subscribe(channel).await {
                Ok(()) => return Ok(()),
                Err(err) => {
                    *link = None;
                    if retried {
                        return Err(err);
                    }
                    retried = true;
                }
            }
        }
    }

    async fn open(&self) -> RedisResult<Link> {
        let (sink, mut stream) = self.client.get_async_pubsub().await?.split();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let waiters = Arc::clone(&self.waiters);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = stream.next() => match message {
                        Some(message) => {
                            if let Some(entry) = lock(&waiters).get(message.get_channel_name()) {
                                entry.notify.notify_waiters();
                            }
                        }
                        None => break,
                    },
                    _ = &mut stopped => break,
                }
            }
            // The connection is gone: wake everyone so that they claim again (and resubscribe
            // on a new connection if they still have to wait).
            for entry in lock(&waiters).values() {
                entry.notify.notify_waiters();
            }
        });
        Ok(Link { sink, _stop: stop })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let last = {
            let mut waiters = lock(&self.notifier.waiters);
            match waiters.get_mut(&self.channel) {
                Some(entry) if entry.count > 1 => {
                    entry.count -= 1;
                    false
                }
                Some(_) => {
                    waiters.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let notifier = Arc::clone(&self.notifier);
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let mut link = notifier.link.lock().await;
            // A waiter that registered meanwhile has subscribed (or will, after this lock).
            if lock(&notifier.waiters).contains_key(&channel) {
                return;
            }
            if let Some(current) = link.as_mut() {
                if current.sink.unsubscribe(&channel).await.is_err() {
                    *link = None;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreErrorKind;

    fn array(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    fn bulk(text: &[u8]) -> Value {
        Value::BulkString(text.to_vec())
    }

    #[test]
    fn claim_replies_decode() {
        assert_eq!(
            claim_outcome(array(vec![bulk(b"claimed"), Value::Int(1)])).unwrap(),
            ClaimOutcome::Claimed { taken_over: true }
        );
        assert_eq!(
            claim_outcome(array(vec![bulk(b"inflight"), Value::Int(1500)])).unwrap(),
            ClaimOutcome::InFlight {
                lease_remaining: Duration::from_millis(1500)
            }
        );
        assert_eq!(
            claim_outcome(array(vec![bulk(b"mismatch")])).unwrap(),
            ClaimOutcome::Mismatch
        );
        let done = claim_outcome(array(vec![
            bulk(b"done"),
            bulk(b"201"),
            bulk(b"x-a: 1\nx-a: 2\n"),
            bulk(b"\x00body"),
        ]))
        .unwrap();
        let ClaimOutcome::Done(saved) = done else {
            panic!("expected done, got {done:?}");
        };
        assert_eq!(saved.status, http::StatusCode::CREATED);
        assert_eq!(saved.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(saved.body, Bytes::from_static(b"\x00body"));
    }

    #[test]
    fn corrupt_replies_are_errors_not_panics() {
        for reply in [
            Value::Nil,
            array(vec![]),
            array(vec![bulk(b"claimed")]),
            array(vec![bulk(b"done"), Value::Nil, Value::Nil, Value::Nil]),
            array(vec![bulk(b"done"), bulk(b"99999"), Value::Nil, Value::Nil]),
            array(vec![
                bulk(b"done"),
                bulk(b"200"),
                bulk(b"bad header"),
                Value::Nil,
            ]),
            array(vec![bulk(b"corrupt")]),
            array(vec![bulk(b"what")]),
        ] {
            let err = claim_outcome(reply).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        }
    }

    #[test]
    fn durations_are_clamped() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }
}
