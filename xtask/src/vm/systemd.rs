//! Scenario 6: the update cycle on a guest whose slots hold a real
//! systemd userspace, with updraft started from the shipped unit.
//!
//! The root file system is Debian bookworm made by `mmdebstrap` (variant
//! `essential` plus systemd, udev, D-Bus, iproute2 and e2fsprogs, without
//! documentation, manual pages or locales), from the mirror this machine's
//! apt uses, cached as a tarball under `target/vm-cache/` so that a second
//! run skips it. Each release's slot image is that tree with what the
//! Yocto recipe installs (`/usr/bin/updraft`, the unit in
//! `/usr/lib/systemd/system`, the tmpfiles and sysusers files in
//! `/usr/lib`, the drop-in example in the documentation, the unit enabled
//! offline with `systemctl --root`, the group made offline with
//! `systemd-sysusers --root`), updraft's configuration with the default
//! `reboot_command` (`systemctl reboot`), the release marker, an fstab for
//! `/boot` and the data partition, and three small units of the VM's own
//! that speak the harness's console protocol (the marker of userspace,
//! the status lines, the console commands). The busybox initramfs of the
//! other scenarios loads the virtio drivers, ext4 and the watchdog's driver
//! and `switch_root`s into `/sbin/init`, which is systemd here, so the slot
//! needs no kernel modules. systemd itself feeds the machine's hardware
//! watchdog (`RuntimeWatchdogSec=` in a `system.conf.d` drop-in), which
//! must never fire.
//!
//! The root file system stays read-only, as the slot image was written;
//! `/var` and `/tmp` are tmpfs (the unit's `PrivateTmp=` needs them
//! writable).
//!
//! This module owns the systemd guest's files, its disk layout and its
//! assertions. It must never start QEMU itself (that is `console`), write
//! into the shipped unit files (they are copied as they are), or touch
//! the disk of the other scenarios. Scenario 10 (`vm/deb_package.rs`, a
//! child of it) boots the same Debian tree to install updraft's package.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;
use updraft_tests::publisher::{Repo, publish_ok};

use super::super::app::{self, APP, component_version};
use super::super::console::{QEMU_EVENT, Vm};
use super::super::disk::{self, BOOT, Part};
use super::super::guest::{self, Settings, USERSPACE_MARK, WATCHDOG_SECONDS, WatchdogLine};
use super::super::machine::{self, WDIOF_CARDRESET};
use super::{
    Lab, committed, expect_env, expect_event, mkdir, show_env, wait_status, wait_userspace,
};
use crate::util::{self, Result};

// Scenario 10, the Debian package on this guest's Debian tree.
#[path = "deb_package.rs"]
mod deb_package;

/// The Debian release the root file system is made from.
const SUITE: &str = "bookworm";
/// What the root file system holds besides the essential packages: systemd
/// as PID 1, udev (for the device units the fstab mounts wait for), D-Bus
/// (so `systemctl reboot` goes through logind, which checks
/// `CAP_SYS_BOOT`), iproute2 (the health check) and e2fsprogs (`fsck` of
/// `/boot` and `/data`).
const INCLUDE: &str = "systemd-sysv,udev,dbus,iproute2,e2fsprogs";
/// dpkg options that keep documentation, manual pages and locales out.
const DPKG_OPTS: &[&str] = &[
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
];

/// Slots of this guest: the Debian tree is about 120 MiB.
const SLOT_MIB: u64 = 192;
const SD_SLOT_A: Part = Part {
    number: 2,
    name: "rootfs A (systemd)",
    start_mib: BOOT.start_mib + BOOT.size_mib,
    size_mib: SLOT_MIB,
};
const SD_SLOT_B: Part = Part {
    number: 3,
    name: "rootfs B (systemd)",
    start_mib: SD_SLOT_A.start_mib + SLOT_MIB,
    size_mib: SLOT_MIB,
};
const SD_DATA: Part = Part {
    number: 4,
    name: "data",
    start_mib: SD_SLOT_B.start_mib + SLOT_MIB,
    size_mib: 32,
};
const SD_PARTS: [Part; 4] = [BOOT, SD_SLOT_A, SD_SLOT_B, SD_DATA];

/// The factory release in A and the update.
const V1: &str = "1.0-systemd";
const V2: &str = "2.0-systemd";

/// The application-only releases after it: one that commits, one whose
/// app fails its health check.
const V3: &str = "2.1-systemd";
const V4: &str = "2.2-systemd";
/// The app's versions in V2, V3 and V4.
const APP_V1: &str = "1.3";
const APP_V2: &str = "1.4";
const APP_V3: &str = "1.5";
/// Data files in the app's tree.
const APP_FILES: usize = 24;
/// The app's unit: runs it from its active generation.
const APP_UNIT: &str = "vm-web.service";
/// Printed by the app when it starts (`app::tree`'s `bin/web`).
const APP_MARK: &str = "updraft-vm: app web ";

/// systemd's drop-in arming the hardware watchdog.
const WATCHDOG_CONF: &str = "etc/systemd/system.conf.d/90-vm-watchdog.conf";

/// A line with the unit's properties: tab-separated `Key=Value`.
const UNIT_MARK: &str = "updraft-vm: unit ";
/// Printed by the marker unit when systemd stops it; followed by the
/// shutdown jobs queued (`reboot.target`, `poweroff.target`).
const SHUTDOWN_MARK: &str = "updraft-vm: shutdown:";
/// Printed once systemd reports the boot finished.
const BOOTED_MARK: &str = "updraft-vm: boot finished:";

/// `CAP_SYS_BOOT` (22) as `/proc/PID/status` shows a capability set.
const CAP_SYS_BOOT_MASK: &str = "0000000000400000";

