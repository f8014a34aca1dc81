//! Shared helpers: fresh databases, Redis prefixes, and the child process of the crash tests.
//!
//! URLs are read at run time; a missing variable fails the test with the variable's name.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::{process::Stdio, time::Duration};

#[cfg(feature = "sqlx")]
use sqlx::Executor;
#[cfg(feature = "sqlite")]
use sqlx::SqlitePool;
#[cfg(feature = "postgres")]
use sqlx::{postgres::PgPoolOptions, PgPool};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The environment variable that turns a crash test into the crash's child process; its value
/// says which database (a PostgreSQL URL, an SQLite path, a Redis prefix) the child works on.
pub const CHILD_ENV: &str = "CONSUMER_CRASH_CHILD";

/// What the child prints once the work is done and the commit is all that remains.
pub const READY: &str = "WORK-DONE-NOT-COMMITTED";

/// How many deliveries the concurrency tests start at once.
pub const DELIVERIES: usize = 10;

#[allow(unused_imports)] // each test binary uses its own part
pub use tower_idempotency_testkit::{postgres_url, redis_url, unique_name};

/// What the brokers' tests publish: an event id (or none) and a body, each once.
pub const MESSAGES: [(Option<&str>, &str); 3] = [
    (Some("evt_ok"), "ok"),
    (Some("evt_poison"), "poison"),
    (None, "no id"),
];

/// One delivery as a broker integration handled it (the same type behind both brokers).
#[cfg(feature = "nats")]
pub use tower_idempotency_consumer::nats::{Handled, Settlement};
#[cfg(all(feature = "rabbitmq", not(feature = "nats")))]
pub use tower_idempotency_consumer::rabbitmq::{Handled, Settlement};
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub use tower_idempotency_consumer::REQUEUE_PAUSE;

