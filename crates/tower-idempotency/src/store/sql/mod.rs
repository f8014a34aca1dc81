//! What the SQL stores (PostgreSQL, SQLite, MySQL) share: the migrator, the parameters their statements
//! bind and the claim row they read ([`Codec`]), the statements they run alike (the operators'
//! reads, the sweep), the in-process side of waiting ([`wait_for_change`], `announce`), the
//! public methods every SQL store has (`sql_store!`), and the conversions between the layer's
//! types and the SQL columns.
//! The SQL itself stays in each store's `queries.rs`, where the databases differ, written for
//! `idempotency_records`; [`TableName::statement`] writes it for the store's table once, when
//! the store is built.

use std::{future::Future, marker::PhantomData, sync::Arc, time::Duration};

use bytes::Bytes;
use sqlx::{
    error::BoxDynError,
    migrate::{Migration, MigrationType, Migrator},
    Arguments, AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool,
    Row, SqlSafeStr, Type,
};
use tokio::time::Instant;
use uuid::Uuid;

use crate::{
    key::KeyHash,
    store::{
        error::{StoreError, StoreErrorKind},
        record::{time, ClaimOutcome, Hold, RecordInfo, StoreStats, StoredResponse, LONGEST},
    },
};

pub(super) use table::TableName;

