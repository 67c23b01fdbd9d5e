//! What runs inside the VM: a busybox initramfs that loads the virtio
//! drivers of the host's Debian cloud kernel and `switch_root`s into the
//! slot the boot script named, and the slot root file systems: busybox,
//! the updraft binary cargo built (with the glibc libraries `ldd` lists),
//! the kernel in `/boot`, updraft's configuration, the release's health
//! check, and an init script that does what a real system does before the
//! systemd unit starts `updraft daemon` (mounts, network), then starts it.
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

use super::disk;
use crate::util::{self, Result};

/// The line GRUB prints before it runs the shipped fragment.
pub const GRUB_MARK: &str = "updraft-vm: grub";
/// The first line of a slot's userspace; followed by `slot=X version=V`.
pub const USERSPACE_MARK: &str = "updraft-vm: userspace";
/// A status line: followed by `updraft status --json` on one line.
pub const STATUS_MARK: &str = "updraft-vm: status ";
/// Printed right before a clean power-off.
pub const HALT_MARK: &str = "updraft-vm: halting";
/// The `compatible` of the VM's releases.
pub const COMPATIBLE: &str = "updraft-vm-x86_64";

/// Kernel modules the initramfs loads, with their dependencies (from
/// `modules.dep`): the virtio disk and network on the PCI transport, and
/// the software watchdog (the cloud kernel has no driver for QEMU's
/// emulated watchdog devices).
const MODULES: &[&str] = &["virtio_pci", "virtio_blk", "virtio_net", "softdog"];

/// The watchdog the slot's init arms, as systemd's `RuntimeWatchdogSec`
/// would: fed every second, it resets the machine after this many seconds
/// without a feed.
pub const WATCHDOG_SECONDS: u32 = 20;

/// What a release does when it boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Comes up, and its health check passes.
    Healthy,
    /// Comes up, and its health check fails.
    FailsHealthCheck,
    /// Its init exits at once: the kernel panics and reboots (`panic=`).
    CannotBoot,
    /// Its init hangs before the services start: the watchdog is no
    /// longer fed and resets the machine.
    Hangs,
}

/// One slot image's contents.
#[derive(Clone, Debug)]
pub struct Release {
    pub version: String,
    pub behaviour: Behaviour,
}

/// What every slot image configures updraft with.
pub struct Settings {
    pub manifest_url: String,
    pub report_url: String,
    /// PEM of the CA the update server's certificate is issued by.
    pub ca_file: PathBuf,
    /// The release signing key's public half.
    pub release_key: PathBuf,
}

/// The installed Debian kernel.
pub struct Kernel {
    pub version: String,
    pub image: PathBuf,
    modules: PathBuf,
}

impl Kernel {
    /// The newest `/boot/vmlinuz-*-cloud-amd64` with its modules.
    pub fn find() -> Result<Kernel> {
        let entries = std::fs::read_dir("/boot").map_err(|e| format!("listing /boot: {e}"))?;
        let mut versions: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix("vmlinuz-"))
                    .filter(|v| v.ends_with("-cloud-amd64"))
                    .map(str::to_string)
            })
            .filter(|v| {
                Path::new("/lib/modules")
                    .join(v)
                    .join("modules.dep")
                    .is_file()
            })
            .collect();
        versions.sort_by_key(|v| natural(v));
        let version = versions.pop().ok_or(
            "no /boot/vmlinuz-*-cloud-amd64 with its /lib/modules: install linux-image-cloud-amd64",
        )?;
        Ok(Kernel {
            image: PathBuf::from(format!("/boot/vmlinuz-{version}")),
            modules: Path::new("/lib/modules").join(&version),
            version,
        })
    }

    /// The module files for [`MODULES`], dependencies first.
    fn module_files(&self) -> Result<Vec<PathBuf>> {
        let dep_file = self.modules.join("modules.dep");
        let text = std::fs::read_to_string(&dep_file)
            .map_err(|e| format!("reading {}: {e}", dep_file.display()))?;
        let deps: BTreeMap<&str, Vec<&str>> = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(m, d)| (m.trim(), d.split_whitespace().collect()))
            .collect();
        let by_name = |name: &str| {
            deps.keys()
                .copied()
                .find(|p| module_name(p) == name)
                .ok_or_else(|| {
                    format!(
                        "kernel {} has no module {name} (in {})",
                        self.version,
                        dep_file.display()
                    )
                })
        };
        fn visit<'a>(m: &'a str, deps: &BTreeMap<&'a str, Vec<&'a str>>, out: &mut Vec<&'a str>) {
            if out.contains(&m) {
                return;
            }
            for d in deps.get(m).into_iter().flatten().rev() {
                visit(d, deps, out);
            }
            out.push(m);
        }
        let mut order = Vec::new();
        for name in MODULES {
            visit(by_name(name)?, &deps, &mut order);
        }
        order
            .into_iter()
            .map(|rel| {
                if !rel.ends_with(".ko") {
                    return Err(format!(
                        "kernel module {rel} is compressed; the VM's initramfs loads plain .ko files"
                    ));
                }
                Ok(self.modules.join(rel))
            })
            .collect()
    }
}

fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split('.').next().unwrap_or(file);
    stem.replace('-', "_")
}

