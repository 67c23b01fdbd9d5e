//! The local control socket: anyone in the socket's group may read the
//! status; only root may change anything (checked with SO_PEERCRED, not
//! with anything the client claims).

use std::process::Command;

use serde_json::json;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::keygen;
use updraft_tests::skip::is_root;
use updraft_tests::tmp::TempDir;

/// Run `updraft` as uid/gid 65534 (nobody/nogroup) with `setpriv`.
fn as_nobody(dev: &Device, args: &[&str]) -> std::process::Output {
    let probe = dev.cmd(args);
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
    c.arg(probe.get_program()).args(probe.get_args());
    c.output().expect("running setpriv (util-linux)")
}

#[test]
fn group_members_read_status_but_only_root_changes_anything() {
    if !is_root() {
        updraft_tests::skip!("needs root to run a client as another user");
    }
    let keys = TempDir::new("socket-perm-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.system = "socket_group = \"nogroup\"\n".into();
    let mut dev = Device::new("socket-perm", spec);
    dev.init();
    dev.start_daemon();
    let out = as_nobody(&dev, &["status", "--json"]);
    assert!(
        out.status.success(),
        "nobody could not read status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["state"], json!("idle"));
    for cmd in [
        &["check"][..],
        &["mark-good"],
        &["mark-bad"],
        &["install", "https://127.0.0.1:1/manifest.json"],
    ] {
        let out = as_nobody(&dev, cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(
            err.contains(&format!("permission denied: `updraft {}` changes the device and is for root only (you are uid 65534)", cmd[0])),
            "{cmd:?}: {err}"
        );
    }
    // Root may.
    let out = dev.updraft(&["mark-good"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A command sent while a step works is answered for what it is, not
/// refused as if the boot still waited for the bootloader.
#[test]
fn a_check_during_a_download_says_which_update_is_in_progress() {
    updraft_tests::require!("nginx");
    let ps = updraft_tests::proxied::ProxiedServer::start("check-busy", false);
    ps.publish("1.0", 11, 8 * 1024 * 1024, &[]);
    ps.drip(400_000);
    let mut dev = ps.device("check-busy", "1h", "");
    dev.start_daemon();
    updraft_tests::proxied::wait_downloading(&dev, 500_000, std::time::Duration::from_secs(120));
    // Answered once the step ends (downloading or installing by then).
    let out = dev.ok(&["check"]);
    assert!(
        out.contains("an update is in progress: release 1.0 into slot B ("),
        "{out}"
    );
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}
