//! The hardware rollback floor against a real TPM 2.0 (swtpm on loopback,
//! reached through tpm2-tools, or spoken to directly with
//! `access = "direct"`) and against the command counter.
//!
//! The counter's value is the lowest security version the device installs.
//! It moves only once a release is committed (not at download, not during
//! the trial boot, never for a release rolled back), survives a deleted
//! database, is caught up at start after a power cut between the commit and
//! the advance, and gates installs only: a device running a release below
//! the counter boots, runs and updates. A counter that cannot be read stops
//! installs unless the operator allowed them, and status says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use updraft::rollback_counter::Counter;
use updraft::rollback_counter::tpm_direct::Tpm2Direct;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen};
use updraft_tests::swtpm::Swtpm;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);
const IMAGE: usize = 2 * 1024 * 1024 + 321;
const INDEX: u32 = 0x0150_0016;
const COUNTER: &str = "tpm2 NV index 0x1500016";

struct Rig {
    dev: Device,
    key: KeyPair,
    _keys: TempDir,
}

/// A device whose `[rollback]` section is `rollback`.
fn rig(name: &str, rollback: &str) -> Rig {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.sections = format!("[rollback]\n{rollback}\n");
    let dev = Device::new(name, spec);
    dev.init();
    Rig {
        dev,
        key,
        _keys: keys,
    }
}

/// `[rollback]` of a TPM counter at [`INDEX`] on `tpm`.
fn tpm2_section(tpm: &Swtpm, extra: &str) -> String {
    format!(
        "counter = \"tpm2\"\nnv_index = \"{INDEX:#x}\"\ntcti = \"{}\"\n{extra}",
        tpm.tcti()
    )
}

impl Rig {
    /// Publish `version` with `security_version` into the release
    /// directory `dir` (under the device's), serial `serial`.
    fn publish(&self, dir: &str, version: &str, seed: u64, serial: u64, security: u64) -> Repo {
        let repo = Repo::new(self.dev.path(dir));
        let img = self.dev.path(&format!("{version}.img"));
        image(&img, IMAGE, seed);
        let (serial, security) = (serial.to_string(), security.to_string());
        self.repo_release(&repo, version, &img, &serial, &security);
        repo
    }

    fn repo_release(&self, repo: &Repo, version: &str, img: &Path, serial: &str, security: &str) {
        repo.release(
            &[&self.key],
            version,
            img,
            &["--serial", serial, "--security-version", security],
        );
    }

    /// One-shot install from `repo`, asserting it succeeds; its stderr.
    fn install(&self, repo: &Repo) -> String {
        let out = self.dev.install(&repo.manifest_str());
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "install: {err}");
        err
    }

    /// One-shot install from `repo` that must be refused before anything
    /// is written (the poll still records the manifest's serial); its
    /// stderr.
    fn refused(&self, repo: &Repo) -> String {
        let before = self.dev.snapshot();
        let out = self.dev.install(&repo.manifest_str());
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "install was not refused: {err}");
        let after = self.dev.snapshot();
        assert_eq!(before.slot_a, after.slot_a, "slot A written");
        assert_eq!(before.slot_b, after.slot_b, "slot B written");
        assert_eq!(before.state, after.state, "state changed");
        assert_eq!(before.slots, after.slots, "slot records changed");
        assert_eq!(
            before.boot_state, after.boot_state,
            "boot selection changed"
        );
        err
    }

    /// Reboot into the trial and let the daemon run it.
    fn boot_trial(&mut self) {
        self.dev.reboot();
        self.dev.start_daemon();
    }

    /// Install from `repo`, reboot and wait for `version` to commit; the
    /// daemon is stopped again.
    fn install_and_commit(&mut self, repo: &Repo, version: &str) -> Value {
        self.install(repo);
        self.boot_trial();
        let st = self.dev.wait_committed(version, WAIT);
        self.dev.stop_daemon();
        st
    }

    /// A health check that waits until [`Rig::release_trial`] (and fails
    /// for `failing`, if given).
    fn hold_trials(&self, failing: Option<&str>) -> PathBuf {
        let go = self.dev.path("trial-may-end");
        let fail = failing
            .map(|v| {
                format!(
                    "if [ \"$UPDRAFT_VERSION\" = {v} ]; then echo 'service down' >&2; exit 1; fi\n"
                )
            })
            .unwrap_or_default();
        self.dev.health_check(
            "10-held",
            &format!(
                "while [ ! -e {} ]; do sleep 0.05; done\n{fail}",
                go.display()
            ),
        );
        go
    }

    fn floor(&self) -> Value {
        self.dev.status()["hardware_floor"].clone()
    }
}

