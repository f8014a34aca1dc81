//! Timeouts, bounds and the graceful shutdown of the real binary.
//!
//! Each test starts `orders-api` with small timeouts and talks to it over raw TCP where a
//! well-behaved HTTP client cannot misbehave on purpose (slow-loris headers, a body sent a byte
//! a second, a request half-sent when SIGTERM arrives).
//!
//! Needs `DATABASE_URL` (a PostgreSQL server the test may create databases on) for the
//! PostgreSQL variant of the shutdown test.

mod common;

use std::{
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    process::Child,
};

const BODY: &str = r#"{"customerId": "c_shutdown", "totalCents": 4000}"#;

/// A fresh SQLite file's URL; the files are removed when this is dropped.
struct SqliteFile(std::path::PathBuf);

impl SqliteFile {
    fn new() -> Self {
        Self(tower_idempotency_testkit::fresh_sqlite_path(
            "orders_hardening",
        ))
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

/// A fresh PostgreSQL database on the server of `DATABASE_URL`: its URL.
async fn fresh_postgres() -> String {
    common::fresh_postgres("tidem_orders_hardening").await.url
}

/// A view of the binary's database, to see its claims.
enum Probe {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl Probe {
    async fn open(database_url: &str) -> Self {
        if database_url.starts_with("sqlite:") {
            Probe::Sqlite(
                sqlx::SqlitePool::connect(database_url)
                    .await
                    .expect("open SQLite"),
            )
        } else {
            Probe::Postgres(
                sqlx::PgPool::connect(database_url)
                    .await
                    .expect("open PostgreSQL"),
            )
        }
    }

    async fn records(&self) -> i64 {
        const SQL: &str = "SELECT count(*) FROM idempotency_records";
        match self {
            Probe::Postgres(pool) => sqlx::query_scalar(SQL).fetch_one(pool).await,
            Probe::Sqlite(pool) => sqlx::query_scalar(SQL).fetch_one(pool).await,
        }
        .expect("count the idempotency records")
    }

    /// Poll until `n` keys are claimed (the claim commits on its own, before the handler runs).
    async fn wait_for_records(&self, n: i64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.records().await != n {
            assert!(Instant::now() < deadline, "{n} claims not seen within 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The running binary, the address it printed, and what it logged.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
    /// Copies stderr into `log` until the process closes it.
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(&self.addr).await.expect("connect")
    }

    fn sigterm(&self) {
        let pid = self.child.id().expect("the server is running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid}");
    }

    /// Wait (bounded) for the process to exit; how long that took and its status.
    async fn exit(&mut self, within: Duration) -> (Duration, std::process::ExitStatus) {
        let started = Instant::now();
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the server did not exit within {within:?}"))
            .expect("wait for the server");
        let took = started.elapsed();
        // The exit is not the end of the log: the last lines may still be in the pipe. The
        // reader ends at the pipe's end of file, so once it has, `logged` holds every line.
        if let Some(reader) = self.reader.take() {
            tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("stderr reaches its end after the exit")
                .expect("the stderr reader");
        }
        (took, status)
    }

    fn logged(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

/// Start the real binary with `env` on top of the defaults and wait (up to 60 s) for its
/// `listening on http://ADDR` line.
async fn start(database_url: &str, env: &[(&str, &str)]) -> Server {
    let mut command = common::orders_api(database_url);
    command.env("RUST_LOG", "info").stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn the orders-api binary");
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
    let reader = {
        let log = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        })
    };
    let url = common::listening_url(&mut child).await;
    let addr = url.trim_start_matches("http://").to_owned();
    Server {
        child,
        addr,
        log,
        reader: Some(reader),
    }
}

/// Read what the server sends until it closes the connection (bounded by `within`); the bytes
/// and when the connection closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server kept the connection open beyond {within:?}"));
    (
        String::from_utf8_lossy(&received).into_owned(),
        started.elapsed(),
    )
}

/// Write `bytes` one a second on `stream`, until the server closes it.
fn drip(
    stream: tokio::net::tcp::OwnedWriteHalf,
    bytes: &'static [u8],
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = stream;
        for byte in bytes {
            if stream.write_all(std::slice::from_ref(byte)).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// 20 clients sending their request head a byte a second are all cut after the 1 s header
/// timeout, and the server still answers others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_loris_headers_are_cut_at_the_header_timeout() {
    let db = SqliteFile::new();
    let server = start(&db.url(), &[("HEADER_READ_TIMEOUT_MS", "1000")]).await;
    let mut clients = Vec::new();
    for _ in 0..20 {
        let stream = server.connect().await;
        clients.push(tokio::spawn(async move {
            let (mut read, write) = stream.into_split();
            let dripping = drip(
                write,
                b"POST /orders HTTP/1.1\r\nHost: slow\r\nIdempotency-Key: k\r\n\r\n",
            );
            let started = Instant::now();
            let mut buf = [0_u8; 256];
            let closed = tokio::time::timeout(Duration::from_secs(10), async {
                while let Ok(n) = read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
            dripping.abort();
            assert!(closed.is_ok(), "a slow-loris connection was held for 10 s");
            started.elapsed()
        }));
    }
    for client in clients {
        let held = client.await.expect("client task");
        assert!(
            held < Duration::from_secs(3),
            "a slow-loris connection was held {held:?} with a 1 s header timeout"
        );
    }
    let health = common::client()
        .get(format!("{}/healthz", server.base()))
        .send()
        .await
        .expect("the server still answers");
    assert_eq!(health.status(), reqwest::StatusCode::OK);
}

/// A keep-alive connection left idle after its answer is closed after the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let db = SqliteFile::new();
    let server = start(&db.url(), &[("HEADER_READ_TIMEOUT_MS", "1000")]).await;
    let mut stream = server.connect().await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: idle\r\n\r\n")
        .await
        .unwrap();
    let (received, after) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    assert!(received.starts_with("HTTP/1.1 200"), "{received}");
    assert!(
        after < Duration::from_secs(4),
        "the idle connection was kept {after:?}"
    );
}

/// A body sent a byte a second gets 408 at the body timeout; nothing was claimed, so the same
/// key then creates the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_gets_408_at_the_body_timeout_and_claims_nothing() {
    let db = SqliteFile::new();
    let server = start(&db.url(), &[("BODY_TIMEOUT_MS", "1500")]).await;
    let stream = server.connect().await;
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: slow\r\nIdempotency-Key: slow-body\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    );
    write.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let dripping = drip(write, BODY.as_bytes());
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        while !String::from_utf8_lossy(&received).contains("\r\n\r\n") {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("an answer within 10 s");
    dripping.abort();
    let took = started.elapsed();
    let received = String::from_utf8_lossy(&received);
    assert!(received.starts_with("HTTP/1.1 408"), "{received}");
    assert!(
        took < Duration::from_secs(4),
        "408 came after {took:?} with a 1.5 s body timeout"
    );
    let created = common::post_order(&common::client(), &server.base(), "slow-body", BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    assert!(created.headers().get("idempotent-replayed").is_none());
}

/// With `MAX_CONNECTIONS=2` and two connections held open, a third client is served only once
/// one of them closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let db = SqliteFile::new();
    let server = start(
        &db.url(),
        &[
            ("MAX_CONNECTIONS", "2"),
            ("HEADER_READ_TIMEOUT_MS", "30000"),
        ],
    )
    .await;
    // Both slots are taken once each held connection has been answered once.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = server.connect().await;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: held\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0_u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(stream);
    }
    let third = tokio::spawn({
        let url = format!("{}/healthz", server.base());
        async move { common::client().get(url).send().await.map(|r| r.status()) }
    });
    // Nothing can answer the third client while both slots are held.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served beyond the cap"
    );
    drop(held.pop());
    let status = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a slot freed")
        .unwrap()
        .expect("answered");
    assert_eq!(status, reqwest::StatusCode::OK);
}

/// SIGTERM while a client is half-way through sending its body: the server exits at the
/// shutdown deadline, not when the client finishes (or never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_half_sent_request_exits_at_the_deadline() {
    let db = SqliteFile::new();
    let mut server = start(
        &db.url(),
        &[
            ("SHUTDOWN_GRACE_MS", "1500"),
            ("BODY_TIMEOUT_MS", "600000"),
            ("HEADER_READ_TIMEOUT_MS", "600000"),
        ],
    )
    .await;
    let mut stream = server.connect().await;
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: half\r\nIdempotency-Key: half-sent\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // `100 Continue` is sent when the layer starts reading the body: the request is in.
    let mut buf = [0_u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("100 Continue within 10 s")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 100"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    stream.write_all(&BODY.as_bytes()[..10]).await.unwrap();

    server.sigterm();
    let (took, status) = server.exit(Duration::from_secs(15)).await;
    assert!(status.success(), "exit status {status}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(3500),
        "exited {took:?} after SIGTERM with a 1.5 s grace period"
    );
    let log = server.logged();
    assert!(log.contains("grace period passed"), "{log}");
    drop(stream);
}

/// SIGTERM while two handlers run (one client waiting, one that went away): both finish and
/// are recorded before the process exits, and after a restart both keys replay.
async fn sigterm_lets_running_handlers_finish_and_be_recorded(database_url: &str) {
    let env = [
        ("PAYMENT_LATENCY_MS", "1500"),
        ("SHUTDOWN_GRACE_MS", "15000"),
    ];
    let mut server = start(database_url, &env).await;
    let base = server.base();
    let probe = Probe::open(database_url).await;
    let (waiting_key, gone_key) = (common::unique("waiting"), common::unique("gone"));
    let waiting =
        tokio::spawn(common::post_order(&common::client(), &base, &waiting_key, BODY).send());
    probe.wait_for_records(1).await;
    let gone = tokio::spawn(common::post_order(&common::client(), &base, &gone_key, BODY).send());
    probe.wait_for_records(2).await;
    // Both handlers are in the payment wait: one client goes away.
    gone.abort();

    server.sigterm();
    let answer = waiting
        .await
        .unwrap()
        .expect("the waiting client gets its answer");
    assert_eq!(answer.status(), reqwest::StatusCode::CREATED);
    let first_body = answer.text().await.unwrap();
    let (took, status) = server.exit(Duration::from_secs(15)).await;
    assert!(status.success(), "exit status {status}");
    assert!(took < Duration::from_secs(5), "exit took {took:?}");
    let log = server.logged();
    assert!(log.contains("every request finished"), "{log}");

    let restarted = start(database_url, &[]).await;
    let replay = common::post_order(&common::client(), &restarted.base(), &waiting_key, BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), reqwest::StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), first_body);
    let replay = common::post_order(&common::client(), &restarted.base(), &gone_key, BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), reqwest::StatusCode::CREATED);
    assert_eq!(
        replay.headers()["idempotent-replayed"],
        "true",
        "the attempt whose client went away was recorded before the exit"
    );
    let listed = common::client()
        .get(format!("{}/orders?customerId=c_shutdown", restarted.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(
        listed["orders"].as_array().unwrap().len(),
        2,
        "one order per key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_sigterm_lets_running_handlers_finish_and_be_recorded() {
    let db = SqliteFile::new();
    sigterm_lets_running_handlers_finish_and_be_recorded(&db.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_sigterm_lets_running_handlers_finish_and_be_recorded() {
    let url = fresh_postgres().await;
    sigterm_lets_running_handlers_finish_and_be_recorded(&url).await;
}

/// A `customerId` cannot forge a log line: control characters are refused (400) before anything
/// is logged, and what is logged (`customer_id` of a created order) is escaped, so even a
/// Unicode line separator appears as `\u{2028}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customer_ids_cannot_forge_log_lines() {
    let db = SqliteFile::new();
    let server = start(&db.url(), &[]).await;
    let send = |key: &'static str, customer: &'static str| {
        let body = serde_json::json!({"customerId": customer, "totalCents": 1}).to_string();
        common::client()
            .post(format!("{}/orders", server.base()))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let refused = send("forge-1", "c_1\nFORGED ERROR admin logged in")
        .await
        .unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST);
    let created = send("forge-2", "c_2\u{2028}FORGED2 \" quoted")
        .await
        .unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    // The "order created" line is written before the answer; wait for it (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.logged().contains("order created") {
        assert!(Instant::now() < deadline, "no `order created` line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = server.logged();
    assert!(
        log.lines()
            .all(|line| !line.trim_start().starts_with("FORGED")),
        "{log}"
    );
    assert!(
        !log.contains('\u{2028}'),
        "a raw line separator was logged: {log}"
    );
    assert!(log.contains(r"c_2\u{2028}FORGED2"), "{log}");
}
