//! Power cuts at any instant of the update cycle.
//!
//! The slots, the U-Boot environment (redundant, in two files) and the
//! state directory live on a FUSE filesystem that keeps, for every file and
//! directory, only what was made durable with fsync; cutting the power
//! drops everything else, and kills the daemon at that very request, so it
//! can do nothing afterwards (no late network traffic either). Power is cut
//! after a seeded random number of filesystem writes, over and over, while
//! releases are installed, committed and rolled back. After every cut the
//! device powers on: the test runs the boot script (real `fw_setenv`), gives
//! the device a new boot id and starts the daemon again.
//!
//! After every cut: the environment is readable by `fw_printenv`; the boot
//! script boots a slot that holds a verified image, and the slot of a
//! release the database calls committed; the slot of the last committed
//! release is untouched; the daemon comes back. In the end every
//! release converges, and the reports reach the server at least once, in an
//! order without gaps, each exactly once after dropping duplicates by
//! idempotency key, signed by the device key with report counters that
//! go up by one (none handed out twice by a cut).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::{BootSpec, Device, DeviceSpec};
use updraft_tests::powerfs::{self, PowerFs};
use updraft_tests::publisher::{KeyPair, image_bytes, keygen};
use updraft_tests::rng::Rng;
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const SLOT: usize = 4 * 1024 * 1024;
const IMAGE: usize = 3 * 1024 * 1024;
const FRAME: &str = "262144";
/// Cuts per run natively; the acceptance figure.
const WANT_CUTS: usize = 100;
/// Cuts per run under qemu-user (cross-target runs), where every process is
/// emulated and a cut costs ten times as long; the same code paths are
/// exercised, the native run carries the full count.
const WANT_CUTS_EMULATED: usize = 30;
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);

struct Campaign {
    fs: PowerFs,
    dev: Device,
    server: UpdateServer,
    key: KeyPair,
    keys: TempDir,
    rng: Rng,
    /// Images a slot may legitimately hold: (size, sha256) → name.
    verified: BTreeMap<(usize, Sha256), String>,
    /// The slot holding the last committed release: slot, image size, sha.
    committed: (SlotName, usize, Sha256),
    cuts: usize,
    /// Persisted state found after each cut.
    cut_states: BTreeMap<String, usize>,
    violations: Vec<String>,
    ops_per_cycle: u64,
    arm: bool,
    /// Boots where the script found no attempts left and reset them.
    exhausted: usize,
    /// Cuts this run makes.
    want: usize,
}

impl Campaign {
    fn slot_hash(&self, s: SlotName, len: usize) -> Sha256 {
        Sha256::of(&self.dev.slot_bytes(s)[..len])
    }

    fn holds_verified_image(&self, s: SlotName) -> Option<String> {
        self.verified
            .iter()
            .find(|((size, sha), _)| self.slot_hash(s, *size) == *sha)
            .map(|(_, name)| name.clone())
    }

    fn violation(&mut self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.push(what);
    }

    /// Start the daemon, register it to die with the power, arm the next cut.
    fn start(&mut self) {
        self.dev.start_daemon();
        let pid = self.dev.daemon_pid().expect("daemon pid");
        self.fs.clear_kill_on_cut();
        self.fs.kill_on_cut(pid);
        self.arm_next();
    }

    /// Arm the next cut at a random point of a cycle's writes.
    fn arm_next(&mut self) {
        if self.arm && self.cuts < self.want && self.ops_per_cycle > 0 {
            // Within half a cycle's writes: most cycles see two cuts or more.
            let k = 1 + self.rng.below(self.ops_per_cycle / 2);
            self.fs.arm_cut_after(k);
        }
    }