impl Lab {
    /// Scenario 6: a full-image update on the systemd guest, 1.0 in A to 2.0
    /// in B, rebooted by `systemctl reboot` from inside the unit's sandbox,
    /// committed, and the next boot still B; the unit active as `notify`
    /// with its watchdog and its hardening in force at every boot.
    pub fn systemd_update(&mut self) -> Result {
        let name = "6-systemd";
        if !util::is_root() {
            let msg = "scenario 6 (the systemd guest) needs root: mmdebstrap, and the slot \
                       images keep the owners of the Debian tree";
            if super::super::ci() {
                return Err(msg.into());
            }
            println!("\n== {name}\nvm-test: skipped: {msg}");
            return Ok(());
        }
        println!("\n== {name}: building the systemd guest");
        let base = base_tarball()?;
        let site = self.site.join("systemd");
        mkdir(&site)?;
        let port = self.nginx.port();
        let settings = Settings {
            manifest_url: format!(
                "https://{}:{port}/systemd/manifest.json",
                super::HOST_FROM_GUEST
            ),
            report_url: self.settings.report_url.clone(),
            ca_file: self.settings.ca_file.clone(),
            release_key: self.settings.release_key.clone(),
            extra: String::new(),
        };
        let t = Instant::now();
        let a = self.systemd_image(&base, V1, &settings)?;
        let b = self.systemd_image(&base, V2, &settings)?;
        println!(
            "   slot images of {V1} and {V2} built in {:.1} s ({SLOT_MIB} MiB ext4 each)",
            t.elapsed().as_secs_f64()
        );
        let app_dir = self.work.join(format!("systemd-app-{APP_V1}"));
        app::tree(&app_dir, APP_V1, APP_FILES)?;
        publish_ok(&[
            "release",
            "--key",
            &self.key.key.display().to_string(),
            "--version",
            V2,
            "--compatible",
            &self.machine.compatible(),
            "--image",
            &b.display().to_string(),
            "--app",
            &format!("{APP}@{APP_V1}={}", app_dir.display()),
            "--level",
            "3",
            "--out",
            &site.display().to_string(),
        ]);
        // Version 2 (a slot and an app): the slot component's artifact.
        let payload = Repo::new(site.clone()).payload();
        let artifact = payload["components"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["kind"] == "slot"))
            .unwrap_or(&payload)["artifact"]["size"]
            .as_u64()
            .unwrap_or(0);
        println!(
            "published {V2} at {}: the full image is {:.1} MiB compressed, with app {APP} {APP_V1}",
            settings.manifest_url,
            artifact as f64 / (1024.0 * 1024.0)
        );

        let disk_image = self.systemd_disk("systemd", &a)?;

        println!("\n== {name}");
        let mut vm = Vm::start(
            self.machine,
            name,
            &disk_image,
            &self.flash,
            &self.work.join(format!("{name}.console.log")),
        )?;
        let expect = Expected::from_unit()?;
        wait_userspace(&mut vm, "A", V1, 0)?;
        let w = self.wait_watchdog(&mut vm, "the factory boot of A (systemd)")?;
        println!(
            "   console: systemd feeds the hardware watchdog: {} {} s ({WATCHDOG_CONF})",
            w.identity,
            w.timeout.unwrap_or(0)
        );
        let u = wait_unit_active(&mut vm)?;
        expect.check(&vm, &u, "the factory boot of A")?;
        println!("   console: {}", expect.describe(&u));
        let m = vm.mark();
        wait_userspace(&mut vm, "B", V2, m).map_err(|e| format!("no trial boot of {V2}: {e}"))?;
        self.wait_watchdog(&mut vm, "the trial boot of B (systemd)")?;
        let reboot = vm.lines()[m..]
            .iter()
            .find(|l| l.contains(SHUTDOWN_MARK))
            .cloned()
            .unwrap_or_default();
        if !reboot.contains("reboot.target") {
            return Err(vm.failure(&format!(
                "A did not end with systemd's reboot.target before B booted (shutdown marker: {reboot:?}): \
                 updraft's `systemctl reboot` must reboot through systemd"
            )));
        }
        println!("   console: A was shut down by systemd for reboot.target ({reboot})");
        let u = wait_unit_active(&mut vm)?;
        expect.check(&vm, &u, "the trial boot of B")?;
        wait_status(&mut vm, &format!("{V2} committed in B"), |s| {
            committed(s, V2) && s["booted_slot"] == "B"
        })?;
        println!("   console: {V2} was written to B, booted under systemd and committed");
        println!("   journal: {}", journal_event(&mut vm, "committed", V2)?);
        let started = app_started(&vm, APP_V1, 0)?;
        wait_status(
            &mut vm,
            &format!("app {APP} {APP_V1} committed with {V2}"),
            |s| component_version(s, APP).as_deref() == Some(APP_V1),
        )?;
        println!(
            "   console: in the trial boot of B, updraft switched app {APP} to {APP_V1} and restarted \
             {APP_UNIT} from its unit's sandbox: {started}"
        );
        let m = vm.mark();
        vm.send("vm-reboot")?;
        wait_userspace(&mut vm, "B", V2, m).map_err(|e| format!("after the commit: {e}"))?;
        self.wait_watchdog(&mut vm, "the boot after the commit (systemd)")?;
        let u = wait_unit_active(&mut vm)?;
        expect.check(&vm, &u, "the boot after the commit")?;
        wait_status(
            &mut vm,
            &format!("{V2} running after a reboot"),
            |s: &Value| {
                s["booted_slot"] == "B" && s["running_version"] == V2 && s["state"] == "idle"
            },
        )?;
        println!("   console: the next boot is B with {V2} again");
        self.wait_report(V2, "committed")?;
        println!("   the server got the install report of {V2}: committed");
        self.systemd_app_releases(&mut vm, &site)?;
        vm.drain();
        let report = unit_report(&vm, &expect)?;
        // Systemd kept the watchdog fed through the install and both
        // reboots: it never fired.
        let fired = vm
            .lines()
            .iter()
            .filter(|l| l.starts_with(&format!("{QEMU_EVENT}WATCHDOG")))
            .count();
        let card_resets = vm
            .lines()
            .iter()
            .filter_map(|l| WatchdogLine::parse(l))
            .filter(|w| w.bootstatus.unwrap_or(0) & WDIOF_CARDRESET != 0)
            .count();
        if fired != 0 || card_resets != 0 {
            return Err(vm.failure(&format!(
                "the hardware watchdog fired on the systemd guest ({fired} watchdog events, \
                 {card_resets} boots after a watchdog reset): systemd must keep it fed"
            )));
        }
        for l in vm.lines().iter().filter(|l| l.contains(BOOTED_MARK)) {
            println!("   {}", l.trim_start_matches("updraft-vm: "));
        }
        println!("   {report}");
        self.finish(vm, name)?;

