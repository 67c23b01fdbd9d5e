//! The update cycle on the VM, scenario by scenario, on one disk whose
//! state carries from one scenario to the next (as a device's would; 7
//! starts a disk of its own):
//!
//! 1. a full-image update from the factory release in A to B, committed,
//!    and the next boot still in B;
//! 3. a release whose health check fails: rolled back by a reboot into the
//!    old slot, reported, not tried again;
//! 4. a release that cannot boot (its init exits, the kernel panics and
//!    reboots): the bootloader falls back (GRUB after one try, U-Boot
//!    after three), and the daemon records the rollback; then one that
//!    hangs, reset by QEMU's emulated 6300ESB hardware watchdog (its
//!    `WATCHDOG` event, and the driver's `bootstatus` on the next boot),
//!    with the same outcome;
//! 2. a delta update from the running slot, applied without falling back
//!    to the full image;
//! 6. the systemd guest (`systemd`, on a disk of its own): a release of a
//!    new slot and the app `web` with updraft started from the shipped
//!    unit, the app's own unit restarted by updraft in the trial boot;
//!    then an application-only release without a reboot, and one whose
//!    app fails its health check, back on the generation before;
//! 5. power cuts (`--cuts N --seed S`): QEMU is killed at an instant chosen
//!    from a console marker plus seeded jitter, in the download, the write,
//!    the bootloader-environment write and switch, the reboot, the first
//!    boot and the commit; the machine is started again and must boot a
//!    verified slot and converge, with every install report delivered;
//! 8. the app under power cuts (`app_cuts`, on a disk of its own, with
//!    `--app-cuts N`): in application-only releases and in releases of a
//!    slot and the app, never a mixed state after recovery;
//! 7. on a new disk whose slot A holds the previous landed release of
//!    updraft: a release of this updraft that fails its health check is
//!    rolled back into the previous updraft, which reads the state this
//!    one wrote; then a healthy one commits;
//! 9. on a new disk booted by another updater's script (RAUC's on U-Boot,
//!    Mender's on GRUB) whose factory image carries that updater's files
//!    (`adopt.rs`): `updraft adopt` on the first boot, then a release
//!    rolled back to the other updater's, one committed, one under a power
//!    cut in the switch, all in the other updater's variables;
//! 10. the Debian package (x86_64, on the systemd guest's Debian tree,
//!     `deb_package.rs`): the previous build installed with dpkg, the unit
//!     enabled but not started, degraded until configured, then idle; an
//!     upgrade to this build keeping the edited conffile and the state;
//!     `dpkg -r` and `dpkg -P` leaving the state directory alone;
//! 11. the hardware rollback floor (x86_64, on a disk of its own,
//!     `hw_floor.rs`): QEMU's TPM backed by swtpm on the host, updraft
//!     speaking TPM 2.0 to `/dev/tpmrm0`; the counter advanced at the
//!     commit of a release raising the security version, and after the
//!     data partition is rewritten empty an older signed release refused
//!     by the counter.
//!
//! Each scenario runs one QEMU machine (reboots happen inside it), asserts
//! what the serial console showed, powers the guest off cleanly, and then
//! asserts what is on the disk: the bootloader environment (GRUB's with
//! `grub-editenv list`, U-Boot's pair on the FAT partition with
//! `fw_printenv`), as that bootloader's script leaves it, and updraft's
//! history (`updraft history --json` on the host, over a copy
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

use super::console::{Boot, QEMU_EVENT, Vm};
use super::disk::{self, BOOT, DATA};
use super::guest::{
    BOOTLOADER_MARK, Behaviour, Guest, HALT_MARK, HANG_MARK, Release, STATUS_MARK, Settings,
    USERSPACE_MARK, WATCHDOG_MARK, WATCHDOG_SECONDS, WatchdogLine,
};
use super::machine::{Loader, Machine, WDIOF_CARDRESET};
use crate::util::{self, Result};

// Scenario 6, the systemd guest: a child of this module so that it runs on
// the same server, keys and helpers.
#[path = "systemd.rs"]
mod systemd;
// Scenario 8, the app under power cuts.
#[path = "app_cuts.rs"]
mod app_cuts;
// Scenario 9, a device another updater's boot script boots, adopted.
#[path = "adopt.rs"]
mod adopt;
// Scenario 11, the hardware rollback floor in QEMU's TPM.
#[path = "hw_floor.rs"]
mod hw_floor;

pub use app_cuts::{AppCut, cut_summary as app_cut_summary};

pub use systemd::prepare_debian_tree;

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

/// Whose boot script the boot partition holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Script {
    /// The shipped one (`boot.cmd.in`, `grub.cfg.in`).
    Updraft,
    /// RAUC's U-Boot integration, with bootnames (`adopt.rs`).
    RaucUboot,
    /// Mender's GRUB integration, its two environment copies (`adopt.rs`).
    MenderGrub,
}

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
    machine: &'static Machine,
    work: PathBuf,
    disk: PathBuf,
    /// U-Boot's flash environment image (U-Boot machines).
    flash: PathBuf,
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
    pub app_cuts: Vec<AppCut>,
}

