//! `RedisConsumer` through the `Consumer` trait: each test under a key prefix of its own.

mod common;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use common::{redis_connection, run_child_and_kill_it, signal_ready_and_hang, unique_name};
use redis::{aio::ConnectionManager, AsyncCommands};
use tokio::sync::Barrier;
use tower_idempotency_consumer::{redis::RedisConsumer, Consumer, Error, Outcome};

const LEASE: Duration = Duration::from_secs(5);

/// A consumer under `prefix`; its done keys expire soon, so that test runs leave nothing behind.
async fn consumer(prefix: &str) -> RedisConsumer {
    RedisConsumer::new(redis_connection().await, "receipts")
        .with_prefix(prefix)
        .with_retention(Duration::from_secs(120))
}

/// A run counter that outlives the test, so that the work (a `'static` future) can count.
fn counter() -> &'static AtomicUsize {
    Box::leak(Box::new(AtomicUsize::new(0)))
}

/// One delivery through [`Consumer::process_once`] with this `lease`, for work that owns what
/// it uses.
async fn deliver<C, T, E, Fut>(
    consumer: &RedisConsumer<C>,
    event_id: &str,
    lease: Duration,
    work: impl FnOnce() -> Fut + Send + 'static,
) -> Result<Outcome<T>, Error<E>>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
    Fut: std::future::Future<Output = Result<T, E>> + Send + 'static,
{
    consumer
        .clone()
        .with_lease(lease)
        .process_once(event_id, move |_| Box::pin(work()))
        .await
}

