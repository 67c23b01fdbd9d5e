//! The whole update cycle against real parts: the daemon polls nginx over
//! TLS, installs, asks for a reboot, and after the (simulated) reboot runs
//! its health checks and commits or rolls back; reports reach a collector.
//!
//! A reboot is: the reboot command leaves a marker; the test gives the
//! device a new boot id, runs the boot script the bootloader would run
//! (for U-Boot with the real `fw_setenv`), writes the chosen slot into the
//! command line and starts the daemon again.

use std::time::Duration;

use serde_json::{Value, json};
use updraft::slot::SlotName;
use updraft_tests::device::{BootSpec, Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);
const IMAGE: usize = 5 * 1024 * 1024 + 777;

struct Rig {
    dev: Device,
    server: UpdateServer,
    key: KeyPair,
    _keys: TempDir,
}

fn rig(name: &str, boot: BootSpec) -> Rig {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.boot = boot;
    let dev = Device::new(name, spec);
    let server = UpdateServer::start(&dev.path("site"), true);
    let mut dev = dev;
    let server_toml = server.server_toml("2s", "1s");
    dev.reconfigure(|s| s.server = server_toml);
    dev.init();
    Rig {
        dev,
        server,
        key,
        _keys: keys,
    }
}

impl Rig {
    /// Publish `version` with an image made from `seed`.
    fn publish(&self, version: &str, seed: u64) -> Vec<u8> {
        let path = self.dev.path(&format!("{version}.img"));
        let bytes = image(&path, IMAGE, seed);
        self.server.repo.release(&[&self.key], version, &path, &[]);
        bytes
    }

    /// Wait until the daemon installed `version` and asked for a reboot.
    fn wait_installed(&self, version: &str) -> Value {
        self.dev.wait_reboot_requested(WAIT);
        let st = self.dev.wait_for("the rebooting state", WAIT, |s| {
            s["state"] == json!("rebooting")
        });
        assert_eq!(st["job"]["version"], json!(version), "{st:#}");
        st
    }

    /// Reboot, start the daemon, wait until it settles on `version`.
    fn reboot_and_settle(&mut self, version: &str) -> Value {
        self.dev.reboot();
        self.dev.start_daemon();
        self.dev
            .wait_for(&format!("release {version} committed"), WAIT, |s| {
                s["state"] == json!("idle") && s["running_version"] == json!(version)
            })
    }

    fn reports(&self) -> Vec<Value> {
        self.server
            .collector
            .as_ref()
            .expect("collector")
            .unique_reports()
            .iter()
            .filter_map(|r| r.json().ok())
            .collect()
    }

