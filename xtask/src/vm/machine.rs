//! The machines `vm-test` builds, as values: what differs between the
//! x86_64 machine (SeaBIOS, GRUB, an ext4 boot partition) and the aarch64
//! one (`-M virt`, Debian's U-Boot, a FAT boot partition) is said here once,
//! and the disk, guest, console and scenario code reads it from a
//! [`Machine`] instead of copying itself per architecture.
//!
//! This module owns that description: the QEMU command line, the firmware,
//! the Debian kernel and packages, the kernel modules, the console device,
//! the bootloader and how many tries it gives a trial. It must never run
//! anything itself.

use std::ffi::OsString;
use std::path::Path;

/// The bootloader a machine boots with, and so the A/B environment the
/// scenarios read back from its disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loader {
    /// GRUB with the shipped `grub.cfg.in` and a `grubenv` block on an
    /// ext4 boot partition.
    Grub,
    /// U-Boot with the shipped `boot.cmd.in` and its FAT-file environment
    /// hooks: the pair `uboot.env` / `uboot-redund.env` on a FAT boot
    /// partition.
    UBoot,
}

/// One full-system machine.
pub struct Machine {
    /// `x86_64` or `aarch64`: the command-line name and the work directory.
    pub name: &'static str,
    pub loader: Loader,
    /// The QEMU binary and the Debian package holding it.
    pub qemu: &'static str,
    pub qemu_package: &'static str,
    /// Debian's name for the architecture (`linux-image-*-cloud-<arch>`).
    pub debian_arch: &'static str,
    /// The serial console as Linux names it.
    pub console: &'static str,
    /// Kernel modules the initramfs loads (with their dependencies).
    pub modules: &'static [&'static str],
    /// Debian packages this machine needs besides the common ones, each
    /// with a file that shows it is there.
    pub packages: &'static [(&'static str, &'static str)],
}

pub const X86_64: Machine = Machine {
    name: "x86_64",
    loader: Loader::Grub,
    qemu: "qemu-system-x86_64",
    qemu_package: "qemu-system-x86",
    debian_arch: "amd64",
    console: "ttyS0",
    // The virtio disk and network on the PCI transport, and the software
    // watchdog (the cloud kernel has no driver for QEMU's emulated
    // watchdog devices).
    modules: &["virtio_pci", "virtio_blk", "virtio_net", "softdog"],
    packages: &[
        ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
        ("grub-pc-bin", "/usr/lib/grub/i386-pc/boot.img"),
        ("grub-common", "/usr/bin/grub-editenv"),
        ("linux-image-cloud-amd64", ""),
        ("busybox-static", "/bin/busybox"),
    ],
};

pub const AARCH64: Machine = Machine {
    name: "aarch64",
    loader: Loader::UBoot,
    qemu: "qemu-system-aarch64",
    qemu_package: "qemu-system-arm",
    debian_arch: "arm64",
    console: "ttyAMA0",
    // The arm64 cloud kernel builds the MMIO transport, the virtio core,
    // vfat and its code pages as modules (ext4 and the PL011 console are
    // built in): the disk and network on MMIO, the FAT boot partition the
    // environment pair lives on, and the software watchdog.
    modules: &[
        "virtio_mmio",
        "virtio_blk",
        "virtio_net",
        "softdog",
        "vfat",
        "nls_cp437",
        "nls_ascii",
    ],
    packages: &[
        ("qemu-system-arm", "/usr/bin/qemu-system-aarch64"),
        ("u-boot-qemu", UBOOT_BIN),
        ("u-boot-tools", "/usr/bin/mkimage"),
        ("dosfstools", "/usr/sbin/mkfs.vfat"),
        ("mtools", "/usr/bin/mcopy"),
        ("libubootenv-tool", "/usr/bin/fw_printenv"),
        // Its applet list names the links of the arm64 busybox (the same
        // Debian package).
        ("busybox-static", "/bin/busybox"),
    ],
};

pub const MACHINES: [&Machine; 2] = [&X86_64, &AARCH64];

