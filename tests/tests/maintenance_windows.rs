//! When a verified release is switched in and rebooted into: the
//! operator's policy (`[policy] switch`, `reboot`, `windows`) and
//! `updraft apply`.
//!
//! * A release written outside its maintenance window waits, slot out of
//!   the boot order and no reboot, and is switched in when the window opens.
//! * `updraft apply` lets a held release through at once.
//! * A held slot survives a reboot (a power cut): it stays written and
//!   waiting, and is hashed again before its switch; a slot changed on the
//!   medium meanwhile is refused and the job fails, nothing switched.
//! * A manifest naming another image drops the held slot.
//! * `policy.write` holds the download itself until `updraft apply`.
//! * Malformed windows are refused with the key and the line; local
//!   windows across a daylight-saving change open as documented.
//!
//! Real nginx (through the pass-through proxy), real daemon processes; the
//! clock is the machine's, except for the daylight-saving case, where
//! libfaketime sets the time of the one `updraft status` it runs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use updraft::slot::SlotName;
use updraft::timestamp::Timestamp;
use updraft_tests::device::Device;
use updraft_tests::proxied::{ProxiedServer, history, wait_history};

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: usize = 4 * 1024 * 1024;

/// A device on `ps` polling every `poll` with `policy` as its `[policy]`.
fn device(ps: &ProxiedServer, name: &str, poll: &str, policy: &str) -> Device {
    let mut spec = ps.device_spec(poll, "");
    spec.slot_size = IMAGE as u64;
    spec.policy = policy.to_string();
    let dev = Device::new(name, spec);
    dev.init();
    dev
}

/// Wait until the daemon holds a verified release; returns the status.
fn wait_held(dev: &Device) -> Value {
    let st = dev.wait_for("a verified release held by the policy", WAIT, |s| {
        s["state"] == json!("installed") && s["policy"]["held_since"].is_string()
    });
    assert_eq!(st["next_boot"], json!("A"), "held, yet switched: {st:#}");
    assert_eq!(st["slots"][1]["bootable"], json!(false), "{st:#}");
    assert!(
        !dev.reboot_marker.exists(),
        "a reboot was requested while held"
    );
    st
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A weekly UTC window starting at the first whole minute at least 60 s
/// from now (time for the install first, under an emulator too),
/// `length` long; returns its text and when it opens.
fn window_soon(length: &str) -> (String, i64) {
    let opens = (now() + 60).div_euclid(60) * 60 + 60;
    let day = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]
        [opens.div_euclid(86_400).rem_euclid(7) as usize];
    let secs = opens.rem_euclid(86_400);
    (
        format!(
            "{day} {:02}:{:02}/{length} UTC",
            secs / 3600,
            secs / 60 % 60
        ),
        opens,
    )
}

#[test]
fn a_release_written_outside_a_window_is_switched_only_when_it_opens() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("window-opens", false);
    ps.publish("1.0", 21, IMAGE, &[]);
    let (window, opens) = window_soon("30m");
    let mut dev = device(
        &ps,
        "window-opens",
        "1h",
        &format!("reboot = \"window\"\nwindows = [{window:?}]\nboot_time = \"1m\"\n"),
    );
    dev.start_daemon();
    let st = wait_held(&dev);
    assert_eq!(st["policy"]["switch"], json!("window"), "{st:#}");
    assert_eq!(st["policy"]["window"]["open"], json!(false), "{st:#}");
    assert_eq!(
        st["policy"]["window"]["opens"],
        json!(Timestamp(opens).to_string()),
        "{st:#}"
    );
    assert!(
        dev.ok(&["status"])
            .contains(&format!("next window {}", Timestamp(opens))),
        "{}",
        dev.ok(&["status"])
    );
    dev.wait_reboot_requested(Duration::from_secs(240));
    assert!(
        now() >= opens,
        "rebooted before the window opened at {}",
        Timestamp(opens)
    );
    let st = dev.status();
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    assert!(
        dev.log()
            .contains("verifying the slot again before the switch"),
        "{}",
        dev.log_tail()
    );
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    dev.wait_for("release 1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    dev.stop_daemon();
}

#[test]
fn updraft_apply_switches_a_held_release_at_once() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("apply", false);
    ps.publish("1.0", 22, IMAGE, &[]);
    let mut dev = device(&ps, "apply", "1h", "reboot = \"manual\"\n");
    let out = dev.fails(&["apply"]);
    assert!(
        out.contains("nothing waits to be applied (state idle)"),
        "{out}"
    );
    dev.start_daemon();
    let st = wait_held(&dev);
    assert_eq!(st["policy"]["switch"], json!("manual"), "{st:#}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !dev.reboot_marker.exists(),
        "rebooted without `updraft apply`"
    );
    let out = dev.ok(&["apply"]);
    assert!(
        out.contains("release 1.0: switching to slot B and rebooting"),
        "{out}"
    );
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.status()["next_boot"], json!("B"));
    dev.stop_daemon();
}

