//! A real HTTP/1 server on 127.0.0.1 whose answers are scripted per request, recording the key
//! and the arrival time of each request it sees.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, task::JoinHandle, time::Instant};

/// What the server does with one request.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// Answer with this status.
    Status(u16),
    /// Answer with this status and `Retry-After: seconds`.
    RetryAfter(u16, u64),
    /// Wait this long, then answer 201 (the client's attempt timeout should fire first).
    Hang(Duration),
    /// Read the request, then close the connection without answering (a lost answer).
    Drop,
}

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub key: Option<String>,
    /// The key under `x-idempotency-key`, for a client configured with that header name.
    pub other_key: Option<String>,
    pub at: Instant,
}

struct Script {
    next: VecDeque<Answer>,
    otherwise: Answer,
    seen: Vec<Seen>,
}

/// The running server; it stops when dropped.
pub struct Scripted {
    pub addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    task: JoinHandle<()>,
}

impl Scripted {
    /// Serve `script` in order on a free port, then `otherwise` for every later request.
    pub async fn start(script: &[Answer], otherwise: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, script, otherwise)
    }

    /// Serve on a listener the test bound.
    pub fn serve(listener: TcpListener, script: &[Answer], otherwise: Answer) -> Self {
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(Script {
            next: script.iter().copied().collect(),
            otherwise,
            seen: Vec::new(),
        }));
        let task = tokio::spawn(accept(listener, script.clone()));
        Self { addr, script, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/orders", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }

    pub fn keys(&self) -> Vec<Option<String>> {
        self.seen().into_iter().map(|s| s.key).collect()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, script: Arc<Mutex<Script>>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let script = script.clone();
        connections.spawn(async move {
            let service = service_fn(move |request| answer(script.clone(), request));
            // A dropped answer ends the connection with an error: that is the point.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    script: Arc<Mutex<Script>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (key, other_key) = (header("idempotency-key"), header("x-idempotency-key"));
    // The whole request arrives before the server acts, as a real handler would.
    let _ = request.into_body().collect().await;
    let answer = {
        let mut script = script.lock().unwrap();
        script.seen.push(Seen {
            key,
            other_key,
            at: Instant::now(),
        });
        let otherwise = script.otherwise;
        script.next.pop_front().unwrap_or(otherwise)
    };
    let response = |status: u16| {
        Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    match answer {
        Answer::Status(status) => Ok(response(status)),
        Answer::RetryAfter(status, seconds) => {
            let mut r = response(status);
            r.headers_mut()
                .insert("retry-after", seconds.to_string().parse().unwrap());
            Ok(r)
        }
        Answer::Hang(wait) => {
            tokio::time::sleep(wait).await;
            Ok(response(201))
        }
        Answer::Drop => Err(std::io::Error::other("answer dropped on purpose")),
    }
}

/// A port on 127.0.0.1 with nothing listening (bound, then released), so connecting is refused.
pub async fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}
