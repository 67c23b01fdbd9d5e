//! An update server as a fleet would run one: the publisher's output
//! directory served by nginx over TLS (certificate from a test CA), with an
//! optional report collector behind `/report`.

use std::path::Path;

use crate::ca::TestCa;
use crate::collector::Collector;
use crate::nginx::Nginx;
use crate::publisher::Repo;

pub struct UpdateServer {
    pub repo: Repo,
    pub nginx: Nginx,
    pub collector: Option<Collector>,
    pub ca: TestCa,
}

impl UpdateServer {
    /// Serve `dir` (created if missing); with `reports`, also run a
    /// collector behind `/report`.
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
        let mut s = format!(
            "manifest_url = {:?}\nca_file = {:?}\npoll_interval = {poll:?}\npoll_jitter = {jitter:?}\nretry_max = \"5s\"\n",
            self.manifest_url(),
            self.nginx.ca_file(),
        );
        if self.collector.is_some() {
            s.push_str(&format!("report_url = {:?}\n", self.report_url()));
        }
        s
    }
}
