//! What only the SQL stores do, against real databases: transactional `complete_in`, waiting,
//! migrations. One suite, instantiated for each backend by `sql_store_tests!` (the store
//! contract every store shares is in `store_contract.rs`). Every test gets a fresh database (PostgreSQL at `DATABASE_URL`)
//! or a fresh SQLite file, and runs on a multi-thread runtime so races are real.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use tower_idempotency::store::{
    mysql::MySqlStore, postgres::PostgresStore, sqlite::SqliteStore, Batching, ClaimOutcome,
    Fenced, Hold, Store, StoreError, StoredResponse, TransactionalStore,
};
use tower_idempotency_tests::{
    contract::{
        claim_of, claimed, is_in_flight, random_key, response, retry_of, retry_with_lease, until,
        DAY, LONG,
    },
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, postgres_advisory_lock_held,
    stores::start_postgres_waiter,
    until_true, Isolation,
};

/// What the suite needs from a backend beyond the [`Store`] traits.
trait Backend: TransactionalStore + Clone + Sized {
    /// A store on a fresh, empty database (not migrated), with a pool of `connections`.
    async fn unmigrated(connections: u32) -> Self;
    /// A migrated store on a fresh database, with a pool of `connections`.
    async fn fresh(connections: u32) -> Self {
        let store = Self::unmigrated(connections).await;
        store.run_migrations().await.expect("migrate");
        store
    }
    /// A store on this one's database with `batching`.
    fn batched(&self, batching: Batching) -> Self;
    /// Whether a table of that name exists.
    async fn table_exists(&self, name: &str) -> bool;
    /// The store's own `migrate`.
    fn run_migrations(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The [`Backend`] of one store: the three differ in their fresh pool and the catalogue they ask
/// for a table.
macro_rules! backend {
    ($store:ident, pool: |$connections:ident| $pool:expr, table_exists: $exists:literal $(,)?) => {
        impl Backend for $store {
            fn run_migrations(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
                self.migrate()
            }

            async fn unmigrated($connections: u32) -> Self {
                $store::new($pool)
            }

            fn batched(&self, batching: Batching) -> Self {
                $store::with_batching(self.pool().clone(), batching)
            }

            async fn table_exists(&self, name: &str) -> bool {
                sqlx::query_scalar::<_, bool>($exists)
                    .bind(name)
                    .fetch_one(self.pool())
                    .await
                    .expect("query the catalogue")
            }
        }
    };
}

backend!(
    PostgresStore,
    pool: |connections| fresh_postgres_pool(connections).await,
    table_exists: "SELECT EXISTS (SELECT FROM pg_tables \
        WHERE schemaname = current_schema() AND tablename = $1)",
);

backend!(
    SqliteStore,
    pool: |connections| fresh_sqlite_pool(connections).await,
    table_exists: "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
);

backend!(
    MySqlStore,
    pool: |connections| fresh_mysql_pool(connections, Isolation::RepeatableRead).await,
    table_exists: "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = ?)",
);

// ---------------------------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------------------------

/// `complete_in` inside a transaction begun for it, left open for the test to end.
async fn complete_in_new_tx<B: Backend>(
    store: &B,
    hold: &Hold,
    response: &StoredResponse,
) -> (sqlx::Transaction<'static, B::Database>, Fenced) {
    let mut tx = store.pool().begin().await.unwrap();
    let fenced = store.complete_in(&mut tx, hold, response).await.unwrap();
    (tx, fenced)
}

async fn complete_in_a_rolled_back_transaction_leaves_the_record_running<B: Backend>() {
    let store = B::fresh(2).await;
    let claim = claim_of(random_key(), "a", LONG, DAY);
    store.claim(&claim).await.unwrap();

    let (tx, fenced) = complete_in_new_tx(&store, &claim.hold(), &response()).await;
    assert_eq!(fenced, Fenced::Applied);
    tx.rollback().await.unwrap();
    assert!(is_in_flight(&store.claim(&retry_of(&claim)).await.unwrap()));

    // Committed, the same write is the saved answer.
    let saved = response();
    let (tx, fenced) = complete_in_new_tx(&store, &claim.hold(), &saved).await;
    assert_eq!(fenced, Fenced::Applied);
    tx.commit().await.unwrap();
    assert_eq!(
        store.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(saved)
    );
}

async fn complete_in_with_a_stale_token_is_lost<B: Backend>() {
    let store = B::fresh(2).await;
    let lease = Duration::from_millis(200);
    let old = claim_of(random_key(), "a", lease, DAY);
    store.claim(&old).await.unwrap();
    let started = Instant::now(); // the claim's lease and expiry count from before this
    until(started + lease + Duration::from_millis(100)).await;
    let new = retry_with_lease(&old, LONG);
    assert_eq!(store.claim(&new).await.unwrap(), claimed(true));

    let (tx, fenced) = complete_in_new_tx(&store, &old.hold(), &response()).await;
    assert_eq!(fenced, Fenced::Lost);
    tx.rollback().await.unwrap();
    assert!(is_in_flight(&store.claim(&retry_of(&old)).await.unwrap()));
}

async fn wait_for_change_wakes_on_complete_and_release<B: Backend>() {
    let store = B::fresh(4).await;
    // The first wait starts the store's notification machinery (PostgreSQL: its listener).
    store
        .wait_for_change(&random_key(), Duration::from_millis(300))
        .await;

    for release in [false, true] {
        let claim = claim_of(random_key(), "a", LONG, DAY);
        store.claim(&claim).await.unwrap();
        let waiter = tokio::spawn({
            let store = store.clone();
            async move {
                let started = Instant::now();
                store
                    .wait_for_change(&claim.key, Duration::from_secs(10))
                    .await;
                started.elapsed()
            }
        });
        // Give the waiter time to register: the change must happen while it waits.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let fenced = if release {
            store.release(&claim.hold()).await.unwrap()
        } else {
            store.complete(&claim.hold(), &response()).await.unwrap()
        };
        assert_eq!(fenced, Fenced::Applied);
        let waited = waiter.await.unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "release={release}: woke after {waited:?}"
        );
    }
}

