//! Slow retrieval: a server (or a path to it) that delivers just fast
//! enough never to trip the rate floor must not hold a device for weeks.
//!
//! * A download has a total deadline derived from its signed size; past
//!   it the download is abandoned and the release tried again at a later
//!   poll, the active slot untouched; that later job goes on after the
//!   frames the abandoned one left on the slot.
//! * The daemon keeps polling while a job downloads: a manifest naming
//!   another image supersedes the job, the same image changes nothing, and
//!   a poll that fails leaves the download alone.
//! * The slot is switched in only on a currently valid manifest naming its
//!   image: an expired one is fetched again before the switch.
//!
//! Downloads are slowed by the fault proxy in front of a real nginx;
//! deadlines and expiry are a few seconds, set through the configuration
//! and the publisher's `--expires`.

use std::time::Duration;

use serde_json::{Value, json};
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::Device;
use updraft_tests::outage;
use updraft_tests::proxied::{ProxiedServer, history, wait_downloading, wait_history};
use updraft_tests::proxy::Behaviour;

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: usize = 8 * 1024 * 1024;
/// About ten seconds for one of these artifacts (some 4 MB).
const SLOW: u64 = 400_000;
/// A few frames, so the slot has been written to.
const UNDER_WAY: u64 = 1_500_000;

fn sha(bytes: &[u8]) -> Sha256 {
    Sha256::of(bytes)
}

/// Wait until the daemon asked for the reboot into a new release; returns
/// the status then.
fn wait_rebooting(dev: &Device) -> Value {
    dev.wait_reboot_requested(WAIT);
    dev.wait_for("the rebooting state", WAIT, |s| {
        s["state"] == json!("rebooting")
    })
}

/// Wait until a job ended before its switch, or a reboot was asked for
/// (which the test then refuses with a clear message).
fn wait_job_failed(dev: &Device) -> Value {
    let st = dev.wait_for("the job to end before its switch", WAIT, |s| {
        s["state"] == json!("rebooting")
            || (s["state"] == json!("idle") && s["last_install"]["result"] == json!("failed"))
    });
    assert_eq!(
        st["state"],
        json!("idle"),
        "the slot was switched in: {st:#}\n{}",
        dev.log_tail()
    );
    st
}

/// Slot B written in part, not bootable; slot A untouched and next; the
/// daemon still running.
fn assert_active_slot_kept(dev: &mut Device, slot_a: Sha256, st: &Value) {
    assert_eq!(sha(&dev.slot_bytes(SlotName::A)), slot_a, "slot A changed");
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(st["slots"][1]["bootable"], json!(false), "{st:#}");
    assert!(!dev.reboot_marker.exists(), "a reboot was requested");
    assert!(
        dev.daemon_running(),
        "the daemon exited:\n{}",
        dev.log_tail()
    );
}

#[test]
fn a_download_past_its_deadline_is_abandoned_and_retried_at_a_later_poll() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("deadline", false);
    ps.publish("1.0", 11, IMAGE, &[]);
    let size = ps.artifact_size();
    ps.drip(SLOW);
    // 2 s plus the size at 2 MB/s: about 5 s, half the time the drip needs.
    let mut dev = ps.device(
        "deadline",
        "1h",
        "download_allowance = \"2s\"\ndownload_min_average_rate = 2000000\n",
    );
    let a = sha(&dev.slot_bytes(SlotName::A));
    dev.start_daemon();
    let st = wait_job_failed(&dev);
    let reason = st["last_install"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("release 1.0 into slot B: download abandoned at its deadline "),
        "{reason}"
    );
    assert!(
        reason.contains(&format!(" bytes received (deadline: server.download_allowance 2s + {size} bytes at server.download_min_average_rate 2000000 bytes/s; slow retrieval)")),
        "{reason}"
    );
    let received: u64 = reason
        .split(": ")
        .nth(2)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {reason:?}"));
    assert!(received > 0 && received < size, "{reason}");
    assert!(
        reason.contains(&format!("{received} of {size} bytes received")),
        "{reason}"
    );
    assert_active_slot_kept(&mut dev, a, &st);
    // Failed like any download out of retries: no retry within the job,
    // the next attempt after a backoff.
    let log = dev.log();
    assert!(!log.contains("resuming later"), "{}", dev.log_tail());
    assert!(
        log.contains("install attempt 1 failed; next check in"),
        "{}",
        dev.log_tail()
    );
    let failed: Vec<Value> = history(&dev)
        .into_iter()
        .filter(|e| e["event"] == json!("failed"))
        .collect();
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["detail"], json!(reason));
    dev.stop_daemon();
}

