//! The SQL a user applies with their own migration tool (the repository's top-level
//! `migrations/`), and `check_schema()` at startup: it refuses a missing or outdated table with a
//! message naming what to apply, and accepts the schema the folder's files create.

use tower_idempotency::store::{
    mysql::MySqlStore, postgres::PostgresStore, sqlite::SqliteStore, StoreErrorKind,
};
use tower_idempotency_tests::{
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, Isolation,
};

fn message(err: &tower_idempotency::store::StoreError) -> String {
    std::error::Error::source(err)
        .map(ToString::to_string)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_check_schema_accepts_the_migrations_folder_applied_by_hand() {
    let pool = fresh_postgres_pool(2).await;
    let store = PostgresStore::new(pool.clone());
    let missing = store.check_schema().await.unwrap_err();
    assert_eq!(missing.kind(), StoreErrorKind::Migration);
    let text = message(&missing);
    assert!(text.contains("PostgresStore::migrate()"), "{text}");
    assert!(text.contains("migrations/postgres/"), "{text}");

    sqlx::raw_sql(include_str!(
        "../../migrations/postgres/0001_idempotency_records.sql"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let outdated = store.check_schema().await.unwrap_err();
    assert!(
        message(&outdated).contains("watched"),
        "{}",
        message(&outdated)
    );

    sqlx::raw_sql(include_str!("../../migrations/postgres/0002_watched.sql"))
        .execute(&pool)
        .await
        .unwrap();
    store.check_schema().await.unwrap();
    // The store's own migrations find the hand-applied schema and leave it as it is.
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_check_schema_accepts_the_migrations_folder_applied_by_hand() {
    let pool = fresh_sqlite_pool(2).await;
    let store = SqliteStore::new(pool.clone());
    let missing = store.check_schema().await.unwrap_err();
    assert_eq!(missing.kind(), StoreErrorKind::Migration);
    let text = message(&missing);
    assert!(text.contains("SqliteStore::migrate()"), "{text}");
    assert!(text.contains("migrations/sqlite/"), "{text}");

    sqlx::raw_sql(include_str!(
        "../../migrations/sqlite/0001_idempotency_records.sql"
    ))
    .execute(&pool)
    .await
    .unwrap();
    store.check_schema().await.unwrap();
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_check_schema_accepts_the_migrations_folder_applied_by_hand() {
    let pool = fresh_mysql_pool(2, Isolation::RepeatableRead).await;
    let store = MySqlStore::new(pool.clone());
    let missing = store.check_schema().await.unwrap_err();
    assert_eq!(missing.kind(), StoreErrorKind::Migration);
    let text = message(&missing);
    assert!(text.contains("MySqlStore::migrate()"), "{text}");
    assert!(text.contains("migrations/mysql/"), "{text}");

    sqlx::raw_sql(include_str!(
        "../../migrations/mysql/0001_idempotency_records.sql"
    ))
    .execute(&pool)
    .await
    .unwrap();
    store.check_schema().await.unwrap();
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
}
