//! HTTPS transfers: the only code that talks to the network.
//!
//! Built on ureq with rustls and the ring provider. This module owns the
//! transport rules every download obeys:
//!
//! * https only; plain http only with the development switch
//!   `server.insecure_allow_http`. Redirects are followed here, not by the
//!   HTTP library, so every hop is checked: a redirect from https to plain
//!   http is refused always, with or without the switch;
//! * trust: the system CA bundle plus the optional `ca_file`; an optional
//!   client certificate (mTLS) and bearer token for servers that identify
//!   devices. The token (`Authorization: Bearer`; a DDI server's
//!   `TargetToken` or `GatewayToken`, from a file only its owner may read)
//!   goes only to the configured origins (scheme, host and port of
//!   `manifest_url`, of each mirror and of `report_url`; of `ddi_url` with
//!   `kind = "hawkbit"`), never to another host a manifest, a deployment,
//!   a redirect or an operator's URL names;
//! * bounded waits: connect (including name resolution) and per-read
//!   timeouts, so a dead peer is noticed in `stall_timeout`;
//! * caps: a body is never read past the size the caller expects (the signed
//!   size), and a server that announces more is refused up front (endless
//!   data);
//! * a slow-retrieval floor: a transfer that delivers fewer than `min_rate`
//!   bytes/s over `min_rate_window` is abandoned;
//! * the operator's bandwidth cap (`policy.max_rate`) on artifact bodies,
//!   never on manifests, key documents or reports ([`crate::throttle`]);
//! * conditional GETs with `If-None-Match`, and one long-lived agent so TLS
//!   sessions are resumed and idle connections reused across polls;
//! * the standard proxy environment variables (`HTTPS_PROXY`, `NO_PROXY`, …).
//!
//! It never interprets what it downloads and never retries on its own:
//! choosing mirrors and backing off belong to [`crate::source`] and
//! [`crate::backoff`].

use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ureq::Agent;
use ureq::tls::{Certificate, ClientCert, PemItem, RootCerts, TlsConfig, TlsProvider, parse_pem};

use crate::config::{Config, DdiAuth, ServerKind};
use crate::error::{Error, Kind, Result};
use crate::hash::truncate;
use crate::throttle::Throttle;
use crate::{bail, err};

/// Where the system CA bundle lives on common distributions.
mod range;
pub use range::{RangeInfo, Ranged};

const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Per-connection buffer sizes (see `Fetcher::new`).
const INPUT_BUFFER: usize = 64 * 1024;
const OUTPUT_BUFFER: usize = 16 * 1024;

/// Outcome of a conditional GET.
#[derive(Debug)]
pub enum Fetched {
    /// 304: the resource has the ETag we sent.
    NotModified,
    /// 200 with the body and its ETag, if any.
    Body {
        bytes: Vec<u8>,
        etag: Option<String>,
    },
}

/// Byte counters shared with the metrics.
#[derive(Default, Debug)]
pub struct Counters {
    pub body_bytes: AtomicU64,
    pub requests: AtomicU64,
}

/// The HTTPS client. One per process, kept for its lifetime.
#[derive(Clone)]
pub struct Fetcher {
    agent: Agent,
    allow_http: bool,
    token_file: Option<std::path::PathBuf>,
    /// The `Authorization` scheme the token is sent with: `Bearer`, or
    /// DDI's `TargetToken` / `GatewayToken`.
    token_scheme: &'static str,
    /// The token file must be its owner's alone (mode 0600 or stricter):
    /// a DDI device token.
    private_token: bool,
    /// Where the token may go: the configured servers' origins.
    credentialed: Arc<Vec<UrlOrigin>>,
    min_rate: u64,
    min_rate_window: Duration,
    /// `policy.max_rate`: the cap on artifact bodies ([`Fetcher::open`]).
    max_rate: Option<u64>,
    /// `policy.window_rate` and the windows it applies in: the cap for a
    /// body opened while a window is open.
    window_rate: Option<(u64, Arc<crate::window::Windows>)>,
    pub counters: Arc<Counters>,
}

