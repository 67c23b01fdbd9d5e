//! A fault-injecting TCP proxy between updraft and its server.
//!
//! [`Proxy`] listens on a free `127.0.0.1` port and forwards each accepted
//! connection to an upstream address, byte for byte: TLS stays end to end
//! (the client verifies nginx's certificate through the proxy). What happens
//! to a connection is chosen when it is accepted: the next [`Behaviour`]
//! from the script ([`Proxy::script`]) or, when the script is empty, the
//! default ([`Proxy::set_default`]). Both can be changed at any time; a
//! connection keeps the behaviour it was accepted with, so a test that
//! changes the rules and wants pooled connections to feel them calls
//! [`Proxy::reset_all`].
//!
//! Byte counters are kept per connection and in total, for both directions,
//! counting bytes actually written to the other side, so a test can tell how
//! many bytes a resumed download sent again after a cut.
//!
//! One thread accepts; each connection has two pump threads (one per
//! direction). Dropping the proxy stops listening, resets every open
//! connection and joins every thread. This module must never connect
//! anywhere but the upstream addresses a test gave it.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::SockRef;

/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a reset waits for bytes already written to reach the client.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Copy buffer size.
const BUF: usize = 16 * 1024;

/// What the proxy does with one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Forward both ways until either side closes.
    Pass,
    /// Forward `n` bytes server→client, then reset both sides (RST, via
    /// SO_LINGER 0) once those bytes have reached the client's socket.
    /// `n` counts the whole connection (TLS records included, across
    /// keep-alive requests); a server that ends sooner ends it as with
    /// [`Behaviour::Pass`]. The same holds for the other `…After(n)`.
    ResetAfter(u64),
    /// Forward `n` bytes server→client, then end the client side cleanly
    /// (FIN): a truncated response. The upstream connection is closed.
    CloseAfter(u64),
    /// Forward `n` bytes server→client, then forward nothing more that way
    /// while keeping the connection open (a server that hangs mid-body).
    StallAfter(u64),
    /// Forward server→client at most `bytes_per_sec` (client→server at full
    /// speed).
    Drip {
        /// Rate limit, bytes per second (at least 1).
        bytes_per_sec: u64,
    },
    /// Accept and hold the connection; never contact the upstream, never
    /// answer.
    Stall,
    /// Reset the connection as soon as it is accepted.
    Refuse,
    /// Forward to this address instead of the proxy's upstream (e.g. an
    /// nginx fault block), otherwise like [`Behaviour::Pass`].
    Upstream(SocketAddr),
}

/// Counters of one connection, as seen by [`Proxy::connections`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnStats {
    /// Accept order, from 0.
    pub id: usize,
    /// The behaviour it was accepted with.
    pub behaviour: Behaviour,
    /// Where it was forwarded (None for [`Behaviour::Stall`] and
    /// [`Behaviour::Refuse`]).
    pub upstream: Option<SocketAddr>,
    /// The proxy's own end of the upstream connection: what the upstream
    /// sees as the client address (nginx's `$remote_port`).
    pub upstream_local: Option<SocketAddr>,
    /// Bytes written to the client.
    pub to_client: u64,
    /// Bytes written to the upstream.
    pub to_server: u64,
    /// Both pumps still running.
    pub open: bool,
    /// Why the upstream could not be reached, if it could not.
    pub upstream_error: Option<String>,
}

/// Totals over every connection so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Connections accepted.
    pub connections: usize,
    /// Bytes written to clients.
    pub to_client: u64,
    /// Bytes written to upstreams.
    pub to_server: u64,
}

/// A running proxy; see the module documentation.
pub struct Proxy {
    shared: Arc<Shared>,
    listener: Arc<TcpListener>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    rules: Mutex<Rules>,
    conns: Mutex<Vec<Arc<Conn>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    changed: Condvar,
    stop: AtomicBool,
}

struct Rules {
    upstream: SocketAddr,
    default: Behaviour,
    script: VecDeque<Behaviour>,
}

/// Per-connection counters and a weak handle on its sockets, so that the
/// sockets close when the pumps finish, not when the proxy does.
struct Conn {
    id: usize,
    behaviour: Behaviour,
    upstream: Option<SocketAddr>,
    to_client: AtomicU64,
    to_server: AtomicU64,
    open: AtomicBool,
    upstream_error: Mutex<Option<String>>,
    upstream_local: Mutex<Option<SocketAddr>>,
    sockets: Mutex<Weak<Sockets>>,
}