impl Lab {
    /// Start the server and build the factory disk: release 1.0 in slot A,
    /// slot B empty, GRUB with the shipped fragment.
    pub fn new(
        machine: &'static Machine,
        work: &Path,
        bin_dir: &Path,
        guest_updraft: &Path,
    ) -> Result<Lab> {
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
            extra: String::new(),
        };
        let guest = Guest::prepare(machine, guest_updraft, work)?;
        println!("kernel {}", guest.kernel.version);
        let mut lab = Lab {
            machine,
            work: work.to_path_buf(),
            disk: work.join("disk.img"),
            flash: work.join("flash.img"),
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
            app_cuts: Vec::new(),
        };
        let factory = lab.image(&healthy("1.0"))?;
        lab.build_disk(&factory, "1.0")?;
        Ok(lab)
    }

    /// A factory disk: `factory` (release `version`) in slot A, slot B
    /// empty, an empty data partition, the machine's boot partition.
    fn build_disk(&mut self, factory: &Path, version: &str) -> Result {
        self.build_disk_as(factory, version, Script::Updraft, &[])
    }

    /// [`Lab::build_disk`] booted by `script`, with `data_files` (path in
    /// the data partition, contents) on the data partition.
    fn build_disk_as(
        &mut self,
        factory: &Path,
        version: &str,
        script: Script,
        data_files: &[(&str, String)],
    ) -> Result {
        let t = Instant::now();
        let w = &self.work.clone();
        let boot_img = w.join("boot.ext4");
        self.boot_partition_as(&boot_img, script)?;
        let data = w.join("datafs");
        let _ = std::fs::remove_dir_all(&data);
        mkdir(&data)?;
        for (path, text) in data_files {
            let file = data.join(path);
            if let Some(dir) = file.parent() {
                mkdir(dir)?;
            }
            std::fs::write(&file, text).map_err(|e| format!("writing {}: {e}", file.display()))?;
        }
        let data_img = w.join("data.ext4");
        disk::mkfs(&data, &data_img, DATA.size_mib, "data")?;
        let empty = w.join("empty.img");
        std::fs::write(&empty, b"").map_err(|e| format!("writing {}: {e}", empty.display()))?;
        disk::assemble(
            self.machine,
            &self.disk,
            w,
            [&boot_img, factory, &empty, &data_img],
        )?;
        println!(
            "disk {} built in {:.1} s: boot, rootfs A (release {version}), rootfs B (empty), data",
            self.disk.display(),
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// The factory boot partition at `out`: the initramfs, and `grub.cfg`
    /// with the shipped fragment and a `grubenv` that boots A, or `boot.scr`
    /// from `boot.cmd.in` and the U-Boot environment pair that boots A.
    fn boot_partition(&self, out: &Path) -> Result {
        self.boot_partition_as(out, Script::Updraft)
    }

    /// [`Lab::boot_partition`] with the boot script of `script`.
    fn boot_partition_as(&self, out: &Path, script: Script) -> Result {
        let w = &self.work;
        let boot = w.join("bootfs");
        let _ = std::fs::remove_dir_all(&boot);
        mkdir(&boot)?;
        self.guest.initramfs(w, &boot.join("initrd.img"))?;
        let boot_img = out;
        match self.machine.loader {
            Loader::Grub if script == Script::RaucUboot => {
                return Err(format!(
                    "{script:?}'s boot script is for U-Boot, not {}'s GRUB",
                    self.machine.name
                ));
            }
            Loader::Grub => {
                mkdir(&boot.join("grub"))?;
                let cfg = match script {
                    Script::MenderGrub => {
                        adopt::mender_grubenv(&boot.join(adopt::MENDER_GRUBENV));
                        adopt::mender_grub_cfg(self.machine)
                    }
                    _ => grub_cfg(self.machine)?,
                };
                std::fs::write(boot.join("grub/grub.cfg"), cfg)
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
                disk::mkfs(&boot, boot_img, BOOT.size_mib, "boot")?;
            }
            Loader::UBoot => {
                let cmd = w.join("boot.cmd");
                let text = match script {
                    Script::Updraft => uboot_script(self.machine)?,
                    Script::RaucUboot => adopt::rauc_uboot_script(self.machine)?,
                    Script::MenderGrub => {
                        return Err(format!(
                            "{script:?}'s boot script is for GRUB, not {}'s U-Boot",
                            self.machine.name
                        ));
                    }
                };
                std::fs::write(&cmd, text)
                    .map_err(|e| format!("writing {}: {e}", cmd.display()))?;
                util::output(
                    Command::new(disk::tool("mkimage"))
                        .args(["-A", "arm64", "-T", "script", "-C", "none"])
                        .args(["-n", "updraft A/B boot", "-d"])
                        .arg(&cmd)
                        .arg(boot.join("boot.scr")),
                )
                .map_err(|e| format!("{e} (Debian package u-boot-tools)"))?;
                // The factory state, in both copies of the pair (the first
                // current, as mkenvimage -r would leave them).
                let factory = match script {
                    Script::Updraft | Script::MenderGrub => [
                        ("BOOT_ORDER", "A B"),
                        ("BOOT_A_LEFT", "3"),
                        ("BOOT_B_LEFT", "0"),
                    ],
                    Script::RaucUboot => adopt::RAUC_FACTORY_ENV,
                };
                for (name, flags) in disk::UBOOT_ENV_FILES.iter().zip([1u8, 0]) {
                    std::fs::write(boot.join(name), disk::uboot_env_copy(&factory, flags)?)
                        .map_err(|e| format!("writing {name}: {e}"))?;
                }
                disk::mkfat(&boot, boot_img, BOOT.size_mib, "BOOT")?;
                disk::make_flash_env(&self.flash, w, UBOOT_FLASH_ENV)?;
            }
        }
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
        self.publish_as(r, from, &[])
    }

    /// Publish `r` with more of the publisher's options (no delta).
    fn publish_with(&mut self, r: &Release, options: &[&str]) -> Result {
        self.publish_as(r, &[], options)
    }

    fn publish_as(&mut self, r: &Release, from: &[&str], options: &[&str]) -> Result {
        let img = self.image(r)?;
        let mut args: Vec<String> = vec![
            "release".into(),
            "--key".into(),
            self.key.key.display().to_string(),
            "--version".into(),
            r.version.clone(),
            "--compatible".into(),
            self.machine.compatible(),
            "--image".into(),
            img.display().to_string(),
            "--level".into(),
            "3".into(),
            "--out".into(),
            self.site.display().to_string(),
        ];
        args.extend(options.iter().map(|o| o.to_string()));
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
            self.machine,
            name,
            &self.disk,
            &self.flash,
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
                        "{:.1} s from reset to userspace ({:.1} s of it firmware and bootloader)",
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
        wait_trial_boot(&mut vm, "B", "2.0")?;
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

        let env = self.boot_env()?;
        self.expect_env(&env, After::Committed("B"))?;
        let h = self.history()?;
        expect_event(&h, "committed", "2.0", Some("B"))?;
        println!(
            "   disk: {} {}; history: 2.0 committed in B",
            self.env_name(),
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
            app: false,
        };
        self.publish(&v3, &[])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "B", "2.0", 0)?;
        wait_trial_boot(&mut vm, "A", "3.0")?;
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

        let env = self.boot_env()?;
        self.expect_env(&env, After::HealthRolledBack("A"))?;
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
            "   disk: {} {}; history: 3.0 downloaded once, rolled back",
            self.env_name(),
            show_env(&env)
        );
        Ok(())
    }

    /// Scenario 4: a release that cannot boot: the kernel panics, the
    /// bootloader (GRUB's try flag, U-Boot's counter once its tries are
    /// used up) makes the next boot the old slot, and the daemon records
    /// the rollback there. The reset was the kernel's: the watchdog's
    /// driver finds no reset of its own after it.
    pub fn cannot_boot(&mut self) -> Result {
        self.unbootable("4-cannot-boot", "4.0", Behaviour::CannotBoot)
    }

    /// Scenario 4, hung: the release's init hangs and stops feeding the
    /// hardware watchdog, QEMU's emulated 6300ESB resets the machine (its
    /// `WATCHDOG` event, no word from the kernel), and the outcome is the
    /// same; the next boot's driver reports the watchdog's reset.
    pub fn hangs(&mut self) -> Result {
        self.unbootable("4-hangs", "4.1", Behaviour::Hangs)
    }

    fn unbootable(&mut self, name: &str, version: &str, behaviour: Behaviour) -> Result {
        let release = Release {
            version: version.into(),
            behaviour,
            app: false,
        };
        self.publish(&release, &[])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "B", "2.0", 0)?;
        wait_trial_boot(&mut vm, "A", version)?;
        let armed = self.wait_watchdog(&mut vm, &format!("the trial boot of {version}"))?;
        let reset = match behaviour {
            Behaviour::Hangs => {
                let m = vm.mark();
                vm.wait_line(&format!("{version} hanging"), m, BOOT_WAIT, |l| {
                    l.contains(HANG_MARK)
                })?;
                let hang = vm.mark();
                let event = vm.wait_line(
                    "QEMU's watchdog event (the 6300ESB expiring)",
                    hang,
                    BOOT_WAIT,
                    |l| l.starts_with(&format!("{QEMU_EVENT}WATCHDOG")),
                )?;
                if !event.contains(r#""action":"reset""#) {
                    return Err(vm.failure(&format!("the watchdog did not reset: {event}")));
                }
                // Nothing in the guest reset it: the kernel neither
                // rebooted nor panicked between the hang and the expiry.
                let upto = vm.mark();
                if let Some(l) = vm.lines()[hang..upto].iter().find(|l| kernel_reset(l)) {
                    return Err(vm.failure(&format!(
                        "the kernel reset the machine itself after the hang ({l}); \
                         the hardware watchdog was to"
                    )));
                }
                println!("   console: {version} hung; {event}");
                "the hardware watchdog"
            }
            _ => {
                let m = vm.mark();
                let l = vm.wait_line("the kernel panic", m, BOOT_WAIT, |l| {
                    l.contains("Kernel panic")
                })?;
                println!("   console: {}", l.trim());
                "a kernel panic"
            }
        };
        let m = vm.mark();
        vm.wait_line("the bootloader after the reset", m, BOOT_WAIT, |l| {
            l.contains(BOOTLOADER_MARK)
        })?;
        wait_userspace(&mut vm, "B", "2.0", m).map_err(|e| format!("no fallback to B: {e}"))?;
        let after = self.wait_watchdog(&mut vm, "the fallback boot of 2.0 in B")?;
        let card_reset = after.bootstatus.unwrap_or(0) & WDIOF_CARDRESET != 0;
        let watchdog_events = vm
            .lines()
            .iter()
            .filter(|l| l.starts_with(&format!("{QEMU_EVENT}WATCHDOG")))
            .count();
        match behaviour {
            Behaviour::Hangs if !card_reset => {
                return Err(vm.failure(&format!(
                    "after the watchdog's reset the {} driver reports bootstatus={:?}, \
                     without WDIOF_CARDRESET ({WDIOF_CARDRESET:#x})",
                    self.machine.watchdog.module, after.bootstatus
                )));
            }
            Behaviour::Hangs => {}
            _ if card_reset || watchdog_events != 0 => {
                return Err(vm.failure(&format!(
                    "a kernel panic reset the machine, but the watchdog fired \
                     ({watchdog_events} watchdog events; bootstatus={:?})",
                    after.bootstatus
                )));
            }
            _ => {}
        }
        println!(
            "   console: the boot after the reset reads bootstatus={} from the {} driver ({})",
            after.bootstatus.unwrap_or(0),
            self.machine.watchdog.module,
            if card_reset {
                "WDIOF_CARDRESET: the last reset was the watchdog's"
            } else {
                "not the watchdog's reset"
            }
        );
        let st = wait_status(&mut vm, &format!("{version} rolled back"), |s| {
            rolled_back(s, version)
        })?;
        println!(
            "   console: {version} did not come up in A ({reset}; the watchdog armed: {} {}s), \
             the bootloader fell back to B: {}",
            armed.identity,
            armed.timeout.unwrap_or(0),
            st["last_install"]["reason"]
        );
        self.wait_report(version, "rolled_back")?;
        self.finish(vm, name)?;

        let env = self.boot_env()?;
        self.expect_env(&env, After::RolledBack("A"))?;
        let h = self.history()?;
        expect_event(&h, "rolled-back", version, None)?;
        println!(
            "   disk: {} {}; history: {version} rolled back",
            self.env_name(),
            show_env(&env)
        );
        Ok(())
    }

    /// The watchdog line of the boot whose userspace line came last: the
    /// machine's hardware watchdog, armed with the slot init's timeout.
    fn wait_watchdog(&self, vm: &mut Vm, boot: &str) -> Result<WatchdogLine> {
        let m = vm.mark();
        let line = vm.wait_line(&format!("the watchdog line of {boot}"), m, BOOT_WAIT, |l| {
            l.contains(WATCHDOG_MARK)
        })?;
        let w = WatchdogLine::parse(&line)
            .ok_or_else(|| vm.failure(&format!("a watchdog line without its fields: {line}")))?;
        let want = &self.machine.watchdog;
        if w.identity != want.identity || w.state != "active" || w.timeout != Some(WATCHDOG_SECONDS)
        {
            return Err(vm.failure(&format!(
                "in {boot}, /dev/watchdog0 is not the {} ({:?}) armed for {WATCHDOG_SECONDS} s: {line}",
                want.qemu_device, want.identity
            )));
        }
        Ok(w)
    }

    /// Scenario 2: a delta update from the running slot (2.0 in B) into A.
    pub fn delta_update(&mut self) -> Result {
        let name = "2-delta-update";
        let v5 = healthy("5.0");
        self.publish(&v5, &["2.0"])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "B", "2.0", 0)?;
        wait_trial_boot(&mut vm, "A", "5.0")?;
        wait_status(&mut vm, "5.0 committed in A", |s| {
            committed(s, "5.0") && s["booted_slot"] == "A"
        })?;
        println!("   console: 5.0 was applied as a delta to A, booted and committed");
        self.finish(vm, name)?;

        let env = self.boot_env()?;
        self.expect_env(&env, After::Committed("A"))?;
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
            "   disk: {} {}; history: 5.0 installed from its delta, committed in A; \
             nginx never served its full image",
            self.env_name(),
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
            let (marker, after_ms) =
                cut_after(&mut vm, point.marker, &version, point.jitter_ms, &mut rng)?;
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
            // A cut during the trial boot (or the reboot into it) costs
            // that boot one of its tries. With one try (GRUB) the next boot
            // is the old slot and the release may end rolled back; with
            // more (U-Boot's 3) the next boot tries it again, so it must
            // commit like any other cut.
            let trial_cut = matches!(point.phase, "first boot" | "commit" | "reboot");
            if result != "committed" && (!trial_cut || self.machine.trial_tries() > 1) {
                return Err(vm.failure(&format!(
                    "a power cut in the {} of {version} ended it as {result}: it must resume and commit \
                     ({} tries for a trial boot)",
                    point.phase,
                    self.machine.trial_tries()
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
            let env = self.boot_env()?;
            let h = self.history()?;
            let settled = if result == "committed" {
                "committed"
            } else {
                "rolled-back"
            };
            expect_event(&h, settled, &version, None)?;
            println!(
                "   disk: {} {}; history: {version} {settled}",
                self.env_name(),
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

    /// Scenario 7: slot A of a new disk holds the previous landed release
    /// of updraft (built from the commit `updraft_tests::previous` pins).
    /// It installs a release of this updraft whose health check fails;
    /// the rollback boots the previous updraft on the state this one
    /// wrote, which must report the rollback and not try the release
    /// again. Then it installs a healthy release of this updraft, which
    /// commits.
    pub fn previous_release(&mut self) -> Result {
        let name = "7-previous-release";
        let commit = updraft_tests::previous::short(updraft_tests::previous::PINNED);
        println!("\n== {name}: slot A runs updraft {commit}, the previous landed release");
        // The host build on x86_64 (as the rollback compatibility tests
        // use it); on another machine, that machine's release build.
        let old_bin = match self.machine.loader {
            Loader::Grub => updraft_tests::previous::binary()?,
            Loader::UBoot => {
                let t = crate::cross::TARGETS
                    .iter()
                    .find(|t| t.short == self.machine.name)
                    .ok_or_else(|| format!("no cross target for {}", self.machine.name))?;
                crate::cross::previous_release_agent(t)?
            }
        };
        let old_guest = self
            .guest
            .with_updraft(&old_bin, &self.work, "updraft-previous")?;
        let factory = self.work.join("rootfs-8.0-previous.ext4");
        old_guest.rootfs(&healthy("8.0"), &self.settings, &self.work, &factory)?;
        self.images.insert("8.0".into(), factory.clone());
        self.build_disk(&factory, "8.0 with the previous updraft")?;

        let failing = Release {
            version: "8.1".into(),
            behaviour: Behaviour::FailsHealthCheck,
            app: false,
        };
        self.publish(&failing, &[])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "A", "8.0", 0)?;
        wait_trial_boot(&mut vm, "B", "8.1")?;
        let m = vm.mark();
        wait_userspace(&mut vm, "A", "8.0", m)
            .map_err(|e| format!("no rollback reboot into the previous updraft: {e}"))?;
        let st = wait_status(
            &mut vm,
            "8.1 rolled back, seen by the previous updraft",
            |s| rolled_back(s, "8.1") && s["booted_slot"] == "A",
        )?;
        println!(
            "   console: the previous updraft ({commit}) installed 8.1, this updraft failed its \
             health check, and the previous one reads the rollback: {}",
            st["last_install"]["reason"]
        );
        self.wait_report("8.1", "rolled_back")?;
        println!("   the server got the install report of 8.1: rolled_back");

        self.publish(&healthy("8.2"), &[])?;
        wait_trial_boot(&mut vm, "B", "8.2")?;
        wait_status(&mut vm, "8.2 committed in B", |s| {
            committed(s, "8.2") && s["booted_slot"] == "B"
        })?;
        self.wait_report("8.2", "committed")?;
        println!(
            "   console: the previous updraft installed 8.2, which this updraft committed in B"
        );
        self.finish(vm, name)?;

        let env = self.boot_env()?;
        self.expect_env(&env, After::Committed("B"))?;
        let h = self.history()?;
        expect_event(&h, "rolled-back", "8.1", None)?;
        expect_event(&h, "committed", "8.2", Some("B"))?;
        let downloads = count_events(&h, "download", "8.1");
        if downloads != 1 {
            return Err(format!(
                "8.1 was downloaded {downloads} times; the previous updraft must not try a \
                 rolled-back release again\n{}",
                show_history(&h)
            ));
        }
        println!(
            "   disk: {} {}; history: 8.1 downloaded once and rolled back, 8.2 committed in B",
            self.env_name(),
            show_env(&env)
        );
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

    /// The bootloader environment on the disk.
    fn boot_env(&self) -> Result<BTreeMap<String, String>> {
        match self.machine.loader {
            Loader::Grub => disk::grubenv(&self.disk, &self.work),
            Loader::UBoot => disk::uboot_env(&self.disk, &self.work),
        }
    }

    fn env_name(&self) -> &'static str {
        match self.machine.loader {
            Loader::Grub => "grubenv",
            Loader::UBoot => "U-Boot environment",
        }
    }

    /// Check `env` against what this machine's bootloader script and
    /// updraft's backend for it leave `after` a scenario.
    fn expect_env(&self, env: &BTreeMap<String, String>, after: After) -> Result {
        let alternatives = expected_env(self.machine.loader, after);
        let mut last = Ok(());
        for want in &alternatives {
            let want: Vec<(&str, &str)> =
                want.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            last = expect_env(env, self.env_name(), &want);
            if last.is_ok() {
                return last;
            }
        }
        last
    }

    /// `updraft history --json` over a copy of the data partition's state.
    fn history(&self) -> Result<Vec<Value>> {
        self.history_of(&self.disk, DATA)
    }

    /// [`Lab::history`] of another disk, whose data partition is `data`.
    fn history_of(&self, disk_image: &Path, data: disk::Part) -> Result<Vec<Value>> {
        let copy = self.work.join("state-copy");
        let _ = std::fs::remove_dir_all(&copy);
        mkdir(&copy)?;
        disk::dump_dir(disk_image, data, "/updraft", &copy, &self.work)?;
        let state = copy.join("updraft");
        let bootloader = match self.machine.loader {
            Loader::Grub => {
                let grubenv = self.work.join("grubenv.host");
                std::fs::write(
                    &grubenv,
                    disk::read_file(disk_image, BOOT, "/grub/grubenv", &self.work)?,
                )
                .map_err(|e| format!("writing {}: {e}", grubenv.display()))?;
                format!("kind = \"grub\"\ngrubenv = {grubenv:?}\n")
            }
            Loader::UBoot => {
                // The pair copied out of the FAT partition, with its config.
                disk::uboot_env(disk_image, &self.work)?;
                let config = self.work.join("uboot-env.read").join("fw_env.config");
                let lock = self.work.join("fw_printenv.lock");
                std::fs::write(&lock, b"")
                    .map_err(|e| format!("writing {}: {e}", lock.display()))?;
                format!("kind = \"uboot\"\nfw_env_config = {config:?}\nlock_file = {lock:?}\n")
            }
        };
        let (a, b) = (self.work.join("slot-a.host"), self.work.join("slot-b.host"));
        for p in [&a, &b] {
            std::fs::write(p, b"").map_err(|e| format!("writing {}: {e}", p.display()))?;
        }
        let config = self.work.join("host-updraft.toml");
        std::fs::write(
            &config,
            format!(
                "[device]\ncompatible = {compatible:?}\nid_file = {id:?}\n\
                 [trust]\nkeys = [{key:?}]\n\
                 [slots]\na = {a:?}\nb = {b:?}\ncmdline = {cmdline:?}\n\
                 [bootloader]\n{bootloader}\
                 [system]\nstate_dir = {state:?}\nsocket = {sock:?}\n",
                compatible = self.machine.compatible(),
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

/// Cut the power of `vm` a seeded jitter below `jitter_ms` after a console
/// line holding every part of `marker` (`{v}`: `version`): the marker as
/// shown, and the milliseconds after it.
fn cut_after(
    vm: &mut Vm,
    marker: &[&str],
    version: &str,
    jitter_ms: u64,
    rng: &mut updraft_tests::rng::Rng,
) -> Result<(String, u64)> {
    let parts: Vec<String> = marker.iter().map(|p| p.replace("{v}", version)).collect();
    let shown = parts.join("…");
    vm.wait_line(&format!("{shown:?} on the console"), 0, INSTALL_WAIT, |l| {
        parts.iter().all(|p| l.contains(p.as_str()))
    })?;
    let after_ms = rng.below(jitter_ms);
    std::thread::sleep(Duration::from_millis(after_ms));
    vm.power_cut()?;
    Ok((shown, after_ms))
}

fn healthy(version: &str) -> Release {
    Release {
        version: version.into(),
        behaviour: Behaviour::Healthy,
        app: false,
    }
}

/// `grub.cfg` on the boot partition: the serial console, a marker line,
/// then the shipped fragment rendered for this disk.
fn grub_cfg(machine: &Machine) -> Result<String> {
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
            format!("{} quiet", machine.console_arg()),
        ),
    ];
    let text = fill(&template, &values, &template_path)?;
    Ok(format!("{GRUB_HEADER}echo \"{BOOTLOADER_MARK}\"\n{text}"))
}

/// The template's placeholders filled with `values`; every placeholder
/// must be.
fn fill(template: &str, values: &[(&str, String)], path: &Path) -> Result<String> {
    let mut text = template.to_string();
    for (k, v) in values {
        text = text.replace(&format!("@@{k}@@"), v);
    }
    if let Some(rest) = text.split("@@").nth(1) {
        return Err(format!(
            "{} has a placeholder the VM does not fill: @@{}@@",
            path.display(),
            rest.split("@@").next().unwrap_or(rest)
        ));
    }
    Ok(text)
}

/// U-Boot's own environment in flash: no boot delay, and a boot command
/// that runs `boot.scr` from the FAT partition of the virtio disk (what
/// the distro boot of `boot_targets=virtio0` would find), with the load
/// addresses of Debian's `qemu_arm64` defaults (the flash environment
/// replaces the built-in one whole).
const UBOOT_FLASH_ENV: &[(&str, &str)] = &[
    ("bootdelay", "0"),
    ("boot_targets", "virtio0"),
    ("arch", "arm"),
    ("cpu", "armv8"),
    ("board", "qemu-arm"),
    ("vendor", "emulation"),
    ("fdt_high", "0xffffffff"),
    ("initrd_high", "0xffffffff"),
    ("fdt_addr", "0x40000000"),
    ("scriptaddr", "0x40200000"),
    ("loadaddr", "0x40200000"),
    ("kernel_addr_r", "0x40400000"),
    ("ramdisk_addr_r", "0x44000000"),
    (
        "bootcmd",
        "virtio scan; load virtio 0:1 ${scriptaddr} /boot.scr && source ${scriptaddr}; reset",
    ),
];

/// Where the environment hooks keep the two copies and their scratch
/// buffers: RAM well above the kernel and initramfs, below U-Boot.
const UBOOT_ENV_ADDR: &str = "0x4f000000";

/// `boot.scr`'s source: a marker line, then the shipped `boot.cmd.in`
/// with the FAT-file environment hooks for the pair on the boot partition,
/// rendered for this disk. The initramfs comes from the boot partition.
/// A file of the shipped boot files, and its path.
fn boot_file(name: &str) -> Result<(String, PathBuf)> {
    let p = util::root()
        .join("yocto/meta-updraft/recipes-bsp/updraft-bootfiles/files")
        .join(name);
    std::fs::read_to_string(&p)
        .map_err(|e| format!("reading {}: {e}", p.display()))
        .map(|t| (t, p))
}

/// The boot partition as U-Boot names it.
fn boot_dev() -> String {
    format!("virtio 0:{}", BOOT.number)
}

/// The shipped FAT-file environment hooks (load, save), rendered for the
/// pair on this disk's boot partition.
fn fat_env_hooks() -> Result<(String, String)> {
    let hook_values = [
        ("UPDRAFT_ENV_DEV", boot_dev()),
        ("UPDRAFT_ENV_ADDR", UBOOT_ENV_ADDR.to_string()),
        ("UPDRAFT_ENV_SIZE", format!("{:#x}", disk::UBOOT_ENV_SIZE)),
        ("UPDRAFT_ENV_FILE", disk::UBOOT_ENV_FILES[0].to_string()),
        (
            "UPDRAFT_ENV_REDUND_FILE",
            disk::UBOOT_ENV_FILES[1].to_string(),
        ),
    ];
    let (load, load_path) = boot_file("env-fat-load.cmd.in")?;
    let (save, save_path) = boot_file("env-fat-save.cmd.in")?;
    Ok((
        fill(&load, &hook_values, &load_path)?,
        fill(&save, &hook_values, &save_path)?,
    ))
}

/// How a script boots the kernel it loaded: the initramfs from the boot
/// partition, the device tree U-Boot was given.
fn uboot_boot_cmd() -> String {
    format!(
        "load {} ${{ramdisk_addr_r}} /initrd.img; \
         booti ${{kernel_addr_r}} ${{ramdisk_addr_r}}:${{filesize}} ${{fdtcontroladdr}}",
        boot_dev()
    )
}

fn uboot_script(machine: &Machine) -> Result<String> {
    let (load, save) = fat_env_hooks()?;
    let (template, template_path) = boot_file("boot.cmd.in")?;
    let values = [
        ("UPDRAFT_ENV_LOAD", load),
        ("UPDRAFT_ENV_SAVE", save),
        ("UPDRAFT_PART_A", disk::SLOT_A.number.to_string()),
        ("UPDRAFT_PART_B", disk::SLOT_B.number.to_string()),
        ("UPDRAFT_TRIES", machine.trial_tries().to_string()),
        ("UPDRAFT_PANIC_SECONDS", "5".to_string()),
        (
            "UPDRAFT_EXTRA_BOOTARGS",
            format!("{} quiet", machine.console_arg()),
        ),
        ("UPDRAFT_KERNEL_PATH", "/boot/vmlinuz".to_string()),
        ("UPDRAFT_BOOT_DEV", "virtio 0".to_string()),
        ("UPDRAFT_ROOT_PREFIX", "/dev/vda".to_string()),
        ("UPDRAFT_BOOT_CMD", uboot_boot_cmd()),
    ];
    let text = fill(&template, &values, &template_path)?;
    Ok(format!("echo \"{BOOTLOADER_MARK}\"\n{text}"))
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

/// From the console's end on: the trial boot of `version` in `slot`.
fn wait_trial_boot(vm: &mut Vm, slot: &str, version: &str) -> Result<String> {
    let m = vm.mark();
    wait_userspace(vm, slot, version, m).map_err(|e| format!("no trial boot of {version}: {e}"))
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

/// A kernel line announcing a reset of its own (a reboot, a panic's).
fn kernel_reset(line: &str) -> bool {
    line.contains("reboot: Restarting system")
        || line.contains("Kernel panic")
        || line.contains("Rebooting in ")
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

/// Where a scenario leaves the A/B state; the slot named is the new
/// release's (committed) or the failed one's (rolled back).
#[derive(Clone, Copy)]
enum After {
    Committed(&'static str),
    /// Rolled back by updraft after a failed health check.
    HealthRolledBack(&'static str),
    /// Fallen back by the bootloader (the release never came up).
    RolledBack(&'static str),
}

/// The variables `loader`'s environment must hold `after` a scenario (any
/// one of the alternatives).
fn expected_env(loader: Loader, after: After) -> Vec<Vec<(String, String)>> {
    let other = |s: &str| if s == "A" { "B" } else { "A" };
    let kv = |k: String, v: &str| (k, v.to_string());
    match (loader, after) {
        (Loader::Grub, After::Committed(s)) => vec![vec![
            kv("ORDER".into(), &format!("{s} {}", other(s))),
            kv(format!("{s}_OK"), "1"),
            kv(format!("{s}_TRY"), "0"),
        ]],
        (Loader::Grub, After::HealthRolledBack(bad)) => {
            let good = other(bad);
            vec![
                vec![
                    kv("ORDER".into(), good),
                    kv(format!("{bad}_OK"), "0"),
                    kv(format!("{good}_OK"), "1"),
                ],
                vec![
                    kv(format!("{bad}_OK"), "0"),
                    kv(format!("{good}_OK"), "1"),
                    kv(format!("{good}_TRY"), "0"),
                ],
            ]
        }
        (Loader::Grub, After::RolledBack(bad)) => {
            let good = other(bad);
            vec![vec![
                kv(format!("{bad}_OK"), "0"),
                kv(format!("{good}_OK"), "1"),
                kv(format!("{good}_TRY"), "0"),
            ]]
        }
        // updraft's U-Boot backend puts a committed slot first; the script
        // records the slot it booted last.
        (Loader::UBoot, After::Committed(s)) => vec![vec![
            kv("BOOT_ORDER".into(), &format!("{s} {}", other(s))),
            kv("updraft_slot".into(), s),
        ]],
        // A bad slot is taken out of BOOT_ORDER with no tries left, by
        // updraft (a failed check) or after the script used its tries up.
        (Loader::UBoot, After::HealthRolledBack(bad) | After::RolledBack(bad)) => {
            let good = other(bad);
            vec![vec![
                kv("BOOT_ORDER".into(), good),
                kv(format!("BOOT_{bad}_LEFT"), "0"),
                kv("updraft_slot".into(), good),
            ]]
        }
    }
}

fn expect_env(env: &BTreeMap<String, String>, what: &str, want: &[(&str, &str)]) -> Result {
    for (k, v) in want {
        if env.get(*k).map(String::as_str) != Some(*v) {
            return Err(format!("{what}: expected {k}={v}, found {}", show_env(env)));
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
        let cfg = grub_cfg(&super::super::machine::X86_64).unwrap_or_else(|e| panic!("{e}"));
        assert!(!cfg.contains("@@"), "{cfg}");
        assert!(cfg.starts_with(GRUB_HEADER));
        assert!(cfg.contains(&format!("echo \"{BOOTLOADER_MARK}\"")));
        assert!(cfg.contains(
            "linux16 (hd0,msdos2)/boot/vmlinuz root=PARTUUID=75706466-02 rootwait ro updraft.slot=A panic=5 console=ttyS0,115200 quiet"
        ));
        assert!(cfg.contains("initrd16 (hd0,msdos1)/initrd.img"));
        assert!(cfg.contains("save_env A_TRY B_TRY"));
    }

    #[test]
    fn the_shipped_boot_script_renders_with_the_fat_environment_hooks() {
        let m = &super::super::machine::AARCH64;
        let scr = uboot_script(m).unwrap_or_else(|e| panic!("{e}"));
        assert!(!scr.contains("@@"), "{scr}");
        assert!(scr.starts_with(&format!("echo \"{BOOTLOADER_MARK}\"\n")));
        assert!(!scr.lines().any(|l| l.trim() == "saveenv"), "{scr}");
        assert!(scr.contains("fatload virtio 0:1 ${updraft_env_a0} uboot.env 0x4000"));
        assert!(scr.contains("fatwrite virtio 0:1 ${updraft_env_a0} ${updraft_env_file} 0x4000"));
        assert!(scr.contains("console=ttyAMA0,115200"));
        assert!(
            scr.contains("booti ${kernel_addr_r} ${ramdisk_addr_r}:${filesize} ${fdtcontroladdr}")
        );
    }

    #[test]
    fn each_bootloader_has_its_expected_environment() {
        let committed = expected_env(Loader::UBoot, After::Committed("B"));
        assert_eq!(
            committed[0],
            vec![
                ("BOOT_ORDER".to_string(), "B A".to_string()),
                ("updraft_slot".to_string(), "B".to_string())
            ]
        );
        let grub = expected_env(Loader::Grub, After::RolledBack("A"));
        assert_eq!(grub[0][0], ("A_OK".to_string(), "0".to_string()));
    }
}