/// Install ring as rustls's process-wide provider (idempotent).
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Load every certificate in a PEM file.
fn load_certs(path: &Path, what: &str) -> Result<Vec<Certificate<'static>>> {
    let pem =
        std::fs::read(path).map_err(|e| err!(Config, "reading {what} {}: {e}", path.display()))?;
    let mut certs = Vec::new();
    for item in parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => bail!(Config, "{what} {}: {e}", path.display()),
        }
    }
    if certs.is_empty() {
        bail!(Config, "{what} {} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

/// Check a client certificate and key the way rustls will use them, so a
/// mismatch is a configuration error at start, not a failure later.
fn load_client_cert(cert: &Path, key: &Path) -> Result<ClientCert> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = load_certs(cert, "server.client_cert")?;
    let key_pem = std::fs::read(key)
        .map_err(|e| err!(Config, "reading server.client_key {}: {e}", key.display()))?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| err!(Config, "server.client_key {}: {e}", key.display()))?;
    let ders: Vec<CertificateDer<'static>> = chain
        .iter()
        .map(|c| CertificateDer::from(c.der().to_vec()))
        .collect();
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| err!(Config, "TLS setup: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(ders, key_der.clone_key())
        .map_err(|e| {
            err!(
                Config,
                "server.client_cert {} and server.client_key {} do not form a usable pair: {e}",
                cert.display(),
                key.display()
            )
        })?;
    let key = ureq::tls::PrivateKey::from_pem(&key_pem)
        .map_err(|e| err!(Config, "server.client_key {}: {e}", key.display()))?;
    Ok(ClientCert::new_with_certs(&chain, key))
}

impl Fetcher {
    /// The client for `config.server`, with `config.policy`'s cap.
    pub fn new(config: &Config) -> Result<Fetcher> {
        let cfg = &config.server;
        install_crypto_provider();
        let mut roots: Vec<Certificate<'static>> = Vec::new();
        if cfg.system_roots {
            let env = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
            let bundle = env
                .into_iter()
                .chain(SYSTEM_BUNDLES.iter().map(std::path::PathBuf::from))
                .find(|p| p.is_file());
            if let Some(b) = bundle {
                match load_certs(&b, "system CA bundle") {
                    Ok(c) => roots.extend(c),
                    Err(e) => log::warn!("ignoring system CA bundle: {e}"),
                }
            }
        }
        if let Some(ca) = &cfg.ca_file {
            roots.extend(load_certs(ca, "server.ca_file")?);
        }
        if roots.is_empty() && (!cfg.manifest_url.is_empty() || !cfg.report_url.is_empty()) {
            log::warn!("no TLS trust anchors: no system CA bundle found and no server.ca_file set");
        }
        let mut tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::new_with_certs(&roots));
        if let (Some(c), Some(k)) = (&cfg.client_cert, &cfg.client_key) {
            tls = tls.client_cert(Some(load_client_cert(c, k)?));
        }
        let agent: Agent = Agent::config_builder()
            .tls_config(tls.build())
            .https_only(!cfg.insecure_allow_http)
            .http_status_as_error(false)
            .timeout_resolve(Some(cfg.connect_timeout.0))
            .timeout_connect(Some(cfg.connect_timeout.0))
            .timeout_send_request(Some(cfg.stall_timeout.0))
            .timeout_recv_response(Some(cfg.stall_timeout.0))
            .timeout_per_read(Some(cfg.stall_timeout.0))
            .timeout_per_write(Some(cfg.stall_timeout.0))
            .user_agent(concat!("updraft/", env!("CARGO_PKG_VERSION")))
            .accept("*/*")
            // Redirects are followed by `Fetcher::call`, hop by hop.
            .max_redirects(0)
            // ureq's default buffers are 128 KiB each way, allocated per
            // connection and kept with an idle pooled one. Input: large
            // enough for ureq's 64 KiB response-header limit, which stays
            // what it was; bodies stream through it in TLS-record-sized
            // reads either way. Output: request headers (URL, token) and
            // report bodies in pieces.
            .input_buffer_size(INPUT_BUFFER)
            .output_buffer_size(OUTPUT_BUFFER)
            .max_idle_connections(2)
            .max_idle_connections_per_host(1)
            .max_idle_age(Duration::from_secs(90))
            .proxy(ureq::Proxy::try_from_env())
            .build()
            .into();
        let (credentialed, token_scheme, private_token) = match cfg.kind {
            ServerKind::Static => (
                std::iter::once(&cfg.manifest_url)
                    .chain(&cfg.mirrors)
                    .chain(std::iter::once(&cfg.report_url))
                    .filter_map(|u| UrlOrigin::of(u))
                    .collect(),
                "Bearer",
                false,
            ),
            // The DDI server's origin only: artifact links to a CDN or any
            // other host get no credentials.
            ServerKind::Hawkbit => (
                UrlOrigin::of(&cfg.ddi_url).into_iter().collect(),
                cfg.ddi_auth.scheme().unwrap_or("Bearer"),
                true,
            ),
        };
        let token_file = match (cfg.kind, cfg.ddi_auth) {
            (ServerKind::Hawkbit, DdiAuth::None) => None,
            _ => cfg.token_file.clone(),
        };
        Ok(Fetcher {
            agent,
            allow_http: cfg.insecure_allow_http,
            token_file,
            token_scheme,
            private_token,
            credentialed: Arc::new(credentialed),
            min_rate: cfg.min_rate,
            min_rate_window: cfg.min_rate_window.0,
            max_rate: config.policy.max_rate,
            window_rate: config
                .policy
                .window_rate
                .map(|r| (r, Arc::new(config.policy.windows.clone()))),
            counters: Arc::new(Counters::default()),
        })
    }

    /// The cap for an artifact body opened now: `policy.window_rate` inside
    /// a maintenance window, else `policy.max_rate`. A body keeps the rate
    /// it was opened with; a download resumed later is capped anew.
    fn artifact_rate(&self) -> Option<u64> {
        if let Some((rate, windows)) = &self.window_rate {
            let now = crate::timestamp::Timestamp::now();
            let open = windows
                .current_or_next(now, &crate::window::Local)
                .is_some_and(|s| s.opens <= now);
            if open {
                return Some(*rate);
            }
        }
        self.max_rate
    }

    fn check_scheme(&self, url: &str) -> Result<()> {
        if url.starts_with("https://") || (self.allow_http && url.starts_with("http://")) {
            Ok(())
        } else if url.starts_with("http://") {
            bail!(
                Policy,
                "refusing plain http URL {} (set server.insecure_allow_http for development)",
                truncate(url, 200)
            )
        } else {
            bail!(Policy, "unsupported URL {}", truncate(url, 200))
        }
    }

    fn token(&self) -> Result<Option<String>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        if self.private_token {
            use std::os::unix::fs::MetadataExt;
            let md = std::fs::metadata(path).map_err(|e| self.unreadable_token(path, &e))?;
            if md.mode() & 0o077 != 0 {
                bail!(
                    Config,
                    "server.token_file {} has mode {:04o}: a device token must be readable by its owner only (chmod 600)",
                    path.display(),
                    md.mode() & 0o7777
                );
            }
        }
        let t = std::fs::read_to_string(path).map_err(|e| self.unreadable_token(path, &e))?;
        let t = t.trim();
        if t.is_empty() || t.chars().any(|c| c.is_control()) {
            bail!(
                Config,
                "server.token_file {} does not hold a single-line token",
                path.display()
            );
        }
        Ok(Some(t.to_string()))
    }

    /// The token file cannot be read. A DDI device without one usually
    /// talks to a server that asks for no authentication, and `ddi_auth`
    /// defaults to sending one: say how to turn it off.
    fn unreadable_token(&self, path: &std::path::Path, e: &io::Error) -> Error {
        let hint = if self.private_token && e.kind() == io::ErrorKind::NotFound {
            format!(
                " (server.ddi_auth sends the header \"Authorization: {} <token>\" with the token \
                 the server issued for this device: put it in that file, mode 0600; for a server \
                 that asks for no authentication, set server.ddi_auth = \"none\")",
                self.token_scheme
            )
        } else {
            String::new()
        };
        err!(
            Config,
            "reading server.token_file {}: {e}{hint}",
            path.display()
        )
    }

    /// [`check_status`], with what a refusal (401, 403) means for the
    /// credentials this device sent, since "HTTP status 401" alone leaves
    /// an operator guessing which of token, header and server is wrong.
    fn check_response(
        &self,
        method: &str,
        url: &str,
        status: u16,
        h: &ureq::http::HeaderMap,
    ) -> Result<()> {
        check_status(method, url, status, h).map_err(|e| match status {
            401 | 403 => err!(Network, "{e}: {}", self.refusal(url, status)),
            _ => e,
        })
    }

    /// Why a server may have refused this device with `status` at `url`.
    fn refusal(&self, url: &str, status: u16) -> String {
        let sent = self
            .token_file
            .as_ref()
            .filter(|_| UrlOrigin::of(url).is_some_and(|o| self.credentialed.contains(&o)));
        match (sent, status) {
            (Some(path), 401) => format!(
                "the server refused the token this device sent (\"Authorization: {} …\" from \
                 server.token_file {}): is it the one the server holds for this device, and is \
                 server.ddi_auth the kind of token it is (target_token or gateway_token)?",
                self.token_scheme,
                path.display()
            ),
            (Some(path), _) => format!(
                "the server knows the token from server.token_file {} but does not let it \
                 reach this resource (a gateway token of another tenant, a target not \
                 assigned to it, or a server rule)",
                path.display()
            ),
            (None, _) => "this device sent no credentials here: configure server.token_file \
                 (and server.ddi_auth for a DDI server) or server.client_cert, as the server \
                 requires"
                .to_string(),
        }
    }

    /// The bearer token, when one is configured and `url` is on one of the
    /// configured servers' origins.
    fn token_for(&self, url: &str) -> Result<Option<String>> {
        if self.token_file.is_none() {
            return Ok(None);
        }
        match UrlOrigin::of(url) {
            Some(o) if self.credentialed.contains(&o) => self.token(),
            _ => {
                log::debug!(
                    "not sending the bearer token to {}: not a configured server",
                    truncate(url, 200)
                );
                Ok(None)
            }
        }
    }

    /// GET `url` with `headers`, following at most [`MAX_REDIRECTS`]
    /// redirects. Every hop is checked like the first URL, a hop from https
    /// to plain http is refused whatever the configuration, and the token
    /// is sent to a hop only when it is on a configured origin. Returns
    /// the final URL with its response.
    fn get(
        &self,
        url: &str,
        headers: &[(&str, String)],
    ) -> Result<(String, ureq::http::Response<ureq::Body>)> {
        let mut current = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            self.check_scheme(&current)?;
            let mut r = self.agent.get(&current);
            if let Some(t) = self.token_for(&current)? {
                r = r.header("Authorization", format!("{} {t}", self.token_scheme));
            }
            for (k, v) in headers {
                r = r.header(*k, v);
            }
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let resp = r.call().map_err(|e| net_error("GET", &current, e))?;
            let status = resp.status().as_u16();
            if !matches!(status, 301 | 302 | 303 | 307 | 308) {
                return Ok((current, resp));
            }
            let Some(location) = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
            else {
                bail!(
                    Network,
                    "GET {}: redirect ({status}) without a usable Location",
                    truncate(&current, 200)
                );
            };
            let next = redirect_target(&current, location.trim());
            if current.starts_with("https://") && !next.starts_with("https://") {
                bail!(
                    Policy,
                    "GET {}: refusing a redirect from https to {} (never allowed, server.insecure_allow_http or not)",
                    truncate(&current, 200),
                    truncate(&next, 200)
                );
            }
            log::debug!(
                "GET {}: redirected ({status}) to {}",
                truncate(&current, 200),
                truncate(&next, 200)
            );
            current = next;
        }
        bail!(
            Network,
            "GET {}: more than {MAX_REDIRECTS} redirects",
            truncate(url, 200)
        )
    }

    /// GET a small resource (manifest, key document) of at most `cap` bytes,
    /// conditionally when `etag` is given.
    pub fn get_small(&self, url: &str, cap: u64, etag: Option<&str>) -> Result<Fetched> {
        let headers: Vec<(&str, String)> = etag
            .map(|tag| ("If-None-Match", tag.to_string()))
            .into_iter()
            .collect();
        let (url, resp) = self.get(url, &headers)?;
        let url = url.as_str();
        let status = resp.status().as_u16();
        if status == 304 {
            return Ok(Fetched::NotModified);
        }
        self.check_response("GET", url, status, resp.headers())?;
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(len) = content_length(resp.headers()) {
            if len > cap {
                bail!(
                    Malformed,
                    "GET {}: server announces {len} bytes, more than the {cap}-byte limit",
                    truncate(url, 200)
                );
            }
        }
        let mut body = resp.into_body();
        let mut reader = body.as_reader();
        let mut bytes = Vec::new();
        let mut limited = (&mut reader).take(cap + 1);
        let mut guard = RateGuard::new(self.min_rate, self.min_rate_window);
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = limited.read(&mut buf).map_err(|e| io_net_error(url, e))?;
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..n]);
            guard
                .add(n as u64)
                .map_err(|e| e.wrap(format!("GET {}", truncate(url, 200))))?;
        }
        if bytes.len() as u64 > cap {
            bail!(
                Malformed,
                "GET {}: body exceeds the {cap}-byte limit",
                truncate(url, 200)
            );
        }
        self.counters
            .body_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(Fetched::Body { bytes, etag })
    }

    /// Open a download of `len` bytes starting at `offset` of a resource
    /// whose signed total size is `total`. Uses a Range request when
    /// `offset > 0`. The returned reader yields exactly `len` bytes or fails.
    pub fn open(&self, url: &str, offset: u64, total: u64) -> Result<Download> {
        if offset > total {
            bail!(
                Integrity,
                "resume offset {offset} is past the signed size {total}"
            );
        }
        let headers: Vec<(&str, String)> = if offset > 0 {
            vec![("Range", format!("bytes={offset}-"))]
        } else {
            Vec::new()
        };
        let (url, resp) = self.get(url, &headers)?;
        let url = url.as_str();
        let status = resp.status().as_u16();
        self.check_response("GET", url, status, resp.headers())?;
        let want = total - offset;
        let mut skip = 0;
        match (offset, status) {
            (0, 200) => {}
            (_, 206) => {
                let start = content_range_start(resp.headers()).ok_or_else(|| {
                    err!(
                        Network,
                        "GET {}: 206 without a usable Content-Range",
                        truncate(url, 200)
                    )
                })?;
                if start != offset {
                    bail!(
                        Network,
                        "GET {}: asked for bytes from {offset}, server sent from {start}",
                        truncate(url, 200)
                    );
                }
            }
            (_, 200) => {
                // The server ignored Range: read and discard up to the offset.
                log::warn!(
                    "{} ignores Range requests: re-reading {offset} bytes to resume",
                    truncate(url, 200)
                );
                skip = offset;
            }
            (_, s) => bail!(Network, "GET {}: unexpected status {s}", truncate(url, 200)),
        }
        if let Some(len) = content_length(resp.headers()) {
            let expect = want + skip;
            if len > expect {
                bail!(
                    Integrity,
                    "GET {}: server announces {len} bytes, but the signed size leaves {expect}: refusing (artifact longer than signed)",
                    truncate(url, 200)
                );
            }
            if len < expect {
                bail!(
                    Integrity,
                    "GET {}: server announces {len} bytes, but the signed size needs {expect} (artifact shorter than signed)",
                    truncate(url, 200)
                );
            }
        }
        let mut dl = self.download(url, resp, want);
        if skip > 0 {
            let mut sink = io::sink();
            let copied = io::copy(&mut (&mut dl.reader).take(skip), &mut sink)
                .map_err(|e| io_net_error(url, e))?;
            if copied < skip {
                bail!(
                    Network,
                    "GET {}: body ended while skipping to the resume offset",
                    truncate(url, 200)
                );
            }
        }
        Ok(dl)
    }

    /// Open a resource whose exact size is not signed, only a bound (an
    /// app's blob: its decoded size and hash are, its compressed size is
    /// at most `cap`). The server must announce its length, and that
    /// length must be within `cap`; the reader yields exactly that.
    pub fn open_capped(&self, url: &str, cap: u64) -> Result<Download> {
        let (url, resp) = self.get(url, &[])?;
        let url = url.as_str();
        let status = resp.status().as_u16();
        self.check_response("GET", url, status, resp.headers())?;
        if status != 200 {
            bail!(
                Network,
                "GET {}: unexpected status {status}",
                truncate(url, 200)
            );
        }
        let len = match content_length(resp.headers()) {
            Some(len) if len <= cap => len,
            Some(len) => bail!(
                Integrity,
                "GET {}: server announces {len} bytes, more than the {cap} bytes the signed size allows",
                truncate(url, 200)
            ),
            None => bail!(
                Network,
                "GET {}: no Content-Length, which an app blob needs",
                truncate(url, 200)
            ),
        };
        Ok(self.download(url, resp, len))
    }

    /// The reader of a response body of `remaining` bytes: rate-checked,
    /// capped by the bandwidth limit, counted.
    fn download(
        &self,
        url: &str,
        resp: ureq::http::Response<ureq::Body>,
        remaining: u64,
    ) -> Download {
        Download {
            url: truncate(url, 200).to_string(),
            reader: resp.into_body().into_reader(),
            remaining,
            guard: RateGuard::new(self.min_rate, self.min_rate_window),
            throttle: self
                .artifact_rate()
                .map(|r| Throttle::new(r, Instant::now())),
            counters: self.counters.clone(),
            received: 0,
        }
    }

    /// POST a JSON body with an idempotency key; returns the status.
    pub fn post_json(&self, url: &str, idempotency_key: &str, body: &[u8]) -> Result<u16> {
        let status = self.send_json("POST", url, Some(idempotency_key), body)?;
        if !(200..300).contains(&status) {
            bail!(Network, "POST {}: HTTP status {status}", truncate(url, 200));
        }
        Ok(status)
    }

    /// Send a JSON body with `method` (`POST` or `PUT`), with the token
    /// when `url` is on a configured origin, never redirected. Returns the
    /// status of a 2xx or 4xx answer, which the caller judges (a DDI server
    /// answers 410 for feedback to an action that is no longer active);
    /// 429, 5xx, 3xx and network failures are errors, with the server's
    /// `Retry-After` when it gave one.
    pub fn send_json(
        &self,
        method: &str,
        url: &str,
        idempotency_key: Option<&str>,
        body: &[u8],
    ) -> Result<u16> {
        self.check_scheme(url)?;
        let mut r = match method {
            "POST" => self.agent.post(url),
            "PUT" => self.agent.put(url),
            other => bail!(Usage, "send_json: unsupported method {other}"),
        }
        .header("Content-Type", "application/json");
        if let Some(key) = idempotency_key {
            r = r.header("Idempotency-Key", key);
        }
        if let Some(t) = self.token_for(url)? {
            r = r.header("Authorization", format!("{} {t}", self.token_scheme));
        }
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        // Not redirected: a 3xx is reported like any other failure.
        let resp = r.send(body).map_err(|e| net_error(method, url, e))?;
        let status = resp.status().as_u16();
        if !(400..500).contains(&status) || status == 429 {
            self.check_response(method, url, status, resp.headers())?;
        }
        // Drain a small body so the connection can be reused.
        let mut body = resp.into_body();
        let _ = io::copy(&mut body.as_reader().take(64 * 1024), &mut io::sink());
        Ok(status)
    }
}

