//! An update server reached through the fault-injecting proxy, with the
//! release key and images of the tests that use it: what a test needs to
//! slow a download down (or refuse new connections) while the daemon
//! works, and to publish newer releases meanwhile.
//!
//! This module only sets things up; it never decides what a test asserts.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::device::{Device, DeviceSpec};
use crate::proxy::{Behaviour, Proxy};
use crate::publisher::{KeyPair, image, keygen};
use crate::server::UpdateServer;
use crate::tmp::TempDir;

/// nginx serving a release directory, and a [`Proxy`] in front of it that
/// devices are pointed at.
pub struct ProxiedServer {
    pub server: UpdateServer,
    pub proxy: Proxy,
    pub key: KeyPair,
    dir: TempDir,
}

impl ProxiedServer {
    /// Start nginx (with a report collector when `reports`) and the proxy
    /// (passing everything until told otherwise).
    pub fn start(name: &str, reports: bool) -> ProxiedServer {
        let dir = TempDir::new(&format!("{name}-server"));
        let key = keygen(dir.path(), "release");
        let server = UpdateServer::start(&dir.join("site"), reports);
        let proxy = Proxy::start(server.nginx.addr()).expect("starting the proxy");
        ProxiedServer {
            server,
            proxy,
            key,
            dir,
        }
    }

    /// The manifest's URL through the proxy.
    pub fn manifest_url(&self) -> String {
        format!("https://{}/manifest.json", self.proxy.addr())
    }

    /// Publish `version` with an image of `size` bytes made from `seed`
    /// (the same seed, the same image); `extra` adds publisher flags.
    /// Returns the image.
    pub fn publish(&self, version: &str, seed: u64, size: usize, extra: &[&str]) -> Vec<u8> {
        let path = self.dir.join(format!("image-{seed}-{size}.img"));
        let bytes = image(&path, size, seed);
        self.server
            .repo
            .release(&[&self.key], version, &path, extra);
        bytes
    }

    /// The signed artifact size of the current manifest.
    pub fn artifact_size(&self) -> u64 {
        self.server.repo.payload()["artifact"]["size"]
            .as_u64()
            .expect("artifact size in the manifest")
    }

    /// A device trusting the release key and polling through the proxy
    /// every `poll` (jitter 1 s), with short network timeouts and the
    /// `[server]` lines in `extra`; initialised (slot A booted and good).
    pub fn device(&self, name: &str, poll: &str, extra: &str) -> Device {
        let dev = Device::new(name, self.device_spec(poll, extra));
        dev.init();
        dev
    }

    /// The spec [`ProxiedServer::device`] uses, for a test to change before
    /// it makes the device.
    pub fn device_spec(&self, poll: &str, extra: &str) -> DeviceSpec {
        self.device_spec_at(&self.manifest_url(), poll, extra)
    }

    /// As [`ProxiedServer::device_spec`], polling `manifest_url` (e.g. a
    /// bundle's URL through the proxy) instead of the manifest.
    pub fn device_spec_at(&self, manifest_url: &str, poll: &str, extra: &str) -> DeviceSpec {
        let mut spec = DeviceSpec::simple(&self.key);
        spec.server = format!(
            "{}stall_timeout = \"5s\"\nconnect_timeout = \"5s\"\n{extra}",
            self.server
                .server_toml_at(manifest_url, poll, "1s")
                .replace("retry_max = \"5s\"\n", "retry_max = \"3s\"\n")
        );
        spec
    }

    /// Wait until the report collector holds a report (as JSON) that
    /// `pred` accepts; returns it.
    pub fn wait_report(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.server
            .collector
            .as_ref()
            .expect("a server started with reports")
            .wait_report(what, timeout, pred)
    }

    pub fn only_the_download_passes(&self, behaviour: Behaviour) {
        self.proxy.set_default(behaviour);
        let busiest = self
            .proxy
            .connections()
            .into_iter()
            .filter(|c| c.open)
            .max_by_key(|c| c.to_client)
            .expect("an open connection: the download");
        self.proxy.reset_all_but(busiest.id);
    }

    /// Slow every new connection down to `bytes_per_sec`.
    pub fn drip(&self, bytes_per_sec: u64) {
        self.proxy.set_default(Behaviour::Drip { bytes_per_sec });
    }
}

/// Wait until `dev` is downloading and holds more than `bytes` of the
/// artifact; returns that status.
pub fn wait_downloading(dev: &Device, bytes: u64, timeout: Duration) -> Value {
    dev.wait_for(
        &format!("more than {bytes} bytes downloaded"),
        timeout,
        |s| s["state"] == "downloading" && s["progress"]["done"].as_u64().unwrap_or(0) > bytes,
    )
}

/// The history as `updraft history --json` lists it, oldest first.
pub fn history(dev: &Device) -> Vec<Value> {
    let text = dev.ok(&["history", "--json"]);
    serde_json::from_str(&text).expect("history --json is JSON")
}

/// Wait until the history holds an entry `pred` accepts; returns it.
pub fn wait_history(
    dev: &Device,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if let Some(e) = history(dev).into_iter().find(|e| pred(e)) {
            return e;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "no history entry for {what} within {timeout:?}: {:#?}\nlog:\n{}",
        history(dev),
        dev.log_tail()
    );
}
