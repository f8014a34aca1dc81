//! A TCP proxy for fault-injection tests.
//!
//! [`FaultProxy::start`] listens on `127.0.0.1:0` and forwards every connection to a target (a
//! database, Redis). Point the code under test at [`FaultProxy::addr`] instead of the target,
//! then, on command:
//!
//! | command | effect |
//! |---|---|
//! | [`set_latency`](FaultProxy::set_latency) | every chunk from the target waits that long before it is forwarded (one added round-trip delay) |
//! | [`cut_all`](FaultProxy::cut_all) | every current connection is closed at once, on both sides |
//! | [`black_hole`](FaultProxy::black_hole) | connections stay open but nothing is forwarded, both ways; new connections are accepted and held silent |
//! | [`refuse`](FaultProxy::refuse) | the target looks down: current connections are cut and new ones are closed as soon as they are accepted |
//! | [`lose_answers`](FaultProxy::lose_answers) | a share of answers, drawn from a seeded generator, is lost: the target did the work, the client's connection is cut instead of answered |
//! | [`restore`](FaultProxy::restore) | forward normally again, no latency, no loss; connections that lost bytes in a black hole are cut |
//! | [`cut_at`](FaultProxy::cut_at) | once: cut the connection that sends a chunk containing a pattern (say `COMMIT`), before the chunk reaches the target or just before its answer comes back |
//!
//! Each command is a plain method (no `.await`), so a test can drive the proxy from any thread.
//! Every task of the proxy stops when it is dropped.
//!
//! The proxy also counts what it carries ([`traffic`](FaultProxy::traffic)): bytes each way and
//! round trips (the client sends, the target answers), whatever the protocol. For counts that
//! need the protocol (statements, say), [`start_watching`](FaultProxy::start_watching) gives
//! each connection a [`Watch`] that sees every byte the client sends.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let target = echo.local_addr()?;
//! tokio::spawn(async move {
//!     let (mut socket, _) = echo.accept().await.unwrap();
//!     let mut buf = [0; 5];
//!     socket.read_exact(&mut buf).await.unwrap();
//!     socket.write_all(&buf).await.unwrap();
//! });
//!
//! let proxy = fault_proxy::FaultProxy::start(target).await?;
//! let mut client = tokio::net::TcpStream::connect(proxy.addr()).await?;
//! client.write_all(b"hello").await?;
//! let mut answer = [0; 5];
//! client.read_exact(&mut answer).await?;
//! assert_eq!(&answer, b"hello");
//! # Ok(()) }
//! ```

use std::{
    fmt, io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use rand::{rngs::StdRng, Rng, SeedableRng};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{tcp::OwnedReadHalf, tcp::OwnedWriteHalf, TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// How many bytes one read forwards at most.
const CHUNK: usize = 16 * 1024;

/// What the proxy does with traffic right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forwarding {
    Pass,
    BlackHole,
    Refuse,
}

#[derive(Debug, Clone, Copy)]
struct State {
    forwarding: Forwarding,
    latency: Duration,
    /// Bumped by every cut: each connection closes when it sees a new value.
    cuts: u64,
}

/// Where [`FaultProxy::cut_at`] cuts the connection that sent the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutPoint {
    /// The chunk carrying the pattern never reaches the target.
    BeforeSending,
    /// The chunk reaches the target; the target's next answer on that connection is dropped and
    /// the connection cut. (For a `COMMIT`: the transaction commits, the client never learns it.)
    BeforeTheAnswer,
}

/// What the proxy carried, over every connection since it started. See
/// [`FaultProxy::traffic`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes forwarded from clients to the target.
    pub bytes_to_target: u64,
    /// Bytes forwarded from the target to clients.
    pub bytes_from_target: u64,
    /// Round trips: a client sent bytes, then the target answered (however many chunks each
    /// way). Bytes the target sends unasked (a notification) start no round trip.
    pub round_trips: u64,
    /// Answers lost by [`FaultProxy::lose_answers`]: counted in `round_trips`, never forwarded.
    pub answers_lost: u64,
}

