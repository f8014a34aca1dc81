//! The harness of the proofs that SIGKILL real processes: a fresh database, a child process
//! whose stdout lines are followed, killed (SIGKILL) on a line of its own or stopped (SIGTERM)
//! when a condition holds, and the tally of the consumers' `settled` lines (see
//! [`report`](crate::report)).
//!
//! Shared by this example's RabbitMQ and NATS proofs and by the end-to-end chain
//! (`examples/chain`). A proof fails loudly: every broken expectation panics with what went
//! wrong, as a test assertion does.

use std::{
    ffi::OsStr,
    future::Future,
    process::Stdio,
    time::{Duration, Instant},
};

use sqlx::{postgres::PgPoolOptions, PgPool};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};
/// `name` from the environment, or a panic that says how to set it; a name no other run uses;
/// the messages left in a RabbitMQ queue (a proof is over when none is).
pub use tower_idempotency_testkit::{env_url as required_env, rabbitmq_ready, unique_name};

/// A freshly created, empty PostgreSQL database on the server of `DATABASE_URL`, named
/// [`unique_name`]`(prefix)`; returns its pool (at most `max_connections`) and its URL.
///
/// Start `prefix` with `tidem_`, so `scripts/test.sh` drops the database on its next run.
pub async fn fresh_database(prefix: &str, max_connections: u32) -> (PgPool, String) {
    let db = tower_idempotency_testkit::fresh_postgres(prefix).await;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(db.options)
        .await
        .expect("connect to the test database");
    (pool, db.url)
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
    /// Count `line` if it is a `settled` line; whether it was.
    pub fn count(&mut self, line: &str) -> bool {
        let Some(rest) = line.strip_prefix("settled ") else {
            return false;
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
        true
    }
}

/// One run of a binary, its stdout lines arriving on a channel.
#[derive(Debug)]
pub struct Run {
    name: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Run {
    /// Start `binary` with `envs` (and `RUST_LOG=warn`), stdout piped, stderr inherited; it is
    /// killed if the `Run` is dropped.
    pub fn start(binary: impl AsRef<OsStr>, envs: &[(&str, String)]) -> Self {
        let name = binary.as_ref().to_string_lossy().into_owned();
        let mut child = Command::new(binary)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
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
        Self { name, child, lines }
    }

    /// Hand every line that arrived to `on_line`, waiting up to `wait` for the first; whether
    /// `on_line` returned `true` for one (the lines after it are left for later).
    async fn take_lines(&mut self, wait: Duration, on_line: &mut impl FnMut(&str) -> bool) -> bool {
        if let Ok(Some(line)) = tokio::time::timeout(wait, self.lines.recv()).await {
            if on_line(&line) {
                return true;
            }
        }
        while let Ok(line) = self.lines.try_recv() {
            if on_line(&line) {
                return true;
            }
        }
        false
    }

    /// Panic if the run has passed `deadline` or exited on its own.
    fn check(&mut self, deadline: Instant, what: &str) {
        assert!(
            Instant::now() < deadline,
            "{}: {what} did not happen before the deadline",
            self.name
        );
        assert!(
            self.child.try_wait().expect("poll the child").is_none(),
            "{} exited on its own while waiting for {what}",
            self.name
        );
    }

    /// Hand each stdout line to `on_line` until it returns `true` (`what` names that moment in
    /// a failure), then SIGKILL the run there and hand it the lines that were already out.
    pub async fn kill_when(
        mut self,
        deadline: Instant,
        what: &str,
        mut on_line: impl FnMut(&str) -> bool,
    ) {
        loop {
            self.check(deadline, what);
            if self
                .take_lines(Duration::from_millis(200), &mut on_line)
                .await
            {
                break;
            }
        }
        // tokio's kill is SIGKILL on Unix: no ack, no rollback, no goodbye to the broker.
        self.child.kill().await.expect("SIGKILL the run");
        while let Ok(line) = self.lines.try_recv() {
            on_line(&line);
        }
    }

    /// Wait until this consumer run has settled `deliveries`, then SIGKILL it mid-stream.
    pub async fn kill_after(self, deliveries: usize, tally: &mut Tally, deadline: Instant) {
        let mut settled = 0;
        let what = format!("settling {deliveries} deliveries");
        self.kill_when(deadline, &what, |line| {
            if tally.count(line) {
                settled += 1;
            }
            settled >= deliveries
        })
        .await;
    }

    /// Poll `done` until it holds, handing the lines to `on_line` meanwhile; then SIGTERM the
    /// run, let it finish what it holds (within 20 s), and hand over its last lines.
    pub async fn stop_when<F, Fut>(
        mut self,
        deadline: Instant,
        mut on_line: impl FnMut(&str),
        mut done: F,
    ) where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let mut each = |line: &str| {
            on_line(line);
            false
        };
        loop {
            self.check(deadline, "the end of the stream");
            // The lines are the signal of progress; `done` asks the database and the broker.
            self.take_lines(Duration::from_millis(100), &mut each).await;
            if done().await {
                break;
            }
        }
        let pid = self.child.id().expect("the child runs");
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("send SIGTERM");
        assert!(term.success(), "SIGTERM {}", self.name);
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} stops within 20 s of SIGTERM", self.name))
            .expect("reap the run");
        assert!(status.success(), "{} stopped cleanly: {status}", self.name);
        while let Some(line) = self.lines.recv().await {
            each(&line);
        }
    }

    /// [`stop_when`](Self::stop_when) for a consumer run, counting its lines in `tally`.
    pub async fn finish_when<F, Fut>(self, tally: &mut Tally, deadline: Instant, done: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.stop_when(
            deadline,
            |line| {
                tally.count(line);
            },
            done,
        )
        .await;
    }
}