fn content_length(h: &ureq::http::HeaderMap) -> Option<u64> {
    h.get("content-length")?.to_str().ok()?.trim().parse().ok()
}

fn content_range_start(h: &ureq::http::HeaderMap) -> Option<u64> {
    // "bytes START-END/TOTAL"
    let v = h.get("content-range")?.to_str().ok()?;
    let rest = v.trim().strip_prefix("bytes ")?;
    rest.split('-').next()?.trim().parse().ok()
}

/// `Retry-After` as seconds (HTTP dates are treated as a minute).
fn retry_after(h: &ureq::http::HeaderMap) -> Option<Duration> {
    let v = h.get("retry-after")?.to_str().ok()?.trim().to_string();
    match v.parse::<u64>() {
        Ok(s) => Some(Duration::from_secs(s.min(24 * 3600))),
        Err(_) => Some(Duration::from_secs(60)),
    }
}

fn check_status(method: &str, url: &str, status: u16, h: &ureq::http::HeaderMap) -> Result<()> {
    match status {
        200..=299 => Ok(()),
        429 | 503 => {
            let mut e = err!(
                Network,
                "{method} {}: server busy ({status})",
                truncate(url, 200)
            );
            if let Some(d) = retry_after(h) {
                e = err!(
                    Network,
                    "{method} {}: server busy ({status}), asked to retry after {}s",
                    truncate(url, 200),
                    d.as_secs()
                )
                .with_retry_after(d);
            }
            Err(e)
        }
        _ => Err(err!(
            Network,
            "{method} {}: HTTP status {status}",
            truncate(url, 200)
        )),
    }
}