/// A download abandoned at its deadline keeps what it wrote: the next job
/// of the same release goes on after the frames the first one left on the
/// slot instead of fetching the artifact again from its first frame, and
/// the image is verified whole before the switch. Under a drip that no
/// download from frame 0 outruns within its deadline, the release is
/// installed all the same.
#[test]
fn the_job_after_an_abandoned_download_resumes_where_it_ended() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("deadline-resume", false);
    let v1 = ps.publish("1.0", 12, IMAGE, &[]);
    let size = ps.artifact_size();
    const DRIP: u64 = 600_000;
    // 3 s plus the size at 2 MB/s: about 5 s; the whole artifact at the
    // drip's rate takes about 7 s.
    let deadline_ms = 3_000 + size * 1_000 / 2_000_000;
    assert!(size * 1_000 / DRIP > deadline_ms, "{size} bytes");
    ps.drip(DRIP);
    let mut dev = ps.device(
        "deadline-resume",
        "1s",
        "download_allowance = \"3s\"\ndownload_min_average_rate = 2000000\n",
    );
    dev.start_daemon();
    let st = wait_rebooting(&dev);
    let failed = history(&dev)
        .into_iter()
        .filter(|e| e["event"] == json!("failed"))
        .count();
    assert!(failed >= 1, "no attempt was abandoned:\n{}", dev.log_tail());
    let log = dev.log();
    let resumed = log
        .lines()
        .find(|l| l.contains("frames are on the slot from an earlier attempt"))
        .unwrap_or_else(|| panic!("the next job started from frame 0:\n{}", dev.log_tail()));
    let kept: u64 = resumed
        .split("release 1.0 slot B: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no frame count in {resumed:?}"));
    assert!(kept > 0, "{resumed}");
    let received = st["job"]["bytes_downloaded"].as_u64().unwrap_or(u64::MAX);
    assert!(
        received < size,
        "the second job received {received} bytes of a {size}-byte artifact"
    );
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v1[..]);
    dev.stop_daemon();
}

#[test]
fn a_newer_release_published_during_a_download_supersedes_it() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("supersede", true);
    ps.publish("1.0", 11, IMAGE, &[]);
    ps.drip(SLOW);
    let mut dev = ps.device("supersede", "1s", "");
    let a = sha(&dev.slot_bytes(SlotName::A));
    dev.start_daemon();
    wait_downloading(&dev, UNDER_WAY, WAIT);
    let v2 = ps.publish("2.0", 22, IMAGE, &[]);
    // The 1.0 download keeps its slow connection; new ones are fast.
    ps.proxy.set_default(Behaviour::Pass);
    let st = wait_rebooting(&dev);
    assert_eq!(st["job"]["version"], json!("2.0"), "{st:#}");
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v2[..]);
    assert_eq!(sha(&dev.slot_bytes(SlotName::A)), a, "slot A changed");
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    let ended = wait_history(&dev, "the superseded job", WAIT, |e| {
        e["event"] == json!("superseded")
    });
    assert_eq!(ended["release"], json!("1.0"));
    assert_eq!(ended["slot"], json!("B"));
    assert_eq!(ended["detail"], json!("superseded by release 2.0 serial 2"));
    let report = ps.wait_report("the install result of 1.0", WAIT, |r| {
        r["kind"] == json!("install") && r["job"]["release"] == json!("1.0")
    });
    assert_eq!(report["result"], json!("failed"));
    assert_eq!(
        report["reason"],
        json!("superseded by release 2.0 serial 2")
    );
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}