impl Traffic {
    /// What was carried between `earlier` and `self`.
    pub fn since(self, earlier: Traffic) -> Traffic {
        Traffic {
            bytes_to_target: self.bytes_to_target - earlier.bytes_to_target,
            bytes_from_target: self.bytes_from_target - earlier.bytes_from_target,
            round_trips: self.round_trips - earlier.round_trips,
            answers_lost: self.answers_lost - earlier.answers_lost,
        }
    }
}

/// Sees every chunk a client sends on one connection, before it is forwarded: protocol-aware
/// counting on top of [`Traffic`]. Made once per connection by
/// [`FaultProxy::start_watching`]'s factory, so it may keep state across chunks.
pub trait Watch: Send + 'static {
    /// `chunk` is on its way from the client to the target.
    fn sent(&mut self, chunk: &[u8]);
}

/// Makes a connection's [`Watch`].
type MakeWatch = Arc<dyn Fn() -> Box<dyn Watch> + Send + Sync>;

/// Counts, the one-shot trigger and the loss generator, shared by the proxy and its tasks.
#[derive(Debug, Default)]
struct Counters {
    open: AtomicUsize,
    accepted: AtomicUsize,
    cut: AtomicUsize,
    trigger: Mutex<Option<(Vec<u8>, CutPoint)>>,
    fired: AtomicUsize,
    bytes_to_target: AtomicU64,
    bytes_from_target: AtomicU64,
    round_trips: AtomicU64,
    answers_lost: AtomicU64,
    /// The share of answers lost and the generator that draws them.
    loss: Mutex<Option<(f64, StdRng)>>,
}

impl Counters {
    /// Take the trigger if `chunk` contains its pattern.
    fn fire(&self, chunk: &[u8]) -> Option<CutPoint> {
        let mut trigger = self.trigger.lock().unwrap_or_else(|e| e.into_inner());
        let (pattern, point) = trigger.as_ref()?;
        if pattern.is_empty()
            || !chunk
                .windows(pattern.len())
                .any(|w| w == pattern.as_slice())
        {
            return None;
        }
        let point = *point;
        *trigger = None;
        self.fired.fetch_add(1, Ordering::SeqCst);
        Some(point)
    }

    /// One draw for an answer: whether [`FaultProxy::lose_answers`] loses it.
    fn lose(&self) -> bool {
        let mut loss = self.loss.lock().unwrap_or_else(|e| e.into_inner());
        let Some((share, rng)) = loss.as_mut() else {
            return false;
        };
        let lost = rng.random_bool(*share);
        if lost {
            self.answers_lost.fetch_add(1, Ordering::SeqCst);
        }
        lost
    }
}

/// A TCP proxy on `127.0.0.1` whose faults the test controls. See the [crate docs](crate).
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    state: watch::Sender<State>,
    counters: Arc<Counters>,
    acceptor: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = *self.state.borrow();
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("target", &self.target)
            .field("forwarding", &state.forwarding)
            .field("latency", &state.latency)
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

