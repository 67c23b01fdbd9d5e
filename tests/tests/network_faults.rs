//! Network trouble between the daemon and its server, injected by a TCP
//! proxy in front of a real nginx: resets, truncation, server errors, rate
//! limiting, slow drips, a dead mirror, an untrusted certificate, and a
//! daemon killed mid-download.
//!
//! Each case ends in a correct install or a clean failure whose reason is in
//! `updraft status`, never with the active slot touched. Where a transfer is
//! cut, the proxy's byte counters show that at most one frame was sent
//! again: the total bytes the proxy delivered, minus what a clean install
//! through the same proxy needs, is at most one compressed frame plus a
//! little protocol overhead for the new connections.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::nginx::Block;
use updraft_tests::proxy::{Behaviour, Proxy};
use updraft_tests::publisher::{KeyPair, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: usize = 8 * 1024 * 1024;
/// TLS handshakes and HTTP headers of reconnections.
const OVERHEAD: u64 = 64 * 1024;

struct Net {
    server: UpdateServer,
    proxy: Proxy,
    key: KeyPair,
    image: Vec<u8>,
    keys: TempDir,
}

impl Net {
    fn new(name: &str) -> Net {
        let keys = TempDir::new(&format!("{name}-keys"));
        let key = keygen(keys.path(), "release");
        let server = UpdateServer::start(&keys.join("site"), false);
        let img = keys.join("v1.img");
        let image = image(&img, IMAGE, 31);
        server.repo.release(&[&key], "1.0", &img, &[]);
        let proxy = Proxy::start(server.nginx.addr()).expect("starting the proxy");
        Net {
            server,
            proxy,
            key,
            image,
            keys,
        }
    }

    fn url(&self) -> String {
        format!("https://{}/manifest.json", self.proxy.addr())
    }

    fn max_frame(&self) -> u64 {
        let p = self.server.repo.payload();
        p["artifact"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["size"].as_u64().unwrap())
            .max()
            .unwrap()
    }

    fn artifact_size(&self) -> u64 {
        self.server.repo.payload()["artifact"]["size"]
            .as_u64()
            .unwrap()
    }

    /// A device polling `url` rarely (installs are triggered explicitly
    /// with `updraft check`), with a slow-retrieval floor.
    fn device(&self, name: &str, url: &str, extra: &str) -> Device {
        let mut spec = DeviceSpec::simple(&self.key);
        spec.server = format!(
            "manifest_url = {url:?}\nca_file = {:?}\npoll_interval = \"1h\"\npoll_jitter = \"1s\"\nretry_max = \"3s\"\n\
             stall_timeout = \"5s\"\nconnect_timeout = \"5s\"\nmin_rate = 20000\nmin_rate_window = \"2s\"\n{extra}",
            self.server.nginx.ca_file()
        );
        let dev = Device::new(name, spec);
        dev.init();
        dev
    }

    /// Bytes the proxy delivers for one clean install.
    fn baseline(&self, name: &str) -> u64 {
        self.proxy.clear_script();
        self.proxy.set_default(Behaviour::Pass);
        let before = self.proxy.totals().to_client;
        let mut dev = self.device(name, &self.url(), "");
        dev.start_daemon();
        wait_installed(&dev);
        dev.stop_daemon();
        self.proxy.wait_idle(Duration::from_secs(10));
        self.proxy.totals().to_client - before
    }

    fn assert_installed(&self, dev: &Device) {
        let b = dev.slot_bytes(SlotName::B);
        assert!(
            b[..IMAGE] == self.image[..],
            "slot B does not hold the image (sha256 {})",
            Sha256::of(&b[..IMAGE])
        );
    }
}

fn factory_a(dev: &Device) -> Sha256 {
    Sha256::of(&dev.slot_bytes(SlotName::A))
}

fn wait_installed(dev: &Device) -> Value {
    dev.wait_reboot_requested(WAIT);
    dev.wait_for("the rebooting state", WAIT, |s| {
        s["state"] == json!("rebooting")
    })
}

/// Run one fault case: the proxy follows `script` for its next connections
/// and passes everything after; the install must complete with at most one
/// frame sent again.
fn resumes_after(name: &str, script: Vec<Behaviour>, expect_in_log: &str) {
    let net = Net::new(name);
    let clean = net.baseline(&format!("{name}-baseline"));
    net.proxy.set_default(Behaviour::Pass);
    net.proxy.script(script);
    let before = net.proxy.totals().to_client;
    let mut dev = net.device(name, &net.url(), "");
    let a = factory_a(&dev);
    dev.start_daemon();
    wait_installed(&dev);
    dev.stop_daemon();
    net.proxy.wait_idle(Duration::from_secs(10));
    let sent = net.proxy.totals().to_client - before;
    net.assert_installed(&dev);
    assert_eq!(factory_a(&dev), a, "the active slot changed");
    let log = dev.log();
    assert!(
        log.contains(expect_in_log),
        "expected {expect_in_log:?} in the daemon log:\n{log}"
    );
    let again = sent.saturating_sub(clean);
    let frame = net.max_frame();
    eprintln!(
        "{name}: artifact {} bytes, clean install {clean} bytes through the proxy, with the fault {sent}: {again} bytes sent again (largest frame {frame})",
        net.artifact_size()
    );
    assert!(
        again <= frame + OVERHEAD,
        "{again} bytes were sent again, more than one frame ({frame}) plus {OVERHEAD} of overhead"
    );
    assert!(
        sent > clean,
        "the fault did not cost anything: was it injected?"
    );
}

#[test]
fn connection_reset_mid_body_resumes_at_the_last_verified_frame() {
    updraft_tests::require!("nginx");
    resumes_after(
        "reset",
        vec![Behaviour::ResetAfter(2_500_000)],
        "resuming at frame",
    );
}

#[test]
fn truncated_body_resumes_at_the_last_verified_frame() {
    updraft_tests::require!("nginx");
    resumes_after(
        "truncated",
        vec![Behaviour::CloseAfter(2_200_000)],
        "resuming at frame",
    );
}

#[test]
fn server_errors_are_retried_with_backoff() {
    updraft_tests::require!("nginx");
    let net = Net::new("http500");
    let e500 = net.server.nginx.addr_of(Block::Error500);
    net.proxy
        .script(vec![Behaviour::Upstream(e500), Behaviour::Upstream(e500)]);
    let mut dev = net.device("http500", &net.url(), "");
    let a = factory_a(&dev);
    dev.start_daemon();
    wait_installed(&dev);
    net.assert_installed(&dev);
    assert_eq!(factory_a(&dev), a);
    let history = dev.ok(&["history"]);
    assert!(history.contains("HTTP status 500"), "{history}");
}

/// tuf-conformance `test_timestamp_404`: the server answers 404 for the
/// manifest. The check fails with the status in its error, nothing is
/// stored (no serial, no state), the daemon keeps running and asks again
/// at a later poll: once the manifest is there, it installs.
#[test]
fn tuf_test_timestamp_404_a_missing_manifest_fails_the_check_and_is_fetched_again() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("manifest-404-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("1s", "200ms");
    let mut dev = Device::new("manifest-404", spec);
    dev.init();
    dev.start_daemon();
    let st = dev.wait_for("a failed check", WAIT, |s| {
        s["last_error"].as_str().is_some_and(|e| e.contains("404"))
    });
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    assert_eq!(st["serial"], json!(null), "{st:#}");
    server
        .nginx
        .wait_access_log(WAIT, |l| {
            l.iter()
                .filter(|e| e.uri == "/manifest.json" && e.status == 404)
                .count()
                >= 1
        })
        .unwrap();
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    let img = keys.join("v1.img");
    let bytes = image(&img, 64 * 1024, 7);
    server.repo.release(&[&key], "1.0", &img, &[]);
    wait_installed(&dev);
    assert_eq!(&dev.slot_bytes(SlotName::B)[..bytes.len()], &bytes[..]);
    dev.stop_daemon();
}

#[test]
fn too_many_requests_with_retry_after_is_honoured() {
    updraft_tests::require!("nginx");
    let net = Net::new("http429");
    let block = net.server.nginx.addr_of(Block::TooManyRequests);
    net.proxy.script(vec![Behaviour::Upstream(block)]);
    let mut dev = net.device("http429", &net.url(), "");
    dev.start_daemon();
    wait_installed(&dev);
    net.assert_installed(&dev);
    let log = dev.log();
    assert!(log.contains("asked to retry after 1s"), "{log}");
    // The retry came no earlier than the server asked (Retry-After: 1).
    let log = net.server.nginx.access_log().unwrap();
    let busy = log
        .iter()
        .find(|e| e.status == 429)
        .expect("a 429 in the access log");
    let next = log
        .iter()
        .find(|e| e.status == 200 && e.uri == "/manifest.json" && e.time > busy.time)
        .expect("a successful poll after the 429");
    let gap = next.time.duration_since(busy.time).unwrap_or_default();
    assert!(
        gap >= Duration::from_millis(900),
        "polled again {gap:?} after a 429 with Retry-After: 1"
    );
    let history = dev.ok(&["history"]);
    assert!(history.contains("server busy (429)"), "{history}");
}

#[test]
fn a_drip_below_the_rate_floor_is_abandoned_and_resumed() {
    updraft_tests::require!("nginx");
    resumes_after(
        "drip",
        vec![Behaviour::Drip {
            bytes_per_sec: 4000,
        }],
        "slow retrieval",
    );
}

#[test]
fn a_dead_mirror_is_skipped_and_the_good_one_preferred() {
    updraft_tests::require!("nginx");
    let net = Net::new("mirror");
    let dead = Proxy::start(net.server.nginx.addr()).unwrap();
    dead.set_default(Behaviour::Refuse);
    let dead_url = format!("https://{}/manifest.json", dead.addr());
    let good = format!("https://{}/", net.server.nginx.addr());
    let mut dev = net.device("mirror", &dead_url, &format!("mirrors = [{good:?}]\n"));
    dev.start_daemon();
    wait_installed(&dev);
    net.assert_installed(&dev);
    let log = dev.log();
    assert!(log.contains(&format!("using mirror {good}")), "{log}");
    // The artifact came from the mirror too, without going back to the
    // dead server first.
    let refused = dead.totals().connections;
    assert!(
        (1..=2).contains(&refused),
        "{refused} connections to the dead server"
    );
}

#[test]
fn a_certificate_from_an_untrusted_ca_is_refused() {
    updraft_tests::require!("nginx");
    let net = Net::new("untrusted");
    let url = net
        .server
        .nginx
        .url_of(Block::UntrustedCert, "/manifest.json");
    let mut dev = net.device("untrusted", &url, "");
    let before = dev.snapshot();
    dev.start_daemon();
    let st = dev.wait_for("the certificate error in status", WAIT, |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("certificate"))
    });
    assert_eq!(st["state"], json!("idle"));
    dev.stop_daemon();
    let after = dev.snapshot();
    assert_eq!(before.slot_a, after.slot_a);
    assert_eq!(before.slot_b, after.slot_b);
    assert_eq!(before.serial, after.serial);
    assert_eq!(before.boot_state, after.boot_state);
}