/// A store's statements, each written for the store's table once, when the store is built
/// ([`TableName::statement`]): `statements! { struct Queries { field: TEMPLATE, .. } }`.
///
/// Besides the fields named, every SQL store has the statements `sql_store!` and the sweeper run:
/// `sweep`, `check_schema`, `get`, `forget` and `stats`, from the backend's `SWEEP`,
/// `CHECK_SCHEMA`, `GET`, `FORGET` and `STATS`.
macro_rules! statements {
    ($(#[$doc:meta])* struct $name:ident { $($field:ident: $template:path),* $(,)? }) => {
        $(#[$doc])*
        pub(super) struct $name {
            $(pub(super) $field: sqlx::SqlStr,)*
            pub(super) sweep: sqlx::SqlStr,
            pub(super) check_schema: sqlx::SqlStr,
            pub(super) get: sqlx::SqlStr,
            pub(super) forget: sqlx::SqlStr,
            pub(super) stats: sqlx::SqlStr,
        }

        impl $name {
            pub(super) fn new(table: &crate::store::sql::TableName) -> Self {
                Self {
                    $($field: table.statement($template),)*
                    sweep: table.statement(SWEEP),
                    check_schema: table.statement(CHECK_SCHEMA),
                    get: table.statement(GET),
                    forget: table.statement(FORGET),
                    stats: table.statement(STATS),
                }
            }
        }
    };
}

/// What every SQL store offers alike, written once: `with_batching`, `batch_stats`,
/// `with_table`, `table`, `pool`, `migrate`, `check_schema`, `Debug`, and the `MIGRATIONS` the
/// store embeds, from the repository's `migrations/<module>/`; `reads`, inside `impl Store`, the
/// operators' `get`, `forget` and `stats` as plain statements. The store keeps `pool`, `table`,
/// `queries`, `batching` and `batches` in `inner`, has a public `run_migrator` (how a
/// [`Migrator`] runs safely on that database from several processes at once), and has
/// `fn build(pool, batching, table)`, which `with_table` calls with the pool and batching it keeps.
macro_rules! sql_store {
    (
        $store:ident in $module:ident on $pool:ident ($url:literal),
        migrations: [$($version:literal => $file:literal),+ $(,)?],
        migrate: $safe:literal,
        batching: $shares:literal $(,)?
    ) => {
        /// The embedded migrations, written for `idempotency_records`.
        const MIGRATIONS: $crate::store::sql::Migrations = $crate::store::sql::Migrations {
            store: stringify!($store),
            folder: stringify!($module),
            files: &[$((
                $version,
                $file,
                include_str!(concat!("../../../../migrations/", stringify!($module), "/", $file)),
            )),+],
        };

        impl $store {
            #[doc = concat!("A store on `pool` whose ", $shares, " as `batching` says (see")]
            /// [Group commit](self#group-commit)).
            ///
            /// ```no_run
            #[doc = concat!("use tower_idempotency::store::{", stringify!($module), "::{sqlx::", stringify!($pool), ", ", stringify!($store), "}, Batching};")]
            ///
            /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
            #[doc = concat!("let pool = ", stringify!($pool), "::connect(\"", $url, "\").await?;")]
            #[doc = concat!("let store = ", stringify!($store), "::with_batching(pool, Batching::default().max_batch(32));")]
            /// # let _ = store;
            /// # Ok(())
            /// # }
            /// ```
            pub fn with_batching(pool: $pool, batching: $crate::store::sql::batch::Batching) -> Self {
                Self::build(pool, batching, TableName::default())
            }

            /// How much the store's batches have shared so far.
            pub fn batch_stats(&self) -> $crate::store::sql::batch::BatchStats {
                self.inner.batches.snapshot()
            }

            /// The same store on `table` instead of `idempotency_records`: its statements,
            /// migrations and [`check_schema`](Self::check_schema) name it (see [`TableName`] for
            /// what that means for `migrate` and your own migration tool). Nothing is sent to the
            /// database.
            ///
            /// ```no_run
            #[doc = concat!("use tower_idempotency::store::{", stringify!($module), "::{sqlx::", stringify!($pool), ", ", stringify!($store), "}, TableName};")]
            ///
            /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
            #[doc = concat!("let pool = ", stringify!($pool), "::connect(\"", $url, "\").await?;")]
            #[doc = concat!("let store = ", stringify!($store), "::new(pool).with_table(TableName::new(\"idempotency_keys\")?);")]
            /// store.migrate().await?;
            /// # Ok(())
            /// # }
            /// ```
            pub fn with_table(self, table: TableName) -> Self {
                Self::build(self.inner.pool.clone(), self.inner.batching, table)
            }

            /// The table the store keeps its records in.
            pub fn table(&self) -> &TableName {
                &self.inner.table
            }

            /// The pool the store runs on.
            pub fn pool(&self) -> &$pool {
                &self.inner.pool
            }

            /// Create or upgrade the store's table (`idempotency_records` unless
            /// [`with_table`](Self::with_table) names another).
            ///
            /// Applied versions are tracked in `_tower_idempotency_migrations` (another table's in
            /// `{table}_migrations`), so this never touches the application's
            #[doc = concat!("`_sqlx_migrations`. Safe to call on every start, from several processes at once: ", $safe, ".")]
            ///
            /// ```no_run
            #[doc = concat!("# async fn run(store: tower_idempotency::store::", stringify!($module), "::", stringify!($store), ") {")]
            /// store.migrate().await.expect("idempotency migrations");
            /// # }
            /// ```
            pub async fn migrate(&self) -> Result<(), StoreError> {
                run_migrator(&self.inner.pool, sql::migrator(&MIGRATIONS, &self.inner.table)).await
            }

            /// Check, without changing anything, that the table this store writes exists with
            /// every column this version uses: for startup, when the schema is applied by your
            #[doc = concat!("own migration tool (the SQL is in the repository's `migrations/", stringify!($module), "/`)")]
            /// instead of [`migrate`](Self::migrate).
            ///
            /// Fails with [`StoreErrorKind::Migration`](crate::store::StoreErrorKind::Migration)
            /// and a message naming the migrations to apply when the table is missing or older
            /// than this version.
            ///
            /// ```no_run
            #[doc = concat!("# async fn run(store: tower_idempotency::store::", stringify!($module), "::", stringify!($store), ") {")]
            /// store.check_schema().await.expect("idempotency schema current");
            /// # }
            /// ```
            pub async fn check_schema(&self) -> Result<(), StoreError> {
                let check = self.inner.queries.check_schema.clone();
                sql::check_schema(&self.inner.pool, check, &self.inner.table, &MIGRATIONS).await
            }
        }

        impl std::fmt::Debug for $store {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("pool", &self.inner.pool)
                    .finish_non_exhaustive()
            }
        }
    };
    (reads) => {
        async fn get(&self, key: &KeyHash) -> Result<Option<RecordInfo>, StoreError> {
            let get = self.inner.queries.get.clone();
            Codec::get(self.inner.pool.clone(), get, *key).await
        }

        async fn forget(&self, key: &KeyHash) -> Result<bool, StoreError> {
            let forget = self.inner.queries.forget.clone();
            Codec::forget(self.inner.pool.clone(), forget, *key).await
        }

        async fn stats(&self) -> Result<StoreStats, StoreError> {
            let stats = self.inner.queries.stats.clone();
            let row = sqlx::query_as(stats).fetch_one(&self.inner.pool).await?;
            sql::stats_of(row)
        }
    };
}

/// The head of a claim's upsert in PostgreSQL and SQLite: `ON CONFLICT (key) DO UPDATE SET` and
/// what a take-over resets (the new attempt's fingerprint, token and lease; no answer). Each
/// backend appends the dates and the `WHERE` that decides which records may be taken, in its own
/// clock's terms.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! take_over_set {
    () => {
        r#"ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    token       = excluded.token,
    state       = 'running',
    status      = NULL,
    headers     = NULL,
    body        = NULL,
    lease_until = excluded.lease_until,
"#
    };
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(super) mod batch;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) mod connections;
mod error;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
mod prelude;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub(super) mod table;

