//! The update cycle on the VM, scenario by scenario, on one disk whose
//! state carries from one scenario to the next (as a device's would):
//!
//! 1. a full-image update from the factory release in A to B, committed,
//!    and the next boot still in B;
//! 3. a release whose health check fails: rolled back by a reboot into the
//!    old slot, reported, not tried again;
//! 4. a release that cannot boot (its init exits, the kernel panics and
//!    reboots): GRUB falls back, and the daemon records the rollback; then
//!    one that hangs, reset by the watchdog, with the same outcome;
//! 2. a delta update from the running slot, applied without falling back
//!    to the full image;
//! 5. power cuts (`--cuts N --seed S`): QEMU is killed at an instant chosen
//!    from a console marker plus seeded jitter, in the download, the write,
//!    the bootloader-environment write and switch, the reboot, the first
//!    boot and the commit; the machine is started again and must boot a
//!    verified slot and converge, with every install report delivered.
//!
//! Each scenario runs one QEMU machine (reboots happen inside it), asserts
//! what the serial console showed, powers the guest off cleanly, and then
//! asserts what is on the disk: the GRUB environment (`grub-editenv list`)
//! and updraft's history (`updraft history --json` on the host, over a copy
//! of the data partition's state directory).
//!
//! This module owns the update server (nginx over TLS on 127.0.0.1 with a
//! test CA, and a report collector), the releases and the assertions. It
//! must never build disk or guest files itself (that is `disk` and `guest`)
//! nor handle QEMU's process (that is `console`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use updraft_tests::ca::TestCa;
use updraft_tests::collector::Collector;
use updraft_tests::nginx::Nginx;
use updraft_tests::publisher::{KeyPair, Repo, keygen, publish_ok};

use super::console::{Boot, Vm};
use super::disk::{self, BOOT, DATA};
use super::guest::{
    Behaviour, COMPATIBLE, GRUB_MARK, Guest, HALT_MARK, Release, STATUS_MARK, Settings,
    USERSPACE_MARK,
};
use crate::util::{self, Result};

/// A boot under TCG takes 5–12 s; an install of a slot image about a
/// minute. These bound each wait generously for a loaded machine.
const BOOT_WAIT: Duration = Duration::from_secs(120);
const INSTALL_WAIT: Duration = Duration::from_secs(600);
const SETTLE_WAIT: Duration = Duration::from_secs(120);

/// The guest reaches the host's loopback as this address (QEMU's user
/// network), so the server certificate is issued for it.
const HOST_FROM_GUEST: &str = "10.0.2.2";

/// The GRUB configuration's own lines, before the shipped fragment: the
/// serial console and a marker line for the harness.
const GRUB_HEADER: &str = "serial --unit=0 --speed=115200\n\
     terminal_input serial\n\
     terminal_output serial\n";

/// Where a power cut is aimed: after the console shows a line holding
/// every part of `marker` for the release, wait a seeded jitter below
/// `jitter_ms`, then cut.
struct CutPoint {
    phase: &'static str,
    /// Parts of the console line (a daemon log line, the guest's marker);
    /// `{v}` is the release.
    marker: &'static [&'static str],
    jitter_ms: u64,
}

/// The cut points, in the order of an update.
const CUT_POINTS: &[CutPoint] = &[
    CutPoint {
        phase: "download",
        marker: &["downloading: release {v} "],
        jitter_ms: 1500,
    },
    CutPoint {
        phase: "write",
        marker: &["downloading: release {v} "],
        jitter_ms: 8000,
    },
    CutPoint {
        phase: "bootloader environment and switch",
        marker: &["installed: release {v} "],
        jitter_ms: 400,
    },
    CutPoint {
        phase: "reboot",
        marker: &["rebooting: release {v} "],
        jitter_ms: 800,
    },
    CutPoint {
        phase: "first boot",
        marker: &[USERSPACE_MARK, " version={v} "],
        jitter_ms: 2000,
    },
    CutPoint {
        phase: "commit",
        marker: &["testing: release {v} "],
        jitter_ms: 300,
    },
];

/// What one power cut found.
pub struct Cut {
    pub release: String,
    pub phase: &'static str,
    /// Milliseconds after the marker the power went.
    pub after_ms: u64,
    /// The daemon's state in the last status line before the cut.
    pub state_before: String,
    /// How the release ended after power came back.
    pub result: String,
    pub boots_after: usize,
}

