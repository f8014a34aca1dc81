//! The SQL a user applies with their own migration tool (the repository's top-level
//! `migrations/`), and `check_schema()` at startup: it refuses a missing or outdated table with a
//! message naming what to apply, and accepts the schema the folder's files create, under the
//! default table name and under another (the files with `idempotency_records` replaced, as the
//! docs of `with_table` say).

use tower_idempotency::store::{
    mysql::MySqlStore, postgres::PostgresStore, sqlite::SqliteStore, StoreErrorKind, TableName,
};
use tower_idempotency_tests::{
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, Isolation,
};

fn message(err: &tower_idempotency::store::StoreError) -> String {
    std::error::Error::source(err)
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// One test per backend: `$files` in order, each with the column `check_schema` still misses
/// after it (`None`: the schema is current).
macro_rules! applied_by_hand {
    ($test:ident, $store:ident, $pool:expr, $folder:literal, [$($file:literal => $missing:expr),+ $(,)?]) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn $test() {
            let pool = $pool;
            let store = $store::new(pool.clone());
            let absent = store.check_schema().await.unwrap_err();
            assert_eq!(absent.kind(), StoreErrorKind::Migration);
            let text = message(&absent);
            assert!(text.contains(concat!(stringify!($store), "::migrate()")), "{text}");
            assert!(text.contains(concat!("migrations/", $folder, "/")), "{text}");

            $(
                let sql = include_str!(concat!("../../migrations/", $folder, "/", $file));
                sqlx::raw_sql(sql).execute(&pool).await.unwrap();
                let missing: Option<&str> = $missing;
                match missing {
                    Some(column) => {
                        let outdated = store.check_schema().await.unwrap_err();
                        assert!(message(&outdated).contains(column), "{}", message(&outdated));
                    }
                    None => store.check_schema().await.unwrap(),
                }
            )+
            // The store's own migrations find the hand-applied schema and leave it as it is.
            store.migrate().await.unwrap();
            store.check_schema().await.unwrap();

            // The same files for another table, the name replaced.
            let other = store.with_table(TableName::new("by_hand_records").unwrap());
            assert!(other.check_schema().await.is_err());
            $(
                let sql = include_str!(concat!("../../migrations/", $folder, "/", $file))
                    .replace("idempotency_records", "by_hand_records");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
            )+
            other.check_schema().await.unwrap();
            other.migrate().await.unwrap();
            other.check_schema().await.unwrap();
        }
    };
}

applied_by_hand!(
    postgres_check_schema_accepts_the_migrations_folder_applied_by_hand,
    PostgresStore,
    fresh_postgres_pool(2).await,
    "postgres",
    [
        "0001_idempotency_records.sql" => Some("watched"),
        "0002_watched.sql" => None,
    ]
);

applied_by_hand!(
    sqlite_check_schema_accepts_the_migrations_folder_applied_by_hand,
    SqliteStore,
    fresh_sqlite_pool(2).await,
    "sqlite",
    ["0001_idempotency_records.sql" => None]
);

applied_by_hand!(
    mysql_check_schema_accepts_the_migrations_folder_applied_by_hand,
    MySqlStore,
    fresh_mysql_pool(2, Isolation::RepeatableRead).await,
    "mysql",
    ["0001_idempotency_records.sql" => None]
);

/// A schema-qualified table applied by hand as `TableName`'s docs say: the index and constraint
/// names take the name without its schema, every other `idempotency_records` the whole name.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_schema_qualified_table_applied_by_hand_as_the_docs_say() {
    let pool = fresh_postgres_pool(2).await;
    sqlx::raw_sql("CREATE SCHEMA billing")
        .execute(&pool)
        .await
        .unwrap();
    let store =
        PostgresStore::new(pool.clone()).with_table(TableName::new("billing.idem").unwrap());
    assert!(store.check_schema().await.is_err());
    for sql in [
        include_str!("../../migrations/postgres/0001_idempotency_records.sql"),
        include_str!("../../migrations/postgres/0002_watched.sql"),
    ] {
        let sql = sql
            .replace("idempotency_records_", "idem_")
            .replace("idempotency_records", "billing.idem");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    store.check_schema().await.unwrap();
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
}