#[test]
fn a_daemon_killed_mid_download_resumes_after_restart() {
    updraft_tests::require!("nginx");
    let net = Net::new("sigkill");
    let clean = net.baseline("sigkill-baseline");
    // Slow enough to catch it in the middle, fast enough for the floor.
    net.proxy.set_default(Behaviour::Drip {
        bytes_per_sec: 300_000,
    });
    let before = net.proxy.totals().to_client;
    let mut dev = net.device("sigkill", &net.url(), "");
    let a = factory_a(&dev);
    dev.start_daemon();
    let frame = net.max_frame();
    let st = dev.wait_for("three frames downloaded", WAIT, |s| {
        s["state"] == json!("downloading")
            && s["progress"]["done"].as_u64().unwrap_or(0) > 3 * frame
    });
    // Status answers during the download, with progress.
    let t = Instant::now();
    let during = dev.status();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "status took {:?} during a download",
        t.elapsed()
    );
    assert_eq!(during["state"], json!("downloading"));
    assert!(
        during["progress"]["rate"].as_u64().unwrap_or(0) > 0,
        "{during:#}"
    );
    assert!(
        during["progress"]["total"].as_u64().unwrap_or(0) == net.artifact_size(),
        "{during:#}"
    );
    eprintln!(
        "killed at {} of {} bytes",
        st["progress"]["done"],
        net.artifact_size()
    );
    dev.kill_daemon();
    net.proxy.set_default(Behaviour::Pass);
    net.proxy.reset_all();
    dev.start_daemon();
    wait_installed(&dev);
    dev.stop_daemon();
    net.proxy.wait_idle(Duration::from_secs(10));
    net.assert_installed(&dev);
    assert_eq!(factory_a(&dev), a);
    let sent = net.proxy.totals().to_client - before;
    let again = sent.saturating_sub(clean);
    eprintln!(
        "sigkill: clean {clean}, with the kill {sent}: {again} bytes sent again (largest frame {frame})"
    );
    assert!(
        again <= frame + OVERHEAD,
        "{again} bytes sent again after the restart"
    );
    assert!(
        dev.log().contains("resuming at frame"),
        "{}",
        dev.log_tail()
    );
}