        let env = disk::grubenv(&disk_image, &self.work)?;
        expect_env(
            &env,
            "grubenv",
            &[("ORDER", "B A"), ("B_OK", "1"), ("B_TRY", "0")],
        )?;
        let h = self.history_of(&disk_image, SD_DATA)?;
        expect_event(&h, "committed", V2, Some("B"))?;
        expect_event(&h, "committed", V3, None)?;
        expect_event(&h, "rolled-back", V4, None)?;
        let on_disk =
            app::check_on_disk(&self.work.join("state-copy/updraft/apps").join(APP), APP_V2)?;
        println!(
            "   disk: grubenv {}; history: {V2} committed in B, {V3} committed and {V4} rolled back \
             without a reboot; {APP}/current -> {on_disk} holding {APP_V2}",
            show_env(&env)
        );
        Ok(())
    }

    /// After the commit of the slot and the app: an application-only
    /// release installed without a reboot, its unit restarted; then one
    /// whose health check fails, the app and its unit back on the
    /// generation before.
    fn systemd_app_releases(&mut self, vm: &mut Vm, site: &Path) -> Result {
        let boots = vm.boots().len();
        for (version, app_version, broken) in [(V3, APP_V2, false), (V4, APP_V3, true)] {
            let dir = self.work.join(format!("systemd-app-{app_version}"));
            app::tree(&dir, app_version, APP_FILES)?;
            if broken {
                // Released with a SUMS that no longer matches one of its files.
                std::fs::write(dir.join("share/0000.bin"), b"not what SUMS lists")
                    .map_err(|e| format!("breaking {}: {e}", dir.display()))?;
            }
            let from = vm.mark();
            let t = Instant::now();
            // No --image: the release keeps the slot already published, the
            // one B runs.
            publish_ok(&[
                "release",
                "--key",
                &self.key.key.display().to_string(),
                "--version",
                version,
                "--compatible",
                &self.machine.compatible(),
                "--app",
                &format!("{APP}@{app_version}={}", dir.display()),
                "--out",
                &site.display().to_string(),
            ]);
            let (want, result) = if broken {
                (APP_V2, "rolled back")
            } else {
                (app_version, "committed")
            };
            let st = wait_status(vm, &format!("{version}: app {APP} {want} running"), |s| {
                s["state"] == "idle"
                    && s["booted_slot"] == "B"
                    && component_version(s, APP).as_deref() == Some(want)
                    && s["last_install"]["release"] == version
            })?;
            let took = t.elapsed();
            let line = app_started(vm, want, from)?;
            if vm.boots().len() != boots {
                return Err(vm.failure(&format!(
                    "{version}, a release of app {APP} alone, rebooted the machine"
                )));
            }
            let detail = st["last_install"]["reason"]
                .as_str()
                .unwrap_or("")
                .to_string();
            println!(
                "   console: {version} (app {APP} {app_version}{}) {result} without a reboot, \
                 {:.1} s from publishing to the status (4 s polls); {APP_UNIT} restarted: {line}\n   \
                 updraft: {detail}",
                if broken {
                    ", a file not as its SUMS"
                } else {
                    ""
                },
                took.as_secs_f64()
            );
        }
        Ok(())
    }

    /// The systemd guest's disk, `PREFIX-disk.img`: the boot partition,
    /// `slot_a` as slot A, slot B empty, an empty data partition.
    pub(super) fn systemd_disk(&self, prefix: &str, slot_a: &Path) -> Result<PathBuf> {
        let disk_image = self.work.join(format!("{prefix}-disk.img"));
        let boot_img = self.work.join(format!("{prefix}-boot.ext4"));
        self.boot_partition(&boot_img)?;
        let data_dir = self.work.join(format!("{prefix}-datafs"));
        let _ = std::fs::remove_dir_all(&data_dir);
        mkdir(&data_dir)?;
        let data_img = self.work.join(format!("{prefix}-data.ext4"));
        disk::mkfs(&data_dir, &data_img, SD_DATA.size_mib, "data")?;
        let empty = self.work.join("empty.img");
        std::fs::write(&empty, b"").map_err(|e| format!("writing {}: {e}", empty.display()))?;
        disk::assemble_parts(
            self.machine,
            &disk_image,
            &self.work,
            SD_PARTS,
            [&boot_img, slot_a, &empty, &data_img],
        )?;
        Ok(disk_image)
    }

    /// The slot image of `version`: the Debian tree, updraft installed
    /// into it as the Yocto recipe installs it, and the VM's own units.
    fn systemd_image(&self, base: &Path, version: &str, settings: &Settings) -> Result<PathBuf> {
        let root = self.work.join(format!("systemd-rootfs-{version}"));
        let _ = std::fs::remove_dir_all(&root);
        mkdir(&root)?;
        util::run(
            Command::new("tar")
                .args(["-xpf"])
                .arg(base)
                .args(["--numeric-owner", "-C"])
                .arg(&root),
        )
        .map_err(|e| format!("unpacking {}: {e}", base.display()))?;
        let r = util::root();
        let sd = r.join("systemd");
        install(self.guest.updraft(), &root, "usr/bin/updraft", 0o755)?;
        install(&self.guest.kernel.image, &root, "boot/vmlinuz", 0o644)?;
        install(
            &sd.join("updraft.service"),
            &root,
            "usr/lib/systemd/system/updraft.service",
            0o644,
        )?;
        install(
            &sd.join("updraft.tmpfiles"),
            &root,
            "usr/lib/tmpfiles.d/updraft.conf",
            0o644,
        )?;
        install(
            &sd.join("updraft.sysusers"),
            &root,
            "usr/lib/sysusers.d/updraft.conf",
            0o644,
        )?;
        install(
            &sd.join("updraft.catalog"),
            &root,
            "usr/lib/systemd/catalog/updraft.catalog",
            0o644,
        )?;
        let example = sd.join("updraft.service.d/50-health-checks.conf.example");
        install(
            &example,
            &root,
            "usr/share/doc/updraft/50-health-checks.conf.example",
            0o644,
        )?;
        // The VM's health check runs `ip route` (netlink): the example
        // drop-in is what an integrator applies for that.
        install(
            &example,
            &root,
            "etc/systemd/system/updraft.service.d/50-health-checks.conf",
            0o644,
        )?;
        // The daemon's log on the console as well as in the journal, so the
        // console log shows what it did.
        put(
            &root,
            "etc/systemd/system/updraft.service.d/90-vm-console.conf",
            "[Service]\nStandardOutput=journal+console\n",
            0o644,
        )?;
        install(&settings.ca_file, &root, "etc/updraft/ca.pem", 0o644)?;
        install(
            &settings.release_key,
            &root,
            "etc/updraft/release.pub",
            0o644,
        )?;
        let mut toml = config(settings);
        toml.push_str(&app::config_tables(&[APP_UNIT]));
        put(&root, "etc/updraft/updraft.toml", &toml, 0o644)?;
        put(&root, "etc/updraft/health.d/10-vm", HEALTH_CHECK, 0o755)?;
        put(
            &root,
            &format!("{}/10-files", &app::HEALTH_DIR[1..]),
            app::HEALTH_CHECK,
            0o755,
        )?;
        put(
            &root,
            &format!("etc/systemd/system/{APP_UNIT}"),
            APP_UNIT_FILE,
            0o644,
        )?;
        put(
            &root,
            "etc/updraft/release",
            &format!("UPDRAFT_RELEASE={version}\n"),
            0o644,
        )?;
        put(&root, "etc/updraft-vm-version", version, 0o644)?;
        put(&root, "etc/fstab", &fstab(), 0o644)?;
        // The mount point: systemd cannot make it on a read-only root.
        mkdir(&root.join("data"))?;
        put(&root, "etc/hostname", "updraft-vm\n", 0o644)?;
        // One machine: both slots carry its id (a read-only root cannot
        // commit one made at boot).
        put(
            &root,
            "etc/machine-id",
            "7570646673797374656d64766d000001\n",
            0o444,
        )?;
        put(&root, "etc/systemd/network/10-vm.network", NETWORK, 0o644)?;
        for (file, text, mode) in VM_FILES {
            put(&root, file, text, *mode)?;
        }
        put(&root, "usr/lib/updraft-vm/status", &status_script(), 0o755)?;
        put(&root, "usr/lib/updraft-vm/mark", &mark_script(), 0o755)?;
        // PID 1 arms the hardware watchdog and feeds it, as integration.md
        // recommends for a device.
        put(
            &root,
            WATCHDOG_CONF,
            &format!("[Manager]\nRuntimeWatchdogSec={WATCHDOG_SECONDS}s\n"),
            0o644,
        )?;
        // As the image build does: the group from sysusers.d, and the units
        // enabled offline.
        util::run(Command::new("systemd-sysusers").arg(format!("--root={}", root.display())))?;
        let systemctl = |args: &[&str]| {
            util::run(
                Command::new("systemctl")
                    .arg(format!("--root={}", root.display()))
                    .args(args),
            )
        };
        systemctl(&[
            "enable",
            "--quiet",
            "updraft.service",
            "systemd-networkd.service",
            "systemd-networkd-wait-online.service",
            "updraft-vm-mark.service",
            "updraft-vm-status.service",
            "updraft-vm-console.service",
            APP_UNIT,
        ])?;
        // The console belongs to the harness; nothing here needs a timer.
        systemctl(&[
            "mask",
            "--quiet",
            "serial-getty@ttyS0.service",
            "getty@tty1.service",
            "e2scrub_all.timer",
            "e2scrub_reap.service",
            "fstrim.timer",
        ])?;
        let out = self.work.join(format!("systemd-rootfs-{version}.ext4"));
        disk::mkfs(&root, &out, SLOT_MIB, "rootfs")?;
        let tree = util::output(Command::new("du").args(["-sm"]).arg(&root))?;
        println!(
            "   {version}: the tree is {} MiB",
            tree.split_whitespace().next().unwrap_or("?")
        );
        let _ = std::fs::remove_dir_all(&root);
        Ok(out)
    }
}