/// What one scenario measured.
pub struct Outcome {
    pub name: String,
    pub boots: Vec<Boot>,
    pub qemu_time: Duration,
}

/// The server, the keys, the guest files and the disk.
pub struct Lab {
    work: PathBuf,
    disk: PathBuf,
    bin_dir: PathBuf,
    key: KeyPair,
    site: PathBuf,
    nginx: Nginx,
    collector: Collector,
    _ca: TestCa,
    guest: Guest,
    settings: Settings,
    images: BTreeMap<String, PathBuf>,
    pub outcomes: Vec<Outcome>,
    pub cuts: Vec<Cut>,
}

impl Lab {
    /// Start the server and build the factory disk: release 1.0 in slot A,
    /// slot B empty, GRUB with the shipped fragment.
    pub fn new(work: &Path, bin_dir: &Path) -> Result<Lab> {
        let site = work.join("site");
        mkdir(&site)?;
        let key = keygen(work, "release");
        let ca = TestCa::new("updraft VM test CA").map_err(|e| format!("making a test CA: {e}"))?;
        let collector =
            Collector::start().map_err(|e| format!("starting the report collector: {e}"))?;
        let nginx = Nginx::builder(&site)
            .ca(&ca)
            .tls_names(&[HOST_FROM_GUEST])
            .keepalive_timeout(30)
            .report_to("/report", collector.addr())
            .in_dir(work)
            .start()
            .map_err(|e| format!("starting nginx: {e}"))?;
        let port = nginx.port();
        println!(
            "nginx serves {} at https://127.0.0.1:{port}/ (https://{HOST_FROM_GUEST}:{port}/ from the guest)",
            site.display()
        );
        let settings = Settings {
            manifest_url: format!("https://{HOST_FROM_GUEST}:{port}/manifest.json"),
            report_url: format!("https://{HOST_FROM_GUEST}:{port}/report"),
            ca_file: nginx.ca_file().to_path_buf(),
            release_key: key.public.clone(),
        };
        let guest = Guest::prepare(&bin_dir.join("updraft"), work)?;
        println!("kernel {}", guest.kernel.version);
        let mut lab = Lab {
            work: work.to_path_buf(),
            disk: work.join("disk.img"),
            bin_dir: bin_dir.to_path_buf(),
            key,
            site,
            nginx,
            collector,
            _ca: ca,
            guest,
            settings,
            images: BTreeMap::new(),
            outcomes: Vec::new(),
            cuts: Vec::new(),
        };
        lab.build_disk()?;
        Ok(lab)
    }

