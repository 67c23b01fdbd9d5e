//! The status wire form across releases: `last_install` was added to the
//! status the daemon sends over the control socket, so the previous
//! release's client must still read the current daemon's answer, and the
//! current client the previous daemon's (which has no `last_install`).
//!
//! The previous release is the commit pinned in `updraft_tests::previous`,
//! built from source on first use (see docs/compatibility.md).

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use updraft_tests::bin;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{Repo, image, keygen};
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);

/// `EXE --config CONFIG status [--json]`, insisting on success.
fn status_by(exe: Option<&Path>, dev: &Device, json: bool) -> String {
    let mut c = match exe {
        Some(e) => std::process::Command::new(e),
        None => bin::command("updraft"),
    };
    c.arg("--config").arg(&dev.config).arg("status");
    if json {
        c.arg("--json");
    }
    let out: Output = c.output().expect("running updraft status");
    assert!(
        out.status.success(),
        "status by {exe:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{text}"))
}

#[test]
fn status_crosses_the_socket_between_releases() {
    let old = updraft_tests::previous_release!();
    let keys = TempDir::new("status-compat-keys");
    let key = keygen(keys.path(), "release");
    let mut dev = Device::new("status-compat", DeviceSpec::simple(&key));
    dev.init();
    let repo = Repo::new(dev.path("usb"));
    let img = dev.path("1.0.img");
    image(&img, 2 * 1024 * 1024 + 5, 11);
    repo.release(&[&key], "1.0", &img, &[]);
    dev.ok(&["install", &repo.manifest_str()]);
    dev.reboot();
    dev.start_daemon();
    dev.wait_for("release 1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });

    // The current daemon answers the previous client, which ignores the
    // field it does not know.
    let st = parse(&status_by(None, &dev, true));
    assert_eq!(st["last_install"]["result"], json!("committed"), "{st:#}");
    let by_old = parse(&status_by(Some(&old), &dev, true));
    assert_eq!(by_old["state"], json!("idle"), "{by_old:#}");
    assert_eq!(by_old["running_version"], json!("1.0"), "{by_old:#}");
    assert!(by_old.get("last_install").is_none(), "{by_old:#}");
    let text = status_by(Some(&old), &dev, false);
    assert!(text.contains("booted slot: B (release 1.0)"), "{text}");

    // The previous daemon answers the current client: no `last_install`,
    // everything else as before.
    dev.stop_daemon();
    dev.use_binary(Some(old.clone()));
    dev.start_daemon();
    let from_old = parse(&status_by(None, &dev, true));
    assert_eq!(from_old["state"], json!("idle"), "{from_old:#}");
    assert_eq!(from_old["running_version"], json!("1.0"), "{from_old:#}");
    assert!(from_old.get("last_install").is_none(), "{from_old:#}");
    let text = status_by(None, &dev, false);
    assert!(text.contains("booted slot:  B (release 1.0)"), "{text}");
    assert!(!text.contains("last install:"), "{text}");
    dev.stop_daemon();
}