/// Make the Debian tree of scenario 6 on a thread of its own (as root;
/// otherwise scenario 6 says why it cannot run), so that `mmdebstrap`, a
/// minute or more of downloading and unpacking, overlaps the first
/// scenarios instead of preceding scenario 6. Scenario 6 waits for it
/// (see [`base_tarball`]); a failure here is reported there, when it is
/// tried again.
pub fn prepare_debian_tree() -> Option<std::thread::JoinHandle<()>> {
    if !util::is_root() {
        return None;
    }
    println!("vm-test: making the systemd guest's Debian tree beside the first scenarios");
    Some(std::thread::spawn(|| {
        if let Err(e) = base_tarball() {
            println!("vm-test: making the Debian tree early failed: {e}");
        }
    }))
}

/// The Debian tree as a tarball, made by `mmdebstrap` once and reused while
/// its command line stays the same.
fn base_tarball() -> Result<PathBuf> {
    // One at a time: [`prepare_debian_tree`] may be making it already.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = util::target_dir().join("vm-cache");
    mkdir(&cache)?;
    let tarball = cache.join(format!("debian-{SUITE}-systemd.tar"));
    let stamp = cache.join(format!("debian-{SUITE}-systemd.args"));
    let mirror = apt_mirror()?;
    let mut args: Vec<String> = vec![
        "--variant=essential".into(),
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr".into(),
        format!("--include={INCLUDE}"),
    ];
    args.extend(DPKG_OPTS.iter().map(|o| format!("--dpkgopt={o}")));
    args.push(SUITE.into());
    let key = format!("{}\n{mirror}\n", args.join("\n"));
    if tarball.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == key) {
        println!(
            "   Debian {SUITE} tree: cached in {} ({:.1} MiB)",
            tarball.display(),
            size_mib(&tarball)
        );
        return Ok(tarball);
    }
    let partial = cache.join(format!("debian-{SUITE}-systemd.tar.partial"));
    let _ = std::fs::remove_file(&partial);
    println!("   mmdebstrap {} {mirror} ...", args.join(" "));
    let t = Instant::now();
    util::run(
        Command::new(disk::tool("mmdebstrap"))
            .arg("--quiet")
            .arg("--format=tar")
            .args(&args)
            .arg(&partial)
            .arg(&mirror),
    )
    .map_err(|e| format!("{e} (Debian package mmdebstrap)"))?;
    std::fs::rename(&partial, &tarball)
        .map_err(|e| format!("renaming {}: {e}", partial.display()))?;
    std::fs::write(&stamp, key).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    println!(
        "   mmdebstrap made the Debian {SUITE} tree in {:.1} s: {} ({:.1} MiB)",
        t.elapsed().as_secs_f64(),
        tarball.display(),
        size_mib(&tarball)
    );
    Ok(tarball)
}