    fn build_disk(&mut self) -> Result {
        let t = Instant::now();
        let w = &self.work.clone();
        let boot = w.join("bootfs");
        mkdir(&boot.join("grub"))?;
        self.guest.initramfs(w, &boot.join("initrd.img"))?;
        std::fs::write(boot.join("grub/grub.cfg"), grub_cfg()?)
            .map_err(|e| format!("writing grub.cfg: {e}"))?;
        disk::make_grubenv(
            &boot.join("grub/grubenv"),
            &[
                ("ORDER", "A B"),
                ("A_OK", "1"),
                ("A_TRY", "0"),
                ("B_OK", "0"),
                ("B_TRY", "0"),
            ],
        )?;
        let boot_img = w.join("boot.ext4");
        disk::mkfs(&boot, &boot_img, BOOT.size_mib, "boot")?;
        let data = w.join("datafs");
        mkdir(&data)?;
        let data_img = w.join("data.ext4");
        disk::mkfs(&data, &data_img, DATA.size_mib, "data")?;
        let a = self.image(&Release {
            version: "1.0".into(),
            behaviour: Behaviour::Healthy,
        })?;
        let empty = w.join("empty.img");
        std::fs::write(&empty, b"").map_err(|e| format!("writing {}: {e}", empty.display()))?;
        disk::assemble(&self.disk, w, [&boot_img, &a, &empty, &data_img])?;
        println!(
            "disk {} built in {:.1} s: boot, rootfs A (release 1.0), rootfs B (empty), data",
            self.disk.display(),
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// The slot image of a release, made once.
    fn image(&mut self, r: &Release) -> Result<PathBuf> {
        if let Some(p) = self.images.get(&r.version) {
            return Ok(p.clone());
        }
        let out = self.work.join(format!("rootfs-{}.ext4", r.version));
        self.guest.rootfs(r, &self.settings, &self.work, &out)?;
        self.images.insert(r.version.clone(), out.clone());
        Ok(out)
    }

    /// Publish `r`, with a delta from each of `from`.
    fn publish(&mut self, r: &Release, from: &[&str]) -> Result {
        let img = self.image(r)?;
        let mut args: Vec<String> = vec![
            "release".into(),
            "--key".into(),
            self.key.key.display().to_string(),
            "--version".into(),
            r.version.clone(),
            "--compatible".into(),
            COMPATIBLE.into(),
            "--image".into(),
            img.display().to_string(),
            "--level".into(),
            "3".into(),
            "--out".into(),
            self.site.display().to_string(),
        ];
        for v in from {
            let base = self
                .images
                .get(*v)
                .ok_or_else(|| format!("no image of release {v} to make a delta from"))?;
            args.push("--from".into());
            args.push(base.display().to_string());
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        publish_ok(&refs);
        println!(
            "published {} ({:?}){}",
            r.version,
            r.behaviour,
            if from.is_empty() {
                String::new()
            } else {
                format!(" with a delta from {}", from.join(", "))
            }
        );
        Ok(())
    }

    fn start(&self, name: &str) -> Result<Vm> {
        println!("\n== {name}");
        Vm::start(
            name,
            &self.disk,
            &self.work.join(format!("{name}.console.log")),
        )
    }

    /// Power the guest off cleanly and record the machine's boots.
    fn finish(&mut self, mut vm: Vm, name: &str) -> Result {
        let from = vm.mark();
        vm.send("vm-poweroff")?;
        vm.wait_line("the guest to halt", from, BOOT_WAIT, |l| {
            l.contains(HALT_MARK)
        })?;
        vm.wait_exit(BOOT_WAIT)?;
        self.record(vm, name)
    }

    /// Record the boots of a machine that has ended.
    fn record(&mut self, vm: Vm, name: &str) -> Result {
        let qemu_time = vm.started().elapsed();
        for b in vm.boots() {
            println!(
                "   boot: slot {} release {}: {}",
                b.slot.as_deref().unwrap_or("?"),
                b.version.as_deref().unwrap_or("?"),
                b.to_userspace()
                    .map(|d| format!(
                        "{:.1} s from reset to userspace ({:.1} s of it firmware and GRUB)",
                        d.as_secs_f64(),
                        b.to_grub().as_secs_f64()
                    ))
                    .unwrap_or_else(|| "never reached userspace".into())
            );
        }
        println!("   {:.1} s in qemu", qemu_time.as_secs_f64());
        self.outcomes.push(Outcome {
            name: name.to_string(),
            boots: vm.boots().to_vec(),
            qemu_time,
        });
        Ok(())
    }

    /// Scenario 1: a full-image update into B, committed; the next boot is B again.
    pub fn full_update(&mut self) -> Result {
        let name = "1-full-update";
        let v2 = healthy("2.0");
        self.publish(&v2, &[])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "A", "1.0", 0)?;
        let m = vm.mark();
        wait_userspace(&mut vm, "B", "2.0", m).map_err(|e| format!("no trial boot of 2.0: {e}"))?;
        let st = wait_status(&mut vm, "2.0 committed in B", |s| {
            committed(s, "2.0") && s["booted_slot"] == "B"
        })?;
        println!(
            "   console: 2.0 was written to B, booted and committed; next boot {}",
            st["next_boot"]
        );
        let m = vm.mark();
        vm.send("vm-reboot")?;
        wait_userspace(&mut vm, "B", "2.0", m).map_err(|e| format!("after the commit: {e}"))?;
        wait_status(&mut vm, "2.0 running after a reboot", |s| {
            s["booted_slot"] == "B" && s["running_version"] == "2.0" && s["state"] == "idle"
        })?;
        println!("   console: the next boot is B with 2.0 again");
        self.finish(vm, name)?;

        let env = self.grubenv()?;
        expect_env(&env, &[("ORDER", "B A"), ("B_OK", "1"), ("B_TRY", "0")])?;
        let h = self.history()?;
        expect_event(&h, "committed", "2.0", Some("B"))?;
        println!(
            "   disk: grubenv {}; history: 2.0 committed in B",
            show_env(&env)
        );
        Ok(())
    }

    /// Scenario 3: a release whose health check fails: rolled back by a reboot,
    /// reported, and not tried again.
    pub fn failed_health_check(&mut self) -> Result {
        let name = "3-health-check-fails";
        let v3 = Release {
            version: "3.0".into(),
            behaviour: Behaviour::FailsHealthCheck,
        };
        self.publish(&v3, &[])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "B", "2.0", 0)?;
        let m = vm.mark();
        wait_userspace(&mut vm, "A", "3.0", m).map_err(|e| format!("no trial boot of 3.0: {e}"))?;
        let m = vm.mark();
        wait_userspace(&mut vm, "B", "2.0", m).map_err(|e| format!("no rollback reboot: {e}"))?;
        let st = wait_status(&mut vm, "3.0 rolled back", |s| rolled_back(s, "3.0"))?;
        println!(
            "   console: 3.0 failed its health check in A and was rolled back: {}",
            st["last_install"]["reason"]
        );
        let report = self.wait_report("3.0", "rolled_back")?;
        println!(
            "   the server got the install report: result rolled_back, reason {}",
            report["reason"]
        );
        // Several polls later, 3.0 has not been downloaded again.
        let after = vm.mark();
        std::thread::sleep(Duration::from_secs(15));
        vm.drain();
        let later = &vm.lines()[after..];
        if later.iter().any(|l| l.contains(USERSPACE_MARK)) {
            return Err(vm.failure("the machine rebooted again after the rollback"));
        }
        let mut polls: Vec<String> = later
            .iter()
            .filter_map(|l| status_of(l))
            .filter_map(|s| s["last_check"].as_str().map(str::to_string))
            .collect();
        polls.dedup();
        if polls.len() < 2 {
            return Err(vm.failure("the daemon did not poll in the 15 s after the rollback"));
        }
        if let Some(s) = later
            .iter()
            .filter_map(|l| status_of(l))
            .find(|s| s["state"] != "idle")
        {
            return Err(vm.failure(&format!(
                "after the rollback the daemon left idle for {} (state {})",
                s["job"]["version"], s["state"]
            )));
        }
        println!(
            "   console: {} polls in 15 s after the rollback, none installing 3.0 again",
            polls.len()
        );
        self.finish(vm, name)?;

        let env = self.grubenv()?;
        expect_env(&env, &[("ORDER", "B"), ("A_OK", "0"), ("B_OK", "1")])
            .or_else(|_| expect_env(&env, &[("A_OK", "0"), ("B_OK", "1"), ("B_TRY", "0")]))?;
        let h = self.history()?;
        expect_event(&h, "rolled-back", "3.0", None)?;
        let downloads = count_events(&h, "download", "3.0");
        if downloads != 1 {
            return Err(format!(
                "3.0 was downloaded {downloads} times; a rolled-back release must not be tried again\n{}",
                show_history(&h)
            ));
        }
        println!(
            "   disk: grubenv {}; history: 3.0 downloaded once, rolled back",
            show_env(&env)
        );
        Ok(())
    }

    /// Scenario 4: a release that cannot boot: the kernel panics, GRUB's try flag
    /// makes the next boot the old slot, and the daemon records the
    /// rollback there.
    pub fn cannot_boot(&mut self) -> Result {
        self.unbootable(
            "4-cannot-boot",
            "4.0",
            Behaviour::CannotBoot,
            "Kernel panic",
        )
    }

    /// Scenario 4, hung: the release's init hangs, the watchdog resets the machine,
    /// and the outcome is the same.
    pub fn hangs(&mut self) -> Result {
        self.unbootable(
            "4-hangs",
            "4.1",
            Behaviour::Hangs,
            "softdog: Initiating system reboot",
        )
    }

    fn unbootable(
        &mut self,
        name: &str,
        version: &str,
        behaviour: Behaviour,
        reset: &str,
    ) -> Result {
        let release = Release {
            version: version.into(),
            behaviour,
        };
        self.publish(&release, &[])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "B", "2.0", 0)?;
        let m = vm.mark();
        wait_userspace(&mut vm, "A", version, m)
            .map_err(|e| format!("no trial boot of {version}: {e}"))?;
        let m = vm.mark();
        vm.wait_line(&format!("the reset ({reset})"), m, BOOT_WAIT, |l| {
            l.contains(reset)
        })?;
        let m = vm.mark();
        vm.wait_line("GRUB after the reset", m, BOOT_WAIT, |l| {
            l.contains(GRUB_MARK)
        })?;
        wait_userspace(&mut vm, "B", "2.0", m).map_err(|e| format!("no fallback to B: {e}"))?;
        let st = wait_status(&mut vm, &format!("{version} rolled back"), |s| {
            rolled_back(s, version)
        })?;
        println!(
            "   console: {version} did not come up in A ({reset}), GRUB fell back to B: {}",
            st["last_install"]["reason"]
        );
        self.wait_report(version, "rolled_back")?;
        self.finish(vm, name)?;

        let env = self.grubenv()?;
        expect_env(&env, &[("A_OK", "0"), ("B_OK", "1"), ("B_TRY", "0")])?;
        let h = self.history()?;
        expect_event(&h, "rolled-back", version, None)?;
        println!(
            "   disk: grubenv {}; history: {version} rolled back",
            show_env(&env)
        );
        Ok(())
    }

