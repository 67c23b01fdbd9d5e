//! A Raspberry Pi's boot firmware (Pi 4/5, CM4/CM5), simulated from its
//! documented contract, for the `rpi-tryboot` bootloader. There is no Pi
//! here: this is a test double of the firmware, never of updraft.
//!
//! What it implements, from the Raspberry Pi documentation ("autoboot.txt",
//! "Fail-safe OS updates (tryboot)", the `reboot` argument and the
//! `chosen/bootloader` device-tree node):
//!
//! - The boot disk's partition 1 is FAT and holds `autoboot.txt`; the
//!   firmware reads at most its first 512 bytes. `[all]` lines apply to
//!   every boot, `[tryboot]` lines only when the tryboot flag is set,
//!   `[none]` lines to none; lines before a filter are `[all]`'s; a later
//!   setting wins. `boot_partition=N` picks the partition, `tryboot_a_b=1`
//!   makes a trial load `config.txt` instead of `tryboot.txt`.
//! - The flag is one-shot: `reboot "0 tryboot"` sets it for the next boot
//!   (`reboot N` boots partition N once); any boot clears it.
//! - A partition is bootable when it is FAT and holds `config.txt` (Pi 5).
//!   A boot that fails (nothing bootable, or a kernel that does not come
//!   up: [`PiFirmware::fail_kernel`]) ends in the watchdog's reset: the
//!   next boot is an ordinary one.
//! - The booted kernel gets the partition's `cmdline.txt` and the device
//!   tree's `chosen/bootloader/partition` and `.../tryboot`, each a 32-bit
//!   big-endian cell.
//!
//! The partitions are FAT images made by `mkfs.vfat`, written by updraft
//! through `fusefat` and read here by mtools, the firmware's stand-in for a
//! FAT reader of its own. The parser below is this module's own reading of
//! the documentation, written apart from updraft's.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use updraft::slot::SlotName;

use crate::device::{BootSpec, Device};
use crate::fat::FatPartition;

/// The slots' boot partitions: A on 2, B on 3 (as the Raspberry Pi
/// documentation's example).
pub const BOOT_A: u32 = 2;
pub const BOOT_B: u32 = 3;

/// What one power-on did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Boot {
    /// The partition the kernel came from.
    pub partition: u32,
    /// The boot was a trial (the tryboot flag was set).
    pub tryboot: bool,
    /// The slot that partition belongs to.
    pub slot: SlotName,
    /// Boots that failed first (each ended by the watchdog).
    pub failed: Vec<u32>,
}

/// The firmware and the boot disk's FAT partitions of one device.
pub struct PiFirmware {
    /// Partition 1: `autoboot.txt`.
    pub autoboot: FatPartition,
    /// Partitions 2 and 3: slot A's and slot B's boot files.
    pub boot_a: FatPartition,
    pub boot_b: FatPartition,
    device_tree: PathBuf,
    /// Partitions whose kernel does not come up.
    failing: BTreeSet<u32>,
}

