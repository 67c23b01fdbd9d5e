//! A real gooseBit: the hawkBit DDI server the DDI client mode is tested
//! against, one fresh instance per test.
//!
//! gooseBit (the PyPI package `goosebit`, pinned in
//! `tests/prerequisites.txt`) lives in the tests' Python venv
//! ([`crate::prereq::venv_dir`], made by `cargo xtask test`). [`GooseBit::start`]
//! gives it a directory of its own (settings file, SQLite database, artifact
//! storage, TLS files, log), creates its tables with `aerich upgrade`, and
//! runs it with uvicorn over TLS on a loopback port bound here and handed
//! over as an inherited socket (no port is guessed), with a server
//! certificate from the test's [`TestCa`]. Its links are then
//! `https://127.0.0.1:PORT/...`: gooseBit builds them from the scheme of the
//! connection and the request's `Host`, and uvicorn runs with proxy headers
//! off, so no client header can change them. An admin is made through
//! `POST /setup`; [`GooseBit`] is then a small typed client of the
//! management API (`/api/v1/...`, bearer token) for what the tests need:
//! software, device assignment, rollouts, device state and logs.
//!
//! gooseBit's settings come from a generated `goosebit.yaml` named by
//! `GOOSEBIT_SETTINGS` (so `/etc/goosebit.yaml` and any `goosebit.yaml`
//! elsewhere are never read), and inherited `GOOSEBIT_*` variables are
//! removed. Its log (gooseBit's and uvicorn's, one request a line) is
//! `goosebit.log` in its directory; the directory is removed on drop, and
//! kept with the log's tail printed when the test panics.
//!
//! This module must never signal a process it did not start: the server
//! is stopped by its PID (SIGTERM, then SIGKILL), and told by
//! PR_SET_PDEATHSIG to stop if the test process dies. It never mocks
//! gooseBit's behaviour; what gooseBit does is pinned by
//! `tests/tests/goosebit_server.rs`.

use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::ca::TestCa;
use crate::prereq;

/// The tenant gooseBit serves the DDI API under (its default): the
/// controller of device `ID` is `https://HOST/DEFAULT/controller/v1/ID`.
pub const TENANT: &str = "DEFAULT";

/// The oldest Python gooseBit runs on.
pub const MIN_PYTHON: (u32, u32) = (3, 11);

/// The admin [`GooseBit::start`] sets up.
pub const ADMIN_USER: &str = "admin@updraft.test";
const ADMIN_PASSWORD: &str = "updraft-test-admin";

/// The commands of the venv gooseBit needs.
pub const COMMANDS: [&str; 2] = ["venv:uvicorn", "venv:aerich"];

/// How long [`GooseBitBuilder::start`] waits for gooseBit to answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a stop waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one management request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The venv's python runs this: uvicorn serving `goosebit:app` over TLS on
/// the listening socket inherited as descriptor 3, proxy headers off.
const LAUNCHER: &str = r#"
import socket, sys
import uvicorn
sock = socket.socket(fileno=3)
config = uvicorn.Config(
    "goosebit:app",
    ssl_certfile=sys.argv[1],
    ssl_keyfile=sys.argv[2],
    proxy_headers=False,
    timeout_graceful_shutdown=1,
)
uvicorn.Server(config).run(sockets=[sock])
"#;

/// Why gooseBit cannot run here, or `None` when it can: the venv lacks
/// the pinned gooseBit (and why: no or too old a Python, or not yet
/// installed).
pub fn unavailable() -> Option<String> {
    let why = prereq::unavailable(&COMMANDS)?;
    let (want_major, want_minor) = MIN_PYTHON;
    Some(match python3_version() {
        None => format!(
            "{why}; python3 is not installed (gooseBit needs Python ≥ {want_major}.{want_minor})"
        ),
        Some((major, minor)) if (major, minor) < MIN_PYTHON => format!(
            "{why}; gooseBit needs Python ≥ {want_major}.{want_minor} and python3 here is {major}.{minor}"
        ),
        Some(_) => format!("{why}; `cargo xtask test` as root installs it"),
    })
}

/// `(major, minor)` of `python3` on `PATH`.
pub fn python3_version() -> Option<(u32, u32)> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys; print(sys.version_info[0], sys.version_info[1])",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|w| w.parse::<u32>().ok());
    Some((it.next()??, it.next()??))
}

