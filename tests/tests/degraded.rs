//! A daemon that cannot start stays up, degraded, instead of exiting into a
//! restart loop: it answers `status` with the reason (exit status 3),
//! reports it, and starts for real once the cause is mended, without a
//! restart. One test per cause a restart cannot cure: a missing key file,
//! a boot environment that cannot be read, an empty device-id file, a slot
//! path that does not exist.
//!
//! Degraded, it still keeps the committed slot bootable (boot scripts
//! count every boot down), and never commits a trial boot.

use std::time::{Duration, Instant};

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::device::{BootSpec, Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(60);

/// What breaks the device before its daemon starts, what the reason must
/// name, and what mends it.
struct Cause {
    name: &'static str,
    break_it: fn(&Device, &KeyPair),
    names: fn(&Device, &KeyPair) -> String,
    mend: fn(&Device, &KeyPair),
}

fn degraded_then_mended(cause: Cause) {
    updraft_tests::require!("nginx");
    let keys = TempDir::new(&format!("{}-keys", cause.name));
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), true);
    let collector = server.collector.as_ref().expect("a report collector");
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("1s", "200ms");
    spec.system = "degraded_retry = \"1s\"\n".into();
    let mut dev = Device::new(cause.name, spec);
    dev.init();
    (cause.break_it)(&dev, &key);
    let named = (cause.names)(&dev, &key);

    dev.start_daemon();
    // Several start attempts later, the daemon is still the same process.
    std::thread::sleep(Duration::from_secs(3));
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    let out = dev.updraft(&["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}\n{}", dev.log_tail());
    assert!(err.contains("degraded since"), "{err}");
    assert!(
        err.contains(&named),
        "the reason does not name {named}: {err}"
    );
    // The reason reaches the report server, though the outbox is never
    // opened.
    let report = collector.wait_report("the degraded state", WAIT, |r| {
        r["kind"] == json!("degraded")
    });
    let reason = report["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&named), "{report:#}");
    assert!(report["version"].is_string(), "{report:#}");
    let log = dev.log();
    assert!(log.contains("cannot start:"), "{log}");

    // Mended: the daemon starts at its next attempt, no restart needed.
    (cause.mend)(&dev, &key);
    let t = Instant::now();
    loop {
        let out = dev.updraft(&["status", "--json"]);
        if out.status.success() {
            break;
        }
        assert!(
            t.elapsed() < WAIT,
            "still degraded after the cause was mended:\n{}",
            dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(dev.status()["state"], json!("idle"));
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    assert!(
        dev.log().contains("no longer degraded"),
        "{}",
        dev.log_tail()
    );
    dev.stop_daemon();
}

#[test]
fn a_missing_key_file_degrades_until_it_is_back() {
    fn aside(k: &KeyPair) -> std::path::PathBuf {
        k.public.with_extension("aside")
    }
    degraded_then_mended(Cause {
        name: "degraded-key",
        break_it: |_, k| std::fs::rename(&k.public, aside(k)).expect("moving the key aside"),
        names: |_, k| k.public.display().to_string(),
        mend: |_, k| std::fs::rename(aside(k), &k.public).expect("putting the key back"),
    });
}

#[test]
fn an_unreadable_boot_environment_degrades_until_it_is_repaired() {
    fn aside(d: &Device) -> std::path::PathBuf {
        d.boot_state.with_extension("good")
    }
    degraded_then_mended(Cause {
        name: "degraded-bootenv",
        break_it: |d, _| {
            std::fs::copy(&d.boot_state, aside(d)).expect("keeping the boot state");
            std::fs::write(&d.boot_state, "BOOT_ORDER=A B\nBOOT_A_LEFT=lots\n")
                .expect("damaging the boot state");
        },
        names: |d, _| d.boot_state.display().to_string(),
        mend: |d, _| std::fs::rename(aside(d), &d.boot_state).expect("restoring the boot state"),
    });
}

#[test]
fn an_empty_device_id_file_degrades_until_it_holds_an_id() {
    fn id_file(d: &Device) -> std::path::PathBuf {
        d.state_dir.join("device-id")
    }
    degraded_then_mended(Cause {
        name: "degraded-id",
        break_it: |d, _| std::fs::write(id_file(d), "").expect("emptying the id file"),
        names: |d, _| id_file(d).display().to_string(),
        mend: |d, _| std::fs::write(id_file(d), "gateway-7\n").expect("writing an id"),
    });
}

#[test]
fn a_slot_path_that_does_not_exist_degrades_naming_its_key() {
    fn aside(d: &Device) -> std::path::PathBuf {
        d.slot_b.with_extension("aside")
    }
    degraded_then_mended(Cause {
        name: "degraded-slot",
        break_it: |d, _| std::fs::rename(&d.slot_b, aside(d)).expect("moving slot B aside"),
        names: |d, _| format!("slots.b: {}", d.slot_b.display()),
        mend: |d, _| std::fs::rename(aside(d), &d.slot_b).expect("putting slot B back"),
    });
}

/// The key file moved aside, so that every start degrades.
fn key_aside(k: &KeyPair) -> std::path::PathBuf {
    let aside = k.public.with_extension("aside");
    std::fs::rename(&k.public, &aside).expect("moving the key aside");
    aside
}

/// Reboot a device whose daemon cannot start `tries + 2` times: the boot
/// script must find the committed slot A every time.
fn committed_slot_survives_degraded_reboots(name: &str, break_it: fn(&mut Device, &KeyPair)) {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.system = "degraded_retry = \"1s\"\n".into();
    let tries = spec.tries;
    let mut dev = Device::new(name, spec);
    dev.init();
    break_it(&mut dev, &key);
    for boot in 1..=tries + 2 {
        // Power on: the boot script counts slot A's attempt.
        assert_eq!(
            dev.boot_script(),
            Some(SlotName::A),
            "boot {boot}: the bootloader gave up the committed slot: {}",
            dev.boot_state_text()
        );
        assert_eq!(dev.boot_vars()["BOOT_A_LEFT"], (tries - 1).to_string());
        dev.reboot_into(SlotName::A);
        dev.start_daemon();
        // Degraded, and slot A's attempts are whole again.
        dev.wait_boot_var("BOOT_A_LEFT", &tries.to_string(), WAIT);
        assert!(dev.daemon_running(), "{}", dev.log_tail());
    }
    assert!(dev.log().contains("cannot start:"), "{}", dev.log_tail());
    assert!(
        dev.log()
            .contains("degraded: booted slot A marked good again"),
        "{}",
        dev.log_tail()
    );
    dev.stop_daemon();
}

#[test]
fn a_committed_slot_stays_bootable_through_more_degraded_reboots_than_it_has_tries() {
    committed_slot_survives_degraded_reboots("degraded-reboots", |_, k| {
        key_aside(k);
    });
}

#[test]
fn a_configuration_refused_by_its_checks_still_keeps_the_committed_slot_bootable() {
    committed_slot_survives_degraded_reboots("degraded-reboots-config", |d, _| {
        d.reconfigure(|s| {
            s.server = "manifest_url = \"http://127.0.0.1:9/manifest.json\"\n".into();
        });
    });
}

#[test]
fn a_trial_boot_is_not_committed_while_degraded_and_is_tested_once_mended() {
    let keys = TempDir::new("degraded-trial-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.system = "degraded_retry = \"1s\"\n".into();
    let mut dev = Device::new("degraded-trial", spec);
    dev.init();
    let repo = Repo::new(dev.path("usb"));
    let img = dev.path("2.0.img");
    image(&img, 1024 * 1024 + 5, 7);
    repo.release(&[&key], "2.0", &img, &[]);
    let out = dev.install(&repo.manifest_str());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let aside = key_aside(&key);
    // The trial boot of slot B, with one of its attempts spent.
    assert_eq!(dev.reboot(), SlotName::B);
    let trial_left = dev.boot_vars()["BOOT_B_LEFT"].clone();
    assert_ne!(trial_left, dev.spec.tries.to_string());
    dev.start_daemon();
    dev.wait_log("the stored state has an update under way", WAIT);
    assert_eq!(dev.updraft(&["status"]).status.code(), Some(3));
    assert_eq!(
        dev.boot_vars()["BOOT_B_LEFT"],
        trial_left,
        "a trial boot was marked good while degraded: {}",
        dev.boot_state_text()
    );

    // Mended: the daemon starts, tests the trial and commits it.
    std::fs::rename(&aside, &key.public).expect("putting the key back");
    dev.wait_for("release 2.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("2.0")
    });
    dev.wait_boot_var("BOOT_B_LEFT", &dev.spec.tries.to_string(), WAIT);
    dev.stop_daemon();
}

#[test]
fn a_status_asked_while_a_start_fails_is_answered_degraded_not_cut_off() {
    let keys = TempDir::new("degraded-slow-start-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.system = "degraded_retry = \"1s\"\n".into();
    let mut dev = Device::new("degraded-slow-start", spec);
    dev.init();
    // A boot selection script that takes two seconds to fail, at the
    // start and again when degraded mode tries to keep the slot good.
    let script = dev.path("boot-select");
    updraft_tests::tmp::write_executable(
        &script,
        "#!/bin/sh\nsleep 2\necho 'boot selection unavailable' >&2\nexit 1\n",
    );
    dev.reconfigure(|s| s.boot = BootSpec::script(&script));
    dev.start_daemon();
    // Asked while the first start waits for the script: the socket that
    // took the request stays open when the start fails, and the answer
    // comes from degraded mode (also while it waits for the script again).
    for _ in 0..3 {
        let out = dev.updraft(&["status"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}\n{}", dev.log_tail());
        assert!(err.contains("degraded since"), "{err}");
    }
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}
