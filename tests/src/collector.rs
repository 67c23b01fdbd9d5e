//! A report collector: the server end of updraft's report outbox.
//!
//! [`Collector`] is a small HTTP/1.1 server on `127.0.0.1` that records
//! every POST it accepts (arrival time, path, `Idempotency-Key`, headers,
//! body) and answers `204 No Content`. It speaks plain HTTP: in end-to-end
//! tests it sits behind the test nginx (`NginxBuilder::report_to`), which
//! terminates TLS with the test CA's certificate exactly as for manifests
//! and artifacts, so the daemon's report path is exercised through the same
//! real TLS stack while this server stays a few hundred lines of std.
//!
//! It can be taken offline and brought back ([`Collector::set_mode`]):
//! [`Mode::Refusing`] stops listening while keeping the port reserved (a
//! bound, non-listening socket), so connections are refused (through nginx:
//! `502`) and the same port comes back on [`Mode::Up`]; [`Mode::Unavailable`]
//! keeps accepting but answers `503` (optionally with `Retry-After`) and
//! records nothing.
//!
//! Requests are bounded (64 KiB of head, 1 MiB of body); anything malformed
//! is answered `400` and the connection closed. One thread accepts, one
//! thread serves each connection; no async runtime. This module must never
//! listen anywhere but loopback.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use socket2::{Domain, SockRef, Socket, Type};

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Largest request body accepted.
pub const MAX_BODY: usize = 1024 * 1024;

/// How long a connection may sit idle between requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the collector does with incoming reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Accept, record, answer `204`.
    Up,
    /// Accept connections, answer every request `503` (with `Retry-After`
    /// seconds when given), record nothing.
    Unavailable {
        /// `Retry-After` seconds, if any.
        retry_after: Option<u32>,
    },
    /// Not listening: connections to the port are refused.
    Refusing,
}

/// One accepted POST.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Position in arrival order, from 0.
    pub seq: usize,
    /// When the full request had been read.
    pub received: SystemTime,
    /// Request target, e.g. `/report`.
    pub path: String,
    /// The `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<String>,
    /// All request headers as sent (names lower-cased), in order.
    pub headers: Vec<(String, String)>,
    /// The request body.
    pub body: Vec<u8>,
}

impl Report {
    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// A header's value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Bodies as JSON lines, one report a line, in the order given (the
/// input `updraft-publish verify-reports` reads).
pub fn json_lines<'a>(bodies: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for b in bodies {
        out.extend_from_slice(b);
        out.push(b'\n');
    }
    out
}

/// A running collector; stops (and closes its port) when dropped.
pub struct Collector {
    shared: Arc<Shared>,
    addr: SocketAddr,
    /// Holds the port while not listening (see [`Mode::Refusing`]).
    _reservation: Socket,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

struct State {
    mode: Mode,
    listener: Option<Arc<TcpListener>>,
    reports: Vec<Report>,
    rejected: usize,
    workers: Vec<JoinHandle<()>>,
    live: Vec<Weak<TcpStream>>,
}

impl Collector {
    /// Start a collector on a free loopback port, up.
    pub fn start() -> io::Result<Collector> {
        let reservation = reuse_port_socket()?;
        reservation
            .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
            .map_err(|e| ctx(e, "binding a loopback port for the collector"))?;
        let addr = reservation
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("collector socket has no inet address"))?;
        let listener = listen_on(addr)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: Mode::Up,
                listener: Some(Arc::new(listener)),
                reports: Vec::new(),
                rejected: 0,
                workers: Vec::new(),
                live: Vec::new(),
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name(format!("collector-{}", addr.port()))
            .spawn(move || accept_loop(&s))
            .map_err(|e| ctx(e, "starting the collector thread"))?;
        Ok(Collector {
            shared,
            addr,
            _reservation: reservation,
            accept: Some(accept),
        })
    }

