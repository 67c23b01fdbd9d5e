//! The VM's disk image, made from directories and files with the ordinary
//! tools and no loop device or mount: `mkfs.ext4 -d` fills each file
//! system from a directory (`mkfs.vfat` and `mcopy` the FAT boot partition
//! of a U-Boot machine), `sfdisk` writes the MBR partition table into the
//! image file, `dd conv=notrunc` puts each file system at its offset, and
//! on a GRUB machine GRUB's `boot.img` (first 440 bytes) and a
//! `grub-mkimage` core image (from sector 1) make it bootable by SeaBIOS.
//! A U-Boot machine also gets its flash environment image (`mkenvimage`).
//! Results are read back by cutting a partition out with `dd` and asking
//! `debugfs` (ext4) or `mcopy` (FAT).
//!
//! This module owns the partition layout ([`PARTS`]), the GRUB core image
//! and the environment images. It must never mount anything, never touch
//! a block device of the host, and never decide what a scenario asserts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::machine::{FLASH_BYTES, Loader, Machine};
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

/// Boot (GRUB's configuration and environment, or U-Boot's `boot.scr` and
/// the environment pair; the initramfs).
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

/// The U-Boot environment pair on the FAT boot partition, as updraft's
/// `fw_env.config` and the boot script's hooks name it, and each copy's
/// size.
pub const UBOOT_ENV_FILES: [&str; 2] = ["uboot.env", "uboot-redund.env"];
pub const UBOOT_ENV_SIZE: usize = 0x4000;

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