/// A requeued event comes back no sooner than [`REQUEUE_PAUSE`] after it was received (less
/// 100 ms for the clocks): redeliveries do not spin through a queue's delivery limit.
/// `received` holds each delivery's event id and when it was received, in order.
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub fn assert_requeues_wait(received: &[(String, tokio::time::Instant)]) {
    let mut checked = 0;
    for (i, (id, at)) in received.iter().enumerate() {
        if let Some((_, again)) = received[i + 1..].iter().find(|(next, _)| next == id) {
            let gap = again.duration_since(*at);
            assert!(
                gap >= REQUEUE_PAUSE - Duration::from_millis(100),
                "{id} came back {gap:?} after it was received"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no event came back: {received:?}");
}

/// Checks the brokers' tests' five deliveries (`evt_ok` once, `evt_poison` three times, one
/// without an id, all done with [`record_unless_poison`]): `evt_ok` processed and acked, the
/// poison requeued twice and then parked and acked, the one without an id rejected. Returns the
/// poison's deliveries in order, for what each broker says of redeliveries.
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub fn assert_each_settlement(seen: &[Handled<(), sqlx::Error>]) -> Vec<&Handled<(), sqlx::Error>> {
    use tower_idempotency_consumer::{Error, Outcome};
    let of = |id: &str| seen.iter().filter(|s| s.event_id == id).collect::<Vec<_>>();
    let ok = of("evt_ok");
    assert_eq!(ok.len(), 1, "{seen:?}");
    assert!(matches!(ok[0].result, Ok(Outcome::Processed(()))));
    assert_eq!(ok[0].settlement, Settlement::Acked);
    let poison = of("evt_poison");
    assert_eq!(poison.len(), 3, "{seen:?}");
    for attempt in &poison[..2] {
        assert!(matches!(attempt.result, Err(Error::Work(_))), "{attempt:?}");
        assert_eq!(attempt.settlement, Settlement::Requeued);
    }
    assert!(
        matches!(poison[2].result, Err(Error::Parked(_))),
        "{seen:?}"
    );
    assert_eq!(poison[2].settlement, Settlement::Acked);
    let no_id = of("");
    assert_eq!(no_id.len(), 1, "{seen:?}");
    assert!(matches!(no_id[0].result, Err(Error::MissingEventId)));
    assert_eq!(no_id[0].settlement, Settlement::Rejected);
    poison
}

/// The brokers' tests' work: a `poison` body fails (the attempt rolls back), any other records
/// `evt_ok`'s effect.
#[cfg(feature = "postgres")]
pub fn record_unless_poison(
    body: String,
) -> impl for<'c> FnOnce(
    &'c mut sqlx::PgConnection,
) -> futures_util::future::BoxFuture<'c, Result<(), sqlx::Error>>
       + Send {
    move |tx| {
        Box::pin(async move {
            if body == "poison" {
                return Err(sqlx::Error::Protocol(
                    "cannot apply a poison message".into(),
                ));
            }
            sqlx::query("INSERT INTO effects (event_id, delivery) VALUES ('evt_ok', 1)")
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

#[cfg(feature = "postgres")]
/// A freshly created, empty PostgreSQL database of its own; returns its URL.
///
/// The name starts with `tidem_` so that `scripts/test.sh` drops it on the next run.
pub async fn empty_postgres() -> String {
    tower_idempotency_testkit::fresh_postgres("tidem_consumer")
        .await
        .url
}

#[cfg(feature = "postgres")]
/// [`empty_postgres`], migrated, with the tests' `effects` table; returns its pool and URL.
pub async fn fresh_postgres() -> (PgPool, String) {
    let db_url = empty_postgres().await;
    let pool = postgres_pool(&db_url).await;
    tower_idempotency_consumer::PgConsumer::new(pool.clone(), "ledger")
        .migrate()
        .await
        .expect("migrate processed_events");
    pool.execute("CREATE TABLE effects (event_id text NOT NULL, delivery integer NOT NULL)")
        .await
        .expect("create the effects table");
    (pool, db_url)
}

#[cfg(feature = "postgres")]
/// A pool on an existing PostgreSQL database.
pub async fn postgres_pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(DELIVERIES as u32 + 2)
        .connect(url)
        .await
        .expect("connect to the test database")
}

#[cfg(feature = "sqlite")]
/// The path of a fresh SQLite file in the system temp dir (created on first connect).
pub async fn empty_sqlite() -> String {
    let path = tower_idempotency_testkit::fresh_sqlite_path("consumer");
    path.to_str().expect("a UTF-8 temp dir").to_owned()
}

#[cfg(feature = "sqlite")]
/// [`empty_sqlite`], migrated, with the tests' `effects` table; returns its pool and path.
pub async fn fresh_sqlite() -> (SqlitePool, String) {
    let path = empty_sqlite().await;
    let pool = sqlite_pool(&path).await;
    tower_idempotency_consumer::SqliteConsumer::new(pool.clone(), "ledger")
        .migrate()
        .await
        .expect("migrate processed_events");
    pool.execute("CREATE TABLE effects (event_id TEXT NOT NULL, delivery INTEGER NOT NULL)")
        .await
        .expect("create the effects table");
    (pool, path)
}

#[cfg(feature = "sqlite")]
/// A pool on an SQLite file (WAL mode, a busy timeout long enough for the tests' work).
pub async fn sqlite_pool(path: &str) -> SqlitePool {
    let (max, busy) = (DELIVERIES as u32 + 2, Duration::from_secs(20));
    tower_idempotency_testkit::sqlite_pool(std::path::Path::new(path), max, busy).await
}

#[cfg(feature = "redis")]
/// A connection manager on `REDIS_URL`.
pub async fn redis_connection() -> redis::aio::ConnectionManager {
    let url = redis_url();
    redis::Client::open(url.as_str())
        .unwrap_or_else(|e| panic!("REDIS_URL={url} is not a valid Redis URL: {e}"))
        .get_connection_manager()
        .await
        .unwrap_or_else(|e| panic!("cannot reach Redis at REDIS_URL={url}: {e}"))
}

/// Run this test binary again as the child of the crash test `test_name`, with `CHILD_ENV` set
/// to `target`, wait until it prints [`READY`], then kill it with SIGKILL.
pub async fn run_child_and_kill_it(test_name: &str, target: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = tokio::process::Command::new(exe)
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, target)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the child process");
    let stdout = child.stdout.take().expect("the child's stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read the child's stdout") {
            // libtest prints "test <name> ... " without a newline before the test's output.
            if line.trim_end().ends_with(READY) {
                return true;
            }
        }
        false
    })
    .await
    .expect("the child did its work within 60 s");
    assert!(ready, "the child exited before its work was done");
    // tokio's kill is SIGKILL on Unix: no destructor, no rollback sent, no commit.
    child.kill().await.expect("kill the child");
    let status = child.wait().await.expect("reap the child");
    assert!(!status.success(), "the child was killed, not finished");
}

/// Print [`READY`] for the parent, then wait to be killed.
pub async fn signal_ready_and_hang() -> ! {
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{READY}").expect("write to the parent");
        out.flush().expect("flush to the parent");
    }
    std::future::pending::<()>().await;
    unreachable!("pending never completes")
}

/// Run `delivery` on a task of its own and check that it panicked (the work's panic goes on
/// unwinding through the consumer).
pub async fn assert_panics<F>(delivery: F)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let ended = tokio::spawn(delivery).await;
    assert!(
        ended.err().is_some_and(|err| err.is_panic()),
        "the delivery did not panic"
    );
}
