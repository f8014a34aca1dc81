//! An HTTP proxy on 127.0.0.1 that loses answers: it forwards each request, waits for the
//! server's whole answer (so the work is done), then, for a share of requests drawn from a seeded
//! generator, closes the client's connection without replying. The client sees the invisible
//! failure: the same error as a network that lost the answer.
//!
//! The proxy is bounded: it serves at most [`ProxySettings::max_requests`] requests and runs at
//! most [`ProxySettings::max_lifetime`], and stops when its handle is dropped.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::{TokioExecutor, TokioIo},
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio::{net::TcpListener, task::JoinHandle};

/// How the proxy loses answers, and its bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProxySettings {
    /// The share of answers dropped after the server did the work (0 to 1).
    pub loss_rate: f64,
    /// The seed of the generator that picks which answers are dropped.
    pub seed: u64,
    /// Requests served at most; later ones get 503 and the proxy stops accepting connections.
    pub max_requests: u64,
    /// How long the proxy runs at most.
    pub max_lifetime: Duration,
}

/// What the proxy did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Requests received from clients.
    pub requests: u64,
    /// Requests forwarded to the server and answered by it.
    pub forwarded: u64,
    /// Answers dropped after the server had answered.
    pub dropped: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
}

struct Shared {
    upstream: SocketAddr,
    settings: ProxySettings,
    client: Client<HttpConnector, Full<Bytes>>,
    rng: Mutex<StdRng>,
    counters: Counters,
}

/// A running lossy proxy; dropping it stops it.
#[derive(Debug)]
pub struct LossyProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("upstream", &self.upstream)
            .field("settings", &self.settings)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl LossyProxy {
    /// Listen on a free port of 127.0.0.1 and forward to `upstream`.
    pub async fn start(upstream: SocketAddr, settings: ProxySettings) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            settings,
            client: Client::builder(TokioExecutor::new()).build_http(),
            rng: Mutex::new(StdRng::seed_from_u64(settings.seed)),
            counters: Counters::default(),
        });
        let serve = accept(listener, shared.clone());
        let task = tokio::spawn(async move {
            // The lifetime bound: whatever the clients do, the proxy ends.
            let _ = tokio::time::timeout(settings.max_lifetime, serve).await;
        });
        Ok(Self { addr, shared, task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            requests: c.requests.load(Ordering::SeqCst),
            forwarded: c.forwarded.load(Ordering::SeqCst),
            dropped: c.dropped.load(Ordering::SeqCst),
        }
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection.
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            // Reap finished connections so the set does not grow with every connection.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        if shared.counters.requests.load(Ordering::SeqCst) >= shared.settings.max_requests {
            break;
        }
        let shared = shared.clone();
        connections.spawn(async move {
            let service = service_fn(move |request| forward(shared.clone(), request));
            // A dropped answer ends the connection with an error: that is the point.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
    // Let the connections in progress finish their requests.
    while connections.join_next().await.is_some() {}
}

/// The error that makes hyper close the client's connection without an answer.
#[derive(Debug)]
struct AnswerDropped;

impl std::fmt::Display for AnswerDropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("answer dropped by the lossy proxy")
    }
}

impl std::error::Error for AnswerDropped {}

async fn forward(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
    let served = shared.counters.requests.fetch_add(1, Ordering::SeqCst);
    if served >= shared.settings.max_requests {
        return Ok(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "the lossy proxy reached its request limit",
        ));
    }
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = Uri::try_from(format!("http://{}{path}", shared.upstream))?;
    let upstream = match shared
        .client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(response) => response,
        Err(_) => {
            return Ok(plain(
                StatusCode::BAD_GATEWAY,
                "the orders API is unreachable",
            ))
        }
    };
    // The whole answer first: by now the server has done the work and committed it.
    let (parts, body) = upstream.into_parts();
    let body = body.collect().await?.to_bytes();
    shared.counters.forwarded.fetch_add(1, Ordering::SeqCst);
    let lose = shared
        .rng
        .lock()
        .expect("the generator's lock")
        .random_bool(shared.settings.loss_rate);
    if lose {
        shared.counters.dropped.fetch_add(1, Ordering::SeqCst);
        return Err(Box::new(AnswerDropped));
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}
