//! An update server as a fleet would run one: the publisher's output
//! directory served over TLS (certificate from a test CA), with an
//! optional report collector behind `/report`.
//!
//! [`UpdateServer`] is what the end-to-end tests use: always a real nginx
//! ([`crate::nginx`]), so they check updraft against the server a fleet
//! runs; a test using it first checks `require!("nginx")`. [`Site`] is
//! what the demo uses: nginx when it is installed, otherwise the embedded
//! [`StaticServer`], so the demo needs nothing but Rust.
//! `UPDRAFT_NGINX=/nonexistent` (any path that is not an executable)
//! makes [`Choice::Auto`] pick the embedded server.
//!
//! This module only chooses and starts servers; it must never decide what
//! a test asserts.

use std::io;
use std::path::Path;
use std::time::Duration;

use crate::ca::TestCa;
use crate::collector::Collector;
use crate::nginx::{AccessEntry, Nginx};
use crate::publisher::Repo;
use crate::static_server::StaticServer;

pub struct UpdateServer {
    pub repo: Repo,
    pub nginx: Nginx,
    pub collector: Option<Collector>,
    pub ca: TestCa,
}

impl UpdateServer {
    /// Serve `dir` (created if missing) with nginx; with `reports`, also
    /// run a collector behind `/report`. Panics when nginx cannot start:
    /// a test guards with `require!("nginx")` first.
    pub fn start(dir: &Path, reports: bool) -> UpdateServer {
        let repo = Repo::new(dir.to_path_buf());
        let ca = TestCa::new("updraft test CA").expect("making a test CA");
        let collector = reports.then(|| Collector::start().expect("starting the report collector"));
        let mut b = Nginx::builder(&repo.dir).ca(&ca).keepalive_timeout(30);
        if let Some(c) = &collector {
            b = b.report_to("/report", c.addr());
        }
        let nginx = b.start().expect("starting nginx");
        UpdateServer {
            repo,
            nginx,
            collector,
            ca,
        }
    }

    pub fn manifest_url(&self) -> String {
        self.nginx.url("/manifest.json")
    }

    pub fn report_url(&self) -> String {
        self.nginx.url("/report")
    }

    /// `[server]` lines for a device polling this server every `poll`
    /// (a duration like "2s") with `jitter`.
    pub fn server_toml(&self, poll: &str, jitter: &str) -> String {
        self.server_toml_at(&self.manifest_url(), poll, jitter)
    }

    /// As [`UpdateServer::server_toml`], with the manifest (and so the
    /// artifacts) at `manifest_url`: this server seen through a proxy.
    /// Reports still go to this server directly.
    pub fn server_toml_at(&self, manifest_url: &str, poll: &str, jitter: &str) -> String {
        server_toml(
            manifest_url,
            self.nginx.ca_file(),
            self.collector.is_some().then(|| self.report_url()),
            poll,
            jitter,
        )
    }

    /// The release directory of channel `name`: `<root>/<name>/`, served
    /// at `/<name>/manifest.json`.
    pub fn channel(&self, name: &str) -> Repo {
        Repo::new(self.repo.dir.join(name))
    }

    /// `[server]` lines for a device that finds each channel's manifest at
    /// `/{channel}/manifest.json` and follows `channel`.
    pub fn channel_server_toml(&self, channel: &str, poll: &str, jitter: &str) -> String {
        let mut s = server_toml(
            &self.nginx.url("/{channel}/manifest.json"),
            self.nginx.ca_file(),
            self.collector.is_some().then(|| self.report_url()),
            poll,
            jitter,
        );
        s.push_str(&format!("channel = {channel:?}\n"));
        s
    }
}

/// A device reporting to a collector: a fresh release key, nginx serving
/// its releases with a collector behind `/report`, and a device (`name`)
/// polling every 2 s with heartbeats every second, initialised but not
/// started. The rig of the outbox and signed-report tests.
pub struct ReportingRig {
    pub key: crate::publisher::KeyPair,
    pub server: UpdateServer,
    pub dev: crate::device::Device,
    /// Holds the keys and the site; removed last.
    _dir: crate::tmp::TempDir,
}

impl ReportingRig {
    /// Panics when nginx cannot start: guard with `require!("nginx")`.
    pub fn new(name: &str) -> ReportingRig {
        let dir = crate::tmp::TempDir::new(&format!("{name}-keys"));
        let key = crate::publisher::keygen(dir.path(), "release");
        let server = UpdateServer::start(&dir.join("site"), true);
        let mut spec = crate::device::DeviceSpec::simple(&key);
        spec.server = format!(
            "{}heartbeat_interval = \"1s\"\n",
            server.server_toml("2s", "1s")
        );
        let dev = crate::device::Device::new(name, spec);
        dev.init();
        ReportingRig {
            key,
            server,
            dev,
            _dir: dir,
        }
    }

    /// The collector behind `/report`.
    pub fn collector(&self) -> &Collector {
        self.server
            .collector
            .as_ref()
            .expect("a reporting rig's server has a collector")
    }
}

fn server_toml(
    manifest_url: &str,
    ca_file: &Path,
    report_url: Option<String>,
    poll: &str,
    jitter: &str,
) -> String {
    let mut s = format!(
        "manifest_url = {manifest_url:?}\nca_file = {ca_file:?}\npoll_interval = {poll:?}\npoll_jitter = {jitter:?}\nretry_max = \"5s\"\n",
    );
    if let Some(r) = report_url {
        s.push_str(&format!("report_url = {r:?}\n"));
    }
    s
}