#[test]
fn a_poll_during_a_download_that_finds_the_same_image_changes_nothing() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("same-image", false);
    let v1 = ps.publish("1.0", 11, IMAGE, &[]);
    ps.drip(SLOW);
    let mut dev = ps.device("same-image", "1s", "");
    dev.start_daemon();
    let during = wait_downloading(&dev, UNDER_WAY, WAIT);
    // Published again: serial 2, the same image.
    ps.publish("1.0", 11, IMAGE, &[]);
    dev.wait_log(
        "check during the download of release 1.0: manifest serial 2 names the image being downloaded; nothing changes",
        WAIT,
    );
    let seen = dev.status();
    assert_eq!(seen["state"], json!("downloading"), "{seen:#}");
    assert_eq!(seen["job"]["id"], during["job"]["id"], "{seen:#}");
    let st = wait_rebooting(&dev);
    // What the poll learnt is kept: the serial.
    assert_eq!(st["serial"], json!(2), "{st:#}");
    assert_eq!(
        st["job"]["id"], during["job"]["id"],
        "the job was restarted"
    );
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v1[..]);
    let events: Vec<Value> = history(&dev)
        .into_iter()
        .map(|e| e["event"].clone())
        .collect();
    assert_eq!(
        events.iter().filter(|e| **e == json!("download")).count(),
        1,
        "{events:?}"
    );
    assert!(!events.contains(&json!("superseded")), "{events:?}");
    assert!(
        !dev.log().contains("resuming at frame"),
        "{}",
        dev.log_tail()
    );
    dev.stop_daemon();
}

#[test]
fn a_poll_failing_during_a_download_does_not_disturb_it() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("poll-fails", false);
    let v1 = ps.publish("1.0", 11, IMAGE, &[]);
    ps.drip(SLOW);
    // The stalled poll must time out well before the dripped download
    // ends (about ten seconds): a 2 s stall timeout, and the stall begins
    // a second into the download. The download's drip never pauses that
    // long, so it is not cut by the shorter timeout.
    let mut spec = ps.device_spec("1s", "");
    spec.server = spec
        .server
        .replace("stall_timeout = \"5s\"", "stall_timeout = \"2s\"");
    let mut dev = Device::new("poll-fails", spec);
    dev.init();
    dev.start_daemon();
    let during = wait_downloading(&dev, SLOW, WAIT);
    // The download's connection stays; a poll's new connection hangs
    // until its timeouts.
    ps.only_the_download_passes(Behaviour::Stall);
    wait_history(&dev, "a failed check", WAIT, |e| {
        e["event"] == json!("check-failed")
    });
    let st = wait_rebooting(&dev);
    assert_eq!(st["job"]["id"], during["job"]["id"]);
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v1[..]);
    let log = dev.log();
    assert!(!log.contains("resuming at frame"), "{}", dev.log_tail());
    assert!(!log.contains("resuming later"), "{}", dev.log_tail());
    assert!(
        log.contains("check during the download of release 1.0: "),
        "{}",
        dev.log_tail()
    );
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}

#[test]
fn a_job_whose_manifest_expired_before_the_switch_is_not_switched_in() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("expired", false);
    ps.drip(SLOW);
    let mut dev = ps.device("expired", "1h", "");
    let a = sha(&dev.slot_bytes(SlotName::A));
    ps.publish("1.0", 11, IMAGE, &["--expires", "4s"]);
    dev.start_daemon();
    let st = wait_job_failed(&dev);
    let reason = st["last_install"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(
            "release 1.0 into slot B: not switching to slot B: the manifest of release 1.0 (serial 1) expired at "
        ),
        "{reason}"
    );
    assert!(
        reason.contains(" and fetching it again failed: manifest serial 1 expired at "),
        "{reason}"
    );
    assert!(
        reason.ends_with("refusing a possibly frozen update server"),
        "{reason}"
    );
    // Slot B holds the whole verified image, but is not switched in.
    assert_active_slot_kept(&mut dev, a, &st);
    let failed = wait_history(&dev, "the failed job", WAIT, |e| {
        e["event"] == json!("failed")
    });
    assert_eq!(failed["detail"], json!(reason));
    dev.stop_daemon();
}