/// The per-key wake-ups of the SQL stores.
pub(super) type Waiters = crate::store::waiters::Waiters<KeyHash>;

/// The deadline of a wait of `timeout` from now, `timeout` taken as at most [`LONGEST`] (a
/// caller's "for ever" is not an overflow).
pub(super) fn deadline_after(timeout: Duration) -> Instant {
    Instant::now() + timeout.min(LONGEST)
}

/// Wait until this process wakes the waiters on `key`, or until `deadline`.
///
/// `watch` is what the store does to be told of a change (PostgreSQL: listen and mark the
/// record watched); it runs only once the waiter is registered, so a wake-up that comes while it
/// runs is not lost. It returns whether to wait on: `false` ends the wait at once (the record
/// changed already, or the deadline passed).
pub(super) async fn wait_for_change(
    waiters: &Arc<Waiters>,
    key: &KeyHash,
    deadline: Instant,
    watch: impl Future<Output = bool>,
) {
    let waiter = waiters.register(*key);
    let notified = waiter.notify.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if watch.await {
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

/// Wake this process's waiters on `key` if the write was applied: a database that cannot notify
/// other connections (SQLite, MySQL) announces a change this way only.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) fn announce(
    waiters: &Waiters,
    key: &KeyHash,
    fenced: crate::store::Fenced,
) -> crate::store::Fenced {
    if fenced.applied() {
        waiters.wake(key);
    }
    fenced
}

/// What a batch answered an entry of a queue that takes claims and token-checked writes
/// together (PostgreSQL's claims and saves, SQLite's writes). A runner answers each entry in its
/// own kind; one answered in the other kind is a bug in the runner, reported as a corrupt store
/// rather than a panic in the request's task.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) trait ClaimOrWrite: Sized {
    /// A claim's outcome, or a write's fencing result as the error.
    fn into_result(self) -> Result<ClaimOutcome, crate::store::Fenced>;

    /// The answer to a claim.
    fn claimed(self) -> Result<ClaimOutcome, StoreError> {
        self.into_result()
            .map_err(|_| StoreError::corrupt("a claim was answered as a write"))
    }

    /// The answer to a token-checked write.
    fn fenced(self) -> Result<crate::store::Fenced, StoreError> {
        match self.into_result() {
            Err(fenced) => Ok(fenced),
            Ok(_) => Err(StoreError::corrupt("a write was answered as a claim")),
        }
    }
}

/// The table the stores' migrations are tracked in, apart from the application's own.
const MIGRATIONS_TABLE: &str = "_tower_idempotency_migrations";

/// A store's embedded migrations, and what `check_schema` tells to run or apply.
pub(super) struct Migrations {
    /// The store whose `migrate()` applies them.
    pub(super) store: &'static str,
    /// The folder of the repository's `migrations/` they are in (`postgres`, `sqlite`, `mysql`).
    pub(super) folder: &'static str,
    /// `(version, file, SQL)` in order, the SQL written for the default table.
    pub(super) files: &'static [(i64, &'static str, &'static str)],
}

