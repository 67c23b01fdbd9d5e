//! `updraft cancel`: an operator stops an update before it is rebooted into.
//!
//! * Mid-download, the write stops; the boot selection is left exactly as
//!   it was (the target out of the boot order since its first write, the
//!   running slot first), the running slot is byte-identical, and the job
//!   ends as `cancelled` in the history and the install result. Polls do
//!   not start the release again; `updraft install` does.
//! * A written slot waiting for `updraft apply` is dropped.
//! * A slot switched in but not yet rebooted into is switched back, and no
//!   reboot happens.
//! * With nothing in progress, cancel says so and changes nothing.
//!
//! Real nginx (through the pass-through proxy), real daemon processes, and
//! for the boot selection Debian's `fw_printenv` reading a U-Boot
//! environment.

use std::time::Duration;

use serde_json::{Value, json};
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::{BootSpec, Device};
use updraft_tests::proxied::{ProxiedServer, history, wait_downloading};

const WAIT: Duration = Duration::from_secs(120);

/// A device on `ps` polling hourly (the first poll comes within its
/// jitter), slots for `image` bytes, `policy` and `system` as its sections.
fn device(ps: &ProxiedServer, name: &str, image: usize, policy: &str, system: &str) -> Device {
    let mut spec = ps.device_spec("1h", "");
    spec.slot_size = image as u64;
    spec.boot = BootSpec::Uboot;
    spec.policy = policy.to_string();
    spec.system = system.to_string();
    let dev = Device::new(name, spec);
    dev.init();
    dev
}

/// Wait for the cancelled job to settle; returns the status.
fn wait_cancelled(dev: &Device) -> Value {
    dev.wait_for("the job to end as cancelled", WAIT, |s| {
        s["state"] == json!("idle") && s["last_install"]["result"] == json!("cancelled")
    })
}

fn cancelled_in_history(dev: &Device) -> Value {
    history(dev)
        .into_iter()
        .find(|e| e["event"] == json!("cancelled"))
        .unwrap_or_else(|| panic!("no cancelled entry: {:#?}", history(dev)))
}