fn size_mib(p: &Path) -> f64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

/// The Debian mirror this machine's apt uses for the main archive.
fn apt_mirror() -> Result<String> {
    let mut texts = Vec::new();
    for f in ["/etc/apt/sources.list"] {
        if let Ok(t) = std::fs::read_to_string(f) {
            texts.push(t);
        }
    }
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut files: Vec<PathBuf> = dir
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"))
            .collect();
        files.sort();
        for f in files {
            if let Ok(t) = std::fs::read_to_string(&f) {
                texts.push(t);
            }
        }
    }
    texts
        .iter()
        .find_map(|t| mirror_in(t, SUITE))
        .ok_or_else(|| {
            format!(
                "no Debian mirror for {SUITE} in /etc/apt/sources.list or /etc/apt/sources.list.d"
            )
        })
}

/// The first URI serving `suite` itself (not `-updates` or `-security`)
/// in a sources file, one-line (`deb URI SUITE …`) or deb822 style.
fn mirror_in(text: &str, suite: &str) -> Option<String> {
    for line in text.lines().map(str::trim) {
        let mut w = line.split_whitespace();
        if w.next() != Some("deb") {
            continue;
        }
        let mut rest: Vec<&str> = w.collect();
        if rest.first().is_some_and(|o| o.starts_with('[')) {
            while let Some(o) = rest.first() {
                let end = o.ends_with(']');
                rest.remove(0);
                if end {
                    break;
                }
            }
        }
        if let [uri, s, ..] = rest[..] {
            if s == suite {
                return Some(uri.to_string());
            }
        }
    }
    for stanza in text.split("\n\n") {
        let mut fields: BTreeMap<String, String> = BTreeMap::new();
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once(':') {
                if !k.starts_with(' ') {
                    fields.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                }
            }
        }
        let deb = fields
            .get("types")
            .is_some_and(|t| t.split_whitespace().any(|x| x == "deb"));
        let has_suite = fields
            .get("suites")
            .is_some_and(|s| s.split_whitespace().any(|x| x == suite));
        if deb && has_suite {
            if let Some(uri) = fields.get("uris").and_then(|u| u.split_whitespace().next()) {
                return Some(uri.to_string());
            }
        }
    }
    None
}

/// What the shipped unit says the running service must show.
struct Expected {
    watchdog: String,
}