/// The work: count a run (the stand-in for an e-mail sent) and return the count.
async fn send(runs: &AtomicUsize) -> Result<usize, std::io::Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_deliveries_run_the_work_once() {
    let consumer = consumer(&unique_name("consumer")).await;
    let barrier = Arc::new(Barrier::new(common::DELIVERIES));
    let runs = counter();
    let deliveries: Vec<_> = (0..common::DELIVERIES)
        .map(|_| {
            let (consumer, barrier, runs) = (consumer.clone(), barrier.clone(), runs);
            tokio::spawn(async move {
                barrier.wait().await;
                deliver(&consumer, "evt_1", LEASE, move || async move {
                    // Work that takes a while, so that the others arrive while it runs.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    send(runs).await
                })
                .await
            })
        })
        .collect();
    let mut processed = 0;
    let mut not_run = 0;
    for delivery in deliveries {
        match delivery.await.expect("no panic").expect("no error") {
            Outcome::Processed(_) => processed += 1,
            Outcome::Duplicate | Outcome::InProgress { .. } => not_run += 1,
            other => panic!("neither processed, nor a duplicate, nor in progress: {other:?}"),
        }
    }
    assert_eq!((processed, not_run), (1, common::DELIVERIES - 1));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
    // Once done, every redelivery is a duplicate.
    for _ in 0..common::DELIVERIES {
        let again = deliver(&consumer, "evt_1", LEASE, || send(runs)).await;
        assert_eq!(again.expect("redelivery"), Outcome::Duplicate);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_work_releases_the_claim_and_the_redelivery_runs_it_once() {
    let consumer = consumer(&unique_name("consumer")).await;
    let runs = counter();
    let failed = deliver(&consumer, "evt_1", LEASE, move || async move {
        send(runs).await?;
        Err::<usize, _>(std::io::Error::other("the mail server said no"))
    })
    .await;
    assert!(matches!(failed, Err(Error::Work(_))), "{failed:?}");
    // Released at once: no waiting for the lease.
    let retried = deliver(&consumer, "evt_1", LEASE, || send(runs)).await;
    assert_eq!(retried.expect("redelivery"), Outcome::Processed(2));
    let again = deliver(&consumer, "evt_1", LEASE, || send(runs)).await;
    assert_eq!(again.expect("third delivery"), Outcome::Duplicate);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "one failed run, one successful run"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_are_counted_then_the_event_is_parked_and_replayed() {
    let consumer = consumer(&unique_name("consumer"))
        .await
        .with_max_attempts(std::num::NonZeroU32::new(3).expect("3"));
    let runs = counter();
    let refuse = move || async move {
        send(runs).await?;
        Err::<usize, _>(std::io::Error::other("the mail server said no"))
    };
    for attempt in 1..=2 {
        let failed = deliver(&consumer, "evt_1", LEASE, refuse).await;
        assert!(
            matches!(failed, Err(Error::Work(_))),
            "attempt {attempt}: {failed:?}"
        );
    }
    assert_eq!(consumer.parked("evt_1").await.expect("read"), None);
    let last = consumer
        .process_once_with_payload("evt_1", Some(b"{\"to\":\"a@b\"}"), move |_| {
            Box::pin(refuse())
        })
        .await;
    assert!(matches!(last, Err(Error::Parked(_))), "{last:?}");
    // The payload is kept with the parked event: acknowledged at the broker, it is not lost.
    let kept = consumer
        .parked("evt_1")
        .await
        .expect("read")
        .expect("parked");
    assert_eq!(kept.attempts, 3);
    assert!(kept.parked_at_ms > 1_700_000_000_000, "{kept:?}");
    assert_eq!(kept.payload.as_deref(), Some(&b"{\"to\":\"a@b\"}"[..]));
    assert_eq!(kept.last_error.as_deref(), Some("the mail server said no"));
    let parked = deliver(&consumer, "evt_1", LEASE, move || send(runs)).await;
    assert_eq!(parked.expect("parked"), Outcome::Parked { attempts: 3 });
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "a parked event does not run"
    );

    assert!(consumer.replay("evt_1").await.expect("replay"));
    assert!(
        !consumer.replay("evt_1").await.expect("replay again"),
        "no longer parked"
    );
    let done = deliver(&consumer, "evt_1", LEASE, move || send(runs)).await;
    assert_eq!(done.expect("after the replay"), Outcome::Processed(4));
    let again = deliver(&consumer, "evt_1", LEASE, move || send(runs)).await;
    assert_eq!(again.expect("a duplicate"), Outcome::Duplicate);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_releases_the_claim_and_the_redelivery_runs_it_once() {
    let consumer = consumer(&unique_name("consumer")).await;
    let panicking = consumer.clone();
    common::assert_panics(async move {
        deliver(&panicking, "evt_1", LEASE, move || async move {
            panic!("the work panicked");
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        })
        .await
    })
    .await;
    let runs = counter();
    let retried = deliver(&consumer, "evt_1", LEASE, || send(runs)).await;
    assert_eq!(retried.expect("redelivery"), Outcome::Processed(1));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lease_is_renewed_while_a_long_work_runs() {
    let consumer = consumer(&unique_name("consumer")).await;
    let lease = Duration::from_millis(300);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            deliver(&consumer, "evt_1", lease, move || async move {
                started_tx.send(()).expect("the test waits");
                go_rx.await.expect("the test says go");
                Ok::<_, std::io::Error>("sent")
            })
            .await
        }
    });
    started_rx.await.expect("the work started");
    // Three leases later the claim still holds, because it was renewed.
    tokio::time::sleep(lease * 3).await;
    let runs = counter();
    let during = deliver(&consumer, "evt_1", lease, || send(runs)).await;
    assert!(
        matches!(during, Ok(Outcome::InProgress { lease_remaining }) if lease_remaining <= lease),
        "{during:?}"
    );
    go_tx.send(()).expect("the work waits");
    assert_eq!(
        first.await.expect("no panic").expect("first"),
        Outcome::Processed("sent")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_that_lost_its_claim_cannot_complete_it() {
    let prefix = unique_name("consumer");
    let consumer = consumer(&prefix).await;
    let key = consumer.key("evt_1");
    let mut conn = redis_connection().await;
    let (work_conn, work_key) = (conn.clone(), key.clone());
    let taken = deliver(&consumer, "evt_1", LEASE, move || {
        let (mut conn, key) = (work_conn, work_key);
        async move {
            // Another delivery takes the claim over (as after a lapsed lease).
            let () = conn.set(&key, "another-token").await.expect("take over");
            Ok::<_, redis::RedisError>(())
        }
    })
    .await;
    assert!(matches!(taken, Err(Error::LeaseLost)), "{taken:?}");
    let value: String = conn.get(&key).await.expect("read the key");
    assert_eq!(value, "another-token", "the fenced holder changed nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_claim_cancels_the_running_work() {
    let consumer = consumer(&unique_name("consumer")).await;
    let key = consumer.key("evt_1");
    let conn = redis_connection().await;
    let lease = Duration::from_millis(300);
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        deliver(&consumer, "evt_1", lease, move || {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move {
                let () = conn.set(&key, "another-token").await.expect("take over");
                // Never finishes: only the failed renewal can end this delivery.
                std::future::pending::<Result<(), redis::RedisError>>().await
            }
        }),
    )
    .await
    .expect("the renewal noticed the lost claim");
    assert!(matches!(outcome, Err(Error::LeaseLost)), "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_holder_blocks_redeliveries_until_its_lease_lapses() {
    let lease = Duration::from_millis(1500);
    if let Ok(prefix) = std::env::var(common::CHILD_ENV) {
        // The child: claim the event, then die (the parent kills us) in the middle of the work.
        let consumer = consumer(&prefix).await;
        let result =
            deliver::<_, (), redis::RedisError, _>(&consumer, "evt_1", lease, move || async move {
                signal_ready_and_hang().await
            })
            .await;
        panic!("the child should be killed while its work waits, but it ended: {result:?}");
    }
    let prefix = unique_name("consumer");
    let consumer = consumer(&prefix).await;
    run_child_and_kill_it(
        "a_crashed_holder_blocks_redeliveries_until_its_lease_lapses",
        &prefix,
    )
    .await;

    let runs = counter();
    let blocked = deliver(&consumer, "evt_1", lease, || send(runs)).await;
    let Ok(Outcome::InProgress { lease_remaining }) = blocked else {
        panic!("the dead holder's claim still holds: {blocked:?}");
    };
    assert!(lease_remaining <= lease);
    // The claim lapses by Redis's clock: wait out the time it reported, and a little more.
    tokio::time::sleep(lease_remaining + Duration::from_millis(50)).await;
    let retried = deliver(&consumer, "evt_1", lease, || send(runs)).await;
    assert_eq!(retried.expect("redelivery"), Outcome::Processed(1));
    let again = deliver(&consumer, "evt_1", lease, || send(runs)).await;
    assert_eq!(again.expect("third delivery"), Outcome::Duplicate);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn done_events_expire_after_the_retention_and_keys_are_cluster_safe() {
    let prefix = unique_name("consumer");
    let retention = Duration::from_secs(60);
    let consumer = consumer(&prefix).await.with_retention(retention);
    let mut conn: ConnectionManager = redis_connection().await;
    let runs = counter();
    let done = deliver(&consumer, "evt_{1}", LEASE, || send(runs)).await;
    assert_eq!(done.expect("first delivery"), Outcome::Processed(1));

    let key = consumer.key("evt_{1}");
    let tag = key
        .strip_prefix(&format!("{prefix}:{{"))
        .and_then(|rest| rest.strip_suffix('}'))
        .expect("<prefix>:{<hash>}");
    assert!(
        tag.len() == 64 && tag.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    assert_ne!(key, consumer.key("evt_{2}"));
    let other = RedisConsumer::new(conn.clone(), "mailer").with_prefix(prefix.as_str());
    assert_ne!(
        key,
        other.key("evt_{1}"),
        "consumers have keys of their own"
    );

    let value: String = conn.get(&key).await.expect("read the key");
    assert_eq!(value, "done");
    let ttl: i64 = conn.pttl(&key).await.expect("read the TTL");
    assert!(
        ttl > 50_000 && ttl <= 60_000,
        "retention is the key's TTL: {ttl} ms"
    );
}

/// A connection to the Redis Cluster at `REDIS_CLUSTER_URLS` (comma-separated node URLs).
async fn cluster_connection() -> redis::cluster_async::ClusterConnection {
    let urls = std::env::var("REDIS_CLUSTER_URLS").expect(
        "REDIS_CLUSTER_URLS is not set: run scripts/redis-cluster.sh and export \
         REDIS_CLUSTER_URLS=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003",
    );
    let urls: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    redis::cluster::ClusterClient::new(urls.clone())
        .unwrap_or_else(|e| panic!("REDIS_CLUSTER_URLS={urls:?} is not valid: {e}"))
        .get_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot reach the cluster at REDIS_CLUSTER_URLS={urls:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_cluster_concurrent_deliveries_of_many_events_run_each_once() {
    const EVENTS: usize = 20;
    let consumer = RedisConsumer::new(cluster_connection().await, "receipts")
        .with_prefix(unique_name("consumer"))
        .with_retention(Duration::from_secs(120));
    let runs: &'static [AtomicUsize] =
        Vec::leak((0..EVENTS).map(|_| AtomicUsize::new(0)).collect());
    let barrier = Arc::new(Barrier::new(EVENTS * common::DELIVERIES));
    let mut tasks = Vec::new();
    for event in 0..EVENTS {
        for _ in 0..common::DELIVERIES {
            let (consumer, barrier, runs) = (consumer.clone(), barrier.clone(), runs);
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let event_id = format!("evt_{event}");
                deliver(&consumer, &event_id, LEASE, move || async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    send(&runs[event]).await
                })
                .await
            }));
        }
    }
    let mut processed = 0;
    for task in tasks {
        if let Outcome::Processed(_) = task.await.expect("no panic").expect("no error") {
            processed += 1;
        }
    }
    assert_eq!(processed, EVENTS, "one delivery of each event ran the work");
    for (event, runs) in runs.iter().enumerate() {
        assert_eq!(runs.load(Ordering::SeqCst), 1, "evt_{event} ran once");
        let again = deliver(&consumer, &format!("evt_{event}"), LEASE, || send(runs)).await;
        assert_eq!(again.expect("redelivery"), Outcome::Duplicate);
    }
}

/// A connection whose commands fail once `broken` is set: Redis unreachable (a failover, a cut
/// network) for everything after it.
#[derive(Clone)]
struct Breakable {
    conn: ConnectionManager,
    broken: Arc<std::sync::atomic::AtomicBool>,
}

impl Breakable {
    fn refusal(&self) -> Option<redis::RedisError> {
        self.broken.load(Ordering::SeqCst).then(|| {
            std::io::Error::new(std::io::ErrorKind::ConnectionReset, "Redis is unreachable").into()
        })
    }
}

impl redis::aio::ConnectionLike for Breakable {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self.refusal() {
            Some(err) => Box::pin(async move { Err(err) }),
            None => self.conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self.refusal() {
            Some(err) => Box::pin(async move { Err(err) }),
            None => self.conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// Renewals that keep failing (Redis unreachable) end the work when the lease runs out, not at
/// the next renewal after it: from then on another delivery may hold the event. With a lease of
/// 1,100 ms the renewals come every 366 ms, the third 2 ms before the lease's end, so waiting for
/// the fourth would let the work run a third of a lease beside the next holder's.
#[tokio::test(flavor = "multi_thread")]
async fn failing_renewals_end_the_work_when_the_lease_runs_out() {
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = RedisConsumer::new(
        Breakable {
            conn: redis_connection().await,
            broken: broken.clone(),
        },
        "receipts",
    )
    .with_prefix(unique_name("consumer"))
    .with_retention(Duration::from_secs(120));
    let lease = Duration::from_millis(1_100);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let delivery = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            let started = tokio::time::Instant::now();
            let outcome = deliver(&consumer, "evt_1", lease, move || async move {
                started_tx.send(()).expect("the test waits");
                std::future::pending::<Result<(), std::io::Error>>().await
            })
            .await;
            (outcome, started.elapsed())
        }
    });
    started_rx.await.expect("the work started");
    broken.store(true, Ordering::SeqCst);
    let (outcome, took) = bounded_by(Duration::from_secs(10), delivery).await;
    assert!(matches!(outcome, Err(Error::LeaseLost)), "{outcome:?}");
    assert!(
        took < lease + Duration::from_millis(250),
        "the work ran on {:?} past its lease",
        took.saturating_sub(lease)
    );
}

/// A first delivery of `evt_1`, processed: the work's first run, counted in `runs`.
async fn first_delivery(consumer: &RedisConsumer, runs: &'static AtomicUsize) {
    let first = deliver(consumer, "evt_1", LEASE, || send(runs)).await;
    assert_eq!(first.expect("first"), Outcome::Processed(1));
}

/// The work is made only once the claim is this delivery's: the closure's own code (outside
/// the future it returns) does not run for a duplicate.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_does_not_make_the_work() {
    let consumer = consumer(&unique_name("consumer")).await;
    let runs = counter();
    first_delivery(&consumer, runs).await;
    let made = counter();
    let again = consumer
        .process_once("evt_1", |_| {
            made.fetch_add(1, Ordering::SeqCst);
            Box::pin(send(runs))
        })
        .await
        .expect("the duplicate");
    assert_eq!(again, Outcome::Duplicate);
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "the work was made for a duplicate"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// "Keep for ever", said with the longest `Duration` there is: the retention is cut to a
/// century, and the event is marked done (Redis refuses an expiry of `u64::MAX` ms, which left
/// the event unmarked after its work ran, to run again after the lease).
#[tokio::test(flavor = "multi_thread")]
async fn the_longest_retention_marks_the_event_done() {
    let consumer = consumer(&unique_name("consumer"))
        .await
        .with_retention(Duration::MAX);
    let runs = counter();
    first_delivery(&consumer, runs).await;
    let again = deliver(&consumer, "evt_1", LEASE, || send(runs)).await;
    let mut conn = redis_connection().await;
    let ttl_ms: i64 = conn.pttl(consumer.key("evt_1")).await.expect("PTTL");
    let () = conn.del(consumer.key("evt_1")).await.expect("clean up");
    assert_eq!(again.expect("the second delivery"), Outcome::Duplicate);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let century_ms = 100 * 365 * 24 * 60 * 60 * 1000_i64;
    assert!(
        ttl_ms > century_ms - 60_000 && ttl_ms <= century_ms,
        "{ttl_ms}"
    );
}

async fn bounded_by<T>(limit: Duration, task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(limit, task)
        .await
        .expect("bounded")
        .expect("no panic")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parked_event_and_its_failures_are_kept_until_replayed() {
    let consumer = consumer(&unique_name("consumer"))
        .await
        .with_max_attempts(std::num::NonZeroU32::new(1).expect("1"));
    let parked = consumer
        .process_once_with_payload("evt_1", Some(b"payload"), |_| {
            Box::pin(async { Err::<(), _>(std::io::Error::other("no")) })
        })
        .await;
    assert!(matches!(parked, Err(Error::Parked(_))), "{parked:?}");
    let mut conn = common::redis_connection().await;
    let key = consumer.key("evt_1");
    let ttls: (i64, i64) = redis::pipe()
        .cmd("PTTL")
        .arg(&key)
        .cmd("PTTL")
        .arg(format!("{key}:failures"))
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert_eq!(ttls, (-1, -1), "the parked mark and its failures expire");
    assert!(consumer.replay("evt_1").await.expect("replay"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_work_that_fails_after_its_claim_was_taken_gets_lease_lost() {
    let consumer = consumer(&unique_name("consumer")).await;
    let key = consumer.key("evt_1");
    let failed = deliver(&consumer, "evt_1", LEASE, move || async move {
        // Another holder's claim, as after this one's lease lapsed.
        let mut conn = common::redis_connection().await;
        let () = redis::cmd("SET")
            .arg(&key)
            .arg("another-holder")
            .query_async(&mut conn)
            .await
            .expect("SET");
        Err::<(), _>(std::io::Error::other("failed late"))
    })
    .await;
    assert!(matches!(failed, Err(Error::LeaseLost)), "{failed:?}");
    assert_eq!(
        consumer.parked("evt_1").await.expect("read"),
        None,
        "a failure of a lost claim is not counted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_work_that_always_panics_is_parked_at_the_maximum_attempts() {
    let consumer = consumer(&unique_name("consumer"))
        .await
        .with_max_attempts(std::num::NonZeroU32::new(2).expect("2"));
    for _ in 0..2 {
        let consumer = consumer.clone();
        common::assert_panics(async move {
            deliver(&consumer, "evt_1", LEASE, move || async move {
                panic!("the work panicked");
                #[allow(unreachable_code)]
                Ok::<(), std::io::Error>(())
            })
            .await
        })
        .await;
    }
    let parked = consumer
        .parked("evt_1")
        .await
        .expect("read")
        .expect("parked");
    assert_eq!(parked.attempts, 2);
    assert_eq!(
        parked.last_error.as_deref(),
        Some("the work panicked: the work panicked")
    );
    let skipped = deliver(&consumer, "evt_1", LEASE, || async {
        Ok::<(), std::io::Error>(())
    })
    .await;
    assert_eq!(skipped.expect("parked"), Outcome::Parked { attempts: 2 });
}
