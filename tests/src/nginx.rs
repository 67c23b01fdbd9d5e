//! A real nginx serving a release directory over TLS on loopback.
//!
//! [`Nginx::builder`] writes a configuration into a directory of its own
//! (config, PID file, error and access logs, temp paths, certificates) and
//! starts Debian's `/usr/sbin/nginx` (or `UPDRAFT_NGINX`) in the foreground
//! with `-p <dir> -c <dir>/nginx.conf`. It never reads `/etc/nginx` or
//! writes `/var/lib/nginx`.
//!
//! Ports are never guessed: the listening sockets are bound to
//! `127.0.0.1:0` here and handed to nginx the way nginx hands them to a new
//! binary on upgrade (the `NGINX` environment variable lists inherited
//! descriptors), so there is no window in which another process can take a
//! port. Besides the main TLS server (the document root, ETags, ranges,
//! optionally `/report` proxied to a [`Collector`](crate::collector)) every
//! instance has fault servers on ports of their own, chosen with [`Block`]:
//! one answering `500`, one `429` and one `503` with `Retry-After`, one with
//! a certificate from an untrusted CA; and a plain-HTTP control server used
//! only for readiness, which is not logged.
//!
//! The access log is one JSON object per line ([`AccessEntry`]); it carries
//! what the end-to-end tests count: request line, status, `$request_length`,
//! `$bytes_sent`, `If-None-Match`, `Range`, TLS session reuse, connection
//! serials and a millisecond timestamp.
//!
//! nginx runs with a master process (the single-process mode crashes on
//! inherited sockets) as root, so workers can read any test directory. It is
//! stopped with SIGTERM to the master's PID on drop; the master stops its
//! workers. The master is also told (PR_SET_PDEATHSIG) to receive SIGTERM if
//! the test process dies, so an aborted run leaves no nginx behind. This
//! module must never signal a process it did not start.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::ca::TestCa;

/// Where nginx is looked for when `UPDRAFT_NGINX` is not set.
pub const DEFAULT_NGINX: &str = "/usr/sbin/nginx";

/// How long [`NginxBuilder::start`] waits for nginx to answer.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a stop waits for the master to exit before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// One of the server blocks of a test nginx, each on its own port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Block {
    /// TLS, serves the document root; `/report` proxied when configured.
    Main,
    /// TLS, answers every request with `500`.
    Error500,
    /// TLS, answers every request with `429` and `Retry-After`.
    TooManyRequests,
    /// TLS, answers every request with `503` and `Retry-After`.
    Unavailable,
    /// TLS with a certificate from a CA the client does not trust; serves
    /// the document root.
    UntrustedCert,
    /// Plain HTTP, readiness only, not logged.
    Control,
}

impl Block {
    /// All blocks, in the order their sockets are bound.
    pub const ALL: [Block; 6] = [
        Block::Main,
        Block::Error500,
        Block::TooManyRequests,
        Block::Unavailable,
        Block::UntrustedCert,
        Block::Control,
    ];

    /// The name written into the access log's `block` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Block::Main => "main",
            Block::Error500 => "error500",
            Block::TooManyRequests => "too_many_requests",
            Block::Unavailable => "unavailable",
            Block::UntrustedCert => "untrusted_cert",
            Block::Control => "control",
        }
    }

    fn from_name(s: &str) -> Option<Block> {
        Block::ALL.into_iter().find(|b| b.as_str() == s)
    }

    fn index(self) -> usize {
        match self {
            Block::Main => 0,
            Block::Error500 => 1,
            Block::TooManyRequests => 2,
            Block::Unavailable => 3,
            Block::UntrustedCert => 4,
            Block::Control => 5,
        }
    }
}

/// Configuration of a test nginx; see [`Nginx::builder`].
pub struct NginxBuilder<'a> {
    root: PathBuf,
    dir: Option<PathBuf>,
    binary: Option<PathBuf>,
    ca: Option<&'a TestCa>,
    retry_after_429: String,
    retry_after_503: String,
    report: Option<(String, SocketAddr)>,
    keepalive_timeout: u32,
    log_headers: Vec<String>,
    /// `(path, target)`: the main server answers `path` with a `302` to
    /// `target`.
    redirects: Vec<(String, String)>,
    /// The main server requires a client certificate issued by this CA
    /// (PEM file) and, when set, this bearer token.
    client_auth: Option<(PathBuf, Option<String>)>,
    /// Names the main server's certificate is issued for; empty:
    /// [`crate::ca::LOOPBACK_NAMES`].
    tls_names: Vec<String>,
    /// Path prefixes under which the main server ignores `Range` headers
    /// (`max_ranges 0`: every answer is the whole file, `200`).
    without_ranges: Vec<String>,
}