fn net_error(method: &str, url: &str, e: ureq::Error) -> Error {
    let kind = match &e {
        ureq::Error::RequireHttpsOnly(_) => Kind::Policy,
        _ => Kind::Network,
    };
    Error::new(kind, format!("{method} {}: {e}", truncate(url, 200)))
}

fn io_net_error(url: &str, e: io::Error) -> Error {
    // Our own rate-floor errors travel through io::Error; keep their text.
    Error::new(Kind::Network, format!("GET {}: {e}", truncate(url, 200)))
}

/// Slow-retrieval floor over a sliding window.
struct RateGuard {
    min_rate: u64,
    window: Duration,
    window_start: Instant,
    window_bytes: u64,
}

impl RateGuard {
    fn new(min_rate: u64, window: Duration) -> RateGuard {
        RateGuard {
            min_rate,
            window,
            window_start: Instant::now(),
            window_bytes: 0,
        }
    }

    fn add(&mut self, n: u64) -> Result<()> {
        self.window_bytes += n;
        let elapsed = self.window_start.elapsed();
        if self.min_rate > 0 && elapsed >= self.window {
            let floor = (self.min_rate as f64 * elapsed.as_secs_f64()) as u64;
            if self.window_bytes < floor {
                bail!(
                    Network,
                    "transfer too slow: {} bytes in {:.0} s, under the floor of {} bytes/s (slow retrieval)",
                    self.window_bytes,
                    elapsed.as_secs_f64(),
                    self.min_rate
                );
            }
            self.window_start = Instant::now();
            self.window_bytes = 0;
        }
        Ok(())
    }
}