/// A migrator over `migrations`, written for `table` and tracked in its own table
/// ([`MIGRATIONS_TABLE`] for the default one).
pub(super) fn migrator(migrations: &Migrations, table: &TableName) -> Migrator {
    let sqlite = migrations.folder == "sqlite";
    let files = migrations
        .files
        .iter()
        .map(|&(version, file, sql)| {
            let description = file.trim_end_matches(".sql").replace('_', " ");
            let sql = AssertSqlSafe(table.migration(sql, sqlite)).into_sql_str();
            Migration::new(
                version,
                description.into(),
                MigrationType::Simple,
                sql,
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(files);
    migrator.dangerous_set_table_name(table.migrations_table());
    migrator
}

/// Run `migrator` on `pool`, up to `attempts` times while a run fails because another process
/// applied the same migration meanwhile (SQLite, which has no migration lock; PostgreSQL takes
/// sqlx's and passes 1; MySQL takes a lock of its own, in `mysql::run_migrator`).
///
/// `session_lock`: `true` for PostgreSQL, whose sqlx lock is an advisory lock of the
/// connection's session. A run that fails or is dropped part way (a start-up timeout)
/// does not let it go: back in the pool, that connection would hold it, and every later run,
/// from any process, would wait on it. So the run's connection is closed afterwards whatever
/// happened, and the lock ends with its session.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) async fn migrate<DB>(
    pool: &Pool<DB>,
    migrator: &Migrator,
    attempts: usize,
    session_lock: bool,
) -> Result<(), StoreError>
where
    DB: Database,
    DB::Connection: sqlx::migrate::Migrate,
{
    let mut attempt = 1;
    loop {
        let mut conn = pool.acquire().await?;
        if session_lock {
            conn.close_on_drop();
        }
        match migrator.run_direct(None, &mut *conn, false).await {
            Ok(()) => return Ok(()),
            Err(
                sqlx::migrate::MigrateError::Execute(_)
                | sqlx::migrate::MigrateError::ExecuteMigration(..),
            ) if attempt < attempts => {
                attempt += 1;
            }
            Err(err) => return Err(StoreError::new(StoreErrorKind::Migration, err)),
        }
    }
}

/// How many rows a statement wrote, whichever the database.
pub(super) trait RowsAffected {
    fn rows(&self) -> u64;
}

macro_rules! rows_affected {
    ($($feature:literal => $result:ty),*) => {$(
        #[cfg(feature = $feature)]
        impl RowsAffected for $result {
            fn rows(&self) -> u64 {
                self.rows_affected()
            }
        }
    )*};
}

rows_affected!(
    "postgres" => sqlx::postgres::PgQueryResult,
    "sqlite" => sqlx::sqlite::SqliteQueryResult,
    "mysql" => sqlx::mysql::MySqlQueryResult
);

/// How long the release of an abandoned claim may take: as long as a lease lasts by default
/// (30 s), by when the key has usually freed itself.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
const ABANDONED_RELEASE_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Release, in a task of its own, a claim that won for a request that is gone (see
/// [`batch`]'s Dropped requests): `release` is the store's token-checked delete. A failure is only
/// logged: the claim's lease frees the key. So does a release still unfinished after
/// [`ABANDONED_RELEASE_WITHIN`], which is given up rather than left to wait on a dead network.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) fn release_abandoned(
    release: impl Future<Output = Result<(), StoreError>> + Send + 'static,
) {
    tokio::spawn(async move {
        let released = tokio::time::timeout(ABANDONED_RELEASE_WITHIN, release)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the release took too long",
                ))
            });
        if let Err(err) = released {
            tracing::debug!(
                target: "tower_idempotency",
                error = %err,
                "releasing the claim of a dropped request failed; its lease frees the key"
            );
        }
    });
}