#[test]
fn a_held_slot_survives_a_power_cut_and_is_verified_again_before_its_switch() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("held-cut", false);
    ps.publish("1.0", 23, IMAGE, &[]);
    let mut dev = device(&ps, "held-cut", "1h", "switch = \"manual\"\n");
    dev.start_daemon();
    let before = wait_held(&dev);
    dev.kill_daemon();
    // Power on again: the bootloader boots A (B is out of the order).
    assert_eq!(dev.reboot(), SlotName::A);
    dev.start_daemon();
    let st = wait_held(&dev);
    assert_eq!(
        st["policy"]["held_since"], before["policy"]["held_since"],
        "{st:#}"
    );
    assert_eq!(st["job"]["id"], before["job"]["id"], "{st:#}");
    dev.ok(&["apply"]);
    dev.wait_reboot_requested(WAIT);
    assert!(
        dev.log()
            .contains("verifying the slot again before the switch"),
        "{}",
        dev.log_tail()
    );
    assert_eq!(dev.status()["next_boot"], json!("B"));
    dev.stop_daemon();
}

#[test]
fn a_held_slot_changed_on_the_medium_is_refused_at_its_switch() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("held-changed", false);
    ps.publish("1.0", 24, IMAGE, &[]);
    let mut dev = device(&ps, "held-changed", "1h", "switch = \"manual\"\n");
    dev.start_daemon();
    wait_held(&dev);
    // One bit flips on the medium while the slot waits.
    let mut b = std::fs::read(&dev.slot_b).unwrap();
    b[IMAGE / 2] ^= 0x01;
    std::fs::write(&dev.slot_b, &b).unwrap();
    dev.ok(&["apply"]);
    let st = dev.wait_for("the job to fail", WAIT, |s| {
        s["state"] == json!("idle") && s["last_install"]["result"] == json!("failed")
    });
    let reason = st["last_install"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("re-verified after the hold"), "{reason}");
    assert!(reason.contains("sha256"), "{reason}");
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert!(!dev.reboot_marker.exists(), "rebooted into a changed slot");
    dev.stop_daemon();
}

#[test]
fn a_release_the_write_gate_holds_is_not_downloaded_until_updraft_apply() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("write-manual", false);
    ps.publish("1.0", 27, IMAGE, &[]);
    let size = ps.artifact_size();
    let mut dev = device(&ps, "write-manual", "1h", "write = \"manual\"\n");
    dev.start_daemon();
    let st = dev.wait_for("the release seen and held before its download", WAIT, |s| {
        s["policy"]["pending_release"] == json!("1.0")
    });
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    assert_eq!(st["policy"]["write"], json!("manual"), "{st:#}");
    assert_eq!(st["policy"]["waiting_for"], json!("operator"), "{st:#}");
    let sent = ps.proxy.totals().to_client;
    assert!(
        sent < size / 2,
        "{sent} bytes sent before apply: the artifact?"
    );
    let out = dev.ok(&["check"]);
    assert!(
        out.contains("release 1.0 waits for `updraft apply` to be downloaded"),
        "{out}"
    );
    assert!(
        dev.ok(&["status"])
            .contains("release 1.0 waits to be downloaded"),
        "{}",
        dev.ok(&["status"])
    );
    let out = dev.ok(&["apply"]);
    assert!(out.contains("release 1.0: downloading it now"), "{out}");
    // The switch gate is "auto": written, switched and rebooted into.
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.status()["next_boot"], json!("B"));
    dev.stop_daemon();
}

