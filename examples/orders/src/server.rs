//! Serving the router: timeouts, a connection cap and a graceful shutdown with a deadline.
//!
//! `axum::serve` has no header-read timeout and no shutdown deadline, so the binary serves
//! connections with hyper directly:
//!
//! - a request head (and the wait for the next request on a keep-alive connection) must arrive
//!   within [`ServerConfig::header_read_timeout`], so slow-loris clients are cut;
//! - at most [`ServerConfig::max_connections`] connections are served at once: the next one is
//!   accepted only when one closes;
//! - each request runs in its own task, so a client that goes away does not cancel its handler,
//!   and the shutdown can wait for handlers that are still running;
//! - on shutdown, the listener closes, idle connections close, running requests finish, and the
//!   process goes on only when they are done or [`ServerConfig::shutdown_grace`] passed,
//!   whichever is first (a client half-way through sending a request cannot hold it up).

use std::{future::Future, sync::Arc, time::Duration};

use axum::{
    http::{Request, StatusCode},
    response::{IntoResponse, Response},
    Router,
};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tower::ServiceExt;

use crate::config::ServerConfig;

/// How long to pause accepting after an accept error (such as too many open files), so the loop
/// does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// How the server stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Every connection closed and every request finished within the grace period.
    Clean,
    /// The grace period passed with connections or requests still open; they were abandoned.
    DeadlinePassed {
        /// Requests still running (a handler, or a request whose body was still arriving).
        requests: usize,
    },
}

/// Serve `app` on `listener` until `signal` resolves, then shut down gracefully within
/// `config.shutdown_grace`.
///
/// ```no_run
/// # async fn run(app: axum::Router) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// let stopped = orders_api::serve(listener, app, Default::default(), async {
///     let _ = tokio::signal::ctrl_c().await;
/// })
/// .await;
/// println!("{stopped:?}");
/// # Ok(())
/// # }
/// ```
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: ServerConfig,
    signal: impl Future<Output = ()>,
) -> Shutdown {
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let (requests, _) = tokio::sync::watch::channel(0_usize);
    let requests = Arc::new(requests);
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);

    tokio::pin!(signal);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut signal => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(err) => {
                    tracing::warn!(error = ?err.to_string(), "accepting a connection failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let service = {
            let app = app.clone();
            let requests = requests.clone();
            hyper::service::service_fn(move |req: Request<Incoming>| {
                run_to_completion(app.clone(), req, RequestGuard::enter(&requests))
            })
        };
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                // Timeouts and clients that go away end up here: not the server's problem.
                tracing::debug!(error = ?err.to_string(), "connection closed with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!(
        grace_ms = config.shutdown_grace.as_millis() as u64,
        "shutting down: no new connections; waiting for running requests"
    );
    let mut idle = requests.subscribe();
    let drained = async {
        graceful.shutdown().await;
        let _ = idle.wait_for(|running| *running == 0).await;
    };
    match tokio::time::timeout(config.shutdown_grace, drained).await {
        Ok(()) => Shutdown::Clean,
        Err(_) => Shutdown::DeadlinePassed {
            requests: *requests.borrow(),
        },
    }
}

/// Run the request in its own task: a client that disconnects drops this future, not the
/// handler, and the guard keeps it counted until the handler is done.
async fn run_to_completion(
    app: Router,
    req: Request<Incoming>,
    guard: RequestGuard,
) -> Result<Response, std::convert::Infallible> {
    let task = tokio::spawn(async move {
        let response = app.oneshot(req.map(axum::body::Body::new)).await;
        drop(guard);
        response
    });
    Ok(match task.await {
        Ok(Ok(response)) => response,
        Ok(Err(never)) => match never {},
        Err(err) => {
            tracing::error!(error = ?err.to_string(), "a request task failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    })
}

/// Counts a running request while it lives.
struct RequestGuard(Arc<tokio::sync::watch::Sender<usize>>);

impl RequestGuard {
    fn enter(requests: &Arc<tokio::sync::watch::Sender<usize>>) -> Self {
        requests.send_modify(|running| *running += 1);
        Self(requests.clone())
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.send_modify(|running| *running -= 1);
    }
}