    /// Scenario 2: a delta update from the running slot (2.0 in B) into A.
    pub fn delta_update(&mut self) -> Result {
        let name = "2-delta-update";
        let v5 = healthy("5.0");
        self.publish(&v5, &["2.0"])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "B", "2.0", 0)?;
        let m = vm.mark();
        wait_userspace(&mut vm, "A", "5.0", m).map_err(|e| format!("no trial boot of 5.0: {e}"))?;
        wait_status(&mut vm, "5.0 committed in A", |s| {
            committed(s, "5.0") && s["booted_slot"] == "A"
        })?;
        println!("   console: 5.0 was applied as a delta to A, booted and committed");
        self.finish(vm, name)?;

        let env = self.grubenv()?;
        expect_env(&env, &[("ORDER", "A B"), ("A_OK", "1"), ("A_TRY", "0")])?;
        let h = self.history()?;
        expect_event(&h, "committed", "5.0", Some("A"))?;
        let delta = h.iter().any(|e| {
            e["event"] == "download"
                && e["release"] == "5.0"
                && e["detail"].as_str().is_some_and(|d| d.starts_with("delta"))
        });
        let fallback = count_events(&h, "delta-fallback", "5.0");
        let installed_as = h
            .iter()
            .filter(|e| e["event"] == "installed" && e["release"] == "5.0")
            .filter_map(|e| e["detail"].as_str())
            .collect::<Vec<_>>()
            .join("; ");
        if !delta || fallback != 0 || !installed_as.contains("delta") {
            return Err(format!(
                "5.0 was not installed from its delta (installed: {installed_as:?}; \
                 the console log {} shows why):\n{}",
                self.work.join(format!("{name}.console.log")).display(),
                show_history(&h)
            ));
        }
        // The server saw the delta fetched, and the full image never.
        let payload = Repo::new(self.site.clone()).payload();
        let full_url = payload["artifact"]["url"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let log = self
            .nginx
            .access_log()
            .map_err(|e| format!("reading nginx's access log: {e}"))?;
        let fetched_full = log
            .iter()
            .filter(|e| e.method == "GET" && !full_url.is_empty() && e.uri.ends_with(&full_url))
            .count();
        if fetched_full != 0 {
            return Err(format!(
                "the full image of 5.0 ({full_url}) was fetched {fetched_full} times besides its delta"
            ));
        }
        println!(
            "   disk: grubenv {}; history: 5.0 installed from its delta, committed in A; \
             nginx never served its full image",
            show_env(&env)
        );
        Ok(())
    }