impl FaultProxy {
    /// Listen on `127.0.0.1:0` and forward to `target`. Must be called inside a tokio runtime,
    /// which runs the proxy's tasks.
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        Self::listen(target, None).await
    }

    /// [`start`](Self::start), with a [`Watch`] made by `make` for each connection, which sees
    /// every chunk its client sends.
    pub async fn start_watching<W: Watch>(
        target: SocketAddr,
        make: impl Fn() -> W + Send + Sync + 'static,
    ) -> io::Result<Self> {
        Self::listen(
            target,
            Some(Arc::new(move || Box::new(make()) as Box<dyn Watch>)),
        )
        .await
    }

    async fn listen(target: SocketAddr, watch: Option<MakeWatch>) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, _) = watch::channel(State {
            forwarding: Forwarding::Pass,
            latency: Duration::ZERO,
            cuts: 0,
        });
        let counters = Arc::new(Counters::default());
        let acceptor = tokio::spawn(accept_loop(
            listener,
            target,
            state.clone(),
            counters.clone(),
            watch,
        ));
        Ok(Self {
            addr,
            target,
            state,
            counters,
            acceptor,
        })
    }

    /// The address to connect to instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address traffic is forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Delay every chunk coming back from the target by `latency` (zero: no delay).
    pub fn set_latency(&self, latency: Duration) {
        self.state.send_modify(|s| s.latency = latency);
    }

    /// Close every current connection, both to the client and to the target. New connections are
    /// served as before.
    pub fn cut_all(&self) {
        self.state.send_modify(|s| s.cuts += 1);
    }

    /// [`cut_all`](Self::cut_all), then wait (a second at most) until the connections open at
    /// the call are closed: each closes in its own task, so a client that writes right after
    /// `cut_all` may still get through once.
    pub async fn cut_all_and_wait(&self) {
        let (open, cut) = (self.open_connections(), self.cut_connections());
        self.cut_all();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while self.cut_connections() < cut + open && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Keep connections open but forward nothing, either way; accept new connections and keep them
    /// silent. Bytes sent meanwhile are lost, so [`restore`](Self::restore) cuts those connections.
    pub fn black_hole(&self) {
        self.state
            .send_modify(|s| s.forwarding = Forwarding::BlackHole);
    }

    /// Make the target look down: cut every current connection and close new ones as soon as they
    /// are accepted.
    pub fn refuse(&self) {
        self.state.send_modify(|s| {
            s.forwarding = Forwarding::Refuse;
            s.cuts += 1;
        });
    }

    /// From now on, lose each answer with probability `share` (0 to 1), drawn from a generator
    /// seeded with `seed`: the target has received the request and answered (so it did the
    /// work), and the client's connection is cut instead of answered, the way a network that
    /// lost the answer looks to the client. One draw per answer (a round trip), so the same seed
    /// loses the same answers of the same sequence of requests. Replaces an earlier loss.
    ///
    /// # Panics
    ///
    /// If `share` is not between 0 and 1.
    pub fn lose_answers(&self, share: f64, seed: u64) {
        assert!(
            (0.0..=1.0).contains(&share),
            "the share of answers lost must be between 0 and 1, got {share}"
        );
        *self.counters.loss.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((share, StdRng::seed_from_u64(seed)));
    }

    /// Forward normally again, with no latency and no loss. Connections that went through a black
    /// hole are cut (their byte streams have holes).
    pub fn restore(&self) {
        *self.counters.loss.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.state.send_modify(|s| {
            if s.forwarding == Forwarding::BlackHole {
                s.cuts += 1;
            }
            s.forwarding = Forwarding::Pass;
            s.latency = Duration::ZERO;
        });
    }

    /// Once: cut the first connection that sends a chunk containing `pattern`, at `point`. Other
    /// connections are untouched. Replaces a trigger that has not fired yet.
    pub fn cut_at(&self, pattern: impl Into<Vec<u8>>, point: CutPoint) {
        *self
            .counters
            .trigger
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((pattern.into(), point));
    }

    /// How many [`cut_at`](Self::cut_at) triggers have fired.
    pub fn triggers_fired(&self) -> usize {
        self.counters.fired.load(Ordering::SeqCst)
    }

    /// Connections currently open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// Connections accepted since the start (refused ones included).
    pub fn accepted_connections(&self) -> usize {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed by a cut, a refusal, a restore or a lost answer since the start.
    pub fn cut_connections(&self) -> usize {
        self.counters.cut.load(Ordering::SeqCst)
    }

    /// What the proxy carried since it started: bytes each way, round trips, answers lost.
    pub fn traffic(&self) -> Traffic {
        let c = &self.counters;
        Traffic {
            bytes_to_target: c.bytes_to_target.load(Ordering::SeqCst),
            bytes_from_target: c.bytes_from_target.load(Ordering::SeqCst),
            round_trips: c.round_trips.load(Ordering::SeqCst),
            answers_lost: c.answers_lost.load(Ordering::SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The connection tasks see the state sender go away and close.
        self.acceptor.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    state: watch::Sender<State>,
    counters: Arc<Counters>,
    watch: Option<MakeWatch>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        counters.accepted.fetch_add(1, Ordering::SeqCst);
        let watcher = state.subscribe();
        if watcher.borrow().forwarding == Forwarding::Refuse {
            counters.cut.fetch_add(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let counters = counters.clone();
        let watch = watch.as_ref().map(|make| make());
        tokio::spawn(async move {
            counters.open.fetch_add(1, Ordering::SeqCst);
            let cut = serve(client, target, watcher, &counters, watch).await;
            counters.open.fetch_sub(1, Ordering::SeqCst);
            if cut {
                counters.cut.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
}

/// Serve one connection until either side closes, or a cut (`true`) or the proxy's drop ends it.
async fn serve(
    client: TcpStream,
    target: SocketAddr,
    mut watcher: watch::Receiver<State>,
    counters: &Counters,
    watch: Option<Box<dyn Watch>>,
) -> bool {
    let start = *watcher.borrow_and_update();
    let traffic = watcher.clone();
    let closed = async move {
        loop {
            if watcher.changed().await.is_err() {
                return false; // the proxy was dropped
            }
            if watcher.borrow_and_update().cuts != start.cuts {
                return true;
            }
        }
    };
    let forward = async move {
        if start.forwarding == Forwarding::BlackHole {
            // Accepted, never answered.
            return std::future::pending::<bool>().await;
        }
        let Ok(upstream) = TcpStream::connect(target).await else {
            return false;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (upstream_read, upstream_write) = upstream.into_split();
        let connection = Connection::default();
        let outbound = Pump {
            state: traffic.clone(),
            direction: Direction::ToTarget(watch),
            counters,
            connection: &connection,
        };
        let inbound = Pump {
            state: traffic,
            direction: Direction::FromTarget,
            counters,
            connection: &connection,
        };
        tokio::select! {
            cut = outbound.run(client_read, upstream_write) => cut,
            cut = inbound.run(upstream_read, client_write) => cut,
        }
    };
    tokio::select! {
        cut = closed => cut,
        cut = forward => cut,
    }
}

/// What the two directions of one connection share.
#[derive(Debug, Default)]
struct Connection {
    /// A trigger fired `BeforeTheAnswer`: the target's next chunk cuts the connection.
    drop_next_answer: AtomicBool,
    /// The client sent bytes the target has not answered yet: its next chunk is an answer.
    asked: AtomicBool,
}

/// Which way a [`Pump`] copies.
enum Direction {
    /// Client to target: triggers fire here, the watch sees every chunk.
    ToTarget(Option<Box<dyn Watch>>),
    /// Target to client: delayed by the latency, answers counted and lost here.
    FromTarget,
}

/// One direction of a connection.
struct Pump<'a> {
    state: watch::Receiver<State>,
    direction: Direction,
    counters: &'a Counters,
    connection: &'a Connection,
}

impl Pump<'_> {
    /// Copy chunk by chunk, following the current state: drop chunks in a black hole, delay the
    /// target's chunks by the latency. Returns `true` when a trigger or a lost answer cut the
    /// connection.
    async fn run(mut self, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) -> bool {
        let mut buf = vec![0; CHUNK];
        let (counters, connection) = (self.counters, self.connection);
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let inbound = matches!(self.direction, Direction::FromTarget);
            let latency = self.state.borrow().latency;
            if inbound && !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            if inbound && connection.drop_next_answer.load(Ordering::SeqCst) {
                return true;
            }
            // Judge the black hole after the delay: a chunk in the air when it began is lost.
            if self.state.borrow().forwarding != Forwarding::Pass {
                continue;
            }
            let fired = match &mut self.direction {
                Direction::ToTarget(watch) => {
                    if let Some(watch) = watch {
                        watch.sent(chunk);
                    }
                    counters.fire(chunk)
                }
                Direction::FromTarget => {
                    if connection.asked.swap(false, Ordering::SeqCst) {
                        counters.round_trips.fetch_add(1, Ordering::SeqCst);
                        if counters.lose() {
                            return true;
                        }
                    }
                    None
                }
            };
            if fired == Some(CutPoint::BeforeSending) {
                return true;
            }
            let bytes = if inbound {
                &counters.bytes_from_target
            } else {
                // Before the bytes leave: the answer to them may come back at once.
                connection.asked.store(true, Ordering::SeqCst);
                &counters.bytes_to_target
            };
            // Counted before the write, so a reader of the answer finds it counted.
            bytes.fetch_add(n as u64, Ordering::SeqCst);
            if to.write_all(chunk).await.is_err() {
                return false;
            }
            if fired == Some(CutPoint::BeforeTheAnswer) {
                connection.drop_next_answer.store(true, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// An echo server that serves every connection until it closes.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(client: &mut TcpStream, within: Duration) -> io::Result<()> {
        client.write_all(b"ping").await?;
        let mut answer = [0; 4];
        match tokio::time::timeout(within, client.read_exact(&mut answer)).await {
            Ok(read) => read.map(|_| assert_eq!(&answer, b"ping")),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no answer")),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn latency_delays_the_answer_and_restore_removes_it() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, Duration::from_secs(5))
            .await
            .unwrap();
        proxy.set_latency(Duration::from_millis(300));
        let started = Instant::now();
        round_trip(&mut client, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300));
        proxy.restore();
        let started = Instant::now();
        round_trip(&mut client, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_millis(300));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_cut_closes_current_connections_and_new_ones_work() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(proxy.open_connections(), 1);
        proxy.cut_all();
        assert_ends(&mut client, "the cut connection").await;
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut fresh, Duration::from_secs(5))
            .await
            .unwrap();
        // The count is taken just after the sockets close, so the client can see the end first.
        let deadline = Instant::now() + Duration::from_secs(5);
        while proxy.cut_connections() == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(proxy.cut_connections(), 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_black_hole_forwards_nothing_until_restored() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut old, Duration::from_secs(5)).await.unwrap();
        proxy.black_hole();
        let silent = round_trip(&mut old, Duration::from_millis(200)).await;
        assert_eq!(silent.unwrap_err().kind(), io::ErrorKind::TimedOut);
        let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
        let silent = round_trip(&mut held, Duration::from_millis(200)).await;
        assert_eq!(silent.unwrap_err().kind(), io::ErrorKind::TimedOut);
        proxy.restore();
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut fresh, Duration::from_secs(5))
            .await
            .unwrap();
    }

    /// The end of a connection within 5 s, with nothing more received: closed or reset, not
    /// left open and silent.
    async fn assert_ends(stream: &mut TcpStream, what: &str) {
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "{what} must end: {read:?}"
        );
        assert!(
            rest.is_empty(),
            "{what} must receive nothing more: {rest:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn refuse_cuts_current_connections_and_closes_new_ones_until_restored() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut current = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut current, Duration::from_secs(5))
            .await
            .unwrap();
        proxy.refuse();
        assert_ends(&mut current, "the current connection").await;
        let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
        // Closed at once: nothing written to it is answered, and it ends (not a black hole).
        let _ = refused.write_all(b"ping").await;
        assert_ends(&mut refused, "a new connection").await;
        proxy.restore();
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut fresh, Duration::from_secs(5))
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn cut_at_cuts_once_before_or_after_the_target_receives_the_pattern() {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = FaultProxy::start(target.local_addr().unwrap())
            .await
            .unwrap();
        for point in [CutPoint::BeforeSending, CutPoint::BeforeTheAnswer] {
            proxy.cut_at("COMMIT", point);
            let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
            let (mut server, _) = target.accept().await.unwrap();
            client.write_all(b"BEGIN").await.unwrap();
            let mut begin = [0; 5];
            server.read_exact(&mut begin).await.unwrap();
            client.write_all(b"COMMIT").await.unwrap();
            match point {
                CutPoint::BeforeSending => {
                    assert_ends(&mut server, "the target, which must not receive COMMIT,").await;
                }
                CutPoint::BeforeTheAnswer => {
                    let mut commit = [0; 6];
                    server.read_exact(&mut commit).await.unwrap();
                    assert_eq!(&commit, b"COMMIT");
                    let _ = server.write_all(b"OK").await;
                }
            }
            assert_ends(
                &mut client,
                &format!("{point:?}: the client, without the answer,"),
            )
            .await;
        }
        assert_eq!(proxy.triggers_fired(), 2);

        // Fired, the trigger is spent: the pattern passes both ways on another connection.
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        let (mut server, _) = target.accept().await.unwrap();
        client.write_all(b"COMMIT").await.unwrap();
        let mut commit = [0; 6];
        server.read_exact(&mut commit).await.unwrap();
        assert_eq!(&commit, b"COMMIT");
        server.write_all(b"OK").await.unwrap();
        let mut answer = [0; 2];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut answer))
            .await
            .expect("the answer comes")
            .unwrap();
        assert_eq!(&answer, b"OK");
        assert_eq!(proxy.triggers_fired(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn dropping_the_proxy_closes_its_connections() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let addr = proxy.addr();
        let mut client = TcpStream::connect(addr).await.unwrap();
        round_trip(&mut client, Duration::from_secs(5))
            .await
            .unwrap();
        drop(proxy);
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn traffic_counts_bytes_each_way_and_one_round_trip_per_answer() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        for _ in 0..3 {
            round_trip(&mut client, Duration::from_secs(5))
                .await
                .unwrap();
        }
        // The echo's last answer is read before the count is taken: the proxy counted it before
        // forwarding it.
        let traffic = proxy.traffic();
        assert_eq!(traffic.round_trips, 3, "{traffic:?}");
        assert_eq!(traffic.bytes_to_target, 12, "{traffic:?}");
        assert_eq!(traffic.bytes_from_target, 12, "{traffic:?}");
        assert_eq!(traffic.answers_lost, 0);
        let before = proxy.traffic();
        round_trip(&mut client, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(proxy.traffic().since(before).round_trips, 1);
    }

    /// A target that counts the requests it received, answering each with `done`.
    async fn counting_server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let count = received.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = [0; 4];
                    while socket.read_exact(&mut buf).await.is_ok() {
                        count.fetch_add(1, Ordering::SeqCst);
                        if socket.write_all(b"done").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, received)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_lost_answer_reaches_the_target_and_cuts_the_client() {
        let (target, received) = counting_server().await;
        let proxy = FaultProxy::start(target).await.unwrap();
        proxy.lose_answers(1.0, 7);
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"work").await.unwrap();
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answer)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        assert!(answer.is_empty(), "the answer must be lost: {answer:?}");
        assert_eq!(
            received.load(Ordering::SeqCst),
            1,
            "the target did the work"
        );
        assert_eq!(proxy.traffic().answers_lost, 1);
        proxy.restore();
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        fresh.write_all(b"work").await.unwrap();
        let mut done = [0; 4];
        fresh.read_exact(&mut done).await.unwrap();
        assert_eq!(&done, b"done");
    }

    /// Send `n` requests, each on a new connection when the last one was cut; which were lost.
    async fn lost_pattern(proxy: &FaultProxy, n: usize) -> Vec<bool> {
        let mut lost = Vec::new();
        for _ in 0..n {
            let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
            client.write_all(b"work").await.unwrap();
            let mut done = [0; 4];
            let read = tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut done))
                .await
                .expect("an answer or a cut");
            lost.push(read.is_err());
        }
        lost
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_same_seed_loses_the_same_answers() {
        let (target, _) = counting_server().await;
        let proxy = FaultProxy::start(target).await.unwrap();
        proxy.lose_answers(0.5, 42);
        let first = lost_pattern(&proxy, 40).await;
        proxy.lose_answers(0.5, 42);
        let second = lost_pattern(&proxy, 40).await;
        assert_eq!(first, second);
        let lost = first.iter().filter(|l| **l).count();
        assert!((5..=35).contains(&lost), "half of 40, give or take: {lost}");
        assert_eq!(proxy.traffic().answers_lost, 2 * lost as u64);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_watch_sees_every_byte_each_client_sends() {
        let seen = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let connections = seen.clone();
        struct Record(Arc<Mutex<Vec<Vec<u8>>>>, usize);
        impl Watch for Record {
            fn sent(&mut self, chunk: &[u8]) {
                self.0.lock().unwrap()[self.1].extend_from_slice(chunk);
            }
        }
        let proxy = FaultProxy::start_watching(echo_server().await, move || {
            let mut all = connections.lock().unwrap();
            all.push(Vec::new());
            Record(connections.clone(), all.len() - 1)
        })
        .await
        .unwrap();
        for _ in 0..2 {
            let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
            round_trip(&mut client, Duration::from_secs(5))
                .await
                .unwrap();
            round_trip(&mut client, Duration::from_secs(5))
                .await
                .unwrap();
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [b"pingping".to_vec(), b"pingping".to_vec()]
        );
    }
}