async fn wait_for_change_is_bounded_by_its_timeout<B: Backend>() {
    let store = B::fresh(2).await;
    // A running record that nobody completes: the wait lasts its timeout, no more. (A key with
    // no running record may return at once: there is nothing to wait for.)
    let claim = claim_of(random_key(), "a", LONG, DAY);
    store.claim(&claim).await.unwrap();
    let started = Instant::now();
    store
        .wait_for_change(&claim.key, Duration::from_millis(300))
        .await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
}

/// "Never" and "unlimited" written as the largest values are taken as the longest and largest
/// the store can use, not panics when the store is built or first used.
async fn settings_at_their_largest_are_bounded<B: Backend>() {
    let settings = Batching::default()
        .pipeline(usize::MAX)
        .max_batch(usize::MAX)
        .queue(usize::MAX)
        .timeout(Duration::MAX);
    let store = B::fresh(4).await.batched(settings);
    let claim = claim_of(random_key(), "a", LONG, DAY);
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
    // Nothing changes the running record: the wait goes on (it would panic at once if its
    // deadline overflowed).
    let wait = store.wait_for_change(&claim.key, Duration::MAX);
    let waited = tokio::time::timeout(Duration::from_millis(200), wait).await;
    assert!(waited.is_err(), "the wait for no change ended");
    let completed = store.complete(&claim.hold(), &response()).await.unwrap();
    assert_eq!(completed, Fenced::Applied);
}

async fn migrate_twice_uses_its_own_tracking_table<B: Backend>() {
    let store = B::fresh(4).await; // migrated once already
    store.run_migrations().await.expect("second migrate");
    // Concurrent migrations (several instances starting at once) all succeed.
    migrate_at_once(&store, 4).await;
    assert!(store.table_exists("idempotency_records").await);
    assert!(store.table_exists("_tower_idempotency_migrations").await);
    assert!(!store.table_exists("_sqlx_migrations").await);
}

