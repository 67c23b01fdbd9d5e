//! What runs inside the VM: a busybox initramfs that loads the modules of
//! the machine's Debian kernel (fetched by [`super::debs`]) it needs (the
//! virtio drivers, ext4, the hardware watchdog's driver) and `switch_root`s
//! into the slot the boot script named, and the slot root file systems: busybox,
//! the updraft binary cargo built (with the glibc loader and libraries it
//! needs: as `ldd` lists them on the host, or as the aarch64 binary's
//! `DT_NEEDED` entries name them in the cross sysroot),
//! the kernel in `/boot`, updraft's configuration, the release's health
//! check, and an init script that arms the hardware watchdog and does what
//! a real system does before the systemd unit starts `updraft daemon`
//! (mounts, network), then starts it.
//!
//! The guest speaks to the harness only through marker lines on the serial
//! console (`updraft-vm: …`) and reads two commands from
//! it (`vm-poweroff`, `vm-reboot`).
//!
//! This module owns the guest's files and scripts. It must never start a
//! VM, read a console, or decide what a scenario asserts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::app;
use super::disk;
use super::machine::{Loader, Machine};
use crate::util::{self, Result};

/// The line the bootloader prints before it runs the shipped script.
pub const BOOTLOADER_MARK: &str = "updraft-vm: bootloader";
/// The first line of a slot's userspace; followed by `slot=X version=V`.
pub const USERSPACE_MARK: &str = "updraft-vm: userspace";
/// A status line: followed by `updraft status --json` on one line.
pub const STATUS_MARK: &str = "updraft-vm: status ";
/// Printed right before a clean power-off.
pub const HALT_MARK: &str = "updraft-vm: halting";
/// Printed by a release that hangs ([`Behaviour::Hangs`]) as it stops
/// feeding the watchdog.
pub const HANG_MARK: &str = "hangs: the watchdog is no longer fed";
/// Where the guest keeps libubootenv's configuration naming the
/// environment pair on the FAT boot partition (U-Boot machines).
const FW_ENV_CONFIG: &str = "/etc/fw_env.config";

/// Printed before each line `updraft adopt` printed in the guest.
pub const ADOPT_MARK: &str = "updraft-vm: adopt: ";

/// The updater a factory image ran before updraft, whose files it carries
/// and which its first boot adopts (`updraft adopt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predecessor {
    /// RAUC with its U-Boot integration: `/etc/rauc/system.conf` naming
    /// slots `rootfs.0` (bootname `system0`, slot A) and `rootfs.1`
    /// (`system1`, B), its data directory `/data/rauc`.
    RaucUboot,
    /// Mender with its GRUB integration: `/etc/mender/mender.conf` naming
    /// the root partitions, its device type and the factory artifact's
    /// name (`11.0`).
    MenderGrub,
}

impl Predecessor {
    /// `updraft adopt --from` this.
    fn name(self) -> &'static str {
        match self {
            Predecessor::RaucUboot => "rauc",
            Predecessor::MenderGrub => "mender",
        }
    }
}

/// The bootnames of RAUC's slots A and B on the VM.
pub const RAUC_BOOTNAMES: [&str; 2] = ["system0", "system1"];

/// The adopted configuration, on the data partition: the slot roots are
/// read-only, so a device that adopts keeps it where both slots find it,
/// and the init script of every release starts updraft with it.
const ADOPTED_CONFIG: &str = "/data/updraft/updraft.toml";

/// The hardware watchdog the slot's init arms, as systemd's
/// `RuntimeWatchdogSec=` does on the systemd guest: fed every second, it
/// resets the machine after this many seconds without a feed.
pub const WATCHDOG_SECONDS: u32 = 20;

/// The watchdog line every boot prints once the watchdog is armed:
/// followed by `device=/dev/watchdog0 state=… timeout=… bootstatus=…
/// identity=…`, read from `/sys/class/watchdog/watchdog0` (the identity,
/// which may hold spaces, last). See [`WatchdogLine`].
pub const WATCHDOG_MARK: &str = "updraft-vm: watchdog ";

/// The shell line that prints [`WATCHDOG_MARK`] with the first watchdog's
/// attributes (empty when there is none).
pub fn watchdog_line_script() -> String {
    format!(
        "w=/sys/class/watchdog/watchdog0; echo \"{WATCHDOG_MARK}device=/dev/watchdog0 \
         state=$(cat $w/state 2>/dev/null) timeout=$(cat $w/timeout 2>/dev/null) \
         bootstatus=$(cat $w/bootstatus 2>/dev/null) identity=$(cat $w/identity 2>/dev/null)\""
    )
}

