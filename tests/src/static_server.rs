//! An embedded HTTPS static file server, for when nginx is not installed.
//!
//! [`StaticServer`] serves one directory (the publisher's output) over TLS
//! on `127.0.0.1`, with a certificate issued by a [`TestCa`], the way the
//! test nginx does: `GET` and `HEAD`; strong ETags and `If-None-Match`
//! (`304`); single byte ranges `bytes=a-b`, `bytes=a-` and `bytes=-n`
//! (`206`, `416` when unsatisfiable, `If-Range` honoured); `Content-Length`
//! on every answer; HTTP/1.1 keep-alive. Optionally one path prefix (e.g.
//! `/report`) is forwarded to a plain-HTTP upstream such as a
//! [`Collector`](crate::collector), as nginx's `proxy_pass` does. Every
//! request is recorded in an in-memory log of [`AccessEntry`] lines, the
//! same type nginx's access log is read into.
//!
//! The ETag of a file is its inode, modification time (nanoseconds) and
//! size: the publisher replaces files by renaming, so a new file is a new
//! inode and a new tag. Multiple ranges in one request are answered with
//! the whole file (`200`), which RFC 9110 allows.
//!
//! One thread accepts; each connection has a thread of its own, at most
//! [`StaticServerBuilder::max_connections`] at once (a connection beyond
//! that is closed at once). Request heads are bounded (16 KiB, 64 headers),
//! as are bodies (1 MiB) and idle connections (a read/write timeout).
//! Dropping the server stops listening, shuts every connection down and
//! joins every thread.
//!
//! It is test and demo support: it lives in the test-support crate, which
//! the device binary never links. It must never listen anywhere but
//! loopback, serve a file outside its root (`..` segments, encoded slashes
//! and NUL are refused with `400`; symlinks leading out are `404`), list a
//! directory, or connect anywhere but the upstream it was given.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{HandshakeKind, ServerConfig, ServerConnection, StreamOwned};
use socket2::SockRef;

use crate::ca::TestCa;
use crate::nginx::{AccessEntry, Block};

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most headers in one request.
pub const MAX_HEADERS: usize = 64;
/// Largest request body (a forwarded report; anything else is drained).
pub const MAX_BODY: u64 = 1024 * 1024;
/// Largest upstream answer relayed.
const MAX_UPSTREAM_RESPONSE: u64 = 1024 * 1024;
/// How long connecting to the upstream may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);
/// Copy buffer for file bodies.
const CHUNK: usize = 64 * 1024;

/// Configuration of a [`StaticServer`]; see [`StaticServer::builder`].
pub struct StaticServerBuilder<'a> {
    root: PathBuf,
    ca: Option<&'a TestCa>,
    proxy: Option<(String, SocketAddr)>,
    max_connections: usize,
    idle_timeout: Duration,
}

/// A running server; stopped when dropped.
pub struct StaticServer {
    addr: SocketAddr,
    root: PathBuf,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
    shared: Arc<Shared>,
    listener: Arc<TcpListener>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    root: PathBuf,
    tls: Arc<ServerConfig>,
    proxy: Option<(String, SocketAddr)>,
    max_connections: usize,
    idle_timeout: Duration,
    stop: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    log: Vec<AccessEntry>,
    /// A handle on each open connection, to shut it down on drop.
    live: BTreeMap<u64, TcpStream>,
    workers: Vec<JoinHandle<()>>,
    serial: u64,
    refused: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StaticServer {
    /// A builder for a server of `root` (a directory).
    pub fn builder<'a>(root: impl Into<PathBuf>) -> StaticServerBuilder<'a> {
        StaticServerBuilder {
            root: root.into(),
            ca: None,
            proxy: None,
            max_connections: 64,
            idle_timeout: Duration::from_secs(30),
        }
    }

    /// The listening address (`127.0.0.1`, a port the kernel chose).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port><path>`; `path` starts with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// PEM file of the CA that issued the server's certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The document root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every request answered so far, oldest first.
    pub fn access_log(&self) -> Vec<AccessEntry> {
        self.shared.lock().log.clone()
    }

    /// Wait until `done` holds for the access log, or `timeout` passes;
    /// returns the log as last read either way.
    pub fn wait_access_log(
        &self,
        timeout: Duration,
        done: impl Fn(&[AccessEntry]) -> bool,
    ) -> Vec<AccessEntry> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.access_log();
            if done(&log) || Instant::now() >= deadline {
                return log;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Connections closed at once because [`StaticServerBuilder::max_connections`]
    /// were open.
    pub fn refused_connections(&self) -> u64 {
        self.shared.lock().refused
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.lock().live.len()
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // A listening socket shut down for reading makes accept(2) return.
        let _ = SockRef::from(&*self.listener).shutdown(Shutdown::Read);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let workers = {
            let mut st = self.shared.lock();
            for s in st.live.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut st.workers)
        };
        for w in workers {
            let _ = w.join();
        }
    }
}

impl<'a> StaticServerBuilder<'a> {
    /// Issue the server's certificate from `ca` (by default a fresh CA is
    /// made; either way its PEM is at [`StaticServer::ca_file`]).
    pub fn ca(mut self, ca: &'a TestCa) -> Self {
        self.ca = Some(ca);
        self
    }