#[test]
fn a_manifest_naming_another_image_drops_the_held_slot() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("held-superseded", false);
    ps.publish("1.0", 25, IMAGE, &[]);
    let mut dev = device(&ps, "held-superseded", "1s", "switch = \"manual\"\n");
    dev.start_daemon();
    wait_held(&dev);
    ps.publish("2.0", 26, IMAGE, &[]);
    wait_history(&dev, "the held 1.0 superseded", WAIT, |e| {
        e["event"] == json!("superseded")
    });
    let st = dev.wait_for("release 2.0 held", WAIT, |s| {
        s["state"] == json!("installed")
            && s["job"]["version"] == json!("2.0")
            && s["policy"]["held_since"].is_string()
    });
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert!(
        history(&dev)
            .iter()
            .any(|e| e["event"] == json!("superseded")
                && e["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("superseded by release 2.0")),
        "{:#?}",
        history(&dev)
    );
    dev.stop_daemon();
}

#[test]
fn malformed_windows_are_refused_with_the_key_and_line() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("window-bad", false);
    let mut dev = device(&ps, "window-bad", "1h", "");
    for (policy, want) in [
        (
            "reboot = \"window\"\nwindows = [\"Mon-Fri 2:00/3h\"]\n",
            "policy.windows (line ",
        ),
        (
            "switch = \"window\"\n",
            "policy.switch: \"window\" needs at least one window",
        ),
        ("switch = \"nightly\"\n", "policy.switch (line "),
        (
            "write = \"window\"\n",
            "policy.write: \"window\" needs at least one window",
        ),
        ("max_rate = \"fast\"\n", "policy.max_rate (line "),
        (
            "windows = [\"Mon 00:00/7d\"]\nwindow_rate = \"4 MiB\"\n",
            "policy.window_rate (line ",
        ),
    ] {
        dev.reconfigure(|s| s.policy = policy.into());
        let out = dev.updraft(&["status"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{policy}: accepted");
        assert!(err.contains(want), "{policy}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_local_window_in_the_spring_forward_gap_opens_at_the_jump() {
    if updraft_tests::bin::emulated() {
        updraft_tests::skip_expected!(
            "libfaketime cannot be preloaded into a binary running under qemu-user"
        );
    }
    updraft_tests::require!("lib:faketime/libfaketime.so.1");
    updraft_tests::require!("nginx", "/usr/share/zoneinfo/Europe/Berlin");
    let Some(lib) = updraft_tests::faketime::library() else {
        panic!("libfaketime is missing: install the Debian package libfaketime");
    };
    let ps = ProxiedServer::start("window-dst", false);
    let dev = device(
        &ps,
        "window-dst",
        "1h",
        "switch = \"window\"\nwindows = [\"Sun 02:30/3h\"]\n",
    );
    // Saturday 2027-03-27 in Berlin; that night 02:00 CET jumps to 03:00
    // CEST (01:00 UTC), so 02:30 does not exist.
    let status = |fake: &str| -> Value {
        let out = dev
            .cmd(&["status", "--json"])
            .env("TZ", "Europe/Berlin")
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME", fake)
            .env("DONT_FAKE_MONOTONIC", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let st = status("@2027-03-27 12:00:00");
    let w = &st["policy"]["window"];
    assert_eq!(w["opens"], json!("2027-03-28T01:00:00Z"), "{st:#}");
    assert_eq!(
        w["closes"],
        json!("2027-03-28T04:00:00Z"),
        "three elapsed hours: {st:#}"
    );
    // A week later, summer time: 02:30 CEST is 00:30 UTC.
    let st = status("@2027-03-29 12:00:00");
    assert_eq!(
        st["policy"]["window"]["opens"],
        json!("2027-04-04T00:30:00Z"),
        "{st:#}"
    );
}

#[test]
fn without_a_daemon_apply_switches_the_held_slot_and_leaves_the_reboot() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("apply-offline", false);
    ps.publish("1.0", 27, IMAGE, &[]);
    let mut dev = device(&ps, "apply-offline", "1h", "reboot = \"manual\"\n");
    dev.start_daemon();
    wait_held(&dev);
    dev.stop_daemon();
    let out = dev.updraft(&["apply"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("slot B boots next for a trial; reboot to try it"),
        "{stdout}"
    );
    assert!(
        stderr.contains("verifying the slot again before the switch"),
        "{stderr}"
    );
    assert!(
        !dev.reboot_marker.exists(),
        "apply without a daemon ran the reboot command"
    );
    assert_eq!(dev.status()["next_boot"], json!("B"));
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    dev.wait_for("release 1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    dev.stop_daemon();
}

/// The same through a real power cut: the device's storage (slots, state,
/// boot selection) is a filesystem that drops every write not yet synced
/// when the power goes, and the daemon dies with it. The held slot, its
/// job and its hold survive; the slot is hashed again before its switch.
#[test]
fn a_held_slot_survives_a_power_cut_that_drops_unsynced_writes() {
    updraft_tests::require!("nginx");
    if let Some(why) = updraft_tests::powerfs::unavailable() {
        updraft_tests::skip!("{why}");
    }
    let ps = ProxiedServer::start("held-powerfs", false);
    ps.publish("1.0", 25, IMAGE, &[]);
    let scratch = updraft_tests::tmp::TempDir::new("held-powerfs-disk");
    let disk = scratch.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mut fs =
        updraft_tests::powerfs::PowerFs::mount(&disk).expect("mounting the power-cut filesystem");
    let mut spec = ps.device_spec("1h", "");
    spec.slot_size = IMAGE as u64;
    spec.policy = "switch = \"manual\"\n".into();
    spec.disk = Some(disk.clone());
    let mut dev = Device::new("held-powerfs", spec);
    dev.init();
    fs.sync_all();
    dev.start_daemon();
    let before = wait_held(&dev);
    fs.kill_on_cut(dev.daemon_pid().expect("daemon pid"));
    fs.cut_now();
    dev.kill_daemon();
    fs.restore_power().expect("power on");
    assert_eq!(dev.reboot(), SlotName::A);
    dev.start_daemon();
    let st = wait_held(&dev);
    assert_eq!(st["job"]["id"], before["job"]["id"], "{st:#}");
    assert_eq!(
        st["policy"]["held_since"], before["policy"]["held_since"],
        "{st:#}"
    );
    dev.ok(&["apply"]);
    dev.wait_reboot_requested(WAIT);
    assert!(
        dev.log()
            .contains("verifying the slot again before the switch"),
        "{}",
        dev.log_tail()
    );
    assert_eq!(dev.status()["next_boot"], json!("B"));
    dev.stop_daemon();
}