#[test]
fn an_artifact_longer_than_signed_is_refused_before_writing() {
    updraft_tests::require!("nginx");
    let net = Net::new("http-long");
    let artifact = net.server.repo.artifact();
    let mut bytes = std::fs::read(&artifact).unwrap();
    bytes.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&artifact, bytes).unwrap();
    let dev = net.device("http-long", &net.url(), "");
    let before = dev.snapshot();
    let err = dev.fails(&["install", &net.url()]);
    assert!(err.contains("(artifact longer than signed)"), "{err}");
    let after = dev.snapshot();
    assert_eq!(before.slot_a, after.slot_a);
    assert_eq!(before.slot_b, after.slot_b, "bytes were written");
    assert_eq!(
        before.boot_state, after.boot_state,
        "the boot selection changed"
    );
    assert_eq!(after.state, json!("idle"));
}

#[test]
fn plain_http_is_refused_without_the_development_switch() {
    updraft_tests::require!("nginx");
    let net = Net::new("plain-http");
    let mut spec = DeviceSpec::simple(&net.key);
    spec.server = "manifest_url = \"http://127.0.0.1:9/manifest.json\"\n".into();
    let dev = Device::new("plain-http", spec);
    let out = dev.updraft(&["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is plain http; use https"), "{err}");
    let _ = &net.keys;
}