/// A watchdog line, as the harness reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct WatchdogLine {
    /// `active` once something feeds it.
    pub state: String,
    /// Seconds without a feed before it resets the machine.
    pub timeout: Option<u32>,
    /// Why the driver found the last reset happened (`WDIOF_*` bits; for
    /// the 6300ESB, `WDIOF_CARDRESET` when it was the watchdog's).
    pub bootstatus: Option<u32>,
    /// The driver's name for the device (`i6300ESB timer`).
    pub identity: String,
}

impl WatchdogLine {
    /// The fields of a watchdog line; `None` for any other line.
    pub fn parse(line: &str) -> Option<WatchdogLine> {
        let rest = line.split(WATCHDOG_MARK).nth(1)?;
        let (fields, identity) = rest.split_once("identity=")?;
        let get = |key: &str| {
            fields
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or("")
                .to_string()
        };
        Some(WatchdogLine {
            state: get("state"),
            timeout: get("timeout").parse().ok(),
            bootstatus: get("bootstatus").parse().ok(),
            identity: identity.trim().to_string(),
        })
    }
}

/// What a release does when it boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Comes up, and its health check passes.
    Healthy,
    /// Comes up, and its health check fails.
    FailsHealthCheck,
    /// Its init exits at once: the kernel panics and reboots (`panic=`).
    CannotBoot,
    /// Its init hangs before the services start: the hardware watchdog is
    /// no longer fed, and QEMU's emulated device resets the machine.
    Hangs,
}

/// One slot image's contents.
#[derive(Clone, Debug)]
pub struct Release {
    pub version: String,
    pub behaviour: Behaviour,
    /// Configures the app component (`super::app`), carries its health
    /// check and prints its line on the console.
    pub app: bool,
}

/// What every slot image configures updraft with.
pub struct Settings {
    pub manifest_url: String,
    pub report_url: String,
    /// PEM of the CA the update server's certificate is issued by.
    pub ca_file: PathBuf,
    /// The release signing key's public half.
    pub release_key: PathBuf,
    /// Sections appended to the configuration (`[rollback]`), or empty.
    pub extra: String,
}

/// The Debian kernel a machine boots, fetched by [`super::debs`].
#[derive(Clone)]
pub struct Kernel {
    pub version: String,
    pub image: PathBuf,
    modules: PathBuf,
    /// The modules the initramfs loads (the machine's and its watchdog's).
    wanted: Vec<&'static str>,
}

impl Kernel {
    /// `machine`'s kernel, with the busybox of its architecture: the
    /// package root [`super::debs`] extracted.
    pub fn of(machine: &Machine) -> Result<(Kernel, PathBuf)> {
        let x = super::debs::kernel_and_busybox(machine.debian_arch, machine.kernel_flavour)?;
        let kernel = Kernel {
            image: x.root.join(format!("boot/vmlinuz-{}", x.kernel_version)),
            modules: x.root.join("lib/modules").join(&x.kernel_version),
            version: x.kernel_version,
            wanted: machine.initramfs_modules(),
        };
        Ok((kernel, x.root.join("bin/busybox")))
    }

    /// The module files the machine names, dependencies first: each found
    /// by its name in `modules.order`, with the modules its `.modinfo`
    /// `depends=` names (what `depmod` would write into `modules.dep`,
    /// which the package leaves to its postinst).
    fn module_files(&self) -> Result<Vec<PathBuf>> {
        let order_file = self.modules.join("modules.order");
        let order = std::fs::read_to_string(&order_file)
            .map_err(|e| format!("reading {}: {e}", order_file.display()))?;
        let paths: BTreeMap<String, &str> = order
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|p| (module_name(p), p))
            .collect();
        let mut out: Vec<&str> = Vec::new();
        let mut stack: Vec<(String, bool)> = self
            .wanted
            .iter()
            .rev()
            .map(|n| (n.replace('-', "_"), false))
            .collect();
        // Depth first: a module goes out after the modules it depends on.
        while let Some((name, deps_done)) = stack.pop() {
            let rel = *paths.get(&name).ok_or_else(|| {
                format!(
                    "kernel {} has no module {name} (in {})",
                    self.version,
                    order_file.display()
                )
            })?;
            if out.contains(&rel) {
                continue;
            }
            if !rel.ends_with(".ko") {
                return Err(format!(
                    "kernel module {rel} is compressed; the VM's initramfs loads plain .ko files"
                ));
            }
            if deps_done {
                out.push(rel);
                continue;
            }
            let file = self.modules.join(rel);
            let bytes =
                std::fs::read(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
            stack.push((name, true));
            for d in modinfo_depends(&bytes).split(',').filter(|d| !d.is_empty()) {
                stack.push((d.replace('-', "_"), false));
            }
        }
        Ok(out.into_iter().map(|rel| self.modules.join(rel)).collect())
    }
}

