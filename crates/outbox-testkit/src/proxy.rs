//! A TCP proxy that cuts connections the way networks do.
//!
//! It runs on its own thread with its own tokio runtime, so it keeps forwarding while
//! the test's runtime is blocked. Each direction has a [`Mode`]; the mode is read for
//! every chunk as it arrives, so changing it affects live connections at once:
//!
//! - `Pass`: forward.
//! - `Delay(d)`: forward each chunk `d` after it arrived (latency, not a rate limit;
//!   order kept).
//! - `BlackHole`: read and drop; nothing is forwarded, not even a FIN or a reset, and the
//!   connection stays open, like a silently dead network path. What was dropped is
//!   lost: switching back to `Pass` resumes a corrupted stream.
//! - `Pause`: stop reading; what is sent waits and flows intact when the mode changes.
//!
//! [`TcpProxy::set_mode_of_matching`] gives the connections whose client sends a pattern
//! early (one protocol's handshake: a PostgreSQL replication connection's startup message)
//! a mode of their own, like a firewall rule for that protocol alone.
//!
//! [`TcpProxy::reset_all`] closes every current connection with an RST on both sides
//! (SO_LINGER 0, then close). New connections are accepted in every mode.
//! [`TcpProxy::retarget`] points new connections at another server and resets the current
//! ones: a VIP or DNS name moved to a promoted standby.
//!
//! It owns only the connections it accepted, and never rewrites a byte: every fault it makes
//! is one a network makes (loss, delay, a stall, a reset).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What a direction does with the bytes it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(Duration),
    BlackHole,
    /// Stop reading: bytes wait in the kernel buffers (the sender is eventually blocked
    /// by TCP flow control) and flow again, intact, when the mode changes back.
    Pause,
}

/// A direction of the proxied connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client (e.g. the relay) to the server.
    ClientToServer,
    /// From the server to the client.
    ServerToClient,
}

struct Shared {
    /// Read at each accept: [`TcpProxy::retarget`] changes it.
    target: Mutex<String>,
    modes: Mutex<[Mode; 2]>,
    /// Bumped by `reset_all`; connections watch it.
    reset: watch::Sender<u64>,
    live: Mutex<HashSet<u64>>,
    accepted: AtomicUsize,
    /// [`TcpProxy::set_mode_of_matching`]: the pattern and its mode.
    matching: Mutex<Option<(Vec<u8>, Mode)>>,
    /// Connections the pattern selected since the start.
    matched: AtomicUsize,
}

impl Shared {
    fn mode(&self, direction: Direction) -> Mode {
        self.modes.lock().unwrap_or_else(|e| e.into_inner())[direction as usize]
    }

