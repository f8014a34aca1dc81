//! The store contract (`tower_idempotency_tests::contract`) against every backend: the same
//! list of tests, expanded once per store by `store_contract_tests!`, each on a fresh store (a
//! new database, SQLite file or Redis key prefix).
//!
//! Run with `DATABASE_URL`, `MYSQL_URL`, `REDIS_URL` and `REDIS_CLUSTER_URLS` set (see `scripts/test.sh`).

use tower_idempotency_tests::{store_contract_tests, stores};

mod memory {
    use super::*;
    store_contract_tests!(stores::memory_store().await);
}

mod postgres {
    use super::*;
    store_contract_tests!(stores::postgres_store().await);
}

mod sqlite {
    use super::*;
    store_contract_tests!(stores::sqlite_store().await);
}

/// MySQL (MariaDB) at both isolation levels the claim is documented for.
mod mysql_repeatable_read {
    use super::*;
    store_contract_tests!(stores::mysql_store().await);
}

mod mysql_read_committed {
    use super::*;
    use tower_idempotency_tests::Isolation;
    store_contract_tests!(stores::mysql_store_at(Isolation::ReadCommitted).await);
}

/// The SQL stores on a table of another name (PostgreSQL's in a schema of its own): every
/// statement, batched or not, and the migrations name it.
mod postgres_on_another_table {
    use super::*;
    store_contract_tests!(stores::postgres_store_on_another_table().await);
}

mod sqlite_on_another_table {
    use super::*;
    store_contract_tests!(stores::sqlite_store_on_another_table().await);
}

mod mysql_on_another_table {
    use super::*;
    store_contract_tests!(stores::mysql_store_on_another_table().await);
}

mod redis {
    use super::*;
    store_contract_tests!(stores::redis_store().await);
}

mod redis_cluster {
    use super::*;
    store_contract_tests!(stores::redis_cluster_store().await);
}
