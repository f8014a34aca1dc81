//! A SQL store on a table of its own name (`with_table`), against the real databases: two stores
//! on two tables of one database keep apart (records, migrations, `check_schema`), and a name
//! that is not a plain SQL identifier is refused before any SQL is written. The store contract
//! on such a table is in `store_contract.rs` (`*_on_another_table`).

use std::future::Future;

use tower_idempotency::store::{
    mysql::MySqlStore, postgres::PostgresStore, sqlite::SqliteStore, ClaimOutcome, Store,
    StoreError, StoreErrorKind, TableName,
};
use tower_idempotency_tests::{
    contract::{claim_of, claimed, is_in_flight, random_key, response, retry_of, DAY, LONG},
    fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, Isolation,
};

/// What the tests need of a SQL store: two stores on one fresh database, on the default table
/// and on `table`.
trait Backend: Store + Sized {
    async fn two_on_one_database(table: TableName) -> (Self, Self);
    fn run_migrations(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn check(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

macro_rules! backend {
    ($store:ty, $pool:expr) => {
        impl Backend for $store {
            async fn two_on_one_database(table: TableName) -> (Self, Self) {
                let pool = $pool;
                let default = <$store>::new(pool.clone());
                (default.clone(), default.with_table(table))
            }

            fn run_migrations(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
                self.migrate()
            }

            fn check(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
                self.check_schema()
            }
        }
    };
}

backend!(PostgresStore, fresh_postgres_pool(4).await);
backend!(SqliteStore, fresh_sqlite_pool(4).await);
backend!(
    MySqlStore,
    fresh_mysql_pool(4, Isolation::RepeatableRead).await
);

fn message(err: &StoreError) -> String {
    std::error::Error::source(err)
        .map(ToString::to_string)
        .unwrap_or_default()
}

async fn two_tables_of_one_database_keep_apart<B: Backend>() {
    let table = TableName::new("billing_idempotency").unwrap();
    let (default, other) = B::two_on_one_database(table).await;

    // Neither table exists yet: each check names its own.
    let missing = other.check().await.unwrap_err();
    assert_eq!(missing.kind(), StoreErrorKind::Migration);
    let text = message(&missing);
    assert!(
        text.contains("the table billing_idempotency is missing"),
        "{text}"
    );
    assert!(
        text.contains("the name `billing_idempotency` written in"),
        "{text}"
    );

    // Migrated apart: each has its own tracking table, so the second is not skipped, and a
    // second run of either finds its own versions applied.
    other.run_migrations().await.unwrap();
    assert!(
        default.check().await.is_err(),
        "the default table was not created"
    );
    default.run_migrations().await.unwrap();
    other.run_migrations().await.unwrap();
    default.check().await.unwrap();
    other.check().await.unwrap();

    // One key, claimed in both: two records.
    let claim = claim_of(random_key(), "a", LONG, DAY);
    let mut second = retry_of(&claim);
    assert_eq!(default.claim(&claim).await.unwrap(), claimed(false));
    assert_eq!(other.claim(&second).await.unwrap(), claimed(false));

    // A save in one is replayed there and not seen in the other.
    assert!(default
        .complete(&claim.hold(), &response())
        .await
        .unwrap()
        .applied());
    assert_eq!(
        default.claim(&retry_of(&claim)).await.unwrap(),
        ClaimOutcome::Done(response())
    );
    second = retry_of(&second);
    assert!(is_in_flight(&other.claim(&second).await.unwrap()));

    // Forgetting in one leaves the other.
    assert!(default.forget(&claim.key).await.unwrap());
    assert!(default.get(&claim.key).await.unwrap().is_none());
    assert!(other.get(&claim.key).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_two_tables_of_one_database_keep_apart() {
    two_tables_of_one_database_keep_apart::<PostgresStore>().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_two_tables_of_one_database_keep_apart() {
    two_tables_of_one_database_keep_apart::<SqliteStore>().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_two_tables_of_one_database_keep_apart() {
    two_tables_of_one_database_keep_apart::<MySqlStore>().await;
}

#[test]
fn a_name_that_is_not_a_plain_identifier_is_refused() {
    for bad in [
        "idempotency_records; DROP TABLE users",
        "records\"",
        "`records`",
        "a.b.c",
        "1records",
        "",
    ] {
        let err = bad.parse::<TableName>().unwrap_err();
        assert!(
            err.to_string().contains("invalid table name"),
            "{bad}: {err}"
        );
    }
    assert_eq!(
        TableName::new("billing.idempotency").unwrap().as_str(),
        "billing.idempotency"
    );
}
