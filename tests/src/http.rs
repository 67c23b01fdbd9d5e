//! HTTP/1.1 server plumbing shared by the test servers written in Rust
//! (the embedded [static server](crate::static_server) and the
//! [DDI server](crate::ddi_server)): a loopback listener that runs a
//! thread per connection and stops them all when dropped ([`Acceptor`]),
//! the rustls server configuration for a [`TestCa`] certificate, request
//! heads parsed with `httparse` ([`Request`]), bounded bodies, responses
//! written with `Content-Length` ([`HttpConn`]), single byte ranges and
//! HTTP dates.
//!
//! It owns the wire format only: what a server answers is decided by the
//! module using it. It must never listen anywhere but loopback, read a
//! head or body beyond its bounds, or keep a thread running after the
//! [`Acceptor`] that started it is dropped.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use socket2::SockRef;

use crate::ca::TestCa;

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most headers in one request.
pub const MAX_HEADERS: usize = 64;
/// Copy buffer for file bodies.
const CHUNK: usize = 64 * 1024;

/// A rustls server configuration presenting a loopback certificate issued
/// by `ca`, offering `http/1.1` by ALPN.
pub fn tls_server_config(ca: &TestCa) -> io::Result<ServerConfig> {
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

/// `e` with `what` in front of its message.
pub fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A listener on `127.0.0.1`, on a port the kernel chose, for the server
/// `name`.
pub fn bind_loopback(name: &str) -> io::Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
        .map_err(|e| ctx(e, &format!("binding a loopback port for the {name}")))
}

/// What serves one accepted connection: the stream, the peer, the
/// connection's serial number (from 1) and the flag that is set when the
/// [`Acceptor`] stops (a keep-alive loop checks it between requests).
pub type Handler = dyn Fn(TcpStream, SocketAddr, u64, &AtomicBool) + Send + Sync;

/// A loopback listener with a thread per connection, at most
/// `max_connections` at once (one beyond that is closed at once).
/// Dropping it stops listening, shuts every open connection down and
/// joins every thread.
pub struct Acceptor {
    addr: SocketAddr,
    listener: Arc<TcpListener>,
    shared: Arc<AcceptShared>,
    accept: Option<JoinHandle<()>>,
}

struct AcceptShared {
    stop: AtomicBool,
    max_connections: usize,
    handler: Box<Handler>,
    state: Mutex<AcceptState>,
}

#[derive(Default)]
struct AcceptState {
    /// A handle on each open connection, to shut it down on drop.
    live: BTreeMap<u64, TcpStream>,
    workers: Vec<JoinHandle<()>>,
    serial: u64,
    refused: u64,
}

impl AcceptShared {
    fn lock(&self) -> MutexGuard<'_, AcceptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Acceptor {
    /// Serve each connection `listener` accepts (see [`bind_loopback`])
    /// with `handler`, on threads named after `name`.
    pub fn start(
        name: &str,
        listener: TcpListener,
        max_connections: usize,
        handler: impl Fn(TcpStream, SocketAddr, u64, &AtomicBool) + Send + Sync + 'static,
    ) -> io::Result<Acceptor> {
        let listener = Arc::new(listener);
        let addr = listener.local_addr()?;
        let shared = Arc::new(AcceptShared {
            stop: AtomicBool::new(false),
            max_connections: max_connections.max(1),
            handler: Box::new(handler),
            state: Mutex::new(AcceptState::default()),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            let listener = Arc::clone(&listener);
            let conn_name = format!("{name}-conn");
            thread::Builder::new()
                .name(format!("{name}-accept"))
                .spawn(move || accept_loop(&shared, &listener, &conn_name))
                .map_err(|e| ctx(e, &format!("starting the {name}'s accept thread")))?
        };
        Ok(Acceptor {
            addr,
            listener,
            shared,
            accept: Some(accept),
        })
    }

    /// The listening address (`127.0.0.1`, a port the kernel chose).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections closed at once because `max_connections` were open.
    pub fn refused_connections(&self) -> u64 {
        self.shared.lock().refused
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.lock().live.len()
    }
}

impl Drop for Acceptor {
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

fn accept_loop(shared: &Arc<AcceptShared>, listener: &TcpListener, conn_name: &str) {
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{conn_name}: accept: {e}");
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
                eprintln!("{conn_name}: keeping a connection handle: {e}");
                continue;
            }
        };
        st.serial += 1;
        let id = st.serial;
        st.live.insert(id, handle);
        let s = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name(conn_name.to_string())
            .spawn(move || {
                (s.handler)(stream, peer, id, &s.stop);
                s.lock().live.remove(&id);
            });
        match spawned {
            Ok(h) => st.workers.push(h),
            Err(e) => {
                st.live.remove(&id);
                eprintln!("{conn_name}: cannot start a connection thread: {e}");
            }
        }
    }
}

