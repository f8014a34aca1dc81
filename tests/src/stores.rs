//! Fresh stores of every backend, each on a database or key prefix of its own, and the signals
//! a test can wait for on them.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tower_idempotency::{
    store::{
        mysql::MySqlStore,
        postgres::PostgresStore,
        redis::{redis, RedisStore},
        sqlite::SqliteStore,
        MemoryStore, Store, TableName,
    },
    KeyHash,
};

use crate::{
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, redis_client, unique_name, Isolation,
};

/// An empty in-process store.
pub async fn memory_store() -> MemoryStore {
    MemoryStore::new()
}

/// A migrated PostgreSQL store on a database of its own (a pool of 16 connections).
pub async fn postgres_store() -> PostgresStore {
    let store = PostgresStore::new(fresh_postgres_pool(16).await);
    store.migrate().await.expect("migrate the fresh database");
    store
}

/// The table of the stores `*_store_on_another_table` keep their records in.
pub const ANOTHER_TABLE: &str = "idempotency_keys";

/// A migrated PostgreSQL store on a database of its own, on the table `idem.idempotency_keys`
/// (a schema of its own) instead of the default.
pub async fn postgres_store_on_another_table() -> PostgresStore {
    let pool = fresh_postgres_pool(16).await;
    sqlx::query("CREATE SCHEMA idem")
        .execute(&pool)
        .await
        .expect("create the schema");
    let table = TableName::new(&format!("idem.{ANOTHER_TABLE}")).expect("a valid name");
    let store = PostgresStore::new(pool).with_table(table);
    store.migrate().await.expect("migrate the fresh database");
    store
}

/// A migrated SQLite store on a fresh database file, on the table [`ANOTHER_TABLE`].
pub async fn sqlite_store_on_another_table() -> SqliteStore {
    let table = TableName::new(ANOTHER_TABLE).expect("a valid name");
    let store = SqliteStore::new(fresh_sqlite_pool(8).await).with_table(table);
    store.migrate().await.expect("migrate the fresh database");
    store
}

/// A migrated MySQL store on a database of its own, on the table [`ANOTHER_TABLE`].
pub async fn mysql_store_on_another_table() -> MySqlStore {
    let table = TableName::new(ANOTHER_TABLE).expect("a valid name");
    let pool = fresh_mysql_pool(8, Isolation::RepeatableRead).await;
    let store = MySqlStore::new(pool).with_table(table);
    store.migrate().await.expect("migrate the fresh database");
    store
}

/// A migrated SQLite store on a fresh database file (a pool of 8 connections).
pub async fn sqlite_store() -> SqliteStore {
    let store = SqliteStore::new(fresh_sqlite_pool(8).await);
    store.migrate().await.expect("migrate the fresh database");
    store
}

/// A migrated MySQL store on a database of its own at REPEATABLE READ, InnoDB's default (a pool
/// of 8 connections).
pub async fn mysql_store() -> MySqlStore {
    mysql_store_at(Isolation::RepeatableRead).await
}

/// A migrated MySQL store on a database of its own, every connection at `isolation` (a pool of
/// 8 connections).
pub async fn mysql_store_at(isolation: Isolation) -> MySqlStore {
    let store = MySqlStore::new(fresh_mysql_pool(8, isolation).await);
    store.migrate().await.expect("migrate the fresh database");
    store
}

/// A store on `REDIS_URL` (with wait-mode notifications) under a key prefix of its own.
pub async fn redis_store() -> RedisStore {
    RedisStore::connect(redis_client())
        .await
        .unwrap_or_else(|e| panic!("cannot reach Redis at REDIS_URL: {e}"))
        .with_prefix(unique_name("tidem"))
}

/// `REDIS_CLUSTER_URLS`, the comma-separated node URLs of a Redis Cluster
/// (`scripts/redis-cluster.sh` starts one on 127.0.0.1:7001-7003).
pub fn cluster_urls() -> Vec<String> {
    let urls = std::env::var("REDIS_CLUSTER_URLS").expect(
        "REDIS_CLUSTER_URLS is not set: run scripts/redis-cluster.sh and export \
         REDIS_CLUSTER_URLS=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003",
    );
    let urls: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(!urls.is_empty(), "REDIS_CLUSTER_URLS holds no URL");
    urls
}

/// A connection to the cluster at `REDIS_CLUSTER_URLS`.
pub async fn cluster_conn() -> redis::cluster_async::ClusterConnection {
    let urls = cluster_urls();
    redis::cluster::ClusterClient::new(urls.clone())
        .unwrap_or_else(|e| panic!("REDIS_CLUSTER_URLS={urls:?} is not valid: {e}"))
        .get_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot reach the cluster at REDIS_CLUSTER_URLS={urls:?}: {e}"))
}

/// A cluster store under a key prefix of its own, notified through the first node.
pub async fn redis_cluster_store() -> RedisStore {
    let first = cluster_urls().remove(0);
    RedisStore::cluster(cluster_conn().await)
        .with_prefix(unique_name("tidem"))
        .with_notifications(redis::Client::open(first).expect("a valid node URL"))
}

/// Whether a PostgreSQL waiter has marked `key`'s record (`watched`), read through `store`.
pub async fn postgres_watched(store: &PostgresStore, key: &KeyHash) -> bool {
    sqlx::query_scalar("SELECT watched FROM idempotency_records WHERE key = $1")
        .bind(key.as_bytes().as_slice())
        .fetch_one(store.pool())
        .await
        .expect("read watched")
}

/// Start a waiter on `waiter` for `key` (for up to `wait`) and return once it has marked the
/// record, read through `observer`: the mark is a PostgreSQL waiter's signal that it listens. The
/// task answers when its wait ended.
pub async fn start_postgres_waiter(
    waiter: &PostgresStore,
    observer: &PostgresStore,
    key: KeyHash,
    wait: Duration,
) -> JoinHandle<Instant> {
    let store = waiter.clone();
    let task = tokio::spawn(async move {
        store.wait_for_change(&key, wait).await;
        Instant::now()
    });
    // The mark is a row in the database, so this reads it until it appears (bounded).
    let deadline = Instant::now() + wait;
    while !postgres_watched(observer, &key).await {
        assert!(
            Instant::now() < deadline,
            "the waiter never marked the record"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    task
}
