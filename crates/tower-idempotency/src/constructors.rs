//! Every way to build an [`Idempotency`] layer for a given store, each behind its store's
//! feature, and the switch to [transactional mode](crate::transaction).

use crate::layer::Idempotency;

#[cfg(feature = "memory")]
impl Idempotency<crate::store::MemoryStore> {
    /// A layer over a new in-process [`MemoryStore`](crate::store::MemoryStore) of the default
    /// capacity. Expired records are removed as new ones come in, so no
    /// [`Sweeper`](crate::Sweeper) is needed.
    ///
    /// ```
    /// let layer = tower_idempotency::Idempotency::memory();
    /// # let _ = layer;
    /// ```
    pub fn memory() -> Self {
        Self::new(crate::store::MemoryStore::new())
    }
}

#[cfg(feature = "postgres")]
impl Idempotency<crate::store::postgres::PostgresStore> {
    /// A layer over a [`PostgresStore`](crate::store::postgres::PostgresStore) on `pool`.
    ///
    /// The table must exist: call [`PostgresStore::migrate`](crate::store::postgres::PostgresStore::migrate) first, or run the schema in the
    /// [module docs](crate::store::postgres) with your own migrations.
    ///
    /// ```no_run
    /// use tower_idempotency::{store::postgres::sqlx::PgPool, Idempotency};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = PgPool::connect("postgres://postgres@localhost/app").await?;
    /// let layer = Idempotency::postgres(pool);
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn postgres(pool: sqlx::PgPool) -> Self {
        Self::new(crate::store::postgres::PostgresStore::new(pool))
    }
}

#[cfg(feature = "sqlite")]
impl Idempotency<crate::store::sqlite::SqliteStore> {
    /// A layer over a [`SqliteStore`](crate::store::sqlite::SqliteStore) on `pool`.
    ///
    /// The table must exist: call [`SqliteStore::migrate`](crate::store::sqlite::SqliteStore::migrate) first, or run the schema in the
    /// [module docs](crate::store::sqlite) with your own migrations.
    ///
    /// ```no_run
    /// use tower_idempotency::{store::sqlite::sqlx::SqlitePool, Idempotency};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = SqlitePool::connect("sqlite://app.db?mode=rwc").await?;
    /// let layer = Idempotency::sqlite(pool);
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sqlite(pool: sqlx::SqlitePool) -> Self {
        Self::new(crate::store::sqlite::SqliteStore::new(pool))
    }
}

#[cfg(feature = "mysql")]
impl Idempotency<crate::store::mysql::MySqlStore> {
    /// A layer over a [`MySqlStore`](crate::store::mysql::MySqlStore) on `pool` (MySQL 8 or
    /// MariaDB).
    ///
    /// The table must exist: call [`MySqlStore::migrate`](crate::store::mysql::MySqlStore::migrate) first, or run the schema in the
    /// [module docs](crate::store::mysql) with your own migrations.
    ///
    /// ```no_run
    /// use tower_idempotency::{store::mysql::sqlx::MySqlPool, Idempotency};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = MySqlPool::connect("mysql://root@localhost/app").await?;
    /// let layer = Idempotency::mysql(pool);
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn mysql(pool: sqlx::MySqlPool) -> Self {
        Self::new(crate::store::mysql::MySqlStore::new(pool))
    }
}

#[cfg(feature = "redis")]
impl Idempotency<crate::store::redis::RedisStore> {
    /// A layer over a [`RedisStore`](crate::store::redis::RedisStore) on `client`, under the default prefix, connecting on first
    /// use (see [`RedisStore::lazy`](crate::store::redis::RedisStore::lazy)), with wait-mode notifications.
    ///
    /// ```
    /// use tower_idempotency::{store::redis::redis, Idempotency};
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let layer = Idempotency::redis(client)?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn redis(
        client: crate::store::redis::redis::Client,
    ) -> Result<Self, crate::store::StoreError> {
        Ok(Self::new(crate::store::redis::RedisStore::lazy(client)?))
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
impl<St: crate::store::TransactionalStore> Idempotency<St> {
    /// Switch to transactional mode: the handler gets an [`IdempotencyTransaction`](crate::IdempotencyTransaction) and its writes
    /// commit together with the saved response. See the [module docs](crate::transaction).
    pub fn transactional(self) -> Idempotency<St, crate::mode::Transactional> {
        self.into_mode()
    }
}

#[cfg(feature = "postgres")]
impl Idempotency<crate::store::postgres::PostgresStore> {
    /// Switch to single-commit mode: the claim, the handler's writes and the saved response
    /// commit once, in one transaction. For handlers whose work is all in the database; see the
    /// [module docs](crate::single_commit) for when to choose it.
    pub fn transactional_single_commit(
        self,
    ) -> Idempotency<crate::store::postgres::PostgresStore, crate::mode::single_commit::SingleCommit>
    {
        self.into_mode()
    }
}