/// Which HTTPS server a [`Site`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// nginx when [`Nginx::binary`] is an executable, else the embedded
    /// server.
    Auto,
    /// nginx; starting fails when it is not installed.
    Nginx,
    /// The embedded [`StaticServer`].
    Embedded,
}

impl Choice {
    /// `auto`, `nginx` or `embedded`.
    pub fn parse(s: &str) -> Option<Choice> {
        match s {
            "auto" => Some(Choice::Auto),
            "nginx" => Some(Choice::Nginx),
            "embedded" => Some(Choice::Embedded),
            _ => None,
        }
    }
}

/// The HTTPS server in front of a [`Site`].
pub enum Http {
    Nginx(Box<Nginx>),
    Embedded(StaticServer),
}

impl Http {
    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        match self {
            Http::Nginx(n) => n.url(path),
            Http::Embedded(s) => s.url(path),
        }
    }

    /// PEM file of the CA that issued the server's certificate.
    pub fn ca_file(&self) -> &Path {
        match self {
            Http::Nginx(n) => n.ca_file(),
            Http::Embedded(s) => s.ca_file(),
        }
    }

    /// Every request answered so far, oldest first. nginx logs a request
    /// a moment after answering it: see [`Http::wait_access_log`].
    pub fn access_log(&self) -> io::Result<Vec<AccessEntry>> {
        match self {
            Http::Nginx(n) => n.access_log(),
            Http::Embedded(s) => Ok(s.access_log()),
        }
    }

    /// Wait until `done` holds for the access log or `timeout` passes.
    pub fn wait_access_log(
        &self,
        timeout: Duration,
        done: impl Fn(&[AccessEntry]) -> bool,
    ) -> io::Result<Vec<AccessEntry>> {
        match self {
            Http::Nginx(n) => n.wait_access_log(timeout, done),
            Http::Embedded(s) => Ok(s.wait_access_log(timeout, done)),
        }
    }

    /// One phrase naming the server, for people.
    pub fn describe(&self) -> String {
        match self {
            Http::Nginx(n) => format!("nginx ({}), pid {}", Nginx::binary().display(), {
                n.pid().map(|p| p.to_string()).unwrap_or_else(|| "-".into())
            }),
            Http::Embedded(_) => "the embedded static server (rustls, in this process)".into(),
        }
    }

    pub fn is_nginx(&self) -> bool {
        matches!(self, Http::Nginx(_))
    }
}

/// The publisher's directory served by nginx or the embedded server.
pub struct Site {
    pub repo: Repo,
    pub http: Http,
    pub collector: Option<Collector>,
    pub ca: TestCa,
    /// Why the embedded server was chosen, when [`Choice::Auto`] chose it.
    pub fallback_reason: Option<String>,
}

impl Site {
    /// Serve `dir` (created if missing) with the server `choice` names;
    /// with `reports`, also run a collector behind `/report`. Errors are
    /// one sentence saying what is missing and how to fix it.
    pub fn start(dir: &Path, reports: bool, choice: Choice) -> io::Result<Site> {
        std::fs::create_dir_all(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        let repo = Repo {
            dir: dir.to_path_buf(),
        };
        let ca = TestCa::new("updraft demo CA")?;
        let collector = match reports {
            true => Some(
                Collector::start()
                    .map_err(|e| io::Error::new(e.kind(), format!("the report collector: {e}")))?,
            ),
            false => None,
        };
        let nginx = Nginx::binary();
        let nginx_here = crate::prereq::find("nginx").is_some();
        let (use_nginx, fallback_reason) = match choice {
            Choice::Nginx if !nginx_here => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "nginx is not installed at {}: install it (apt-get install nginx), \
                         point UPDRAFT_NGINX at an nginx binary, or choose the embedded server",
                        nginx.display()
                    ),
                ));
            }
            Choice::Nginx => (true, None),
            Choice::Embedded => (false, None),
            Choice::Auto if nginx_here => (true, None),
            Choice::Auto => (
                false,
                Some(format!(
                    "no nginx at {} (install the Debian package nginx or set UPDRAFT_NGINX to use one)",
                    nginx.display()
                )),
            ),
        };
        let http = if use_nginx {
            let mut b = Nginx::builder(&repo.dir).ca(&ca).keepalive_timeout(30);
            if let Some(c) = &collector {
                b = b.report_to("/report", c.addr());
            }
            Http::Nginx(Box::new(b.start().map_err(|e| {
                io::Error::new(e.kind(), format!("starting nginx: {e}"))
            })?))
        } else {
            let mut b = StaticServer::builder(&repo.dir).ca(&ca);
            if let Some(c) = &collector {
                b = b.proxy("/report", c.addr());
            }
            Http::Embedded(b.start().map_err(|e| {
                io::Error::new(e.kind(), format!("starting the embedded server: {e}"))
            })?)
        };
        Ok(Site {
            repo,
            http,
            collector,
            ca,
            fallback_reason,
        })
    }

    pub fn manifest_url(&self) -> String {
        self.http.url("/manifest.json")
    }

    pub fn report_url(&self) -> String {
        self.http.url("/report")
    }

    /// `[server]` lines for a device polling this site every `poll` with
    /// `jitter`.
    pub fn server_toml(&self, poll: &str, jitter: &str) -> String {
        server_toml(
            &self.manifest_url(),
            self.http.ca_file(),
            self.collector.is_some().then(|| self.report_url()),
            poll,
            jitter,
        )
    }
}