/// The gooseBit version the prerequisites pin (`0.2.12`).
pub fn pinned_version() -> Option<String> {
    prereq::package_of(COMMANDS[0]).and_then(|p| p.pin().map(|(_, v)| v.to_string()))
}

/// Skip the current test unless gooseBit can run here, saying why
/// (the venv is missing, or Python is older than [`MIN_PYTHON`]).
#[macro_export]
macro_rules! require_goosebit {
    () => {{
        if let Some(why) = $crate::goosebit::unavailable() {
            $crate::skip!("{why}");
        }
    }};
}

/// gooseBit's `device_auth` setting: how a device's `TargetToken` is
/// checked on every DDI request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceAuth {
    /// `enable: false` (gooseBit's default): the `Authorization` header
    /// is ignored.
    Off,
    /// `setup`: a device polling with a `TargetToken` has it recorded as
    /// its token; any request is let through.
    Setup,
    /// `strict`: every request needs `Authorization: TargetToken T`, the
    /// device must exist and `T` must equal its token, both set through
    /// the management API ([`DevicePatch::auth_token`]).
    Strict,
    /// `lax`: devices are registered on first contact; the token sent (or
    /// its absence) must equal the device's token (none until one is set).
    Lax,
}

impl DeviceAuth {
    fn setting(self) -> Value {
        match self {
            DeviceAuth::Off => json!({ "enable": false }),
            DeviceAuth::Setup => json!({ "enable": true, "mode": "setup" }),
            DeviceAuth::Strict => json!({ "enable": true, "mode": "strict" }),
            DeviceAuth::Lax => json!({ "enable": true, "mode": "lax" }),
        }
    }
}

/// Configuration of a test gooseBit; see [`GooseBit::builder`].
pub struct GooseBitBuilder<'a> {
    ca: &'a TestCa,
    device_auth: DeviceAuth,
    poll_time: String,
    dir: Option<PathBuf>,
}

/// A running gooseBit with an admin logged in; stopped (by PID) on drop.
pub struct GooseBit {
    child: Option<Child>,
    dir: PathBuf,
    tempdir: Option<tempfile::TempDir>,
    addr: SocketAddr,
    ca_file: PathBuf,
    token: String,
    agent: ureq::Agent,
    startup: Duration,
    migrate: Duration,
}

/// A software id (`Software.id`): also the DDI action id under which
/// gooseBit offers it (`deploymentBase/{id}`).
pub type SoftwareId = u64;

/// A hardware model and revision, as gooseBit matches devices to software.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hardware {
    pub model: String,
    pub revision: String,
}

/// One software gooseBit stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Software {
    pub id: SoftwareId,
    /// `software.version` of the file's sw-description.
    pub version: String,
    /// The file's size in bytes.
    pub size: u64,
    /// The file's SHA-1, lower-case hex (the only hash gooseBit keeps).
    pub hash: String,
    /// The file name it was uploaded as.
    pub name: String,
    pub compatibility: Vec<Hardware>,
}

/// A device's `last_state` in gooseBit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateState {
    None,
    /// Seen, but it has not sent configData yet.
    Unknown,
    /// configData received; no action running.
    Registered,
    /// A `proceeding` feedback was received.
    Running,
    /// The last action was closed with `failure`.
    Error,
    /// The last action was closed with `success` (or `none`).
    Finished,
}

impl UpdateState {
    fn parse(s: &str) -> Option<UpdateState> {
        Some(match s {
            "None" => UpdateState::None,
            "Unknown" => UpdateState::Unknown,
            "Registered" => UpdateState::Registered,
            "Running" => UpdateState::Running,
            "Error" => UpdateState::Error,
            "Finished" => UpdateState::Finished,
            _ => return None,
        })
    }
}

/// A device as the management API lists it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub id: String,
    /// The installed version: configData's `sw_version` (every configData
    /// sets it, to `None` when it has none), or the version of the software
    /// whose action was closed with success. Software of this version is
    /// not offered (unless forced).
    pub sw_version: Option<String>,
    pub last_state: UpdateState,
    /// `Rollout` (the default), `Assigned`, `Latest`, `Pinned`.
    pub update_mode: String,
    /// 0 on `proceeding`, 100 on success, or the last `Downloaded N%` in
    /// feedback details.
    pub progress: Option<i64>,
    pub force_update: bool,
    pub feed: Option<String>,
    /// From configData's `hw_boardname` / `hw_revision`, each `default`
    /// when the last configData lacked it. An updraft bundle's
    /// `compatible` ids are revisions of model `default`.
    pub hardware: Option<Hardware>,
    /// The software gooseBit would offer the device now (assigned, from
    /// its rollout, or the latest), even when it is already installed.
    pub target_software: Option<SoftwareId>,
    pub auth_token: Option<String>,
    pub last_ip: Option<String>,
    /// The whole JSON object, for what the fields above leave out.
    pub json: Value,
}

