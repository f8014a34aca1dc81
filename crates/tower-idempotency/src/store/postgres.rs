//! The PostgreSQL store (feature `postgres`): the default for real applications.
//!
//! Records live in the table `idempotency_records`, in the same database as the data they
//! protect, which is what makes [transactional mode](crate::transaction) possible: the handler's
//! writes and the saved response commit together.
//!
//! ```no_run
//! use tower_idempotency::{store::postgres::{sqlx::PgPool, PostgresStore}, Idempotency};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPool::connect("postgres://postgres@localhost/app").await?;
//! let store = PostgresStore::new(pool.clone());
//! store.migrate().await?; // creates idempotency_records if needed
//! let layer = Idempotency::new(store); // or Idempotency::postgres(pool) if migrated elsewhere
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Atomicity
//!
//! Every write is one SQL statement. A claim is one `INSERT .. ON CONFLICT (key) DO UPDATE ..
//! WHERE <expired or lease lapsed> RETURNING ..`, joined in a CTE with a locking read of the
//! existing row, so the outcome that was not a claim (in flight, mismatch, done) comes back in the
//! same round trip; in the rare race with an insert its snapshot cannot see, it returns no row and
//! runs again, whole. A `complete` or `release` of a watched record is followed, on the same
//! connection, by a `pg_notify` that writes no record (see [Waiting](#waiting)). Time is the
//! database's: `now()`, never the application's clock.
//!
//! # Group commit
//!
//! Concurrent requests share statements and commits: claims wait in a bounded queue, and one
//! `INSERT .. SELECT .. FROM unnest(..) ON CONFLICT .. RETURNING` claims everything that queued
//! while the previous batches were in the database; saves, releases and renewals likewise share
//! one `UPDATE .. FROM unnest(..)` or `DELETE .. USING unnest(..)`, each row checked against its
//! own fencing token. There is no timer: a lone request finds an empty queue and runs at once.
//! [`Batching`] sets the largest batch, how many batches may be in the database at once and the
//! queue's bound (a full queue answers [`StoreErrorKind::Full`], 503);
//! [`PostgresStore::batch_stats`] tells how much was shared. The rules per entry are those of
//! one statement per request, and two entries for one key never share a statement (see
//! [`Batching`]'s module notes in the crate's design document). In single-commit mode the claim
//! runs inside the handler's transaction, which no other request can share, so it is not
//! batched; in transactional mode the claim is batched and the save stays in the handler's
//! transaction.
//!
//! # Migrations
//!
//! [`PostgresStore::migrate`] applies the embedded migrations and tracks them in its own table,
//! `_tower_idempotency_migrations`, never in your application's `_sqlx_migrations`. It takes
//! sqlx's advisory lock, so several instances may call it at start-up at once.
//!
//! If you run your own migrations instead, this is the schema the store expects
//! (`migrations/postgres/0001_idempotency_records.sql` and `0002_watched.sql`, included here verbatim):
//!
//! ```sql
#![doc = include_str!("../../migrations/postgres/0001_idempotency_records.sql")]
#![doc = include_str!("../../migrations/postgres/0002_watched.sql")]
//! ```
//!
//! # Waiting
//!
//! [`Store::wait_for_change`] uses `LISTEN`/`NOTIFY` on the channel `tower_idempotency`, and
//! only for records someone waits on. A waiter first listens, then marks the running record
//! `watched` (one statement that also tells it whether the record is still running; if not, it
//! returns at once). `complete` and `release` return the record's `watched` flag and send the
//! key's hex hash with `pg_notify` only when it is set, on the same connection (so a notification
//! inside a transaction goes out only when it commits). Without waiters nothing is notified:
//! PostgreSQL serialises the commits of every transaction that notified (a global lock), which
//! would otherwise cost every first-time key, wait mode on or off.
//!
//! Each store starts one listener in the background on the first wait, on a connection of its
//! own (same options as the pool, outside it). Until it listens, or should it fail (for example
//! behind PgBouncer in transaction mode, which cannot `LISTEN`), a wait lasts the timeout the
//! layer gives, so it is always bounded.
//!
//! # Expiry
//!
//! Expired rows stay until swept: run a [`Sweeper`](crate::Sweeper) (or call
//! [`Store::sweep`] from your own scheduler). An expired row is already treated as absent by
//! `claim`, so sweeping is about space, not correctness.

