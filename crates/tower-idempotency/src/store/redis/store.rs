//! [`RedisStore`]: the [`Store`] methods as script calls.

use std::{fmt, sync::Arc, time::Duration};

use redis::{aio::ConnectionManager, ScriptInvocation, Value};
use tokio::time::Instant;

use super::{
    notifier::Notifier,
    scripts::{self, claim_outcome, Connection, CLAIM, COMPLETE, PEEK, RELEASE, RENEW},
};
use crate::{
    key::KeyHash,
    store::{
        record::time::{from_millis, to_millis},
        Claim, ClaimOutcome, Fenced, Hold, RecordInfo, Store, StoreError, StoreStats,
        StoredResponse,
    },
};

/// The key prefix used unless [`RedisStore::with_prefix`] sets another.
pub const DEFAULT_PREFIX: &str = "idempotency";

/// How long [`RedisStore::lazy`] waits for a connection before the request fails.
const LAZY_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Stands in for a wait timeout too large to add to the clock (about 30 years).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// Idempotency records in Redis or Redis Cluster, one hash per key.
///
/// See the [module docs](crate::store::redis) for the data layout, atomicity, cluster safety and durability.
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
    /// Fails with [`StoreErrorKind::Unavailable`](crate::store::StoreErrorKind::Unavailable) when the server cannot be reached.
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
            Value::Int(n) => Ok(Fenced::applied_if(n > 0)),
            _ => Err(StoreError::corrupt("unexpected reply from a redis script")),
        }
    }

    /// The lease time left of the record of `key`, zero when it is not running under a valid
    /// lease (absent, done, or lapsed).
    async fn lease_remaining(&self, key: &KeyHash) -> Result<Duration, StoreError> {
        let invocation = PEEK.key(self.record_key(key));
        match self.conn.invoke(&invocation).await? {
            Value::Int(ms) => Ok(from_millis(ms)),
            _ => Err(StoreError::corrupt("unexpected reply from a redis script")),
        }
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
            .arg(to_millis(claim.lease))
            .arg(to_millis(claim.ttl).max(1));
        claim_outcome(self.conn.invoke(&invocation).await?)
    }

    async fn renew(&self, hold: &Hold, lease: Duration) -> Result<Fenced, StoreError> {
        let mut invocation = RENEW.key(self.record_key(&hold.key));
        invocation.arg(hold.token.to_string()).arg(to_millis(lease));
        self.fenced(&invocation).await
    }

    async fn complete(&self, hold: &Hold, response: &StoredResponse) -> Result<Fenced, StoreError> {
        let mut invocation = COMPLETE.key(self.record_key(&hold.key));
        invocation
            .arg(hold.token.to_string())
            .arg(response.status.as_u16())
            .arg(response.encode_headers())
            .arg(response.body.as_ref())
            .arg(self.channel(&hold.key));
        self.fenced(&invocation).await
    }

    async fn release(&self, hold: &Hold) -> Result<Fenced, StoreError> {
        let mut invocation = RELEASE.key(self.record_key(&hold.key));
        invocation
            .arg(hold.token.to_string())
            .arg(self.channel(&hold.key));
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
        let notified = registration.notify().notified();
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

    async fn get(&self, key: &KeyHash) -> Result<Option<RecordInfo>, StoreError> {
        let invocation = scripts::GET.key(self.record_key(key));
        scripts::record_info(self.conn.invoke(&invocation).await?)
    }

    async fn forget(&self, key: &KeyHash) -> Result<bool, StoreError> {
        let mut invocation = scripts::FORGET.key(self.record_key(key));
        invocation.arg(self.channel(key));
        match self.conn.invoke(&invocation).await? {
            Value::Int(deleted) => Ok(deleted > 0),
            _ => Err(StoreError::corrupt(
                "unexpected reply from the redis forget script",
            )),
        }
    }

    /// A `SCAN` over the prefix's records, their state read in pipelines of a thousand: it
    /// visits every key of the server (`SCAN` does not filter before it reads), in steps that
    /// do not block the server. Counts are as of each record's read, not one instant; a
    /// record written before `created_at` was kept (an older version) is counted but cannot be
    /// the oldest. Redis Cluster answers [`Unsupported`](crate::store::StoreErrorKind::Unsupported):
    /// its keys are spread over nodes a single `SCAN` does not reach.
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        #[allow(irrefutable_let_patterns)]
        let Connection::Single(conn) = &self.conn
        else {
            return Err(StoreError::unsupported("stats on Redis Cluster"));
        };
        let mut conn = conn.clone();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let mut tally = Tally::new(secs * 1000 + micros / 1000);
        let pattern = format!("{}:{{*}}", glob_escape(&self.prefix));
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(STATS_BATCH)
                .query_async(&mut conn)
                .await?;
            cursor = next;
            // A step may find nothing (and an empty pipeline is an error).
            if !keys.is_empty() {
                let fields = record_fields(&mut conn, &keys).await?;
                for (key, fields) in keys.into_iter().zip(fields) {
                    tally.add(key, fields);
                }
            }
            if cursor == 0 {
                break;
            }
        }
        Ok(tally.finish(|key| self.key_of(key)))
    }
}