/// A device's feedback log: the `details` lines of every feedback since
/// the action's first `proceeding`, one per line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLog {
    pub log: Option<String>,
    pub progress: Option<i64>,
}

/// A rollout: the software offered to every device of `feed` in rollout
/// mode (the newest unpaused rollout of the feed wins).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollout {
    pub id: u64,
    pub name: Option<String>,
    pub feed: String,
    pub software: SoftwareId,
    pub paused: bool,
    pub success_count: u64,
    pub failure_count: u64,
}

/// What to offer a device ([`DevicePatch::software`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// This software (update mode `Assigned`).
    Software(SoftwareId),
    /// Whatever the newest rollout of its feed names (mode `Rollout`).
    Rollout,
    /// The newest compatible software (mode `Latest`).
    Latest,
}

/// A change to devices (`PATCH`/`PUT /api/v1/devices`); `None` leaves a
/// field as it is.
#[derive(Clone, Debug, Default)]
pub struct DevicePatch {
    pub software: Option<Assignment>,
    pub name: Option<String>,
    /// `true`: pin the device (no updates).
    pub pinned: bool,
    pub feed: Option<String>,
    /// Offer the software again even after a failure or when installed.
    pub force_update: Option<bool>,
    /// The device's `TargetToken` (at most 32 characters).
    pub auth_token: Option<String>,
}

impl DevicePatch {
    fn body(&self, devices: &[&str]) -> Value {
        let mut b = json!({ "devices": devices });
        let software = self.software.map(|a| match a {
            Assignment::Software(id) => id.to_string(),
            Assignment::Rollout => "rollout".to_string(),
            Assignment::Latest => "latest".to_string(),
        });
        for (key, value) in [
            ("software", software.map(Value::from)),
            ("name", self.name.clone().map(Value::from)),
            ("pinned", self.pinned.then_some(Value::Bool(true))),
            ("feed", self.feed.clone().map(Value::from)),
            ("force_update", self.force_update.map(Value::from)),
            ("auth_token", self.auth_token.clone().map(Value::from)),
        ] {
            if let Some(v) = value {
                b[key] = v;
            }
        }
        b
    }
}

/// A management request gooseBit refused, or could not be asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status; `None` when no answer came.
    pub status: Option<u16>,
    /// gooseBit's `detail` text (or the body, or the transport error).
    pub detail: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(s) => write!(f, "gooseBit answered {s}: {}", self.detail),
            None => write!(f, "gooseBit did not answer: {}", self.detail),
        }
    }
}

impl std::error::Error for ApiError {}

/// A ureq agent trusting exactly `ca_pem`, with HTTP error statuses
/// returned as responses; for the management API and for tests' DDI
/// clients.
pub fn tls_agent(ca_pem: &str, timeout: Duration) -> io::Result<ureq::Agent> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(ca_pem.as_bytes()) {
        if let ureq::tls::PemItem::Certificate(c) =
            item.map_err(|e| io::Error::other(format!("reading the test CA PEM: {e}")))?
        {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(io::Error::other("no certificate in the test CA PEM"));
    }
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into())
}

