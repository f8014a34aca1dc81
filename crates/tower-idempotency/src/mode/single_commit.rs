//! Single-commit mode (PostgreSQL): the claim, the handler's writes and the saved answer commit
//! once, in one transaction.
//!
//! ```no_run
//! # #[cfg(feature = "axum")] mod example {
//! use axum::{routing::post, Router};
//! use sqlx::Postgres;
//! use tower_idempotency::{Idempotency, IdempotencyTransaction};
//!
//! async fn create_order(tx: IdempotencyTransaction<Postgres>) -> Result<&'static str, String> {
//!     let mut tx = tx.begin().await.map_err(|e| e.to_string())?; // already open: no round trip
//!     sqlx::query("INSERT INTO orders (total_cents) VALUES (4000)")
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|e| e.to_string())?;
//!     Ok("created") // saved in the same transaction, then one COMMIT
//! }
//!
//! fn app(pool: sqlx::PgPool) -> Router {
//!     Router::new()
//!         .route("/orders", post(create_order))
//!         .route_layer(Idempotency::postgres(pool).transactional_single_commit())
//! }
//! # }
//! ```
//!
//! The layer first reads the key's committed record, outside any transaction and in one
//! statement with the other requests reading at the same moment: a replay, a mismatch (422) or a
//! key held under another mode's lease (409) is answered from it without a `BEGIN`. Otherwise
//! the layer begins the transaction before the handler runs and claims the key inside it,
//! under a transaction-scoped advisory lock on the key's hash taken without waiting
//! (`pg_try_advisory_xact_lock`). The lock is the "running" marker: a duplicate that arrives
//! meanwhile cannot take it and gets 409 at once (it never waits on the uncommitted row); a
//! committed record is the memory, replayed or answered 422 as in the other modes. The handler
//! gets the same [`IdempotencyTransaction`] as in [transactional mode](crate::transaction), already
//! open; the layer saves the answer in it and commits once. A crash anywhere rolls everything
//! back, claim included, so there is no lease to renew and nothing to release: a retry runs at
//! once.
//!
//! Against [`transactional`](crate::Idempotency::transactional) mode this saves the claim's own
//! connection checkout and commit (one WAL flush instead of two per first-time key).
//!
//! # When to choose it
//!
//! - **Yes**: handlers whose work is all in this database (insert the order, update the stock),
//!   quick from start to end.
//! - **No**: handlers that call something slow before their writes (a payment provider, another
//!   service). The transaction, and with it a pooled connection, is open for the whole handler,
//!   so a slow call holds a connection per request; use transactional mode, whose transaction
//!   begins only at the handler's first write. Nor for handlers with effects outside the
//!   database: a rollback cannot undo them, and without a committed claim a retry of a crashed
//!   attempt runs again at once.
//!
//! Details: a duplicate of a running single-commit attempt gets `Retry-After: 1` (an
//! uncommitted claim has no lease to estimate from) after the read and a `BEGIN`; wait mode polls
//! every [`WAIT_POLL_INTERVAL`] (an uncommitted claim cannot be watched); a first-time key waits
//! for the read before its `BEGIN`. The advisory lock key is the first 8 bytes of the key's
//! SHA-256 hash: an application that takes advisory locks of its own on `bigint` keys shares
//! that space (a collision makes a request wait for nothing and answer 409, never a wrong
//! answer).

use std::{sync::Arc, time::Duration};

use http::Extensions;
use sqlx::Postgres;

use super::{
    transactional::{begin_transaction, IdempotencyTransaction, Transactional},
    Mode, Save, SaveFailure, Sealed,
};
use crate::{
    config::WAIT_POLL_INTERVAL,
    error::Rejection,
    key::KeyHash,
    store::{postgres::PostgresStore, Claim, ClaimOutcome, Fenced, StoreError, TransactionalStore},
};

/// The mode of a layer built with [`Idempotency::transactional_single_commit`](crate::Idempotency::transactional_single_commit).
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleCommit;

impl Sealed for SingleCommit {}

impl Mode<PostgresStore> for SingleCommit {
    type RunState = IdempotencyTransaction<Postgres>;
    const LEASED: bool = false;

    async fn claim(
        store: &Arc<PostgresStore>,
        claim: &Claim,
    ) -> Result<(ClaimOutcome, Option<Self::RunState>), StoreError> {
        // A committed record answers as it would inside the transaction; only a key with no
        // live record needs the transaction and its claim.
        if let Some(answer) = store.answer_without_claiming(claim).await? {
            return Ok((answer, None));
        }
        let tx = begin_transaction(TransactionalStore::pool(store.as_ref()), None).await?;
        let run = IdempotencyTransaction::open(tx);
        let outcome = {
            let Some(mut tx) = run.open_guard().await else {
                unreachable!("a transaction opened above is open");
            };
            store.claim_in(&mut tx, claim).await?
        };
        Ok(match outcome {
            ClaimOutcome::Claimed { taken_over } => {
                (ClaimOutcome::Claimed { taken_over }, Some(run))
            }
            // Another transaction holds the key; there is no lease to estimate from.
            ClaimOutcome::InFlight { lease_remaining } if lease_remaining.is_zero() => (
                ClaimOutcome::InFlight {
                    lease_remaining: WAIT_POLL_INTERVAL,
                },
                None,
            ),
            // Dropping the run rolls the read-only transaction back.
            other => (other, None),
        })
    }

    async fn wait(_: &PostgresStore, _: &KeyHash, pause: Duration) {
        tokio::time::sleep(pause).await;
    }

    fn begin_run(
        _: &Arc<PostgresStore>,
        extensions: &mut Extensions,
        claimed: Option<Self::RunState>,
    ) -> Self::RunState {
        let tx = claimed.expect("single-commit claims return their transaction");
        extensions.insert(tx.clone());
        tx
    }

    /// Without a claim there is nothing to claim inside the transaction: the handler's
    /// transaction begins when it asks, as in transactional mode.
    fn begin_unguarded(store: &Arc<PostgresStore>, extensions: &mut Extensions) -> Self::RunState {
        <Transactional as Mode<PostgresStore>>::begin_unguarded(store, extensions)
    }

    async fn end_unguarded(
        run: Self::RunState,
        keep: bool,
        limit: Duration,
    ) -> Result<(), StoreError> {
        <Transactional as Mode<PostgresStore>>::end_unguarded(run, keep, limit).await
    }

    async fn save_with_work(
        run: Self::RunState,
        save: Save<'_, PostgresStore>,
    ) -> Option<Result<Fenced, StoreError>> {
        <Transactional as Mode<PostgresStore>>::save_with_work(run, save).await
    }

    async fn abandon(run: Self::RunState, limit: Duration) {
        <Transactional as Mode<PostgresStore>>::abandon(run, limit).await;
    }

    fn unsaved(failure: &SaveFailure<'_>, retry_after: Duration) -> Option<Rejection> {
        <Transactional as Mode<PostgresStore>>::unsaved(failure, retry_after)
    }
}