impl Expected {
    /// `WatchdogSec=` of `systemd/updraft.service`, as `systemctl show`
    /// prints it (`WatchdogUSec=3min`).
    fn from_unit() -> Result<Expected> {
        let path = util::root().join("systemd/updraft.service");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let watchdog = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("WatchdogSec="))
            .ok_or_else(|| format!("{} sets no WatchdogSec=", path.display()))?
            .trim()
            .to_string();
        Ok(Expected { watchdog })
    }

    /// The properties a unit line must have, as (key, value).
    fn wanted(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ActiveState", "active".into()),
            ("SubState", "running".into()),
            ("Type", "notify".into()),
            ("NotifyAccess", "main".into()),
            ("WatchdogUSec", self.watchdog.clone()),
            ("NRestarts", "0".into()),
            ("CapabilityBoundingSet", "cap_sys_boot".into()),
            ("ProtectSystem", "strict".into()),
            // The live process: only CAP_SYS_BOOT, no new privileges, a
            // seccomp filter.
            ("CapBnd", CAP_SYS_BOOT_MASK.into()),
            ("CapEff", CAP_SYS_BOOT_MASK.into()),
            ("NoNewPrivs", "1".into()),
            ("Seccomp", "2".into()),
        ]
    }

    fn check(&self, vm: &Vm, u: &BTreeMap<String, String>, boot: &str) -> Result {
        for (k, v) in self.wanted() {
            if u.get(k) != Some(&v) {
                return Err(vm.failure(&format!(
                    "in {boot}, updraft.service has {k}={} where the shipped unit gives {k}={v}",
                    u.get(k).map(String::as_str).unwrap_or("(missing)")
                )));
            }
        }
        Ok(())
    }

    fn describe(&self, u: &BTreeMap<String, String>) -> String {
        self.wanted()
            .iter()
            .map(|(k, _)| format!("{k}={}", u.get(*k).map(String::as_str).unwrap_or("-")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The properties in a unit line.
fn unit_of(line: &str) -> Option<BTreeMap<String, String>> {
    let rest = line.split(UNIT_MARK).nth(1)?;
    Some(
        rest.split('\t')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
    )
}

/// Wait for a unit line that shows the service up (`READY=1` received).
fn wait_unit_active(vm: &mut Vm) -> Result<BTreeMap<String, String>> {
    let from = vm.mark();
    let line = vm.wait_line(
        "updraft.service active under systemd",
        from,
        super::SETTLE_WAIT,
        |l| {
            unit_of(l).is_some_and(|u| {
                u.get("ActiveState").map(String::as_str) == Some("active")
                    && u.contains_key("CapBnd")
            })
        },
    )?;
    unit_of(&line).ok_or_else(|| format!("unit line without properties: {line}"))
}

/// Over every unit line of the run: the service never restarted and never
/// failed; how many watchdog pings the lines showed.
fn unit_report(vm: &Vm, expect: &Expected) -> Result<String> {
    let units: Vec<BTreeMap<String, String>> =
        vm.lines().iter().filter_map(|l| unit_of(l)).collect();
    let mut pings: Vec<&str> = units
        .iter()
        .filter_map(|u| u.get("WatchdogTimestampMonotonic").map(String::as_str))
        .filter(|t| *t != "0")
        .collect();
    pings.dedup();
    for u in &units {
        let restarts = u.get("NRestarts").map(String::as_str).unwrap_or("0");
        if restarts != "0" || u.get("ActiveState").map(String::as_str) == Some("failed") {
            return Err(vm.failure(&format!(
                "updraft.service restarted or failed under systemd (ActiveState={}, NRestarts={restarts}, ExecMainStatus={})",
                u.get("ActiveState").map(String::as_str).unwrap_or("-"),
                u.get("ExecMainStatus").map(String::as_str).unwrap_or("-")
            )));
        }
    }
    Ok(format!(
        "unit: {} unit lines over 3 boots, NRestarts=0 and never failed; WatchdogUSec={}; {} distinct watchdog timestamps (the start and the daemon's pings)",
        units.len(),
        expect.watchdog,
        pings.len()
    ))
}

/// The app's start line for `version` from console line `from` on (the
/// app prints it when its unit starts it).
fn app_started(vm: &Vm, version: &str, from: usize) -> Result<String> {
    let want = format!("{APP_MARK}{version} running from ");
    vm.lines()[from..]
        .iter()
        .rev()
        .find(|l| l.contains(&want))
        .map(|l| l.split(APP_MARK).nth(1).unwrap_or(l).trim().to_string())
        .ok_or_else(|| {
            vm.failure(&format!(
                "{APP_UNIT} never started app {APP} {version}: updraft must restart it after the switch"
            ))
        })
}

/// `src` copied to `rel` under `root` with `mode`.
fn install(src: &Path, root: &Path, rel: &str, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt;
    let to = root.join(rel);
    if let Some(parent) = to.parent() {
        mkdir(parent)?;
    }
    std::fs::copy(src, &to)
        .map_err(|e| format!("copying {} to {}: {e}", src.display(), to.display()))?;
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("setting the mode of {}: {e}", to.display()))
}

/// `text` written to `rel` under `root` with `mode`.
fn put(root: &Path, rel: &str, text: &str, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt;
    let to = root.join(rel);
    if let Some(parent) = to.parent() {
        mkdir(parent)?;
    }
    let _ = std::fs::remove_file(&to);
    std::fs::write(&to, text).map_err(|e| format!("writing {}: {e}", to.display()))?;
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("setting the mode of {}: {e}", to.display()))
}

/// updraft's configuration on the systemd guest: as the Yocto template
/// (`socket_group`, the default `reboot_command`, `systemctl reboot`), with
/// the VM's server, keys, slots and GRUB environment.
fn config(s: &Settings) -> String {
    format!(
        r#"# updraft on the systemd guest: polls the host's nginx through QEMU's user network.
{server}
[device]
compatible = "{compatible}"
id_file = "/data/updraft/device-id"

[trust]
keys = ["/etc/updraft/release.pub"]

[slots]
a = "/dev/vda{a}"
b = "/dev/vda{b}"

[bootloader]
kind = "grub"
grubenv = "/boot/grub/grubenv"

[health]
checks_dir = "/etc/updraft/health.d"
required_units = ["systemd-networkd.service"]
timeout = "60s"

[system]
reboot = "auto"
state_dir = "/data/updraft"
socket = "/run/updraft/updraft.sock"
socket_group = "updraft"
"#,
        server = guest::server_section(s),
        compatible = machine::X86_64.compatible(),
        a = SD_SLOT_A.number,
        b = SD_SLOT_B.number,
    )
}

fn fstab() -> String {
    format!(
        "# The root file system is the slot, mounted read-only by the initramfs.\n\
         /dev/vda{boot} /boot ext4 defaults 0 2\n\
         /dev/vda{data} /data ext4 defaults 0 2\n\
         tmpfs /tmp tmpfs mode=1777,size=32m 0 0\n\
         tmpfs /var tmpfs mode=0755,size=64m 0 0\n",
        boot = BOOT.number,
        data = SD_DATA.number,
    )
}

const HEALTH_CHECK: &str = "#!/bin/sh\n\
# Healthy when the data partition is mounted and the network has its route\n\
# (netlink: allowed by the 50-health-checks drop-in).\n\
grep -q ' /data ' /proc/self/mounts || { echo '/data is not mounted'; exit 1; }\n\
ip route | grep -q '^default' || { echo 'no default route'; exit 1; }\n";

/// QEMU's user network, configured statically (no DHCP wait).
const NETWORK: &str =
    "[Match]\nName=en* eth*\n\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n";

/// The VM's own units and their scripts: the harness's console protocol.
const VM_FILES: &[(&str, &str, u32)] = &[
    (
        "etc/systemd/system/updraft-vm-mark.service",
        "[Unit]\n\
         Description=updraft VM: marks userspace and the shutdown on the console\n\
         DefaultDependencies=no\n\
         Conflicts=shutdown.target\n\
         Before=shutdown.target\n\n\
         [Service]\n\
         Type=oneshot\n\
         RemainAfterExit=yes\n\
         ExecStart=/usr/lib/updraft-vm/mark start\n\
         ExecStop=/usr/lib/updraft-vm/mark stop\n\n\
         [Install]\n\
         WantedBy=sysinit.target\n",
        0o644,
    ),
    (
        "etc/systemd/system/updraft-vm-status.service",
        "[Unit]\n\
         Description=updraft VM: status and unit lines on the console\n\
         After=updraft-vm-mark.service\n\n\
         [Service]\n\
         ExecStart=/usr/lib/updraft-vm/status\n\n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        0o644,
    ),
    (
        "etc/systemd/system/updraft-vm-console.service",
        "[Unit]\n\
         Description=updraft VM: the harness's commands from the serial console\n\
         After=updraft-vm-mark.service\n\n\
         [Service]\n\
         ExecStart=/usr/lib/updraft-vm/console\n\n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        0o644,
    ),
    ("usr/lib/updraft-vm/console", CONSOLE_SCRIPT, 0o755),
];

/// The app's unit: the app run from the generation `current` names; not
/// started before updraft installed one.
const APP_UNIT_FILE: &str = "[Unit]\n\
     Description=updraft VM: the application web, run from its active generation\n\
     ConditionPathExists=/data/updraft/apps/web/current\n\
     RequiresMountsFor=/data/updraft\n\n\
     [Service]\n\
     ExecStart=/data/updraft/apps/web/current/bin/web\n\
     StandardOutput=journal+console\n\n\
     [Install]\n\
     WantedBy=multi-user.target\n";

/// The marker unit's script: the userspace line (and the hardware
/// watchdog's, which systemd opened before any unit ran) at start, the
/// shutdown jobs at stop.
fn mark_script() -> String {
    format!(
        r#"#!/bin/sh
exec >/dev/console 2>&1
case "$1" in
start)
    version=$(cat /etc/updraft-vm-version)
    slot=none
    for a in $(cat /proc/cmdline); do
        case "$a" in updraft.slot=*) slot=${{a#updraft.slot=}} ;; esac
    done
    echo "{USERSPACE_MARK} slot=$slot version=$version uptime=$(cut -d' ' -f1 /proc/uptime) boot_id=$(cat /proc/sys/kernel/random/boot_id) init=$(readlink /proc/1/exe)"
    {watchdog_line}
    ;;
stop)
    jobs=$(systemctl list-jobs --no-legend --plain 2>/dev/null | awk '{{print $2}}' | grep -E '^(reboot|poweroff|halt|kexec)\.target$' | tr '\n' ' ')
    echo "{SHUTDOWN_MARK} $jobs"
    ;;
esac
"#,
        watchdog_line = guest::watchdog_line_script(),
    )
}