    /// The loopback address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>`, for direct (non-TLS) use.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.lock().mode.clone()
    }

    /// Switch mode. Takes effect for every request that starts after this
    /// returns; [`Mode::Refusing`] also closes open connections.
    pub fn set_mode(&self, mode: Mode) -> io::Result<()> {
        let mut st = self.shared.lock();
        match (&st.mode, &mode) {
            (Mode::Refusing, Mode::Refusing) => {}
            (_, Mode::Refusing) => {
                if let Some(l) = st.listener.take() {
                    // On Linux this stops a listening socket at once (new
                    // connections are refused) and wakes a blocked accept.
                    let _ = SockRef::from(&*l).shutdown(Shutdown::Read);
                }
                for s in st.live.drain(..).filter_map(|w| w.upgrade()) {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
            (Mode::Refusing, _) => {
                st.listener = Some(Arc::new(listen_on(self.addr)?));
            }
            _ => {}
        }
        st.mode = mode;
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Shorthand for `set_mode(Mode::Up)`.
    pub fn up(&self) -> io::Result<()> {
        self.set_mode(Mode::Up)
    }

    /// Every recorded report in arrival order, duplicates included.
    pub fn reports(&self) -> Vec<Report> {
        self.shared.lock().reports.clone()
    }

    /// The first report for each idempotency key, in arrival order (what a
    /// server that drops duplicates keeps); reports without a key all count.
    pub fn unique_reports(&self) -> Vec<Report> {
        let mut seen = std::collections::HashSet::new();
        self.reports()
            .into_iter()
            .filter(|r| match &r.idempotency_key {
                Some(k) => seen.insert(k.clone()),
                None => true,
            })
            .collect()
    }

    /// How many recorded reports repeated an earlier idempotency key.
    pub fn duplicate_count(&self) -> usize {
        self.reports().len() - self.unique_reports().len()
    }

    /// Requests answered `503` while [`Mode::Unavailable`].
    pub fn rejected_count(&self) -> usize {
        self.shared.lock().rejected
    }

    /// Wait until at least `n` reports are recorded or `timeout` passes;
    /// returns the reports either way (the caller asserts).
    pub fn wait_for_reports(&self, n: usize, timeout: Duration) -> Vec<Report> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while st.reports.len() < n {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = match self.shared.changed.wait_timeout(st, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        st.reports.clone()
    }

    /// Wait for a recorded report whose JSON body `pred` accepts, and
    /// return that body; panics naming `what` and listing the reports seen
    /// after `timeout`.
    pub fn wait_report(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            let reports = self.wait_for_reports(seen + 1, Duration::from_millis(200));
            let bodies: Vec<serde_json::Value> =
                reports.iter().filter_map(|r| r.json().ok()).collect();
            if let Some(r) = bodies.iter().find(|r| pred(r)) {
                return r.clone();
            }
            seen = reports.len();
            if Instant::now() >= deadline {
                panic!("no report for {what} within {timeout:?}: {bodies:#?}");
            }
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let workers = {
            let mut st = self.shared.lock();
            if let Some(l) = st.listener.take() {
                let _ = SockRef::from(&*l).shutdown(Shutdown::Read);
            }
            for s in st.live.drain(..).filter_map(|w| w.upgrade()) {
                let _ = s.shutdown(Shutdown::Both);
            }
            self.shared.changed.notify_all();
            std::mem::take(&mut st.workers)
        };
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        for w in workers {
            let _ = w.join();
        }
        // Workers accepted after the drain above.
        let rest = std::mem::take(&mut self.shared.lock().workers);
        for w in rest {
            let _ = w.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn reuse_port_socket() -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    Ok(s)
}

fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = reuse_port_socket()?;
    s.bind(&addr.into())
        .map_err(|e| ctx(e, &format!("binding collector port {addr} again")))?;
    s.listen(128)?;
    Ok(s.into())
}

fn accept_loop(shared: &Arc<Shared>) {
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let listener = {
            let mut st = shared.lock();
            st.workers.retain(|w| !w.is_finished());
            st.live.retain(|w| w.strong_count() > 0);
            match &st.listener {
                Some(l) => Arc::clone(l),
                None => {
                    // Not listening: wait for a mode change or stop.
                    let _ = shared.changed.wait_timeout(st, Duration::from_millis(200));
                    continue;
                }
            }
        };
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                // Shut down for Refusing or stop; drop our reference.
                drop(listener);
                let st = shared.lock();
                if st.listener.is_some() && !shared.stop.load(Ordering::SeqCst) {
                    // A transient accept error on a live listener.
                    drop(st);
                    thread::sleep(Duration::from_millis(5));
                }
                continue;
            }
        };
        drop(listener);
        let mut st = shared.lock();
        if shared.stop.load(Ordering::SeqCst) || st.listener.is_none() {
            let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
            continue;
        }
        let stream = Arc::new(stream);
        st.live.push(Arc::downgrade(&stream));
        let s = Arc::clone(shared);
        match thread::Builder::new()
            .name("collector-conn".to_string())
            .spawn(move || serve(&s, stream))
        {
            Ok(h) => st.workers.push(h),
            Err(e) => eprintln!("collector: cannot start a connection thread: {e}"),
        }
    }
}

/// A parsed request.
struct Request {
    method: String,
    target: String,
    http11: bool,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn keep_alive(&self) -> bool {
        let conn = self.header("connection").map(str::to_ascii_lowercase);
        match conn.as_deref() {
            Some(c) if c.contains("close") => false,
            Some(c) if c.contains("keep-alive") => true,
            _ => self.http11,
        }
    }
}

fn serve(shared: &Arc<Shared>, stream: Arc<TcpStream>) {
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IDLE_TIMEOUT));
    let writer: &TcpStream = &stream;
    let mut reader = BufReader::new(&*stream);
    loop {
        let req = match read_request(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    let _ = respond(writer, "400 Bad Request", &[], false);
                }
                return;
            }
        };
        let keep = req.keep_alive();
        let mode = shared.lock().mode.clone();
        let sent = match mode {
            Mode::Refusing => return,
            Mode::Unavailable { retry_after } => {
                shared.lock().rejected += 1;
                let ra = retry_after.map(|s| ("Retry-After", s.to_string()));
                respond(writer, "503 Service Unavailable", ra.as_slice(), keep)
            }
            Mode::Up if req.method != "POST" => respond(
                writer,
                "405 Method Not Allowed",
                &[("Allow", "POST".into())],
                keep,
            ),
            Mode::Up => {
                {
                    let mut st = shared.lock();
                    let seq = st.reports.len();
                    st.reports.push(Report {
                        seq,
                        received: SystemTime::now(),
                        idempotency_key: req.header("idempotency-key").map(str::to_string),
                        path: req.target,
                        headers: req.headers,
                        body: req.body,
                    });
                    shared.changed.notify_all();
                }
                respond(writer, "204 No Content", &[], keep)
            }
        };
        if sent.is_err() || !keep {
            return;
        }
    }
}