/// The `depends=` entry of a module's `.modinfo` (empty when none).
fn modinfo_depends(ko: &[u8]) -> String {
    let key = b"\0depends=";
    ko.windows(key.len())
        .position(|w| w == key)
        .map(|i| {
            let rest = &ko[i + key.len()..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end]).into_owned()
        })
        .unwrap_or_default()
}

fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split('.').next().unwrap_or(file);
    stem.replace('-', "_")
}

/// The host files every guest image is made from.
#[derive(Clone)]
pub struct Guest {
    machine: &'static Machine,
    pub kernel: Kernel,
    busybox: PathBuf,
    applets: Vec<String>,
    /// The updraft binary without its debug information.
    updraft: PathBuf,
    /// The loader and libraries the binary needs: where they are on the
    /// host, and where they go in the slot.
    libs: Vec<(PathBuf, PathBuf)>,
}

impl Guest {
    /// Collect the kernel, busybox and updraft (`updraft_bin`, built for
    /// the machine, stripped into `work`).
    pub fn prepare(machine: &'static Machine, updraft_bin: &Path, work: &Path) -> Result<Guest> {
        let (kernel, busybox) = Kernel::of(machine)?;
        // The host's busybox-static is the same Debian package: its applet
        // list names the links for either architecture.
        let list = util::output(Command::new("/bin/busybox").arg("--list"))
            .map_err(|e| format!("{e} (Debian package busybox-static)"))?;
        let applets = list
            .lines()
            .map(str::trim)
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .map(str::to_string)
            .collect();
        let (updraft, libs) = stripped(machine, updraft_bin, &work.join("updraft"))?;
        Ok(Guest {
            machine,
            kernel,
            busybox,
            applets,
            updraft,
            libs,
        })
    }

    /// The same guest with another updraft binary (the previous release's,
    /// for scenario 7), stripped into `work` as `name`.
    pub fn with_updraft(&self, updraft_bin: &Path, work: &Path, name: &str) -> Result<Guest> {
        let (updraft, libs) = stripped(self.machine, updraft_bin, &work.join(name))?;
        Ok(Guest {
            updraft,
            libs,
            ..self.clone()
        })
    }

    /// The stripped updraft binary every guest image carries.
    pub fn updraft(&self) -> &Path {
        &self.updraft
    }

