//! Transactional mode: the handler's writes and the saved response commit together.
//!
//! ```no_run
//! # #[cfg(all(feature = "postgres", feature = "axum"))] mod example {
//! use axum::{routing::post, Router};
//! use sqlx::Postgres;
//! use tower_idempotency::{Idempotency, IdempotencyTransaction};
//!
//! async fn create_order(tx: IdempotencyTransaction<Postgres>) -> Result<&'static str, String> {
//!     let mut tx = tx.begin().await.map_err(|e| e.to_string())?;
//!     sqlx::query("INSERT INTO orders (total_cents) VALUES (4000)")
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|e| e.to_string())?;
//!     Ok("created") // the layer saves this answer in the same transaction, then commits
//! }
//!
//! fn app(pool: sqlx::PgPool) -> Router {
//!     Router::new()
//!         .route("/orders", post(create_order))
//!         .route_layer(Idempotency::postgres(pool).transactional())
//! }
//! # }
//! ```
//!
//! The layer claims the key first (committed on its own, so duplicates see it at once), then the
//! handler begins the transaction on its first call to [`IdempotencyTransaction::begin`]: a handler
//! that first calls a slow payment provider holds no pooled connection (and no SQLite write lock)
//! meanwhile. The transaction begins on an idle connection of the pool when there is one, without
//! the pool's checkout ping: the `BEGIN` tells as much, and a connection that died while idle
//! fails it and is replaced by one checked out as the pool's options say (the pool's
//! `before_acquire` hook does not run for a connection taken idle). When the handler answers, the
//! layer saves the response inside the transaction, checking the fencing token, and commits. So:
//!
//! - a crash before the commit rolls back the work and the saved answer together; the lease then
//!   frees the key and the retry does the work exactly once;
//! - a handler that lost its lease to a retry cannot commit: its transaction rolls back and its
//!   client gets 409 with `Retry-After`;
//! - a response that is not saved (408, 425, 429, 503 by default), an inner service error and a
//!   panic roll the transaction back and release the key;
//! - a handler that answers without beginning the transaction (an answer that wrote nothing, or
//!   work done elsewhere) has its answer saved on its own, as in standard mode: should that save
//!   fail, nothing is rolled back, so the answer is still sent and the key kept for its lease.
//!
//! On PostgreSQL, a handler whose work is all in the database (no slow call before its writes)
//! can also make the claim inside that transaction and commit once:
//! [`transactional_single_commit`](crate::Idempotency::transactional_single_commit) (see
//! `single_commit`). On SQLite the transaction begins with `BEGIN IMMEDIATE` and waits its turn
//! behind the store's other writes in this process (see the SQLite store's docs).

use std::{fmt, sync::Arc, time::Duration};

use http::Extensions;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::{Mode, Save, SaveFailure, Sealed};
use crate::{
    error::Rejection,
    store::{
        bounded,
        writers::{self, TransactionTurn, WriterQueue},
        Fenced, StoreError, TransactionalStore,
    },
};

/// The mode of a layer built with [`Idempotency::transactional`](crate::Idempotency::transactional).
#[derive(Debug, Clone, Copy, Default)]
pub struct Transactional;

impl Sealed for Transactional {}

enum TxState<DB: sqlx::Database> {
    NotBegun(Begin<DB>),
    /// The open transaction, and its turn in the store's writer queue.
    Open(sqlx::Transaction<'static, DB>, Option<TransactionTurn<DB>>),
    Finished,
}

/// How the handler's transaction begins.
struct Begin<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    statement: Option<&'static str>,
    writers: Option<WriterQueue<DB>>,
}

/// The handler's side of the idempotency transaction (an axum extractor with the `axum` feature).
///
/// Clone it freely: every clone is the same transaction. Call [`begin`](Self::begin) when the
/// handler is ready to write; the transaction is opened on the first call and reused after.
pub struct IdempotencyTransaction<DB: sqlx::Database> {
    state: Arc<Mutex<TxState<DB>>>,
}

impl<DB: sqlx::Database> Clone for IdempotencyTransaction<DB> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
        }
    }
}

impl<DB: sqlx::Database> fmt::Debug for IdempotencyTransaction<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyTransaction")
            .finish_non_exhaustive()
    }
}