    /// Scenario 5: `n` power cuts, one per release, at points cycling
    /// through [`CUT_POINTS`] from `seed` with seeded jitter. After each,
    /// the machine must boot a verified slot and the release converge:
    /// committed, or (a cut during the trial boot or its checks) rolled
    /// back with the old release running; its install report must reach
    /// the server. Releases alternate between a full image and a delta
    /// from the running release.
    pub fn power_cuts(&mut self, n: u32, seed: u64) -> Result {
        let mut rng = updraft_tests::rng::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut running = self.running_release()?;
        for i in 0..n {
            let point = &CUT_POINTS[(seed as usize + i as usize) % CUT_POINTS.len()];
            let version = format!("6.{i}");
            let from: Vec<&str> = if i % 2 == 1 {
                vec![running.as_str()]
            } else {
                Vec::new()
            };
            self.publish(&healthy(&version), &from)?;
            let name = format!("5-cut-{i}-{}", point.phase.replace(' ', "-"));
            let mut vm = self.start(&name)?;
            let parts: Vec<String> = point
                .marker
                .iter()
                .map(|p| p.replace("{v}", &version))
                .collect();
            let marker = parts.join("…");
            vm.wait_line(
                &format!("{marker:?} on the console"),
                0,
                INSTALL_WAIT,
                |l| parts.iter().all(|p| l.contains(p.as_str())),
            )?;
            let after_ms = rng.below(point.jitter_ms);
            std::thread::sleep(Duration::from_millis(after_ms));
            vm.power_cut()?;
            let state_before = vm
                .lines()
                .iter()
                .rev()
                .find_map(|l| status_of(l))
                .and_then(|s| s["state"].as_str().map(str::to_string))
                .unwrap_or_else(|| "?".into());
            println!(
                "   power cut {after_ms} ms after {marker:?} (last state seen: {state_before})"
            );
            self.record(vm, &name)?;

            let name_after = format!("{name}-after");
            let mut vm = self.start(&name_after)?;
            let st = wait_status_for(&mut vm, &format!("{version} settled"), INSTALL_WAIT, |s| {
                s["state"] == "idle"
                    && s["last_install"]["release"] == version.as_str()
                    && (s["last_install"]["result"] == "committed"
                        || s["last_install"]["result"] == "rolled_back")
            })?;
            let result = st["last_install"]["result"]
                .as_str()
                .unwrap_or("?")
                .to_string();
            let trial_cut = matches!(point.phase, "first boot" | "commit" | "reboot");
            if result != "committed" && !trial_cut {
                return Err(vm.failure(&format!(
                    "a power cut in the {} of {version} ended it as {result}: it must resume and commit",
                    point.phase
                )));
            }
            let expect_running = if result == "committed" {
                version.clone()
            } else {
                running.clone()
            };
            if st["running_version"] != expect_running.as_str() {
                return Err(vm.failure(&format!(
                    "after the cut, {version} {result} but the device runs {}",
                    st["running_version"]
                )));
            }
            let boots_after = vm.boots().len();
            for b in vm.boots() {
                if b.to_userspace().is_none() {
                    return Err(vm.failure("after the cut a boot never reached userspace"));
                }
            }
            // `result` is `last_install.result`, the install report's.
            self.wait_report(&version, &result)?;
            println!(
                "   after the cut: {version} {result}, running {expect_running}, {boots_after} boots, install report delivered"
            );
            self.finish(vm, &name_after)?;
            let env = self.grubenv()?;
            let h = self.history()?;
            let settled = if result == "committed" {
                "committed"
            } else {
                "rolled-back"
            };
            expect_event(&h, settled, &version, None)?;
            println!(
                "   disk: grubenv {}; history: {version} {settled}",
                show_env(&env)
            );
            self.cuts.push(Cut {
                release: version.clone(),
                phase: point.phase,
                after_ms,
                state_before,
                result,
                boots_after,
            });
            running = expect_running;
        }
        Ok(())
    }