struct Sockets {
    client: TcpStream,
    server: Option<TcpStream>,
    /// Set once the connection is being reset or cut on purpose: pumps
    /// then stop without propagating a FIN.
    cut: AtomicBool,
}

impl Proxy {
    /// Start a proxy on a free loopback port forwarding to `upstream`, with
    /// default behaviour [`Behaviour::Pass`].
    pub fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| io::Error::new(e.kind(), format!("binding the proxy port: {e}")))?;
        let addr = listener.local_addr()?;
        let listener = Arc::new(listener);
        let shared = Arc::new(Shared {
            rules: Mutex::new(Rules {
                upstream,
                default: Behaviour::Pass,
                script: VecDeque::new(),
            }),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let (s, l) = (Arc::clone(&shared), Arc::clone(&listener));
        let accept = thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || accept_loop(&s, &l))
            .map_err(|e| io::Error::new(e.kind(), format!("starting the proxy thread: {e}")))?;
        Ok(Proxy {
            shared,
            listener,
            addr,
            accept: Some(accept),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Change the upstream for connections accepted from now on.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        lock(&self.shared.rules).upstream = upstream;
    }

    /// The behaviour of connections accepted while the script is empty.
    pub fn set_default(&self, behaviour: Behaviour) {
        lock(&self.shared.rules).default = behaviour;
    }

    /// Append behaviours for the next connections, one each, in order.
    pub fn script(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        lock(&self.shared.rules).script.extend(behaviours);
    }

    /// Drop the behaviours not yet used by a connection.
    pub fn clear_script(&self) {
        lock(&self.shared.rules).script.clear();
    }

    /// How many scripted behaviours are still waiting for a connection.
    pub fn script_len(&self) -> usize {
        lock(&self.shared.rules).script.len()
    }

    /// Reset (RST) every open connection now.
    pub fn reset_all(&self) {
        let conns: Vec<Arc<Conn>> = lock(&self.shared.conns).clone();
        for c in conns {
            if let Some(s) = lock(&c.sockets).upgrade() {
                s.reset(false);
            }
        }
    }

    /// Reset (RST) every open connection but the one numbered `keep` (in
    /// accept order, as [`ConnStats::id`]): a transfer goes on while the
    /// idle connections a client keeps for reuse are closed, so its next
    /// requests open new connections and meet the current behaviour.
    pub fn reset_all_but(&self, keep: usize) {
        let conns: Vec<Arc<Conn>> = lock(&self.shared.conns).clone();
        for c in conns.iter().filter(|c| c.id != keep) {
            if let Some(s) = lock(&c.sockets).upgrade() {
                s.reset(false);
            }
        }
    }

    /// A snapshot of every connection so far, in accept order.
    pub fn connections(&self) -> Vec<ConnStats> {
        lock(&self.shared.conns).iter().map(|c| c.stats()).collect()
    }

    /// Totals over every connection so far.
    pub fn totals(&self) -> Totals {
        let conns = lock(&self.shared.conns);
        Totals {
            connections: conns.len(),
            to_client: conns
                .iter()
                .map(|c| c.to_client.load(Ordering::SeqCst))
                .sum(),
            to_server: conns
                .iter()
                .map(|c| c.to_server.load(Ordering::SeqCst))
                .sum(),
        }
    }

    /// Wait until `done` holds for the connection list or `timeout` passes;
    /// returns the list either way (the caller asserts).
    pub fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ConnStats]) -> bool,
    ) -> Vec<ConnStats> {
        let deadline = Instant::now() + timeout;
        let mut conns = lock(&self.shared.conns);
        loop {
            let stats: Vec<ConnStats> = conns.iter().map(|c| c.stats()).collect();
            let now = Instant::now();
            if done(&stats) || now >= deadline {
                return stats;
            }
            // Counters move without notification: wake at least every 5 ms.
            let wait = (deadline - now).min(Duration::from_millis(5));
            conns = match self.shared.changed.wait_timeout(conns, wait) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Wait until every connection so far has closed (or `timeout`).
    pub fn wait_idle(&self, timeout: Duration) -> Vec<ConnStats> {
        self.wait_for(timeout, |c| c.iter().all(|c| !c.open))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the blocked accept (Linux: a listening socket shut down for
        // reading stops listening and fails pending accepts).
        let _ = SockRef::from(&*self.listener).shutdown(Shutdown::Read);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        self.reset_all();
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Conn {
    fn stats(&self) -> ConnStats {
        ConnStats {
            id: self.id,
            behaviour: self.behaviour,
            upstream: self.upstream,
            upstream_local: *lock(&self.upstream_local),
            to_client: self.to_client.load(Ordering::SeqCst),
            to_server: self.to_server.load(Ordering::SeqCst),
            open: self.open.load(Ordering::SeqCst),
            upstream_error: lock(&self.upstream_error).clone(),
        }
    }
}

impl Sockets {
    /// Reset both sides: SO_LINGER 0 so the last close sends RST, and wake
    /// both pumps (a read on a socket shut down for reading returns 0).
    /// With `drain`, first wait (bounded) until what was written to the
    /// client has left our send queue.
    fn reset(&self, drain: bool) {
        if self.cut.swap(true, Ordering::SeqCst) {
            return;
        }
        if drain {
            wait_sent(&self.client);
        }
        for s in std::iter::once(&self.client).chain(self.server.as_ref()) {
            let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
            let _ = s.shutdown(Shutdown::Read);
        }
    }
}

/// Wait until the kernel has no unsent bytes for `s` (TIOCOUTQ), bounded.
fn wait_sent(s: &TcpStream) {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let mut pending: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one c_int through the pointer, which
        // points at a live local.
        let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut pending) };
        if rc != 0 || pending == 0 || Instant::now() >= deadline {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    loop {
        let client = match listener.accept() {
            Ok((c, _)) => c,
            Err(_) if shared.stop.load(Ordering::SeqCst) => return,
            Err(_) => {
                thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        if shared.stop.load(Ordering::SeqCst) {
            let _ = SockRef::from(&client).set_linger(Some(Duration::ZERO));
            return;
        }
        let (behaviour, upstream) = {
            let mut rules = lock(&shared.rules);
            let b = rules.script.pop_front().unwrap_or(rules.default);
            let up = match b {
                Behaviour::Stall | Behaviour::Refuse => None,
                Behaviour::Upstream(a) => Some(a),
                _ => Some(rules.upstream),
            };
            (b, up)
        };
        let conn = {
            let mut conns = lock(&shared.conns);
            let c = Arc::new(Conn {
                id: conns.len(),
                behaviour,
                upstream,
                to_client: AtomicU64::new(0),
                to_server: AtomicU64::new(0),
                open: AtomicBool::new(true),
                upstream_error: Mutex::new(None),
                upstream_local: Mutex::new(None),
                sockets: Mutex::new(Weak::new()),
            });
            conns.push(Arc::clone(&c));
            shared.changed.notify_all();
            c
        };
        let s = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name(format!("proxy-conn-{}", conn.id))
            .spawn(move || {
                serve(&s, &conn, client);
                conn.open.store(false, Ordering::SeqCst);
                s.changed.notify_all();
            });
        let mut threads = lock(&shared.threads);
        threads.retain(|t| !t.is_finished());
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => eprintln!("proxy: cannot start a connection thread: {e}"),
        }
    }
}

fn serve(shared: &Arc<Shared>, conn: &Arc<Conn>, client: TcpStream) {
    let _ = client.set_nodelay(true);
    let server = match (conn.behaviour, conn.upstream) {
        (Behaviour::Refuse, _) => {
            let _ = SockRef::from(&client).set_linger(Some(Duration::ZERO));
            return;
        }
        (_, None) => None,
        (_, Some(addr)) => match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                *lock(&conn.upstream_local) = s.local_addr().ok();
                Some(s)
            }
            Err(e) => {
                *lock(&conn.upstream_error) = Some(format!("connecting to {addr}: {e}"));
                let _ = SockRef::from(&client).set_linger(Some(Duration::ZERO));
                return;
            }
        },
    };
    let sockets = Arc::new(Sockets {
        client,
        server,
        cut: AtomicBool::new(false),
    });
    *lock(&conn.sockets) = Arc::downgrade(&sockets);
    if shared.stop.load(Ordering::SeqCst) {
        sockets.reset(false);
        return;
    }
    if sockets.server.is_none() {
        // Stall: hold the connection, read and drop what the client sends,
        // until it closes or the proxy resets it.
        let mut buf = [0u8; 4096];
        while matches!((&sockets.client).read(&mut buf), Ok(n) if n > 0) {}
        return;
    }

    let up = {
        let (s, c) = (Arc::clone(&sockets), Arc::clone(conn));
        thread::Builder::new()
            .name(format!("proxy-up-{}", conn.id))
            .spawn(move || client_to_server(&s, &c))
    };
    server_to_client(&sockets, conn);
    match up {
        Ok(h) => {
            let _ = h.join();
        }
        Err(_) => sockets.reset(false),
    }
}

/// Write all of `data` to `to`, adding each written chunk to `counter`.
fn write_counted(mut to: &TcpStream, data: &[u8], counter: &AtomicU64) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        let n = to.write(&data[off..])?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        off += n;
        counter.fetch_add(n as u64, Ordering::SeqCst);
    }
    Ok(())
}

