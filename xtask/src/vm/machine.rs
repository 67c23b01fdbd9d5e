//! The machines `vm-test` builds, as values: what differs between the
//! x86_64 machine (SeaBIOS, GRUB, an ext4 boot partition) and the aarch64
//! one (`-M virt`, Debian's U-Boot, a FAT boot partition) is said here once,
//! and the disk, guest, console and scenario code reads it from a
//! [`Machine`] instead of copying itself per architecture.
//!
//! This module owns that description: the QEMU command line, the firmware,
//! the Debian kernel and packages, the kernel modules, the emulated
//! hardware watchdog, the console device, the bootloader and how many tries
//! it gives a trial. It must never run anything itself.

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

/// The emulated hardware watchdog a machine has, as QEMU and Linux name it.
pub struct Watchdog {
    /// QEMU's device (`-device`); an expiry resets the machine
    /// (`-action watchdog=reset`).
    pub qemu_device: &'static str,
    /// The Linux module driving it (with its dependencies, the watchdog
    /// core), loaded by the initramfs.
    pub module: &'static str,
    /// What the driver calls it in `/sys/class/watchdog/watchdog0/identity`.
    pub identity: &'static str,
}

/// QEMU's Intel 6300ESB, a PCI device: on the x86_64 machine's PCI bus and
/// on the PCIe host bridge of `-M virt` alike. Its Linux driver reports a
/// reset it caused in the next boot's `bootstatus` (`WDIOF_CARDRESET`),
/// read from the flag QEMU keeps across the reset.
pub const I6300ESB: Watchdog = Watchdog {
    qemu_device: "i6300esb",
    module: "i6300esb",
    identity: "i6300ESB timer",
};

/// `WDIOF_CARDRESET` in a watchdog's `bootstatus`: the last reset was the
/// watchdog's (`linux/watchdog.h`).
pub const WDIOF_CARDRESET: u32 = 0x20;

/// One full-system machine.
pub struct Machine {
    /// `x86_64` or `aarch64`: the command-line name and the work directory.
    pub name: &'static str,
    pub loader: Loader,
    /// The QEMU binary and the Debian package holding it.
    pub qemu: &'static str,
    pub qemu_package: &'static str,
    /// Debian's name for the architecture.
    pub debian_arch: &'static str,
    /// The Debian kernel flavour the machine boots: the newest
    /// `linux-image-<ver>-<flavour>` that `linux-image-<flavour>` depends
    /// on, fetched and unpacked under `target/vm-debs/` (never installed).
    pub kernel_flavour: &'static str,
    /// The hardware watchdog the slot's init (or systemd) arms.
    pub watchdog: Watchdog,
    /// The serial console as Linux names it.
    pub console: &'static str,
    /// Kernel modules the initramfs loads (with their dependencies), besides
    /// the watchdog's.
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
    // The generic kernel: the cloud one has no driver for any watchdog
    // QEMU emulates (`CONFIG_I6300ESB_WDT`, `CONFIG_IB700_WDT` and
    // `CONFIG_ITCO_WDT` are not set, and QEMU gives no ACPI WDAT table).
    kernel_flavour: "amd64",
    watchdog: I6300ESB,
    console: "ttyS0",
    // The virtio disk and network on the PCI transport, and ext4 with the
    // CRC32C its checksums need (ext4's `softdep`, which insmod does not
    // follow; QEMU's default CPU has no SSE 4.2 for crc32c-intel): the
    // generic kernel builds them all as modules.
    modules: &[
        "virtio_pci",
        "virtio_blk",
        "virtio_net",
        "crc32c_generic",
        "ext4",
    ],
    packages: &[
        ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
        ("grub-pc-bin", "/usr/lib/grub/i386-pc/boot.img"),
        ("grub-common", "/usr/bin/grub-editenv"),
        // Its applet list names the links of the guest's busybox (the
        // same Debian package, fetched with the kernel).
        ("busybox-static", "/bin/busybox"),
        // Scenario 11's TPM, and defining its NV counter from the host.
        ("swtpm", "/usr/bin/swtpm"),
        ("tpm2-tools", "/usr/bin/tpm2_nvdefine"),
    ],
};

pub const AARCH64: Machine = Machine {
    name: "aarch64",
    loader: Loader::UBoot,
    qemu: "qemu-system-aarch64",
    qemu_package: "qemu-system-arm",
    debian_arch: "arm64",
    // The generic kernel: the cloud one has no `i6300esb` driver, and the
    // watchdog it has a driver for (`sbsa_gwdt`) is not one `-M virt`
    // offers (QEMU builds it into `-M sbsa-ref` only).
    kernel_flavour: "arm64",
    watchdog: I6300ESB,
    console: "ttyAMA0",
    // The generic arm64 kernel builds the MMIO transport, the virtio core,
    // ext4, vfat and its code pages as modules (the PL011 console and the
    // PCIe host bridge the watchdog sits on are built in): the disk and
    // network on MMIO, ext4 with its CRC32C, the FAT boot partition the
    // environment pair lives on.
    modules: &[
        "virtio_mmio",
        "virtio_blk",
        "virtio_net",
        "crc32c_generic",
        "ext4",
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

    /// The modules the initramfs loads: the machine's and its watchdog's.
    pub fn initramfs_modules(&self) -> Vec<&'static str> {
        let mut m = self.modules.to_vec();
        m.push(self.watchdog.module);
        m
    }

    /// QEMU's arguments for `disk` (and, for U-Boot, the flash image
    /// holding its environment, `flash`): TCG, one CPU, the disk on virtio,
    /// user networking, the hardware watchdog resetting the machine when it
    /// expires, the serial console on stdio.
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
        // `-action watchdog=` replaces `-watchdog-action` (QEMU 6.0 on).
        push("-device");
        push(self.watchdog.qemu_device);
        push("-action");
        push("watchdog=reset");
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

    /// `m`'s QEMU command line for a disk `/d.img` and a flash `/f.img`.
    fn command_line(m: &Machine) -> String {
        m.qemu_args(Path::new("/d.img"), Path::new("/f.img"))
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn the_aarch64_machine_puts_its_disk_on_the_mmio_transport() {
        let line = command_line(&AARCH64);
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
        let x86 = command_line(&X86_64);
        assert!(!x86.contains("pflash"), "{x86}");
    }

    #[test]
    fn both_machines_reset_through_the_emulated_6300esb() {
        for m in MACHINES {
            let line = command_line(m);
            assert!(
                line.contains("-device i6300esb -action watchdog=reset"),
                "{line}"
            );
            assert_eq!(m.initramfs_modules().last(), Some(&"i6300esb"));
        }
    }
}