/// Let held trials end.
fn release_trial(go: &Path) {
    std::fs::write(go, "").expect("releasing the trial");
}

/// Remove everything on the data partition's state directory but the
/// bootloader's state: what an attacker who rewrites the partition does to
/// the database and its protected copy.
fn wipe_database(dev: &Device) {
    let keep = dev
        .boot_state
        .file_name()
        .expect("boot state name")
        .to_owned();
    for e in std::fs::read_dir(&dev.state_dir).expect("state dir") {
        let e = e.expect("state dir entry");
        if e.file_name() == keep {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).expect("removing a state directory");
        } else {
            std::fs::remove_file(&p).expect("removing a state file");
        }
    }
}

#[test]
fn the_tpm_counter_advances_on_commit_only_never_for_a_download_a_trial_or_a_rollback() {
    updraft_tests::require_swtpm!();
    let tpm = Swtpm::start("floor-commit");
    tpm.define_counter(INDEX);
    let mut r = rig("floor-commit", &tpm2_section(&tpm, ""));
    // A counter defined but never incremented reads as floor 0.
    assert_eq!(tpm.value(INDEX), None);
    assert_eq!(r.floor()["value"], json!(0), "{:#}", r.floor());
    assert_eq!(r.floor()["counter"], json!(COUNTER));
    let go = r.hold_trials(Some("2.0"));

    let v1 = r.publish("r1", "1.0", 11, 1, 3);
    r.install(&v1);
    assert_eq!(tpm.value(INDEX), None, "advanced by the download");
    r.boot_trial();
    r.dev.wait_state("testing", WAIT);
    assert_eq!(tpm.value(INDEX), None, "advanced during the trial boot");
    release_trial(&go);
    let st = r.dev.wait_committed("1.0", WAIT);
    assert_eq!(tpm.value(INDEX), Some(3), "not advanced by the commit");
    assert_eq!(st["hardware_floor"]["value"], json!(3), "{st:#}");
    assert_eq!(
        st["hardware_floor"]["committed_security_version"],
        json!(3),
        "{st:#}"
    );
    assert_eq!(st["hardware_floor"]["installs"], json!("checked"), "{st:#}");
    assert!(
        r.dev.log().contains(&format!(
            "release 1.0: {COUNTER} advanced from 0 to 3 (committed, security version 3)"
        )),
        "{}",
        r.dev.log_tail()
    );
    assert!(
        r.dev
            .ok(&["status"])
            .contains(&format!("hw floor:     3 ({COUNTER})"))
    );
    r.dev.stop_daemon();

    // 2.0 raises the security version but fails its health check.
    let v2 = r.publish("r2", "2.0", 22, 2, 5);
    r.install(&v2);
    r.boot_trial();
    r.dev.wait_reboot_requested(WAIT);
    r.dev.reboot();
    r.dev.start_daemon();
    let st = r.dev.wait_rolled_back(WAIT);
    assert_eq!(st["running_version"], json!("1.0"), "{st:#}");
    assert_eq!(
        tpm.value(INDEX),
        Some(3),
        "advanced for a rolled-back release"
    );
    assert_eq!(
        st["hardware_floor"]["committed_security_version"],
        json!(3),
        "{st:#}"
    );
    r.dev.stop_daemon();
}

