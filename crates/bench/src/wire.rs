//! A counting TCP proxy for PostgreSQL: it forwards every byte and counts the messages clients
//! send, so the bench can report round trips and statements per request without
//! `pg_stat_statements` (which needs `shared_preload_libraries`, so a server restart).
//!
//! In the extended query protocol every round trip ends with a `Sync` message (sqlx's pool ping
//! is a bare `Sync`); a simple query is one `Query` message. Each statement run is one `Execute`
//! (or one `Query`).

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{tcp::OwnedReadHalf, tcp::OwnedWriteHalf, TcpListener, TcpStream},
};

use crate::{
    load::{create_keys, send_each},
    stores::Started,
    BoxError,
};

/// Message counts, shared by every connection through one proxy.
#[derive(Debug, Default)]
struct Counts {
    syncs: AtomicU64,
    queries: AtomicU64,
    executes: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    syncs: u64,
    queries: u64,
    executes: u64,
}

impl Snapshot {
    /// Round trips: every `Sync` and every simple `Query` waits for the server's answer.
    pub fn round_trips(&self) -> u64 {
        self.syncs + self.queries
    }

    /// Statements run: `Execute` messages and simple queries.
    pub fn statements(&self) -> u64 {
        self.executes + self.queries
    }

    /// The counts between `earlier` and `self`.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            syncs: self.syncs - earlier.syncs,
            queries: self.queries - earlier.queries,
            executes: self.executes - earlier.executes,
        }
    }
}

impl Counts {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            syncs: self.syncs.load(Ordering::Relaxed),
            queries: self.queries.load(Ordering::Relaxed),
            executes: self.executes.load(Ordering::Relaxed),
        }
    }
}

/// A running counting proxy: its address and its counts.
#[derive(Debug, Clone)]
pub struct Counter {
    addr: SocketAddr,
    counts: Arc<Counts>,
}

impl Counter {
    /// Start a proxy on 127.0.0.1 (a free port) to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Counter> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = shared.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let to_client = tokio::spawn(async move {
                        let mut client_write: OwnedWriteHalf = client_write;
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    });
                    let _ = forward_counting(client_read, &mut server_write, &counts).await;
                    to_client.abort();
                });
            }
        });
        Ok(Counter { addr, counts })
    }

    /// Where clients connect instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Snapshot {
        self.counts.snapshot()
    }
}

/// Copy the client's messages to the server, counting `Sync`, `Query` and `Execute`.
///
/// The first messages have no type byte (SSL and GSS requests, then the startup message);
/// every message after the startup message has one.
async fn forward_counting(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    counts: &Counts,
) -> std::io::Result<()> {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSS_REQUEST: u32 = 80_877_104;
    let mut started = false;
    let mut buf = Vec::with_capacity(8192);
    loop {
        let mut header = [0u8; 5];
        let header_len = if started { 5 } else { 4 };
        from.read_exact(&mut header[..header_len]).await?;
        let (kind, len_bytes) = if started {
            (header[0], &header[1..5])
        } else {
            (0, &header[0..4])
        };
        let len = u32::from_be_bytes(len_bytes.try_into().expect("four bytes")) as usize;
        let rest = len.saturating_sub(4);
        buf.resize(rest, 0);
        from.read_exact(&mut buf).await?;
        if started {
            match kind {
                b'S' => counts.syncs.fetch_add(1, Ordering::Relaxed),
                b'Q' => counts.queries.fetch_add(1, Ordering::Relaxed),
                b'E' => counts.executes.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
        } else if rest >= 4 {
            let code = u32::from_be_bytes(buf[0..4].try_into().expect("four bytes"));
            started = code != SSL_REQUEST && code != GSS_REQUEST;
        }
        to.write_all(&header[..header_len]).await?;
        to.write_all(&buf).await?;
    }
}

/// Requests counted per scenario at one worker (more workers send more: ten each).
const REQUESTS: usize = 200;

/// Round trips and statements per request of one scenario at one worker count.
#[derive(Debug, Clone)]
pub struct Counted {
    /// Concurrent workers.
    pub workers: usize,
    /// `store (mode) scenario`.
    pub scenario: String,
    /// Round trips to the server per request.
    pub round_trips: f64,
    /// Statements per request.
    pub statements: f64,
}

/// Pool connections of a counted run at `workers` (the warm-up opens and prepares every one).
pub fn connections(workers: usize) -> usize {
    workers.max(4)
}

/// Count the bare handlers' requests, and the first-time keys and replays of every mode, of a
/// store started through the counting proxy, `workers` requests at a time.
pub async fn count(
    client: &reqwest::Client,
    started: &Started,
    workers: usize,
) -> Result<Vec<Counted>, BoxError> {
    let counter = started
        .wire
        .as_ref()
        .ok_or("the store was not started through the counting proxy")?;
    let mut scenarios = Vec::new();
    for bare in &started.bare {
        scenarios.push((format!("{} {}", started.store, bare.name), &bare.url, false));
    }
    for mode in &started.layered {
        scenarios.push((format!("{} first-time keys", mode.label), &mode.url, false));
        scenarios.push((format!("{} replays", mode.label), &mode.url, true));
    }
    let warm_workers = connections(workers);
    let requests = REQUESTS.max(10 * workers);
    let mut out = Vec::new();
    for (scenario, url, replay) in scenarios {
        // Warm up: every connection prepares its statements.
        let warm = create_keys(client, url, 10 * warm_workers, warm_workers).await?;
        let keys: Arc<Vec<String>> = Arc::new(if replay {
            (0..requests)
                .map(|i| warm[i % warm.len()].clone())
                .collect()
        } else {
            let run = uuid::Uuid::new_v4().simple().to_string();
            (0..requests).map(|i| format!("{run}-c{i}")).collect()
        });
        let before = counter.snapshot();
        send_each(client, url, &keys, workers).await?;
        let used = counter.snapshot().since(&before);
        let per = |n: u64| n as f64 / requests as f64;
        let counted = Counted {
            workers,
            scenario,
            round_trips: per(used.round_trips()),
            statements: per(used.statements()),
        };
        eprintln!(
            "  {:<44} {:.2} round trips, {:.2} statements per request ({workers} workers)",
            counted.scenario, counted.round_trips, counted.statements
        );
        out.push(counted);
    }
    Ok(out)
}