    /// Power-on after a cut: checks, boot script, new boot id, daemon.
    fn power_on(&mut self) {
        self.dev.kill_daemon();
        self.fs.restore_power().expect("power on");
        self.cuts += 1;
        // What the machine had persisted when the power went.
        let status = std::fs::read(self.dev.state_dir.join("updraft.db"))
            .ok()
            .map(|_| {
                let out = self.dev.updraft(&["status", "--json"]);
                serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
            });
        let state = status.as_ref().map(|v| {
            v["state"]
                .as_str()
                .map_or_else(|| "unreadable".into(), str::to_string)
        });
        // A release the database calls committed is one the bootloader
        // boots: the slot is made permanent before the commit is written.
        let committed_slot = status
            .as_ref()
            .filter(|v| v["state"] == json!("committed"))
            .and_then(|v| v["job"]["target"].as_str().map(str::to_string));
        *self
            .cut_states
            .entry(state.unwrap_or_else(|| "no database".into()))
            .or_default() += 1;
        if let Err(e) = updraft_tests::bootenv::fw_printenv(&self.dev.fw_env_config) {
            self.violation(format!(
                "cut {}: fw_printenv cannot read the environment: {e}",
                self.cuts
            ));
        }
        let (slot, size, sha) = self.committed;
        if self.slot_hash(slot, size) != sha {
            self.violation(format!(
                "cut {}: the committed slot {slot} changed",
                self.cuts
            ));
        }
        let chosen = self.boot();
        if let Some(target) = committed_slot {
            if chosen.to_string() != target {
                self.violation(format!(
                    "cut {}: the database says the release in slot {target} is committed, but the boot script booted slot {chosen}",
                    self.cuts
                ));
            }
        }
    }

    /// Run the boot script and start the daemon on the slot it chose;
    /// returns that slot.
    fn boot(&mut self) -> SlotName {
        self.fs.disarm();
        // Power cuts before the daemon re-marks the running slot good use up
        // its attempts; a boot script that finds none left resets the
        // counters (not the order) and resets the board, so the next
        // power-on boots again. That must then succeed.
        let slot = match self.dev.boot_script() {
            Some(s) => s,
            None => {
                self.exhausted += 1;
                match self.dev.boot_script() {
                    Some(s) => s,
                    None => {
                        self.violation(format!("after cut {}: no bootable slot", self.cuts));
                        panic!("no bootable slot: {:?}", self.dev.boot_vars());
                    }
                }
            }
        };
        if self.holds_verified_image(slot).is_none() {
            self.violation(format!(
                "after cut {}: the bootloader chose slot {slot}, which does not hold a verified image",
                self.cuts
            ));
        }
        self.dev.reboot_into(slot);
        self.start();
        slot
    }