use std::{
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use sqlx::{
    migrate::Migrator,
    postgres::{PgConnection, PgListener, PgPool, PgPoolOptions, Postgres},
};
use tokio::{sync::watch, time::Instant};

pub use sqlx;

use super::batch::{BatchStats, Batcher, Batching, Counters};
use super::sql::{self, Waiters};
use super::{
    Claim, ClaimOutcome, Fenced, FencingToken, RecordInfo, Store, StoreError, StoreErrorKind,
    StoreStats, StoredResponse, TransactionalStore,
};
use crate::key::KeyHash;

mod batch;
use batch::{Change, Claims, Write, WriteKind, Writes};

/// The parameters and the claim row, as both SQL stores bind and read them.
type Codec = sql::Codec<Postgres>;

/// The `NOTIFY` channel `complete` and `release` announce a key's change on.
const CHANNEL: &str = "tower_idempotency";

/// How many times a claim is retried when it raced with an insert it could not see (see
/// [`CLAIM`]). Two attempts settle it in practice; more only guard against pathological churn.
const CLAIM_ATTEMPTS: usize = 8;

/// How long after a failed start the listener is tried again; waiting sleeps meanwhile.
const LISTENER_RETRY: Duration = Duration::from_secs(5);

/// The claim statement, with extra CTEs first (`$lock`), a condition on the writes (`$gate`)
/// and extra outcomes last (`$tail`): one text for both claims, checked by the compiler.
macro_rules! claim_sql {
    ($lock:literal, $gate:literal, $tail:literal) => {
        concat!(
            "\nWITH ",
            $lock,
            r#"
live AS (
    SELECT l.fingerprint, l.state, l.status, l.headers, l.body, l.lease_until
    FROM idempotency_records AS l
    WHERE l.key = $1
      AND l.expires_at > now()
      AND (l.fingerprint <> $2 OR l.state = 'done' OR l.lease_until > now())
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        $1, $2, $3, 'running', now(),
        now() + $4 * interval '1 millisecond',
        now() + $5 * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT FROM live)"#,
            $gate,
            r#"
    ON CONFLICT (key) DO UPDATE SET
        fingerprint = EXCLUDED.fingerprint,
        token       = EXCLUDED.token,
        state       = 'running',
        status      = NULL,
        headers     = NULL,
        body        = NULL,
        lease_until = EXCLUDED.lease_until,
        watched     = r.watched AND r.expires_at > now(),
        created_at  = CASE WHEN r.expires_at <= now() THEN EXCLUDED.created_at ELSE r.created_at END,
        expires_at  = CASE WHEN r.expires_at <= now() THEN EXCLUDED.expires_at ELSE r.expires_at END
    WHERE r.expires_at <= now()
       OR (r.state = 'running' AND r.lease_until <= now() AND r.fingerprint = EXCLUDED.fingerprint)
    RETURNING r.created_at <> now() AS taken_over
),
existing AS (
    SELECT e.fingerprint, e.state, e.status, e.headers, e.body, e.lease_until
    FROM idempotency_records AS e
    WHERE e.key = $1 AND NOT EXISTS (SELECT FROM live) AND NOT EXISTS (SELECT FROM claimed)"#,
            $gate,
            r#"
    FOR SHARE
),
found AS (
    SELECT * FROM live
    UNION ALL
    SELECT * FROM existing
)
SELECT 'claimed' AS outcome, taken_over, NULL::bigint AS lease_remaining_ms,
       NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body
FROM claimed
UNION ALL
SELECT CASE WHEN fingerprint <> $2 THEN 'mismatch'
            WHEN state = 'done' THEN 'done'
            ELSE 'in_flight' END,
       false,
       greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint,
       status, headers, body
FROM found"#,
            $tail,
            "\n"
        )
    };
}

