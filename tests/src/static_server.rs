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
//! The listener, TLS configuration and HTTP/1.1 reading and writing are
//! [`crate::http`], shared with the DDI server.
//!
//! It is test and demo support: it lives in the test-support crate, which
//! the device binary never links. It must never listen anywhere but
//! loopback, serve a file outside its root (`..` segments, encoded slashes
//! and NUL are refused with `400`; symlinks leading out are `404`), list a
//! directory, or connect anywhere but the upstream it was given.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use rustls::{HandshakeKind, ServerConfig, ServerConnection, StreamOwned};

use crate::ca::TestCa;
use crate::http::{
    Acceptor, Body, HttpConn, Request, Response, Sent, Transport, bind_loopback, ctx, parse_head,
    path_of, percent_decode, tls_server_config,
};
pub use crate::http::{MAX_HEAD, MAX_HEADERS, Range, http_date, parse_range};
use crate::nginx::{AccessEntry, Block};

/// Largest request body (a forwarded report; anything else is drained).
pub const MAX_BODY: u64 = 1024 * 1024;
/// Largest upstream answer relayed.
const MAX_UPSTREAM_RESPONSE: u64 = 1024 * 1024;
/// How long connecting to the upstream may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

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
    // Dropped first: stops listening and joins every connection thread.
    acceptor: Acceptor,
    root: PathBuf,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
    shared: Arc<Shared>,
}

struct Shared {
    root: PathBuf,
    tls: Arc<ServerConfig>,
    proxy: Option<(String, SocketAddr)>,
    idle_timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    log: Vec<AccessEntry>,
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
        self.acceptor.addr()
    }

    /// `https://127.0.0.1:<port><path>`; `path` starts with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr())
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
        self.acceptor.refused_connections()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.acceptor.open_connections()
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
        let tls = Arc::new(tls_server_config(ca)?);
        let shared = Arc::new(Shared {
            root: root.clone(),
            tls,
            proxy: self.proxy,
            idle_timeout: self.idle_timeout,
            state: Mutex::new(State::default()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            Acceptor::start(
                "static server",
                bind_loopback("static server")?,
                self.max_connections,
                move |stream, peer, id, stop| Connection::serve(&shared, stream, peer, id, stop),
            )?
        };
        Ok(StaticServer {
            acceptor,
            root,
            ca_file,
            _dir: dir,
            shared,
        })
    }
}

struct Connection {
    http: HttpConn<StreamOwned<ServerConnection, TcpStream>>,
    id: u64,
    peer: SocketAddr,
    requests: u64,
}

impl Connection {
    fn serve(shared: &Shared, stream: TcpStream, peer: SocketAddr, id: u64, stop: &AtomicBool) {
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
            http: HttpConn::new(StreamOwned::new(conn, stream), "updraft-static"),
            id,
            peer,
            requests: 0,
        };
        while !stop.load(Ordering::SeqCst) {
            match c.one_request(shared) {
                Ok(true) => {}
                Ok(false) | Err(_) => break,
            }
        }
        c.http.stream.close();
    }

    /// Read, answer and log one request; `Ok(true)` to keep the
    /// connection open.
    fn one_request(&mut self, shared: &Shared) -> io::Result<bool> {
        let head = match self.http.read_head()? {
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
                let sent = self.http.write(&r, true)?;
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
                let body = match self.http.read_body(&req, MAX_BODY) {
                    Ok(b) => b,
                    Err(r) => {
                        let sent = self.http.write(&r, true)?;
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

        let mut response = match self.http.read_body(&req, MAX_BODY) {
            Ok(body) => {
                received += body.len() as u64;
                answer(&shared.root, &req)
            }
            Err(r) => r,
        };
        if !req.keep_alive() {
            response.close = true;
        }
        let sent = self.http.write(&response, req.method != "HEAD")?;
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
                    return Ok((502, self.http.write(&r, true)?));
                }
                self.http.stream.write_all(&bytes)?;
                self.http.stream.flush()?;
                let sent = Sent {
                    head: head as u64,
                    body: (bytes.len() - head) as u64,
                    cut: false,
                };
                Ok((status, sent))
            }
            Err(e) => {
                let mut r = Response::text(502, &format!("upstream {upstream}: {e}\n"));
                r.close = true;
                Ok((502, self.http.write(&r, true)?))
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
        let conn = &self.http.stream.conn;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