/// A running nginx; stopped (SIGTERM to its PID) when dropped.
pub struct Nginx {
    child: Option<Child>,
    dir: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
    root: PathBuf,
    addrs: [SocketAddr; 6],
    ca_file: PathBuf,
    untrusted_ca_file: PathBuf,
    startup: Duration,
}

/// One line of the access log.
#[derive(Clone, Debug, PartialEq)]
pub struct AccessEntry {
    /// When nginx finished the request (`$msec`, millisecond resolution).
    pub time: SystemTime,
    /// Which server block answered.
    pub block: Block,
    /// nginx's connection serial number (`$connection`): equal serials mean
    /// the requests shared a connection.
    pub connection: u64,
    /// Position of this request on its connection, from 1.
    pub connection_requests: u64,
    /// The client's source port (the proxy's, when one is in between).
    pub remote_port: u16,
    /// The request line, e.g. `GET /manifest.json HTTP/1.1`.
    pub request: String,
    /// Request method.
    pub method: String,
    /// Request URI as sent, with its query.
    pub uri: String,
    /// Response status.
    pub status: u16,
    /// Bytes received from the client: request line, headers and body.
    pub request_length: u64,
    /// Bytes sent to the client, headers included (before TLS framing).
    pub bytes_sent: u64,
    /// Bytes of response body sent.
    pub body_bytes_sent: u64,
    /// The `If-None-Match` request header, if sent.
    pub if_none_match: Option<String>,
    /// The `Range` request header, if sent.
    pub range: Option<String>,
    /// The `Idempotency-Key` request header, if sent.
    pub idempotency_key: Option<String>,
    /// The `User-Agent` request header, if sent.
    pub user_agent: Option<String>,
    /// The TLS session was resumed (`$ssl_session_reused` = `r`).
    pub ssl_session_reused: bool,
    /// `TLSv1.3`, `TLSv1.2`; `None` on plain HTTP.
    pub ssl_protocol: Option<String>,
    /// Request processing time in milliseconds (`$request_time`).
    pub request_time_ms: u64,
    /// Values of the headers named with [`NginxBuilder::log_header`]
    /// that were present, keyed by the lower-case header name.
    pub headers: BTreeMap<String, String>,
}

impl Nginx {
    /// A builder for an nginx serving `root` (a directory) over TLS.
    pub fn builder<'a>(root: impl Into<PathBuf>) -> NginxBuilder<'a> {
        NginxBuilder {
            root: root.into(),
            dir: None,
            binary: None,
            ca: None,
            retry_after_429: "1".to_string(),
            retry_after_503: "1".to_string(),
            report: None,
            keepalive_timeout: 75,
            log_headers: Vec::new(),
            redirects: Vec::new(),
            client_auth: None,
            tls_names: Vec::new(),
            without_ranges: Vec::new(),
        }
    }

