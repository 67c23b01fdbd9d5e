//! The VM's disk image, made from directories and files with the ordinary
//! tools and no loop device or mount: `mkfs.ext4 -d` fills each file
//! system from a directory, `sfdisk` writes the MBR partition table into
//! the image file, `dd conv=notrunc` puts each file system at its offset,
//! and GRUB's `boot.img` (first 440 bytes) and a `grub-mkimage` core image
//! (from sector 1) make it bootable by SeaBIOS. Results are read back by
//! cutting a partition out with `dd` and asking `debugfs`.
//!
//! This module owns the partition layout ([`PARTS`]) and the GRUB core
//! image. It must never mount anything, never touch a block device of the
//! host, and never decide what a scenario asserts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Result};

const MIB: u64 = 1024 * 1024;

/// The MBR disk signature; with the partition number it makes the
/// partitions' `PARTUUID`s (`75706466-02` is slot A).
pub const DISK_ID: u32 = 0x7570_6466;

/// A primary partition of the VM disk.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    /// 1-based partition number: `/dev/vdaN`, GRUB's `(hd0,msdosN)`.
    pub number: u8,
    pub name: &'static str,
    pub start_mib: u64,
    pub size_mib: u64,
}

impl Part {
    /// The `PARTUUID` Linux gives this partition of an MBR disk.
    pub fn partuuid(&self) -> String {
        format!("{DISK_ID:08x}-{:02x}", self.number)
    }

    pub fn bytes(&self) -> u64 {
        self.size_mib * MIB
    }
}

/// Boot (GRUB's configuration and environment, the initramfs).
pub const BOOT: Part = Part {
    number: 1,
    name: "boot",
    start_mib: 1,
    size_mib: 16,
};
/// Root file system slot A (with its kernel in `/boot`).
pub const SLOT_A: Part = Part {
    number: 2,
    name: "rootfs A",
    start_mib: 17,
    size_mib: 64,
};
/// Root file system slot B.
pub const SLOT_B: Part = Part {
    number: 3,
    name: "rootfs B",
    start_mib: 81,
    size_mib: 64,
};
/// Data, shared by both slots: updraft's `state_dir`.
pub const DATA: Part = Part {
    number: 4,
    name: "data",
    start_mib: 145,
    size_mib: 32,
};
pub const PARTS: [Part; 4] = [BOOT, SLOT_A, SLOT_B, DATA];
const DISK_MIB: u64 = 177;

/// GRUB modules in the core image: the disk and file system, the script
/// the shipped fragment needs, and the serial console.
const GRUB_MODULES: &[&str] = &[
    "biosdisk",
    "part_msdos",
    "ext2",
    "normal",
    "configfile",
    "serial",
    "terminal",
    "loadenv",
    "test",
    "echo",
    "linux16",
    "halt",
    "reboot",
];
const GRUB_PC_DIR: &str = "/usr/lib/grub/i386-pc";

/// `mkfs.ext4` a file system image of `size_mib` from the contents of
/// `dir`, with a journal, as a device's would have: power cuts must find
/// every partition consistent after the journal is replayed (a journal-less
/// boot partition cut during a `grubenv` write was left with a free-block
/// count of 2 and refused every later write with ENOSPC). `debugfs`, which
/// replays no journal, reads a partition only after the guest unmounted it
/// cleanly.
pub fn mkfs(dir: &Path, image: &Path, size_mib: u64, label: &str) -> Result {
    let _ = std::fs::remove_file(image);
    let mut c = Command::new(tool("mkfs.ext4"));
    c.args(["-q", "-F", "-L", label, "-E", "root_owner=0:0"]);
    c.arg("-d")
        .arg(dir)
        .arg(image)
        .arg(format!("{}k", size_mib * 1024));
    util::output(&mut c).map(drop)
}

/// Put the four file system images together into a bootable disk.
pub fn assemble(disk: &Path, work: &Path, images: [&Path; 4]) -> Result {
    let _ = std::fs::remove_file(disk);
    let f = std::fs::File::create(disk).map_err(|e| format!("creating {}: {e}", disk.display()))?;
    f.set_len(DISK_MIB * MIB)
        .map_err(|e| format!("sizing {}: {e}", disk.display()))?;
    drop(f);
    let mut table = format!("label: dos\nlabel-id: 0x{DISK_ID:08x}\nunit: sectors\n\n");
    for p in PARTS {
        table.push_str(&format!(
            "start={}, size={}, type=83{}\n",
            p.start_mib * MIB / 512,
            p.bytes() / 512,
            if p.number == BOOT.number {
                ", bootable"
            } else {
                ""
            }
        ));
    }
    let script = work.join("sfdisk.txt");
    std::fs::write(&script, &table).map_err(|e| format!("writing {}: {e}", script.display()))?;
    let stdin =
        std::fs::File::open(&script).map_err(|e| format!("opening {}: {e}", script.display()))?;
    util::output(
        Command::new(tool("sfdisk"))
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(disk)
            .stdin(stdin),
    )
    .map_err(|e| format!("partitioning {}: {e}", disk.display()))?;
    for (p, image) in PARTS.iter().zip(images) {
        let len = std::fs::metadata(image)
            .map_err(|e| format!("{}: {e}", image.display()))?
            .len();
        if len > p.bytes() {
            return Err(format!(
                "{} is {len} bytes, more than partition {} ({}) holds",
                image.display(),
                p.number,
                p.name
            ));
        }
        write_at(disk, image, p.start_mib * MIB)?;
    }
    install_grub(disk, work)
}