    /// Forward requests whose path starts with `prefix` (e.g. `/report`)
    /// to the plain-HTTP server at `upstream`.
    pub fn proxy(mut self, prefix: &str, upstream: SocketAddr) -> Self {
        self.proxy = Some((prefix.to_string(), upstream));
        self
    }

    /// At most `n` connections at once (default 64).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long a connection may wait for the client (default 30 s).
    pub fn idle_timeout(mut self, t: Duration) -> Self {
        self.idle_timeout = t;
        self
    }

    /// Bind `127.0.0.1:0` and start serving.
    pub fn start(self) -> io::Result<StaticServer> {
        let root = self.root.canonicalize().map_err(|e| {
            ctx(
                e,
                &format!("the static server's root {}", self.root.display()),
            )
        })?;
        if !root.is_dir() {
            return Err(io::Error::other(format!(
                "the static server's root {} is not a directory",
                root.display()
            )));
        }
        if let Some((prefix, _)) = &self.proxy {
            if !prefix.starts_with('/') {
                return Err(io::Error::other(format!(
                    "proxied path {prefix:?} must start with '/'"
                )));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("updraft-static-")
            .tempdir()
            .map_err(|e| ctx(e, "making the static server's temp dir"))?;
        let fresh;
        let ca = match self.ca {
            Some(ca) => ca,
            None => {
                fresh = TestCa::new("updraft test CA")?;
                &fresh
            }
        };
        let ca_file = dir.path().join("ca.pem");
        ca.write_cert(&ca_file)?;
        let tls = Arc::new(tls_config(ca)?);
        let listener = Arc::new(
            TcpListener::bind("127.0.0.1:0")
                .map_err(|e| ctx(e, "binding a loopback port for the static server"))?,
        );
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            root: root.clone(),
            tls,
            proxy: self.proxy,
            max_connections: self.max_connections,
            idle_timeout: self.idle_timeout,
            stop: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            let listener = Arc::clone(&listener);
            thread::Builder::new()
                .name("static-accept".into())
                .spawn(move || accept_loop(&shared, &listener))
                .map_err(|e| ctx(e, "starting the static server's accept thread"))?
        };
        Ok(StaticServer {
            addr,
            root,
            ca_file,
            _dir: dir,
            shared,
            listener,
            accept: Some(accept),
        })
    }
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn tls_config(ca: &TestCa) -> io::Result<ServerConfig> {
    let leaf = ca.issue_loopback()?;
    let chain = CertificateDer::pem_slice_iter(leaf.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io::Error::other(format!("reading the server certificate chain: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())
        .map_err(|e| io::Error::other(format!("reading the server key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(format!("TLS versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| io::Error::other(format!("the server certificate: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                eprintln!("static server: accept: {e}");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let mut st = shared.lock();
        st.workers.retain(|w| !w.is_finished());
        if st.live.len() >= shared.max_connections {
            st.refused += 1;
            drop(st);
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        let handle = match stream.try_clone() {
            Ok(h) => h,
            Err(e) => {
                eprintln!("static server: keeping a connection handle: {e}");
                continue;
            }
        };
        st.serial += 1;
        let id = st.serial;
        st.live.insert(id, handle);
        let s = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name("static-conn".into())
            .spawn(move || {
                Connection::serve(&s, stream, peer, id);
                s.lock().live.remove(&id);
            });
        match spawned {
            Ok(h) => st.workers.push(h),
            Err(e) => {
                st.live.remove(&id);
                eprintln!("static server: cannot start a connection thread: {e}");
            }
        }
    }
}

/// A parsed request head.
struct Request {
    method: String,
    target: String,
    version: u8,
    headers: Vec<(String, String)>,
    head_len: usize,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn keep_alive(&self) -> bool {
        match self.header("connection").map(str::to_ascii_lowercase) {
            Some(c) if c.contains("close") => false,
            Some(c) if c.contains("keep-alive") => true,
            _ => self.version >= 1,
        }
    }
}

/// What goes after the response head.
enum Body {
    Empty,
    Bytes(Vec<u8>),
    File { file: File, start: u64, len: u64 },
}

/// One answer, before it is written.
struct Response {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Body,
    /// The body's length for `Content-Length` (a `HEAD` answer has the
    /// length of the `GET` answer and no body).
    length: Option<u64>,
    close: bool,
}

impl Response {
    fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Empty,
            length: Some(0),
            close: false,
        }
    }

    fn text(status: u16, text: &str) -> Response {
        let mut r = Response::new(status);
        r.headers.push(("Content-Type", "text/plain".into()));
        r.length = Some(text.len() as u64);
        r.body = Body::Bytes(text.as_bytes().to_vec());
        r
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

/// Bytes written for one response.
#[derive(Clone, Copy)]
struct Sent {
    head: u64,
    body: u64,
}

struct Connection {
    tls: StreamOwned<ServerConnection, TcpStream>,
    id: u64,
    peer: SocketAddr,
    requests: u64,
    /// Bytes read past the end of the last request head.
    buf: Vec<u8>,
}

impl Connection {
    fn serve(shared: &Shared, stream: TcpStream, peer: SocketAddr, id: u64) {
        let _ = stream.set_read_timeout(Some(shared.idle_timeout));
        let _ = stream.set_write_timeout(Some(shared.idle_timeout));
        let _ = stream.set_nodelay(true);
        let conn = match ServerConnection::new(Arc::clone(&shared.tls)) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("static server: TLS: {e}");
                return;
            }
        };
        let mut c = Connection {
            tls: StreamOwned::new(conn, stream),
            id,
            peer,
            requests: 0,
            buf: Vec::new(),
        };
        while !shared.stop.load(Ordering::SeqCst) {
            match c.one_request(shared) {
                Ok(true) => {}
                Ok(false) | Err(_) => break,
            }
        }
        c.tls.conn.send_close_notify();
        let _ = c.tls.flush();
        let _ = c.tls.sock.shutdown(Shutdown::Both);
    }

    /// Read, answer and log one request; `Ok(true)` to keep the
    /// connection open.
    fn one_request(&mut self, shared: &Shared) -> io::Result<bool> {
        let head = match self.read_head()? {
            Some(h) => h,
            None => return Ok(false),
        };
        let started = Instant::now();
        self.requests += 1;
        let req = match parse_head(&head) {
            Ok(r) => r,
            Err(why) => {
                let mut r = Response::text(400, &format!("{why}\n"));
                r.close = true;
                let sent = self.write(&r, true)?;
                self.log(
                    shared,
                    None,
                    head.len() as u64,
                    400,
                    sent,
                    started,
                    String::from_utf8_lossy(head.split(|&b| b == b'\r').next().unwrap_or(&[]))
                        .into_owned(),
                );
                return Ok(false);
            }
        };
        let line = format!("{} {} HTTP/1.{}", req.method, req.target, req.version);
        let mut received = req.head_len as u64;

        if let Some((prefix, upstream)) = &shared.proxy {
            if path_of(&req.target) == prefix.as_str()
                || path_of(&req.target).starts_with(&format!("{prefix}/"))
            {
                let body = match self.read_body(&req) {
                    Ok(b) => b,
                    Err(r) => {
                        let sent = self.write(&r, true)?;
                        self.log(shared, Some(&req), received, r.status, sent, started, line);
                        return Ok(false);
                    }
                };
                received += body.len() as u64;
                let (status, sent) = self.forward(&req, &body, *upstream)?;
                self.log(shared, Some(&req), received, status, sent, started, line);
                return Ok(false);
            }
        }

        let mut response = match self.read_body(&req) {
            Ok(body) => {
                received += body.len() as u64;
                answer(&shared.root, &req)
            }
            Err(r) => r,
        };
        if !req.keep_alive() {
            response.close = true;
        }
        let sent = self.write(&response, req.method != "HEAD")?;
        self.log(
            shared,
            Some(&req),
            received,
            response.status,
            sent,
            started,
            line,
        );
        Ok(!response.close)
    }

    /// The next request head (through the blank line), or `None` when the
    /// client closed the connection between requests.
    fn read_head(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let rest = self.buf.split_off(end + 4);
                let head = std::mem::replace(&mut self.buf, rest);
                return Ok(Some(head));
            }
            if self.buf.len() > MAX_HEAD {
                let mut r = Response::text(431, "request head too large\n");
                r.close = true;
                let _ = self.write(&r, true);
                return Ok(None);
            }
            let mut chunk = [0u8; 4096];
            let n = match self.tls.read(&mut chunk) {
                Ok(n) => n,
                // A client that closes without close_notify, or times out.
                Err(_) if self.buf.is_empty() => return Ok(None),
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The request body (`Content-Length` only), bounded; an error answer
    /// when it is refused.
    fn read_body(&mut self, req: &Request) -> Result<Vec<u8>, Response> {
        if req.header("transfer-encoding").is_some() {
            let mut r = Response::text(411, "a request body needs Content-Length\n");
            r.close = true;
            return Err(r);
        }
        let len = match req.header("content-length") {
            None => return Ok(Vec::new()),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) => n,
                Err(_) => {
                    let mut r = Response::text(400, "bad Content-Length\n");
                    r.close = true;
                    return Err(r);
                }
            },
        };
        if len > MAX_BODY {
            let mut r = Response::text(413, "request body too large\n");
            r.close = true;
            return Err(r);
        }
        let len = len as usize;
        let mut body = std::mem::take(&mut self.buf);
        if body.len() > len {
            self.buf = body.split_off(len);
        }
        while body.len() < len {
            let mut chunk = vec![0u8; (len - body.len()).min(CHUNK)];
            match self.tls.read(&mut chunk) {
                Ok(0) | Err(_) => {
                    let mut r = Response::text(400, "request body ended early\n");
                    r.close = true;
                    return Err(r);
                }
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        Ok(body)
    }

    /// Write a response; returns the bytes written.
    fn write(&mut self, r: &Response, with_body: bool) -> io::Result<Sent> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", r.status, reason(r.status));
        head.push_str(&format!("Date: {}\r\n", http_date(SystemTime::now())));
        head.push_str("Server: updraft-static\r\n");
        for (k, v) in &r.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(len) = r.length {
            head.push_str(&format!("Content-Length: {len}\r\n"));
        }
        if r.close {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        self.tls.write_all(head.as_bytes())?;
        let mut sent = Sent {
            head: head.len() as u64,
            body: 0,
        };
        if with_body {
            match &r.body {
                Body::Empty => {}
                Body::Bytes(b) => {
                    self.tls.write_all(b)?;
                    sent.body += b.len() as u64;
                }
                Body::File { file, start, len } => {
                    let mut f = file;
                    f.seek(SeekFrom::Start(*start))?;
                    let mut left = *len;
                    let mut chunk = vec![0u8; CHUNK];
                    while left > 0 {
                        let want = (left as usize).min(CHUNK);
                        let n = f.read(&mut chunk[..want])?;
                        if n == 0 {
                            // The file shrank while being served.
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file shorter than its Content-Length",
                            ));
                        }
                        self.tls.write_all(&chunk[..n])?;
                        sent.body += n as u64;
                        left -= n as u64;
                    }
                }
            }
        }
        self.tls.flush()?;
        Ok(sent)
    }

    /// Send the request to `upstream` with `Connection: close` and relay
    /// its whole answer; returns its status and the bytes relayed.
    fn forward(
        &mut self,
        req: &Request,
        body: &[u8],
        upstream: SocketAddr,
    ) -> io::Result<(u16, Sent)> {
        let relayed = (|| -> io::Result<Vec<u8>> {
            let mut up = TcpStream::connect_timeout(&upstream, UPSTREAM_TIMEOUT)?;
            up.set_read_timeout(Some(UPSTREAM_TIMEOUT))?;
            up.set_write_timeout(Some(UPSTREAM_TIMEOUT))?;
            let mut head = format!("{} {} HTTP/1.1\r\n", req.method, req.target);
            for (k, v) in &req.headers {
                if !k.eq_ignore_ascii_case("connection") && !k.eq_ignore_ascii_case("keep-alive") {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
            }
            head.push_str("Connection: close\r\n\r\n");
            up.write_all(head.as_bytes())?;
            up.write_all(body)?;
            let mut answer = Vec::new();
            up.take(MAX_UPSTREAM_RESPONSE).read_to_end(&mut answer)?;
            Ok(answer)
        })();
        match relayed {
            Ok(bytes) => {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                let (status, head) = match resp.parse(&bytes) {
                    Ok(httparse::Status::Complete(n)) => (resp.code.unwrap_or(502), n),
                    _ => (502, 0),
                };
                if head == 0 {
                    let mut r = Response::text(502, "the upstream answered garbage\n");
                    r.close = true;
                    return Ok((502, self.write(&r, true)?));
                }
                self.tls.write_all(&bytes)?;
                self.tls.flush()?;
                let sent = Sent {
                    head: head as u64,
                    body: (bytes.len() - head) as u64,
                };
                Ok((status, sent))
            }
            Err(e) => {
                let mut r = Response::text(502, &format!("upstream {upstream}: {e}\n"));
                r.close = true;
                Ok((502, self.write(&r, true)?))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn log(
        &self,
        shared: &Shared,
        req: Option<&Request>,
        received: u64,
        status: u16,
        sent: Sent,
        started: Instant,
        line: String,
    ) {
        let h = |name: &str| req.and_then(|r| r.header(name)).map(str::to_string);
        let conn = &self.tls.conn;
        let entry = AccessEntry {
            time: SystemTime::now(),
            block: Block::Main,
            connection: self.id,
            connection_requests: self.requests,
            remote_port: self.peer.port(),
            request: line,
            method: req.map(|r| r.method.clone()).unwrap_or_default(),
            uri: req.map(|r| r.target.clone()).unwrap_or_default(),
            status,
            request_length: received,
            bytes_sent: sent.head + sent.body,
            body_bytes_sent: sent.body,
            if_none_match: h("if-none-match"),
            range: h("range"),
            idempotency_key: h("idempotency-key"),
            user_agent: h("user-agent"),
            ssl_session_reused: conn.handshake_kind() == Some(HandshakeKind::Resumed),
            ssl_protocol: conn.protocol_version().map(|v| match v {
                rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3".to_string(),
                rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2".to_string(),
                other => format!("{other:?}"),
            }),
            request_time_ms: started.elapsed().as_millis() as u64,
            headers: BTreeMap::new(),
        };
        shared.lock().log.push(entry);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_head(head: &[u8]) -> Result<Request, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(head) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err("incomplete request head".into()),
        Err(e) => return Err(format!("malformed request: {e}")),
    };
    let method = req.method.ok_or("no method")?.to_string();
    let target = req.path.ok_or("no request target")?.to_string();
    let version = req.version.ok_or("no HTTP version")?;
    let headers = req
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    Ok(Request {
        method,
        target,
        version,
        headers,
        head_len: len,
    })
}

/// The path part of a request target (no query).
fn path_of(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or("")
}

/// The file a request target names under `root`, or the status that
/// refuses it: `400` for a target that is not a plain path (`..` or `.`
/// segments, an encoded `/` or NUL, bad escapes), `404` for anything
/// that is not a regular file inside `root`.
pub fn resolve(root: &Path, target: &str) -> Result<PathBuf, u16> {
    let path = path_of(target);
    if !path.starts_with('/') {
        return Err(400);
    }
    let mut out = root.to_path_buf();
    for raw in path.split('/').skip(1) {
        let seg = percent_decode(raw).ok_or(400u16)?;
        if seg.is_empty() {
            continue;
        }
        if seg == b"." || seg == b".." || seg.contains(&b'/') || seg.contains(&0) {
            return Err(400);
        }
        out.push(std::ffi::OsStr::from_bytes(&seg));
    }
    let real = out.canonicalize().map_err(|_| 404u16)?;
    if !real.starts_with(root) || !real.is_file() {
        return Err(404);
    }
    Ok(real)
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The strong ETag of a file: inode, modification time in nanoseconds and
/// size.
pub fn etag(meta: &std::fs::Metadata) -> String {
    let mtime_ns = (meta.mtime() as i128) * 1_000_000_000 + meta.mtime_nsec() as i128;
    format!("\"{:x}-{:x}-{:x}\"", meta.ino(), mtime_ns, meta.size())
}

/// Whether an `If-None-Match` value matches `tag` (weak comparison, as
/// RFC 9110 asks for this header; `*` matches any).
pub fn none_match(header: &str, tag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    header
        .split(',')
        .any(|t| t.trim() == "*" || bare(t) == bare(tag))
}

/// What a `Range` header asks of a body of `len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// No usable range (absent, another unit, several ranges, malformed):
    /// the whole body, `200`.
    Full,
    /// Bytes `start..=end`, `206`.
    Part { start: u64, end: u64 },
    /// A syntactically valid range that no byte satisfies: `416`.
    Unsatisfiable,
}

/// Parse a `Range` header for a body of `len` bytes.
pub fn parse_range(header: &str, len: u64) -> Range {
    let h = header.trim();
    let Some(spec) = h
        .get(..6)
        .filter(|p| p.eq_ignore_ascii_case("bytes="))
        .map(|_| &h[6..])
    else {
        return Range::Full;
    };
    if spec.contains(',') {
        return Range::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Range::Full;
    };
    let num = |s: &str| -> Option<u64> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    match (a.trim().is_empty(), b.trim().is_empty()) {
        // bytes=-n: the last n bytes.
        (true, false) => match num(b) {
            Some(0) => Range::Unsatisfiable,
            Some(_) if len == 0 => Range::Unsatisfiable,
            Some(n) => Range::Part {
                start: len.saturating_sub(n),
                end: len - 1,
            },
            None => Range::Full,
        },
        // bytes=a-: from a to the end.
        (false, true) => match num(a) {
            Some(s) if s >= len => Range::Unsatisfiable,
            Some(s) => Range::Part {
                start: s,
                end: len - 1,
            },
            None => Range::Full,
        },
        // bytes=a-b.
        (false, false) => match (num(a), num(b)) {
            (Some(s), Some(e)) if s <= e => {
                if s >= len {
                    Range::Unsatisfiable
                } else {
                    Range::Part {
                        start: s,
                        end: e.min(len - 1),
                    }
                }
            }
            _ => Range::Full,
        },
        (true, true) => Range::Full,
    }
}

/// The answer to a `GET` or `HEAD` for a file under `root`.
fn answer(root: &Path, req: &Request) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return Response::text(405, "only GET and HEAD are served\n").header("Allow", "GET, HEAD");
    }
    let path = match resolve(root, &req.target) {
        Ok(p) => p,
        Err(400) => return Response::text(400, "the request target is not a plain path\n"),
        Err(status) => return Response::text(status, "not found\n"),
    };
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(_) => return Response::text(404, "not found\n"),
    };
    let meta = match file.metadata() {
        Ok(m) if m.is_file() => m,
        _ => return Response::text(404, "not found\n"),
    };
    let tag = etag(&meta);
    let len = meta.len();
    let content_type = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => "application/json",
        Some("txt") => "text/plain",
        Some("html") => "text/html",
        _ => "application/octet-stream",
    };
    if let Some(inm) = req.header("if-none-match") {
        if none_match(inm, &tag) {
            let mut r = Response::new(304).header("ETag", tag);
            r.length = None;
            return r;
        }
    }
    let mut range = req
        .header("range")
        .map(|h| parse_range(h, len))
        .unwrap_or(Range::Full);
    if let Some(if_range) = req.header("if-range") {
        // Only a strong ETag validates a range.
        if if_range.trim() != tag {
            range = Range::Full;
        }
    }
    let base = |status: u16| {
        Response::new(status)
            .header("Content-Type", content_type)
            .header("ETag", tag.clone())
            .header("Accept-Ranges", "bytes")
    };
    match range {
        Range::Full => {
            let mut r = base(200);
            r.length = Some(len);
            r.body = Body::File {
                file,
                start: 0,
                len,
            };
            r
        }
        Range::Part { start, end } => {
            let n = end - start + 1;
            let mut r = base(206).header("Content-Range", format!("bytes {start}-{end}/{len}"));
            r.length = Some(n);
            r.body = Body::File {
                file,
                start,
                len: n,
            };
            r
        }
        Range::Unsatisfiable => Response::text(416, "range not satisfiable\n")
            .header("Content-Range", format!("bytes */{len}")),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        _ => "",
    }
}

/// An IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn http_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[days.rem_euclid(7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_as_rfc_9110_says() {
        let p = |start, end| Range::Part { start, end };
        assert_eq!(parse_range("bytes=0-9", 100), p(0, 9));
        assert_eq!(parse_range("bytes=90-200", 100), p(90, 99));
        assert_eq!(parse_range("bytes=10-", 100), p(10, 99));
        assert_eq!(parse_range("bytes=-10", 100), p(90, 99));
        assert_eq!(parse_range("bytes=-200", 100), p(0, 99));
        assert_eq!(parse_range("BYTES=5-5", 100), p(5, 5));
        assert_eq!(parse_range("bytes=100-", 100), Range::Unsatisfiable);
        assert_eq!(parse_range("bytes=100-200", 100), Range::Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), Range::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-", 0), Range::Unsatisfiable);
        for ignored in [
            "bytes=9-0",
            "bytes=0-1,5-6",
            "bytes=x-1",
            "bytes=-",
            "items=0-1",
            "bytes=1-2-3",
            "bytes=+1-2",
            "",
        ] {
            assert_eq!(parse_range(ignored, 100), Range::Full, "{ignored}");
        }
    }

    #[test]
    fn if_none_match_compares_weakly_and_star_matches() {
        let tag = "\"1-2-3\"";
        assert!(none_match("\"1-2-3\"", tag));
        assert!(none_match("W/\"1-2-3\"", tag));
        assert!(none_match("\"x\", \"1-2-3\"", tag));
        assert!(none_match("*", tag));
        assert!(!none_match("\"1-2-4\"", tag));
        assert!(!none_match("", tag));
    }

    #[test]
    fn targets_outside_the_root_or_not_plain_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("artifacts")).unwrap();
        std::fs::write(root.join("artifacts/a b"), b"x").unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
        let root = root.canonicalize().unwrap();
        assert_eq!(
            resolve(&root, "/artifacts/a%20b?x=1"),
            Ok(root.join("artifacts/a b"))
        );
        assert_eq!(
            resolve(&root, "//artifacts//a%20b"),
            Ok(root.join("artifacts/a b"))
        );
        for bad in [
            "/../secret",
            "/artifacts/../../secret",
            "/%2e%2e/secret",
            "/artifacts%2f..%2f..%2fsecret",
            "/a%00b",
            "/./artifacts/a%20b",
            "/bad%zz",
            "/bad%2",
            "secret",
            "*",
        ] {
            assert_eq!(resolve(&root, bad), Err(400), "{bad}");
        }
        assert_eq!(resolve(&root, "/link"), Err(404));
        assert_eq!(resolve(&root, "/artifacts"), Err(404));
        assert_eq!(resolve(&root, "/missing"), Err(404));
    }

    #[test]
    fn dates_are_imf_fixdates() {
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(784_111_777)),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "Tue, 29 Feb 2000 00:00:00 GMT"
        );
    }
}