    /// The nginx binary used: `UPDRAFT_NGINX` or [`DEFAULT_NGINX`].
    pub fn binary() -> PathBuf {
        std::env::var_os("UPDRAFT_NGINX")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_NGINX))
    }

    /// Address of the main TLS server.
    pub fn addr(&self) -> SocketAddr {
        self.addr_of(Block::Main)
    }

    /// Port of the main TLS server.
    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    /// Address of one server block.
    pub fn addr_of(&self, block: Block) -> SocketAddr {
        self.addrs[block.index()]
    }

    /// `https://127.0.0.1:<port><path>` for the main server; `path` starts
    /// with `/`.
    pub fn url(&self, path: &str) -> String {
        self.url_of(Block::Main, path)
    }

    /// A URL for one server block (`http://` for [`Block::Control`]).
    pub fn url_of(&self, block: Block, path: &str) -> String {
        let scheme = if block == Block::Control {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{}{path}", self.addr_of(block))
    }

    /// PEM file of the CA that issued the main server's certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// PEM file of the CA behind [`Block::UntrustedCert`].
    pub fn untrusted_ca_file(&self) -> &Path {
        &self.untrusted_ca_file
    }

    /// The document root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// nginx's directory: config, logs, certificates, temp paths.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// PID of the nginx master, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Time from spawning nginx to its first answer.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Path of the access log.
    pub fn access_log_path(&self) -> PathBuf {
        self.dir.join("logs/access.log")
    }

    /// The error log, for failure messages.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }

    /// Every request logged so far, oldest first.
    ///
    /// nginx writes a line when it has finished a request, which can be a
    /// moment after the client has read the response: use
    /// [`Nginx::wait_access_log`] to wait for entries a test expects.
    pub fn access_log(&self) -> io::Result<Vec<AccessEntry>> {
        let path = self.access_log_path();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("reading nginx access log {}: {e}", path.display()),
                ));
            }
        };
        // nginx appends each entry with one write(2), but a read can land
        // while that write is under way: a last line without its newline
        // is an entry still being written, not a malformed one.
        let complete = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(&bytes[..0], |end| &bytes[..=end]);
        parse_access_log(complete)
    }

    /// Wait until `done` holds for the access log, or `timeout` passes;
    /// returns the log as last read either way (the caller asserts).
    pub fn wait_access_log(
        &self,
        timeout: Duration,
        done: impl Fn(&[AccessEntry]) -> bool,
    ) -> io::Result<Vec<AccessEntry>> {
        let deadline = Instant::now() + timeout;
        loop {
            let entries = self.access_log()?;
            if done(&entries) || Instant::now() >= deadline {
                return Ok(entries);
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stop nginx now (SIGTERM, then SIGKILL after a timeout) and return
    /// the master's exit status. Dropping does the same.
    pub fn stop(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.child.take() {
            Some(child) => stop_child(child).map(Some),
            None => Ok(None),
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("stopping nginx in {}: {e}", self.dir.display());
        }
    }
}

impl<'a> NginxBuilder<'a> {
    /// Issue the main server's certificate from `ca` (by default a fresh CA
    /// is made; either way its PEM is at [`Nginx::ca_file`]).
    pub fn ca(mut self, ca: &'a TestCa) -> Self {
        self.ca = Some(ca);
        self
    }

    /// Issue the main server's certificate for `names` (IP literals become
    /// IP SANs) instead of the loopback names, e.g. for a client that
    /// reaches this loopback server through an address translation, as a
    /// QEMU guest does through `10.0.2.2`.
    pub fn tls_names(mut self, names: &[&str]) -> Self {
        self.tls_names = names.iter().map(|n| n.to_string()).collect();
        self
    }

    /// Run this nginx binary instead of [`Nginx::binary`].
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Put nginx's files in a new subdirectory of `dir` (kept; the caller's
    /// temp dir removes it) instead of a temp dir removed on drop.
    pub fn in_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// `Retry-After` seconds sent by both the `429` and `503` blocks.
    pub fn retry_after(self, secs: u32) -> Self {
        self.retry_after_429(&secs.to_string())
            .retry_after_503(&secs.to_string())
    }

    /// Raw `Retry-After` value of the `429` block (seconds or HTTP-date).
    pub fn retry_after_429(mut self, value: &str) -> Self {
        self.retry_after_429 = value.to_string();
        self
    }

    /// Raw `Retry-After` value of the `503` block (seconds or HTTP-date).
    pub fn retry_after_503(mut self, value: &str) -> Self {
        self.retry_after_503 = value.to_string();
        self
    }

    /// Answer `path` (an exact path) on the main server with
    /// `302 Found` and `Location: target`.
    pub fn redirect(mut self, path: &str, target: &str) -> Self {
        self.redirects.push((path.to_string(), target.to_string()));
        self
    }

    /// Serve the files under `prefix` (a path starting and ending with
    /// `/`, e.g. `/whole/`) from the document root as a server that does
    /// not do ranges: every `GET` gets the whole file with `200`.
    pub fn without_ranges(mut self, prefix: &str) -> Self {
        self.without_ranges.push(prefix.to_string());
        self
    }

    /// Proxy requests under `path` (e.g. `/report`) on the main server to
    /// a plain-HTTP server at `upstream` (a [`Collector`](crate::collector::Collector)).
    pub fn report_to(mut self, path: &str, upstream: SocketAddr) -> Self {
        self.report = Some((path.to_string(), upstream));
        self
    }

    /// Make the main server demand device identity: a client certificate
    /// issued by the CA in `ca_pem` (mTLS) and, with `bearer`, an
    /// `Authorization: Bearer …` header carrying that token (else 401).
    pub fn require_client(mut self, ca_pem: impl Into<PathBuf>, bearer: Option<&str>) -> Self {
        self.client_auth = Some((ca_pem.into(), bearer.map(str::to_string)));
        self
    }

    /// Seconds an idle keep-alive connection stays open (default 75).
    pub fn keepalive_timeout(mut self, secs: u32) -> Self {
        self.keepalive_timeout = secs;
        self
    }

    /// Also log request header `name` into [`AccessEntry::headers`].
    pub fn log_header(mut self, name: &str) -> Self {
        self.log_headers.push(name.to_ascii_lowercase());
        self
    }

    /// Write the configuration, start nginx and wait until it answers.
    pub fn start(self) -> io::Result<Nginx> {
        let binary = self.binary.clone().unwrap_or_else(Nginx::binary);
        if !binary.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "nginx not found at {}: install the Debian package `nginx` \
                     (apt-get install nginx), or set UPDRAFT_NGINX",
                    binary.display()
                ),
            ));
        }
        let root = fs::canonicalize(&self.root).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("nginx document root {}: {e}", self.root.display()),
            )
        })?;
        check_conf_path(&root)?;
        for v in [&self.retry_after_429, &self.retry_after_503] {
            check_conf_value("Retry-After value", v)?;
        }
        if let Some((ca, bearer)) = &self.client_auth {
            check_conf_path(ca)?;
            if let Some(t) = bearer {
                check_conf_value("bearer token", t)?;
            }
        }
        if let Some((path, _)) = &self.report {
            check_conf_value("report path", path)?;
            if !path.starts_with('/') {
                return Err(invalid(format!("report path {path:?} must start with '/'")));
            }
        }
        for p in &self.without_ranges {
            check_conf_value("path prefix", p)?;
            if !p.starts_with('/') || !p.ends_with('/') || p.contains(char::is_whitespace) {
                return Err(invalid(format!(
                    "path prefix {p:?} must start and end with '/', without spaces"
                )));
            }
        }
        for h in &self.log_headers {
            if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(invalid(format!("header name {h:?} cannot be logged")));
            }
        }

        let (tempdir, dir) = match &self.dir {
            Some(parent) => {
                let d = tempfile::Builder::new()
                    .prefix("nginx-")
                    .tempdir_in(parent)
                    .map_err(|e| ctx(e, &format!("making an nginx dir in {}", parent.display())))?
                    .keep();
                (None, d)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("updraft-nginx-")
                    .tempdir()
                    .map_err(|e| ctx(e, "making an nginx temp dir"))?;
                let d = t.path().to_path_buf();
                (Some(t), d)
            }
        };
        check_conf_path(&dir)?;
        for sub in ["logs", "tls", "tmp"] {
            fs::create_dir(dir.join(sub))
                .map_err(|e| ctx(e, &format!("creating {}", dir.join(sub).display())))?;
        }

        // Certificates.
        let names: Vec<&str> = if self.tls_names.is_empty() {
            crate::ca::LOOPBACK_NAMES.to_vec()
        } else {
            self.tls_names.iter().map(String::as_str).collect()
        };
        let (ca_pem, leaf) = match self.ca {
            Some(ca) => (ca.cert_pem(), ca.issue(&names)?),
            None => {
                let ca = TestCa::new("updraft test CA")?;
                (ca.cert_pem(), ca.issue(&names)?)
            }
        };
        let tls = dir.join("tls");
        let ca_file = tls.join("ca.pem");
        fs::write(&ca_file, ca_pem)
            .map_err(|e| ctx(e, &format!("writing {}", ca_file.display())))?;
        leaf.write(&tls, "server")?;
        let untrusted = TestCa::new("updraft untrusted test CA")?;
        let untrusted_ca_file = tls.join("untrusted-ca.pem");
        untrusted.write_cert(&untrusted_ca_file)?;
        untrusted.issue_loopback()?.write(&tls, "untrusted")?;

        // Listening sockets, inherited by nginx.
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for block in Block::ALL {
            let l = TcpListener::bind("127.0.0.1:0")
                .map_err(|e| ctx(e, &format!("binding a loopback port for nginx {block:?}")))?;
            addrs.push(l.local_addr()?);
            listeners.push(l);
        }
        let addrs: [SocketAddr; 6] = match addrs.try_into() {
            Ok(a) => a,
            Err(_) => return Err(io::Error::other("nginx: wrong number of sockets")),
        };

        let conf = self.config(&dir, &root, &addrs);
        let conf_path = dir.join("nginx.conf");
        fs::write(&conf_path, conf)
            .map_err(|e| ctx(e, &format!("writing {}", conf_path.display())))?;

        let fds: Vec<RawFd> = listeners.iter().map(|l| l.as_raw_fd()).collect();
        let inherited: String = fds.iter().map(|fd| format!("{fd};")).collect();
        let stderr_path = dir.join("logs/stderr.log");
        let stderr = fs::File::create(&stderr_path)
            .map_err(|e| ctx(e, &format!("creating {}", stderr_path.display())))?;
        let mut cmd = Command::new(&binary);
        cmd.arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.join("logs/error.log"))
            .env("NGINX", inherited)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe calls (fcntl, prctl, getppid).
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::other("test process exited while starting nginx"));
                }
                Ok(())
            });
        }
        let started = Instant::now();
        let child = spawn_from_keeper(cmd)
            .map_err(|e| ctx(e, &format!("starting {}", binary.display())))?;
        drop(listeners);

        let mut nginx = Nginx {
            child: Some(child),
            dir,
            _tempdir: tempdir,
            root,
            addrs,
            ca_file,
            untrusted_ca_file,
            startup: Duration::ZERO,
        };
        wait_ready(&mut nginx)?;
        nginx.startup = started.elapsed();
        Ok(nginx)
    }

    fn config(&self, dir: &Path, root: &Path, addrs: &[SocketAddr; 6]) -> String {
        let d = dir.display();
        let root = root.display();
        let port = |b: Block| addrs[b.index()].port();
        let mut c = String::new();
        let _ = writeln!(c, "# nginx for updraft's end-to-end tests (generated)");
        let _ = writeln!(c, "daemon off;\nmaster_process on;\nworker_processes 1;");
        if crate::skip::is_root() {
            let _ = writeln!(c, "user root root;");
        }
        let _ = writeln!(c, "pid \"{d}/nginx.pid\";\nlock_file \"{d}/nginx.lock\";");
        let _ = writeln!(c, "error_log \"{d}/logs/error.log\" notice;");
        let _ = writeln!(c, "worker_shutdown_timeout 1s;");
        let _ = writeln!(c, "events {{ worker_connections 1024; }}");
        let _ = writeln!(c, "http {{");
        let _ = writeln!(c, "  default_type application/octet-stream;");
        let _ = writeln!(
            c,
            "  types {{ application/json json; text/plain txt; text/html html; }}"
        );
        for (directive, sub) in [
            ("client_body_temp_path", "body"),
            ("proxy_temp_path", "proxy"),
            ("fastcgi_temp_path", "fastcgi"),
            ("uwsgi_temp_path", "uwsgi"),
            ("scgi_temp_path", "scgi"),
        ] {
            let _ = writeln!(c, "  {directive} \"{d}/tmp/{sub}\";");
        }
        let mut fmt = String::from(
            "{\"msec\":\"$msec\",\"block\":\"$updraft_block\",\"connection\":\"$connection\",\
             \"connection_requests\":\"$connection_requests\",\"remote_port\":\"$remote_port\",\
             \"request\":\"$request\",\"method\":\"$request_method\",\"uri\":\"$request_uri\",\
             \"status\":\"$status\",\"request_length\":\"$request_length\",\
             \"bytes_sent\":\"$bytes_sent\",\"body_bytes_sent\":\"$body_bytes_sent\",\
             \"if_none_match\":\"$http_if_none_match\",\"range\":\"$http_range\",\
             \"idempotency_key\":\"$http_idempotency_key\",\"user_agent\":\"$http_user_agent\",\
             \"ssl_session_reused\":\"$ssl_session_reused\",\"ssl_protocol\":\"$ssl_protocol\",\
             \"request_time\":\"$request_time\"",
        );
        for h in &self.log_headers {
            let var = h.replace('-', "_");
            let _ = write!(fmt, ",\"h:{h}\":\"$http_{var}\"");
        }
        fmt.push('}');
        let _ = writeln!(c, "  log_format updraft escape=json '{fmt}';");
        let _ = writeln!(c, "  access_log \"{d}/logs/access.log\" updraft;");
        let _ = writeln!(c, "  server_tokens off;");
        let _ = writeln!(c, "  keepalive_timeout {}s;", self.keepalive_timeout);
        let _ = writeln!(c, "  ssl_protocols TLSv1.2 TLSv1.3;");
        let _ = writeln!(c, "  ssl_session_cache shared:updraft_tls:1m;");
        let _ = writeln!(c, "  ssl_session_timeout 1h;");
        let _ = writeln!(c, "  ssl_certificate \"{d}/tls/server.crt\";");
        let _ = writeln!(c, "  ssl_certificate_key \"{d}/tls/server.key\";");

        // Main server.
        let _ = writeln!(c, "  server {{");
        let _ = writeln!(c, "    listen 127.0.0.1:{} ssl;", port(Block::Main));
        let _ = writeln!(c, "    set $updraft_block {};", Block::Main.as_str());
        let _ = writeln!(c, "    root \"{root}\";");
        if let Some((ca, bearer)) = &self.client_auth {
            let _ = writeln!(c, "    ssl_client_certificate \"{}\";", ca.display());
            let _ = writeln!(c, "    ssl_verify_client on;");
            if let Some(t) = bearer {
                let _ = writeln!(
                    c,
                    "    if ($http_authorization != \"Bearer {t}\") {{ return 401; }}"
                );
            }
        }
        let _ = writeln!(c, "    location / {{ }}");
        for p in &self.without_ranges {
            let _ = writeln!(c, "    location {p} {{ max_ranges 0; }}");
        }
        for (path, target) in &self.redirects {
            let _ = writeln!(c, "    location = {path} {{ return 302 \"{target}\"; }}");
        }
        if let Some((path, upstream)) = &self.report {
            let _ = writeln!(
                c,
                "    location {path} {{ proxy_pass http://{upstream}; proxy_set_header Host $host; }}"
            );
        }
        let _ = writeln!(c, "  }}");

        // Fault servers.
        let fault = |c: &mut String, block: Block, body: &str| {
            let _ = writeln!(
                c,
                "  server {{\n    listen 127.0.0.1:{} ssl;\n    set $updraft_block {};\n    \
                 location / {{ {body} }}\n  }}",
                port(block),
                block.as_str()
            );
        };
        fault(&mut c, Block::Error500, "return 500;");
        fault(
            &mut c,
            Block::TooManyRequests,
            &format!(
                "add_header Retry-After \"{}\" always; return 429;",
                self.retry_after_429
            ),
        );
        fault(
            &mut c,
            Block::Unavailable,
            &format!(
                "add_header Retry-After \"{}\" always; return 503;",
                self.retry_after_503
            ),
        );
        let _ = writeln!(c, "  server {{");
        let _ = writeln!(
            c,
            "    listen 127.0.0.1:{} ssl;",
            port(Block::UntrustedCert)
        );
        let _ = writeln!(
            c,
            "    set $updraft_block {};",
            Block::UntrustedCert.as_str()
        );
        let _ = writeln!(c, "    ssl_certificate \"{d}/tls/untrusted.crt\";");
        let _ = writeln!(c, "    ssl_certificate_key \"{d}/tls/untrusted.key\";");
        let _ = writeln!(c, "    root \"{root}\";");
        let _ = writeln!(c, "    location / {{ }}");
        let _ = writeln!(c, "  }}");

        // Control server: readiness, never logged.
        let _ = writeln!(c, "  server {{");
        let _ = writeln!(c, "    listen 127.0.0.1:{};", port(Block::Control));
        let _ = writeln!(c, "    set $updraft_block {};", Block::Control.as_str());
        let _ = writeln!(c, "    access_log off;");
        let _ = writeln!(c, "    location = /ready {{ return 204; }}");
        let _ = writeln!(c, "    location / {{ return 404; }}");
        let _ = writeln!(c, "  }}");
        let _ = writeln!(c, "}}");
        c
    }
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Refuse paths nginx's config syntax or variable interpolation would
/// misread.
fn check_conf_path(p: &Path) -> io::Result<()> {
    match p.to_str() {
        Some(s) => check_conf_value("path", s),
        None => Err(invalid(format!("nginx path {} is not UTF-8", p.display()))),
    }
}

