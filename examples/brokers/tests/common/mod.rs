//! The proof harness shared by the RabbitMQ and NATS tests: a fresh database, the events to
//! publish, the consumer binary as a child process that is killed and restarted, and the final
//! count.
//!
//! URLs are read at run time; a missing variable fails the test with the variable's name.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::{
    collections::HashSet,
    future::Future,
    process::Stdio,
    time::{Duration, Instant},
};

use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    ConnectOptions, Connection, Executor, PgPool,
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

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

/// `name`, or a panic that says how to set it.
pub fn required_env(name: &str, example: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: export {name}={example}"))
}

/// A name no other run uses: `<prefix>_<uuid>`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A freshly created PostgreSQL database of its own (named `tidem_*`, so `scripts/test.sh`
/// drops it on its next run); returns its pool and URL.
pub async fn fresh_database() -> (PgPool, String) {
    let url = required_env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
    let db = unique_name("tidem_brokers");
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at DATABASE_URL={url}: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{db}""#)))
        .await
        .expect("create the test database");
    let options: PgConnectOptions = url.parse().expect("DATABASE_URL parses");
    let db_url = options.database(&db).to_url_lossy().to_string();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&db_url)
        .await
        .expect("connect to the test database");
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

/// What the consumer runs reported, summed over every run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Deliveries settled (one `settled` line each).
    pub settled: usize,
    /// Applied now.
    pub applied: usize,
    /// Found already applied: the duplicates and redeliveries the consumer absorbed.
    pub duplicate: usize,
    /// Deliveries the broker flagged as redelivered.
    pub redelivered: usize,
    /// Parked or failed: none expected.
    pub other: usize,
}

impl Tally {
    fn count(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("settled ") else {
            return;
        };
        self.settled += 1;
        if rest.contains(" outcome=applied ") {
            self.applied += 1;
        } else if rest.contains(" outcome=duplicate ") {
            self.duplicate += 1;
        } else {
            self.other += 1;
        }
        if rest.ends_with(" redelivered=true") {
            self.redelivered += 1;
        }
    }
}

/// One run of a consumer binary, its stdout lines arriving on a channel.
pub struct Run {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Deliveries this run settled.
    pub settled: usize,
}

impl Run {
    /// Start `binary` with `envs`.
    pub fn start(binary: &str, envs: &[(&str, String)]) -> Self {
        let mut child = Command::new(binary)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {binary}: {e}"));
        let stdout = child.stdout.take().expect("the child's stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            settled: 0,
        }
    }

    /// Count the lines that arrived so far; wait up to `wait` for the first of them.
    async fn take_lines(&mut self, tally: &mut Tally, wait: Duration) {
        if let Ok(Some(line)) = tokio::time::timeout(wait, self.lines.recv()).await {
            self.count(tally, &line);
        }
        while let Ok(line) = self.lines.try_recv() {
            self.count(tally, &line);
        }
    }

    fn count(&mut self, tally: &mut Tally, line: &str) {
        if line.starts_with("settled ") {
            self.settled += 1;
        }
        tally.count(line);
    }

    /// Wait until this run has settled `deliveries`, then SIGKILL it mid-stream.
    pub async fn kill_after(mut self, deliveries: usize, tally: &mut Tally, deadline: Instant) {
        while self.settled < deliveries {
            assert!(
                Instant::now() < deadline,
                "the consumer settled only {} deliveries before the deadline",
                self.settled
            );
            assert!(
                self.child.try_wait().expect("poll the child").is_none(),
                "the consumer exited on its own after {} deliveries",
                self.settled
            );
            self.take_lines(tally, Duration::from_millis(200)).await;
        }
        // tokio's kill is SIGKILL on Unix: no ack, no rollback, no goodbye to the broker.
        self.child.kill().await.expect("SIGKILL the consumer");
        self.take_lines(tally, Duration::ZERO).await;
    }

    /// Poll `done` until it holds, counting lines meanwhile; then SIGTERM the run, let it
    /// finish what it holds, and collect its last lines.
    pub async fn finish_when<F, Fut>(mut self, tally: &mut Tally, deadline: Instant, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        loop {
            assert!(
                Instant::now() < deadline,
                "the stream was not consumed before the deadline ({tally:?})"
            );
            assert!(
                self.child.try_wait().expect("poll the child").is_none(),
                "the consumer exited on its own"
            );
            // The lines are the signal of progress; `done` asks the database and the broker.
            self.take_lines(tally, Duration::from_millis(100)).await;
            if done().await {
                break;
            }
        }
        let pid = self.child.id().expect("the child runs");
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("send SIGTERM");
        assert!(term.success(), "SIGTERM the consumer");
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("the consumer stops within 20 s of SIGTERM")
            .expect("reap the consumer");
        assert!(status.success(), "the consumer stopped cleanly: {status}");
        while let Some(line) = self.lines.recv().await {
            self.count(tally, &line);
        }
    }
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

/// Print the figures of a proof run (shown with `--no-capture`; the README quotes them).
pub fn report(broker: &str, tally: &Tally, published: usize, started: Instant) {
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
