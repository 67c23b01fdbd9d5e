//! updraft driven by a real DDI server: gooseBit, in its own venv, over
//! TLS on 127.0.0.1. A release bundle is uploaded through gooseBit's REST
//! API and rolled out; the device polls in DDI mode with its target token,
//! reads the bundle by Range requests, installs, reboots and reports.
//! What gooseBit records comes only from what the device sends, so the
//! order of its feedback and configData is what these tests read.

use std::time::{Duration, Instant};

use updraft::slot::SlotName;
use updraft_tests::ca::TestCa;
use updraft_tests::ddi_rig::{self, CONTROLLER, DdiAuth, Rig, TOKEN};
use updraft_tests::goosebit::{
    Assignment, DeviceAuth, DeviceInfo, DevicePatch, GooseBit, UpdateState,
};
use updraft_tests::proxy::{Behaviour, Proxy};
use updraft_tests::require_goosebit;

const WAIT: Duration = Duration::from_secs(180);
const IMAGE: usize = 3 * 1024 * 1024 + 321;
const FEED: &str = "stable";

/// gooseBit checking target tokens strictly, with the rig's device known
/// to it in rollout mode on [`FEED`].
fn goosebit(ca: &TestCa) -> GooseBit {
    let gb = GooseBit::builder(ca)
        .device_auth(DeviceAuth::Strict)
        .poll_time("00:00:01")
        .start()
        .expect("starting gooseBit");
    gb.put_devices(
        &[CONTROLLER],
        &DevicePatch {
            software: Some(Assignment::Rollout),
            feed: Some(FEED.into()),
            auth_token: Some(TOKEN.into()),
            ..DevicePatch::default()
        },
    )
    .expect("registering the device");
    gb
}

/// A device flashed with release 1.0 (its release marker says so), in DDI
/// mode against `base_url`.
fn device(name: &str, base_url: &str, gb: &GooseBit) -> Rig {
    let mut rig = Rig::new(name);
    let toml = ddi_rig::server_toml(
        base_url,
        updraft_tests::goosebit::TENANT,
        gb.ca_file(),
        DdiAuth::TargetToken,
        "1s",
    );
    let marker = rig.dev.path("release");
    std::fs::write(&marker, "UPDRAFT_RELEASE=1.0\n").expect("writing the release marker");
    let device_lines = format!("release_file = {:?}", marker.display().to_string());
    rig.dev.reconfigure(|s| {
        s.server = toml;
        s.device = device_lines;
    });
    ddi_rig::provision(&rig.dev, TOKEN);
    rig.dev.init();
    rig
}

/// Publish 1.1 as a bundle and roll it out on [`FEED`].
fn roll_out(rig: &Rig, gb: &GooseBit, seed: u64) -> u64 {
    let rel = rig.publish("1.1", seed, IMAGE, &[]);
    let bundle = rel.bundle(&rig.dev.path("release-1.1.updraft"));
    let id = gb
        .upload_software(&bundle)
        .expect("gooseBit takes the bundle");
    gb.create_rollout("to-1.1", FEED, id).expect("a rollout");
    std::fs::metadata(&bundle).map(|m| m.len()).unwrap_or(0)
}

fn info(gb: &GooseBit) -> DeviceInfo {
    gb.device(CONTROLLER)
        .expect("reading the device from gooseBit")
        .expect("gooseBit knows the device")
}

