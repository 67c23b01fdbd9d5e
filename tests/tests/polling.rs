//! What a poll re-checks even when the server says "not modified": a 304
//! only saves the transfer, never a decision.

use std::time::Duration;

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec, TrustSpec};
use updraft_tests::publisher::{image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(60);

fn manifest_polls(server: &UpdateServer, status: u16) -> usize {
    server
        .nginx
        .access_log()
        .unwrap_or_default()
        .iter()
        .filter(|e| e.uri == "/manifest.json" && e.status == status)
        .count()
}

/// A manifest that expires while the server keeps answering 304 is refused
/// as frozen: the cached copy is verified again at every poll.
#[test]
fn a_304_does_not_hide_an_expired_manifest() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("expire-304-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    let img = keys.join("v1.img");
    image(&img, 1024 * 1024, 3);
    // Not for this device (rollout 0): the first poll verifies it and finds
    // nothing to do; it expires seconds later.
    server
        .repo
        .release(&[&key], "1.0", &img, &["--rollout", "0", "--expires", "4s"]);
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("1s", "500ms");
    let mut dev = Device::new("expire-304", spec);
    dev.init();
    dev.start_daemon();
    let st = dev.wait_for("a manifest refused as expired", WAIT, |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("expired at"))
    });
    assert!(
        manifest_polls(&server, 304) >= 1,
        "the server never answered 304; the test proves nothing"
    );
    assert!(
        st["last_error"].as_str().unwrap().contains("frozen"),
        "{st:#}"
    );
}

/// tuf-conformance `test_basic_refresh_requests`: one poll of a root-mode
/// device that trusts no key document yet asks for exactly the manifest,
/// the key document it names, and the next one (the probe for a rotation
/// no manifest names yet), in that order, and nothing else: the release is
/// outside its rollout, so no artifact is asked for.
#[test]
fn tuf_test_basic_refresh_requests_one_poll_asks_for_exactly_what_it_needs() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("requests-keys");
    let root = keygen(keys.path(), "root");
    let release = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    server.repo.key_document(&[&root], &[&release], 1, &[]);
    let img = keys.join("v1.img");
    image(&img, 64 * 1024, 3);
    server
        .repo
        .release(&[&release], "1.0", &img, &["--rollout", "0"]);
    let mut spec = DeviceSpec::simple(&release);
    spec.trust = TrustSpec::Root(vec![root.public.clone()], 1, 0);
    spec.server = server.server_toml("1h", "100ms");
    let mut dev = Device::new("requests", spec);
    dev.init();
    dev.start_daemon();
    server
        .nginx
        .wait_access_log(WAIT, |l| l.iter().any(|e| e.uri == "/keys/2.json"))
        .unwrap();
    dev.wait_for("key document 1 trusted", WAIT, |s| {
        s["keys_version"] == json!(1)
    });
    // Anything more this poll would ask for follows at once; the next poll
    // is an hour away.
    std::thread::sleep(Duration::from_millis(500));
    let requests: Vec<(String, u16)> = server
        .nginx
        .access_log()
        .unwrap()
        .into_iter()
        .map(|e| (e.uri, e.status))
        .collect();
    let expected = [
        ("/manifest.json", 200),
        ("/keys/1.json", 200),
        ("/keys/2.json", 404),
    ]
    .map(|(u, s)| (u.to_string(), s));
    assert_eq!(requests, expected, "{}", dev.log_tail());
    dev.stop_daemon();
}

/// A key document no manifest names yet (a revocation) is found by the
/// probe for `keys/N+1.json` and takes effect at once.
#[test]
fn a_revocation_reaches_the_device_before_any_manifest_names_it() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("probe-keys");
    let root = keygen(keys.path(), "root");
    let release = keygen(keys.path(), "release");
    let replacement = keygen(keys.path(), "replacement");
    let server = UpdateServer::start(&keys.join("site"), false);
    server.repo.key_document(&[&root], &[&release], 1, &[]);
    let img = keys.join("v1.img");
    image(&img, 1024 * 1024, 3);
    server
        .repo
        .release(&[&release], "1.0", &img, &["--rollout", "0"]);
    assert_eq!(server.repo.payload()["keys_version"], json!(1));
    // Key document 2 revokes the release key; the manifest still names 1.
    server.repo.key_document(&[&root], &[&replacement], 2, &[]);
    let mut spec = DeviceSpec::simple(&release);
    spec.trust = TrustSpec::Root(vec![root.public.clone()], 1, 0);
    spec.server = server.server_toml("1s", "500ms");
    let mut dev = Device::new("probe", spec);
    dev.init();
    dev.start_daemon();
    let st = dev.wait_for("the revocation in force", WAIT, |s| {
        s["keys_version"] == json!(2)
            && s["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("release keys of key document v2"))
    });
    assert_eq!(st["state"], json!("idle"));
}

