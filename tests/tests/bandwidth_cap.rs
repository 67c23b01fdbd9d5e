//! The bandwidth cap (`policy.max_rate`): an update must not take the whole
//! of a cellular or shared link.
//!
//! * The artifact arrives at the cap: measured by the proxy between nginx
//!   and the daemon, over the steady part of the transfer, within 10 %.
//! * Under the cap a download cut mid-way still resumes at the last
//!   verified frame, and a link slower than the slow-retrieval floor is
//!   still abandoned as slow retrieval.
//! * A cap below the floor can never be met: the daemon refuses to start
//!   and names the key.

use std::time::{Duration, Instant};

use serde_json::json;
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::Device;
use updraft_tests::proxied::ProxiedServer;
use updraft_tests::proxy::Behaviour;

const WAIT: Duration = Duration::from_secs(180);
const CAP: u64 = 4 << 20;

/// A device polling hourly (the first poll comes within its jitter) with
/// `policy` as its `[policy]` and slots for an image of `image` bytes.
fn capped_device(
    ps: &ProxiedServer,
    name: &str,
    image: usize,
    policy: &str,
    extra: &str,
) -> Device {
    let mut spec = ps.device_spec("1h", extra);
    spec.slot_size = image as u64;
    spec.policy = policy.to_string();
    let dev = Device::new(name, spec);
    dev.init();
    dev
}

fn wait_installed(dev: &Device) {
    dev.wait_reboot_requested(WAIT);
    dev.wait_for("the rebooting state", WAIT, |s| {
        s["state"] == json!("rebooting")
    });
}

/// The rate at which the proxy delivered the steady part of an artifact
/// of `size` bytes, the first byte after `before` of its total: from 30 %
/// to 90 %. Before it, the throttle's first burst and the daemon's socket
/// buffer filling up (the kernel grows it to several MiB on loopback)
/// arrive faster than the cap; after it the buffer drains while the proxy
/// has nothing left to send.
fn steady_rate(ps: &ProxiedServer, dev: &Device, before: u64, size: u64) -> f64 {
    let (lo, hi) = (before + size * 3 / 10, before + size * 9 / 10);
    let mut first: Option<(Instant, u64)> = None;
    let t = Instant::now();
    loop {
        assert!(
            t.elapsed() < WAIT,
            "the download did not pass 90 % in {WAIT:?}\n{}",
            dev.log_tail()
        );
        let now = Instant::now();
        let sent = ps.proxy.totals().to_client;
        if first.is_none() && sent >= lo {
            first = Some((now, sent));
        }
        if let (Some((t0, b0)), true) = (first, sent >= hi) {
            let rate = (sent - b0) as f64 / (now - t0).as_secs_f64();
            eprintln!(
                "artifact {size} bytes: {} bytes in {:.2} s = {rate:.0} B/s through the proxy",
                sent - b0,
                (now - t0).as_secs_f64(),
            );
            return rate;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_capped_download_arrives_at_the_cap() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("cap-rate", false);
    // Half of this image is noise zstd cannot shrink: an artifact of some
    // 36 MB, nine seconds at the cap.
    const IMAGE: usize = 72 * 1024 * 1024;
    let img = ps.publish("1.0", 7, IMAGE, &[]);
    let size = ps.artifact_size();
    let mut dev = capped_device(&ps, "cap-rate", IMAGE, "max_rate = \"4Mi\"\n", "");
    let before = ps.proxy.totals().to_client;
    dev.start_daemon();

    let rate = steady_rate(&ps, &dev, before, size);
    assert!(
        (rate - CAP as f64).abs() <= CAP as f64 * 0.10,
        "measured {rate:.0} B/s against a cap of {CAP} B/s"
    );

    wait_installed(&dev);
    dev.stop_daemon();
    assert!(
        dev.slot_bytes(SlotName::B)[..IMAGE] == img[..],
        "slot B does not hold the image"
    );
}

#[test]
fn inside_a_maintenance_window_the_window_rate_applies() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("cap-window", false);
    // As large as the max_rate test's: a shorter transfer leaves the
    // socket buffer's growth a larger share of the measured span.
    const IMAGE: usize = 72 * 1024 * 1024;
    ps.publish("1.0", 10, IMAGE, &[]);
    let size = ps.artifact_size();
    // A window open all week long: the download starts inside it.
    let mut dev = capped_device(
        &ps,
        "cap-window",
        IMAGE,
        "max_rate = \"1Mi\"\nwindow_rate = \"4Mi\"\nwindows = [\"Mon 00:00/7d UTC\"]\n",
        "",
    );
    let before = ps.proxy.totals().to_client;
    dev.start_daemon();
    let rate = steady_rate(&ps, &dev, before, size);
    assert!(
        (rate - CAP as f64).abs() <= CAP as f64 * 0.10,
        "measured {rate:.0} B/s inside the window, window_rate {CAP} B/s (max_rate 1 MiB/s)"
    );
    wait_installed(&dev);
    dev.stop_daemon();
}

#[test]
fn under_the_cap_a_cut_download_resumes_at_the_last_verified_frame() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("cap-resume", false);
    const IMAGE: usize = 16 * 1024 * 1024;
    let img = ps.publish("1.0", 8, IMAGE, &[]);
    // The first connection carries the manifest and then the artifact:
    // cut it a third of the way in.
    ps.proxy
        .script([Behaviour::ResetAfter(ps.artifact_size() / 3)]);
    let mut dev = capped_device(&ps, "cap-resume", IMAGE, "max_rate = \"2Mi\"\n", "");
    let a = Sha256::of(&dev.slot_bytes(SlotName::A));
    dev.start_daemon();
    wait_installed(&dev);
    dev.stop_daemon();
    let log = dev.log();
    assert!(
        log.contains("resuming at frame"),
        "no resume in the log:\n{log}"
    );
    assert!(
        dev.slot_bytes(SlotName::B)[..IMAGE] == img[..],
        "slot B does not hold the image"
    );
    assert_eq!(
        Sha256::of(&dev.slot_bytes(SlotName::A)),
        a,
        "the active slot changed"
    );
}