fn check_conf_value(what: &str, s: &str) -> io::Result<()> {
    if s.is_empty()
        || s.chars()
            .any(|c| matches!(c, '"' | '\'' | '\\' | '$' | ';' | '{' | '}' | '#') || c.is_control())
    {
        return Err(invalid(format!(
            "nginx {what} {s:?} cannot be written into a config"
        )));
    }
    Ok(())
}

/// Spawn a command from one long-lived thread, so that PR_SET_PDEATHSIG
/// (which fires when the *thread* that forked exits) fires only when the
/// test process itself ends. [`crate::goosebit`] starts its server here too.
pub(crate) fn spawn_from_keeper(cmd: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = thread::Builder::new()
            .name("nginx-spawner".to_string())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        if let Err(e) = spawned {
            eprintln!("starting the nginx spawner thread: {e}");
        }
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    keeper
        .lock()
        .map_err(|_| io::Error::other("nginx spawner lock poisoned"))?
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("nginx spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("nginx spawner thread did not answer"))?
}

/// Wait until the control server answers `/ready`, or nginx exits.
fn wait_ready(nginx: &mut Nginx) -> io::Result<()> {
    let addr = nginx.addr_of(Block::Control);
    let deadline = Instant::now() + START_TIMEOUT;
    let failed = |nginx: &Nginx, why: String| {
        let stderr = fs::read_to_string(nginx.dir.join("logs/stderr.log")).unwrap_or_default();
        io::Error::other(format!(
            "nginx in {} did not start: {why}\n--- error.log ---\n{}--- stderr ---\n{stderr}",
            nginx.dir.display(),
            nginx.error_log()
        ))
    };
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .map_err(|e| failed(nginx, format!("connecting to control port {addr}: {e}")))?;
    stream.set_read_timeout(Some(Duration::from_millis(2)))?;
    stream
        .write_all(b"GET /ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| failed(nginx, format!("asking control port {addr}: {e}")))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if let Some(child) = nginx.child.as_mut() {
                    if let Some(status) = child.try_wait()? {
                        nginx.child = None;
                        return Err(failed(nginx, format!("nginx exited with {status}")));
                    }
                }
                if Instant::now() >= deadline {
                    return Err(failed(nginx, format!("no answer within {START_TIMEOUT:?}")));
                }
            }
            Err(e) => return Err(failed(nginx, format!("reading control port {addr}: {e}"))),
        }
    }
    if answer.starts_with(b"HTTP/1.1 204") {
        Ok(())
    } else {
        Err(failed(
            nginx,
            format!(
                "control port answered {:?}",
                String::from_utf8_lossy(&answer[..answer.len().min(200)])
            ),
        ))
    }
}