    /// Wait for an install report with this result.
    fn wait_install_report(&self, result: &str) -> Value {
        let t = std::time::Instant::now();
        while t.elapsed() < WAIT {
            if let Some(r) = self
                .reports()
                .into_iter()
                .find(|r| r["kind"] == json!("install") && r["result"] == json!(result))
            {
                return r;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "no install report with result {result:?}; reports: {:#?}\nlog:\n{}",
            self.reports(),
            self.dev.log_tail()
        );
    }
}

#[test]
fn the_daemon_discovers_installs_and_commits_a_release() {
    updraft_tests::require!("nginx");
    let mut r = rig("discover", BootSpec::File);
    let metrics = r.dev.path("metrics/updraft.prom");
    std::fs::create_dir_all(metrics.parent().unwrap()).unwrap();
    let m = metrics.clone();
    r.dev
        .reconfigure(|s| s.system = format!("metrics_file = {m:?}\n"));
    let v1 = r.publish("1.0", 11);
    r.dev.start_daemon();
    let st = r.wait_installed("1.0");
    assert_eq!(st["job"]["target"], json!("B"));
    assert_eq!(st["slots"][1]["version"], json!("1.0"));
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    assert_eq!(
        &r.dev.slot_bytes(SlotName::B)[..IMAGE],
        &v1[..],
        "slot B does not hold the image"
    );
    let st = r.reboot_and_settle("1.0");
    assert_eq!(st["booted_slot"], json!("B"));
    assert_eq!(st["next_boot"], json!("B"));
    let rep = r.wait_install_report("committed");
    assert_eq!(rep["job"]["release"], json!("1.0"));
    // The metrics file node_exporter reads says the same.
    let text = std::fs::read_to_string(&metrics).expect("the metrics file");
    for line in [
        "updraft_release_info{slot=\"B\",version=\"1.0\"} 1",
        "updraft_booted_slot{slot=\"B\"} 1",
        "updraft_state{state=\"idle\"} 1",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }

    assert!(rep["duration_s"].as_i64().is_some());
    assert!(rep["bytes_downloaded"].as_u64().unwrap() > 0);
    // Every report carries the idempotency key it was sent with.
    for rep in r.server.collector.as_ref().unwrap().reports() {
        let body = rep.json().unwrap();
        assert_eq!(
            rep.idempotency_key.as_deref(),
            body["idempotency_key"].as_str()
        );
    }
}

/// Scenario 1: v1 → v2, health passes → committed, bootloader final, report
/// delivered.
#[test]
fn update_with_passing_health_checks_is_committed() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let mut r = rig("commit", BootSpec::Uboot);
    r.dev.health_check("10-ok", "test -n \"$UPDRAFT_VERSION\"");
    r.publish("1.0", 11);
    r.dev.start_daemon();
    r.wait_installed("1.0");
    r.reboot_and_settle("1.0");
    let v2 = r.publish("2.0", 22);
    r.dev.ok(&["check"]);
    let st = r.wait_installed("2.0");
    assert_eq!(st["job"]["target"], json!("A"));
    r.reboot_and_settle("2.0");
    assert_eq!(&r.dev.slot_bytes(SlotName::A)[..IMAGE], &v2[..]);
    let env = r.dev.boot_vars();
    assert_eq!(env["BOOT_ORDER"], "A B", "{env:?}");
    assert_eq!(env["BOOT_A_LEFT"], "3", "{env:?}");
    // The old slot stays bootable as a fallback.
    assert_eq!(env["BOOT_B_LEFT"], "3", "{env:?}");
    let rep = r.wait_install_report("committed");
    assert!(
        r.reports().iter().any(|x| x["kind"] == json!("install")
            && x["job"]["release"] == json!("2.0")
            && x["result"] == json!("committed")),
        "{rep:#}"
    );
}