    /// The initramfs (an uncompressed newc cpio archive) at `out`.
    pub fn initramfs(&self, work: &Path, out: &Path) -> Result {
        let root = work.join("initramfs");
        let _ = std::fs::remove_dir_all(&root);
        for d in ["bin", "dev", "proc", "sys", "newroot", "lib/modules"] {
            mkdir(&root.join(d))?;
        }
        copy(&self.busybox, &root.join("bin/busybox"), 0o755)?;
        let mut order = String::new();
        for m in self.kernel.module_files()? {
            let name = m
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| format!("module path {} has no name", m.display()))?
                .to_string();
            copy(&m, &root.join("lib/modules").join(&name), 0o644)?;
            order.push_str(&name);
            order.push('\n');
        }
        write(&root.join("lib/modules/order"), &order, 0o644)?;
        write(&root.join("init"), INITRAMFS_INIT, 0o755)?;
        let out_file =
            std::fs::File::create(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
        let mut find = Command::new("find");
        find.arg(".").current_dir(&root);
        let listing = util::output(&mut find)?;
        let mut cpio = Command::new(disk::tool("cpio"));
        cpio.args(["--quiet", "-o", "-H", "newc"])
            .current_dir(&root)
            .stdin(std::process::Stdio::piped())
            .stdout(out_file);
        let mut child = cpio
            .spawn()
            .map_err(|e| format!("starting cpio: {e} (Debian package cpio)"))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            stdin
                .write_all(listing.as_bytes())
                .map_err(|e| format!("feeding cpio: {e}"))?;
        }
        let status = child.wait().map_err(|e| format!("waiting for cpio: {e}"))?;
        if !status.success() {
            return Err(format!("cpio failed making {}: {status}", out.display()));
        }
        Ok(())
    }

    /// The slot image of `release`: an ext4 file system the size of a
    /// slot partition, at `out`.
    pub fn rootfs(
        &self,
        release: &Release,
        settings: &Settings,
        work: &Path,
        out: &Path,
    ) -> Result {
        self.rootfs_with(release, settings, work, out, None)
    }

    /// [`Guest::rootfs`], for a factory image that ran `predecessor`: its
    /// files, and a first boot that adopts the device from it.
    pub fn rootfs_with(
        &self,
        release: &Release,
        settings: &Settings,
        work: &Path,
        out: &Path,
        predecessor: Option<Predecessor>,
    ) -> Result {
        let root = work.join(format!("rootfs-{}", release.version));
        let _ = std::fs::remove_dir_all(&root);
        for d in [
            "bin",
            "sbin",
            "usr/bin",
            "usr/sbin",
            "etc/updraft/health.d",
            "proc",
            "sys",
            "dev",
            "run",
            "tmp",
            "data",
            "boot",
        ] {
            mkdir(&root.join(d))?;
        }
        copy(&self.busybox, &root.join("bin/busybox"), 0o755)?;
        for a in &self.applets {
            let link = root.join("bin").join(a);
            if !link.exists() {
                std::os::unix::fs::symlink("busybox", &link)
                    .map_err(|e| format!("linking {}: {e}", link.display()))?;
            }
        }
        copy(&self.updraft, &root.join("usr/bin/updraft"), 0o755)?;
        for (from, to) in &self.libs {
            let rel = to.strip_prefix("/").unwrap_or(to);
            copy(from, &root.join(rel), 0o755)?;
        }
        copy(&self.kernel.image, &root.join("boot/vmlinuz"), 0o644)?;
        copy(&settings.ca_file, &root.join("etc/updraft/ca.pem"), 0o644)?;
        copy(
            &settings.release_key,
            &root.join("etc/updraft/release.pub"),
            0o644,
        )?;
        let mut toml = config(settings, self.machine);
        if release.app {
            toml.push_str(&app::config_tables(&[]));
            mkdir(&root.join(&app::HEALTH_DIR[1..]))?;
            write(
                &root.join(&app::HEALTH_DIR[1..]).join("10-files"),
                app::HEALTH_CHECK,
                0o755,
            )?;
        }
        if let Some(p) = predecessor {
            // The marker adopt writes, where a read-only root lets it.
            toml = toml.replace(
                "[device]\n",
                "[device]\nrelease_file = \"/data/updraft/release\"\n",
            );
            for (path, text) in predecessor_files(p, self.machine) {
                let file = root.join(path);
                if let Some(dir) = file.parent() {
                    mkdir(dir)?;
                }
                write(&file, &text, 0o644)?;
            }
            write(&root.join("etc/updraft-vm-adopt"), p.name(), 0o644)?;
        }
        write(&root.join("etc/updraft/updraft.toml"), &toml, 0o644)?;
        if self.machine.loader == Loader::UBoot {
            write(
                &root.join(&FW_ENV_CONFIG[1..]),
                &fw_env_config("/boot"),
                0o644,
            )?;
        }
        write(
            &root.join("etc/updraft/health.d/10-vm"),
            &health_check(release),
            0o755,
        )?;
        // The release marker the image build writes: a device fresh from
        // the factory knows what it runs without hashing its slot.
        write(
            &root.join("etc/updraft/release"),
            &format!("UPDRAFT_RELEASE={}\n", release.version),
            0o644,
        )?;
        write(
            &root.join("etc/updraft-vm-version"),
            &release.version,
            0o644,
        )?;
        write(
            &root.join("sbin/init"),
            &slot_init(release, self.machine),
            0o755,
        )?;
        // With a journal, as a Yocto ext4 image has: mounted read-only,
        // its page cache differs from the medium (the kernel changes the
        // journal superblock in memory), and a delta must still apply
        // from it.
        disk::mkfs(&root, out, disk::SLOT_A.size_mib, "rootfs")?;
        let _ = std::fs::remove_dir_all(&root);
        Ok(())
    }
}

/// `binary` without its debug information at `out`, and the loader and
/// libraries it needs for `machine`.
fn stripped(
    machine: &Machine,
    binary: &Path,
    out: &Path,
) -> Result<(PathBuf, Vec<(PathBuf, PathBuf)>)> {
    let strip = match machine.loader {
        Loader::Grub => "strip",
        Loader::UBoot => "aarch64-linux-gnu-strip",
    };
    util::output(
        Command::new(strip)
            .arg("--strip-debug")
            .arg("-o")
            .arg(out)
            .arg(binary),
    )
    .map_err(|e| format!("{e} (Debian package binutils)"))?;
    let libs = match machine.loader {
        Loader::Grub => shared_libraries(out)?,
        Loader::UBoot => cross_libraries(out, Path::new(AARCH64_SYSROOT))?,
    };
    Ok((out.to_path_buf(), libs))
}