/// SIGTERM to our child's PID, wait, then SIGKILL it and its children.
fn stop_child(mut child: Child) -> io::Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill has no memory-safety preconditions; `pid` is our own
    // child, not yet reaped (try_wait above returned None), so the PID
    // cannot have been reused.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        thread::sleep(Duration::from_millis(2));
    }
    // The master did not stop: kill the workers it started, then it.
    let children =
        fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for worker in children
        .split_whitespace()
        .filter_map(|w| w.parse::<libc::pid_t>().ok())
    {
        // SAFETY: as above; these are children of our unreaped child.
        unsafe {
            libc::kill(worker, libc::SIGKILL);
        }
    }
    child.kill()?;
    child.wait()
}

/// Parse an access log written with the `updraft` log format.
pub fn parse_access_log(bytes: &[u8]) -> io::Result<Vec<AccessEntry>> {
    let mut out = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let entry = parse_access_line(line).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "nginx access log line {}: {why}: {:?}",
                    i + 1,
                    String::from_utf8_lossy(&line[..line.len().min(300)])
                ),
            )
        })?;
        out.push(entry);
    }
    Ok(out)
}

fn parse_access_line(line: &[u8]) -> Result<AccessEntry, String> {
    let text = String::from_utf8_lossy(line);
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let s = |k: &str| -> Result<&str, String> {
        obj.get(k)
            .and_then(|x| x.as_str())
            .ok_or_else(|| format!("field {k:?} missing"))
    };
    let opt = |k: &str| -> Result<Option<String>, String> {
        let v = s(k)?;
        Ok((!v.is_empty()).then(|| v.to_string()))
    };
    let num = |k: &str| -> Result<u64, String> {
        let v = s(k)?;
        v.parse::<u64>()
            .map_err(|_| format!("field {k:?} is not a number: {v:?}"))
    };
    let block =
        Block::from_name(s("block")?).ok_or_else(|| format!("unknown block {:?}", s("block")))?;
    let mut headers = BTreeMap::new();
    for (k, v) in obj {
        if let (Some(name), Some(value)) = (k.strip_prefix("h:"), v.as_str()) {
            if !value.is_empty() {
                headers.insert(name.to_string(), value.to_string());
            }
        }
    }
    let remote_port = num("remote_port")?;
    let status = num("status")?;
    Ok(AccessEntry {
        time: UNIX_EPOCH + parse_millis(s("msec")?)?,
        block,
        connection: num("connection")?,
        connection_requests: num("connection_requests")?,
        remote_port: u16::try_from(remote_port)
            .map_err(|_| format!("remote_port {remote_port}"))?,
        request: s("request")?.to_string(),
        method: s("method")?.to_string(),
        uri: s("uri")?.to_string(),
        status: u16::try_from(status).map_err(|_| format!("status {status}"))?,
        request_length: num("request_length")?,
        bytes_sent: num("bytes_sent")?,
        body_bytes_sent: num("body_bytes_sent")?,
        if_none_match: opt("if_none_match")?,
        range: opt("range")?,
        idempotency_key: opt("idempotency_key")?,
        user_agent: opt("user_agent")?,
        ssl_session_reused: s("ssl_session_reused")? == "r",
        ssl_protocol: opt("ssl_protocol")?,
        request_time_ms: parse_millis(s("request_time")?)?.as_millis() as u64,
        headers,
    })
}