async fn concurrent_first_migrations_succeed<B: Backend>() {
    // A fresh database, migrated by several "instances" at once from the start.
    let store = B::unmigrated(4).await;
    assert!(!store.table_exists("idempotency_records").await);
    migrate_at_once(&store, 4).await;
    assert!(store.table_exists("idempotency_records").await);
    assert!(store.table_exists("_tower_idempotency_migrations").await);
    let claim = claim_of(random_key(), "a", LONG, DAY);
    assert_eq!(store.claim(&claim).await.unwrap(), claimed(false));
}

/// `instances` migrations of `store`'s database at once, as instances starting together run
/// them; each must succeed.
async fn migrate_at_once<B: Backend>(store: &B, instances: usize) {
    let runs: Vec<_> = (0..instances)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.run_migrations().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().expect("concurrent migrate");
    }
}

// ---------------------------------------------------------------------------------------------
// Instantiation
// ---------------------------------------------------------------------------------------------

macro_rules! sql_store_tests {
    ($backend:ident: $store:ty => $($test:ident),+ $(,)?) => {
        mod $backend {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test::<$store>().await;
                }
            )+
        }
    };
}

macro_rules! suite {
    ($($backend:ident: $store:ty),+ $(,)?) => {
        $(
            sql_store_tests!($backend: $store =>
                complete_in_a_rolled_back_transaction_leaves_the_record_running,
                complete_in_with_a_stale_token_is_lost,
                wait_for_change_wakes_on_complete_and_release,
                wait_for_change_is_bounded_by_its_timeout,
                settings_at_their_largest_are_bounded,
                migrate_twice_uses_its_own_tracking_table,
                concurrent_first_migrations_succeed,
            );
        )+
    };
}

suite!(postgres: PostgresStore, sqlite: SqliteStore, mysql: MySqlStore);

// ---------------------------------------------------------------------------------------------
// PostgreSQL only
// ---------------------------------------------------------------------------------------------

/// Another process's `complete` (another store, another pool, same database) wakes a waiter:
/// the notification goes through the database, not through this store's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_wait_for_change_wakes_on_another_instance_s_complete() {
    let here = PostgresStore::fresh(2).await;
    let there = PostgresStore::new(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(here.pool().connect_options().as_ref().clone())
            .await
            .unwrap(),
    );
    here.wait_for_change(&random_key(), Duration::from_millis(300))
        .await;

    let claim = claim_of(random_key(), "a", LONG, DAY);
    there.claim(&claim).await.unwrap();
    let waiter = start_postgres_waiter(&here, &there, claim.key, Duration::from_secs(10)).await;
    // Completed inside a transaction: the notification goes out on commit, not before.
    let (tx, fenced) = complete_in_new_tx(&there, &claim.hold(), &response()).await;
    assert_eq!(fenced, Fenced::Applied);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "no notification before the commit");
    tx.commit().await.unwrap();
    let committed = Instant::now();
    let woke = waiter.await.unwrap();
    let waited = woke.saturating_duration_since(committed);
    assert!(
        waited < Duration::from_secs(5),
        "woke {waited:?} after the commit"
    );
    assert!(matches!(
        here.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
}

/// A listener that cannot connect never makes waiting fail or spin: each wait lasts its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_wait_for_change_without_a_database_sleeps_the_timeout() {
    // Nothing listens on port 1.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let store = PostgresStore::new(pool);
    for _ in 0..3 {
        let started = Instant::now();
        store
            .wait_for_change(&random_key(), Duration::from_millis(200))
            .await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
    }
    // Operations report the database as unavailable, without its text.
    let err = store
        .claim(&claim_of(random_key(), "a", LONG, DAY))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        tower_idempotency::store::StoreErrorKind::Unavailable
    );
    assert_eq!(err.to_string(), "idempotency store unavailable");
}

/// A migrator of one migration, version 1, that runs `sql`.
fn one_migration(sql: &'static str) -> sqlx::migrate::Migrator {
    use sqlx::{
        migrate::{Migration, MigrationType, Migrator},
        SqlSafeStr,
    };
    Migrator::with_migrations(vec![Migration::new(
        1,
        "the test's".into(),
        MigrationType::Simple,
        sqlx::AssertSqlSafe(sql).into_sql_str(),
        false,
    )])
}