fn wait_goosebit(gb: &GooseBit, what: &str, pred: impl Fn(&DeviceInfo) -> bool) -> DeviceInfo {
    let t = Instant::now();
    loop {
        let d = info(gb);
        if pred(&d) {
            return d;
        }
        assert!(
            t.elapsed() < WAIT,
            "gooseBit never showed {what}: {d:#?}\ngooseBit log:\n{}",
            gb.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_bundle_rolled_out_by_goosebit_is_installed_and_counted_only_after_the_commit() {
    require_goosebit!();
    let ca = TestCa::new("updraft goosebit CA").expect("a test CA");
    let gb = goosebit(&ca);
    let mut rig = device("gb-cycle", &gb.base_url(), &gb);
    rig.dev.start_daemon();
    // The device registers itself with what it runs.
    wait_goosebit(&gb, "the device registered with 1.0", |d| {
        d.sw_version.as_deref() == Some("1.0") && d.last_state == UpdateState::Registered
    });
    roll_out(&rig, &gb, 31);
    rig.dev.wait_reboot_requested(WAIT);
    // Written and about to boot it: gooseBit must not count it yet.
    let d = info(&gb);
    assert_eq!(d.sw_version.as_deref(), Some("1.0"), "{d:#?}");
    assert_ne!(d.last_state, UpdateState::Finished, "{d:#?}");
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    rig.dev.wait_for("1.1 committed", WAIT, |s| {
        s["state"] == "idle" && s["running_version"] == "1.1"
    });
    let d = wait_goosebit(&gb, "the device finished with 1.1", |d| {
        d.last_state == UpdateState::Finished && d.sw_version.as_deref() == Some("1.1")
    });
    assert_eq!(
        d.hardware.map(|h| h.revision),
        Some("testboard".to_string())
    );
    let rollouts = gb.rollouts().expect("rollouts");
    assert_eq!(
        (rollouts[0].success_count, rollouts[0].failure_count),
        (1, 0),
        "{rollouts:#?}"
    );
    let log = gb.device_log(CONTROLLER).expect("the device log");
    assert!(
        log.log
            .unwrap_or_default()
            .contains("release 1.1 committed in slot B"),
        "gooseBit log: {}",
        gb.log()
    );
    // Nothing more is offered: the device stays idle on 1.1.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(rig.dev.status()["state"], "idle");
}

#[test]
fn a_release_failing_its_health_check_is_reported_as_a_failure_and_the_device_stays_on_1_0() {
    require_goosebit!();
    let ca = TestCa::new("updraft goosebit CA").expect("a test CA");
    let gb = goosebit(&ca);
    let mut rig = device("gb-rollback", &gb.base_url(), &gb);
    rig.dev
        .health_check("10-fails", "echo 'service did not come up' >&2; exit 1");
    rig.dev.start_daemon();
    roll_out(&rig, &gb, 32);
    rig.dev.wait_reboot_requested(WAIT);
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    rig.dev.wait_reboot_requested(WAIT);
    assert_eq!(rig.dev.reboot(), SlotName::A);
    rig.dev.start_daemon();
    let d = wait_goosebit(&gb, "the action failed", |d| {
        d.last_state == UpdateState::Error
    });
    assert_eq!(d.sw_version.as_deref(), Some("1.0"), "{d:#?}");
    let rollouts = gb.rollouts().expect("rollouts");
    assert_eq!(
        (rollouts[0].success_count, rollouts[0].failure_count),
        (0, 1),
        "{rollouts:#?}"
    );
    let st = rig
        .dev
        .wait_for("idle on 1.0's slot", WAIT, |s| s["state"] == "idle");
    assert_eq!(st["booted_slot"], "A");
    assert_eq!(st["last_install"]["result"], "rolled_back", "{st:#}");
}

#[test]
fn a_download_cut_mid_way_resumes_by_range_against_goosebit() {
    require_goosebit!();
    let ca = TestCa::new("updraft goosebit CA").expect("a test CA");
    let gb = goosebit(&ca);
    // Through a proxy that resets connections once they carried three
    // quarters of the bundle; gooseBit's links name the address the device
    // used.
    let proxy = Proxy::start(gb.addr()).expect("starting the proxy");
    let mut rig = device(
        "gb-resume",
        &format!("https://127.0.0.1:{}", proxy.port()),
        &gb,
    );
    rig.dev.start_daemon();
    wait_goosebit(&gb, "the device registered", |d| {
        d.last_state == UpdateState::Registered
    });
    {
        let rel = rig.publish("1.1", 33, IMAGE, &[]);
        let bundle = rel.bundle(&rig.dev.path("release-1.1.updraft"));
        let size = std::fs::metadata(&bundle).map(|m| m.len()).unwrap_or(0);
        // Past the first frame (a walk of the bundle's headers and the
        // first frames fit), short of the whole bundle.
        proxy.set_default(Behaviour::ResetAfter(size * 3 / 4));
        proxy.reset_all();
        let id = gb
            .upload_software(&bundle)
            .expect("gooseBit takes the bundle");
        gb.create_rollout("to-1.1", FEED, id).expect("a rollout");
    }
    rig.dev.wait_log("resuming at frame", WAIT);
    proxy.set_default(Behaviour::Pass);
    rig.dev.wait_reboot_requested(WAIT);
    let log = rig.dev.log();
    let resumed = log
        .lines()
        .find(|l| l.contains("resuming at frame"))
        .unwrap_or_default();
    assert!(!resumed.contains("resuming at frame 0 "), "{resumed}");
    // Each resumed transfer asked gooseBit for a Range from the first
    // frame not yet in the slot, not for the bundle again.
    let resumes: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("resuming at frame"))
        .collect();
    assert!(
        resumes.iter().all(|l| !l.contains("resuming at frame 0 ")),
        "{resumes:#?}"
    );
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    wait_goosebit(&gb, "the device finished with 1.1", |d| {
        d.last_state == UpdateState::Finished && d.sw_version.as_deref() == Some("1.1")
    });
}