#[test]
fn under_the_cap_a_link_slower_than_the_floor_is_still_abandoned() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("cap-floor", false);
    const IMAGE: usize = 8 * 1024 * 1024;
    ps.publish("1.0", 9, IMAGE, &[]);
    ps.drip(4_000);
    let mut dev = capped_device(
        &ps,
        "cap-floor",
        IMAGE,
        "max_rate = \"1M\"\n",
        "min_rate = 20000\nmin_rate_window = \"2s\"\n",
    );
    let a = Sha256::of(&dev.slot_bytes(SlotName::A));
    dev.start_daemon();
    dev.wait_for("the slow download to be abandoned", WAIT, |_| {
        dev.log().contains("slow retrieval")
    });
    dev.stop_daemon();
    let st = dev.status();
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(
        Sha256::of(&dev.slot_bytes(SlotName::A)),
        a,
        "the active slot changed"
    );
}

#[test]
fn a_cap_below_the_slow_retrieval_floor_is_refused_at_start() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("cap-refused", false);
    let mut dev = ps.device("cap-refused", "1h", "min_rate = 20000\n");
    dev.reconfigure(|s| s.policy = "max_rate = \"10k\"\n".into());
    // The configuration is refused at start, naming both keys; the daemon
    // stays up degraded (no restart loop) rather than running with it.
    dev.start_daemon();
    let want = "policy.max_rate: 10000 bytes/s is below server.min_rate (20000 bytes/s)";
    let t = std::time::Instant::now();
    while !dev.log().contains(want) {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{}",
            dev.log_tail()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let log = dev.log();
    assert!(log.contains("running degraded"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(dev.daemon_running(), "{log}");
    // The CLI reads the same configuration and says the same.
    let err = dev.fails(&["status"]);
    assert!(err.contains(want), "{err}");
    dev.stop_daemon();
}