#[test]
fn cancel_mid_download_leaves_the_boot_selection_and_the_active_slot_untouched() {
    updraft_tests::require!("nginx", "fw_printenv");
    let ps = ProxiedServer::start("cancel-download", false);
    // Half noise: an artifact of some 12 MB, over ten seconds at the cap.
    const IMAGE: usize = 24 * 1024 * 1024;
    ps.publish("1.0", 31, IMAGE, &[]);
    let size = ps.artifact_size();
    let mut dev = device(&ps, "cancel-download", IMAGE, "max_rate = \"1Mi\"\n", "");
    let active = Sha256::of(&dev.slot_bytes(SlotName::A));
    dev.start_daemon();
    wait_downloading(&dev, size / 4, WAIT);
    // Frames are being written: B left the boot order at the first one.
    let during = dev.boot_vars();
    let out = dev.ok(&["cancel"]);
    assert!(out.contains("release 1.0 slot B: cancelled"), "{out}");
    let st = wait_cancelled(&dev);
    // The artifact's connection is closed, and nothing more arrives
    // (what was in flight when it closed is let through first).
    std::thread::sleep(Duration::from_secs(1));
    let sent = ps.proxy.totals().to_client;
    assert!(
        sent < size,
        "the whole artifact was sent ({sent} of {size} bytes)"
    );
    let open: Vec<_> = ps
        .proxy
        .connections()
        .into_iter()
        .filter(|c| c.open && c.to_client > size / 8)
        .collect();
    assert!(
        open.is_empty(),
        "the download's connection is still open: {open:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        ps.proxy.totals().to_client,
        sent,
        "the download went on after the cancel"
    );
    assert_eq!(
        dev.boot_vars(),
        during,
        "the cancel changed the boot selection"
    );
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(st["slots"][1]["bootable"], json!(false), "{st:#}");
    assert_eq!(
        st["last_install"]["reason"],
        json!(
            "cancelled by the operator: downloading stopped; the partly written slot stays out of the boot order"
        ),
        "{st:#}"
    );
    assert_eq!(
        Sha256::of(&dev.slot_bytes(SlotName::A)),
        active,
        "the active slot changed"
    );
    let e = cancelled_in_history(&dev);
    assert_eq!(e["release"], json!("1.0"), "{e:#}");
    assert!(
        e["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("downloading stopped"),
        "{e:#}"
    );
    assert!(!dev.reboot_marker.exists(), "a reboot was requested");

    // The same image is not started again by a poll...
    let out = dev.ok(&["check"]);
    assert!(
        out.contains("release 1.0 was cancelled by the operator"),
        "{out}"
    );
    assert_eq!(dev.status()["state"], json!("idle"));
    // ...but an operator's install starts it.
    let out = dev.ok(&["install", &ps.manifest_url()]);
    assert!(out.contains("installed release 1.0 in slot B"), "{out}");
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();
}

#[test]
fn cancel_drops_a_written_slot_waiting_for_its_switch() {
    updraft_tests::require!("nginx", "fw_printenv");
    let ps = ProxiedServer::start("cancel-held", false);
    const IMAGE: usize = 4 * 1024 * 1024;
    ps.publish("1.0", 32, IMAGE, &[]);
    let mut dev = device(&ps, "cancel-held", IMAGE, "switch = \"manual\"\n", "");
    dev.start_daemon();
    dev.wait_for("a verified release held by the policy", WAIT, |s| {
        s["state"] == json!("installed") && s["policy"]["held_since"].is_string()
    });
    let during = dev.boot_vars();
    let out = dev.ok(&["cancel"]);
    assert!(
        out.contains("the written slot is dropped and stays out of the boot order"),
        "{out}"
    );
    let st = wait_cancelled(&dev);
    assert_eq!(
        dev.boot_vars(),
        during,
        "the cancel changed the boot selection"
    );
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(st["slots"][1]["version"], Value::Null, "{st:#}");
    let out = dev.fails(&["apply"]);
    assert!(out.contains("nothing waits to be applied"), "{out}");
    assert!(!dev.reboot_marker.exists(), "a reboot was requested");
    dev.stop_daemon();
}

#[test]
fn cancel_after_the_switch_switches_back_without_a_reboot() {
    updraft_tests::require!("nginx", "fw_printenv");
    let ps = ProxiedServer::start("cancel-switched", false);
    const IMAGE: usize = 4 * 1024 * 1024;
    ps.publish("1.0", 33, IMAGE, &[]);
    let mut dev = device(&ps, "cancel-switched", IMAGE, "", "reboot = \"manual\"\n");
    let before = dev.boot_vars();
    dev.start_daemon();
    let st = dev.wait_for("the switch, waiting for a manual reboot", WAIT, |s| {
        s["state"] == json!("rebooting")
    });
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    let out = dev.ok(&["cancel"]);
    assert!(
        out.contains("release 1.0 slot B: cancelled; switched back to slot A, no reboot"),
        "{out}"
    );
    let st = wait_cancelled(&dev);
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(st["slots"][1]["bootable"], json!(false), "{st:#}");
    let after = dev.boot_vars();
    let order = after.get("BOOT_ORDER").cloned().unwrap_or_default();
    assert!(
        order.starts_with('A') && !order.contains('B'),
        "BOOT_ORDER={order}: {after:?} (before the update {before:?})"
    );
    assert!(!dev.reboot_marker.exists(), "a reboot was requested");
    // The machine does not reboot into it on its own afterwards either.
    assert_eq!(dev.reboot(), SlotName::A);
    dev.stop_daemon();
}

#[test]
fn cancel_with_nothing_in_progress_says_so() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("cancel-idle", false);
    let mut dev = ps.device("cancel-idle", "1h", "");
    let before = dev.snapshot();
    let out = dev.fails(&["cancel"]);
    assert!(out.contains("nothing to cancel (state idle)"), "{out}");
    dev.start_daemon();
    let out = dev.fails(&["cancel"]);
    assert!(out.contains("nothing to cancel (state idle)"), "{out}");
    dev.stop_daemon();
    before.assert_unchanged(&dev.snapshot());
}