/// Claim in one statement.
///
/// `live` reads the record as this statement's snapshot sees it, without a lock. A live record
/// that cannot be claimed (another fingerprint, `done`, or `running` with a valid lease) answers
/// at once: those states hold until the record expires (a lease can only lapse, which the next
/// claim handles), so no lock is needed to report them. Replays, duplicates in flight and
/// mismatches are read-only statements: no transaction id, no WAL flush, no row lock that
/// concurrent replays of one hot key would queue on.
///
/// Otherwise `claimed` inserts the record, or overwrites it when it has expired (a fresh claim,
/// any fingerprint) or when it is running with a lapsed lease and the same fingerprint (a
/// takeover: new token and lease, original `created_at` and `expires_at`). `created_at <> now()`
/// in its `RETURNING` tells a takeover from a fresh claim: a fresh claim writes `now()`, a
/// takeover keeps a `created_at` at least one lease older. The decision to run the handler is
/// made only here, under the primary key's conflict check, never by the unlocked read.
///
/// When that `WHERE` fails (another attempt changed the row after the snapshot), `ON CONFLICT`
/// has locked the latest version of the row, and `existing` reads it `FOR SHARE`: under READ
/// COMMITTED a locking read follows the row to its latest committed version. `existing` runs
/// only when `live` and `claimed` are empty (one-time filters), so it never touches a row this
/// statement wrote.
///
/// One case remains: a row inserted by a transaction that committed after the snapshot. `ON
/// CONFLICT` waits for it and sees it, but no read in this statement can: the statement returns
/// no row, and [`PostgresStore::claim`] runs it again with a fresh snapshot.
///
/// [`batch::CLAIM_MANY`] is this statement for many keys at once, which is how the store claims
/// outside single-commit mode.
#[allow(dead_code)]
const CLAIM: &str = claim_sql!("", "", "");

/// [`CLAIM`] inside the handler's transaction, for single-commit mode: the claim is gated by a
/// transaction-scoped advisory lock on `$6` (the key hash's first eight bytes), taken without
/// waiting. The lock is the "running" marker: it is held until the transaction commits or rolls
/// back, and the uncommitted row is invisible to others. When another transaction holds it, the
/// statement answers `in_flight` (unless a committed record answers first) and writes nothing,
/// so a duplicate never waits on the uncommitted row.
const CLAIM_LOCKED: &str = claim_sql!(
    "lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($6) AS held),",
    " AND (SELECT held FROM lock)",
    "
UNION ALL
SELECT 'in_flight', false, NULL, NULL, NULL, NULL
WHERE NOT (SELECT held FROM lock) AND NOT EXISTS (SELECT FROM live)"
);

/// Save the response on the running record held with the token (its expiry unchanged); one row
/// if the token matched, telling whether a waiter watches the record.
const COMPLETE: &str = r#"
UPDATE idempotency_records
SET state = 'done', status = $3, headers = $4, body = $5
WHERE key = $1 AND token = $2 AND state = 'running'
RETURNING watched
"#;

/// Delete the running record held with the token; one row if the token matched, telling
/// whether a waiter watches the record.
const RELEASE: &str = r#"
DELETE FROM idempotency_records
WHERE key = $1 AND token = $2 AND state = 'running'
RETURNING watched
"#;

/// Announce a change of a watched record to the waiters (of every instance). Inside a
/// transaction the notification goes out when it commits.
const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// Mark the running record of a key as watched, so its completion or release notifies; `true`
/// when the record is still running and watched (wait for the notification), `false` when it is
/// no longer running (it changed already: claim again).
///
/// The update skips a record already watched, so a crowd of waiters on one hot key reads instead
/// of queueing on the row lock. It locks a row it updates: a completion under way finishes
/// first, and the update then finds it done and returns `false`.
const WATCH: &str = r#"
WITH marked AS (
    UPDATE idempotency_records
    SET watched = true
    WHERE key = $1 AND state = 'running' AND NOT watched
    RETURNING 1
)
SELECT EXISTS (SELECT FROM marked)
    OR EXISTS (
        SELECT FROM idempotency_records
        WHERE key = $1 AND state = 'running' AND watched
    )
"#;

/// Delete up to `$1` expired records, skipping rows another statement holds.
const SWEEP: &str = r#"
DELETE FROM idempotency_records
WHERE key IN (
    SELECT key FROM idempotency_records
    WHERE expires_at <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
"#;

/// A [`Store`] on PostgreSQL, through an sqlx [`PgPool`].
///
/// Cloning is cheap and shares the pool and the notification listener.
///
/// ```no_run
/// use tower_idempotency::store::postgres::{sqlx::PgPool, PostgresStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::new(PgPool::connect("postgres://postgres@localhost/app").await?);
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    claims: Batcher<Claims>,
    completes: Batcher<Writes>,
    releases: Batcher<Writes>,
    renewals: Batcher<Writes>,
    batches: Arc<Counters>,
    waiters: Arc<Waiters>,
    listener: Mutex<ListenerState>,
    /// `true` while the listener task listens.
    listening: Arc<watch::Sender<bool>>,
}