impl GooseBit {
    /// A builder for a gooseBit whose certificate `ca` issues.
    pub fn builder(ca: &TestCa) -> GooseBitBuilder<'_> {
        GooseBitBuilder {
            ca,
            device_auth: DeviceAuth::Off,
            poll_time: "00:01:00".to_string(),
            dir: None,
        }
    }

    /// Start gooseBit with its defaults (no device auth, 1 min polling),
    /// its certificate issued by `ca`.
    pub fn start(ca: &TestCa) -> io::Result<GooseBit> {
        GooseBit::builder(ca).start()
    }

    /// `https://127.0.0.1:PORT`: the DDI base URL a device is given.
    pub fn base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// `https://127.0.0.1:PORT{path}`; `path` starts with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// The DDI controller base of device `id`:
    /// `https://127.0.0.1:PORT/DEFAULT/controller/v1/{id}`.
    pub fn controller_url(&self, id: &str) -> String {
        self.url(&format!("/{TENANT}/controller/v1/{id}"))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// PEM file of the CA that issued gooseBit's certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// gooseBit's directory: settings, database, artifacts, TLS files, log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// PID of the server process, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Time from spawning uvicorn to gooseBit's first answer.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Time `aerich upgrade` took to create the database.
    pub fn migrate_time(&self) -> Duration {
        self.migrate
    }

    /// The server's resident set size in KiB, from `/proc`.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The log so far: gooseBit's messages and uvicorn's request lines.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("goosebit.log")).unwrap_or_default()
    }

    /// The admin's bearer token (`Authorization: Bearer ...`).
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// Log in as the admin (`POST /login`, form fields) and return the
    /// access token.
    pub fn login(&self) -> Result<String, ApiError> {
        let resp = self
            .agent
            .post(self.url("/login"))
            .send_form([("username", ADMIN_USER), ("password", ADMIN_PASSWORD)]);
        token_of(answer(resp)?)
    }

    /// Upload a software file (`PUT /api/v1/software`, multipart field
    /// `file`). gooseBit parses it and refuses what it cannot: a file
    /// neither an SWUpdate-style cpio with `sw-description` first nor a
    /// RAUC bundle (`422 Software image header cannot be parsed`), or the
    /// same version for overlapping hardware again (`409`).
    pub fn upload_software(&self, path: &Path) -> Result<SoftwareId, ApiError> {
        let data = fs::read(path).map_err(|e| ApiError {
            status: None,
            detail: format!("reading {}: {e}", path.display()),
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "software".to_string());
        let (content_type, body) = multipart_file("file", &name, &data);
        let resp = self
            .agent
            .put(self.url("/api/v1/software"))
            .header("Authorization", &self.bearer())
            .header("Content-Type", &content_type)
            .send(&body[..]);
        let v = answer(resp)?;
        v["id"]
            .as_u64()
            .ok_or_else(|| unexpected("software upload", &v))
    }

    /// Every software gooseBit stores (`GET /api/v1/software`).
    pub fn software(&self) -> Result<Vec<Software>, ApiError> {
        let v = self.get("/api/v1/software")?;
        v["software"]
            .as_array()
            .ok_or_else(|| unexpected("software list", &v))?
            .iter()
            .map(|s| parse_software(s).ok_or_else(|| unexpected("software", s)))
            .collect()
    }

    /// Offer `software` to `device` (`PATCH /api/v1/devices`, update mode
    /// `Assigned`). The device must exist (it does once it has polled)
    /// and its hardware must be in the software's compatibility.
    pub fn assign(&self, device: &str, software: SoftwareId) -> Result<(), ApiError> {
        self.patch_devices(
            &[device],
            &DevicePatch {
                software: Some(Assignment::Software(software)),
                ..DevicePatch::default()
            },
        )
    }

    /// `PATCH /api/v1/devices`: change devices that exist.
    pub fn patch_devices(&self, devices: &[&str], patch: &DevicePatch) -> Result<(), ApiError> {
        self.send_json("PATCH", "/api/v1/devices", &patch.body(devices))
            .map(drop)
    }

    /// `PUT /api/v1/devices`: as [`GooseBit::patch_devices`], registering
    /// devices gooseBit has not seen (how a device's `TargetToken` is set
    /// before its first poll, for [`DeviceAuth::Strict`]).
    pub fn put_devices(&self, devices: &[&str], patch: &DevicePatch) -> Result<(), ApiError> {
        self.send_json("PUT", "/api/v1/devices", &patch.body(devices))
            .map(drop)
    }

    /// Create a rollout of `software` to the devices of `feed` in rollout
    /// mode (`PUT /api/v1/rollouts`); it is active at once.
    pub fn create_rollout(
        &self,
        name: &str,
        feed: &str,
        software: SoftwareId,
    ) -> Result<u64, ApiError> {
        let v = self.send_json(
            "PUT",
            "/api/v1/rollouts",
            &json!({ "name": name, "feed": feed, "software_id": software }),
        )?;
        v["id"].as_u64().ok_or_else(|| unexpected("rollout", &v))
    }

    /// Pause or resume rollouts (`PATCH /api/v1/rollouts`).
    pub fn pause_rollouts(&self, ids: &[u64], paused: bool) -> Result<(), ApiError> {
        self.send_json(
            "PATCH",
            "/api/v1/rollouts",
            &json!({ "ids": ids, "paused": paused }),
        )
        .map(drop)
    }

    /// Every rollout (`GET /api/v1/rollouts`).
    pub fn rollouts(&self) -> Result<Vec<Rollout>, ApiError> {
        let v = self.get("/api/v1/rollouts")?;
        v["rollouts"]
            .as_array()
            .ok_or_else(|| unexpected("rollout list", &v))?
            .iter()
            .map(|r| parse_rollout(r).ok_or_else(|| unexpected("rollout", r)))
            .collect()
    }

    /// Every device (`GET /api/v1/devices`).
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, ApiError> {
        let v = self.get("/api/v1/devices")?;
        v["devices"]
            .as_array()
            .ok_or_else(|| unexpected("device list", &v))?
            .iter()
            .map(|d| parse_device(d).ok_or_else(|| unexpected("device", d)))
            .collect()
    }

    /// Device `id`, `None` when gooseBit does not know it. Read from the
    /// device list: gooseBit 0.2.12's `GET /api/v1/devices/{id}` answers
    /// `500` once software is assigned.
    pub fn device(&self, id: &str) -> Result<Option<DeviceInfo>, ApiError> {
        Ok(self.devices()?.into_iter().find(|d| d.id == id))
    }

    /// Device `id`'s feedback log (`GET /api/v1/devices/{id}/log`). Note
    /// that gooseBit registers a device it does not know on this request.
    pub fn device_log(&self, id: &str) -> Result<DeviceLog, ApiError> {
        let v = self.get(&format!("/api/v1/devices/{id}/log"))?;
        Ok(DeviceLog {
            log: v["log"].as_str().map(str::to_string),
            progress: v["progress"].as_i64(),
        })
    }

    /// Stop gooseBit now (SIGTERM to its PID, SIGKILL after a timeout) and
    /// return its exit status. Dropping does the same.
    pub fn stop(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.child.take() {
            Some(child) => stop_child(child).map(Some),
            None => Ok(None),
        }
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    fn get(&self, path: &str) -> Result<Value, ApiError> {
        let resp = self
            .agent
            .get(self.url(path))
            .header("Authorization", &self.bearer())
            .call();
        answer(resp)
    }

    fn send_json(&self, method: &str, path: &str, body: &Value) -> Result<Value, ApiError> {
        let url = self.url(path);
        let body = body.to_string();
        let resp = match method {
            "PUT" => self.agent.put(url),
            "PATCH" => self.agent.patch(url),
            _ => self.agent.post(url),
        }
        .header("Authorization", &self.bearer())
        .header("Content-Type", "application/json")
        .send(body.as_bytes());
        answer(resp)
    }
}

impl Drop for GooseBit {
    fn drop(&mut self) {
        let rss = self.rss_kib();
        if let Err(e) = self.stop() {
            eprintln!("stopping gooseBit in {}: {e}", self.dir.display());
        }
        if thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "--- gooseBit log (last {} lines; all in {}/goosebit.log, RSS was {} KiB) ---",
                tail.len(),
                self.dir.display(),
                rss.map_or("?".to_string(), |r| r.to_string()),
            );
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
            eprintln!("--- end of gooseBit log ---");
            if let Some(t) = self.tempdir.take() {
                let _ = t.keep();
            }
        }
    }
}

