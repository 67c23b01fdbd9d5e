//! Release channels: a device acts only on signed manifests of the channel
//! it follows, keeps a serial floor per channel, and an operator can move it
//! to another channel for good (the choice lives on the data partition, not
//! in the image's configuration).
//!
//! The attack these guard against: `beta/manifest.json` (serial 40) served
//! at the stable URL used to install the beta build and then lock the
//! device out of stable, whose next release (serial 3) was refused as a
//! rollback.

use std::time::Duration;

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(60);
const IMAGE: usize = 2 * 1024 * 1024 + 777;

struct Local {
    dev: Device,
    key: KeyPair,
    _keys: TempDir,
}

fn local(name: &str) -> Local {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let dev = Device::new(name, DeviceSpec::simple(&key));
    dev.init();
    Local {
        dev,
        key,
        _keys: keys,
    }
}

impl Local {
    fn repo(&self, channel: &str) -> Repo {
        Repo::new(self.dev.path(channel))
    }

    fn publish(&self, repo: &Repo, version: &str, seed: u64, extra: &[&str]) {
        let img = self.dev.path(&format!("{version}.img"));
        image(&img, IMAGE, seed);
        repo.release(&[&self.key], version, &img, extra);
    }
}

#[test]
fn a_manifest_of_another_channel_is_refused_and_moves_no_floor() {
    let l = local("channel-other");
    let beta = l.repo("beta");
    l.publish(
        &beta,
        "3.0-beta-debug",
        1,
        &["--channel", "beta", "--serial", "40"],
    );
    assert_eq!(beta.payload()["channel"], json!("beta"));
    let before = l.dev.snapshot();
    let err = l.dev.fails(&["install", &beta.manifest_str()]);
    assert!(
        err.contains("manifest serial 40 is for channel beta; this device follows stable"),
        "{err}"
    );
    before.assert_unchanged(&l.dev.snapshot());
    assert_eq!(
        l.dev.status()["serial"],
        json!(null),
        "the beta serial was recorded"
    );
    // The next stable release, with a far lower serial, still installs.
    let stable = l.repo("stable");
    l.publish(&stable, "2.0", 2, &["--serial", "3"]);
    assert_eq!(stable.payload()["channel"], json!("stable"));
    l.dev.ok(&["install", &stable.manifest_str()]);
    let st = l.dev.status();
    assert_eq!(st["slots"][1]["version"], json!("2.0"), "{st:#}");
    assert_eq!(st["serial"], json!(3));
    assert_eq!(
        st["channel"],
        json!({"name": "stable", "source": "configuration"})
    );
}

#[test]
fn a_manifest_naming_no_channel_is_refused() {
    let l = local("channel-none");
    let stable = l.repo("stable");
    l.publish(&stable, "2.0", 2, &[]);
    stable.resign(&[&l.key], |p| {
        p.as_object_mut().unwrap().remove("channel");
    });
    let before = l.dev.snapshot();
    let err = l.dev.fails(&["install", &stable.manifest_str()]);
    assert!(
        err.contains("manifest serial 1 names no channel; this device follows stable"),
        "{err}"
    );
    before.assert_unchanged(&l.dev.snapshot());
}

#[test]
fn a_device_whose_url_names_no_channel_cannot_be_moved_off_its_channel() {
    let l = local("channel-fixed-url");
    let err = l.dev.fails(&["channel", "beta"]);
    assert!(err.contains("has no {channel} placeholder"), "{err}");
    assert!(
        err.contains("following beta would refuse every manifest"),
        "{err}"
    );
    let out = l.dev.ok(&["channel"]);
    assert!(out.starts_with("channel stable (configuration)"), "{out}");
    assert_eq!(l.dev.status()["channel"]["name"], json!("stable"));
}

#[test]
fn channel_names_are_checked_on_the_command_line_and_in_the_configuration() {
    let mut l = local("channel-names");
    let out = l.dev.updraft(&["channel", "Beta Two"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("channel name \"Beta Two\""), "{err}");
    l.dev
        .reconfigure(|s| s.server.push_str("channel = \"../beta\"\n"));
    let err = l.dev.fails(&["status"]);
    assert!(
        err.contains("server.channel: channel name \"../beta\""),
        "{err}"
    );
}

/// The per-channel floors and the operator's choice, end to end: a daemon
/// polling nginx follows stable (serial 5), is moved to beta (serial 2,
/// lower, yet new on its own channel), and keeps following beta after an
/// image whose configuration says stable.
#[test]
fn an_operator_moves_a_device_to_another_channel_for_good() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("channel-move-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    let stable = server.channel("stable");
    let beta = server.channel("beta");
    let img = |name: &str, seed: u64| {
        let p = keys.join(name);
        image(&p, IMAGE, seed);
        p
    };
    stable.release(&[&key], "1.0", &img("1.0.img", 1), &["--serial", "5"]);
    beta.release(
        &[&key],
        "2.0-beta",
        &img("2.0-beta.img", 2),
        &["--channel", "beta", "--serial", "2"],
    );
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.channel_server_toml("stable", "1s", "200ms");
    let mut dev = Device::new("channel-move", spec);
    dev.init();
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    let st = dev.status();
    assert_eq!(st["job"]["version"], json!("1.0"), "{st:#}");
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    dev.wait_for("1.0 committed and idle", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    assert_eq!(dev.status()["floor"], json!(5));

    let out = dev.ok(&["channel", "beta"]);
    assert!(
        out.contains("following channel beta instead of stable"),
        "{out}"
    );
    assert!(out.contains("/beta/manifest.json"), "{out}");
    // Serial 2 is below stable's 5 but new on beta: installed.
    dev.wait_reboot_requested(WAIT);
    let st = dev.status();
    assert_eq!(st["job"]["version"], json!("2.0-beta"), "{st:#}");
    assert_eq!(st["channel"], json!({"name": "beta", "source": "operator"}));
    assert_eq!(st["floor"], json!(2));
    assert_eq!(dev.reboot(), SlotName::A);

    // The next image's configuration still says stable: the choice stays.
    dev.reconfigure(|s| s.server.push_str("# a new image\n"));
    dev.start_daemon();
    dev.wait_for("2.0-beta committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("2.0-beta")
    });
    let out = dev.ok(&["channel"]);
    assert!(
        out.starts_with("channel beta (chosen by an operator; the configuration says stable)"),
        "{out}"
    );
    // Back to the configuration's channel: stable's floor was kept (5, not
    // beta's 2), and following stable means running stable's release.
    let out = dev.ok(&["channel", "--default"]);
    assert!(
        out.contains("following channel stable instead of beta (configuration)"),
        "{out}"
    );
    dev.wait_reboot_requested(WAIT);
    let st = dev.status();
    assert_eq!(st["job"]["version"], json!("1.0"), "{st:#}");
    assert_eq!(
        st["channel"],
        json!({"name": "stable", "source": "configuration"})
    );
    assert_eq!(st["floor"], json!(5));
    assert!(dev.daemon_running(), "the daemon stopped");
}