impl PiFirmware {
    /// Give `dev` a Pi's boot disk: `autoboot.txt` as given, slot A's and
    /// slot B's boot partitions each with a `config.txt` and a
    /// `cmdline.txt` naming the slot's root partition; configure it for
    /// `rpi-tryboot` with a reboot command that records its argument, and
    /// power it on.
    pub fn install(dev: &mut Device, autoboot: &str) -> PiFirmware {
        let part = |n: u32| {
            let dir = dev.path(&format!("mmcblk0p{n}"));
            std::fs::create_dir_all(&dir).expect("partition directory");
            FatPartition::new(&dir, 33)
        };
        let fw = PiFirmware {
            autoboot: part(1),
            boot_a: part(BOOT_A),
            boot_b: part(BOOT_B),
            device_tree: dev.path("device-tree/chosen/bootloader"),
            failing: BTreeSet::new(),
        };
        std::fs::write(fw.autoboot.mount.join("autoboot.txt"), autoboot).expect("autoboot.txt");
        for (p, slot) in [(&fw.boot_a, SlotName::A), (&fw.boot_b, SlotName::B)] {
            std::fs::write(
                p.mount.join("config.txt"),
                "[all]\narm_64bit=1\nkernel=kernel_2712.img\n",
            )
            .expect("config.txt");
            std::fs::write(
                p.mount.join("cmdline.txt"),
                format!(
                    "console=serial0,115200 root={} rootwait updraft.slot={slot}\n",
                    match slot {
                        SlotName::A => dev.slot_a.display(),
                        SlotName::B => dev.slot_b.display(),
                    }
                ),
            )
            .expect("cmdline.txt");
        }
        std::fs::create_dir_all(&fw.device_tree).expect("device tree");
        let lines = format!(
            "kind = \"rpi-tryboot\"\nautoboot = {:?}\ndevice_tree = {:?}\n",
            fw.autoboot.mount.join("autoboot.txt"),
            fw.device_tree
        );
        let reboot = dev.recording_reboot_command();
        dev.reconfigure(|s| {
            s.boot = BootSpec::Custom(lines);
            s.reboot_command = Some(reboot);
        });
        let mut fw = fw;
        let first = fw.power_on(dev);
        assert_eq!(first.slot, SlotName::A, "{first:?}");
        fw
    }

    /// The kernel of `partition` no longer comes up (a boot that hangs
    /// until the watchdog resets the board).
    pub fn fail_kernel(&mut self, partition: u32) {
        self.failing.insert(partition);
    }

    /// `autoboot.txt` as the firmware reads it from partition 1's image.
    pub fn autoboot_text(&mut self) -> String {
        String::from_utf8_lossy(&self.autoboot.read_image("/autoboot.txt")).into_owned()
    }

    /// Which partition an ordinary boot and a trial boot take now.
    pub fn selection(&mut self) -> (u32, u32) {
        let text = self.autoboot_text();
        let ordinary = read_autoboot(text.as_bytes(), false)
            .unwrap_or_else(|| panic!("the firmware cannot boot from autoboot.txt: {text:?}"));
        let trial = read_autoboot(text.as_bytes(), true)
            .unwrap_or_else(|| panic!("the firmware cannot try from autoboot.txt: {text:?}"));
        (ordinary.0, trial.0)
    }

    /// Power the board on (after the reboot the device asked for, or a
    /// power cut): choose the partition as the firmware does, give the
    /// kernel its command line and device tree, and start the device's
    /// next boot. Panics when no partition boots at all.
    pub fn power_on(&mut self, dev: &mut Device) -> Boot {
        dev.stop_daemon();
        // The reboot argument: "0 tryboot" sets the one-shot flag; a
        // partition number boots that partition once.
        let (mut once, mut tryboot) = match dev.reboot_arguments() {
            Some(arg) => parse_reboot_argument(&arg),
            None => (0, false),
        };
        let text = self.autoboot.read_image("/autoboot.txt");
        let mut failed = Vec::new();
        loop {
            let (from_file, a_b) = read_autoboot(&text, tryboot).unwrap_or_else(|| {
                panic!(
                    "autoboot.txt does not name a boot partition: {:?}",
                    String::from_utf8_lossy(&text)
                )
            });
            let partition = if once != 0 { once } else { from_file };
            let config = if tryboot && !a_b {
                "tryboot.txt"
            } else {
                "config.txt"
            };
            match self.load(partition, config, tryboot) {
                Some(cmdline) if !self.failing.contains(&partition) => {
                    self.write_device_tree(partition, tryboot);
                    dev.power_on(&cmdline);
                    return Boot {
                        partition,
                        tryboot,
                        slot: slot_of(partition).unwrap_or_else(|| {
                            panic!("booted partition {partition}, which is no slot's")
                        }),
                        failed,
                    };
                }
                _ => {
                    // The watchdog resets the board; the flag and a
                    // one-time partition are gone.
                    failed.push(partition);
                    assert!(
                        once != 0 || tryboot,
                        "an ordinary boot of partition {partition} fails: the board is bricked (failed boots {failed:?})"
                    );
                    (once, tryboot) = (0, false);
                }
            }
        }
    }