#[test]
fn a_device_whose_database_is_wiped_refuses_an_older_signed_release_by_the_tpm_counter() {
    updraft_tests::require_swtpm!();
    let tpm = Swtpm::start("floor-wiped");
    tpm.define_counter(INDEX);
    let mut r = rig("floor-wiped", &tpm2_section(&tpm, ""));
    let old = r.publish("old", "1.0", 11, 1, 1);
    r.install_and_commit(&old, "1.0");
    let new = r.publish("new", "2.0", 22, 2, 2);
    r.install_and_commit(&new, "2.0");
    assert_eq!(tpm.value(INDEX), Some(2));

    wipe_database(&r.dev);
    assert!(
        !r.dev.state_dir.join("updraft.db").exists(),
        "the database survived"
    );
    r.dev.init();
    let st = r.dev.status();
    assert!(
        st.get("serial").is_none() && st.get("floor").is_none(),
        "{st:#}"
    );
    let err = r.refused(&old);
    assert!(
        err.contains(&format!(
            "release 1.0 security version 1 is below the hardware floor 2 ({COUNTER})"
        )),
        "{err}"
    );
    // The release the counter was advanced for still installs.
    let again = r.publish("again", "2.1", 33, 3, 2);
    r.install(&again);
}

#[test]
fn a_power_cut_between_the_commit_and_the_advance_is_caught_up_at_the_next_start() {
    updraft_tests::require_swtpm!();
    let mut tpm = Swtpm::start("floor-cut");
    tpm.define_counter(INDEX);
    let mut r = rig("floor-cut", &tpm2_section(&tpm, ""));
    let go = r.hold_trials(None);
    let v1 = r.publish("r1", "1.0", 11, 1, 4);
    r.install(&v1);
    r.boot_trial();
    r.dev.wait_state("testing", WAIT);
    // The TPM goes away during the trial: the commit is made, the advance
    // cannot be, and the power fails before anything else happens.
    tpm.stop();
    release_trial(&go);
    let st = r.dev.wait_committed("1.0", WAIT);
    assert_eq!(st["hardware_floor"]["installs"], json!("refused"), "{st:#}");
    assert_eq!(
        st["hardware_floor"]["committed_security_version"],
        json!(4),
        "{st:#}"
    );
    r.dev.kill_daemon();
    tpm.power_on();
    assert_eq!(tpm.value(INDEX), None, "advanced with the TPM gone");

    r.dev.reboot();
    r.dev.start_daemon();
    let st = r.dev.wait_for("the counter caught up", WAIT, |s| {
        s["hardware_floor"]["value"] == json!(4)
    });
    assert_eq!(st["running_version"], json!("1.0"), "{st:#}");
    assert_eq!(tpm.value(INDEX), Some(4));
    assert!(
        r.dev.log().contains(&format!(
            "release 1.0: {COUNTER} advanced from 0 to 4 (start, security version 4)"
        )),
        "{}",
        r.dev.log_tail()
    );
    r.dev.stop_daemon();
}

#[test]
fn a_counter_above_the_running_release_gates_installs_only_never_the_boot() {
    updraft_tests::require_swtpm!();
    let tpm = Swtpm::start("floor-above");
    tpm.define_counter(INDEX);
    let mut r = rig("floor-above", &tpm2_section(&tpm, ""));
    let v1 = r.publish("r1", "1.0", 11, 1, 1);
    r.install_and_commit(&v1, "1.0");
    assert_eq!(tpm.value(INDEX), Some(1));
    // The other order: 2.0's advance reached the TPM, its commit record
    // did not, and the device went back to 1.0.
    let go = r.hold_trials(Some("2.0"));
    let v2 = r.publish("r2", "2.0", 22, 2, 2);
    r.install(&v2);
    r.boot_trial();
    r.dev.wait_state("testing", WAIT);
    tpm.increment(INDEX);
    release_trial(&go);
    r.dev.wait_reboot_requested(WAIT);
    r.dev.reboot();
    r.dev.start_daemon();
    let st = r.dev.wait_rolled_back(WAIT);
    assert_eq!(st["running_version"], json!("1.0"), "{st:#}");
    assert_eq!(st["hardware_floor"]["value"], json!(2), "{st:#}");
    assert_eq!(
        st["hardware_floor"]["committed_security_version"],
        json!(1),
        "{st:#}"
    );
    assert_eq!(tpm.value(INDEX), Some(2), "the counter moved");
    r.dev.stop_daemon();
    // Restarting on 1.0 is fine, and the device still updates.
    r.dev.reboot();
    r.dev.start_daemon();
    r.dev.wait_committed("1.0", WAIT);
    r.dev.stop_daemon();
    let v3 = r.publish("r3", "3.0", 33, 3, 2);
    let st = r.install_and_commit(&v3, "3.0");
    assert_eq!(st["hardware_floor"]["value"], json!(2), "{st:#}");
    assert_eq!(tpm.value(INDEX), Some(2));
}

