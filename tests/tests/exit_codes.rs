//! The exit statuses scripts rely on (docs/cli.md, "Exit status"), each
//! produced by the situation it names, against real nginx and real daemon
//! processes:
//!
//! * 0: `check --wait` that installs and commits an app without a reboot;
//!   every success without `--wait`, as before.
//! * 1: `check --wait` whose release fails its health check and is rolled
//!   back.
//! * 2: a command line that cannot be understood.
//! * 3: a daemon that runs degraded.
//! * 4: `check --wait` and `install --wait` with nothing to do.
//! * 5: `install --wait` without a daemon (the operator's reboot finishes
//!   it) and `check --wait` whose daemon reboots into the release.
//! * 6: `check --wait` whose download the policy holds, and `install
//!   --wait` whose switch it holds.

use std::time::Duration;

use serde_json::json;
use updraft_tests::apps::{
    app_device_polling, health_needs_healthy_file, publish_apps, write_tree,
};
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::proxied::{ProxiedServer, wait_history};
use updraft_tests::publisher::keygen;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: usize = 1 << 20;

fn device(ps: &ProxiedServer, name: &str, policy: &str) -> Device {
    let mut spec = ps.device_spec("1h", "");
    spec.slot_size = IMAGE as u64;
    spec.policy = policy.to_string();
    let dev = Device::new(name, spec);
    dev.init();
    dev
}

#[test]
fn a_command_line_that_cannot_be_understood_exits_2() {
    let keys = TempDir::new("exit-usage-keys");
    let key = keygen(keys.path(), "release");
    let dev = Device::new("exit-usage", DeviceSpec::simple(&key));
    let out = dev.exits(2, &["check", "--wait=yes"]);
    assert!(out.contains("--wait takes no value"), "{out}");
    let out = dev.exits(2, &["status", "--wait"]);
    assert!(out.contains("unknown option --wait for status"), "{out}");
}

#[test]
fn a_degraded_daemon_answers_check_with_3() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("exit-degraded", false);
    let mut dev = device(&ps, "exit-degraded", "");
    let aside = ps.key.public.with_extension("aside");
    std::fs::rename(&ps.key.public, &aside).expect("moving the trusted key aside");
    dev.start_daemon();
    let out = dev.exits(3, &["check", "--wait"]);
    assert!(out.contains("degraded since"), "{out}");
    assert!(out.contains(&ps.key.public.display().to_string()), "{out}");
    std::fs::rename(&aside, &ps.key.public).expect("putting the key back");
    dev.stop_daemon();
}

#[test]
fn installs_tell_nothing_to_do_from_a_reboot_to_finish_them() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("exit-reboot", false);
    ps.publish("1.0", 41, IMAGE, &[]);
    let url = ps.manifest_url();
    let mut dev = device(&ps, "exit-reboot", "");

    // No daemon: the install stops before the reboot the operator owes.
    let out = dev.exits(5, &["install", "--wait", &url]);
    assert!(out.contains("installed release 1.0 into slot B"), "{out}");
    assert!(out.contains("reboot to try it"), "{out}");
    dev.reboot();
    dev.start_daemon();
    dev.wait_committed("1.0", WAIT);

    // The same release again: nothing to do, and 0 without --wait.
    let out = dev.exits(4, &["install", "--wait", &url]);
    assert!(out.contains("no change:") && out.contains("1.0"), "{out}");
    let out = dev.exits(4, &["check", "--wait"]);
    assert!(out.contains("1.0"), "{out}");
    dev.exits(0, &["check"]);

    // A new release: the daemon installs it and reboots (reboot = auto).
    ps.publish("2.0", 42, IMAGE, &[]);
    let out = dev.exits(5, &["check", "--wait"]);
    assert!(out.contains("installing release 2.0 into slot A"), "{out}");
    assert!(
        out.contains("installed release 2.0 in slot A; the daemon reboots into it"),
        "{out}"
    );
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();
}

#[test]
fn a_release_the_policy_holds_exits_6() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("exit-held", false);
    ps.publish("1.0", 43, IMAGE, &[]);
    let mut dev = device(
        &ps,
        "exit-held",
        "write = \"manual\"\nswitch = \"manual\"\n",
    );
    dev.start_daemon();

    // policy.write holds the download.
    let out = dev.exits(6, &["check", "--wait"]);
    assert!(
        out.contains("release 1.0 waits for `updraft apply` to be downloaded"),
        "{out}"
    );
    dev.exits(0, &["check"]);

    // An operator's install passes the write gate; policy.switch holds
    // the written slot.
    let out = dev.exits(6, &["install", "--wait", &ps.manifest_url()]);
    assert!(
        out.contains("installed release 1.0 in slot B; held by the policy: it waits for operator"),
        "{out}"
    );
    assert!(
        !dev.reboot_marker.exists(),
        "a held release was rebooted into"
    );
    dev.stop_daemon();
}

#[test]
fn an_app_committed_without_a_reboot_exits_0_and_one_rolled_back_1() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("exit-app", false);
    let trees = TempDir::new("exit-app-trees");
    let tree = |version: &str, healthy: bool| {
        let dir = trees.join(format!("web-{version}"));
        let mut files = vec![("VERSION", version)];
        if healthy {
            files.push(("healthy", ""));
        }
        write_tree(&dir, &files);
        format!("web@{version}={}", dir.display())
    };
    ps.publish("1.0", 44, IMAGE, &["--app", &tree("1.3", true)]);
    let mut dev = app_device_polling(&ps, "exit-app", "1.0", "web", "1h");
    health_needs_healthy_file(&dev, "web");
    dev.start_daemon();
    wait_history(&dev, "release 1.0 committed", WAIT, |e| {
        e["event"] == json!("committed") && e["release"] == json!("1.0")
    });

    publish_apps(&ps, "1.1", &[tree("1.4", true)]);
    let out = dev.exits(0, &["check", "--wait"]);
    assert!(
        out.contains("release 1.1")
            && out.contains("committed")
            && out.contains("without a reboot"),
        "{out}"
    );

    publish_apps(&ps, "1.2", &[tree("1.5", false)]);
    let out = dev.exits(1, &["check", "--wait"]);
    assert!(
        out.contains("release 1.2") && out.contains("rolled back"),
        "{out}"
    );
    assert!(
        !dev.reboot_marker.exists(),
        "an app release asked for a reboot"
    );
    dev.stop_daemon();
}