/// A pool on a fresh PostgreSQL database, and a connection to it outside the pool.
async fn postgres_pool_and_another_connection() -> (sqlx::PgPool, sqlx::PgConnection) {
    use sqlx::Connection;

    let pool = fresh_postgres_pool(4).await;
    let other = sqlx::PgConnection::connect_with(&pool.connect_options())
        .await
        .expect("a connection outside the pool");
    (pool, other)
}

/// Waits until no session of `conn`'s database holds an advisory lock.
async fn until_lock_let_go(conn: &mut sqlx::PgConnection) {
    until_true(LOCK_LET_GO, "the lock is let go", async || {
        !postgres_advisory_lock_held(conn).await
    })
    .await;
}

/// A migration run dropped part way (a start-up timeout) leaves no connection of the pool
/// holding sqlx's advisory lock, which every later run, from any process, would wait on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_migration_run_dropped_part_way_leaves_no_lock_held() {
    use tower_idempotency::store::postgres;

    let (pool, mut other) = postgres_pool_and_another_connection().await;
    let run = tokio::spawn({
        let pool = pool.clone();
        async move { postgres::run_migrator(&pool, one_migration("SELECT pg_sleep(2)")).await }
    });
    until_true(LOCK_TAKEN, "the run takes its lock", async || {
        postgres_advisory_lock_held(&mut other).await
    })
    .await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled(), "dropped part way");
    until_lock_let_go(&mut other).await;
}

/// A migration that fails leaves no connection of the pool holding sqlx's advisory lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_failed_migration_leaves_no_lock_held() {
    use tower_idempotency::store::postgres;

    let (pool, mut other) = postgres_pool_and_another_connection().await;
    let failed = postgres::run_migrator(&pool, one_migration("SELECT 1 / 0")).await;
    assert!(failed.is_err(), "a migration dividing by zero fails");
    until_lock_let_go(&mut other).await;
}

/// How long a migration run may take to take its lock in these tests.
const LOCK_TAKEN: Duration = Duration::from_secs(10);
/// How long a dropped or failed run's lock may outlive it: its statement (two seconds at most)
/// and the connection's close.
const LOCK_LET_GO: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// MySQL only
// ---------------------------------------------------------------------------------------------

/// The named lock `mysql::run_migrator` takes for the migrations of this connection's database.
const MYSQL_MIGRATION_LOCK: &str = "CONCAT('tower_idempotency_migrate_', MD5(DATABASE()))";

/// A migration run dropped part way (a start-up timeout) leaves no connection of the pool
/// holding its named lock: the next run, from any process, takes it as soon as the dropped run's
/// statement ends, instead of waiting out its minute and failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_migration_run_dropped_part_way_leaves_its_lock_behind_with_no_one() {
    use sqlx::Connection;
    use tower_idempotency::store::mysql;

    let pool = fresh_mysql_pool(4, Isolation::RepeatableRead).await;
    let mut other = sqlx::MySqlConnection::connect_with(&pool.connect_options())
        .await
        .expect("a connection outside the pool");
    let run = tokio::spawn({
        let pool = pool.clone();
        async move { mysql::run_migrator(&pool, one_migration("SELECT SLEEP(2)")).await }
    });
    let held = format!("SELECT IS_USED_LOCK({MYSQL_MIGRATION_LOCK}) IS NOT NULL");
    until_true(LOCK_TAKEN, "the run takes its lock", async || {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(held.clone()))
            .fetch_one(&mut other)
            .await
            .expect("ask whether the lock is held")
            == 1
    })
    .await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled(), "dropped part way");

    let started = Instant::now();
    let taken: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT GET_LOCK({MYSQL_MIGRATION_LOCK}, 20)"
    )))
    .fetch_one(&mut other)
    .await
    .expect("take the lock");
    assert_eq!(taken, Some(1), "the dropped run's lock was never let go");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "taken after {:?}: the dropped run's statement lasts two seconds",
        started.elapsed()
    );
}