/// `"1700000000.123"` → 1700000000 s 123 ms (no float rounding).
fn parse_millis(v: &str) -> Result<Duration, String> {
    let bad = || format!("not a seconds.millis value: {v:?}");
    let (secs, frac) = v.split_once('.').ok_or_else(bad)?;
    if frac.len() != 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let secs: u64 = secs.parse().map_err(|_| bad())?;
    let millis: u64 = frac.parse().map_err(|_| bad())?;
    Ok(Duration::from_secs(secs) + Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"msec":"1764464400.123","block":"main","connection":"7","connection_requests":"2","remote_port":"40000","request":"GET /manifest.json HTTP/1.1","method":"GET","uri":"/manifest.json","status":"304","request_length":"210","bytes_sent":"180","body_bytes_sent":"0","if_none_match":"\"abc-12\"","range":"","idempotency_key":"","user_agent":"updraft/0.1","ssl_session_reused":"r","ssl_protocol":"TLSv1.3","request_time":"0.000","h:x-device":"d1"}"#;

    #[test]
    fn an_access_line_parses_into_its_fields() {
        let e = &parse_access_log(LINE.as_bytes()).unwrap()[0];
        assert_eq!(
            e.time,
            UNIX_EPOCH + Duration::from_millis(1_764_464_400_123)
        );
        assert_eq!(e.block, Block::Main);
        assert_eq!((e.connection, e.connection_requests), (7, 2));
        assert_eq!(e.status, 304);
        assert_eq!((e.request_length, e.bytes_sent), (210, 180));
        assert_eq!(e.if_none_match.as_deref(), Some("\"abc-12\""));
        assert_eq!(e.range, None);
        assert!(e.ssl_session_reused);
        assert_eq!(e.headers.get("x-device").map(String::as_str), Some("d1"));
    }

    #[test]
    fn malformed_access_lines_are_errors_not_panics() {
        for bad in [
            "not json",
            "[]",
            "{}",
            &LINE.replace("\"304\"", "\"3x4\""),
            &LINE.replace("\"main\"", "\"other\""),
            &LINE.replace("1764464400.123", "1764464400"),
            &LINE.replace("1764464400.123", "99999999999999999999.123"),
            &LINE.replace("\"40000\"", "\"70000\""),
        ] {
            assert!(parse_access_log(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_access_log(b"\xff\xfe{").is_err());
    }
}