/// Scenario 2: v2's health check fails → back on v1; the environment shows
/// it; the reason reaches the server; later polls do not reinstall v2.
#[test]
fn failing_health_check_rolls_back_and_is_not_retried() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let mut r = rig("health-fail", BootSpec::Uboot);
    r.dev.health_check(
        "20-service",
        "if [ \"$UPDRAFT_VERSION\" = 2.0 ]; then echo 'payment service did not start' >&2; exit 1; fi",
    );
    r.publish("1.0", 11);
    r.dev.start_daemon();
    r.wait_installed("1.0");
    r.reboot_and_settle("1.0");
    r.publish("2.0", 22);
    r.dev.ok(&["check"]);
    r.wait_installed("2.0");
    // Boot into v2: the health check fails and the daemon asks for a
    // reboot back into v1.
    let booted = r.dev.reboot();
    assert_eq!(booted, SlotName::A);
    r.dev.start_daemon();
    r.dev.wait_reboot_requested(WAIT);
    let env = r.dev.boot_vars();
    assert_eq!(
        env["BOOT_ORDER"], "B",
        "slot A still in the boot order: {env:?}"
    );
    assert_eq!(env["BOOT_A_LEFT"], "0", "{env:?}");
    let booted = r.dev.reboot();
    assert_eq!(booted, SlotName::B, "the boot script did not go back to v1");
    r.dev.start_daemon();
    let st = r.dev.wait_for("rolled back to 1.0", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    assert_eq!(st["booted_slot"], json!("B"));
    let rep = r.wait_install_report("rolled_back");
    assert!(
        rep["reason"]
            .as_str()
            .unwrap_or("")
            .contains("payment service did not start"),
        "{rep:#}"
    );
    // Several more polls: v2 is not installed again.
    let polls_before = manifest_requests(&r);
    let t = std::time::Instant::now();
    while manifest_requests(&r) < polls_before + 3 {
        assert!(
            t.elapsed() < WAIT,
            "the daemon stopped polling:\n{}",
            r.dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = r.dev.status();
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    assert_eq!(st["running_version"], json!("1.0"));
    assert!(
        !r.dev.reboot_marker.exists(),
        "a reboot was requested again"
    );
    let history = r.dev.ok(&["history"]);
    assert_eq!(
        history.matches("download").count(),
        2,
        "v2 was downloaded again after its rollback:\n{history}"
    );
}

fn manifest_requests(r: &Rig) -> usize {
    r.server
        .nginx
        .access_log()
        .unwrap_or_default()
        .iter()
        .filter(|e| e.uri == "/manifest.json")
        .count()
}

/// Scenario 3: the new slot never comes up; the boot script uses up its
/// attempts and falls back; the daemon reports RolledBack.
#[test]
fn a_slot_that_never_boots_is_rolled_back_by_the_bootloader() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let mut r = rig("never-boots", BootSpec::Uboot);
    r.publish("1.0", 11);
    r.dev.start_daemon();
    r.wait_installed("1.0");
    r.dev.stop_daemon();
    // Three attempts at slot B, each dying before userspace.
    for attempt in 1..=3 {
        assert_eq!(r.dev.boot_script(), Some(SlotName::B), "attempt {attempt}");
    }
    let env = r.dev.boot_vars();
    assert_eq!(env["BOOT_B_LEFT"], "0", "{env:?}");
    // The fourth power-on falls back to A.
    let booted = r.dev.reboot();
    assert_eq!(booted, SlotName::A);
    r.dev.start_daemon();
    let rep = r.wait_install_report("rolled_back");
    assert!(
        rep["reason"]
            .as_str()
            .unwrap_or("")
            .contains("slot B did not boot"),
        "{rep:#}"
    );
    let st = r
        .dev
        .wait_for("idle on A", WAIT, |s| s["state"] == json!("idle"));
    assert_eq!(st["booted_slot"], json!("A"));
    assert_eq!(st["next_boot"], json!("A"));
    // And it does not try again.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !r.dev.reboot_marker.exists(),
        "reinstalled a release the bootloader rejected"
    );
}

/// Scenario 4: the daemon is killed after requesting the reboot but before
/// it happens (same boot id): it requests the reboot again and concludes
/// nothing.
#[test]
fn a_restart_before_the_reboot_requests_it_again() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let mut r = rig("same-boot-id", BootSpec::Uboot);
    r.publish("1.0", 11);
    r.dev.start_daemon();
    r.wait_installed("1.0");
    r.dev.kill_daemon();
    std::fs::remove_file(&r.dev.reboot_marker).unwrap();
    r.dev.start_daemon();
    r.dev.wait_reboot_requested(WAIT);
    let st = r.dev.status();
    assert_eq!(st["state"], json!("rebooting"), "{st:#}");
    assert_eq!(st["booted_slot"], json!("A"));
    let history = r.dev.ok(&["history"]);
    assert!(!history.contains("rolled-back"), "{history}");
    assert!(!history.contains("trial-boot"), "{history}");
    // The trial is still armed.
    let env = r.dev.boot_vars();
    assert_eq!(env["BOOT_ORDER"], "B A", "{env:?}");
    assert_eq!(env["BOOT_B_LEFT"], "3", "{env:?}");
    r.reboot_and_settle("1.0");
}