    /// Drive the device until `done(status)`; handle cuts and the reboots
    /// the daemon asks for.
    fn drive(&mut self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let t = Instant::now();
        let cuts_at_start = self.cuts;
        self.arm_next();
        loop {
            assert!(
                t.elapsed() < SCENARIO_TIMEOUT,
                "{what} did not converge ({} cuts so far)\n{}",
                self.cuts,
                self.dev.log_tail()
            );
            if self.fs.is_dead() {
                self.power_on();
                // A scenario that keeps getting cut early still finishes.
                if self.cuts - cuts_at_start >= 8 {
                    self.fs.disarm();
                    self.arm = false;
                }
                continue;
            }
            if self.dev.reboot_marker.exists() {
                self.fs.disarm();
                self.dev.stop_daemon();
                if self.fs.is_dead() {
                    continue;
                }
                self.boot();
                continue;
            }
            let out = self.dev.updraft(&["status", "--json"]);
            if out.status.success() && !self.fs.is_dead() {
                if let Ok(st) = serde_json::from_slice::<Value>(&out.stdout) {
                    if done(&st) {
                        // Hold the power steady while the test looks at the
                        // slots; a cut that already happened is handled first.
                        self.fs.disarm();
                        if self.fs.is_dead() {
                            continue;
                        }
                        self.arm = true;
                        return st;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn publish(&mut self, version: &str, seed: u64) {
        let bytes = image_bytes(IMAGE, seed);
        let path = self.keys.join(format!("{version}.img"));
        std::fs::write(&path, &bytes).unwrap();
        self.server
            .repo
            .release(&[&self.key], version, &path, &["--frame-size", FRAME]);
        self.verified
            .insert((IMAGE, Sha256::of(&bytes)), version.to_string());
        // Ask for a check now rather than wait for the next poll (it may
        // fail if the power is out; the poll comes anyway).
        let _ = self.dev.updraft(&["check"]);
    }
}

#[test]
fn power_cuts_anywhere_in_the_update_cycle() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    if let Some(why) = powerfs::unavailable() {
        updraft_tests::skip!("{why}");
    }
    let keys = TempDir::new("powercut-keys");
    let key = keygen(keys.path(), "release");
    let disk = keys.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let fs = PowerFs::mount(&disk).expect("mounting the power-cut filesystem");
    let server = UpdateServer::start(&keys.join("site"), true);
    let mut spec = DeviceSpec::simple(&key);
    spec.boot = BootSpec::Uboot;
    spec.slot_size = SLOT as u64;
    spec.disk = Some(disk.clone());
    spec.server = server.server_toml("1s", "500ms");
    let dev = Device::new("powercut", spec);
    // Releases whose version ends in "-bad" fail their health check.
    dev.health_check(
        "10-app",
        "case \"$UPDRAFT_VERSION\" in *-bad) echo 'app failed to start' >&2; exit 1;; esac",
    );
    dev.init();
    fs.sync_all();
    let factory = Sha256::of(&dev.slot_bytes(SlotName::A));
    let seed: u64 = std::env::var("UPDRAFT_POWERCUT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cafe);
    eprintln!("power-cut schedule seed {seed:#x} (set UPDRAFT_POWERCUT_SEED to replay)");
    let mut c = Campaign {
        fs,
        dev,
        server,
        key,
        keys,
        rng: Rng(seed | 1),
        verified: BTreeMap::from([((SLOT, factory), "factory".to_string())]),
        committed: (SlotName::A, SLOT, factory),
        cuts: 0,
        cut_states: BTreeMap::new(),
        violations: Vec::new(),
        ops_per_cycle: 0,
        arm: false,
        exhausted: 0,
        want: if updraft_tests::bin::emulated() {
            WANT_CUTS_EMULATED
        } else {
            WANT_CUTS
        },
    };
    // Calibrate: one clean install and commit, counting filesystem writes.
    let ops0 = c.fs.mutating_ops();
    c.start();
    c.publish("1.0", 100);
    c.drive("the first release", |s| {
        s["running_version"] == json!("1.0") && s["state"] == json!("idle")
    });
    let booted = c.dev.booted();
    c.committed = (booted, IMAGE, c.slot_hash(booted, IMAGE));
    c.ops_per_cycle = (c.fs.mutating_ops() - ops0).max(50);
    eprintln!(
        "one clean install and commit took {} filesystem writes",
        c.ops_per_cycle
    );
    // Now cut the power again and again across installs, commits and
    // rollbacks until enough cuts happened.
    c.arm = true;
    c.dev.stop_daemon();
    c.start();
    let mut n = 1;
    let mut running = "1.0".to_string();
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    while c.cuts < c.want {
        n += 1;
        let bad = n % 3 == 0;
        let version = if bad {
            format!("{n}.0-bad")
        } else {
            format!("{n}.0")
        };
        c.publish(&version, 100 + n);
        // Converged: idle, and either running the release (committed) or
        // back on the previous one with the release rolled back (its health
        // check failed, or power cuts used up its trial boots: both are
        // rollbacks the bootloader and updraft must handle). Not merely
        // idle with the release in a slot: a daemon started after a cut
        // before the switch reached the environment is idle on the old
        // slot for a moment before it switches again, and 13.0 was once
        // taken for rolled back there and then committed unseen.
        let v = version.clone();
        let st = c.drive(&format!("release {version}"), move |s| {
            s["state"] == json!("idle")
                && (s["running_version"] == json!(v)
                    || (s["last_install"]["release"] == json!(v)
                        && s["last_install"]["result"] == json!("rolled_back")))
        });
        if st["running_version"] == json!(version) {
            assert!(!bad, "release {version} passed a health check that fails");
            *outcomes.entry("committed").or_default() += 1;
            running = version.clone();
            let booted = c.dev.booted();
            c.committed = (booted, IMAGE, c.slot_hash(booted, IMAGE));
        } else {
            assert_eq!(st["running_version"], json!(running), "{st:#}");
            *outcomes
                .entry(if bad {
                    "rolled back (health check)"
                } else {
                    "rolled back (trial boots used up)"
                })
                .or_default() += 1;
        }
        assert!(
            n < 200,
            "too many releases without reaching {} cuts",
            c.want
        );
    }
    // Settle: no more cuts; every report reaches the server.
    c.fs.disarm();
    c.arm = false;
    let t = Instant::now();
    loop {
        if c.fs.is_dead() {
            c.power_on();
            continue;
        }
        let st = c.dev.status();
        if st["outbox"] == json!(0) {
            break;
        }
        assert!(
            t.elapsed() < SCENARIO_TIMEOUT,
            "the outbox never drained: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let collector = c.server.collector.as_ref().unwrap();
    let all = collector.reports();
    let mut unique: Vec<(i64, Vec<u8>)> = collector
        .unique_reports()
        .into_iter()
        .filter_map(|r| Some((r.json().ok()?["sequence"].as_i64()?, r.body)))
        .collect();
    unique.sort_by_key(|(seq, _)| *seq);
    let mut by_key: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut conflicts = 0;
    for r in &all {
        let body = r.json().unwrap();
        let key = r.idempotency_key.clone().unwrap_or_default();
        let seq = body["sequence"].as_i64().unwrap();
        let kind = body["kind"].as_str().unwrap_or("").to_string();
        if let Some((s, _)) = by_key.insert(key.clone(), (seq, kind)) {
            if s != seq {
                conflicts += 1;
            }
        }
    }
    let seqs: BTreeSet<i64> = by_key.values().map(|(s, _)| *s).collect();
    let first = *seqs.iter().next().unwrap();
    let last = *seqs.iter().last().unwrap();
    let gaps: Vec<i64> = (first..=last).filter(|s| !seqs.contains(s)).collect();
    if !gaps.is_empty() {
        c.violation(format!("report sequence gaps: {gaps:?}"));
    }
    if seqs.len() != by_key.len() {
        c.violation(format!(
            "{} keys but {} distinct sequence numbers",
            by_key.len(),
            seqs.len()
        ));
    }
    if conflicts > 0 {
        c.violation(format!(
            "{conflicts} reports re-sent under one key with another sequence"
        ));
    }
    // Signed, and no report counter handed out twice: the reports kept
    // after de-duplication, in sequence order, verify as one device's
    // unbroken stream.
    let st = c.dev.status();
    match st["identity"]["public_key"]
        .as_str()
        .and_then(|k| updraft::envelope::decode_base64(k, "public_key").ok())
        .and_then(|raw| <[u8; 32]>::try_from(raw).ok())
        .and_then(|raw| updraft::trust::PublicKey::from_bytes(&raw).ok())
    {
        None => c.violation(format!("no usable device key in the status: {st:#}")),
        Some(key) => {
            let mut v = updraft_publish::reports::Verifier::new(vec![key]);
            for (seq, body) in &unique {
                let line = v.check(&format!("sequence {seq}"), body);
                if !line.ends_with(": ok") {
                    c.violation(format!("signed reports: {line}"));
                }
            }
        }
    }
    let installs = by_key.values().filter(|(_, k)| k == "install").count();
    eprintln!(
        "power cuts: {} (persisted state at the cut: {:?}); releases: {n} ({outcomes:?}); reports: {} sent, {} after de-duplication ({} duplicates), {installs} install results; boots that found every attempt used and reset the counters: {}; violations: {}",
        c.cuts,
        c.cut_states,
        all.len(),
        by_key.len(),
        all.len() - by_key.len(),
        c.exhausted,
        c.violations.len()
    );
    assert!(
        c.violations.is_empty(),
        "{} violations:\n{}",
        c.violations.len(),
        c.violations.join("\n")
    );
    assert!(c.cuts >= c.want);
    c.dev.stop_daemon();
}
