//! Application inhibitors: the application on the device holds off the
//! switch and reboot into a new release while it is busy.
//!
//! * A file in the inhibit directory holds the verified release, slot out
//!   of the boot order and no reboot, until it is removed; the status and
//!   a `waiting` report name who inhibits and why.
//! * A file owned by another user is ignored, with a warning.
//! * An inhibitor that appears after the switch still holds the reboot
//!   (`policy.inhibit_command` here, asked before the switch and again
//!   before the reboot command).
//! * `policy.max_deferral` ends the wait: an inhibitor that never goes
//!   away does not keep a device from converging.
//!
//! Real nginx (through the pass-through proxy), real daemon processes, real
//! files and a real inhibit command.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use updraft_tests::device::Device;
use updraft_tests::proxied::ProxiedServer;

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: usize = 4 * 1024 * 1024;

/// A device on `ps` with its own inhibitors
/// ([`Device::own_inhibitors`]) and `policy` added; returns it and the
/// inhibit directory.
fn device(ps: &ProxiedServer, name: &str, policy: &str) -> (Device, PathBuf) {
    let mut spec = ps.device_spec("1h", "");
    spec.slot_size = IMAGE as u64;
    let mut dev = Device::new(name, spec);
    let dir = dev.own_inhibitors(policy);
    dev.init();
    (dev, dir)
}

fn inhibit(dir: &PathBuf, name: &str, reason: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("{reason}\n")).unwrap();
    path
}

/// Wait until the verified release waits for an inhibitor; returns the
/// status.
fn wait_inhibited(dev: &Device) -> Value {
    dev.wait_for("the release held by an inhibitor", WAIT, |s| {
        s["policy"]["waiting_for"] == json!("inhibitor")
    })
}

#[test]
fn an_inhibitor_file_holds_the_switch_and_reboot_until_it_is_removed() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("inhibit-file", true);
    ps.publish("1.0", 41, IMAGE, &[]);
    let (mut dev, dir) = device(&ps, "inhibit-file", "");
    let file = inhibit(&dir, "backup", "Copying the database");
    dev.start_daemon();
    let st = wait_inhibited(&dev);
    assert_eq!(st["state"], json!("installed"), "{st:#}");
    assert_eq!(
        st["next_boot"],
        json!("A"),
        "switched while inhibited: {st:#}"
    );
    let who = &st["policy"]["inhibitors"][0];
    assert_eq!(who["who"], json!("backup"), "{st:#}");
    assert_eq!(who["origin"], json!("file"), "{st:#}");
    assert_eq!(who["reason"], json!("Copying the database"), "{st:#}");
    assert!(st["policy"]["inhibited_since"].is_string(), "{st:#}");
    let text = dev.ok(&["status"]);
    assert!(
        text.contains("inhibited by:") && text.contains("backup (file, since "),
        "{text}"
    );
    let report = ps.wait_report("a waiting report", WAIT, |r| r["kind"] == json!("waiting"));
    assert_eq!(report["waiting_for"], json!("inhibitor"), "{report:#}");
    assert!(
        report["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("Copying the database"),
        "{report:#}"
    );
    assert_eq!(report["job"]["release"], json!("1.0"), "{report:#}");
    // The operator's apply does not override a busy application.
    let out = dev.ok(&["apply"]);
    assert!(out.contains("applied, but inhibited by backup"), "{out}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !dev.reboot_marker.exists(),
        "rebooted while an inhibitor was present"
    );

    std::fs::remove_file(&file).unwrap();
    dev.wait_reboot_requested(WAIT);
    let st = dev.status();
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    dev.stop_daemon();
}

#[test]
fn an_inhibitor_file_owned_by_another_user_is_ignored_with_a_warning() {
    updraft_tests::require!("nginx");
    if !updraft_tests::skip::is_root() {
        updraft_tests::skip!("giving a file to another user needs root (run the suite as root)");
    }
    let ps = ProxiedServer::start("inhibit-foreign", false);
    ps.publish("1.0", 42, IMAGE, &[]);
    let (mut dev, dir) = device(&ps, "inhibit-foreign", "");
    let file = inhibit(&dir, "intruder", "never update");
    std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    let log = dev.log();
    assert!(
        log.contains("ignoring") && log.contains("intruder") && log.contains("uid 65534"),
        "{log}"
    );
    assert_eq!(dev.status()["next_boot"], json!("B"));
    dev.stop_daemon();
}

#[test]
fn an_inhibitor_that_appears_after_the_switch_holds_the_reboot() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("inhibit-command", false);
    ps.publish("1.0", 43, IMAGE, &[]);
    let mut spec = ps.device_spec("1h", "");
    spec.slot_size = IMAGE as u64;
    let mut dev = Device::new("inhibit-command", spec);
    // The application is idle when asked before the switch, and busy
    // from then on until `done` exists.
    let script = dev.path("busy.sh");
    let (count, done) = (dev.path("asked"), dev.path("done"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho x >> {count:?}\n[ -e {done:?} ] && exit 0\n\
             [ \"$(wc -l < {count:?})\" -le 1 ] && exit 0\necho 'recording a measurement'\nexit 1\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    dev.own_inhibitors(&format!(
        "inhibit_command = [{:?}]\n",
        script.display().to_string()
    ));
    dev.init();
    dev.start_daemon();
    let st = wait_inhibited(&dev);
    assert_eq!(st["state"], json!("rebooting"), "{st:#}");
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    let who = &st["policy"]["inhibitors"][0];
    assert_eq!(who["who"], json!("command:busy.sh"), "{st:#}");
    assert_eq!(who["reason"], json!("recording a measurement"), "{st:#}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !dev.reboot_marker.exists(),
        "rebooted while the inhibit command refused"
    );
    std::fs::write(&done, "").unwrap();
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();
}

#[test]
fn the_maximum_deferral_ends_the_wait_for_an_inhibitor() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("inhibit-deferral", false);
    ps.publish("1.0", 44, IMAGE, &[]);
    let (mut dev, dir) = device(&ps, "inhibit-deferral", "max_deferral = \"5s\"\n");
    inhibit(&dir, "forever", "a stuck application");
    dev.start_daemon();
    wait_inhibited(&dev);
    dev.wait_reboot_requested(WAIT);
    let log = dev.log();
    assert!(
        log.contains("longer than policy.max_deferral (5s); going ahead despite forever"),
        "{log}"
    );
    dev.stop_daemon();
}