impl<'a> GooseBitBuilder<'a> {
    /// gooseBit's `device_auth` setting (default [`DeviceAuth::Off`]).
    pub fn device_auth(mut self, auth: DeviceAuth) -> Self {
        self.device_auth = auth;
        self
    }

    /// `poll_time` (`HH:MM:SS`): the `config.polling.sleep` gooseBit sends
    /// registered devices (default `00:01:00`).
    pub fn poll_time(mut self, hms: &str) -> Self {
        self.poll_time = hms.to_string();
        self
    }

    /// Keep gooseBit's files in `dir` (created if missing) instead of a
    /// temporary directory removed on drop.
    pub fn in_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Create the database, start gooseBit, wait until it answers, set up
    /// the admin. Errors carry gooseBit's log.
    pub fn start(self) -> io::Result<GooseBit> {
        if let Some(why) = unavailable() {
            return Err(io::Error::new(io::ErrorKind::NotFound, why));
        }
        let (dir, tempdir) = match &self.dir {
            Some(d) => {
                fs::create_dir_all(d).map_err(|e| ctx(e, &format!("creating {}", d.display())))?;
                (d.clone(), None)
            }
            None => {
                let base = std::env::var_os("UPDRAFT_TEST_TMP")
                    .map(PathBuf::from)
                    .unwrap_or_else(std::env::temp_dir);
                let t = tempfile::Builder::new()
                    .prefix("updraft-goosebit-")
                    .tempdir_in(&base)
                    .map_err(|e| {
                        ctx(
                            e,
                            &format!("making a gooseBit directory in {}", base.display()),
                        )
                    })?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let dir = dir
            .canonicalize()
            .map_err(|e| ctx(e, &format!("resolving {}", dir.display())))?;
        let tls_dir = dir.join("tls");
        fs::create_dir_all(&tls_dir)
            .map_err(|e| ctx(e, &format!("creating {}", tls_dir.display())))?;
        let tls = self.ca.write_server_files(&tls_dir, "server")?;

        let settings = dir.join("goosebit.yaml");
        let settings_json = self.settings(&dir);
        // JSON is YAML: pydantic-settings reads this file as YAML.
        fs::write(&settings, format!("{settings_json:#}\n"))
            .map_err(|e| ctx(e, &format!("writing {}", settings.display())))?;
        let pyproject = dir.join("pyproject.toml");
        fs::write(&pyproject, aerich_config()?)
            .map_err(|e| ctx(e, &format!("writing {}", pyproject.display())))?;

        let log_path = dir.join("goosebit.log");
        let log = || {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|e| ctx(e, &format!("opening {}", log_path.display())))
        };

        // The tables: `aerich upgrade` runs gooseBit's migrations.
        let migrate_started = Instant::now();
        let mut aerich = Command::new(prereq::venv_dir().join("bin/aerich"));
        aerich
            .args(["-c", "pyproject.toml", "upgrade"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log()?)
            .stderr(log()?);
        environment(&mut aerich, &settings);
        let status = aerich
            .status()
            .map_err(|e| ctx(e, "running aerich upgrade"))?;
        let migrate = migrate_started.elapsed();
        if !status.success() {
            return Err(io::Error::other(format!(
                "aerich upgrade in {} failed ({status}):\n{}",
                dir.display(),
                fs::read_to_string(&log_path).unwrap_or_default()
            )));
        }

        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| ctx(e, "binding a loopback port for gooseBit"))?;
        let addr = listener.local_addr()?;
        let fd = listener.as_raw_fd();
        let mut cmd = Command::new(prereq::venv_python());
        cmd.arg("-c")
            .arg(LAUNCHER)
            .arg(&tls.chain)
            .arg(&tls.key)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log()?)
            .stderr(log()?);
        environment(&mut cmd, &settings);
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe calls (dup2, fcntl, prctl, getppid).
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    if libc::fcntl(3, libc::F_SETFD, 0) == -1 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, 3) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::other(
                        "test process exited while starting gooseBit",
                    ));
                }
                Ok(())
            });
        }
        let started = Instant::now();
        let child = crate::nginx::spawn_from_keeper(cmd)
            .map_err(|e| ctx(e, "starting gooseBit (uvicorn)"))?;
        drop(listener);

        let agent = tls_agent(&self.ca.cert_pem(), REQUEST_TIMEOUT)?;
        let mut gb = GooseBit {
            child: Some(child),
            dir,
            tempdir,
            addr,
            ca_file: tls.ca_cert,
            token: String::new(),
            agent,
            startup: Duration::ZERO,
            migrate,
        };
        wait_ready(&mut gb)?;
        gb.startup = started.elapsed();
        gb.token = gb
            .setup_admin()
            .map_err(|e| gb.failed(format!("setting up the admin: {e}")))?;
        Ok(gb)
    }

    fn settings(&self, dir: &Path) -> Value {
        json!({
            "tenant": TENANT,
            "poll_time": self.poll_time,
            "device_auth": self.device_auth.setting(),
            "db_uri": format!("sqlite://{}", dir.join("db.sqlite3").display()),
            "artifacts_dir": dir.join("artifacts").display().to_string(),
            "storage": { "backend": "filesystem" },
            "plugins": [],
            "metrics": { "prometheus": { "enable": false } },
            "track_device_ip": true,
            // gooseBit's own logging, with uvicorn's loggers left enabled
            // (gooseBit's default turns them off, losing tracebacks) and
            // its request lines.
            "logging": {
                "version": 1,
                "disable_existing_loggers": false,
                "formatters": {
                    "simple": { "format": "%(asctime)s %(name)s %(levelname)s %(message)s" }
                },
                "handlers": {
                    "console": { "class": "logging.StreamHandler", "formatter": "simple" }
                },
                "loggers": {
                    "tortoise": { "level": "WARNING" },
                    "aiosqlite": { "level": "WARNING" },
                    "multipart": { "level": "INFO" },
                },
                "root": { "level": "INFO", "handlers": ["console"] },
            },
        })
    }
}