/// `6.1.0-57-cloud-amd64` → comparable number runs.
fn natural(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The host files every guest image is made from.
pub struct Guest {
    pub kernel: Kernel,
    busybox: PathBuf,
    applets: Vec<String>,
    /// The updraft binary without its debug information.
    updraft: PathBuf,
    /// The loader and libraries the binary needs, at their host paths.
    libs: Vec<PathBuf>,
}

impl Guest {
    /// Collect the kernel, busybox and updraft (`updraft_bin`, stripped
    /// into `work`).
    pub fn prepare(updraft_bin: &Path, work: &Path) -> Result<Guest> {
        let kernel = Kernel::find()?;
        let busybox = PathBuf::from("/bin/busybox");
        let list = util::output(Command::new(&busybox).arg("--list"))
            .map_err(|e| format!("{e} (Debian package busybox-static)"))?;
        let applets = list
            .lines()
            .map(str::trim)
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .map(str::to_string)
            .collect();
        let updraft = work.join("updraft");
        util::output(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(&updraft)
                .arg(updraft_bin),
        )
        .map_err(|e| format!("{e} (Debian package binutils)"))?;
        let libs = shared_libraries(&updraft)?;
        Ok(Guest {
            kernel,
            busybox,
            applets,
            updraft,
            libs,
        })
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
        for lib in &self.libs {
            let rel = lib.strip_prefix("/").unwrap_or(lib);
            copy(lib, &root.join(rel), 0o755)?;
        }
        copy(&self.kernel.image, &root.join("boot/vmlinuz"), 0o644)?;
        copy(&settings.ca_file, &root.join("etc/updraft/ca.pem"), 0o644)?;
        copy(
            &settings.release_key,
            &root.join("etc/updraft/release.pub"),
            0o644,
        )?;
        write(
            &root.join("etc/updraft/updraft.toml"),
            &config(settings),
            0o644,
        )?;
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
        write(&root.join("sbin/init"), &slot_init(release), 0o755)?;
        // With a journal, as a Yocto ext4 image has: mounted read-only,
        // its page cache differs from the medium (the kernel changes the
        // journal superblock in memory), and a delta must still apply
        // from it.
        disk::mkfs(&root, out, disk::SLOT_A.size_mib, "rootfs")?;
        let _ = std::fs::remove_dir_all(&root);
        Ok(())
    }
}

/// The loader and libraries `ldd` lists for `binary`.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
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
    Ok(libs)
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

fn config(s: &Settings) -> String {
    format!(
        r#"# updraft in the VM: polls the host's nginx through QEMU's user network.
[server]
manifest_url = "{manifest}"
report_url = "{report}"
ca_file = "/etc/updraft/ca.pem"
system_roots = false
poll_interval = "4s"
poll_jitter = "1s"
retry_max = "10s"

[device]
compatible = "{COMPATIBLE}"

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
timeout = "60s"

[system]
reboot_command = ["reboot", "-f"]
state_dir = "/data/updraft"
"#,
        manifest = s.manifest_url,
        report = s.report_url,
        a = disk::SLOT_A.number,
        b = disk::SLOT_B.number,
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
/// names, mounted read-only and switched into.
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
for a in $(cat /proc/cmdline); do
    case "$a" in root=PARTUUID=*) root=${a#root=PARTUUID=} ;; esac
done
part=${root##*-}
dev=/dev/vda$((0x${part:-0}))
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

/// A slot's init: what the boot does before systemd would start updraft,
/// then the daemon (restarted when it fails, as `Restart=on-failure`
/// does), a status line whenever the status changes, and the harness's
/// commands read from the console.
fn slot_init(r: &Release) -> String {
    let broken = match r.behaviour {
        Behaviour::CannotBoot => {
            "echo \"updraft-vm: release $version cannot boot: init exits\"\nexit 1\n"
        }
        Behaviour::Hangs => {
            "echo \"updraft-vm: release $version hangs: the watchdog is no longer fed\"\n\
             kill -STOP $(pidof watchdog)\n\
             sleep 100000\n"
        }
        Behaviour::Healthy | Behaviour::FailsHealthCheck => "",
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
for a in $(cat /proc/cmdline); do
    case "$a" in updraft.slot=*) slot=${{a#updraft.slot=}} ;; esac
done
echo "{USERSPACE_MARK} slot=$slot version=$version uptime=$(cut -d' ' -f1 /proc/uptime) boot_id=$(cat /proc/sys/kernel/random/boot_id)"
watchdog -t 1 -T {WATCHDOG_SECONDS} /dev/watchdog || echo "updraft-vm: no watchdog"
{broken}mount -t ext4 /dev/vda{data} /data || echo "updraft-vm: cannot mount the data partition"
mount -t ext4 /dev/vda{boot} /boot || echo "updraft-vm: cannot mount the boot partition"
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2
(
    while :; do
        UPDRAFT_LOG=info updraft daemon
        echo "updraft-vm: updraft daemon exited with status $?; restarting in 5 s"
        sleep 5
    done
) &
daemon=$!
(
    last=
    while :; do
        sleep 2
        s=$(updraft status --json 2>&1 | tr -d '\n')
        if [ "$s" != "$last" ]; then
            echo "{STATUS_MARK}$s"
            last=$s
        fi
    done
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
    fn kernel_versions_sort_by_their_numbers() {
        let mut v = [
            "6.1.0-9-cloud-amd64",
            "6.1.0-57-cloud-amd64",
            "6.1.0-10-cloud-amd64",
        ];
        v.sort_by_key(|v| natural(v));
        assert_eq!(v.last(), Some(&"6.1.0-57-cloud-amd64"));
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