/// The loader and libraries `ldd` lists for `binary`, each going to the
/// same path in the slot.
fn shared_libraries(binary: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let out = util::output(Command::new("ldd").arg(binary))?;
    let libs = parse_ldd(&out);
    if !libs
        .iter()
        .any(|l| l.to_string_lossy().contains("ld-linux"))
    {
        return Err(format!(
            "ldd lists no loader for {}:\n{out}",
            binary.display()
        ));
    }
    Ok(libs.into_iter().map(|l| (l.clone(), l)).collect())
}

/// The aarch64 sysroot the cross toolchain links against (Debian package
/// libc6-arm64-cross).
const AARCH64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// The loader and libraries of a foreign `binary` (`ldd` cannot run it):
/// its program interpreter and `DT_NEEDED` entries, as
/// `aarch64-linux-gnu-readelf` shows them, taken from `sysroot/lib` and
/// put where Debian's arm64 loader looks (its own path, and the multiarch
/// `/lib/aarch64-linux-gnu`; the cross libc is Debian's arm64 one).
fn cross_libraries(binary: &Path, sysroot: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let out = util::output(
        Command::new("aarch64-linux-gnu-readelf")
            .args(["-d", "-l", "-W"])
            .arg(binary),
    )
    .map_err(|e| format!("{e} (Debian package binutils-aarch64-linux-gnu)"))?;
    let (interp, needed) = parse_readelf(&out);
    let interp = interp.ok_or_else(|| {
        format!(
            "readelf shows no program interpreter for {}:\n{out}",
            binary.display()
        )
    })?;
    let lib = sysroot.join("lib");
    let mut libs = Vec::new();
    let interp_name = interp
        .file_name()
        .ok_or_else(|| format!("interpreter {} has no file name", interp.display()))?;
    libs.push((lib.join(interp_name), interp.clone()));
    for n in needed {
        if Path::new(&n).file_name() == Some(interp_name) {
            continue;
        }
        let from = lib.join(&n);
        if !from.is_file() {
            return Err(format!(
                "{} needs {n}, which {} does not have (Debian package libc6-arm64-cross)",
                binary.display(),
                lib.display()
            ));
        }
        libs.push((from, PathBuf::from("/lib/aarch64-linux-gnu").join(&n)));
    }
    Ok(libs)
}

/// The interpreter (`[Requesting program interpreter: /lib/ld-….so.1]`)
/// and the `(NEEDED)  Shared library: [libc.so.6]` entries of `readelf -d
/// -l` output.
fn parse_readelf(text: &str) -> (Option<PathBuf>, Vec<String>) {
    let bracketed = |l: &str| {
        let start = l.find('[')? + 1;
        let end = l[start..].find(']')? + start;
        Some(l[start..end].to_string())
    };
    let interp = text
        .lines()
        .find_map(|l| l.split_once("Requesting program interpreter: "))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(path, _)| PathBuf::from(path.trim()));
    let needed = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(bracketed)
        .collect();
    (interp, needed)
}

/// The files in `ldd` output: `libc.so.6 => /lib/…/libc.so.6 (0x…)` or
/// `/lib64/ld-linux-x86-64.so.2 (0x…)`; the vDSO has no file.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        })
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The files of `p` in a factory image, as its integration leaves them.
fn predecessor_files(p: Predecessor, m: &Machine) -> Vec<(&'static str, String)> {
    match p {
        Predecessor::RaucUboot => vec![(
            "etc/rauc/system.conf",
            format!(
                "# RAUC's system configuration of the factory image.\n\
                 [system]\ncompatible={compatible}\nbootloader=uboot\ndata-directory=/data/rauc\n\n\
                 [keyring]\npath=/etc/rauc/keyring.pem\n\n\
                 [slot.rootfs.0]\ndevice=/dev/vda{a}\ntype=ext4\nbootname={n0}\n\n\
                 [slot.rootfs.1]\ndevice=/dev/vda{b}\ntype=ext4\nbootname={n1}\n",
                compatible = m.compatible(),
                a = disk::SLOT_A.number,
                b = disk::SLOT_B.number,
                n0 = RAUC_BOOTNAMES[0],
                n1 = RAUC_BOOTNAMES[1],
            ),
        )],
        Predecessor::MenderGrub => vec![
            (
                "etc/mender/mender.conf",
                format!(
                    "{{\n  \"RootfsPartA\": \"/dev/vda{a}\",\n  \"RootfsPartB\": \"/dev/vda{b}\",\n  \
                     \"ServerURL\": \"https://mender.example.com\"\n}}\n",
                    a = disk::SLOT_A.number,
                    b = disk::SLOT_B.number,
                ),
            ),
            (
                "etc/mender/artifact_info",
                "artifact_name=11.0\n".to_string(),
            ),
            (
                "var/lib/mender/device_type",
                format!("device_type={}\n", m.compatible()),
            ),
        ],
    }
}