    /// The release the device runs, from its state on the disk.
    fn running_release(&self) -> Result<String> {
        let h = self.history()?;
        h.iter()
            .rev()
            .find(|e| e["event"] == "committed")
            .and_then(|e| e["release"].as_str())
            .map(str::to_string)
            .ok_or_else(|| {
                "no committed release in the history to start the power cuts from".into()
            })
    }

    fn grubenv(&self) -> Result<BTreeMap<String, String>> {
        disk::grubenv(&self.disk, &self.work)
    }

    /// `updraft history --json` over a copy of the data partition's state.
    fn history(&self) -> Result<Vec<Value>> {
        let copy = self.work.join("state-copy");
        let _ = std::fs::remove_dir_all(&copy);
        mkdir(&copy)?;
        disk::dump_dir(&self.disk, DATA, "/updraft", &copy, &self.work)?;
        let state = copy.join("updraft");
        let grubenv = self.work.join("grubenv.host");
        std::fs::write(
            &grubenv,
            disk::read_file(&self.disk, BOOT, "/grub/grubenv", &self.work)?,
        )
        .map_err(|e| format!("writing {}: {e}", grubenv.display()))?;
        let (a, b) = (self.work.join("slot-a.host"), self.work.join("slot-b.host"));
        for p in [&a, &b] {
            std::fs::write(p, b"").map_err(|e| format!("writing {}: {e}", p.display()))?;
        }
        let config = self.work.join("host-updraft.toml");
        std::fs::write(
            &config,
            format!(
                "[device]\ncompatible = {COMPATIBLE:?}\nid_file = {id:?}\n\
                 [trust]\nkeys = [{key:?}]\n\
                 [slots]\na = {a:?}\nb = {b:?}\ncmdline = {cmdline:?}\n\
                 [bootloader]\nkind = \"grub\"\ngrubenv = {grubenv:?}\n\
                 [system]\nstate_dir = {state:?}\nsocket = {sock:?}\n",
                id = state.join("device-id"),
                key = self.key.public,
                cmdline = self.work.join("cmdline.host"),
                sock = self.work.join("host.sock"),
            ),
        )
        .map_err(|e| format!("writing {}: {e}", config.display()))?;
        std::fs::write(self.work.join("cmdline.host"), "updraft.slot=A\n")
            .map_err(|e| format!("writing the host cmdline: {e}"))?;
        let out = util::output(
            Command::new(self.bin_dir.join("updraft"))
                .arg("--config")
                .arg(&config)
                .args(["history", "--json"]),
        )?;
        let v: Value = serde_json::from_str(&out)
            .map_err(|e| format!("updraft history --json printed no JSON ({e}):\n{out}"))?;
        v.as_array()
            .cloned()
            .ok_or_else(|| format!("updraft history --json printed no list:\n{out}"))
    }

