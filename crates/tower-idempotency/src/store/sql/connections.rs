//! The connections a SQL store's batches run on: a pool of the store's own beside the
//! application's, and the connections kept between batches.
//!
//! sqlx pings a connection when it takes it back: for PostgreSQL a network round trip, for
//! SQLite a hop to the connection's thread and back (two thread wake-ups), per batch. Under load
//! that costs as much as the batch's statement, so a connection whose batch succeeded is parked
//! here for the next batch instead. A parked connection goes back to its pool (and is pinged)
//! once it has run [`PARKED_BATCHES`] batches, so the pool's lifetime rules still apply to it,
//! or when it is taken after [`PARKED_FOR`] idle or after a failed batch; a batch that fails
//! drops its connection, which sqlx then tests.
//!
//! The pool is the store's own, made from the application pool's connect options, so batches
//! never wait behind the application's queries for a connection, and a parked connection never
//! holds one of the application's (a SQLite pool of one connection is common). A checkout does
//! not ping either, except for a connection that has been idle since a batch last failed: after
//! a cut network or a restarted server every idle connection may be dead, and each would fail
//! one more batch. A connection returned since then is alive, as sqlx pinged it on its return.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sqlx::{
    pool::{PoolConnection, PoolOptions},
    Connection, Database, Pool,
};

use crate::store::{error::StoreError, sql::batch::Batching, waiters::lock};

/// How many batches in a row a connection runs before it goes back to the pool.
const PARKED_BATCHES: u32 = 1_000;
/// How long a connection may wait parked; past this it goes back to the pool.
const PARKED_FOR: Duration = Duration::from_secs(10);

/// The batches' connections of one store (see the [module docs](self)).
pub(in crate::store) struct BatchConnections<DB: Database> {
    pool: Pool<DB>,
    failures: Arc<BatchFailures>,
    parked: Mutex<Vec<Parked<DB>>>,
}

/// A connection for one batch: [`BatchConnections::park`] it after the batch succeeded.
pub(in crate::store) struct BatchConnection<DB: Database> {
    connection: PoolConnection<DB>,
    /// The batches it ran since it left the pool.
    batches: u32,
    /// Inside a transaction its own statements opened (see [`Self::transaction_begun`]).
    in_transaction: bool,
}

impl<DB: Database> BatchConnection<DB> {
    /// The statements about to run open a transaction of their own (`BEGIN` inside a statement
    /// list, which sqlx does not see): until [`transaction_ended`](Self::transaction_ended), a
    /// drop closes the connection, which ends the transaction. A batch dropped part way (its
    /// timeout) would otherwise hand the connection back to the pool inside it, where on SQLite
    /// it holds the file's write lock from every other writer.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(in crate::store) fn transaction_begun(&mut self) {
        self.in_transaction = true;
    }

    /// The transaction of [`transaction_begun`](Self::transaction_begun) committed or rolled
    /// back: the connection may go back to the pool again.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(in crate::store) fn transaction_ended(&mut self) {
        self.in_transaction = false;
    }
}

impl<DB: Database> Drop for BatchConnection<DB> {
    fn drop(&mut self) {
        if self.in_transaction {
            self.connection.close_on_drop();
        }
    }
}

impl<DB: Database> std::ops::Deref for BatchConnection<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.connection
    }
}

impl<DB: Database> std::ops::DerefMut for BatchConnection<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.connection
    }
}

struct Parked<DB: Database> {
    connection: BatchConnection<DB>,
    since: Instant,
}

impl<DB: Database> BatchConnections<DB> {
    /// Batches on a pool of at most `max` connections made with `options` (the application
    /// pool's, adjusted by the store), opened on demand.
    pub(in crate::store) fn new(
        options: <DB::Connection as Connection>::Options,
        max: usize,
        batching: Batching,
    ) -> Self {
        let failures = Arc::new(BatchFailures::default());
        let suspect = failures.clone();
        let pool = PoolOptions::<DB>::new()
            .max_connections(u32::try_from(max.max(1)).unwrap_or(u32::MAX))
            .min_connections(0)
            // A batch past its timeout is abandoned; its connection may still be stuck.
            .acquire_timeout(batching.batch_timeout())
            // A ping on every checkout is a round trip per batch; a dead connection fails the
            // batch's statement instead, which answers 503 like any outage.
            .test_before_acquire(false)
            .before_acquire(move |connection, meta| {
                let suspect = suspect.since_idle(meta.idle_for);
                Box::pin(async move {
                    if suspect {
                        connection.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(options);
        Self {
            pool,
            failures,
            parked: Mutex::default(),
        }
    }

    /// The pool the batches' connections come from.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(in crate::store) fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// A parked connection still fit for a batch, or one from the pool.
    pub(in crate::store) async fn acquire(&self) -> Result<BatchConnection<DB>, StoreError>
    where
        StoreError: From<sqlx::Error>,
    {
        let (mut fit, mut unfit) = (None, Vec::new());
        {
            let mut parked = lock(&self.parked);
            while let Some(p) = parked.pop() {
                let idle = p.since.elapsed();
                if idle < PARKED_FOR && !self.failures.since_idle(idle) {
                    fit = Some(p.connection);
                    break;
                }
                unfit.push(p);
            }
        }
        // Dropped outside the lock: each goes back to the pool, which pings it.
        drop(unfit);
        match fit {
            Some(connection) => Ok(connection),
            None => Ok(BatchConnection {
                in_transaction: false,
                connection: self.pool.acquire().await?,
                batches: 0,
            }),
        }
    }

    /// Keep `connection`, whose batch succeeded, for the next batch.
    pub(in crate::store) fn park(&self, mut connection: BatchConnection<DB>) {
        connection.batches += 1;
        if connection.batches >= PARKED_BATCHES {
            return;
        }
        let mut parked = lock(&self.parked);
        // Checked under the lock `close` drains with, so nothing is parked after it drained.
        if !self.pool.is_closed() {
            parked.push(Parked {
                connection,
                since: Instant::now(),
            });
        }
    }

    /// A batch failed as a whole: its connection may be dead, and so may the idle ones.
    pub(in crate::store) fn failed(&self) {
        self.failures.note();
    }

    /// Close the pool, once every connection is back.
    pub(in crate::store) async fn close(&self) {
        // Marks the pool closed at once; it finishes when every connection is back.
        let closing = self.pool.close();
        let parked = std::mem::take(&mut *lock(&self.parked));
        drop(parked);
        closing.await;
    }
}

/// When a batch on the store's own connections last failed as a whole.
#[derive(Debug, Default)]
struct BatchFailures {
    last: Mutex<Option<Instant>>,
}

impl BatchFailures {
    fn note(&self) {
        *lock(&self.last) = Some(Instant::now());
    }

    /// Whether a connection idle for `idle_for` was already idle when a batch last failed.
    fn since_idle(&self, idle_for: Duration) -> bool {
        let last = *lock(&self.last);
        last.is_some_and(|failed| idle_for >= failed.elapsed())
    }
}