/// A stream a response is written to, which can be dropped on the floor:
/// [`Transport::abort`] closes the TCP connection without any orderly
/// end (no TLS `close_notify`), as a network failure would.
/// [`Transport::close`] ends it in order (TLS `close_notify` first).
pub trait Transport: Read + Write {
    fn abort(&mut self);
    fn close(&mut self);
}

impl Transport for TcpStream {
    fn abort(&mut self) {
        let _ = self.shutdown(Shutdown::Both);
    }

    fn close(&mut self) {
        let _ = self.flush();
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl Transport for StreamOwned<ServerConnection, TcpStream> {
    fn abort(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

/// A parsed request head.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// The request target as sent (path and query).
    pub target: String,
    /// The minor HTTP version (`1` for HTTP/1.1).
    pub version: u8,
    /// Headers in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// Bytes of the head.
    pub head_len: usize,
}

impl Request {
    /// A header's value by case-insensitive name (the first one).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection stays open after the answer.
    pub fn keep_alive(&self) -> bool {
        match self.header("connection").map(str::to_ascii_lowercase) {
            Some(c) if c.contains("close") => false,
            Some(c) if c.contains("keep-alive") => true,
            _ => self.version >= 1,
        }
    }

    /// `METHOD target HTTP/1.x`.
    pub fn line(&self) -> String {
        format!("{} {} HTTP/1.{}", self.method, self.target, self.version)
    }
}

/// Parse a request head (through the blank line).
pub fn parse_head(head: &[u8]) -> Result<Request, String> {
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

/// What goes after the response head.
pub enum Body {
    Empty,
    Bytes(Vec<u8>),
    File { file: File, start: u64, len: u64 },
}

/// One answer, before it is written.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
    /// The body's length for `Content-Length` (a `HEAD` answer has the
    /// length of the `GET` answer and no body; `None` writes none).
    pub length: Option<u64>,
    /// Close the connection after this answer (`Connection: close`).
    pub close: bool,
}

impl Response {
    /// An empty answer with `Content-Length: 0`.
    pub fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Empty,
            length: Some(0),
            close: false,
        }
    }

    /// A `text/plain` answer.
    pub fn text(status: u16, text: &str) -> Response {
        Response::bytes(status, "text/plain", text.as_bytes().to_vec())
    }

    /// An answer of `body` as `content_type`.
    pub fn bytes(status: u16, content_type: &str, body: Vec<u8>) -> Response {
        let mut r = Response::new(status);
        r.headers.push(("Content-Type", content_type.to_string()));
        r.length = Some(body.len() as u64);
        r.body = Body::Bytes(body);
        r
    }

    /// Add a header.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

/// Bytes written for one response.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sent {
    pub head: u64,
    pub body: u64,
    /// The body was cut on purpose ([`HttpConn::write_cut`]) and the
    /// connection aborted.
    pub cut: bool,
}

/// The reason phrase of the statuses the test servers answer.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        _ => "",
    }
}