/// A FAT boot partition image of `size_mib` holding the files of `dir`
/// (flat), made with `mkfs.vfat` and `mcopy`.
pub fn mkfat(dir: &Path, image: &Path, size_mib: u64, label: &str) -> Result {
    let _ = std::fs::remove_file(image);
    util::output(
        Command::new(tool("mkfs.vfat"))
            .args(["-n", label, "-C"])
            .arg(image)
            .arg((size_mib * 1024).to_string()),
    )
    .map_err(|e| format!("{e} (Debian package dosfstools)"))?;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("listing {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    files.sort();
    let mut c = Command::new(tool("mcopy"));
    c.arg("-i").arg(image).args(&files).arg("::/");
    util::output(&mut c)
        .map(drop)
        .map_err(|e| format!("{e} (Debian package mtools)"))
}

/// Put the four file system images together into a disk `machine` boots.
pub fn assemble(machine: &Machine, disk: &Path, work: &Path, images: [&Path; 4]) -> Result {
    assemble_parts(machine, disk, work, PARTS, images)
}

/// [`assemble`] with another layout of the same four partitions (a guest
/// whose slots need more room); the boot partition stays [`BOOT`], where
/// the boot loader looks for its files.
pub fn assemble_parts(
    machine: &Machine,
    disk: &Path,
    work: &Path,
    parts: [Part; 4],
    images: [&Path; 4],
) -> Result {
    let _ = std::fs::remove_file(disk);
    let f = std::fs::File::create(disk).map_err(|e| format!("creating {}: {e}", disk.display()))?;
    let end_mib = parts
        .iter()
        .map(|p| p.start_mib + p.size_mib)
        .max()
        .unwrap_or(0);
    f.set_len(end_mib * MIB)
        .map_err(|e| format!("sizing {}: {e}", disk.display()))?;
    drop(f);
    let mut table = format!("label: dos\nlabel-id: 0x{DISK_ID:08x}\nunit: sectors\n\n");
    for p in parts {
        // FAT32 (LBA) for a U-Boot machine's boot partition.
        let kind = if p.number == BOOT.number && machine.loader == Loader::UBoot {
            "c"
        } else {
            "83"
        };
        table.push_str(&format!(
            "start={}, size={}, type={kind}{}\n",
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
    for (p, image) in parts.iter().zip(images) {
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
    match machine.loader {
        Loader::Grub => install_grub(disk, work),
        Loader::UBoot => Ok(()),
    }
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

/// The U-Boot environment pair on the FAT boot partition, read the way
/// updraft and U-Boot's script read it: both files copied out with
/// `mcopy`, then `fw_printenv -c` (libubootenv) over them.
pub fn uboot_env(disk: &Path, work: &Path) -> Result<BTreeMap<String, String>> {
    let image = work.join(format!("part{}.img", BOOT.number));
    extract(disk, BOOT, &image)?;
    let dir = work.join("uboot-env.read");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut config = String::new();
    for name in UBOOT_ENV_FILES {
        let out = dir.join(name);
        let copied = util::output(
            Command::new(tool("mcopy"))
                .arg("-i")
                .arg(&image)
                .arg(format!("::/{name}"))
                .arg(&out),
        );
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&image);
            return Err(format!("copying {name} out of the boot partition: {e}"));
        }
        config.push_str(&format!("{} 0x0 {UBOOT_ENV_SIZE:#x}\n", out.display()));
    }
    let _ = std::fs::remove_file(&image);
    let config_path = dir.join("fw_env.config");
    std::fs::write(&config_path, config)
        .map_err(|e| format!("writing {}: {e}", config_path.display()))?;
    let listing = util::output(
        Command::new(tool("fw_printenv"))
            .arg("-c")
            .arg(&config_path)
            .env("LC_ALL", "C"),
    )
    .map_err(|e| format!("{e} (Debian package libubootenv-tool)"))?;
    Ok(listing
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// The U-Boot environment copy `flags` and `vars`, as libubootenv lays out
/// a redundant copy: CRC-32 (little-endian) over the data, the flags byte,
/// the data (`name=value` entries, each ending in NUL, then NUL padding).
pub fn uboot_env_copy(vars: &[(&str, &str)], flags: u8) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    for (k, v) in vars {
        data.extend_from_slice(format!("{k}={v}").as_bytes());
        data.push(0);
    }
    data.push(0);
    if data.len() > UBOOT_ENV_SIZE - 5 {
        return Err(format!(
            "{vars:?} do not fit a {UBOOT_ENV_SIZE:#x}-byte environment"
        ));
    }
    data.resize(UBOOT_ENV_SIZE - 5, 0);
    let mut copy = crc32(&data).to_le_bytes().to_vec();
    copy.push(flags);
    copy.extend_from_slice(&data);
    Ok(copy)
}

/// zlib's CRC-32, as U-Boot and libubootenv check an environment copy.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// U-Boot's own environment in the `virt` machine's second flash bank:
/// `vars` as `mkenvimage -s 0x40000` writes them (CRC, data), in a file
/// the size of the bank.
pub fn make_flash_env(path: &Path, work: &Path, vars: &[(&str, &str)]) -> Result {
    let text: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let txt = work.join("flash-env.txt");
    std::fs::write(&txt, text).map_err(|e| format!("writing {}: {e}", txt.display()))?;
    let img = work.join("flash-env.img");
    util::output(
        Command::new(tool("mkenvimage"))
            .args(["-s", "0x40000", "-o"])
            .arg(&img)
            .arg(&txt),
    )
    .map_err(|e| format!("{e} (Debian package u-boot-tools)"))?;
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    f.set_len(FLASH_BYTES)
        .map_err(|e| format!("sizing {}: {e}", path.display()))?;
    drop(f);
    write_at(path, &img, 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_copy_is_laid_out_as_libubootenv_reads_it() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        let copy = uboot_env_copy(&[("BOOT_ORDER", "A B")], 7).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(copy.len(), UBOOT_ENV_SIZE);
        assert_eq!(copy[4], 7);
        assert!(copy[5..].starts_with(b"BOOT_ORDER=A B\0\0"));
        let crc = u32::from_le_bytes([copy[0], copy[1], copy[2], copy[3]]);
        assert_eq!(crc, crc32(&copy[5..]));
    }
}