impl GooseBit {
    /// `POST /setup`: the first user, with every permission.
    fn setup_admin(&self) -> Result<String, ApiError> {
        let resp = self
            .agent
            .post(self.url("/setup"))
            .send_form([("username", ADMIN_USER), ("password", ADMIN_PASSWORD)]);
        token_of(answer(resp)?)
    }

    fn failed(&self, why: String) -> io::Error {
        io::Error::other(format!(
            "gooseBit in {} did not start: {why}\n--- goosebit.log ---\n{}",
            self.dir.display(),
            self.log()
        ))
    }
}

/// Settings come only from the file written for this instance.
fn environment(cmd: &mut Command, settings: &Path) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GOOSEBIT_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("GOOSEBIT_SETTINGS", settings)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME");
}

/// aerich's `pyproject.toml`: gooseBit's Tortoise config and the
/// migrations shipped in its package.
fn aerich_config() -> io::Result<String> {
    let out = Command::new(prereq::venv_python())
        .args([
            "-c",
            "import importlib.util; print(importlib.util.find_spec('goosebit').submodule_search_locations[0])",
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ctx(e, "asking the venv's python where gooseBit is"))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "finding the goosebit package in the venv: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let package = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let migrations = Path::new(&package).join("db").join("migrations");
    Ok(format!(
        "[tool.aerich]\ntortoise_orm = \"goosebit.db.config.TORTOISE_CONF\"\nlocation = {:?}\nsrc_folder = \".\"\n",
        migrations.display().to_string()
    ))
}

/// Wait until gooseBit answers an HTTP request over TLS, or exits.
fn wait_ready(gb: &mut GooseBit) -> io::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let probe = tls_agent(
        &fs::read_to_string(&gb.ca_file).map_err(|e| ctx(e, "reading the CA file"))?,
        Duration::from_secs(2),
    )?;
    let url = gb.url("/login");
    loop {
        if let Some(child) = gb.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                gb.child = None;
                return Err(gb.failed(format!("it exited with {status}")));
            }
        }
        match probe.get(&url).call() {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(gb.failed(format!("no answer within {START_TIMEOUT:?} (last: {e})")));
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// SIGTERM to our child's PID, wait, then SIGKILL.
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
        thread::sleep(Duration::from_millis(10));
    }
    child.kill()?;
    child.wait()
}