/// One HTTP/1.1 server connection over `S`: reads heads and bounded
/// bodies, writes responses. Bytes read past a request stay buffered for
/// the next one (pipelining).
pub struct HttpConn<S> {
    pub stream: S,
    server: &'static str,
    /// Bytes read past the end of the last request head.
    buf: Vec<u8>,
}

impl<S: Transport> HttpConn<S> {
    /// A connection whose answers carry `Server: <server>`.
    pub fn new(stream: S, server: &'static str) -> HttpConn<S> {
        HttpConn {
            stream,
            server,
            buf: Vec::new(),
        }
    }

    /// The next request head (through the blank line), or `None` when the
    /// client closed the connection between requests. A head over
    /// [`MAX_HEAD`] is answered `431` here and ends the connection.
    pub fn read_head(&mut self) -> io::Result<Option<Vec<u8>>> {
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
            let n = match self.stream.read(&mut chunk) {
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

    /// The request body (`Content-Length` only) of at most `max` bytes;
    /// the answer that refuses it otherwise (`411` for a chunked body,
    /// `400` for a bad length or a body that ends early, `413` over
    /// `max`), each closing the connection.
    pub fn read_body(&mut self, req: &Request, max: u64) -> Result<Vec<u8>, Response> {
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
        if len > max {
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
            match self.stream.read(&mut chunk) {
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
    pub fn write(&mut self, r: &Response, with_body: bool) -> io::Result<Sent> {
        self.write_cut(r, with_body, None)
    }

    /// Write a response, but when `cut_after` is given stop after that
    /// many body bytes and [abort](Transport::abort) the connection: the
    /// client sees a body shorter than its `Content-Length` and no
    /// orderly close.
    pub fn write_cut(
        &mut self,
        r: &Response,
        with_body: bool,
        cut_after: Option<u64>,
    ) -> io::Result<Sent> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", r.status, reason(r.status));
        head.push_str(&format!("Date: {}\r\n", http_date(SystemTime::now())));
        head.push_str(&format!("Server: {}\r\n", self.server));
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
        self.stream.write_all(head.as_bytes())?;
        let mut sent = Sent {
            head: head.len() as u64,
            ..Sent::default()
        };
        let budget = cut_after.unwrap_or(u64::MAX);
        if with_body {
            match &r.body {
                Body::Empty => {}
                Body::Bytes(b) => {
                    let n = (b.len() as u64).min(budget) as usize;
                    self.stream.write_all(&b[..n])?;
                    sent.body += n as u64;
                }
                Body::File { file, start, len } => {
                    let mut f = file;
                    f.seek(SeekFrom::Start(*start))?;
                    let mut left = (*len).min(budget);
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
                        self.stream.write_all(&chunk[..n])?;
                        sent.body += n as u64;
                        left -= n as u64;
                    }
                }
            }
        }
        self.stream.flush()?;
        if cut_after.is_some() {
            sent.cut = true;
            self.stream.abort();
        }
        Ok(sent)
    }
}

/// The first position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The path part of a request target (no query).
pub fn path_of(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or("")
}

/// The query of a request target (after `?`, before `#`), if any.
pub fn query_of(target: &str) -> Option<&str> {
    let (_, q) = target.split_once('?')?;
    Some(q.split('#').next().unwrap_or(""))
}

/// `%XX` escapes decoded; `None` for a bad escape.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
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

/// `s` with every byte but ASCII letters, digits and `-._~` written as
/// `%XX`, for one path segment.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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

/// Parse a `Range` header for a body of `len` bytes, as RFC 9110 asks of
/// a server that honours single ranges.
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

    #[test]
    fn path_segments_encode_and_decode() {
        assert_eq!(percent_encode("a b/c.tgz"), "a%20b%2Fc.tgz");
        assert_eq!(
            percent_decode(&percent_encode("é ~x")).unwrap(),
            "é ~x".as_bytes()
        );
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(query_of("/a?c=1#f"), Some("c=1"));
        assert_eq!(query_of("/a"), None);
        assert_eq!(path_of("/a?c=1"), "/a");
    }
}