/// The `[bootloader]` section of the guest's configuration.
fn bootloader_section(m: &Machine) -> String {
    match m.loader {
        Loader::Grub => "kind = \"grub\"\ngrubenv = \"/boot/grub/grubenv\"\n".to_string(),
        // The lock file on the tmpfs: the slot root is read-only.
        Loader::UBoot => format!(
            "kind = \"uboot\"\nfw_env_config = \"{FW_ENV_CONFIG}\"\nlock_file = \"/run/fw_printenv.lock\"\n"
        ),
    }
}

/// libubootenv's configuration for the pair on the FAT partition mounted
/// at `dir`.
pub fn fw_env_config(dir: &str) -> String {
    format!(
        "# The redundant environment pair on the FAT boot partition.\n\
         {dir}/{} 0x0 {size:#x}\n{dir}/{} 0x0 {size:#x}\n",
        disk::UBOOT_ENV_FILES[0],
        disk::UBOOT_ENV_FILES[1],
        size = disk::UBOOT_ENV_SIZE
    )
}

/// The `[server]` section every guest's configuration starts with: the
/// host's nginx through QEMU's user network, polled every few seconds.
pub fn server_section(s: &Settings) -> String {
    format!(
        r#"[server]
manifest_url = "{manifest}"
report_url = "{report}"
ca_file = "/etc/updraft/ca.pem"
system_roots = false
poll_interval = "4s"
poll_jitter = "1s"
retry_max = "10s"
"#,
        manifest = s.manifest_url,
        report = s.report_url,
    )
}

fn config(s: &Settings, m: &Machine) -> String {
    format!(
        r#"# updraft in the VM: polls the host's nginx through QEMU's user network.
{server}
[device]
compatible = "{compatible}"

[trust]
keys = ["/etc/updraft/release.pub"]

[slots]
a = "/dev/vda{a}"
b = "/dev/vda{b}"

[bootloader]
{bootloader}
[health]
checks_dir = "/etc/updraft/health.d"
timeout = "60s"

[system]
reboot_command = ["reboot", "-f"]
state_dir = "/data/updraft"
{extra}"#,
        extra = s.extra,
        server = server_section(s),
        a = disk::SLOT_A.number,
        b = disk::SLOT_B.number,
        compatible = m.compatible(),
        bootloader = bootloader_section(m),
    )
}

fn health_check(r: &Release) -> String {
    match r.behaviour {
        Behaviour::FailsHealthCheck => format!(
            "#!/bin/sh\necho \"release {} does not start its application (on purpose)\"\nexit 1\n",
            r.version
        ),
        Behaviour::Healthy | Behaviour::CannotBoot | Behaviour::Hangs => "#!/bin/sh\n\
             # Healthy when the data partition is mounted and the network is up.\n\
             grep -q ' /data ' /proc/mounts || { echo '/data is not mounted'; exit 1; }\n\
             ip route | grep -q '^default' || { echo 'no default route'; exit 1; }\n"
            .to_string(),
    }
}

/// The initramfs: drivers, then the partition `root=PARTUUID=<disk>-<NN>`
/// (GRUB's fragment) or `root=/dev/vdaN` (U-Boot's script) names, mounted
/// read-only and switched into.
const INITRAMFS_INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /lib/modules/order); do
    insmod /lib/modules/$m || echo "updraft-vm: initramfs: insmod $m failed"
