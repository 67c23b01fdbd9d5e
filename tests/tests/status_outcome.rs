//! `updraft status` tells how the last install ended (release, committed /
//! rolled back / failed, the reason, when), both from a running daemon and
//! from the database without one, in text and as `last_install` in
//! `--json`; during a download it shows the progress with rate and time
//! left, and still the last outcome.

use std::time::Duration;

use serde_json::{Value, json};
use updraft::timestamp::Timestamp;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::proxy::{Behaviour, Proxy};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);
const IMAGE: usize = 4 * 1024 * 1024 + 123;

struct Rig {
    dev: Device,
    repo: Repo,
    key: KeyPair,
    _keys: TempDir,
}

fn rig(name: &str) -> Rig {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let dev = Device::new(name, DeviceSpec::simple(&key));
    dev.init();
    let repo = Repo::new(dev.path("usb"));
    Rig {
        dev,
        repo,
        key,
        _keys: keys,
    }
}

impl Rig {
    fn publish(&self, version: &str, seed: u64) {
        let img = self.dev.path(&format!("{version}.img"));
        image(&img, IMAGE, seed);
        self.repo.release(&[&self.key], version, &img, &[]);
    }

    /// One-shot install of `version` from the local directory, reboot into
    /// it, and let the daemon run the health checks.
    fn install_and_boot(&mut self, version: &str, seed: u64) {
        self.publish(version, seed);
        let out = self.dev.install(&self.repo.manifest_str());
        assert!(
            out.status.success(),
            "install {version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.dev.reboot();
        self.dev.start_daemon();
    }

    /// `status` in text and JSON, asserting both say the same about the
    /// last install; returns the `last_install` object and its text line.
    fn last_install(&self) -> (Value, String) {
        let st = self.dev.status();
        let text = self.dev.ok(&["status"]);
        let line = text
            .lines()
            .find(|l| l.starts_with("last install: "))
            .unwrap_or_else(|| panic!("no last install line in:\n{text}"))
            .to_string();
        (st["last_install"].clone(), line)
    }
}

/// The line without its age (`(5 s ago)`), which moves on between calls.
fn without_age(line: &str) -> String {
    match (line.find(" ("), line.find(" ago)")) {
        (Some(a), Some(b)) if a < b => format!("{}{}", &line[..a], &line[b + " ago)".len()..]),
        _ => line.to_string(),
    }
}

/// `time` is an RFC 3339 instant between `from` and now.
fn assert_recent(l: &Value, from: Timestamp) {
    let t = l["time"]
        .as_str()
        .and_then(|s| Timestamp::parse_rfc3339(s).ok())
        .unwrap_or_else(|| panic!("last_install.time is not RFC 3339: {l:#}"));
    assert!(
        t.0 >= from.0 - 1 && t.0 <= Timestamp::now().0 + 1,
        "last_install.time {t:?} not between {from:?} and now: {l:#}"
    );
}

#[test]
fn status_after_a_commit_names_the_release_and_committed() {
    let mut r = rig("status-commit");
    // Before any install there is no outcome to show.
    let st = r.dev.status();
    assert!(st.get("last_install").is_none(), "{st:#}");
    assert!(!r.dev.ok(&["status"]).contains("last install:"));

    let t0 = Timestamp::now();
    r.install_and_boot("1.0", 11);
    r.dev.wait_for("release 1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    // From the daemon, over the socket.
    let (l, line) = r.last_install();
    assert_eq!(l["release"], json!("1.0"), "{l:#}");
    assert_eq!(l["result"], json!("committed"), "{l:#}");
    assert_eq!(l["reason"], json!("health checks passed"), "{l:#}");
    assert_eq!(l["slot"], json!("B"), "{l:#}");
    assert_recent(&l, t0);
    assert!(
        line.starts_with("last install: release 1.0 committed in slot B at ")
            && line.contains(l["time"].as_str().unwrap_or("?"))
            && line.contains(" ago): health checks passed"),
        "{line}"
    );
    // Without the daemon, from the database: the same.
    r.dev.stop_daemon();
    let (offline, offline_line) = r.last_install();
    assert_eq!(offline, l);
    assert_eq!(without_age(&offline_line), without_age(&line));
}

#[test]
fn status_after_a_rollback_names_the_release_and_the_reason() {
    let mut r = rig("status-rollback");
    r.dev.health_check(
        "20-payment",
        "if [ \"$UPDRAFT_VERSION\" = 2.0 ]; then echo 'payment service did not start' >&2; exit 1; fi",
    );
    r.install_and_boot("1.0", 11);
    r.dev.wait_for("release 1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    r.dev.stop_daemon();
    let t0 = Timestamp::now();
    // 2.0 boots, fails its health check; the daemon rolls back to 1.0.
    r.install_and_boot("2.0", 22);
    r.dev.wait_reboot_requested(WAIT);
    // While the rollback reboot is pending, the last finished install is
    // still 1.0's commit.
    let st = r.dev.status();
    assert_eq!(st["last_install"]["release"], json!("1.0"), "{st:#}");
    assert_eq!(st["last_install"]["result"], json!("committed"), "{st:#}");
    r.dev.reboot();
    r.dev.start_daemon();
    r.dev.wait_for("rolled back to 1.0", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    let (l, line) = r.last_install();
    assert_eq!(l["release"], json!("2.0"), "{l:#}");
    assert_eq!(l["result"], json!("rolled_back"), "{l:#}");
    assert_eq!(l["slot"], json!("A"), "{l:#}");
    let reason = l["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("20-payment") && reason.contains("payment service did not start"),
        "{l:#}"
    );
    assert_recent(&l, t0);
    assert!(
        line.starts_with("last install: release 2.0 rolled back in slot A at ")
            && line.ends_with(&format!(": {reason}")),
        "{line}"
    );
    r.dev.stop_daemon();
    let (offline, offline_line) = r.last_install();
    assert_eq!(offline, l);
    assert_eq!(without_age(&offline_line), without_age(&line));
}

#[test]
fn status_after_a_failed_install_says_failed_and_why() {
    let r = rig("status-failed");
    r.publish("1.0", 11);
    r.repo.resign(&[&r.key], |p| {
        p["artifact"]["sha256"] = json!(updraft::hash::Sha256::of(b"something else").to_hex())
    });
    let t0 = Timestamp::now();
    let err = r.dev.fails(&["install", &r.repo.manifest_str()]);
    let (l, line) = r.last_install();
    assert_eq!(l["release"], json!("1.0"), "{l:#}");
    assert_eq!(l["result"], json!("failed"), "{l:#}");
    let reason = l["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("artifact sha256 is") && err.contains(reason),
        "the reason {reason:?} is not the install's error:\n{err}"
    );
    assert_recent(&l, t0);
    assert!(
        line.starts_with("last install: release 1.0 failed in slot B at "),
        "{line}"
    );
}

#[test]
fn status_during_a_download_shows_progress_rate_and_time_left() {
    updraft_tests::require!("nginx");
    let mut r = rig("status-progress");
    // A failed install first, so there is a last outcome to keep showing.
    r.publish("0.9", 9);
    r.repo.resign(&[&r.key], |p| {
        p["artifact"]["sha256"] = json!(updraft::hash::Sha256::of(b"not it").to_hex())
    });
    r.dev.fails(&["install", &r.repo.manifest_str()]);

    let server = UpdateServer::start(&r.dev.path("site"), false);
    let img = r.dev.path("1.0.img");
    image(&img, IMAGE, 11);
    // Serial 1 went to the failed 0.9.
    server
        .repo
        .release(&[&r.key], "1.0", &img, &["--serial", "2"]);
    let total = server.repo.payload()["artifact"]["size"]
        .as_u64()
        .unwrap_or(0);
    // Slow enough to watch (about 15 s), fast enough for the rate floor.
    let proxy = Proxy::start(server.nginx.addr()).expect("starting the proxy");
    proxy.set_default(Behaviour::Drip {
        bytes_per_sec: total / 15,
    });
    let url = format!("https://{}/manifest.json", proxy.addr());
    let ca = server.nginx.ca_file().to_path_buf();
    r.dev.reconfigure(|s| {
        s.server = format!(
            "manifest_url = {url:?}\nca_file = {ca:?}\npoll_interval = \"1h\"\npoll_jitter = \"1s\"\n"
        )
    });
    r.dev.start_daemon();
    let st = r
        .dev
        .wait_for("a download with a rate and time left", WAIT, |s| {
            s["state"] == json!("downloading")
                && s["progress"]["rate"].as_u64().unwrap_or(0) > 0
                && s["progress"]["eta"].is_u64()
                && s["progress"]["done"].as_u64().unwrap_or(0) > 0
        });
    let p = &st["progress"];
    assert_eq!(p["phase"], json!("download"), "{st:#}");
    assert_eq!(p["total"], json!(total), "{st:#}");
    assert_eq!(st["job"]["version"], json!("1.0"), "{st:#}");
    // The last finished install is still the failed one.
    assert_eq!(st["last_install"]["release"], json!("0.9"), "{st:#}");
    assert_eq!(st["last_install"]["result"], json!("failed"), "{st:#}");

    let text = r.dev.ok(&["status"]);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key:?} line in:\n{text}"))
            .to_string()
    };
    assert!(line("state:").contains("downloading"), "{text}");
    assert_eq!(
        line("job:"),
        "job:          release 1.0 -> slot B (full image)"
    );
    let progress = line("progress:");
    // `download 45% 1.2 MiB of 2.6 MiB, 0.2 MiB/s, 7 s left`
    let rest = progress
        .strip_prefix("progress:     download ")
        .unwrap_or_else(|| panic!("{progress}"));
    let (pct, rest) = rest
        .split_once("% ")
        .unwrap_or_else(|| panic!("{progress}"));
    assert!(
        pct.parse::<u64>().is_ok_and(|p| p <= 100),
        "no percentage in {progress:?}"
    );
    assert!(rest.contains(" MiB of "), "{progress}");
    assert!(rest.contains(" MiB/s, "), "no rate in {progress:?}");
    assert!(rest.ends_with(" s left"), "no time left in {progress:?}");
    assert!(
        line("last install:").starts_with("last install: release 0.9 failed in slot B at "),
        "{text}"
    );
    r.dev.stop_daemon();
}