/// Run `check` (a statement that reads every column the store uses and no row); a failure is a
/// [`StoreErrorKind::Migration`] naming the table and what to run or apply.
pub(super) async fn check_schema<DB>(
    pool: &Pool<DB>,
    check: impl SqlSafeStr,
    table: &TableName,
    migrations: &Migrations,
) -> Result<(), StoreError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
{
    sqlx::query::<DB>(check)
        .execute(pool)
        .await
        .map(drop)
        .map_err(|err| {
            let Migrations { store, folder, files } = migrations;
            let files = files.iter().map(|(_, file, _)| *file).collect::<Vec<_>>().join(" and ");
            let by_hand = if table.as_str() == TableName::default().as_str() {
                String::new()
            } else {
                format!(", with the name `{table}` written in as `TableName`'s docs say")
            };
            StoreError::new(
                StoreErrorKind::Migration,
                format!(
                    "the table {table} is missing or not current ({err}); call {store}::migrate() at startup, or apply migrations/{folder}/ ({files}{by_hand}) with your migration tool"
                ),
            )
        })
}

/// The parameters both stores bind and the claim row both read, written once so that the two
/// files' SQL numbers its parameters and names its columns alike (`DB` is `Postgres` or
/// `Sqlite`; each store names its own as `Codec`).
pub(super) struct Codec<DB>(PhantomData<DB>);