    /// The install report of `version` with `result`, as the collector got it.
    fn wait_report(&self, version: &str, result: &str) -> Result<Value> {
        let deadline = Instant::now() + SETTLE_WAIT;
        loop {
            let found = self
                .collector
                .reports()
                .iter()
                .filter_map(|r| r.json().ok())
                .find(|j| {
                    j["kind"] == "install"
                        && j["job"]["release"] == version
                        && j["result"] == result
                });
            if let Some(j) = found {
                return Ok(j);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no install report of {version} with result {result} reached the server in {} s",
                    SETTLE_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

fn healthy(version: &str) -> Release {
    Release {
        version: version.into(),
        behaviour: Behaviour::Healthy,
    }
}

/// `grub.cfg` on the boot partition: the serial console, a marker line,
/// then the shipped fragment rendered for this disk.
fn grub_cfg() -> Result<String> {
    let template_path =
        util::root().join("yocto/meta-updraft/recipes-bsp/updraft-bootfiles/files/grub.cfg.in");
    let template = std::fs::read_to_string(&template_path)
        .map_err(|e| format!("reading {}: {e}", template_path.display()))?;
    let initrd = format!("initrd16 (hd0,msdos{})/initrd.img", BOOT.number);
    let values = [
        ("UPDRAFT_GRUB_TIMEOUT", "0".to_string()),
        ("UPDRAFT_GRUB_DISK", "hd0".to_string()),
        ("UPDRAFT_GRUB_PARTMAP", "msdos".to_string()),
        ("UPDRAFT_GRUB_LINUX", "linux16".to_string()),
        ("UPDRAFT_GRUB_INITRD", initrd),
        ("UPDRAFT_PART_A", disk::SLOT_A.number.to_string()),
        ("UPDRAFT_PART_B", disk::SLOT_B.number.to_string()),
        ("UPDRAFT_KERNEL_PATH", "/boot/vmlinuz".to_string()),
        ("UPDRAFT_PARTUUID_A", disk::SLOT_A.partuuid()),
        ("UPDRAFT_PARTUUID_B", disk::SLOT_B.partuuid()),
        ("UPDRAFT_PANIC_SECONDS", "5".to_string()),
        (
            "UPDRAFT_EXTRA_BOOTARGS",
            "console=ttyS0,115200 quiet".to_string(),
        ),
    ];
    let mut text = template;
    for (k, v) in &values {
        text = text.replace(&format!("@@{k}@@"), v);
    }
    if let Some(rest) = text.split("@@").nth(1) {
        return Err(format!(
            "{} has a placeholder the VM does not fill: @@{}@@",
            template_path.display(),
            rest.split("@@").next().unwrap_or(rest)
        ));
    }
    Ok(format!("{GRUB_HEADER}echo \"{GRUB_MARK}\"\n{text}"))
}

fn wait_userspace(vm: &mut Vm, slot: &str, version: &str, from: usize) -> Result<String> {
    let want_slot = format!("slot={slot} ");
    let want_version = format!("version={version} ");
    let wait = if from == 0 { BOOT_WAIT } else { INSTALL_WAIT };
    vm.wait_line(
        &format!("a boot of slot {slot} with release {version}"),
        from,
        wait,
        |l| l.contains(USERSPACE_MARK) && l.contains(&want_slot) && l.contains(&want_version),
    )
}

/// Wait for a status line whose JSON satisfies `pred`; that JSON.
fn wait_status(vm: &mut Vm, what: &str, pred: impl FnMut(&Value) -> bool) -> Result<Value> {
    wait_status_for(vm, what, SETTLE_WAIT, pred)
}

/// [`wait_status`] with its own bound.
fn wait_status_for(
    vm: &mut Vm,
    what: &str,
    timeout: Duration,
    mut pred: impl FnMut(&Value) -> bool,
) -> Result<Value> {
    let from = vm.mark();
    let line = vm.wait_line(what, from, timeout, |l| {
        status_of(l).is_some_and(|s| pred(&s))
    })?;
    status_of(&line).ok_or_else(|| format!("status line without JSON: {line}"))
}

fn status_of(line: &str) -> Option<Value> {
    let json = line.split(STATUS_MARK).nth(1)?;
    serde_json::from_str(json).ok()
}

fn committed(s: &Value, version: &str) -> bool {
    s["state"] == "idle"
        && s["running_version"] == version
        && s["last_install"]["release"] == version
        && s["last_install"]["result"] == "committed"
}

fn rolled_back(s: &Value, version: &str) -> bool {
    s["state"] == "idle"
        && s["last_install"]["release"] == version
        && s["last_install"]["result"] == "rolled_back"
}

fn expect_env(env: &BTreeMap<String, String>, want: &[(&str, &str)]) -> Result {
    for (k, v) in want {
        if env.get(*k).map(String::as_str) != Some(*v) {
            return Err(format!(
                "grubenv: expected {k}={v}, found {}",
                show_env(env)
            ));
        }
    }
    Ok(())
}

fn show_env(env: &BTreeMap<String, String>) -> String {
    env.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn expect_event(h: &[Value], event: &str, release: &str, slot: Option<&str>) -> Result {
    let hit = h.iter().any(|e| {
        e["event"] == event && e["release"] == release && slot.is_none_or(|s| e["slot"] == s)
    });
    if hit {
        Ok(())
    } else {
        Err(format!(
            "the history on the data partition has no {event} of {release}{}:\n{}",
            slot.map(|s| format!(" in slot {s}")).unwrap_or_default(),
            show_history(h)
        ))
    }
}

fn count_events(h: &[Value], event: &str, release: &str) -> usize {
    h.iter()
        .filter(|e| e["event"] == event && e["release"] == release)
        .count()
}

fn show_history(h: &[Value]) -> String {
    h.iter()
        .map(|e| {
            format!(
                "  {} {} {} {} {}",
                e["time"].as_str().unwrap_or(""),
                e["event"].as_str().unwrap_or(""),
                e["release"].as_str().unwrap_or("-"),
                e["slot"].as_str().unwrap_or("-"),
                e["detail"].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn mkdir(p: &Path) -> Result {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_fragment_renders_for_the_vm_disk() {
        let cfg = grub_cfg().unwrap_or_else(|e| panic!("{e}"));
        assert!(!cfg.contains("@@"), "{cfg}");
        assert!(cfg.starts_with(GRUB_HEADER));
        assert!(cfg.contains(&format!("echo \"{GRUB_MARK}\"")));
        assert!(cfg.contains(
            "linux16 (hd0,msdos2)/boot/vmlinuz root=PARTUUID=75706466-02 rootwait ro updraft.slot=A panic=5 console=ttyS0,115200 quiet"
        ));
        assert!(cfg.contains("initrd16 (hd0,msdos1)/initrd.img"));
        assert!(cfg.contains("save_env A_TRY B_TRY"));
    }
}
