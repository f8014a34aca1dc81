//! A store that cannot be reached: fail closed (503) by default, or fail open.
//!
//! Store-specific: instantiated per unreachable store by [`store_down_tests!`](crate::store_down_tests).

use super::*;

/// For each `name => store` pair, a module `name` with one test per store-down behaviour, each
/// on the (unreachable) store the expression makes.
#[macro_export]
macro_rules! store_down_tests {
    ($($backend:ident => $store:expr),+ $(,)?) => {
        $(
            mod $backend {
                use super::*;
                $crate::store_down_tests!(@list [tests $store]);
            }
        )+
    };
    (@names) => {
        $crate::store_down_tests!(@list [names])
    };
    (@list $mode:tt) => {
        $crate::store_down_tests! {@expand $mode;
            store_down_fails_closed,
            store_down_fail_open_calls_the_handler,
            store_down_fail_open_hands_the_handler_its_key,
        }
    };
    (@expand [names]; $($name:ident),+ $(,)?) => {
        &[$(stringify!($name)),+]
    };
    (@expand [tests $store:expr]; $($name:ident),+ $(,)?) => {
        $crate::bounded_tests!($store; $($name => $crate::suite::store_down::$name),+);
    };
}

/// The store-down behaviours, by name.
pub const STORE_DOWN: &[&str] = crate::store_down_tests!(@names);

/// With an unreachable store (fail closed, the default): 503 with `Retry-After`, handler not
/// called.
pub async fn store_down_fails_closed(store: impl Store) {
    let server = serve(Idempotency::new(store)).await;
    let reply = send(server.order("down-1")).await;
    reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE);
    assert!(reply.retry_after() >= 1);
    assert_eq!(server.state.executions(), 0);
}

/// With an unreachable store and `.fail_open()`: the handler is called (without idempotency).
pub async fn store_down_fail_open_calls_the_handler(store: impl Store) {
    let server = serve(Idempotency::new(store).fail_open()).await;
    send(server.order("down-2"))
        .await
        .assert_executed(StatusCode::CREATED, 1);
    send(server.order("down-2"))
        .await
        .assert_executed(StatusCode::CREATED, 2);
}

/// With an unreachable store and `.fail_open()`: the handler called without a claim still gets
/// the request's key (its `IdempotencyKey` extractor finds it), to pass on downstream.
pub async fn store_down_fail_open_hands_the_handler_its_key(store: impl Store) {
    let server = serve(Idempotency::new(store).fail_open()).await;
    send(server.order("down-3"))
        .await
        .assert_executed(StatusCode::CREATED, 1);
    assert_eq!(server.state.executions_of("down-3"), 1);
}

/// A TCP proxy on `127.0.0.1:0` to `target`, to take a store "down" under a live client.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Start proxying to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = {
            let tasks = tasks.clone();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    tasks.lock().unwrap().push(task);
                }
            })
        };
        Self {
            addr,
            tasks,
            accept,
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Close the listening port and every proxied connection.
    pub async fn shutdown(self) {
        self.accept.abort();
        let _ = self.accept.await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap());
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
    }
}