/// Ask the guest for this boot's journal entries of the event kind `event`
/// and check them: one for `release` with the kind's `MESSAGE_ID` and
/// updraft's fields (`journalctl -o json`), and the catalog's text beside
/// it (`journalctl -x`). A line saying what was found.
fn journal_event(vm: &mut Vm, event: &str, release: &str) -> Result<String> {
    let kind = updraft::events::kind(event).ok_or_else(|| format!("{event} is no event kind"))?;
    let id = kind.message_id;
    let m = vm.mark();
    vm.send(&format!("vm-journal {id}"))?;
    vm.wait_line(
        &format!("the journal's entries of {event}"),
        m,
        std::time::Duration::from_secs(60),
        |l| l.contains(&format!("updraft-vm: journal-end {id}")),
    )?;
    let lines = &vm.lines()[m..];
    let entry = lines
        .iter()
        .filter_map(|l| l.split_once("updraft-vm: journal-json ").map(|(_, j)| j))
        .filter_map(|j| serde_json::from_str::<Value>(j.trim()).ok())
        .find(|e| e["UPDRAFT_RELEASE"] == release);
    let Some(entry) = entry else {
        return Err(vm.failure(&format!(
            "no journal entry with MESSAGE_ID={id} ({event}) for release {release}"
        )));
    };
    for (field, want) in [
        ("MESSAGE_ID", id),
        ("UPDRAFT_EVENT", event),
        ("SYSLOG_IDENTIFIER", "updraft"),
        ("_SYSTEMD_UNIT", "updraft.service"),
    ] {
        if entry[field] != want {
            return Err(vm.failure(&format!(
                "the journal entry of {event} has {field}={} instead of {want}: {entry}",
                entry[field]
            )));
        }
    }
    // `journalctl -x` puts the catalog's subject, its fields filled in,
    // under the entry.
    let slot = entry["UPDRAFT_SLOT"].as_str().unwrap_or("?").to_string();
    let subject = kind
        .subject
        .replace("@UPDRAFT_RELEASE@", release)
        .replace("@UPDRAFT_SLOT@", &slot);
    let explained = lines
        .iter()
        .any(|l| l.contains("updraft-vm: journal-x ") && l.contains(&subject));
    if !explained {
        return Err(vm.failure(&format!(
            "journalctl -x does not show the catalog's subject {subject:?} for {event}"
        )));
    }
    Ok(format!(
        "{event} of {release} logged with MESSAGE_ID={id}, UPDRAFT_SLOT={slot}; journalctl -x: \"{subject}\""
    ))
}

