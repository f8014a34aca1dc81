//! What every SQL backend is written with, imported at once by `postgres/`, `sqlite/` and
//! `mysql/`: the [`Store`] contract, what it keeps and answers, its errors, and the shared pieces
//! of `sql/` (the batching executor, the table name, the waiters).

pub(super) use sqlx::migrate::Migrator;

pub(super) use crate::{
    key::KeyHash,
    store::{
        error::StoreError,
        record::{Claim, ClaimOutcome, Fenced, Hold, RecordInfo, StoreStats, StoredResponse},
        sql::{
            self,
            batch::{Batcher, Batching, Counters},
            TableName, Waiters,
        },
        Store, TransactionalStore,
    },
};
