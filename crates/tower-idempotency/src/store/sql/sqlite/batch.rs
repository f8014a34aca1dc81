//! The SQLite store's group commit: every write of concurrent requests (claims, saves, releases,
//! renewals) in one `BEGIN IMMEDIATE .. COMMIT` (see [`batch`](crate::store::sql::batch)).
//!
//! SQLite runs one writer at a time, and what a write costs is mostly the commit (a journal sync)
//! and the hold of the file's write lock. A batch takes the store's writer queue and the write lock
//! once, runs each entry's own one-key statement in order, and commits once. The entries of a
//! batch run one after another on one connection, so two entries for one key see each other's
//! writes exactly as two requests in a row would: nothing about a batch needs rules of its own.

use std::sync::Arc;

use sqlx::sqlite::{SqliteConnection, SqlitePool};
use tokio::sync::Mutex;

use super::{complete_on, queries::Queries, Codec};
use crate::{
    key::KeyHash,
    store::{
        sql::{self, batch::Runner},
        Claim, ClaimOutcome, Fenced, FencingToken, StoreError,
    },
};

/// One write queued for a batch.
#[derive(Debug)]
pub(super) enum Write {
    Claim(Claim),
    Complete {
        key: KeyHash,
        token: FencingToken,
        response: crate::store::StoredResponse,
    },
    Release {
        key: KeyHash,
        token: FencingToken,
    },
    Renew {
        key: KeyHash,
        token: FencingToken,
        lease: std::time::Duration,
    },
}

/// What a [`Write`] answered.
#[derive(Debug)]
// Moved once per write, as `ClaimOutcome` itself is (see its note).
#[allow(clippy::large_enum_variant)]
pub(super) enum Written {
    Claim(ClaimOutcome),
    Fenced(Fenced),
}

/// Runs batches of writes in one transaction each.
pub(super) struct Writes {
    pub(super) pool: SqlitePool,
    /// The store's statements, for its table.
    pub(super) queries: Arc<Queries>,
    pub(super) writers: Arc<Mutex<()>>,
    /// Called with the key of every applied save or release once it is committed.
    pub(super) announce: Arc<dyn Fn(&KeyHash) + Send + Sync>,
}

impl Runner for Writes {
    type Entry = Write;
    type Output = Written;

    /// Each entry's statement, in order, inside one transaction. A statement that fails fails its
    /// own entry (SQLite keeps the transaction open after a failed statement); a failed begin or
    /// commit fails them all, and nothing of the batch is written.
    async fn run(&self, writes: &[Write]) -> Result<Vec<Result<Written, StoreError>>, StoreError> {
        let _writer = self.writers.lock().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut results = Vec::with_capacity(writes.len());
        for write in writes {
            results.push(write_one(&self.queries, &mut tx, write).await);
        }
        tx.commit().await?;
        for (write, result) in writes.iter().zip(&results) {
            if let (
                Write::Complete { key, .. } | Write::Release { key, .. },
                Ok(Written::Fenced(Fenced::Applied)),
            ) = (write, result)
            {
                (self.announce)(key);
            }
        }
        Ok(results)
    }

    /// A claim won for a request that is gone: release it now rather than leave the key to its
    /// lease.
    fn abandoned(self: &Arc<Self>, write: Write, written: Written) {
        let (Write::Claim(claim), Written::Claim(ClaimOutcome::Claimed { .. })) = (write, written)
        else {
            return;
        };
        let writes = self.clone();
        sql::release_abandoned(async move {
            let _writer = writes.writers.lock().await;
            let held = Codec::held(&claim.key, claim.token)?;
            sqlx::query_with(writes.queries.release.clone(), held)
                .execute(&writes.pool)
                .await?;
            Ok(())
        });
    }
}

async fn write_one(
    queries: &Queries,
    conn: &mut SqliteConnection,
    write: &Write,
) -> Result<Written, StoreError> {
    match write {
        Write::Claim(claim) => {
            let row = sqlx::query_with(queries.claim.clone(), Codec::claim(claim)?)
                .fetch_one(&mut *conn)
                .await?;
            Ok(Written::Claim(Codec::claim_outcome(&row)?))
        }
        Write::Complete {
            key,
            token,
            response,
        } => Ok(Written::Fenced(
            complete_on(queries, &mut *conn, key, *token, response).await?,
        )),
        Write::Release { key, token } => {
            let done = sqlx::query_with(queries.release.clone(), Codec::held(key, *token)?)
                .execute(&mut *conn)
                .await?;
            Ok(Written::Fenced(Fenced::from_rows(done.rows_affected())))
        }
        Write::Renew { key, token, lease } => {
            let done = sqlx::query_with(queries.renew.clone(), Codec::renew(key, *token, *lease)?)
                .execute(&mut *conn)
                .await?;
            Ok(Written::Fenced(Fenced::from_rows(done.rows_affected())))
        }
    }
}