/// A capped, rate-checked body reader.
pub struct Download {
    url: String,
    reader: ureq::BodyReader<'static>,
    remaining: u64,
    guard: RateGuard,
    /// The bandwidth cap; the reader sleeps in `read` (it runs on a
    /// transfer thread).
    throttle: Option<Throttle>,
    counters: Arc<Counters>,
    received: u64,
}

impl Read for Download {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let mut want = (buf.len() as u64).min(self.remaining) as usize;
        if let Some(t) = &self.throttle {
            want = want.min(t.burst());
        }
        let n = self.reader.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: body ended {} bytes early (artifact shorter than signed, or the connection was cut)",
                    self.url, self.remaining
                ),
            ));
        }
        self.remaining -= n as u64;
        self.received += n as u64;
        self.counters
            .body_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        if let Some(t) = &mut self.throttle {
            let wait = t.take(n, Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        self.guard
            .add(n as u64)
            .map_err(|e| io::Error::new(io::ErrorKind::TimedOut, e.to_string()))?;
        Ok(n)
    }
}

/// Redirects followed for one GET.
const MAX_REDIRECTS: usize = 5;

/// Scheme, host and port of a URL: where credentials may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlOrigin {
    scheme: String,
    host: String,
    port: u16,
}

impl UrlOrigin {
    /// The origin of an absolute http(s) URL; `None` for anything else.
    /// The host is compared without case, a missing port is the scheme's.
    pub fn of(url: &str) -> Option<UrlOrigin> {
        let uri: ureq::http::Uri = url.parse().ok()?;
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default = match scheme.as_str() {
            "https" => 443,
            "http" => 80,
            _ => return None,
        };
        let host = uri.host()?.to_ascii_lowercase();
        if host.is_empty() {
            return None;
        }
        Some(UrlOrigin {
            scheme,
            host,
            port: uri.port_u16().unwrap_or(default),
        })
    }
}

