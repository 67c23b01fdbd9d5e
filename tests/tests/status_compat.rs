//! The status wire form across releases: the status the daemon sends
//! over the control socket only gains fields, so the previous release's
//! client reads the current daemon's answer exactly as it reads its own
//! daemon's, and the current client reads the previous daemon's answer as
//! the current one's without the fields added since.
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

    let cur_by_cur = parse(&status_by(None, &dev, true));
    assert_eq!(cur_by_cur["last_install"]["result"], json!("committed"));
    let old_by_cur = parse(&status_by(Some(&old), &dev, true));
    let old_text_by_cur = status_by(Some(&old), &dev, false);

    dev.stop_daemon();
    dev.use_binary(Some(old.clone()));
    dev.start_daemon();
    let old_by_old = parse(&status_by(Some(&old), &dev, true));
    let cur_by_old = parse(&status_by(None, &dev, true));
    let cur_text_by_old = status_by(None, &dev, false);
    dev.stop_daemon();

    // The previous client: the current daemon looks to it exactly as its
    // own daemon does.
    assert_eq!(
        without_clock(old_by_cur.clone()),
        without_clock(old_by_old),
        "the previous client reads the current daemon differently"
    );
    assert_eq!(old_by_cur["state"], json!("idle"), "{old_by_cur:#}");
    assert!(
        old_text_by_cur.contains("booted slot:") && old_text_by_cur.contains("B (release 1.0)"),
        "{old_text_by_cur}"
    );

    // The current client: what the previous daemon says is what the
    // current one says, minus fields added since.
    assert_eq!(cur_by_old["state"], json!("idle"), "{cur_by_old:#}");
    assert_eq!(
        cur_by_old["running_version"],
        json!("1.0"),
        "{cur_by_old:#}"
    );
    assert_within("", &without_clock(cur_by_old), &without_clock(cur_by_cur));
    assert!(
        cur_text_by_old.contains("booted slot:  B (release 1.0)"),
        "{cur_text_by_old}"
    );
}

/// `status` without what moves with the clock between two reads: the
/// time of the next check.
fn without_clock(mut st: Value) -> Value {
    if let Some(o) = st.as_object_mut() {
        o.remove("next_check");
    }
    st
}

/// Every field of `part` is in `whole` with the same value (objects are
/// compared field by field, recursively); `whole` may hold more.
fn assert_within(at: &str, part: &Value, whole: &Value) {
    match (part, whole) {
        (Value::Object(p), Value::Object(w)) => {
            for (k, v) in p {
                let here = format!("{at}.{k}");
                match w.get(k) {
                    Some(wv) => assert_within(&here, v, wv),
                    None => panic!(
                        "{here} is in the previous daemon's status, not in the current one's"
                    ),
                }
            }
        }
        (Value::Array(p), Value::Array(w)) if p.len() == w.len() => {
            for (i, (pv, wv)) in p.iter().zip(w).enumerate() {
                assert_within(&format!("{at}[{i}]"), pv, wv);
            }
        }
        _ => assert_eq!(part, whole, "{at} differs between the releases' daemons"),
    }
}
