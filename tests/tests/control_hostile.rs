//! Hostile local users against the control socket: a member of the
//! socket's group who connects and never finishes a request must neither
//! stall the daemon nor turn a passing health run into a rollback, and
//! must not keep root from being answered.

use std::time::{Duration, Instant};

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::hostile_client::{self, Drip};
use updraft_tests::publisher::{Repo, image, keygen};
use updraft_tests::tmp::TempDir;

const IMAGE: usize = 1024 * 1024 + 333;

/// Twelve connections (more than the daemon holds) drip a byte every
/// 0.4 s for 32 s while a 20-second health check runs after a trial boot.
/// The daemon drops each connection after its 2-second request deadline,
/// refuses those beyond its limit, answers root's `status` in under a
/// second throughout, and commits the release.
#[test]
fn a_dripping_local_user_neither_stalls_the_daemon_nor_fails_a_passing_health_run() {
    if let Some(why) = hostile_client::unavailable() {
        updraft_tests::skip!("{why}");
    }
    let keys = TempDir::new("drip-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.system = "socket_group = \"nogroup\"\n".into();
    spec.health = "timeout = \"26s\"\ncheck_timeout = \"26s\"\n".into();
    let mut dev = Device::new("drip", spec);
    dev.init();
    let usb = Repo::new(dev.path("usb"));
    let img = dev.path("1.0.img");
    let bytes = image(&img, IMAGE, 7);
    usb.release(&[&key], "1.0", &img, &[]);
    let out = dev.install(&usb.manifest_str());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dev.health_check("10-slow", "sleep 20");
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();

    let drip = Drip::start(
        &dev.socket,
        12,
        Duration::from_secs(32),
        Duration::from_millis(400),
    );
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    let mut answers = 0;
    let mut committed_after = None;
    while started.elapsed() < Duration::from_secs(33) {
        let t = Instant::now();
        let out = dev.updraft(&["status", "--json"]);
        let took = t.elapsed();
        assert!(
            out.status.success(),
            "root's status failed after {:?} of the attack: {}\n{}",
            started.elapsed(),
            String::from_utf8_lossy(&out.stderr),
            dev.log_tail()
        );
        assert!(
            took < Duration::from_secs(1),
            "root's status took {took:?} after {:?} of the attack\n{}",
            started.elapsed(),
            dev.log_tail()
        );
        worst = worst.max(took);
        answers += 1;
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        if committed_after.is_none()
            && st["state"] == json!("idle")
            && st["running_version"] == json!("1.0")
        {
            committed_after = Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let report = drip.finish();
    eprintln!(
        "drip: {} connections, {} bytes; root's status answered {answers} times, worst {worst:?}; committed after {committed_after:?}",
        report.connects, report.bytes
    );
    assert!(dev.daemon_running(), "the daemon died:\n{}", dev.log_tail());
    let committed_after = committed_after.unwrap_or_else(|| {
        panic!(
            "the release was not committed during the attack:\n{}",
            dev.log_tail()
        )
    });
    assert!(
        committed_after < Duration::from_secs(30),
        "committed only after {committed_after:?}"
    );
    // The attacker kept coming back: far more connections than slots.
    assert!(report.connects > 40, "{report:?}");
    let log = dev.log();
    assert!(
        log.contains("control: dropped a client of uid 65534: no complete request within 2000 ms"),
        "{}",
        dev.log_tail()
    );
    assert!(
        log.contains("the last slot is kept for root"),
        "{}",
        dev.log_tail()
    );
    assert!(!log.contains("did not finish within"), "{}", dev.log_tail());
    let st = dev.status();
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    assert_eq!(st["running_version"], json!("1.0"), "{st:#}");
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &bytes[..]);
    let vars = dev.boot_vars();
    assert_eq!(vars["BOOT_ORDER"], "B A", "{vars:?}");
    dev.stop_daemon();
}