/// A locked handle on the open transaction. It derefs to the transaction's connection, so
/// `&mut *guard` is an executor (as `&mut *tx` is for a `sqlx::Transaction`), and a savepoint is
/// `sqlx::Acquire::begin(&mut *guard)`.
///
/// Hold it only while writing; the layer takes the transaction back after the handler answers.
pub struct TransactionGuard<DB: sqlx::Database>(OwnedMutexGuard<TxState<DB>>);

impl<DB: sqlx::Database> std::ops::Deref for TransactionGuard<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &Self::Target {
        match &*self.0 {
            TxState::Open(tx, _) => tx,
            // `begin` hands out a guard only after opening the transaction, under the same lock.
            _ => unreachable!("a TransactionGuard always holds an open transaction"),
        }
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for TransactionGuard<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match &mut *self.0 {
            TxState::Open(tx, _) => tx,
            _ => unreachable!("a TransactionGuard always holds an open transaction"),
        }
    }
}

impl<DB: sqlx::Database> fmt::Debug for TransactionGuard<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionGuard").finish_non_exhaustive()
    }
}

impl<DB: sqlx::Database> IdempotencyTransaction<DB> {
    /// A transaction the layer has already begun (single-commit mode).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn open(tx: sqlx::Transaction<'static, DB>) -> Self {
        Self {
            state: Arc::new(Mutex::new(TxState::Open(tx, None))),
        }
    }

    /// The open transaction, for the layer's own statements before the handler runs.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) async fn open_guard(&self) -> Option<TransactionGuard<DB>> {
        let state = self.state.clone().lock_owned().await;
        matches!(&*state, TxState::Open(..)).then(|| TransactionGuard(state))
    }

    fn new(begin: Begin<DB>) -> Self {
        Self {
            state: Arc::new(Mutex::new(TxState::NotBegun(begin))),
        }
    }

    /// The transaction, begun on the first call.
    ///
    /// Fails if the database cannot begin a transaction, or if the layer already finished the
    /// attempt (the guard was kept past the handler, for example in a spawned task).
    pub async fn begin(&self) -> Result<TransactionGuard<DB>, sqlx::Error> {
        let mut state = self.state.clone().lock_owned().await;
        if let TxState::NotBegun(begin) = &*state {
            // Queue behind this process's other writers first, holding no connection meanwhile;
            // the transaction before may have begun this one.
            let (turn, begun) = match &begin.writers {
                Some(writers) => {
                    let (turn, begun) = writers.transaction_turn().await;
                    (Some(turn), begun)
                }
                None => (None, None),
            };
            let tx = match begun {
                Some(tx) => tx,
                None => begin_transaction(&begin.pool, begin.statement).await?,
            };
            *state = TxState::Open(tx, turn);
        }
        match &*state {
            TxState::Open(..) => Ok(TransactionGuard(state)),
            _ => Err(sqlx::Error::Protocol(
                "the idempotency transaction is finished: use it only inside the handler".into(),
            )),
        }
    }

    /// Take the transaction out (with the writer queue it holds, to be dropped after the
    /// commit or rollback), leaving `Finished`: nothing can use it after the layer does.
    async fn take(&self) -> Option<(sqlx::Transaction<'static, DB>, Option<TransactionTurn<DB>>)> {
        let mut state = self.state.lock().await;
        match std::mem::replace(&mut *state, TxState::Finished) {
            TxState::Open(tx, writer) => Some((tx, writer)),
            _ => None,
        }
    }
}

impl<St: TransactionalStore> Mode<St> for Transactional {
    type RunState = IdempotencyTransaction<St::Database>;

    fn begin_run(
        store: &Arc<St>,
        extensions: &mut Extensions,
        _: Option<Self::RunState>,
    ) -> Self::RunState {
        let tx = IdempotencyTransaction::new(Begin {
            pool: store.pool().clone(),
            statement: St::BEGIN,
            writers: store.writer_queue(),
        });
        extensions.insert(tx.clone());
        tx
    }

    fn begin_unguarded(store: &Arc<St>, extensions: &mut Extensions) -> Self::RunState {
        <Self as Mode<St>>::begin_run(store, extensions, None)
    }