/// A server that wants device identity: a client certificate (mTLS) and a
/// bearer token. Without them the device is refused; with them it installs.
#[test]
fn a_client_certificate_and_bearer_token_identify_the_device() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("mtls-keys");
    let key = keygen(keys.path(), "release");
    let site = keys.join("site");
    let repo = updraft_tests::publisher::Repo::new(site.clone());
    let img = keys.join("v1.img");
    image(&img, 2 * 1024 * 1024, 8);
    repo.release(&[&key], "1.0", &img, &[]);
    let ca = updraft_tests::ca::TestCa::new("mtls test CA").unwrap();
    let ca_pem = keys.join("client-ca.pem");
    ca.write_cert(&ca_pem).unwrap();
    let nginx = updraft_tests::nginx::Nginx::builder(&site)
        .ca(&ca)
        .require_client(&ca_pem, Some("s3cr3t-device-token"))
        .start()
        .unwrap();
    let (cert, keyfile) = ca
        .issue_client("device-0001")
        .unwrap()
        .write(keys.path(), "device")
        .unwrap();
    let token = keys.join("token");
    std::fs::write(&token, "s3cr3t-device-token\n").unwrap();
    let url = nginx.url("/manifest.json");
    let base = format!(
        "manifest_url = {url:?}\nca_file = {:?}\npoll_interval = \"1h\"\n",
        nginx.ca_file()
    );
    // No identity: refused.
    let mut spec = DeviceSpec::simple(&key);
    spec.server = base.clone();
    let mut dev = Device::new("mtls", spec);
    dev.init();
    let err = dev.fails(&["install", &url]);
    assert!(err.contains("HTTP status 400"), "{err}");
    // Certificate but no token: 401.
    let with_cert = format!("{base}client_cert = {cert:?}\nclient_key = {keyfile:?}\n");
    dev.reconfigure(|s| s.server = with_cert.clone());
    let err = dev.fails(&["install", &url]);
    assert!(
        err.contains("HTTP status 401"),
        "{err}\nnginx: {}",
        nginx.error_log()
    );
    // Both: installed.
    dev.reconfigure(|s| s.server = format!("{with_cert}token_file = {token:?}\n"));
    let out = dev.ok(&["install", &url]);
    assert!(out.contains("installed release 1.0"), "{out}");
    // A key that does not match the certificate is a configuration error.
    let (_, other_key) = ca
        .issue_client("other")
        .unwrap()
        .write(keys.path(), "other")
        .unwrap();
    dev.reconfigure(|s| {
        s.server = format!("{base}client_cert = {cert:?}\nclient_key = {other_key:?}\n")
    });
    let err = dev.fails(&["install", &url]);
    assert!(err.contains("do not form a usable pair"), "{err}");
}