fn respond(
    mut w: &TcpStream,
    status: &str,
    headers: &[(&str, String)],
    keep: bool,
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !status.starts_with("204") {
        head.push_str("Content-Length: 0\r\n");
    }
    head.push_str(if keep {
        "Connection: keep-alive\r\n\r\n"
    } else {
        "Connection: close\r\n\r\n"
    });
    w.write_all(head.as_bytes())?;
    w.flush()
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Read one line (up to `*budget` bytes, CRLF or LF), without the ending.
fn read_line(r: &mut impl BufRead, budget: &mut usize) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    let n = r.take(*budget as u64 + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if n > *budget || line.last() != Some(&b'\n') {
        return Err(bad("request head too long or truncated"));
    }
    *budget -= n;
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| bad("request head is not UTF-8"))
}

/// Read one request; `Ok(None)` on a clean end of the connection.
fn read_request(r: &mut impl BufRead) -> io::Result<Option<Request>> {
    let mut budget = MAX_HEAD;
    let line = match read_line(r, &mut budget)? {
        Some(l) => l,
        None => return Ok(None),
    };
    let mut parts = line.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if !m.is_empty() && t.starts_with('/') => (m, t, v),
        _ => return Err(bad(format!("bad request line {line:?}"))),
    };
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(bad(format!("unsupported version {version:?}"))),
    };
    let mut headers = Vec::new();
    loop {
        let h = read_line(r, &mut budget)?.ok_or_else(|| bad("connection closed in headers"))?;
        if h.is_empty() {
            break;
        }
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| bad(format!("bad header line {h:?}")))?;
        if k.is_empty() || k.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(bad(format!("bad header name {k:?}")));
        }
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut req = Request {
        method: method.to_string(),
        target: target.to_string(),
        http11,
        headers,
        body: Vec::new(),
    };
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    if chunked {
        req.body = read_chunked(r)?;
    } else if let Some(cl) = req.header("content-length") {
        let len: usize = cl
            .parse()
            .map_err(|_| bad(format!("bad Content-Length {cl:?}")))?;
        if len > MAX_BODY {
            return Err(bad(format!("body of {len} bytes exceeds {MAX_BODY}")));
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        req.body = body;
    }
    Ok(Some(req))
}

fn read_chunked(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut budget = MAX_HEAD;
    loop {
        let line = read_line(r, &mut budget)?.ok_or_else(|| bad("connection closed in body"))?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| bad(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // Trailers, then the blank line.
            while !read_line(r, &mut budget)?
                .ok_or_else(|| bad("connection closed in trailers"))?
                .is_empty()
            {}
            return Ok(body);
        }
        if size > MAX_BODY - body.len() {
            return Err(bad(format!("chunked body exceeds {MAX_BODY} bytes")));
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        let end = read_line(r, &mut budget)?.ok_or_else(|| bad("connection closed in body"))?;
        if !end.is_empty() {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Option<Request>> {
        read_request(&mut BufReader::new(bytes))
    }

    #[test]
    fn a_post_with_content_length_parses() {
        let r =
            parse(b"POST /report HTTP/1.1\r\nIdempotency-Key: k1\r\nContent-Length: 2\r\n\r\n{}")
                .unwrap()
                .unwrap();
        assert_eq!((r.method.as_str(), r.target.as_str()), ("POST", "/report"));
        assert_eq!(r.header("IDEMPOTENCY-KEY"), Some("k1"));
        assert_eq!(r.body, b"{}");
        assert!(r.keep_alive());
    }

    #[test]
    fn a_chunked_post_parses() {
        let r = parse(b"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.body, b"abcde");
    }

    #[test]
    fn hostile_requests_are_refused_without_panic_or_huge_allocation() {
        let huge_len = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        let huge_chunk =
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffff\r\n".to_string();
        let long_header = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        for bad in [
            b"GARBAGE\r\n\r\n".to_vec(),
            b"GET / HTTP/2.0\r\n\r\n".to_vec(),
            b"GET noslash HTTP/1.1\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort".to_vec(),
            b"GET / HTTP/1.1\r\nHost: x".to_vec(),
            b"\xff\xfe / HTTP/1.1\r\n\r\n".to_vec(),
            huge_len.into_bytes(),
            huge_chunk.into_bytes(),
            long_header.into_bytes(),
        ] {
            assert!(parse(&bad).is_err(), "{:?}", String::from_utf8_lossy(&bad));
        }
        assert!(parse(b"").unwrap().is_none());
    }
}