    async fn end_unguarded(
        run: Self::RunState,
        keep: bool,
        limit: Duration,
    ) -> Result<(), StoreError> {
        if !keep {
            <Self as Mode<St>>::abandon(run, limit).await;
            return Ok(());
        }
        let Some((tx, turn)) = run.take().await else {
            return Ok(());
        };
        let queued = turn.is_some();
        let committed = bounded("the commit", limit, async { Ok(tx.commit().await?) }).await;
        drop(turn);
        if queued {
            writers::yield_to_next_writer().await;
        }
        committed
    }

    async fn save_with_work(
        run: Self::RunState,
        save: Save<'_, St>,
    ) -> Option<Result<Fenced, StoreError>> {
        // `None`: the handler never began the transaction, so there is no work to commit with.
        let (tx, turn) = run.take().await?;
        Some(save_and_commit(tx, turn, save).await)
    }

    async fn abandon(run: Self::RunState, limit: Duration) {
        if let Some((tx, _writer)) = run.take().await {
            let rollback = bounded("the rollback", limit, async { Ok(tx.rollback().await?) });
            if let Err(err) = rollback.await {
                tracing::warn!(target: "tower_idempotency", error = %crate::observe::Chain(&err), "rolling back the idempotency transaction failed; the connection is discarded");
            }
        }
    }

    /// The work was rolled back with the save, or for a commit cut on its way may have landed
    /// (`CommitUnconfirmed`, decided in `service/unsaved.rs`): the client gets 409 (fenced out)
    /// or 503.
    fn unsaved(failure: &SaveFailure<'_>, retry_after: Duration) -> Option<Rejection> {
        Some(match failure {
            SaveFailure::FencedOut => Rejection::LeaseLost { retry_after },
            SaveFailure::Failed(err) => Rejection::for_store_error(err),
        })
    }
}

/// Begin a transaction on `pool` with `statement` (`BEGIN` when `None`), on an idle connection
/// without the checkout test when the pool has one.
///
/// A pool with `test_before_acquire` (sqlx's default) pings every connection it hands out, and
/// the transaction's `BEGIN` is one more round trip right after: two per transaction where one
/// tells as much, since a dead connection fails the `BEGIN` as surely as the ping. An idle
/// connection was alive when it went back (sqlx pings every connection it takes back), so it is
/// taken as it is; if its `BEGIN` fails (a connection that died while idle), it is dropped and
/// the transaction begins on a connection checked out as the pool's options say. The pool's
/// `before_acquire` hook does not run for a connection taken idle; with `test_before_acquire`
/// off, every transaction is checked out as the pool's options say.
pub(crate) async fn begin_transaction<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    statement: Option<&'static str>,
) -> Result<sqlx::Transaction<'static, DB>, sqlx::Error> {
    if pool.options().get_test_before_acquire() {
        let idle = match statement {
            Some(statement) => pool.try_begin_with(statement).await,
            None => pool.try_begin().await,
        };
        match idle {
            Ok(Some(tx)) => return Ok(tx),
            Ok(None) => {}
            Err(err) => {
                tracing::debug!(target: "tower_idempotency", error = %err, "an idle connection failed to begin the transaction; checking one out");
            }
        }
    }
    match statement {
        Some(statement) => pool.begin_with(statement).await,
        None => pool.begin().await,
    }
}

/// Save the response in the handler's transaction, checked against the token, then commit; a
/// record taken over in the meantime rolls the work back instead.
async fn save_and_commit<St: TransactionalStore>(
    tx: sqlx::Transaction<'static, St::Database>,
    turn: Option<TransactionTurn<St::Database>>,
    save: Save<'_, St>,
) -> Result<Fenced, StoreError> {
    let Save {
        store,
        hold,
        response,
        limit,
    } = save;
    let queued = turn.is_some();
    let saved = store
        .complete_and_commit(tx, turn, hold, response, limit)
        .await;
    if queued {
        writers::yield_to_next_writer().await;
    }
    saved
}

#[cfg(feature = "axum")]
mod extract {
    use axum_core::extract::FromRequestParts;
    use http::request::Parts;

    use super::IdempotencyTransaction;
    use crate::extract::MissingExtension;

    impl<S: Send + Sync, DB: sqlx::Database> FromRequestParts<S> for IdempotencyTransaction<DB> {
        type Rejection = MissingExtension;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<IdempotencyTransaction<DB>>()
                .cloned()
                .ok_or(MissingExtension {
                    what: "idempotency transaction",
                    hint: "is the handler behind a layer built with Idempotency::transactional(), on a method the layer covers?",
                })
        }
    }
}
