//! The behaviour suite (`tower_idempotency_tests::suite`) against every store, over real HTTP.
//!
//! One body per behaviour, instantiated for each backend by `behaviour_tests!`, whose list lives
//! in the suite next to the bodies (tower-sessions-stores' `route_tests!` idea): every store runs
//! every behaviour. Each backend passes an expression that makes a fresh store: a new database
//! (migrated) or a new Redis key prefix.
//!
//! Each backend runs the suite in the default mode; `modes` runs it again in transactional mode
//! (PostgreSQL, SQLite, MySQL) and single-commit mode (PostgreSQL): `behaviour_tests!(store, mode)`.
//!
//! The store-down and transactional tests are backend-specific and live in their own modules.
//!
//! Run with `DATABASE_URL`, `MYSQL_URL` and `REDIS_URL` set (see `scripts/test.sh`).

use std::time::Duration;

use tower_idempotency_tests::{
    behaviour_tests, store_down_tests, stores, suite, transactional_tests,
};

mod memory {
    use super::*;
    behaviour_tests!(stores::memory_store().await);
}

mod postgres {
    use super::*;
    behaviour_tests!(stores::postgres_store().await);
}

mod sqlite {
    use super::*;
    behaviour_tests!(stores::sqlite_store().await);
}

mod mysql {
    use super::*;
    behaviour_tests!(stores::mysql_store().await);
}

mod redis {
    use super::*;
    behaviour_tests!(stores::redis_store().await);
}

/// The whole suite again with the layer in transactional mode (the handlers never begin the
/// transaction) on the SQL stores, and in single-commit mode on PostgreSQL. Where a mode's
/// contract differs by design, the body asserts that mode's (`suite::flavour::Contract`); no
/// behaviour is skipped.
mod modes {
    use super::*;

    mod transactional_postgres {
        use super::*;
        behaviour_tests!(stores::postgres_store().await, transactional);
    }

    mod transactional_sqlite {
        use super::*;
        behaviour_tests!(stores::sqlite_store().await, transactional);
    }

    mod transactional_mysql {
        use super::*;
        behaviour_tests!(stores::mysql_store().await, transactional);
    }

    mod single_commit_postgres {
        use super::*;
        behaviour_tests!(stores::postgres_store().await, single_commit);
    }

    /// The SQL stores on a table of another name (`with_table`): the statements of every mode
    /// (single commit's locked claim, the transactional saves, wait mode's watch) name it.
    mod single_commit_postgres_on_another_table {
        use super::*;
        behaviour_tests!(
            stores::postgres_store_on_another_table().await,
            single_commit
        );
    }

    mod transactional_sqlite_on_another_table {
        use super::*;
        behaviour_tests!(stores::sqlite_store_on_another_table().await, transactional);
    }

    mod transactional_mysql_on_another_table {
        use super::*;
        behaviour_tests!(stores::mysql_store_on_another_table().await, transactional);
    }
}

/// PostgreSQL on a table of another name, in standard mode (batched claims and writes, the
/// `LISTEN` watch of wait mode).
mod postgres_on_another_table {
    use super::*;
    behaviour_tests!(stores::postgres_store_on_another_table().await);
}

/// A store that cannot be reached: 503 by default (handler not called), the handler with
/// `.fail_open()`.
mod store_down {
    use super::*;
    use tower_idempotency::store::{
        mysql::{sqlx::mysql::MySqlPoolOptions, MySqlStore},
        postgres::{sqlx::postgres::PgPoolOptions, PostgresStore},
        redis::{
            redis::{self, aio::ConnectionManagerConfig},
            RedisStore,
        },
        sqlite::{
            sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions},
            SqliteStore,
        },
    };
    use tower_idempotency_tests::{redis_url, unique_name};

    /// A pool on a closed port (nothing listens on 127.0.0.1:1); nothing connects until used.
    fn postgres_down() -> PostgresStore {
        let pool = PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy("postgres://postgres@127.0.0.1:1/down")
            .expect("a valid url");
        PostgresStore::new(pool)
    }

    /// A MySQL pool on a closed port; nothing connects until used.
    fn mysql_down() -> MySqlStore {
        let pool = MySqlPoolOptions::new()
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy("mysql://root@127.0.0.1:1/down")
            .expect("a valid url");
        MySqlStore::new(pool)
    }

    /// A pool on a file in a directory that does not exist: every connection fails.
    fn sqlite_down() -> SqliteStore {
        let path = std::env::temp_dir()
            .join(unique_name("no_such_dir"))
            .join("down.db");
        let pool = SqlitePoolOptions::new()
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy_with(SqliteConnectOptions::new().filename(path));
        SqliteStore::new(pool)
    }

    /// A store connected to the real Redis through a proxy, which is then shut down: the
    /// server goes away under a live store.
    async fn redis_down() -> RedisStore {
        let url: std::net::SocketAddr = redis_url()
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .parse()
            .expect("REDIS_URL is redis://IP:PORT");
        let proxy = suite::store_down::Proxy::start(url).await;
        let client = redis::Client::open(format!("redis://{}", proxy.addr())).unwrap();
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(500)));
        let manager = redis::aio::ConnectionManager::new_with_config(client, config)
            .await
            .expect("connect through the proxy");
        proxy.shutdown().await;
        RedisStore::new(manager).with_prefix(unique_name("down"))
    }

    /// A store built while nothing listens at its address: the application starts anyway.
    fn redis_never_up() -> RedisStore {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("a valid url");
        RedisStore::lazy(client)
            .expect("a lazy store needs no server")
            .with_prefix(unique_name("never"))
    }

    store_down_tests!(
        postgres => postgres_down(),
        sqlite => sqlite_down(),
        mysql => mysql_down(),
        redis_gone => redis_down().await,
        redis_never_up => redis_never_up(),
    );
}

/// Transactional mode with `.fail_open()` on SQL stores whose table was never made: the claims
/// fail while the database works, and each handler runs in its own transaction.
mod claims_fail_while_the_database_works {
    use super::*;
    use tower_idempotency::store::{
        mysql::MySqlStore, postgres::PostgresStore, sqlite::SqliteStore,
    };
    use tower_idempotency_tests::{
        fresh_mysql_pool, fresh_postgres_pool, fresh_sqlite_pool, Isolation,
    };

    mod postgres {
        use super::*;
        transactional_tests!(claims_fail: PostgresStore::new(fresh_postgres_pool(4).await));
    }

    mod sqlite {
        use super::*;
        transactional_tests!(claims_fail: SqliteStore::new(fresh_sqlite_pool(4).await));
    }

    mod mysql {
        use super::*;
        transactional_tests!(claims_fail: MySqlStore::new(
            fresh_mysql_pool(4, Isolation::RepeatableRead).await
        ));
    }
}

/// Transactional mode on the SQL stores: the handler's writes commit with the saved answer.
mod transactional {
    use super::*;

    mod postgres {
        use super::*;
        // Deferred constraints: a COMMIT can fail after the save applied.
        transactional_tests!(stores::postgres_store().await, deferred);
    }

    mod sqlite {
        use super::*;
        // Deferred constraints: a COMMIT can fail after the save applied.
        transactional_tests!(stores::sqlite_store().await, deferred);
    }

    mod mysql {
        use super::*;
        transactional_tests!(stores::mysql_store().await);
    }
}
