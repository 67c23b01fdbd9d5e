//! A device fresh from the factory runs a release its store does not
//! know. Its first poll must not download that same image into the other
//! slot and reboot into it:
//!
//! * With a release marker (`device.release_file`) naming the manifest's
//!   release, the release is recorded as running, with no slot read.
//! * Without one, the booted slot's first `image.size` bytes are hashed
//!   once; equal to the signed image, the release is recorded as running.
//! * Either way nothing is written to the other slot, no reboot is asked
//!   for, history says `running` and a `running` report reaches the fleet.
//!   A marker naming another release installs the manifest's as before.
//!
//! Real nginx behind the fault proxy, real daemons, the report collector.

use std::io::{Seek, SeekFrom, Write};
use std::time::Duration;

use serde_json::{Value, json};
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::Device;
use updraft_tests::proxied::{ProxiedServer, history, wait_history};

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: usize = 4 * 1024 * 1024;

/// A device on `ps` whose release marker is `marker` (none when `None`),
/// polling every second.
fn device(ps: &ProxiedServer, name: &str, marker: Option<&str>) -> Device {
    let mut spec = ps.device_spec("1s", "");
    let mut dev = Device::new(name, spec.clone());
    let path = dev.path("etc-updraft-release");
    if let Some(text) = marker {
        std::fs::write(&path, text).unwrap();
    }
    spec.device = format!("release_file = {:?}", path.display().to_string());
    dev.reconfigure(|s| *s = spec);
    dev.init();
    dev
}

/// Write `image` at the start of slot A, as the factory flashes it.
fn flash_slot_a(dev: &Device, image: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&dev.slot_a)
        .unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(image).unwrap();
    f.sync_all().unwrap();
}

/// Wait until release 1.0 is recorded as running; check what must not
/// have happened and return the status.
fn wait_running_untouched(dev: &Device, slot_b: Sha256) -> Value {
    wait_history(dev, "release 1.0 running", WAIT, |e| {
        e["event"] == json!("running") && e["release"] == json!("1.0")
    });
    let st = dev.status();
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    assert_eq!(st["running_version"], json!("1.0"), "{st:#}");
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(
        Sha256::of(&dev.slot_bytes(SlotName::B)),
        slot_b,
        "slot B was written"
    );
    assert!(!dev.reboot_marker.exists(), "a reboot was requested");
    let events: Vec<Value> = history(dev)
        .into_iter()
        .map(|e| e["event"].clone())
        .collect();
    assert!(!events.contains(&json!("download")), "{events:?}");
    st
}

#[test]
fn a_device_flashed_with_the_release_installs_nothing_and_reports_it_running() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("flashed", true);
    let v1 = ps.publish("1.0", 21, IMAGE, &[]);
    let mut dev = device(&ps, "flashed", None);
    flash_slot_a(&dev, &v1);
    let slot_b = Sha256::of(&dev.slot_bytes(SlotName::B));
    dev.start_daemon();
    wait_running_untouched(&dev, slot_b);
    let report = ps.wait_report("the running report", WAIT, |r| {
        r["kind"] == json!("running")
    });
    assert_eq!(report["release"], json!("1.0"), "{report:#}");
    assert_eq!(report["booted_slot"], json!("A"), "{report:#}");
    assert_eq!(
        report["image_sha256"],
        json!(Sha256::of(&v1).to_hex()),
        "{report:#}"
    );
    assert!(
        report["evidence"]
            .as_str()
            .unwrap_or("")
            .contains("hash to the signed image"),
        "{report:#}"
    );
    // Later polls know the release from the store: the slot is hashed once.
    let answer = dev.ok(&["check"]);
    assert!(
        answer.contains("manifest serial 1 is unchanged; release 1.0 is running"),
        "{answer}"
    );
    let log = dev.log();
    assert_eq!(
        log.matches("no install recorded; hashing its first")
            .count(),
        1,
        "{}",
        dev.log_tail()
    );
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}

#[test]
fn a_release_marker_names_the_running_release_without_reading_the_slot() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("marker", false);
    ps.publish("1.0", 22, IMAGE, &[]);
    // Slot A holds other bytes (a read-write root never hashes equal):
    // the marker alone says what it runs.
    let mut dev = device(
        &ps,
        "marker",
        Some("# written by the image recipe\nUPDRAFT_RELEASE=\"1.0\"\n"),
    );
    let slot_b = Sha256::of(&dev.slot_bytes(SlotName::B));
    dev.start_daemon();
    wait_running_untouched(&dev, slot_b);
    let h = history(&dev);
    let running = h.iter().find(|e| e["event"] == json!("running")).unwrap();
    assert!(
        running["detail"]
            .as_str()
            .unwrap_or("")
            .contains("its release marker"),
        "{running:#}"
    );
    assert!(
        !dev.log().contains("hashing its first"),
        "{}",
        dev.log_tail()
    );
    dev.stop_daemon();
}

#[test]
fn a_marker_naming_another_release_installs_the_manifests_as_before() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("marker-older", false);
    let v1 = ps.publish("1.0", 23, IMAGE, &[]);
    let mut dev = device(&ps, "marker-older", Some("UPDRAFT_RELEASE=0.9\n"));
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v1[..]);
    let events: Vec<Value> = history(&dev)
        .into_iter()
        .map(|e| e["event"].clone())
        .collect();
    assert!(!events.contains(&json!("running")), "{events:?}");
    dev.stop_daemon();
}

#[test]
fn a_malformed_marker_is_named_in_the_log_and_the_release_installed() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("marker-bad", false);
    ps.publish("1.0", 24, IMAGE, &[]);
    let mut dev = device(&ps, "marker-bad", Some("UPDRAFT_RELEASE=1.0\ngarbage\n"));
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    let log = dev.log();
    assert!(
        log.contains("etc-updraft-release: line 2: expected KEY=VALUE"),
        "{}",
        dev.log_tail()
    );
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}