/// The power goes while the bootloader's environment is being switched to
/// the verified slot: the `script` bootloader's `trial` kills the daemon
/// (SIGKILL, nothing after it runs) before its write, or after it. On the
/// next boot the old slot may boot (the write did not land) or the new one
/// (it did). Neither says the image cannot boot: the first switches again
/// and reboots, the second tests it; both commit, nothing is rejected.
#[test]
fn a_power_cut_during_the_switch_neither_rejects_nor_loses_the_release() {
    updraft_tests::require!("nginx");
    for (case, write_landed) in [("cut-before-switch", false), ("cut-after-switch", true)] {
        let mut r = rig(case, BootSpec::File);
        let state = r.dev.path("boot-select.state");
        let cut = r.dev.path("cut-at-trial");
        let kill = format!(
            r#"if [ "$1" = trial ] && [ -f {cut:?} ]; then rm -f {cut:?}; kill -KILL $PPID; exit 1; fi"#
        );
        let (before, after) = if write_landed {
            (String::new(), kill)
        } else {
            (kill, String::new())
        };
        let script = r.dev.path("boot-select");
        updraft_tests::tmp::write_executable(
            &script,
            &updraft_tests::bootenv::shell_script_bootloader(&state, &before, &after),
        );
        r.dev.reconfigure(|s| s.boot = BootSpec::script(&script));
        std::fs::write(&cut, "").expect("arming the cut");
        r.publish("1.0", 11);
        r.dev.start_daemon();
        let t = std::time::Instant::now();
        while cut.exists() || r.dev.daemon_running() {
            assert!(
                t.elapsed() < WAIT,
                "{case}: the daemon did not reach the switch\n{}",
                r.dev.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r.dev.kill_daemon();
        let selection = std::fs::read_to_string(&state).unwrap_or_default();
        assert_eq!(
            selection.contains("O=\"B A\""),
            write_landed,
            "{case}: the selection at the cut:\n{selection}"
        );
        // Power on: the bootloader boots what the selection says.
        let first = if write_landed {
            SlotName::B
        } else {
            SlotName::A
        };
        r.dev.reboot_into(first);
        r.dev.start_daemon();
        if !write_landed {
            // Back on the old slot: the switch is made again, and the
            // reboot into the new slot requested.
            r.wait_installed("1.0");
            let history = r.dev.ok(&["history"]);
            assert!(!history.contains("rolled-back"), "{case}: {history}");
            r.dev.reboot_into(SlotName::B);
            r.dev.start_daemon();
        }
        let st = r
            .dev
            .wait_for(&format!("{case}: 1.0 committed"), WAIT, |s| {
                s["state"] == json!("idle") && s["running_version"] == json!("1.0")
            });
        assert_eq!(st["booted_slot"], json!("B"), "{case}: {st:#}");
        let rep = r.wait_install_report("committed");
        assert_eq!(rep["job"]["release"], json!("1.0"), "{case}: {rep:#}");
        assert!(
            !r.reports()
                .iter()
                .any(|r| r["result"] == json!("rolled_back")),
            "{case}: a rollback was reported: {:#?}",
            r.reports()
        );
        r.dev.stop_daemon();
    }
}

/// Scenario 5: ordinary reboots after a commit leave the committed slot
/// first, with its counter restored every time.
#[test]
fn ordinary_reboots_keep_the_committed_slot_first() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let mut r = rig("reboots", BootSpec::Uboot);
    r.publish("1.0", 11);
    r.dev.start_daemon();
    r.wait_installed("1.0");
    r.reboot_and_settle("1.0");
    for n in 1..=3 {
        let booted = r.dev.reboot();
        assert_eq!(booted, SlotName::B, "reboot {n}");
        r.dev.start_daemon();
        r.dev
            .wait_for("idle", WAIT, |s| s["state"] == json!("idle"));
        // The boot script counted the boot; the daemon restored the count.
        let t = std::time::Instant::now();
        loop {
            let env = r.dev.boot_vars();
            if env["BOOT_B_LEFT"] == "3" {
                assert_eq!(env["BOOT_ORDER"], "B A", "reboot {n}: {env:?}");
                break;
            }
            assert!(
                t.elapsed() < WAIT,
                "reboot {n}: counter not restored: {env:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The same rollback with GRUB: one try, then the fallback.
#[test]
fn grub_rollback_after_a_failed_health_check() {
    updraft_tests::require!("nginx", "grub-editenv");
    let mut r = rig("grub-rollback", BootSpec::Grub);
    r.dev.health_check("10-fail", "exit 1");
    r.publish("1.0", 11);
    r.dev.start_daemon();
    r.wait_installed("1.0");
    // The log says the try GRUB gives, not the configured count.
    let log = r.dev.log();
    assert!(
        log.contains("release 1.0 slot B: first in the boot order for a trial boot (1 try)"),
        "{}",
        r.dev.log_tail()
    );
    assert_eq!(r.dev.reboot(), SlotName::B);
    r.dev.start_daemon();
    r.dev.wait_reboot_requested(WAIT);
    let env = r.dev.boot_vars();
    assert_eq!(env["B_OK"], "0", "{env:?}");
    assert_eq!(env["ORDER"], "A", "{env:?}");
    assert_eq!(r.dev.reboot(), SlotName::A);
    r.dev.start_daemon();
    let rep = r.wait_install_report("rolled_back");
    assert!(
        rep["reason"]
            .as_str()
            .unwrap_or("")
            .contains("health check 10-fail failed"),
        "{rep:#}"
    );
}

/// An operator rolls the fleet back by publishing a newer manifest (higher
/// serial) that points at the older image: a legitimate downgrade.
#[test]
fn an_operator_downgrade_with_a_higher_serial_is_installed() {
    updraft_tests::require!("nginx");
    let mut r = rig("downgrade", BootSpec::File);
    let v1 = r.publish("1.0", 11);
    r.dev.start_daemon();
    r.wait_installed("1.0");
    r.reboot_and_settle("1.0");
    r.publish("2.0", 22);
    r.dev.ok(&["check"]);
    r.wait_installed("2.0");
    r.reboot_and_settle("2.0");
    // Re-publish 1.0: the publisher gives it the next serial.
    r.publish("1.0", 11);
    assert_eq!(r.server.repo.payload()["serial"], json!(3));
    r.dev.ok(&["check"]);
    r.wait_installed("1.0");
    let st = r.reboot_and_settle("1.0");
    assert_eq!(st["serial"], json!(3));
    let slot = if st["booted_slot"] == json!("A") {
        SlotName::A
    } else {
        SlotName::B
    };
    assert_eq!(&r.dev.slot_bytes(slot)[..IMAGE], &v1[..]);
}

/// `updraft install` with a daemon running hands the job to the daemon
/// (here from a local directory, as from a USB stick) and follows it.
#[test]
fn install_hands_the_job_to_the_running_daemon() {
    updraft_tests::require!("nginx");
    let mut r = rig("handover", BootSpec::File);
    let usb = updraft_tests::publisher::Repo::new(r.dev.path("usb"));
    let img = r.dev.path("usb-1.0.img");
    let bytes = image(&img, IMAGE, 44);
    usb.release(&[&r.key], "1.0", &img, &[]);
    r.dev.start_daemon();
    // A relative path works too: the CLI passes the daemon an absolute one.
    let out = r
        .dev
        .cmd(&["install", "usb/manifest.json"])
        .current_dir(r.dev.dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("installed release 1.0 in slot B"),
        "{stdout}"
    );
    r.dev.wait_reboot_requested(WAIT);
    assert_eq!(&r.dev.slot_bytes(SlotName::B)[..IMAGE], &bytes[..]);
    assert!(r.dev.log().contains("installing release 1.0") || r.dev.log().contains("release 1.0"));
    r.reboot_and_settle("1.0");
}

/// With `system.reboot = "manual"` the daemon installs, then waits for an
/// operator to reboot instead of running the reboot command.
#[test]
fn manual_reboot_waits_for_the_operator() {
    updraft_tests::require!("nginx");
    let mut r = rig("manual-reboot", BootSpec::File);
    r.dev
        .reconfigure(|s| s.system = "reboot = \"manual\"\n".into());
    r.publish("1.0", 11);
    r.dev.start_daemon();
    r.dev.wait_for("the rebooting state", WAIT, |s| {
        s["state"] == json!("rebooting")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !r.dev.reboot_marker.exists(),
        "the reboot command ran in manual mode"
    );
    assert!(
        r.dev
            .log()
            .contains("waiting for an operator to reboot into slot B"),
        "{}",
        r.dev.log_tail()
    );
    // The operator reboots.
    r.reboot_and_settle("1.0");
}