fn client_to_server(s: &Sockets, conn: &Conn) {
    let Some(server) = s.server.as_ref() else {
        return;
    };
    let mut buf = vec![0u8; BUF];
    loop {
        let n = match (&s.client).read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if s.cut.load(Ordering::SeqCst) {
            // Cut on purpose (CloseAfter): keep draining the client so our
            // close is a clean FIN, forward nothing.
            continue;
        }
        if write_counted(server, &buf[..n], &conn.to_server).is_err() {
            if !s.cut.load(Ordering::SeqCst) {
                s.reset(false);
            }
            return;
        }
    }
    if !s.cut.load(Ordering::SeqCst) {
        // The client finished sending: pass its FIN on.
        let _ = server.shutdown(Shutdown::Write);
    }
}

fn server_to_client(s: &Sockets, conn: &Conn) {
    let Some(server) = s.server.as_ref() else {
        return;
    };
    let limit = match conn.behaviour {
        Behaviour::ResetAfter(n) | Behaviour::CloseAfter(n) | Behaviour::StallAfter(n) => Some(n),
        _ => None,
    };
    let rate = match conn.behaviour {
        Behaviour::Drip { bytes_per_sec } => Some(bytes_per_sec.max(1)),
        _ => None,
    };
    // Dripping reads in small slices so the pace is even.
    let chunk = rate.map_or(BUF, |r| (r / 20).clamp(1, BUF as u64) as usize);
    let started = Instant::now();
    let mut buf = vec![0u8; BUF];
    let mut forwarded: u64 = 0;
    loop {
        if limit == Some(forwarded) {
            break;
        }
        let want = match limit {
            Some(l) => chunk.min((l - forwarded).min(BUF as u64) as usize),
            None => chunk,
        };
        let n = match (&*server).read(&mut buf[..want]) {
            Ok(0) => {
                if !s.cut.load(Ordering::SeqCst) {
                    let _ = s.client.shutdown(Shutdown::Write);
                }
                return;
            }
            Ok(n) => n,
            Err(_) => {
                // The upstream reset: reset the client too.
                s.reset(false);
                return;
            }
        };
        if let Some(r) = rate {
            // Sleep until `forwarded + n` bytes are due, in short steps so
            // a reset or a stop is noticed.
            let due = Duration::from_secs_f64((forwarded + n as u64) as f64 / r as f64);
            while started.elapsed() < due {
                if s.cut.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(
                    due.saturating_sub(started.elapsed())
                        .min(Duration::from_millis(20)),
                );
            }
        }
        if write_counted(&s.client, &buf[..n], &conn.to_client).is_err() {
            s.reset(false);
            return;
        }
        forwarded += n as u64;
    }
    match conn.behaviour {
        Behaviour::ResetAfter(_) => s.reset(true),
        Behaviour::CloseAfter(_) => {
            s.cut.store(true, Ordering::SeqCst);
            let _ = s.client.shutdown(Shutdown::Write);
            let _ = server.shutdown(Shutdown::Both);
        }
        // StallAfter: forward nothing more; the connection stays open until
        // the client closes it or the proxy resets it.
        _ => {}
    }
}