/// A release whose install failed is tried again with the same manifest
/// (equal serial) once the server serves good bytes, after a backoff.
#[test]
fn a_failed_install_is_retried_with_the_same_manifest() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("retry-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    let img = keys.join("v1.img");
    let bytes = image(&img, 3 * 1024 * 1024, 3);
    server.repo.release(&[&key], "1.0", &img, &[]);
    // Break the artifact on the server (same size, wrong bytes).
    let artifact = server.repo.artifact();
    let good = std::fs::read(&artifact).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    for b in &mut bad[mid..mid + 100] {
        *b ^= 0xff;
    }
    std::fs::write(&artifact, &bad).unwrap();
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("1s", "500ms");
    let mut dev = Device::new("retry", spec);
    dev.init();
    dev.start_daemon();
    dev.wait_for("a failed attempt", WAIT, |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("artifact frame"))
    });
    // The publisher fixes the file; the manifest (and its serial) stay.
    std::fs::write(&artifact, &good).unwrap();
    dev.wait_reboot_requested(WAIT);
    assert_eq!(&dev.slot_bytes(SlotName::B)[..bytes.len()], &bytes[..]);
    let log = dev.log();
    assert!(
        log.contains("install attempt 1 failed; next check in"),
        "{log}"
    );
    assert_eq!(dev.status()["serial"], json!(1));
}

/// A reboot command that exits 0 without rebooting (a blocked `systemctl
/// reboot`, a shutdown inhibitor, a broken script): once
/// `system.reboot_timeout` has passed, the daemon warns, reports that it
/// waits for the reboot, asks again, and polls meanwhile, so the server
/// sees a device alive and stuck rather than silence.
#[test]
fn a_reboot_that_does_not_come_is_warned_about_reported_and_asked_again() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("no-reboot-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), true);
    let collector = server.collector.as_ref().expect("a report collector");
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("1s", "200ms");
    spec.system = "reboot_timeout = \"2s\"\n".into();
    let marker = keys.join("asked");
    spec.reboot_command = Some(format!(
        "[\"sh\", \"-c\", \"echo asked >> '{}'\"]",
        marker.display()
    ));
    let mut dev = Device::new("no-reboot", spec);
    dev.init();
    let img = keys.join("1.0.img");
    image(&img, 2 * 1024 * 1024 + 5, 9);
    server.repo.release(&[&key], "1.0", &img, &[]);
    dev.start_daemon();
    dev.wait_for("the reboot asked", WAIT, |s| {
        s["state"] == json!("rebooting")
    });
    let t = std::time::Instant::now();
    while !dev.log().contains("has not come") {
        assert!(t.elapsed() < WAIT, "no warning:\n{}", dev.log_tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    let warned_at = std::time::SystemTime::now();
    let log = dev.log();
    let line = log
        .lines()
        .find(|l| l.contains("has not come"))
        .unwrap_or_default();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("release 1.0 slot B"), "{line}");
    // Reported: the device waits for its reboot.
    collector.wait_report("waiting for the reboot", WAIT, |r| {
        r["kind"] == json!("waiting") && r["waiting_for"] == json!("reboot")
    });
    // Asked again, and polled meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    let asked = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        asked.lines().count() >= 2,
        "asked {} time(s)",
        asked.lines().count()
    );
    let polls_after = server
        .nginx
        .access_log()
        .expect("the access log")
        .iter()
        .filter(|e| e.request.contains("manifest.json") && e.time > warned_at)
        .count();
    assert!(
        polls_after >= 1,
        "no poll after the warning:\n{}",
        dev.log_tail()
    );
    let st = dev.status();
    assert_eq!(st["state"], json!("rebooting"), "{st:#}");
    dev.stop_daemon();
}