/// Where a `Location` header sends a request for `base`: absolute URLs as
/// they are, `//host/…` with the base's scheme, `/path` on the base's
/// origin, anything else beside the base's file.
fn redirect_target(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    if let Some(rest) = location.strip_prefix("//") {
        return format!("{}{rest}", &base[..scheme_end]);
    }
    let path_start = base[scheme_end..]
        .find('/')
        .map(|i| i + scheme_end)
        .unwrap_or(base.len());
    if location.starts_with('/') {
        return format!("{}{location}", &base[..path_start]);
    }
    let without_query = base.split(['?', '#']).next().unwrap_or(base);
    let (dir, _) = split_url(without_query);
    format!("{dir}{location}")
}

/// Join a relative reference to a base URL ending in `/`. Absolute URLs
/// are returned as they are.
pub fn join(base: &str, rel: &str) -> String {
    if rel.contains("://") {
        return rel.to_string();
    }
    let mut s = base.to_string();
    if !s.ends_with('/') {
        s.push('/');
    }
    s.push_str(rel.trim_start_matches('/'));
    s
}

/// The directory part of a URL (up to and including the last `/` of the
/// path), and the file name after it.
pub fn split_url(url: &str) -> (String, String) {
    let path_start = url.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = url[path_start..]
        .find('/')
        .map(|i| i + path_start)
        .unwrap_or(url.len());
    match url[path_start..].rfind('/') {
        Some(i) => {
            let cut = path_start + i + 1;
            (url[..cut].to_string(), url[cut..].to_string())
        }
        None => (format!("{url}/"), String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_joining() {
        assert_eq!(
            join("https://h/a/", "artifacts/x.zst"),
            "https://h/a/artifacts/x.zst"
        );
        assert_eq!(join("https://h/a", "x"), "https://h/a/x");
        assert_eq!(join("https://h/a/", "https://cdn/x"), "https://cdn/x");
        assert_eq!(
            split_url("https://h:8443/stable/manifest.json"),
            (
                "https://h:8443/stable/".to_string(),
                "manifest.json".to_string()
            )
        );
        assert_eq!(
            split_url("https://h"),
            ("https://h/".to_string(), String::new())
        );
    }

    #[test]
    fn origins_are_scheme_host_and_port() {
        let o = |u: &str| UrlOrigin::of(u);
        assert_eq!(
            o("https://Updates.Example:443/m.json"),
            o("https://updates.example/x")
        );
        assert_ne!(o("https://updates.example/"), o("http://updates.example/"));
        assert_ne!(
            o("https://updates.example/"),
            o("https://updates.example:8443/")
        );
        assert_ne!(
            o("https://updates.example/"),
            o("https://updates.example.evil/")
        );
        assert_ne!(
            o("https://updates.example/"),
            o("https://evil/@updates.example/")
        );
        assert_eq!(
            o("https://user@updates.example/"),
            o("https://updates.example/")
        );
        assert!(o("").is_none());
        assert!(o("file:///x").is_none());
        assert!(o("relative/path").is_none());
        assert_eq!(o("https://[::1]:8443/a"), o("https://[::1]:8443/b"));
    }

    #[test]
    fn redirect_targets() {
        let b = "https://h:8443/stable/manifest.json?x=1";
        assert_eq!(redirect_target(b, "https://cdn/a"), "https://cdn/a");
        assert_eq!(redirect_target(b, "//cdn/a"), "https://cdn/a");
        assert_eq!(
            redirect_target(b, "/other/m.json"),
            "https://h:8443/other/m.json"
        );
        assert_eq!(
            redirect_target(b, "m2.json"),
            "https://h:8443/stable/m2.json"
        );
        assert_eq!(redirect_target("https://h", "/a"), "https://h/a");
    }

    #[test]
    fn rate_guard_trips_only_below_the_floor() {
        let mut g = RateGuard::new(1000, Duration::from_millis(0));
        assert!(g.add(10_000_000).is_ok());
        let mut g = RateGuard::new(u64::MAX / 4, Duration::from_millis(0));
        std::thread::sleep(Duration::from_millis(5));
        let e = g.add(1).unwrap_err();
        assert!(e.to_string().contains("slow retrieval"), "{e}");
    }
}