#[test]
fn a_republished_manifest_naming_the_same_image_lets_the_switch_happen() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("republished", false);
    ps.drip(SLOW);
    let mut dev = ps.device("republished", "1h", "");
    let v1 = ps.publish("1.0", 11, IMAGE, &["--expires", "4s"]);
    dev.start_daemon();
    wait_downloading(&dev, UNDER_WAY, WAIT);
    // Signed again for the same image, valid for the default 30 days.
    ps.publish("1.0", 11, IMAGE, &[]);
    let st = wait_rebooting(&dev);
    assert_eq!(st["job"]["version"], json!("1.0"));
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v1[..]);
    // The switch rested on the manifest fetched again.
    assert_eq!(st["serial"], json!(2), "{st:#}");
    assert!(
        dev.log().contains(
            "release 1.0 slot B: manifest serial 2 names the same image and is valid until "
        ),
        "{}",
        dev.log_tail()
    );
    dev.stop_daemon();
}

#[test]
fn a_manifest_naming_another_image_at_the_switch_installs_that_release() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("switch-newer", false);
    ps.drip(SLOW);
    let mut dev = ps.device("switch-newer", "1h", "");
    let a = sha(&dev.slot_bytes(SlotName::A));
    ps.publish("1.0", 11, IMAGE, &["--expires", "4s"]);
    dev.start_daemon();
    wait_downloading(&dev, UNDER_WAY, WAIT);
    let v2 = ps.publish("2.0", 22, IMAGE, &[]);
    ps.proxy.set_default(Behaviour::Pass);
    let st = wait_rebooting(&dev);
    assert_eq!(st["job"]["version"], json!("2.0"), "{st:#}");
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v2[..]);
    assert_eq!(sha(&dev.slot_bytes(SlotName::A)), a, "slot A changed");
    let ended = wait_history(&dev, "the superseded job", WAIT, |e| {
        e["event"] == json!("superseded")
    });
    assert_eq!(ended["release"], json!("1.0"));
    assert_eq!(ended["detail"], json!("superseded by release 2.0 serial 2"));
    dev.stop_daemon();
}

/// A black hole in the middle of a download: every connection accepted,
/// nothing answered, for longer than eight attempts take (the budget of
/// earlier releases; 30 minutes on a device, here with one-second
/// timeouts). The download waits it out: no failure is recorded or
/// reported, the job is the same, it resumes where the verified frames
/// end (at most one frame crosses the network twice), and the release is
/// installed.
#[test]
fn a_black_hole_in_the_middle_of_a_download_is_waited_out() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("black-hole", true);
    let v1 = ps.publish("1.0", 13, IMAGE, &[]);
    ps.drip(SLOW);
    let mut spec = ps.device_spec("1s", "");
    spec.server = spec
        .server
        .replace("stall_timeout = \"5s\"", "stall_timeout = \"1s\"")
        .replace("connect_timeout = \"5s\"", "connect_timeout = \"1s\"");
    let mut dev = Device::new("black-hole", spec);
    dev.init();
    dev.start_daemon();
    let during = wait_downloading(&dev, UNDER_WAY, WAIT);
    // The network goes.
    ps.proxy.set_default(Behaviour::Stall);
    ps.proxy.reset_all();
    outage::wait_failed_attempts(&dev, 10, WAIT);
    outage::assert_waiting_for_network(&dev, &during);
    // The network comes back.
    ps.proxy.set_default(Behaviour::Pass);
    let st = wait_rebooting(&dev);
    assert_eq!(st["job"]["id"], during["job"]["id"]);
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &v1[..]);
    let events: Vec<Value> = history(&dev)
        .into_iter()
        .map(|e| e["event"].clone())
        .collect();
    assert!(!events.contains(&json!("failed")), "{events:?}");
    let failures = ps
        .server
        .collector
        .as_ref()
        .expect("a collector")
        .reports()
        .iter()
        .filter_map(|r| r.json().ok())
        .filter(|r| r["kind"] == json!("install") && r["result"] == json!("failed"))
        .count();
    assert_eq!(failures, 0, "an install failure was reported");
    outage::assert_at_most_one_frame_twice(&st, &ps.server.repo.payload());
    dev.stop_daemon();
}