    /// The command line a bootable `partition` gives its kernel, `None`
    /// when it is not bootable (no FAT image or no `config`) or has no
    /// command line file.
    fn load(&mut self, partition: u32, config: &str, tryboot: bool) -> Option<String> {
        let p = match partition {
            BOOT_A => &mut self.boot_a,
            BOOT_B => &mut self.boot_b,
            _ => return None,
        };
        let config = p.try_read_image(&format!("/{config}"))?;
        let file = cmdline_file(&String::from_utf8_lossy(&config), partition, tryboot);
        let cmdline = p.try_read_image(&format!("/{file}"))?;
        Some(String::from_utf8_lossy(&cmdline).into_owned())
    }

    fn write_device_tree(&self, partition: u32, tryboot: bool) {
        std::fs::write(self.device_tree.join("partition"), partition.to_be_bytes())
            .expect("device tree partition");
        std::fs::write(
            self.device_tree.join("tryboot"),
            u32::from(tryboot).to_be_bytes(),
        )
        .expect("device tree tryboot");
    }

    /// The device-tree node the kernel sees.
    pub fn device_tree(&self) -> &Path {
        &self.device_tree
    }
}

/// The slot whose boot partition `p` is.
pub fn slot_of(p: u32) -> Option<SlotName> {
    match p {
        BOOT_A => Some(SlotName::A),
        BOOT_B => Some(SlotName::B),
        _ => None,
    }
}

/// The command line file `config.txt` names for a boot of `partition`:
/// `cmdline=FILE` under the filters that apply (`[all]`, `[none]`,
/// `[tryboot]`, `[boot_partition=N]`; others skipped), `cmdline.txt` when
/// none does.
fn cmdline_file(config: &str, partition: u32, tryboot: bool) -> String {
    let mut applies = true;
    let mut file = "cmdline.txt".to_string();
    for line in config.lines().map(str::trim) {
        if let Some(filter) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            applies = match filter {
                "all" => true,
                "tryboot" => tryboot,
                f => {
                    f.strip_prefix("boot_partition=")
                        .and_then(|n| n.parse::<u32>().ok())
                        == Some(partition)
                }
            };
        } else if let Some(v) = line.strip_prefix("cmdline=") {
            if applies {
                file = v.to_string();
            }
        }
    }
    file
}

/// `reboot`'s argument: "[PARTITION] [tryboot]".
fn parse_reboot_argument(arg: &str) -> (u32, bool) {
    let mut words = arg.split_whitespace();
    let partition = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let tryboot = words.any(|w| w == "tryboot");
    (partition, tryboot)
}

/// The partition and `tryboot_a_b` a boot reads from `autoboot.txt`, with
/// or without the tryboot flag; `None` when the file names no partition.
/// Lines the firmware does not know are skipped, as it skips them.
pub fn read_autoboot(bytes: &[u8], tryboot: bool) -> Option<(u32, bool)> {
    let head = &bytes[..bytes.len().min(512)];
    let text = String::from_utf8_lossy(head);
    let mut applies = true;
    let mut partition = None;
    let mut a_b = false;
    for line in text.lines().map(str::trim) {
        match line {
            "[all]" => applies = true,
            "[tryboot]" => applies = tryboot,
            "[none]" => applies = false,
            l if l.starts_with('[') => applies = false,
            // No spaces around '=': "boot_partition = 2" is no setting.
            l if applies => match l.split_once('=') {
                Some(("boot_partition", v)) => partition = v.parse().ok(),
                Some(("tryboot_a_b", v)) => a_b = v == "1",
                _ => {}
            },
            _ => {}
        }
    }
    partition.filter(|p| *p != 0).map(|p| (p, a_b))
}
