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

/// Message counts, shared by every connection through one proxy.
#[derive(Debug, Default)]
pub struct Counts {
    syncs: AtomicU64,
    queries: AtomicU64,
    executes: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub syncs: u64,
    pub queries: u64,
    pub executes: u64,
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

    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            syncs: self.syncs - earlier.syncs,
            queries: self.queries - earlier.queries,
            executes: self.executes - earlier.executes,
        }
    }
}

impl Counts {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            syncs: self.syncs.load(Ordering::Relaxed),
            queries: self.queries.load(Ordering::Relaxed),
            executes: self.executes.load(Ordering::Relaxed),
        }
    }
}

/// Start a proxy on 127.0.0.1 (a free port) to `upstream`; its address and its counts.
pub async fn start(upstream: SocketAddr) -> std::io::Result<(SocketAddr, Arc<Counts>)> {
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
    Ok((addr, counts))
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
