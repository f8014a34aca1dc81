//! Messages per request to a store's server, counted on the wire: the store connects through a
//! [`FaultProxy`], which counts round trips (the client sends, the server answers) for any
//! protocol; for PostgreSQL a [`Watch`] on each connection also counts the statements, so the
//! bench reports both without `pg_stat_statements` (which needs `shared_preload_libraries`, so a
//! server restart).
//!
//! PostgreSQL's frontend messages: the first ones have no type byte (SSL and GSS requests, then
//! the startup message); every later one is a type byte and a length. Each statement run is one
//! `Execute` (extended protocol) or one `Query` (simple protocol).

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use fault_proxy::{FaultProxy, Watch};

/// A running counting proxy to a store's server.
#[derive(Debug, Clone)]
pub struct Counter {
    proxy: Arc<FaultProxy>,
    /// Statements, when the server speaks PostgreSQL's protocol.
    statements: Option<Arc<AtomicU64>>,
}

/// What a [`Counter`] counted up to some moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub round_trips: u64,
    pub statements: Option<u64>,
}

impl Snapshot {
    /// What was counted between `earlier` and `self`.
    pub fn since(self, earlier: Snapshot) -> Snapshot {
        Snapshot {
            round_trips: self.round_trips - earlier.round_trips,
            statements: self.statements.zip(earlier.statements).map(|(a, b)| a - b),
        }
    }
}

impl Counter {
    /// Start a proxy on 127.0.0.1 to `upstream`, counting round trips only.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Counter> {
        Ok(Counter {
            proxy: Arc::new(FaultProxy::start(upstream).await?),
            statements: None,
        })
    }

    /// Start a proxy on 127.0.0.1 to the PostgreSQL server at `upstream`, counting round trips
    /// and statements.
    pub async fn start_postgres(upstream: SocketAddr) -> std::io::Result<Counter> {
        let statements = Arc::new(AtomicU64::new(0));
        let counted = statements.clone();
        let proxy = FaultProxy::start_watching(upstream, move || PgMessages {
            statements: counted.clone(),
            started: false,
            pending: Vec::new(),
            skip: 0,
        })
        .await?;
        Ok(Counter {
            proxy: Arc::new(proxy),
            statements: Some(statements),
        })
    }

    /// Where clients connect instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            round_trips: self.proxy.traffic().round_trips,
            statements: self.statements.as_ref().map(|s| s.load(Ordering::SeqCst)),
        }
    }
}

/// Counts the statements in what one client sends to PostgreSQL, across chunk boundaries.
struct PgMessages {
    statements: Arc<AtomicU64>,
    /// Past the startup message: every message has a type byte.
    started: bool,
    /// The start of a message whose header is not complete yet.
    pending: Vec<u8>,
    /// Bytes of the current message's body still to pass over.
    skip: usize,
}

impl Watch for PgMessages {
    fn sent(&mut self, mut chunk: &[u8]) {
        const SSL_REQUEST: u32 = 80_877_103;
        const GSS_REQUEST: u32 = 80_877_104;
        loop {
            let passed = self.skip.min(chunk.len());
            self.skip -= passed;
            chunk = &chunk[passed..];
            if chunk.is_empty() {
                return;
            }
            // A header: the type byte and the length; before the startup message, the length and
            // the request code that tells an SSL or GSS request from the startup message.
            let need = if self.started { 5 } else { 8 };
            let take = (need - self.pending.len()).min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() < need {
                return;
            }
            let header = std::mem::take(&mut self.pending);
            let length = |at: usize| {
                u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
                    as usize
            };
            if self.started {
                if matches!(header[0], b'E' | b'Q') {
                    self.statements.fetch_add(1, Ordering::SeqCst);
                }
                self.skip = length(1).saturating_sub(4);
            } else {
                let code = length(4) as u32;
                self.started = code != SSL_REQUEST && code != GSS_REQUEST;
                self.skip = length(0).saturating_sub(8);
            }
        }
    }
}

/// Round trips and statements per request of one scenario at one worker count.
#[derive(Debug, Clone)]
pub struct Counted {
    /// Concurrent workers.
    pub workers: usize,
    /// `store (mode) scenario`.
    pub scenario: String,
    /// Round trips to the server per request.
    pub round_trips: f64,
    /// Statements per request, when the proxy understands the protocol.
    pub statements: Option<f64>,
}

/// Pool connections of a counted run at `workers` (the warm-up opens and prepares every one).
pub fn connections(workers: usize) -> usize {
    workers.max(4)
}