done
root=
dev=
for a in $(cat /proc/cmdline); do
    case "$a" in
        root=PARTUUID=*) root=${a#root=PARTUUID=} ;;
        root=/dev/*) dev=${a#root=} ;;
    esac
done
if [ -z "$dev" ]; then
    part=${root##*-}
    dev=/dev/vda$((0x${part:-0}))
fi
n=0
while [ ! -b "$dev" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
if ! mount -t ext4 -o ro "$dev" /newroot; then
    echo "updraft-vm: initramfs: cannot mount $dev (root=PARTUUID=$root); rebooting"
    sleep 2
    reboot -f
fi
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
"#;

/// A slot's init: the hardware watchdog armed and fed every second (busybox
/// `watchdog`, as systemd's `RuntimeWatchdogSec=` would) and its line, what
/// the boot does before systemd would start updraft, then the daemon
/// (restarted when it fails, as `Restart=on-failure` does), a status line
/// whenever the status changes, and the harness's commands read from the
/// console.
fn slot_init(r: &Release, m: &Machine) -> String {
    let broken = match r.behaviour {
        Behaviour::CannotBoot => {
            "echo \"updraft-vm: release $version cannot boot: init exits\"\nexit 1\n".to_string()
        }
        Behaviour::Hangs => format!(
            "echo \"updraft-vm: release $version {HANG_MARK}\"\n\
             kill -STOP $(pidof watchdog)\n\
             sleep 100000\n"
        ),
        Behaviour::Healthy | Behaviour::FailsHealthCheck => String::new(),
    };
    format!(
        r#"#!/bin/sh
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs tmpfs /tmp
version=$(cat /etc/updraft-vm-version)
slot=none
rootslot=
for a in $(cat /proc/cmdline); do
    case "$a" in
        updraft.slot=*) slot=${{a#updraft.slot=}} ;;
        rauc.slot={n0}) slot=A ;;
        rauc.slot={n1}) slot=B ;;
        root=/dev/vda{part_a}) rootslot=A ;;
        root=/dev/vda{part_b}) rootslot=B ;;
    esac
done
# Another updater's script names the root partition only.
[ "$slot" = none ] && [ -n "$rootslot" ] && slot=$rootslot
echo "{USERSPACE_MARK} slot=$slot version=$version uptime=$(cut -d' ' -f1 /proc/uptime) boot_id=$(cat /proc/sys/kernel/random/boot_id)"
watchdog -F -t 1 -T {WATCHDOG_SECONDS} /dev/watchdog &
n=0
while [ "$(cat /sys/class/watchdog/watchdog0/state 2>/dev/null)" != active ] && [ $n -lt 50 ]; do
    sleep 0.1
    n=$((n + 1))
done
{watchdog_line}
{broken}mount -t ext4 /dev/vda{data} /data || echo "updraft-vm: cannot mount the data partition"
mount -t {boot_fs} /dev/vda{boot} /boot || echo "updraft-vm: cannot mount the boot partition"
{lock}
# A factory image that ran another updater adopts the device on its first
# boot, into a configuration on the data partition every release uses.
cfg=/etc/updraft/updraft.toml
if [ -f /etc/updraft-vm-adopt ] && [ ! -f {adopted} ]; then
    mkdir -p /data/updraft
    cp $cfg /data/updraft/adopting.toml
    if updraft --config /data/updraft/adopting.toml adopt --from "$(cat /etc/updraft-vm-adopt)" >/tmp/adopt.log 2>&1; then
        mv /data/updraft/adopting.toml {adopted}
        sync
    fi
    sed 's/^/{ADOPT_MARK}/' /tmp/adopt.log
fi
[ -f {adopted} ] && cfg={adopted}
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2
(
    while :; do
        UPDRAFT_LOG=info updraft --config "$cfg" daemon
        echo "updraft-vm: updraft daemon exited with status $?; restarting in 5 s"
        sleep 5
    done
) &
daemon=$!
(
    last=
    while :; do
        sleep 2
        s=$(updraft --config "$cfg" status --json 2>&1 | tr -d '\n')
        if [ "$s" != "$last" ]; then
            echo "{STATUS_MARK}$s"
            last=$s
        fi
{app_lines}    done
) &
status=$!
stop() {{
    kill $status $daemon 2>/dev/null
    killall updraft 2>/dev/null
    n=0
    while pidof updraft >/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
    sync
    umount /data
    umount /boot
}}
while read -r cmd; do
    case "$cmd" in
        vm-poweroff) stop; echo "{HALT_MARK}"; poweroff -f ;;
        vm-reboot) stop; echo "updraft-vm: rebooting"; reboot -f ;;
    esac
done
sleep 100000
"#,
        data = disk::DATA.number,
        boot = disk::BOOT.number,
        adopted = ADOPTED_CONFIG,
        part_a = disk::SLOT_A.number,
        part_b = disk::SLOT_B.number,
        n0 = RAUC_BOOTNAMES[0],
        n1 = RAUC_BOOTNAMES[1],
        watchdog_line = watchdog_line_script(),
        app_lines = if r.app { app::STATUS_LINES } else { "" },
        boot_fs = match m.loader {
            Loader::Grub => "ext4",
            Loader::UBoot => "vfat",
        },
        // libubootenv's lock file, which the tmpfiles.d entry would create.
        lock = match m.loader {
            Loader::Grub => "",
            Loader::UBoot => "touch /run/fw_printenv.lock && chmod 0600 /run/fw_printenv.lock",
        },
    )
}

fn mkdir(p: &Path) -> Result {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = to.parent() {
        mkdir(parent)?;
    }
    std::fs::copy(from, to)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("setting the mode of {}: {e}", to.display()))
}

fn write(p: &Path, text: &str, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = p.parent() {
        mkdir(parent)?;
    }
    std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("setting the mode of {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_come_from_their_paths() {
        assert_eq!(
            module_name("kernel/drivers/virtio/virtio_pci.ko"),
            "virtio_pci"
        );
        assert_eq!(
            module_name("kernel/drivers/net/net-failover.ko.xz"),
            "net_failover"
        );
    }

    #[test]
    fn watchdog_lines_give_their_fields() {
        let l = WatchdogLine::parse(&format!(
            "{WATCHDOG_MARK}device=/dev/watchdog0 state=active timeout=20 bootstatus=32 identity=i6300ESB timer"
        ));
        assert_eq!(
            l,
            Some(WatchdogLine {
                state: "active".into(),
                timeout: Some(20),
                bootstatus: Some(32),
                identity: "i6300ESB timer".into(),
            })
        );
        // No watchdog: the attributes are empty.
        let none = WatchdogLine::parse(&format!(
            "{WATCHDOG_MARK}device=/dev/watchdog0 state= timeout= bootstatus= identity="
        ))
        .unwrap();
        assert_eq!((none.timeout, none.identity.as_str()), (None, ""));
        assert_eq!(WatchdogLine::parse("updraft-vm: userspace slot=A"), None);
        assert!(watchdog_line_script().contains(&format!("echo \"{WATCHDOG_MARK}device=")));
    }

    #[test]
    fn depends_come_out_of_the_modinfo_section() {
        let ko = b"\x7fELF...\0license=GPL\0depends=virtio,virtio_ring\0intree=Y\0";
        assert_eq!(modinfo_depends(ko), "virtio,virtio_ring");
        assert_eq!(modinfo_depends(b"\0depends=\0name=x\0"), "");
        assert_eq!(modinfo_depends(b"no modinfo"), "");
    }

    #[test]
    fn modules_come_after_the_modules_they_depend_on() {
        let dir = std::env::temp_dir().join(format!("updraft-vm-modules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let modules = [
            ("kernel/drivers/virtio/virtio_ring.ko", ""),
            ("kernel/drivers/virtio/virtio.ko", "virtio_ring"),
            ("kernel/drivers/block/virtio_blk.ko", "virtio,virtio_ring"),
            ("kernel/drivers/watchdog/watchdog.ko", ""),
            ("kernel/drivers/watchdog/i6300esb.ko", "watchdog"),
            ("kernel/fs/unused.ko", ""),
        ];
        let mut order = String::new();
        for (rel, deps) in modules {
            let f = dir.join(rel);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, format!("\x7fELF\0depends={deps}\0name=x\0")).unwrap();
            order.push_str(&format!("{rel}\n"));
        }
        std::fs::write(dir.join("modules.order"), order).unwrap();
        let kernel = Kernel {
            version: "6.1.0-57-amd64".into(),
            image: dir.join("vmlinuz"),
            modules: dir.clone(),
            wanted: vec!["virtio_blk", "i6300esb"],
        };
        let names: Vec<String> = kernel
            .module_files()
            .unwrap()
            .iter()
            .map(|p| module_name(&p.to_string_lossy()))
            .collect();
        assert_eq!(
            names,
            [
                "virtio_ring",
                "virtio",
                "virtio_blk",
                "watchdog",
                "i6300esb"
            ]
        );
        let missing = Kernel {
            wanted: vec!["softdog"],
            ..kernel
        };
        let e = missing.module_files().unwrap_err();
        assert!(e.contains("has no module softdog"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn readelf_output_gives_the_interpreter_and_needed_libraries() {
        let text = "      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]\n\
                    \x20 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]\n\
                    \x20 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n";
        let (interp, needed) = parse_readelf(text);
        assert_eq!(interp, Some(PathBuf::from("/lib/ld-linux-aarch64.so.1")));
        assert_eq!(needed, vec!["libgcc_s.so.1", "libc.so.6"]);
    }

    #[test]
    fn ldd_output_gives_the_loader_and_libraries() {
        // What shared_libraries parses, on a fixed text.
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }
}