impl PostgresStore {
    /// A store on `pool`, batching with [`Batching::default`]. Nothing is sent to the database
    /// until the first operation.
    pub fn new(pool: PgPool) -> Self {
        Self::with_batching(pool, Batching::default())
    }

    /// A store on `pool` whose concurrent claims, saves, releases and renewals share statements
    /// as `batching` says (see [Group commit](self#group-commit)).
    ///
    /// ```no_run
    /// use tower_idempotency::store::{postgres::{sqlx::PgPool, PostgresStore}, Batching};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = PgPool::connect("postgres://postgres@localhost/app").await?;
    /// let store = PostgresStore::with_batching(pool, Batching::default().max_batch(64));
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_batching(pool: PgPool, batching: Batching) -> Self {
        let batches = Arc::new(Counters::default());
        let batch_pool = batch_pool(&pool, batching);
        let writes = |kind| {
            let runner = Writes {
                pool: batch_pool.clone(),
                kind,
            };
            Batcher::new(runner, batching, batches.clone())
        };
        Self {
            inner: Arc::new(Inner {
                claims: Batcher::new(
                    Claims {
                        pool: batch_pool.clone(),
                    },
                    batching,
                    batches.clone(),
                ),
                completes: writes(WriteKind::Complete),
                releases: writes(WriteKind::Release),
                renewals: writes(WriteKind::Renew),
                batches,
                pool,
                waiters: Arc::default(),
                listener: Mutex::default(),
                listening: Arc::new(watch::channel(false).0),
            }),
        }
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// How much the store's batches have shared so far.
    pub fn batch_stats(&self) -> BatchStats {
        self.inner.batches.snapshot()
    }

    /// Create or upgrade the `idempotency_records` table.
    ///
    /// Applied versions are tracked in `_tower_idempotency_migrations`, so this never touches
    /// the application's `_sqlx_migrations`. Safe to call on every start, from several processes
    /// at once: sqlx serialises them with an advisory lock.
    ///
    /// ```no_run
    /// # async fn run(store: tower_idempotency::store::postgres::PostgresStore) {
    /// store.migrate().await.expect("idempotency migrations");
    /// # }
    /// ```
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrator()
            .run(&self.inner.pool)
            .await
            .map_err(|err| StoreError::new(StoreErrorKind::Migration, err))
    }

    /// Check, without changing anything, that the table this store writes exists with every
    /// column this version uses: for startup, when the schema is applied by your own migration
    /// tool (the SQL is in the repository's `migrations/postgres/`) instead of [`migrate`](Self::migrate).
    ///
    /// Fails with [`StoreErrorKind::Migration`] and a message naming the migrations to apply
    /// when the table is missing or older than this version.
    ///
    /// ```no_run
    /// # async fn run(store: tower_idempotency::store::postgres::PostgresStore) {
    /// store.check_schema().await.expect("idempotency schema current");
    /// # }
    /// ```
    pub async fn check_schema(&self) -> Result<(), StoreError> {
        sqlx::query(CHECK_SCHEMA)
            .execute(&self.inner.pool)
            .await
            .map(drop)
            .map_err(|err| {
                StoreError::new(
                    StoreErrorKind::Migration,
                    format!(
                        "the table idempotency_records is missing or not current ({err}); call PostgresStore::migrate() at startup, or apply migrations/postgres/ (0001_idempotency_records.sql and 0002_watched.sql) with your migration tool"
                    ),
                )
            })
    }
}