impl<DB> Codec<DB>
where
    DB: Database,
    // What both drivers bind and read, as the columns of `idempotency_records` hold them.
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    for<'a> &'a str: Decode<'a, DB> + Type<DB> + ColumnIndex<DB::Row>,
    Uuid: for<'a> Encode<'a, DB> + Type<DB>,
    i64: for<'a> Encode<'a, DB> + for<'a> Decode<'a, DB> + Type<DB>,
    i32: for<'a> Encode<'a, DB> + for<'a> Decode<'a, DB> + Type<DB>,
    bool: for<'a> Decode<'a, DB> + Type<DB>,
    Vec<u8>: for<'a> Decode<'a, DB> + Type<DB>,
    // What the statements run on the pool need.
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    DB::QueryResult: RowsAffected,
{
    /// The parameters of a claim: 1 key, 2 fingerprint, 3 token, 4 lease and 5 retention in
    /// milliseconds. (SQLite binds its batch's claims as JSON arrays.)
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(super) fn claim(claim: &crate::store::Claim) -> Result<DB::Arguments, StoreError> {
        Self::encoded(|args| {
            args.add(claim.key.as_bytes().as_slice())?;
            args.add(claim.fingerprint.as_bytes().as_slice())?;
            args.add(claim.token.as_uuid())?;
            args.add(millis(claim.lease))?;
            args.add(millis(claim.ttl))
        })
    }

    /// The parameters of a write on the record `hold` holds (`release`): 1 key, 2 token.
    pub(super) fn held(hold: &Hold) -> Result<DB::Arguments, StoreError> {
        Self::encoded(|args| Self::add_hold(args, hold))
    }

    /// Adds `hold`'s key and token, in that order.
    fn add_hold(args: &mut DB::Arguments, hold: &Hold) -> Result<(), BoxDynError> {
        args.add(hold.key.as_bytes().as_slice())?;
        args.add(hold.token.as_uuid())
    }

    /// The parameters of `complete`: 1 key, 2 token, 3 status, 4 headers, 5 body.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(super) fn complete(
        hold: &Hold,
        response: &StoredResponse,
    ) -> Result<DB::Arguments, StoreError> {
        Self::encoded(|args| {
            Self::add_hold(args, hold)?;
            args.add(i32::from(response.status.as_u16()))?;
            args.add(response.encode_headers().as_slice())?;
            args.add(response.body.as_ref())
        })
    }

    /// The parameters of `renew` in the order of an `UPDATE .. SET .. WHERE` whose parameters
    /// are numbered by position (MySQL's `?`): 1 lease in milliseconds, 2 key, 3 token.
    #[cfg(feature = "mysql")]
    pub(super) fn renew_set_first(
        hold: &Hold,
        lease: Duration,
    ) -> Result<DB::Arguments, StoreError> {
        Self::encoded(|args| {
            args.add(millis(lease))?;
            Self::add_hold(args, hold)
        })
    }

    /// The parameters of `complete` in the order of an `UPDATE .. SET .. WHERE` whose
    /// parameters are numbered by position (MySQL's `?`): 1 status, 2 headers, 3 body, 4 key,
    /// 5 token.
    #[cfg(feature = "mysql")]
    pub(super) fn complete_set_first(
        hold: &Hold,
        response: &StoredResponse,
    ) -> Result<DB::Arguments, StoreError> {
        Self::encoded(|args| {
            args.add(i32::from(response.status.as_u16()))?;
            args.add(response.encode_headers().as_slice())?;
            args.add(response.body.as_ref())?;
            Self::add_hold(args, hold)
        })
    }

    /// The outcome in a row of a claim statement, whose columns are `outcome` (`claimed`,
    /// `in_flight`, `mismatch` or `done`), `taken_over`, `lease_remaining_ms`, `status`,
    /// `headers` and `body`. A column is read only for the outcome that needs it, so a
    /// mismatch never copies the saved body it comes with.
    pub(super) fn claim_outcome(row: &DB::Row) -> Result<ClaimOutcome, StoreError> {
        let outcome: &str = row.try_get("outcome")?;
        match outcome {
            "claimed" => Ok(ClaimOutcome::Claimed {
                taken_over: row.try_get("taken_over")?,
            }),
            "in_flight" => Ok(ClaimOutcome::InFlight {
                lease_remaining: remaining(row.try_get("lease_remaining_ms")?),
            }),
            "mismatch" => Ok(ClaimOutcome::Mismatch),
            "done" => Ok(ClaimOutcome::Done(saved_response(
                row.try_get("status")?,
                row.try_get("headers")?,
                row.try_get("body")?,
            )?)),
            _ => Err(StoreError::corrupt("the claim returned an unknown outcome")),
        }
    }

    /// The parameters of an operator's read or delete of one record: 1 key.
    fn key(key: &KeyHash) -> Result<DB::Arguments, StoreError> {
        Self::encoded(|args| args.add(key.as_bytes().as_slice()))
    }

    /// Operators: the record of `key` as `get` reads it, whose columns are `state`, `status`,
    /// `headers`, `body`, `lease_ms` and `expires_ms` (the times left by the database's clock).
    /// Owned arguments, so the future can run in a task of its own (MySQL's `detached`).
    pub(super) async fn get(
        pool: Pool<DB>,
        get: impl SqlSafeStr,
        key: KeyHash,
    ) -> Result<Option<RecordInfo>, StoreError> {
        let row = sqlx::query_with(get, Self::key(&key)?)
            .fetch_optional(&pool)
            .await?;
        row.as_ref().map(Self::record_info).transpose()
    }

    /// Operators: delete the record of `key` with `forget`; `true` when there was one.
    pub(super) async fn forget(
        pool: Pool<DB>,
        forget: impl SqlSafeStr,
        key: KeyHash,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query_with(forget, Self::key(&key)?)
            .execute(&pool)
            .await?;
        Ok(done.rows() > 0)
    }

    /// Delete up to `batch` expired records with the store's `sweep`; how many it deleted.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(super) async fn sweep(
        pool: &Pool<DB>,
        sweep: impl SqlSafeStr,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let batch = Self::encoded(|args| args.add(i64::from(batch)))?;
        let done = sqlx::query_with(sweep, batch).execute(pool).await?;
        Ok(done.rows())
    }

    /// A row of a store's `GET` as the record it describes.
    fn record_info(row: &DB::Row) -> Result<RecordInfo, StoreError> {
        let expires_in = remaining(row.try_get("expires_ms")?);
        let age = remaining(row.try_get("age_ms")?);
        let info = match row.try_get::<&str, _>("state")? {
            "running" => RecordInfo::running(remaining(row.try_get("lease_ms")?), expires_in),
            "done" => RecordInfo::done(
                saved_response(
                    row.try_get("status")?,
                    row.try_get("headers")?,
                    row.try_get("body")?,
                )?,
                expires_in,
            ),
            _ => return Err(StoreError::corrupt("a record has an unknown state")),
        };
        Ok(info.with_age(age))
    }

    /// Arguments filled by `add`, apart from any query so that `query_with` and
    /// `query_scalar_with` take them alike. A value that fails to encode is the driver's
    /// encoding error, as from `bind`, only reported before the statement is sent.
    fn encoded(
        add: impl FnOnce(&mut DB::Arguments) -> Result<(), BoxDynError>,
    ) -> Result<DB::Arguments, StoreError> {
        let mut args = DB::Arguments::default();
        add(&mut args).map_err(sqlx::Error::Encode)?;
        Ok(args)
    }
}