/// The JSON body of a 2xx answer, or the error with gooseBit's detail.
fn answer(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Value, ApiError> {
    let mut resp = resp.map_err(|e| ApiError {
        status: None,
        detail: e.to_string(),
    })?;
    let status = resp.status().as_u16();
    let mut text = String::new();
    resp.body_mut()
        .as_reader()
        .read_to_string(&mut text)
        .map_err(|e| ApiError {
            status: Some(status),
            detail: format!("reading the body: {e}"),
        })?;
    let json: Option<Value> = serde_json::from_str(&text).ok();
    if !(200..300).contains(&status) {
        let detail = json
            .as_ref()
            .and_then(|v| v["detail"].as_str().map(str::to_string))
            .unwrap_or(text);
        return Err(ApiError {
            status: Some(status),
            detail,
        });
    }
    json.ok_or_else(|| ApiError {
        status: Some(status),
        detail: format!("not JSON: {text:?}"),
    })
}

fn token_of(v: Value) -> Result<String, ApiError> {
    v["access_token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| unexpected("login", &v))
}

fn unexpected(what: &str, v: &Value) -> ApiError {
    ApiError {
        status: None,
        detail: format!("unexpected {what} JSON from gooseBit: {v}"),
    }
}

fn parse_hardware(v: &Value) -> Option<Hardware> {
    Some(Hardware {
        model: v["model"].as_str()?.to_string(),
        revision: v["revision"].as_str()?.to_string(),
    })
}

fn parse_software(v: &Value) -> Option<Software> {
    Some(Software {
        id: v["id"].as_u64()?,
        version: v["version"].as_str()?.to_string(),
        size: v["size"].as_u64()?,
        hash: v["hash"].as_str()?.to_string(),
        name: v["name"].as_str()?.to_string(),
        compatibility: v["compatibility"]
            .as_array()?
            .iter()
            .map(parse_hardware)
            .collect::<Option<_>>()?,
    })
}

fn parse_device(v: &Value) -> Option<DeviceInfo> {
    let text = |k: &str| v[k].as_str().map(str::to_string);
    Some(DeviceInfo {
        id: text("id")?,
        sw_version: text("sw_version"),
        last_state: UpdateState::parse(v["last_state"].as_str()?)?,
        update_mode: text("update_mode")?,
        progress: v["progress"].as_i64(),
        force_update: v["force_update"].as_bool()?,
        feed: text("feed"),
        hardware: parse_hardware(&v["hardware"]),
        target_software: v["assigned_software"]["id"].as_u64(),
        auth_token: text("auth_token"),
        last_ip: text("last_ip"),
        json: v.clone(),
    })
}

fn parse_rollout(v: &Value) -> Option<Rollout> {
    Some(Rollout {
        id: v["id"].as_u64()?,
        name: v["name"].as_str().map(str::to_string),
        feed: v["feed"].as_str()?.to_string(),
        software: v["software"]["id"].as_u64()?,
        paused: v["paused"].as_bool()?,
        success_count: v["success_count"].as_u64()?,
        failure_count: v["failure_count"].as_u64()?,
    })
}

/// A `multipart/form-data` body with one file field: `(content type,
/// body)`. The boundary is chosen so that it does not occur in `data`.
fn multipart_file(field: &str, filename: &str, data: &[u8]) -> (String, Vec<u8>) {
    let mut n: u64 = 0x7570_6472_6166_7421;
    let boundary = loop {
        let b = format!("updraft-goosebit-{n:016x}");
        if !data.windows(b.len()).any(|w| w == b.as_bytes()) {
            break b;
        }
        n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    };
    let safe: String = filename
        .chars()
        .map(|c| if c == '"' || c.is_control() { '_' } else { c })
        .collect();
    let mut body = Vec::with_capacity(data.len() + 256);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{safe}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_patch_sends_only_what_it_changes() {
        let p = DevicePatch {
            software: Some(Assignment::Software(7)),
            force_update: Some(true),
            ..DevicePatch::default()
        };
        assert_eq!(
            p.body(&["d1"]),
            json!({ "devices": ["d1"], "software": "7", "force_update": true })
        );
        let p = DevicePatch {
            software: Some(Assignment::Rollout),
            auth_token: Some("t".into()),
            pinned: true,
            ..DevicePatch::default()
        };
        assert_eq!(
            p.body(&["a", "b"]),
            json!({ "devices": ["a", "b"], "software": "rollout", "pinned": true, "auth_token": "t" })
        );
    }

    #[test]
    fn a_multipart_boundary_never_occurs_in_the_file() {
        let first = multipart_file("file", "x.bin", b"abc").0;
        let boundary = first.rsplit('=').next().unwrap().to_string();
        let (ct, body) = multipart_file("file", "a\"b.swu", boundary.as_bytes());
        let other = ct.rsplit('=').next().unwrap();
        assert_ne!(other, boundary);
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("filename=\"a_b.swu\""), "{text}");
        assert!(text.ends_with(&format!("\r\n--{other}--\r\n")), "{text}");
    }

    #[test]
    fn device_json_parses_into_its_fields() {
        // As gooseBit 0.2.12's GET /api/v1/devices lists a device.
        let v = json!({"id":"dev1","name":null,"sw_version":"1.2.3","assigned_software":{"id":1,"size":5412,"hash":"6596c0fd034ad845c9170f0069f5d72686b4c34c","version":"1.2.3","compatibility":[{"id":1,"model":"default","revision":"default"}],"name":"test.swu"},"hardware":{"id":1,"model":"default","revision":"default"},"feed":null,"progress":100,"last_state":"Finished","update_mode":"Assigned","force_update":false,"last_ipv4":"127.0.0.1","last_ipv6":null,"last_seen":4,"auth_token":null,"polling":true,"last_ip":"127.0.0.1","poll_seconds":60});
        let d = parse_device(&v).unwrap();
        assert_eq!(d.sw_version.as_deref(), Some("1.2.3"));
        assert_eq!(d.last_state, UpdateState::Finished);
        assert_eq!(d.target_software, Some(1));
        assert_eq!(d.progress, Some(100));
        assert_eq!(d.feed, None);
        assert_eq!(
            d.hardware,
            Some(Hardware {
                model: "default".into(),
                revision: "default".into()
            })
        );
        assert!(parse_device(&json!({"id": "x"})).is_none());
    }
}