    /// The mode of one connection's direction: the matching mode once its client sent the
    /// pattern, while one is set; the proxy's otherwise.
    fn mode_of(&self, direction: Direction, selected: &AtomicBool) -> Mode {
        if selected.load(Ordering::Relaxed) {
            let matching = self.matching.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, mode)) = &*matching {
                return *mode;
            }
        }
        self.mode(direction)
    }

    /// Selects the connection when `chunk`, read from its client within its first
    /// [`MATCH_WITHIN`] bytes (`seen` before it), holds the pattern.
    fn classify(&self, chunk: &[u8], seen: usize, selected: &AtomicBool) {
        if seen >= MATCH_WITHIN || selected.load(Ordering::Relaxed) {
            return;
        }
        let matching = self.matching.lock().unwrap_or_else(|e| e.into_inner());
        let Some((pattern, _)) = &*matching else {
            return;
        };
        if !pattern.is_empty() && chunk.windows(pattern.len()).any(|w| w == &pattern[..]) {
            selected.store(true, Ordering::Relaxed);
            self.matched.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How far into what a client sends [`TcpProxy::set_mode_of_matching`] looks: a handshake,
/// not the traffic after it.
const MATCH_WITHIN: usize = 1024;

/// A TCP proxy on a free 127.0.0.1 port in front of `target`.
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpProxy {
    /// Starts a proxy to `target` (`host:port`), both directions in `Pass`.
    pub fn start(target: &str) -> TcpProxy {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy's listener");
        listener.set_nonblocking(true).expect("set_nonblocking");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            target: Mutex::new(target.to_string()),
            modes: Mutex::new([Mode::Pass; 2]),
            reset: watch::channel(0).0,
            live: Mutex::new(HashSet::new()),
            accepted: AtomicUsize::new(0),
            matching: Mutex::new(None),
            matched: AtomicUsize::new(0),
        });
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("build the proxy's runtime");
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("tokio listener");
                    tokio::select! {
                        _ = accept_loop(listener, thread_shared) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime drops every connection task and its sockets.
            })
            .expect("spawn the proxy thread");
        TcpProxy {
            addr,
            shared,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server new connections go to (`host:port`).
    pub fn target(&self) -> String {
        self.shared
            .target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Points new connections at `target` (`host:port`) and resets every current one (an
    /// RST to both ends, as [`Self::reset_all`]), the way a VIP or DNS name moved to
    /// another server leaves its clients: whoever reconnects reaches the new server.
    pub fn retarget(&self, target: &str) {
        *self.shared.target.lock().unwrap_or_else(|e| e.into_inner()) = target.to_string();
        self.reset_all();
    }

    /// Sets one direction's mode; live connections follow from their next chunk.
    pub fn set_mode(&self, direction: Direction, mode: Mode) {
        self.shared.modes.lock().unwrap_or_else(|e| e.into_inner())[direction as usize] = mode;
    }

    /// Sets both directions' mode.
    pub fn set_modes(&self, mode: Mode) {
        *self.shared.modes.lock().unwrap_or_else(|e| e.into_inner()) = [mode; 2];
    }

    pub fn mode(&self, direction: Direction) -> Mode {
        self.shared.mode(direction)
    }

    /// Gives every connection whose client sends `pattern` within its first 1 KiB `mode`, in
    /// both directions, from the chunk that holds it on, whatever the proxy's modes: a rule
    /// for one protocol alone (a PostgreSQL replication connection's startup message holds
    /// `replication\0database\0`; an ordinary one's does not). Connections accepted earlier
    /// are matched too if they are still within their first 1 KiB; those selected follow a
    /// change of `mode` at once.
    pub fn set_mode_of_matching(&self, pattern: &[u8], mode: Mode) {
        *self
            .shared
            .matching
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((pattern.to_vec(), mode));
    }

    /// Ends [`Self::set_mode_of_matching`]: the selected connections follow the proxy's
    /// modes again (what a black hole dropped stays lost).
    pub fn clear_mode_of_matching(&self) {
        *self
            .shared
            .matching
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Connections [`Self::set_mode_of_matching`]'s patterns selected since the start.
    pub fn matched_connections(&self) -> usize {
        self.shared.matched.load(Ordering::Relaxed)
    }

    /// Closes every current connection with an RST to both ends, and returns once they
    /// are closed (at most 5 s). Connections accepted afterwards are not affected.
    pub fn reset_all(&self) {
        let current: HashSet<u64> = self.shared.live.lock().unwrap().clone();
        self.shared.reset.send_modify(|generation| *generation += 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if self.shared.live.lock().unwrap().is_disjoint(&current) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("proxy connections still open 5 s after reset_all");
    }

    /// Connections currently open.
    pub fn live_connections(&self) -> usize {
        self.shared.live.lock().unwrap().len()
    }

    /// Connections accepted since the start.
    pub fn accepted_connections(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    static NEXT_ID: AtomicU64 = AtomicU64::new(0);
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // Registered before the task runs, so a reset_all right after the accept sees it.
        shared.live.lock().unwrap().insert(id);
        let reset = shared.reset.subscribe();
        let shared = shared.clone();
        tokio::spawn(async move {
            connection(client, &shared, reset).await;
            shared.live.lock().unwrap().remove(&id);
        });
    }
}

async fn connection(client: TcpStream, shared: &Shared, mut reset: watch::Receiver<u64>) {
    reset.borrow_and_update();
    let target = shared
        .target
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let server = tokio::select! {
        server = TcpStream::connect(&target) => server.ok(),
        _ = reset.changed() => None,
    };
    let Some(server) = server else {
        // The client sees a refused or reset upstream as a reset.
        set_zero_linger(client.as_raw_fd());
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let selected = AtomicBool::new(false);
    let clean = tokio::select! {
        outcome = async {
            tokio::try_join!(
                pump(&mut client_read, &mut server_write, (shared, &selected), Direction::ClientToServer),
                pump(&mut server_read, &mut client_write, (shared, &selected), Direction::ServerToClient),
            )
        } => outcome.is_ok(),
        // A reset, or the proxy shutting down.
        _ = reset.changed() => false,
    };
    // Dropping an OwnedWriteHalf sends a FIN; a reunited stream closes without one, so
    // with SO_LINGER 0 the peer sees only the RST.
    let client = client_read
        .reunite(client_write)
        .expect("halves of one stream");
    let server = server_read
        .reunite(server_write)
        .expect("halves of one stream");
    if !clean {
        // An error on one side, or reset_all: both ends get an RST.
        set_zero_linger(client.as_raw_fd());
        set_zero_linger(server.as_raw_fd());
    }
}

/// Sets SO_LINGER 0 so that closing the socket sends an RST.
fn set_zero_linger(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a socket fd that is open for the duration of the call, and an option value
    // of the size we pass.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Forwards one direction until EOF (then half-closes the far side: FIN) or an error.
/// In `BlackHole` mode an EOF or error is swallowed too: the direction just goes quiet.
/// `selected`: whether the connection's client sent [`TcpProxy::set_mode_of_matching`]'s
/// pattern (the client's direction decides it).
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    (shared, selected): (&Shared, &AtomicBool),
    direction: Direction,
) -> Result<(), ()> {
    // Chunks with the time they are due; bounded, so a slow reader pushes back.
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(256);
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut seen = 0;
        loop {
            if shared.mode_of(direction, selected) == Mode::Pause {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let read = from.read(&mut buf).await;
            if let (Ok(n), Direction::ClientToServer) = (&read, direction) {
                shared.classify(&buf[..*n], seen, selected);
                seen += n;
            }
            let mode = shared.mode_of(direction, selected);
            match (read, mode) {
                (Ok(0) | Err(_), Mode::BlackHole) => std::future::pending::<()>().await,
                // Dropping `tx` lets the writer finish and send the FIN.
                (Ok(0), _) => return Ok(()),
                (Err(_), _) => return Err(()),
                (Ok(_), Mode::BlackHole) => {}
                (Ok(n), Mode::Pass | Mode::Pause) => {
                    let _ = tx.send((Instant::now(), buf[..n].to_vec())).await;
                }
                (Ok(n), Mode::Delay(delay)) => {
                    let _ = tx.send((Instant::now() + delay, buf[..n].to_vec())).await;
                }
            }
        }
    };
    let writer = async {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            to.write_all(&bytes).await.map_err(|_| ())?;
        }
        to.shutdown().await.map_err(|_| ())
    };
    tokio::try_join!(reader, writer).map(|_| ())
}
