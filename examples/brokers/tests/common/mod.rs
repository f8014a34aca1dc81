//! What the RabbitMQ and NATS tests share on top of the proof harness
//! ([`broker_consumers_example::proof`]: the consumer binary as a child process that is killed and
//! restarted): a fresh database, the events to publish, and the final count.
//!
//! URLs are read at run time; a missing variable fails the test with the variable's name.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

pub use broker_consumers_example::proof::{required_env, unique_name, Run, Tally};
use sqlx::PgPool;

/// Distinct events published.
pub const EVENTS: usize = 5_000;
/// Events published a second time (10%).
pub const DUPLICATES: usize = EVENTS / 10;
/// How many times the consumer is SIGKILLed mid-stream before the last run.
pub const KILLS: usize = 4;
/// Deliveries a run settles before it is killed.
pub const SETTLED_BEFORE_KILL: usize = 900;
/// The whole proof must finish within this.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// A freshly created PostgreSQL database of its own (named `tidem_*`, so `scripts/test.sh`
/// drops it on its next run), with the consumer's tables; returns its pool and URL.
pub async fn fresh_database() -> (PgPool, String) {
    let (pool, db_url) = broker_consumers_example::proof::fresh_database("tidem_brokers", 4).await;
    // The consumer creates its tables too; the test reads `effects` before the first run ends.
    broker_consumers_example::migrate(&pool)
        .await
        .expect("create the tables");
    (pool, db_url)
}

/// One message to publish: the event id and its JSON body.
#[derive(Debug, Clone)]
pub struct Publication {
    /// The event id.
    pub id: String,
    /// `{"id", "amountCents"}`.
    pub body: Vec<u8>,
    /// Whether this is the second copy of an event.
    pub duplicate: bool,
}

/// [`EVENTS`] events and [`DUPLICATES`] second copies, the copies spread through the stream
/// (a fixed shuffle, so a failure can be replayed).
pub fn publications(prefix: &str) -> Vec<Publication> {
    let publication = |n: usize, duplicate| {
        let id = format!("{prefix}-evt-{n}");
        let body = serde_json::json!({ "id": id, "amountCents": 100 + n })
            .to_string()
            .into_bytes();
        Publication {
            id,
            body,
            duplicate,
        }
    };
    let mut all: Vec<Publication> = (0..EVENTS).map(|n| publication(n, false)).collect();
    // Every tenth event again, inserted a little after its original.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for n in (0..EVENTS).step_by(EVENTS / DUPLICATES) {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let after = n + 1 + (state >> 33) as usize % 400;
        let at = after.min(all.len());
        all.insert(at, publication(n, true));
    }
    all
}

/// How many distinct events have an effect.
pub async fn distinct_effects(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT event_id) FROM effects")
        .fetch_one(pool)
        .await
        .expect("count effects")
}

/// The proof's end state: one effect per distinct event, none lost, none twice, every event
/// marked processed, nothing parked.
pub async fn assert_applied_once(pool: &PgPool, publications: &[Publication]) {
    let expected: HashSet<&str> = publications.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(expected.len(), EVENTS);
    let twice: Vec<(String, i64)> = sqlx::query_as(
        "SELECT event_id, count(*) FROM effects GROUP BY event_id HAVING count(*) > 1 LIMIT 10",
    )
    .fetch_all(pool)
    .await
    .expect("effects applied twice");
    assert!(twice.is_empty(), "events applied more than once: {twice:?}");
    let applied: Vec<String> = sqlx::query_scalar("SELECT event_id FROM effects")
        .fetch_all(pool)
        .await
        .expect("effects");
    let applied: HashSet<&str> = applied.iter().map(String::as_str).collect();
    let lost: Vec<_> = expected.difference(&applied).take(10).collect();
    assert!(lost.is_empty(), "events never applied: {lost:?}");
    let unexpected: Vec<_> = applied.difference(&expected).take(10).collect();
    assert!(
        unexpected.is_empty(),
        "effects of unknown events: {unexpected:?}"
    );
    let (processed, other): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status <> 'processed')
         FROM processed_events WHERE consumer = $1",
    )
    .bind(broker_consumers_example::CONSUMER)
    .fetch_one(pool)
    .await
    .expect("count processed marks");
    assert_eq!(processed, EVENTS as i64, "one processed mark per event");
    assert_eq!(other, 0, "no event failed or was parked");
}

/// What the consumer's lines must show after the kills: redeliveries, duplicates absorbed, no
/// failed delivery; then the figures of the run, printed (shown with `--no-capture`; the README
/// quotes them).
pub fn assert_settled_and_report(broker: &str, tally: &Tally, published: usize, started: Instant) {
    assert!(
        tally.redelivered > 0,
        "the kills caused redeliveries: {tally:?}"
    );
    assert!(
        tally.duplicate > 0,
        "duplicates reached the consumer and were absorbed: {tally:?}"
    );
    assert_eq!(tally.other, 0, "no delivery failed: {tally:?}");
    println!(
        "{broker} proof: {EVENTS} events, {published} published, {KILLS} SIGKILLs; \
         {} deliveries settled: {} applied, {} duplicates absorbed, {} flagged redelivered, \
         {} other; duplicate effects 0; {:.1} s",
        tally.settled,
        tally.applied,
        tally.duplicate,
        tally.redelivered,
        tally.other,
        started.elapsed().as_secs_f64()
    );
}

/// The consumer's runs: [`KILLS`] runs SIGKILLed once each has settled [`SETTLED_BEFORE_KILL`]
/// deliveries, then one left to run until `done` holds; every run's lines counted in `tally`.
pub async fn kill_then_finish<F, Fut>(
    binary: &str,
    envs: &[(&str, String)],
    tally: &mut Tally,
    deadline: Instant,
    done: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..KILLS {
        Run::start(binary, envs)
            .kill_after(SETTLED_BEFORE_KILL, tally, deadline)
            .await;
    }
    Run::start(binary, envs)
        .finish_when(tally, deadline, done)
        .await;
}