/// The connections the batches run on: the pool's own options, outside the pool, so batches
/// never wait behind the application's queries for a connection, with generic plans forced and
/// no ping before each batch.
///
/// The batch statements take arrays, and PostgreSQL would otherwise plan every execution anew for
/// the arrays' actual contents (a custom plan), which for the claim costs more than running it:
/// measured with pgbench, 16-key claims ran at 479 statements/s with custom plans and 1,661 with
/// the generic one. One generic plan fits every batch: each entry is one index probe.
/// At most two connections per pipeline slot of each kind of operation are opened, on demand.
fn batch_pool(pool: &PgPool, batching: Batching) -> PgPool {
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .options([("plan_cache_mode", "force_generic_plan")]);
    let connections = u32::try_from(batching.pipeline_depth() * 4).unwrap_or(u32::MAX);
    PgPoolOptions::new()
        .max_connections(connections)
        .min_connections(0)
        // A ping on every checkout is a round trip per batch; a dead connection fails the
        // batch's statement instead, which answers 503 like any outage.
        .test_before_acquire(false)
        .connect_lazy_with(options)
}

/// Reads every column this version uses, and no row: fails when the table or a column is missing.
const CHECK_SCHEMA: &str =
    "SELECT key, fingerprint, token, state, status, headers, body, created_at, lease_until, expires_at, watched FROM idempotency_records WHERE false";

fn migrator() -> Migrator {
    sql::migrator(&[
        (
            1,
            "idempotency records",
            include_str!("../../migrations/postgres/0001_idempotency_records.sql"),
        ),
        (
            2,
            "watched records",
            include_str!("../../migrations/postgres/0002_watched.sql"),
        ),
    ])
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.inner.pool)
            .finish_non_exhaustive()
    }
}

impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        self.inner.claims.submit(claim.clone()).await
    }

    async fn renew(
        &self,
        key: &KeyHash,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Fenced, StoreError> {
        let lease_ms = sql::millis(lease);
        self.inner
            .renewals
            .submit(Write {
                key: *key,
                token,
                change: Change::Renew { lease_ms },
            })
            .await
    }

    async fn complete(
        &self,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<Fenced, StoreError> {
        let change = Change::Complete {
            status: i32::from(response.status.as_u16()),
            headers: response.encode_headers(),
            body: response.body.clone(),
        };
        self.inner
            .completes
            .submit(Write {
                key: *key,
                token,
                change,
            })
            .await
    }

    async fn release(&self, key: &KeyHash, token: FencingToken) -> Result<Fenced, StoreError> {
        self.inner
            .releases
            .submit(Write {
                key: *key,
                token,
                change: Change::Release,
            })
            .await
    }

    async fn sweep(&self, batch: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(SWEEP)
            .bind(i64::from(batch))
            .execute(&self.inner.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn wait_for_change(&self, key: &KeyHash, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        // Lazy, like any future: the listener starts only once the waiter is registered, so no
        // notification slips between.
        let watch = self.inner.watch(key, deadline);
        sql::wait_for_change(&self.inner.waiters, key, deadline, watch).await;
    }

    async fn get(&self, key: &KeyHash) -> Result<Option<RecordInfo>, StoreError> {
        let row = sqlx::query(GET)
            .bind(key.as_bytes().as_slice())
            .fetch_optional(&self.inner.pool)
            .await?;
        row.as_ref().map(record_info).transpose()
    }

    async fn forget(&self, key: &KeyHash) -> Result<bool, StoreError> {
        let deleted = sqlx::query(FORGET)
            .bind(key.as_bytes().as_slice())
            .execute(&self.inner.pool)
            .await?;
        Ok(deleted.rows_affected() > 0)
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let row = sqlx::query_as(STATS).fetch_one(&self.inner.pool).await?;
        sql::stats_of(row)
    }
}

impl TransactionalStore for PostgresStore {
    type Database = Postgres;

    fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    async fn complete_in(
        &self,
        tx: &mut sqlx::Transaction<'static, Postgres>,
        key: &KeyHash,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<Fenced, StoreError> {
        complete_on(tx, key, token, response).await
    }
}

/// [`COMPLETE`] on a pooled connection or inside a transaction, then the notification if a
/// waiter watches the record. The statement returns one row per record it completed, so its
/// row count is the fencing result.
async fn complete_on(
    conn: &mut PgConnection,
    key: &KeyHash,
    token: FencingToken,
    response: &StoredResponse,
) -> Result<Fenced, StoreError> {
    let watched: Option<bool> =
        sqlx::query_scalar_with(COMPLETE, Codec::complete(key, token, response)?)
            .fetch_optional(&mut *conn)
            .await?;
    notify_if_watched(conn, key, watched).await
}

/// The fencing result of a `complete` or `release` that returned `watched` (`None`: the token
/// did not match), after notifying the waiters of a watched record.
async fn notify_if_watched(
    conn: &mut PgConnection,
    key: &KeyHash,
    watched: Option<bool>,
) -> Result<Fenced, StoreError> {
    match watched {
        None => Ok(Fenced::Lost),
        Some(false) => Ok(Fenced::Applied),
        Some(true) => {
            sqlx::query(NOTIFY)
                .bind(CHANNEL)
                .bind(key.to_hex())
                .execute(conn)
                .await?;
            Ok(Fenced::Applied)
        }
    }
}

impl PostgresStore {
    /// [`CLAIM_LOCKED`] in the transaction on `conn` (single-commit mode).
    pub(crate) async fn claim_in(
        &self,
        conn: &mut PgConnection,
        claim: &Claim,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut lock_key = [0u8; 8];
        lock_key.copy_from_slice(&claim.key.as_bytes()[..8]);
        for _ in 0..CLAIM_ATTEMPTS {
            let row = sqlx::query_with(CLAIM_LOCKED, Codec::claim(claim)?)
                .bind(i64::from_be_bytes(lock_key))
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(row) = row {
                return Codec::claim_outcome(&row);
            }
        }
        Err(raced())
    }
}

fn raced() -> StoreError {
    StoreError::new(
        StoreErrorKind::Backend,
        "the claim kept racing with concurrent inserts",
    )
}

// ---------------------------------------------------------------------------------------------
// Notifications
// ---------------------------------------------------------------------------------------------

/// The notification listener of one store: a task that connects, `LISTEN`s and then wakes the
/// waiters of each key it hears about.
#[derive(Default)]
struct ListenerState {
    task: Option<tokio::task::JoinHandle<()>>,
    started_at: Option<Instant>,
}

impl Inner {
    /// Make sure the listener task runs, starting it in the background if needed; whether it
    /// listens.
    ///
    /// The caller never waits for the connection beyond its own deadline: a wait that begins
    /// before the listener is listening is bounded by its timeout like any other. A task that
    /// stopped (connection refused, pool closed) is restarted at most once per
    /// [`LISTENER_RETRY`]; meanwhile waits simply last their timeout.
    fn ensure_listener(&self) -> watch::Receiver<bool> {
        let mut state = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        let running = state.task.as_ref().is_some_and(|task| {
            !task.is_finished()
                || state
                    .started_at
                    .is_some_and(|at| at.elapsed() < LISTENER_RETRY)
        });
        if !running {
            state.task = Some(tokio::spawn(listen(
                self.pool.clone(),
                self.waiters.clone(),
                self.listening.clone(),
            )));
            state.started_at = Some(Instant::now());
        }
        self.listening.subscribe()
    }

    /// What a wait on `key` does before it waits for the notification (see
    /// [`sql::wait_for_change`]): the listener listening, then the record marked watched.
    /// Whether to wait on: `false` once the record is no longer running or the deadline passed.
    async fn watch(&self, key: &KeyHash, deadline: Instant) -> bool {
        let mut listening = self.ensure_listener();
        // Mark the record only once the listener listens: a completion committed after the mark
        // then reaches this process. Until then (or if it cannot listen) the wait is the timeout.
        if !matches!(
            tokio::time::timeout_at(deadline, listening.wait_for(|on| *on)).await,
            Ok(Ok(_))
        ) {
            tokio::time::sleep_until(deadline).await;
            return false;
        }
        let watch = sqlx::query_scalar::<_, bool>(WATCH)
            .bind(key.as_bytes().as_slice())
            .fetch_one(&self.pool);
        match tokio::time::timeout_at(deadline, watch).await {
            // No longer running: it changed between the claim and the mark.
            Ok(Ok(false)) | Err(_) => false,
            Ok(Ok(true)) => true,
            Ok(Err(err)) => {
                tracing::debug!(
                    target: "tower_idempotency",
                    error = %err,
                    "marking a record watched failed; waiting for the timeout"
                );
                true
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let state = self
            .listener
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = &state.task {
            task.abort();
        }
    }
}

/// Connect and listen, then receive notifications until the listener fails; `listening` is
/// `true` meanwhile.
async fn listen(pool: PgPool, waiters: Arc<Waiters>, listening: Arc<watch::Sender<bool>>) {
    // A connection of its own, outside the application's pool: a listener holds its connection
    // for good, which would starve a small pool.
    let started = async {
        let own = PgPoolOptions::new()
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(pool.connect_options().as_ref().clone())
            .await?;
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen(CHANNEL).await?;
        Ok::<_, sqlx::Error>(listener)
    };
    let mut listener = match started.await {
        Ok(listener) => listener,
        Err(err) => {
            tracing::warn!(
                target: "tower_idempotency",
                error = %err,
                "cannot listen for idempotency notifications; waiting falls back to polling"
            );
            return;
        }
    };
    listening.send_replace(true);
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                if let Some(key) = parse_key_hex(notification.payload()) {
                    waiters.wake(&key);
                }
            }
            // The connection was lost and re-established: notifications may have been missed.
            Ok(None) => waiters.wake_all(),
            Err(err) => {
                tracing::warn!(
                    target: "tower_idempotency",
                    error = %err,
                    "the idempotency notification listener stopped; a later wait restarts it"
                );
                listening.send_replace(false);
                waiters.wake_all();
                return;
            }
        }
    }
}

/// A key hash from the hex text of a notification; `None` for anything else on the channel.
fn parse_key_hex(hex: &str) -> Option<KeyHash> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (byte, pair) in key.iter_mut().zip(hex.chunks_exact(2)) {
        let digit = |c: u8| (c as char).to_digit(16);
        *byte = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
    }
    Some(KeyHash(key))
}

/// Operators' read of one live record ([`Store::get`]), its times left by the database's clock.
const GET: &str = r#"
SELECT state, status, headers, body,
    GREATEST(0, EXTRACT(EPOCH FROM (lease_until - now())) * 1000)::bigint AS lease_ms,
    GREATEST(0, EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::bigint AS expires_ms
FROM idempotency_records
WHERE key = $1 AND expires_at > now()
"#;

/// Operators' delete of one record, whatever its state ([`Store::forget`]).
const FORGET: &str = "DELETE FROM idempotency_records WHERE key = $1";

/// Operators' counts by state and the oldest running record ([`Store::stats`]): one scan.
const STATS: &str = r#"
SELECT counts.running, counts.done, counts.expired, oldest.key,
    (EXTRACT(EPOCH FROM (now() - oldest.created_at)) * 1000)::bigint
FROM (
    SELECT count(*) FILTER (WHERE state = 'running' AND expires_at > now()) AS running,
        count(*) FILTER (WHERE state = 'done' AND expires_at > now()) AS done,
        count(*) FILTER (WHERE expires_at <= now()) AS expired
    FROM idempotency_records
) AS counts
LEFT JOIN (
    SELECT key, created_at FROM idempotency_records
    WHERE state = 'running' AND expires_at > now()
    ORDER BY created_at, key
    LIMIT 1
) AS oldest ON true
"#;

/// A row of [`GET`] as the record it describes.
fn record_info(row: &sqlx::postgres::PgRow) -> Result<RecordInfo, StoreError> {
    use sqlx::Row;
    let millis = |column: &str| -> Result<Duration, StoreError> {
        Ok(Duration::from_millis(
            row.try_get::<i64, _>(column)?.max(0) as u64
        ))
    };
    let expires_in = millis("expires_ms")?;
    match row.try_get::<&str, _>("state")? {
        "running" => Ok(RecordInfo::running(millis("lease_ms")?, expires_in)),
        "done" => {
            let status: i32 = row.try_get("status")?;
            let status = u16::try_from(status)
                .map_err(|_| StoreError::corrupt("a saved status is out of range"))?;
            let headers: Vec<u8> = row.try_get("headers")?;
            let body: Vec<u8> = row.try_get("body")?;
            let response = StoredResponse::from_parts(status, &headers, body.into())?;
            Ok(RecordInfo::done(response, expires_in))
        }
        _ => Err(StoreError::corrupt("a record has an unknown state")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_payloads_parse_as_key_hashes() {
        let key = KeyHash([0xab; 32]);
        assert_eq!(parse_key_hex(&key.to_hex()), Some(key));
        assert_eq!(parse_key_hex(&"AB".repeat(32)), Some(key));
        assert_eq!(parse_key_hex("abc"), None);
        assert_eq!(parse_key_hex(&"zz".repeat(32)), None);
        assert_eq!(parse_key_hex(&"é".repeat(32)), None);
    }
}