/// GRUB for BIOS without `grub-install` (which wants a block device):
/// `boot.img`'s code in the MBR, the core image from sector 1, before the
/// first partition.
fn install_grub(disk: &Path, work: &Path) -> Result {
    let core = work.join("core.img");
    util::output(
        Command::new(tool("grub-mkimage"))
            .args(["-O", "i386-pc", "-p", "(hd0,msdos1)/grub", "-o"])
            .arg(&core)
            .args(GRUB_MODULES),
    )?;
    let size = std::fs::metadata(&core)
        .map_err(|e| format!("{}: {e}", core.display()))?
        .len();
    if size + 512 > BOOT.start_mib * MIB {
        return Err(format!(
            "the GRUB core image is {size} bytes and does not fit before the first partition"
        ));
    }
    let boot_img = Path::new(GRUB_PC_DIR).join("boot.img");
    let code = std::fs::read(&boot_img).map_err(|e| {
        format!(
            "reading {}: {e} (Debian package grub-pc-bin)",
            boot_img.display()
        )
    })?;
    if code.len() < 440 {
        return Err(format!("{} is shorter than 440 bytes", boot_img.display()));
    }
    let mbr_code = work.join("boot-code.img");
    std::fs::write(&mbr_code, &code[..440])
        .map_err(|e| format!("writing {}: {e}", mbr_code.display()))?;
    write_at(disk, &mbr_code, 0)?;
    write_at(disk, &core, 512)
}

/// `dd` `file` into `disk` at byte `offset`, leaving the rest as it is.
fn write_at(disk: &Path, file: &Path, offset: u64) -> Result {
    util::output(
        Command::new("dd")
            .arg(format!("if={}", file.display()))
            .arg(format!("of={}", disk.display()))
            .args(["bs=512", "conv=notrunc,sparse", "status=none"])
            .arg(format!("seek={}", offset / 512)),
    )
    .map(drop)
}

/// Copy partition `p` of `disk` out into `out`.
pub fn extract(disk: &Path, p: Part, out: &Path) -> Result {
    util::output(
        Command::new("dd")
            .arg(format!("if={}", disk.display()))
            .arg(format!("of={}", out.display()))
            .args(["bs=1M", "status=none", "conv=sparse"])
            .arg(format!("skip={}", p.start_mib))
            .arg(format!("count={}", p.size_mib)),
    )
    .map(drop)
}

/// A file's contents in partition `p` of `disk`, read with `debugfs`.
pub fn read_file(disk: &Path, p: Part, path: &str, work: &Path) -> Result<Vec<u8>> {
    let image = work.join(format!("part{}.img", p.number));
    extract(disk, p, &image)?;
    let out = Command::new(tool("debugfs"))
        .arg("-R")
        .arg(format!("cat {path}"))
        .arg(&image)
        .output()
        .map_err(|e| format!("starting debugfs: {e}"))?;
    let _ = std::fs::remove_file(&image);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // debugfs exits 0 when the file is missing; the error is on stderr.
    if !out.status.success() || stderr.lines().any(|l| l.contains(path)) {
        return Err(format!(
            "reading {path} from partition {} ({}) of {}: {}",
            p.number,
            p.name,
            disk.display(),
            stderr.trim()
        ));
    }
    Ok(out.stdout)
}

/// Copy directory `path` of partition `p` into `dest` (which must exist),
/// with `debugfs rdump`.
pub fn dump_dir(disk: &Path, p: Part, path: &str, dest: &Path, work: &Path) -> Result {
    let image = work.join(format!("part{}.img", p.number));
    extract(disk, p, &image)?;
    let out = util::output(
        Command::new(tool("debugfs"))
            .arg("-R")
            .arg(format!("rdump {path} {}", dest.display()))
            .arg(&image),
    );
    let _ = std::fs::remove_file(&image);
    out.map(drop)
        .map_err(|e| format!("copying {path} out of partition {}: {e}", p.number))
}

/// The GRUB environment block on the boot partition, as `grub-editenv
/// list` reads it.
pub fn grubenv(disk: &Path, work: &Path) -> Result<BTreeMap<String, String>> {
    let block = read_file(disk, BOOT, "/grub/grubenv", work)?;
    let file = work.join("grubenv.read");
    std::fs::write(&file, block).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let listing = util::output(Command::new(tool("grub-editenv")).arg(&file).arg("list"))?;
    Ok(listing
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Write a fresh GRUB environment block with `vars` to `path`.
pub fn make_grubenv(path: &Path, vars: &[(&str, &str)]) -> Result {
    let _ = std::fs::remove_file(path);
    let editenv = tool("grub-editenv");
    util::output(Command::new(&editenv).arg(path).arg("create"))?;
    let mut c = Command::new(&editenv);
    c.arg(path).arg("set");
    for (k, v) in vars {
        c.arg(format!("{k}={v}"));
    }
    util::output(&mut c).map(drop)
}

/// A tool's path: on `PATH`, else in `/usr/sbin` or `/sbin` (where Debian
/// puts `sfdisk`, `mkfs.ext4` and `debugfs`, not on a user's `PATH`).
pub fn tool(name: &str) -> PathBuf {
    if util::have(name) {
        return PathBuf::from(name);
    }
    for dir in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(name)
}