/// A record's `state`, `expires_at` and `created_at`, as `HMGET` reads them (all `None`: gone).
type RecordFields = (Option<String>, Option<u64>, Option<u64>);

/// The fields [`RedisStore::stats`] counts of each of `keys`, in one pipeline.
async fn record_fields(
    conn: &mut ConnectionManager,
    keys: &[String],
) -> Result<Vec<RecordFields>, StoreError> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("HMGET")
            .arg(key)
            .arg("state")
            .arg("expires_at")
            .arg("created_at");
    }
    Ok(pipe.query_async(conn).await?)
}

/// What [`RedisStore::stats`] has counted so far, as of `now` (Redis' clock, in milliseconds).
struct Tally {
    now: u64,
    stats: StoreStats,
    /// The record key and creation time of the oldest running record seen.
    oldest: Option<(String, u64)>,
}

impl Tally {
    fn new(now: u64) -> Self {
        Self {
            now,
            stats: StoreStats::default(),
            oldest: None,
        }
    }

    fn add(&mut self, key: String, (state, expires_at, created_at): RecordFields) {
        // Gone since the scan, or not a record (the prefix's other keys); or expired, in the
        // millisecond before Redis deletes it itself: nothing for a sweep to do.
        if expires_at.is_none_or(|expires_at| expires_at <= self.now) {
            return;
        }
        match state.as_deref() {
            Some("done") => self.stats.done += 1,
            Some("running") => {
                self.stats.running += 1;
                if let Some(at) = created_at {
                    if self.oldest.as_ref().is_none_or(|(_, first)| at < *first) {
                        self.oldest = Some((key, at));
                    }
                }
            }
            _ => {}
        }
    }

    /// The counts, with the oldest running record whose key `key_of` reads back.
    fn finish(self, key_of: impl Fn(&str) -> Option<KeyHash>) -> StoreStats {
        let oldest = self.oldest.and_then(|(key, at)| Some((key_of(&key)?, at)));
        match oldest {
            Some((key, at)) => self
                .stats
                .with_oldest_running(key, Duration::from_millis(self.now.saturating_sub(at))),
            None => self.stats,
        }
    }
}

/// Keys read per `SCAN` step and per pipeline by [`RedisStore::stats`].
const STATS_BATCH: usize = 1000;

/// `text` matched literally by a `SCAN MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl RedisStore {
    /// The key hash of a record key (`{prefix}:{<key hex>}`), if it is one.
    fn key_of(&self, record_key: &str) -> Option<KeyHash> {
        KeyHash::from_hex(
            record_key
                .strip_prefix(&*self.prefix)?
                .strip_prefix(":{")?
                .strip_suffix('}')?,
        )
    }
}