/// The status script with the app's line.
fn status_script() -> String {
    STATUS_SCRIPT.replace(
        "    sleep 2\n",
        &format!("{}    sleep 2\n", app::STATUS_LINES),
    )
}

const STATUS_SCRIPT: &str = r#"#!/bin/sh
# updraft's status and its unit's properties, whenever they change.
exec >/dev/console 2>&1
(
    systemctl is-system-running --wait >/dev/null 2>&1
    echo "updraft-vm: boot finished: $(systemd-analyze time 2>&1 | head -n 1); system $(systemctl is-system-running); failed units: $(systemctl --failed --plain --no-legend | awk '{print $1}' | tr '\n' ' ')"
) &
last=
lastu=
while :; do
    s=$(updraft status --json 2>&1 | tr -d '\n')
    if [ "$s" != "$last" ]; then
        echo "updraft-vm: status $s"
        last=$s
    fi
    u=$(systemctl show updraft.service -p ActiveState -p SubState -p Type -p NotifyAccess \
        -p WatchdogUSec -p WatchdogTimestampMonotonic -p NRestarts -p ExecMainStatus \
        -p CapabilityBoundingSet -p ProtectSystem | tr '\n' '\t')
    pid=$(systemctl show -p MainPID --value updraft.service)
    if [ -n "$pid" ] && [ "$pid" != 0 ]; then
        u="$u$(awk '/^(CapBnd|CapEff|NoNewPrivs|Seccomp):/ { sub(":", "", $1); printf "%s=%s\t", $1, $2 }' /proc/$pid/status 2>/dev/null)"
    fi
    if [ "$u" != "$lastu" ]; then
        echo "updraft-vm: unit $u"
        lastu=$u
    fi
    sleep 2
done
"#;

const CONSOLE_SCRIPT: &str = r#"#!/bin/sh
# The harness's commands, typed on the serial console.
exec </dev/ttyS0 >/dev/console 2>&1
stty -echo 2>/dev/null
while read -r cmd; do
    case "$cmd" in
        vm-journal\ *)
            # This boot's journal entries of updraft with one MESSAGE_ID,
            # as JSON and as `journalctl -x` explains them (/var is a
            # tmpfs: the catalog's database is made now).
            id=${cmd#vm-journal }
            journalctl --update-catalog
            journalctl -b -o json -u updraft.service "MESSAGE_ID=$id" | sed 's/^/updraft-vm: journal-json /'
            journalctl -b -x --no-pager -u updraft.service "MESSAGE_ID=$id" | sed 's/^/updraft-vm: journal-x /'
            echo "updraft-vm: journal-end $id"
            ;;
        vm-poweroff) echo "updraft-vm: halting"; systemctl poweroff ;;
        vm-reboot) echo "updraft-vm: rebooting"; systemctl reboot ;;
    esac
done
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::guest::{HALT_MARK, STATUS_MARK};

    #[test]
    fn the_mirror_comes_from_either_sources_format() {
        let deb822 = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
                      URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\
                      Components: main\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\n\
                      Suites: bookworm-security\nComponents: main\n";
        assert_eq!(
            mirror_in(deb822, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        let list = "deb http://security.debian.org/ bookworm-security main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n";
        assert_eq!(
            mirror_in(list, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(mirror_in(list, "trixie"), None);
    }

    #[test]
    fn unit_lines_give_their_properties() {
        let u = unit_of("updraft-vm: unit ActiveState=active\tType=notify\tWatchdogUSec=3min\tCapBnd=0000000000400000\t")
            .unwrap_or_default();
        assert_eq!(u.get("Type").map(String::as_str), Some("notify"));
        assert_eq!(u.get("WatchdogUSec").map(String::as_str), Some("3min"));
        assert_eq!(u.get("CapBnd").map(String::as_str), Some(CAP_SYS_BOOT_MASK));
        assert_eq!(unit_of("updraft-vm: status {}"), None);
    }

    #[test]
    fn the_guest_scripts_print_the_markers_the_harness_reads() {
        let mark = mark_script();
        assert!(mark.contains(&format!(
            "echo \"{USERSPACE_MARK} slot=$slot version=$version "
        )));
        assert!(mark.contains(&guest::watchdog_line_script()));
        assert!(mark.contains(&format!("echo \"{SHUTDOWN_MARK} $jobs\"")));
        assert!(mark.contains("awk '{print $2}'"), "{mark}");
        assert!(STATUS_SCRIPT.contains(&format!("echo \"{STATUS_MARK}$s\"")));
        assert!(status_script().contains(app::STATUS_LINES));
        assert!(
            APP_UNIT_FILE.contains(&format!("ExecStart={}/web/current/bin/web", app::APPS_DIR))
        );
        assert!(STATUS_SCRIPT.contains(&format!("echo \"{UNIT_MARK}$u\"")));
        assert!(STATUS_SCRIPT.contains(&format!("echo \"{BOOTED_MARK} ")));
        assert!(CONSOLE_SCRIPT.contains(&format!("echo \"{HALT_MARK}\"; systemctl poweroff")));
    }

    #[test]
    fn the_expected_watchdog_is_the_shipped_units() {
        let e = Expected::from_unit().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.watchdog, "3min");
    }

    #[test]
    fn the_systemd_layout_follows_the_boot_partition() {
        assert_eq!(SD_SLOT_A.start_mib, BOOT.start_mib + BOOT.size_mib);
        assert_eq!(SD_DATA.start_mib, SD_SLOT_B.start_mib + SD_SLOT_B.size_mib);
        assert!(fstab().contains(&format!("/dev/vda{} /data ", SD_DATA.number)));
    }
}
