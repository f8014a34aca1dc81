//! The behaviour suite (`tower_idempotency_tests::suite`) against every store, over real HTTP.
//!
//! One body per behaviour, instantiated for each backend by [`behaviour_tests!`]
//! (tower-sessions-stores' `route_tests!` idea). Each backend module supplies `store()`, which
//! makes a fresh store: a new database (migrated) or a new Redis key prefix.
//!
//! The store-down and transactional tests are backend-specific and live in their own modules.
//!
//! Run with `DATABASE_URL` and `REDIS_URL` set (see `scripts/test.sh`).

use std::time::Duration;

use tower_idempotency_tests::suite;

/// No test may take longer than this, whatever hangs.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Instantiate every suite test in the calling module, against its `store()`.
macro_rules! behaviour_tests {
    () => {
        behaviour_tests!(
            five_concurrent_attempts_execute_once,
            fifty_concurrent_attempts_execute_once,
            two_instances_execute_each_key_once,
            missing_key_is_400_problem,
            empty_key_is_400,
            key_over_255_bytes_is_400,
            key_with_control_char_is_400,
            two_key_headers_are_400,
            quoted_and_bare_key_are_the_same_key,
            body_over_limit_is_413_and_claims_nothing,
            chunked_body_over_limit_is_413_and_claims_nothing,
            same_key_other_body_is_422,
            same_key_other_path_is_422,
            mismatch_while_running_is_422,
            reordered_json_is_replayed,
            get_passes_through_without_key,
            handler_500_is_saved_and_replayed,
            handler_429_releases_the_key,
            handler_503_releases_the_key,
            inner_error_releases_the_key,
            panicking_handler_releases_the_key,
            other_authorization_is_an_independent_key,
            empty_authorization_scopes_like_absent,
            optional_layer_passes_keyless_requests_through,
            lapsed_lease_is_taken_over_and_stale_holder_fenced,
            slow_handler_is_not_taken_over_while_alive,
            retry_after_reflects_default_lease,
            retry_after_reflects_configured_lease,
            client_disconnect_still_records_the_answer,
            replay_keeps_resource_headers_only,
            wait_mode_replays_to_concurrent_attempts,
            wait_mode_bound_falls_back_to_409,
            key_is_checked_before_the_body,
            patch_is_covered_put_is_not,
            handler_408_and_425_release_the_key,
            custom_save_policy_decides_what_is_saved,
            expired_record_is_claimed_afresh,
            takeover_keeps_the_original_expiry,
        );
    };
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store = store().await;
                suite::bounded(TEST_TIMEOUT, stringify!($name), suite::$name(store)).await;
            }
        )*
    };
}

mod memory {
    use super::*;
    use tower_idempotency::store::MemoryStore;

    async fn store() -> MemoryStore {
        MemoryStore::new()
    }

    behaviour_tests!();
}

mod postgres {
    use super::*;

    async fn store() -> tower_idempotency::store::postgres::PostgresStore {
        super::postgres_store().await
    }

    behaviour_tests!();
}

mod sqlite {
    use super::*;

    async fn store() -> tower_idempotency::store::sqlite::SqliteStore {
        super::sqlite_store().await
    }

    behaviour_tests!();
}

mod redis {
    use super::*;
    use tower_idempotency::store::redis::RedisStore;
    use tower_idempotency_tests::{redis_client, unique_name};

    /// A store (with wait-mode notifications) under a key prefix of its own.
    async fn store() -> RedisStore {
        RedisStore::connect(redis_client())
            .await
            .expect("connect to REDIS_URL")
            .with_prefix(unique_name("behaviour"))
    }

    behaviour_tests!();
}

/// A store that cannot be reached: 503 by default (handler not called), the handler with
/// `.fail_open()`.
mod store_down {
    use super::*;
    use tower_idempotency::store::{
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
        let proxy = suite::Proxy::start(url).await;
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

    macro_rules! down_tests {
        ($($name:ident => $store:expr),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let store = $store;
                    let what = stringify!($name);
                    if what.ends_with("fail_open") {
                        suite::bounded(TEST_TIMEOUT, what, suite::store_down_fail_open_calls_the_handler(store)).await;
                    } else {
                        suite::bounded(TEST_TIMEOUT, what, suite::store_down_fails_closed(store)).await;
                    }
                }
            )*
        };
    }

    down_tests!(
        postgres_fails_closed => postgres_down(),
        postgres_fail_open => postgres_down(),
        sqlite_fails_closed => sqlite_down(),
        sqlite_fail_open => sqlite_down(),
        redis_fails_closed => redis_down().await,
        redis_fail_open => redis_down().await,
        redis_never_up_fails_closed => redis_never_up(),
        redis_never_up_fail_open => redis_never_up(),
    );
}

/// Transactional mode on the SQL stores: the handler's writes commit with the saved answer.
mod transactional {
    use super::*;

    macro_rules! transactional_tests {
        ($backend:ident => $store:expr; $($name:ident),* $(,)?) => {
            mod $backend {
                use super::*;
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        let store = $store;
                        suite::bounded(TEST_TIMEOUT, stringify!($name), suite::$name(store)).await;
                    }
                )*
            }
        };
    }

    transactional_tests!(postgres => super::super::postgres_store().await;
        transactional_commit_saves_row_and_answer,
        transactional_503_rolls_back_and_releases,
        transactional_without_begin_is_saved,
        transactional_lease_lost_rolls_back_with_409,
        transactional_panic_rolls_back_and_releases,
    );

    transactional_tests!(sqlite => super::super::sqlite_store().await;
        transactional_commit_saves_row_and_answer,
        transactional_503_rolls_back_and_releases,
        transactional_without_begin_is_saved,
        transactional_lease_lost_rolls_back_with_409,
        transactional_panic_rolls_back_and_releases,
    );
}

/// A migrated PostgreSQL store on a database of its own.
async fn postgres_store() -> tower_idempotency::store::postgres::PostgresStore {
    let pool = tower_idempotency_tests::fresh_postgres_pool(16).await;
    let store = tower_idempotency::store::postgres::PostgresStore::new(pool);
    store.migrate().await.expect("migrate the fresh database");
    store
}

/// A migrated SQLite store on a fresh database file.
async fn sqlite_store() -> tower_idempotency::store::sqlite::SqliteStore {
    let pool = tower_idempotency_tests::fresh_sqlite_pool(8).await;
    let store = tower_idempotency::store::sqlite::SqliteStore::new(pool);
    store.migrate().await.expect("migrate the fresh database");
    store
}