#[test]
fn an_unreadable_counter_stops_installs_unless_allowed_and_status_says_so() {
    updraft_tests::require_swtpm!();
    let mut tpm = Swtpm::start("floor-gone");
    tpm.define_counter(INDEX);
    let mut r = rig("floor-gone", &tpm2_section(&tpm, ""));
    let v1 = r.publish("r1", "1.0", 11, 1, 1);
    tpm.stop();

    let err = r.refused(&v1);
    assert!(
        err.contains(&format!(
            "the hardware rollback floor ({COUNTER}) cannot be read"
        )) && err.contains("refusing to install release 1.0 (rollback.on_unreadable = \"refuse\")"),
        "{err}"
    );
    let floor = r.floor();
    assert_eq!(floor["installs"], json!("refused"), "{floor:#}");
    assert!(
        floor["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{floor:#}"
    );
    assert!(floor.get("value").is_none(), "{floor:#}");
    r.dev.start_daemon();
    let st = r.dev.status();
    assert_eq!(st["hardware_floor"]["installs"], json!("refused"), "{st:#}");
    let text = r.dev.ok(&["status"]);
    assert!(
        text.contains(&format!("hw floor:     UNREADABLE ({COUNTER})"))
            && text.contains("installs refused"),
        "{text}"
    );
    r.dev.stop_daemon();

    let section = tpm2_section(&tpm, "on_unreadable = \"allow\"\n");
    r.dev
        .reconfigure(|s| s.sections = format!("[rollback]\n{section}\n"));
    assert_eq!(r.floor()["installs"], json!("unchecked"));
    let err = r.install(&v1);
    assert!(
        err.contains("WARN")
            && err.contains("installing release 1.0 (security version 1) unchecked, as rollback.on_unreadable = \"allow\" says"),
        "{err}"
    );
}

#[test]
fn the_command_counter_keeps_the_floor_through_two_scripts_even_when_the_advance_is_cut() {
    let keys_dir = TempDir::new("floor-command-scripts");
    let value = keys_dir.join("counter");
    std::fs::write(&value, "0\n").expect("counter file");
    let cut = keys_dir.join("cut-next-advance");
    let read = keys_dir.join("read-counter");
    let advance = keys_dir.join("advance-counter");
    updraft_tests::tmp::write_executable(&read, &format!("#!/bin/sh\ncat {}\n", value.display()));
    // Armed, the advance kills its caller first: the daemon dies exactly
    // between the commit and the advance.
    updraft_tests::tmp::write_executable(
        &advance,
        &format!(
            "#!/bin/sh\nif [ -e {cut} ]; then rm {cut}; kill -9 $PPID; exit 1; fi\necho \"$1\" > {value}\n",
            cut = cut.display(),
            value = value.display()
        ),
    );
    let mut r = rig(
        "floor-command",
        &format!(
            "counter = \"command\"\nread_command = [{:?}]\nadvance_command = [{:?}]\n",
            read.display().to_string(),
            advance.display().to_string()
        ),
    );
    let counter = format!("counter command {}", read.display());
    let v1 = r.publish("r1", "1.0", 11, 1, 4);
    r.install_and_commit(&v1, "1.0");
    assert_eq!(std::fs::read_to_string(&value).unwrap(), "4\n");

    std::fs::write(&cut, "").expect("arming the cut");
    let v2 = r.publish("r2", "2.0", 22, 2, 6);
    r.install(&v2);
    r.boot_trial();
    let t = std::time::Instant::now();
    while r.dev.daemon_running() {
        assert!(
            t.elapsed() < WAIT,
            "the daemon survived the cut:\n{}",
            r.dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    r.dev.kill_daemon();
    assert_eq!(
        std::fs::read_to_string(&value).unwrap(),
        "4\n",
        "advanced despite the cut"
    );
    r.dev.reboot();
    r.dev.start_daemon();
    let st = r.dev.wait_committed("2.0", WAIT);
    assert_eq!(std::fs::read_to_string(&value).unwrap(), "6\n");
    assert_eq!(st["hardware_floor"]["value"], json!(6), "{st:#}");
    assert_eq!(st["hardware_floor"]["counter"], json!(counter), "{st:#}");
    r.dev.stop_daemon();

    let old = r.publish("old", "1.5", 15, 3, 5);
    let err = r.refused(&old);
    assert!(
        err.contains(&format!(
            "release 1.5 security version 5 is below the hardware floor 6 ({counter})"
        )),
        "{err}"
    );
}

#[test]
fn the_direct_tpm_counter_advances_on_commit_and_a_wiped_device_refuses_an_older_release() {
    updraft_tests::require!("swtpm", "tpm2_nvdefine", "tpm2_nvread");
    let tpm = Swtpm::start("floor-direct");
    tpm.define_counter(INDEX);
    let mut r = rig("floor-direct", &tpm2_section(&tpm, "access = \"direct\"\n"));
    assert_eq!(r.floor()["value"], json!(0), "{:#}", r.floor());
    let old = r.publish("old", "1.0", 11, 1, 1);
    r.install_and_commit(&old, "1.0");
    let new = r.publish("new", "2.0", 22, 2, 3);
    let st = r.install_and_commit(&new, "2.0");
    // What tpm2-tools read is what updraft's own commands left.
    assert_eq!(tpm.value(INDEX), Some(3));
    assert_eq!(st["hardware_floor"]["value"], json!(3), "{st:#}");
    assert!(
        r.dev.log().contains(&format!(
            "release 2.0: {COUNTER} advanced from 1 to 3 (committed, security version 3)"
        )),
        "{}",
        r.dev.log_tail()
    );

    wipe_database(&r.dev);
    r.dev.init();
    let err = r.refused(&old);
    assert!(
        err.contains(&format!(
            "release 1.0 security version 1 is below the hardware floor 3 ({COUNTER})"
        )),
        "{err}"
    );
}

#[test]
fn the_direct_access_names_what_the_tpm_answered_for_a_badly_provisioned_index() {
    updraft_tests::require!("swtpm", "tpm2_nvdefine", "tpm2_nvread");
    let mut tpm = Swtpm::start("floor-direct-answers");
    let tcti = tpm.tcti();
    let mut c = Tpm2Direct::new(INDEX, &tcti);
    assert_eq!(c.describe(), COUNTER);
    let e = c.read().unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "{COUNTER} (tcti {tcti}) is not defined on the TPM: define it at provisioning"
        )),
        "{e}"
    );

    tpm.define_counter(INDEX);
    assert_eq!(c.read().unwrap(), 0, "a counter never incremented");
    assert_eq!(c.advance_to(2).unwrap(), 2);
    assert_eq!(c.advance_to(1).unwrap(), 2, "never moves down");
    assert_eq!(tpm.value(INDEX), Some(2));
    tpm.increment(INDEX);
    assert_eq!(c.read().unwrap(), 3, "reads what the tools wrote");
    let e = c.advance_to(3 + 257).unwrap_err().to_string();
    assert!(e.contains("more than 256"), "{e}");

    // An ordinary index could be written back: no floor.
    let ordinary = INDEX + 1;
    tpm.define(ordinary, "ownerread|ownerwrite|authread|authwrite|no_da");
    let e = Tpm2Direct::new(ordinary, &tcti)
        .read()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tpm2 NV index 0x1500017") && e.contains("is not an NV counter"),
        "{e}"
    );

    // A counter only the owner may increment: the TPM's refusal, named.
    let owner_only = INDEX + 2;
    tpm.define(owner_only, "nt=counter|ownerread|ownerwrite|authread|no_da");
    let mut c2 = Tpm2Direct::new(owner_only, &tcti);
    assert_eq!(c2.read().unwrap(), 0);
    let e = c2.advance_to(1).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "TPM2_NV_Increment on 0x1500018 (tcti {tcti}): TPM_RC_AUTH_UNAVAILABLE (0x12f)"
        )),
        "{e}"
    );

    tpm.stop();
    let e = c.read().unwrap_err().to_string();
    assert!(
        e.contains(&format!("TPM2_NV_Read on 0x1500016 (tcti {tcti}): ")),
        "{e}"
    );
}