/// Debian's U-Boot for QEMU's arm64 `virt` machine.
pub const UBOOT_BIN: &str = "/usr/lib/u-boot/qemu_arm64/u-boot.bin";

/// The size of a pflash image of QEMU's `virt` machine (each of its two
/// flash banks is 64 MiB).
pub const FLASH_BYTES: u64 = 64 * 1024 * 1024;

impl Machine {
    /// The machine `name` names.
    pub fn by_name(name: &str) -> Option<&'static Machine> {
        MACHINES.into_iter().find(|m| m.name == name)
    }

    /// The `compatible` of this machine's releases.
    pub fn compatible(&self) -> String {
        format!("updraft-vm-{}", self.name)
    }

    /// Boots a trial release gets before the bootloader falls back, as
    /// updraft's backend counts them (`Bootloader::trial_tries`): GRUB's
    /// script gives one, the U-Boot script the configured tries (3).
    pub fn trial_tries(&self) -> u32 {
        match self.loader {
            Loader::Grub => 1,
            Loader::UBoot => 3,
        }
    }

    /// The kernel command line's console.
    pub fn console_arg(&self) -> String {
        format!("console={},115200", self.console)
    }

    /// QEMU's arguments for `disk` (and, for U-Boot, the flash image
    /// holding its environment, `flash`): TCG, one CPU, the disk on virtio,
    /// user networking, the serial console on stdio.
    pub fn qemu_args(&self, disk: &Path, flash: &Path) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &str| a.push(s.into());
        match self.loader {
            Loader::Grub => {
                for s in ["-accel", "tcg", "-m", "512", "-smp", "1"] {
                    push(s);
                }
            }
            Loader::UBoot => {
                for s in [
                    "-M",
                    "virt",
                    "-cpu",
                    "cortex-a57",
                    "-accel",
                    "tcg",
                    "-m",
                    "512",
                    "-smp",
                    "1",
                    "-bios",
                    UBOOT_BIN,
                ] {
                    push(s);
                }
            }
        }
        for s in ["-display", "none", "-monitor", "none", "-serial", "stdio"] {
            push(s);
        }
        match self.loader {
            Loader::Grub => {
                push("-drive");
                push(&format!(
                    "file={},format=raw,if=virtio,cache=writeback",
                    disk.display()
                ));
                push("-nic");
                push("user,model=virtio-net-pci");
            }
            Loader::UBoot => {
                push("-drive");
                push(&format!(
                    "if=pflash,unit=1,format=raw,file={}",
                    flash.display()
                ));
                push("-drive");
                push(&format!(
                    "file={},format=raw,if=none,id=disk,cache=writeback",
                    disk.display()
                ));
                push("-device");
                push("virtio-blk-device,drive=disk");
                push("-netdev");
                push("user,id=net");
                push("-device");
                push("virtio-net-device,netdev=net");
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_are_found_by_name() {
        assert_eq!(
            Machine::by_name("aarch64").map(|m| m.loader),
            Some(Loader::UBoot)
        );
        assert_eq!(Machine::by_name("x86_64").map(|m| m.console), Some("ttyS0"));
        assert!(Machine::by_name("armv7").is_none());
    }

    #[test]
    fn the_aarch64_machine_puts_its_disk_on_the_mmio_transport() {
        let args: Vec<String> = AARCH64
            .qemu_args(Path::new("/d.img"), Path::new("/f.img"))
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        let line = args.join(" ");
        assert!(
            line.contains("-M virt -cpu cortex-a57 -accel tcg"),
            "{line}"
        );
        assert!(
            line.contains("-device virtio-blk-device,drive=disk"),
            "{line}"
        );
        assert!(
            line.contains("if=pflash,unit=1,format=raw,file=/f.img"),
            "{line}"
        );
        let x86 = X86_64
            .qemu_args(Path::new("/d.img"), Path::new("/f.img"))
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(!x86.contains("pflash"), "{x86}");
    }
}