/// A duration in whole milliseconds for the SQL, at least 1 (a zero lease would make a claim
/// indistinguishable from a takeover) and at most [`MAX_MILLIS`](crate::store::record::time::MAX_MILLIS).
pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(time::to_millis(duration).max(1)).unwrap_or(i64::MAX)
}

/// A record's key as a statement returned it: the 32 bytes of its [`KeyHash`].
pub(super) fn stored_key(bytes: &[u8]) -> Result<KeyHash, StoreError> {
    <[u8; 32]>::try_from(bytes)
        .map(KeyHash)
        .map_err(|_| StoreError::corrupt("a stored key is not 32 bytes"))
}

/// The time left, from the milliseconds a statement computed (none: nothing left).
fn remaining(ms: Option<i64>) -> Duration {
    ms.map_or(Duration::ZERO, time::from_millis)
}

/// The saved response of a `done` record.
fn saved_response(
    status: Option<i32>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<StoredResponse, StoreError> {
    let (Some(status), Some(headers), Some(body)) = (status, headers, body) else {
        return Err(StoreError::corrupt("a done record has no saved response"));
    };
    let status = u16::try_from(status).map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e))?;
    StoredResponse::from_parts(status, &headers, Bytes::from(body))
}

/// The row of each SQL store's `STATS` query (running, done, expired, the oldest running
/// record's key and age in milliseconds) as [`StoreStats`].
fn stats_of(
    (running, done, expired, key, age_ms): (i64, i64, i64, Option<Vec<u8>>, Option<i64>),
) -> Result<StoreStats, StoreError> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let stats = StoreStats::new(count(running), count(done), count(expired));
    Ok(match key {
        None => stats,
        Some(key) => stats.with_oldest_running(
            stored_key(&key)?,
            Duration::from_millis(count(age_ms.unwrap_or(0))),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_wake_while_watching_is_not_lost() {
        let waiters = Arc::new(Waiters::default());
        let key = KeyHash([1; 32]);
        let started = Instant::now();
        let watch = async {
            waiters.wake(&key);
            true
        };
        wait_for_change(&waiters, &key, started + MINUTE, watch).await;
        assert!(started.elapsed() < MINUTE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_says_no_ends_the_wait_and_none_outlasts_its_deadline() {
        let waiters = Arc::new(Waiters::default());
        let key = KeyHash([1; 32]);
        let started = Instant::now();
        wait_for_change(&waiters, &key, started + MINUTE, async { false }).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        wait_for_change(&waiters, &key, started + MINUTE, async { true }).await;
        assert_eq!(started.elapsed(), MINUTE);
    }

    #[test]
    fn millis_are_clamped() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::from_secs(30)), 30_000);
        assert_eq!(millis(Duration::MAX), 100 * 365 * 24 * 60 * 60 * 1000);
    }

    #[test]
    fn remaining_is_never_negative() {
        assert_eq!(remaining(Some(-5)), Duration::ZERO);
        assert_eq!(remaining(None), Duration::ZERO);
        assert_eq!(remaining(Some(1500)), Duration::from_millis(1500));
    }

    #[test]
    fn a_done_record_without_a_response_is_corrupt() {
        let err = saved_response(None, Some(vec![]), Some(vec![])).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        let err = saved_response(Some(-1), Some(vec![]), Some(vec![])).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        let ok = saved_response(Some(201), Some(b"x-a: 1\n".to_vec()), Some(b"hi".to_vec()));
        assert_eq!(ok.unwrap().status, http::StatusCode::CREATED);
    }
}
