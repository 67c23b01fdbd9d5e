//! The `uboot` backend: the U-Boot environment, read and written natively.
//!
//! This module owns the on-medium format of the U-Boot environment, as
//! U-Boot's `saveenv` and libubootenv's `fw_printenv`/`fw_setenv` (0.3.x,
//! Debian's `libubootenv-tool`) read and write it, and the `fw_env.config`
//! file that says where it lives:
//!
//! * A copy is `envsize` bytes at `offset` of a device (a regular file such
//!   as a Raspberry Pi's `uboot.env` on FAT, a block device, an eMMC boot
//!   partition): a little-endian CRC-32 (zlib's) of the data area, then, for
//!   a redundant pair only, one flags byte, then the data area: entries
//!   `name=value`, each ending in NUL, the list ending in an empty entry.
//! * One `fw_env.config` line describes a single copy; two lines describe a
//!   redundant pair. When both copies have a valid CRC the newer one by
//!   flags wins, with the counter wrapping 255→0 exactly as libubootenv
//!   decides ([`select_copy`]); a copy with a bad CRC is ignored. A write
//!   goes to the other copy with the flags of the current one plus one
//!   (wrapping), so a power cut during the write leaves the current copy
//!   valid and selected.
//! * Every access holds libubootenv's lock, `flock(LOCK_EX)` on
//!   [`DEFAULT_LOCK_FILE`], so `fw_setenv` and updraft never interleave.
//! * Writes to an eMMC boot partition (`/dev/mmcblkXbootY`) clear
//!   `/sys/block/mmcblkXbootY/force_ro` for the write and restore it after.
//!
//! It must never write an environment it could not read: when no copy has a
//! valid CRC it refuses and reports, and it never writes a fresh or default
//! environment. It never reorders, rewrites or drops variables it does not
//! own, never writes the copy it read the current state from, and never
//! touches MTD or UBI devices (they need erase handling it does not have).
//!
//! The boot model lives in `BOOT_ORDER` ("A B"), `BOOT_A_LEFT` and
//! `BOOT_B_LEFT`, the variables of the RAUC-style boot script shown in
//! `docs/bootloaders.md`. A variable that is missing or empty reads as the
//! shipped `boot.cmd.in` initialises it (`A`, 3, 0: slot B of a new device
//! is empty), because that is what the script will do.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{BootState, Bootloader, SlotBoot, model};
use crate::error::{Context, Error, Kind, Result};
use crate::slot::SlotName;
use crate::{bail, err};

/// The lock libubootenv takes around every access to the environment.
/// libubootenv's `src/uboot_env.c` (`default_lockname`, `libuboot_lock`)
/// opens this path with `O_WRONLY | O_CREAT | O_TRUNC`, mode 0666, and
/// holds `flock(fd, LOCK_EX)` on it; the string is the same in the Debian
/// bookworm build (libubootenv 0.3.2).
pub const DEFAULT_LOCK_FILE: &str = "/var/lock/fw_printenv.lock";

/// How long updraft waits for another holder of the lock (libubootenv
/// waits forever; updraft's waits are bounded) before failing as busy.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest environment copy accepted. Real environments are 8 KiB to
/// 1 MiB; the bound keeps a typo in `fw_env.config` from allocating
/// without limit.
pub const MAX_ENV_SIZE: usize = 16 * 1024 * 1024;

/// Smallest environment copy accepted (header plus a few bytes of data).
pub const MIN_ENV_SIZE: usize = 16;

/// Largest `fw_env.config` read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// Attempts a missing or empty `BOOT_x_LEFT` stands for: the default of the
/// RAUC-style boot script.
pub const DEFAULT_LEFT: u32 = 3;

/// The boot script decrements `BOOT_x_LEFT` with `setexpr`, which reads and
/// writes hexadecimal, and compares it with `test -gt`, which reads decimal;
/// the two agree only on single digits.
pub const MAX_TRIES: u32 = 9;

const VAR_ORDER: &str = "BOOT_ORDER";

fn left_var(slot: SlotName) -> &'static str {
    match slot {
        SlotName::A => "BOOT_A_LEFT",
        SlotName::B => "BOOT_B_LEFT",
    }
}

// ---------------------------------------------------------------------------
// CRC-32 (the zlib / IEEE 802.3 polynomial, reflected), as U-Boot stores it.

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static CRC_TABLE: [u32; 256] = crc_table();

/// CRC-32 of `data` as zlib's `crc32(0, data, len)` computes it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

// ---------------------------------------------------------------------------
// The variable list.

/// The variables of one environment copy, kept as the bytes of its data
/// area (`name=value\0` entries, in order, without the terminating empty
/// entry), so everything updraft does not change is written back byte for
/// byte. Entries without `=` are kept but are not variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// Entries, each followed by NUL; empty when there are none.
    data: Vec<u8>,
}

fn entry_name(entry: &[u8]) -> Option<&[u8]> {
    entry.iter().position(|&b| b == b'=').map(|i| &entry[..i])
}

impl Environment {
    /// An environment without variables.
    pub fn new() -> Environment {
        Environment::default()
    }

    /// The raw entries in order (`name=value`, without the NUL).
    pub fn entries(&self) -> impl Iterator<Item = &[u8]> {
        let body = self.data.strip_suffix(&[0]).unwrap_or(&[]);
        body.split(|&b| b == 0).filter(|e| !e.is_empty())
    }

    /// The value of `name`. Should the name appear more than once, the last
    /// one counts, as in U-Boot and libubootenv.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.entries()
            .filter(|e| entry_name(e) == Some(name.as_bytes()))
            .last()
            .map(|e| &e[name.len() + 1..])
    }

    /// Set `name` to `value`: in place where it exists (later duplicates are
    /// dropped), appended otherwise. Names must be non-empty without `=` or
    /// NUL; values must not contain NUL.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            bail!(Bootloader, "{name:?} is not a valid U-Boot variable name");
        }
        if value.contains('\0') {
            bail!(Bootloader, "the value for {name} contains a NUL byte");
        }
        let mut new_entry = Vec::with_capacity(name.len() + value.len() + 1);
        new_entry.extend_from_slice(name.as_bytes());
        new_entry.push(b'=');
        new_entry.extend_from_slice(value.as_bytes());
        let mut out = Vec::with_capacity(self.data.len() + new_entry.len() + 1);
        let mut placed = false;
        for e in self.entries() {
            if entry_name(e) == Some(name.as_bytes()) {
                if placed {
                    continue;
                }
                out.extend_from_slice(&new_entry);
                placed = true;
            } else {
                out.extend_from_slice(e);
            }
            out.push(0);
        }
        if !placed {
            out.extend_from_slice(&new_entry);
            out.push(0);
        }
        self.data = out;
        Ok(())
    }

    /// Remove every entry named `name`.
    pub fn remove(&mut self, name: &str) {
        let mut out = Vec::with_capacity(self.data.len());
        for e in self.entries() {
            if entry_name(e) != Some(name.as_bytes()) {
                out.extend_from_slice(e);
                out.push(0);
            }
        }
        self.data = out;
    }

    /// Bytes the list needs in a data area, the end marker included.
    pub fn encoded_len(&self) -> usize {
        self.data.len() + 1
    }
}

/// Parse a data area (what follows the CRC and flags). The list ends at the
/// first empty entry, or exactly at the end of the area after a NUL; an
/// entry that runs off the end without its NUL is refused.
pub fn parse_env_data(data: &[u8]) -> Result<Environment> {
    let mut pos = 0;
    while pos < data.len() && data[pos] != 0 {
        let Some(len) = data[pos..].iter().position(|&b| b == 0) else {
            bail!(
                Malformed,
                "the entry at data offset {pos:#x} has no terminating NUL within the {} bytes of the data area",
                data.len()
            );
        };
        pos += len + 1;
    }
    Ok(Environment {
        data: data[..pos].to_vec(),
    })
}

/// The data area of `data_size` bytes holding `env`: the entries, the end
/// marker, and zeros after it (as U-Boot's `saveenv` fills it).
pub fn serialize_env_data(env: &Environment, data_size: usize) -> Result<Vec<u8>> {
    if env.encoded_len() > data_size {
        bail!(
            Bootloader,
            "the environment needs {} bytes but a copy holds only {data_size} bytes of data",
            env.encoded_len()
        );
    }
    let mut out = Vec::with_capacity(data_size);
    out.extend_from_slice(&env.data);
    out.resize(data_size, 0);
    Ok(out)
}

/// Bytes before the data area: the CRC, and the flags byte when redundant.
pub fn header_len(redundant: bool) -> usize {
    if redundant { 5 } else { 4 }
}

/// One copy as found on the medium.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodedCopy<'a> {
    pub stored_crc: u32,
    pub computed_crc: u32,
    /// The flags byte of a redundant copy.
    pub flags: Option<u8>,
    pub data: &'a [u8],
}

impl DecodedCopy<'_> {
    pub fn crc_ok(&self) -> bool {
        self.stored_crc == self.computed_crc
    }
}

/// Split a copy into header and data and check its CRC (not the entries).
pub fn decode_copy(image: &[u8], redundant: bool) -> Result<DecodedCopy<'_>> {
    let h = header_len(redundant);
    if image.len() <= h {
        bail!(
            Malformed,
            "an environment copy of {} bytes has no room for data",
            image.len()
        );
    }
    let stored_crc = u32::from_le_bytes([image[0], image[1], image[2], image[3]]);
    let data = &image[h..];
    Ok(DecodedCopy {
        stored_crc,
        computed_crc: crc32(data),
        flags: redundant.then_some(image[4]),
        data,
    })
}

/// A whole copy of `env_size` bytes: CRC, flags when `flags` is given (a
/// redundant copy), data area.
pub fn encode_copy(env: &Environment, env_size: usize, flags: Option<u8>) -> Result<Vec<u8>> {
    let h = header_len(flags.is_some());
    if env_size <= h {
        bail!(
            Bootloader,
            "an environment of {env_size} bytes has no room for data"
        );
    }
    let data = serialize_env_data(env, env_size - h)?;
    let mut out = Vec::with_capacity(env_size);
    out.extend_from_slice(&crc32(&data).to_le_bytes());
    if let Some(f) = flags {
        out.push(f);
    }
    out.extend_from_slice(&data);
    Ok(out)
}

/// Decode a whole copy: CRC checked, entries parsed.
pub fn parse_image(image: &[u8], redundant: bool) -> Result<Environment> {
    let c = decode_copy(image, redundant)?;
    if !c.crc_ok() {
        bail!(
            Malformed,
            "CRC mismatch (stored {:#010x}, computed {:#010x})",
            c.stored_crc,
            c.computed_crc
        );
    }
    parse_env_data(c.data)
}

/// Which copy of a redundant pair is current, given which have a valid CRC
/// and their flags bytes, exactly as libubootenv's `libuboot_load` decides
/// for incremental flags (files, block devices): the only valid one; of two
/// valid ones the one with the higher flags, except that 0 beats 255 (the
/// counter wrapped); equal flags select copy 0. `None` when neither is valid.
pub fn select_copy(valid: [bool; 2], flags: [u8; 2]) -> Option<usize> {
    match valid {
        [false, false] => None,
        [true, false] => Some(0),
        [false, true] => Some(1),
        [true, true] => Some(match flags {
            [0xff, 0] => 1,
            [0, 0xff] => 0,
            [f0, f1] if f1 > f0 => 1,
            _ => 0,
        }),
    }
}

// ---------------------------------------------------------------------------
// fw_env.config

/// Where one copy of the environment lives (one `fw_env.config` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvLocation {
    pub device: PathBuf,
    /// Byte offset; negative counts back from the end of a block device.
    pub offset: i64,
    /// Size of the copy, header included.
    pub env_size: usize,
    /// Erase-block size and count: MTD only, kept for completeness.
    pub sector_size: Option<u64>,
    pub sectors: Option<u64>,
}

/// The parsed `fw_env.config`: one copy, or two for a redundant pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FwEnvConfig {
    pub copies: Vec<EnvLocation>,
}

impl FwEnvConfig {
    pub fn redundant(&self) -> bool {
        self.copies.len() == 2
    }

    pub fn env_size(&self) -> usize {
        self.copies.first().map(|c| c.env_size).unwrap_or(0)
    }
}

/// An integer as C's `strtoll(s, NULL, 0)` reads a whole field: optional
/// sign, `0x` hex, leading-zero octal, or decimal.
fn parse_c_integer(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) =
        if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
            (16, h)
        } else if body.len() > 1 && body.starts_with('0') {
            (8, &body[1..])
        } else {
            (10, body)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from(u64::from_str_radix(digits, radix).ok()?);
    i64::try_from(if neg { -magnitude } else { magnitude }).ok()
}

/// A hexadecimal field as C's `%zx` reads it (with or without `0x`).
fn parse_hex(s: &str) -> Option<u64> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Parse the text of an `fw_env.config` in libubootenv's line format:
/// `DEVICE OFFSET ENVSIZE [SECTORSIZE [SECTORS]]`, `#` comments. OFFSET is
/// a C integer (`0x…` hex, `0…` octal, decimal, negative = from the end of
/// a block device); ENVSIZE, SECTORSIZE and SECTORS are hexadecimal with or
/// without `0x`, as libubootenv reads them (so `4000` is 16 KiB). Lines
/// libubootenv would skip silently because they are short or garbled are
/// errors here.
pub fn parse_fw_env_config(text: &str) -> Result<FwEnvConfig> {
    let mut copies: Vec<EnvLocation> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let fields: Vec<&str> = line
            .split_whitespace()
            .take_while(|f| !f.starts_with('#'))
            .collect();
        if fields.is_empty() {
            continue;
        }
        if fields.len() < 3 {
            let hint = if fields[0].ends_with(':') {
                " (this looks like libubootenv's YAML format, which updraft does not read)"
            } else {
                ""
            };
            bail!(
                Malformed,
                "line {n}: expected DEVICE OFFSET ENVSIZE [SECTORSIZE [SECTORS]], found {:?}{hint}",
                line.trim()
            );
        }
        if fields.len() > 5 {
            bail!(
                Malformed,
                "line {n}: {} fields, at most 5 expected (DEVICE OFFSET ENVSIZE SECTORSIZE SECTORS; the MTD lock field is not supported)",
                fields.len()
            );
        }
        if copies.len() == 2 {
            bail!(
                Malformed,
                "line {n}: a third environment copy; U-Boot keeps one or two"
            );
        }
        let device = fields[0];
        if !device.starts_with('/') {
            bail!(
                Malformed,
                "line {n}: device {device:?} is not an absolute path"
            );
        }
        if device.starts_with("/dev/mtd") || device.starts_with("/dev/ubi") {
            bail!(
                Malformed,
                "line {n}: {device} is an MTD/UBI device; updraft writes environments on files and block devices only (use the script backend with fw_setenv for raw flash)"
            );
        }
        let offset = parse_c_integer(fields[1]).ok_or_else(|| {
            err!(
                Malformed,
                "line {n}: offset {:?} is not a number",
                fields[1]
            )
        })?;
        let env_size = parse_hex(fields[2]).ok_or_else(|| {
            err!(
                Malformed,
                "line {n}: size {:?} is not a hexadecimal number",
                fields[2]
            )
        })?;
        if env_size < MIN_ENV_SIZE as u64 || env_size > MAX_ENV_SIZE as u64 {
            bail!(
                Malformed,
                "line {n}: size {:#x} is outside {MIN_ENV_SIZE:#x}..={MAX_ENV_SIZE:#x} (sizes are hexadecimal, as libubootenv reads them)",
                env_size
            );
        }
        let hex_field = |idx: usize, what: &str| -> Result<Option<u64>> {
            fields
                .get(idx)
                .map(|f| {
                    parse_hex(f).ok_or_else(|| {
                        err!(
                            Malformed,
                            "line {n}: {what} {f:?} is not a hexadecimal number"
                        )
                    })
                })
                .transpose()
        };
        let sector_size = hex_field(3, "sector size")?;
        let sectors = hex_field(4, "sector count")?;
        copies.push(EnvLocation {
            device: PathBuf::from(device),
            offset,
            env_size: env_size as usize,
            sector_size,
            sectors,
        });
    }
    match copies.as_slice() {
        [] => bail!(
            Malformed,
            "no environment copy described (expected DEVICE OFFSET ENVSIZE lines)"
        ),
        [a, b] => {
            if a.env_size != b.env_size {
                bail!(
                    Malformed,
                    "the two copies differ in size ({:#x} and {:#x}); a redundant environment needs equal sizes",
                    a.env_size,
                    b.env_size
                );
            }
            if a.device == b.device && a.offset >= 0 && b.offset >= 0 {
                let (lo, hi) = if a.offset <= b.offset { (a, b) } else { (b, a) };
                if (lo.offset as u64).saturating_add(lo.env_size as u64) > hi.offset as u64 {
                    bail!(
                        Malformed,
                        "the two copies overlap on {} (offsets {:#x} and {:#x}, size {:#x})",
                        a.device.display(),
                        lo.offset,
                        hi.offset,
                        a.env_size
                    );
                }
            }
        }
        _ => {}
    }
    Ok(FwEnvConfig { copies })
}

// ---------------------------------------------------------------------------
// Devices: locking, reading, writing.

/// libubootenv's lock, held while it lives.
struct EnvLock {
    _file: Option<File>,
}

fn take_lock(path: &Path, timeout: Duration) -> Result<EnvLock> {
    let file = match OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o666)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        // libubootenv goes on without the lock when it cannot create the
        // file; then no fw_setenv can hold it either.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EROFS)) => {
            log::warn!(
                "cannot create the U-Boot environment lock {} ({e}); going on without it, as libubootenv does",
                path.display()
            );
            return Ok(EnvLock { _file: None });
        }
        Err(e) => {
            return Err(Error::from(e)
                .wrap(format!(
                    "opening the U-Boot environment lock {}",
                    path.display()
                ))
                .with_kind(Kind::Bootloader));
        }
    };
    let start = Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(EnvLock { _file: Some(file) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                if start.elapsed() >= timeout {
                    bail!(
                        Busy,
                        "the U-Boot environment lock {} has been held by another process (fw_setenv?) for more than {} ms",
                        path.display(),
                        timeout.as_millis()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                return Err(Error::from(e)
                    .wrap(format!("locking {}", path.display()))
                    .with_kind(Kind::Bootloader));
            }
        }
    }
}

// _IOR(0x12, 114, size_t)
const BLKGETSIZE64: libc::c_ulong = if cfg!(target_pointer_width = "64") {
    0x8008_1272
} else {
    0x8004_1272
};

/// Size of a regular file or block device.
fn device_size(file: &File, path: &Path) -> Result<u64> {
    let md = file
        .metadata()
        .kind_context(Kind::Bootloader, format!("inspecting {}", path.display()))?;
    if md.file_type().is_block_device() {
        let mut size: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer we pass.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
        if rc != 0 {
            return Err(Error::from(io::Error::last_os_error())
                .wrap(format!("reading the size of {}", path.display()))
                .with_kind(Kind::Bootloader));
        }
        Ok(size)
    } else if md.file_type().is_file() {
        Ok(md.len())
    } else {
        bail!(
            Bootloader,
            "{} is neither a regular file nor a block device",
            path.display()
        )
    }
}

/// The absolute offset of a copy on its opened device, checked to fit.
fn resolve_offset(loc: &EnvLocation, file: &File) -> Result<u64> {
    let size = device_size(file, &loc.device)?;
    let offset = if loc.offset < 0 {
        let block = file
            .metadata()
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if !block {
            bail!(
                Bootloader,
                "offset {} of {} counts from the end of a block device, but it is not one",
                loc.offset,
                loc.device.display()
            );
        }
        size.checked_sub(loc.offset.unsigned_abs()).ok_or_else(|| {
            err!(
                Bootloader,
                "offset {} reaches before the start of {} ({size} bytes)",
                loc.offset,
                loc.device.display()
            )
        })?
    } else {
        loc.offset as u64
    };
    if offset.saturating_add(loc.env_size as u64) > size {
        bail!(
            Bootloader,
            "{} holds {size} bytes, too few for an environment of {:#x} bytes at offset {offset:#x}",
            loc.device.display(),
            loc.env_size
        );
    }
    Ok(offset)
}

/// The `/sys/block/…/force_ro` switch of an eMMC boot partition
/// (`/dev/mmcblkXbootY`, also behind a symlink), if `device` is one.
pub fn emmc_force_ro_path(device: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
    let name = real.file_name()?.to_str()?;
    is_emmc_boot_name(name).then(|| Path::new("/sys/block").join(name).join("force_ro"))
}

/// `mmcblk<digits>boot<digits>`.
fn is_emmc_boot_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("mmcblk") else {
        return false;
    };
    let disk_digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if disk_digits == 0 {
        return false;
    }
    match rest[disk_digits..].strip_prefix("boot") {
        Some(part) => !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Clears a `force_ro` switch and sets it again when dropped.
pub struct ForceRoGuard {
    path: PathBuf,
}

impl ForceRoGuard {
    /// Clear `force_ro` at `path` if it is set. `None` when there is no
    /// such switch or it is already clear (then nothing is restored).
    pub fn clear(path: &Path) -> Result<Option<ForceRoGuard>> {
        let current = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Error::from(e)
                    .wrap(format!("reading {}", path.display()))
                    .with_kind(Kind::Bootloader));
            }
        };
        if current.trim() == "0" {
            return Ok(None);
        }
        write_switch(path, b"0")?;
        Ok(Some(ForceRoGuard {
            path: path.to_path_buf(),
        }))
    }
}

fn write_switch(path: &Path, value: &[u8]) -> Result<()> {
    use std::io::Write;
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value))
        .kind_context(
            Kind::Bootloader,
            format!(
                "writing {:?} to {}",
                String::from_utf8_lossy(value),
                path.display()
            ),
        )
}

impl Drop for ForceRoGuard {
    fn drop(&mut self) {
        if let Err(e) = write_switch(&self.path, b"1") {
            log::warn!(
                "the environment was written but the write protection was not restored: {e}"
            );
        }
    }
}

fn open_device(loc: &EnvLocation, write: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_CLOEXEC)
        .open(&loc.device)
        .kind_context(
            Kind::Bootloader,
            format!(
                "opening {} for {}",
                loc.device.display(),
                if write { "writing" } else { "reading" }
            ),
        )
}

/// One copy read from its device.
struct CopyRead {
    offset: u64,
    bytes: Vec<u8>,
}

fn read_copy(loc: &EnvLocation) -> Result<CopyRead> {
    let file = open_device(loc, false)?;
    let offset = resolve_offset(loc, &file)?;
    let mut bytes = vec![0u8; loc.env_size];
    file.read_exact_at(&mut bytes, offset).kind_context(
        Kind::Bootloader,
        format!(
            "reading {:#x} bytes at offset {offset:#x} of {}",
            loc.env_size,
            loc.device.display()
        ),
    )?;
    Ok(CopyRead { offset, bytes })
}

fn write_copy(loc: &EnvLocation, image: &[u8]) -> Result<u64> {
    let _unprotected = match emmc_force_ro_path(&loc.device) {
        Some(p) => ForceRoGuard::clear(&p)?,
        None => None,
    };
    let file = open_device(loc, true)?;
    let offset = resolve_offset(loc, &file)?;
    let what = || {
        format!(
            "writing {:#x} bytes at offset {offset:#x} of {}",
            image.len(),
            loc.device.display()
        )
    };
    file.write_all_at(image, offset)
        .with_context(what)
        .map_err(|e| e.with_kind(Kind::Bootloader))?;
    file.sync_data()
        .with_context(what)
        .map_err(|e| e.with_kind(Kind::Bootloader))?;
    Ok(offset)
}

// ---------------------------------------------------------------------------
// The backend.

/// The environment as read: the variables and where they came from.
#[derive(Clone, Debug)]
pub struct LoadedEnv {
    pub env: Environment,
    /// Index of the copy read (0 or 1).
    pub current: usize,
    /// Its flags byte (redundant only).
    pub flags: Option<u8>,
}

pub struct UbootBootloader {
    /// Where the description came from, for messages.
    source: String,
    config: FwEnvConfig,
    lock_file: PathBuf,
    lock_timeout: Duration,
}

impl UbootBootloader {
    /// Read and parse an `fw_env.config`. Devices are opened only when the
    /// environment is accessed.
    pub fn from_config_file(path: &Path) -> Result<UbootBootloader> {
        let ctx = || format!("reading {}", path.display());
        let file = File::open(path)
            .with_context(ctx)
            .map_err(|e| e.with_kind(Kind::Bootloader))?;
        let len = file
            .metadata()
            .with_context(ctx)
            .map_err(|e| e.with_kind(Kind::Bootloader))?
            .len();
        if len > MAX_CONFIG_BYTES {
            bail!(
                Bootloader,
                "{} is {len} bytes, larger than any fw_env.config",
                path.display()
            );
        }
        let bytes = std::fs::read(path)
            .with_context(ctx)
            .map_err(|e| e.with_kind(Kind::Bootloader))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| err!(Bootloader, "{} is not UTF-8 text", path.display()))?;
        let config = parse_fw_env_config(&text).kind_context(Kind::Bootloader, path.display())?;
        Ok(UbootBootloader::new(config, path.display().to_string()))
    }

    /// A backend for an already parsed description; `source` names it in
    /// messages.
    pub fn new(config: FwEnvConfig, source: String) -> UbootBootloader {
        UbootBootloader {
            source,
            config,
            lock_file: PathBuf::from(DEFAULT_LOCK_FILE),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }

    /// Use another lock file (libubootenv's YAML configuration can name one).
    pub fn set_lock_file(&mut self, path: PathBuf) {
        self.lock_file = path;
    }

    /// Wait at most this long for the lock.
    pub fn set_lock_timeout(&mut self, timeout: Duration) {
        self.lock_timeout = timeout;
    }

    pub fn config(&self) -> &FwEnvConfig {
        &self.config
    }

    fn copy_name(&self, index: usize, offset: u64) -> String {
        let loc = &self.config.copies[index];
        if self.config.redundant() {
            format!(
                "uboot env copy {} at {} offset {offset:#x}",
                index + 1,
                loc.device.display()
            )
        } else {
            format!("uboot env at {} offset {offset:#x}", loc.device.display())
        }
    }

    fn lock(&self) -> Result<EnvLock> {
        take_lock(&self.lock_file, self.lock_timeout)
    }

    /// Read the current environment (the caller holds the lock).
    fn load_locked(&self) -> Result<LoadedEnv> {
        let redundant = self.config.redundant();
        let mut reads = Vec::with_capacity(2);
        for loc in &self.config.copies {
            reads.push(read_copy(loc)?);
        }
        let mut problems = Vec::new();
        let mut valid = [false; 2];
        let mut flags = [0u8; 2];
        for (i, r) in reads.iter().enumerate() {
            let c = decode_copy(&r.bytes, redundant)
                .kind_context(Kind::Bootloader, self.copy_name(i, r.offset))?;
            valid[i] = c.crc_ok();
            flags[i] = c.flags.unwrap_or(0);
            if !c.crc_ok() {
                problems.push(format!(
                    "{}: CRC mismatch (stored {:#010x}, computed {:#010x})",
                    self.copy_name(i, r.offset),
                    c.stored_crc,
                    c.computed_crc
                ));
            }
        }
        let current = if redundant {
            select_copy(valid, flags)
        } else {
            valid[0].then_some(0)
        };
        let Some(current) = current else {
            bail!(
                Bootloader,
                "{}: no valid environment copy; refusing to read or write it (U-Boot's `saveenv` rewrites it from the running environment)",
                problems.join("; ")
            );
        };
        for p in &problems {
            log::warn!("{p}; using the other copy");
        }
        let r = &reads[current];
        let c = decode_copy(&r.bytes, redundant)
            .kind_context(Kind::Bootloader, self.copy_name(current, r.offset))?;
        let env = parse_env_data(c.data)
            .kind_context(Kind::Bootloader, self.copy_name(current, r.offset))?;
        Ok(LoadedEnv {
            env,
            current,
            flags: c.flags,
        })
    }

    /// Read the environment under libubootenv's lock.
    pub fn load(&self) -> Result<LoadedEnv> {
        let _lock = self.lock()?;
        self.load_locked()
    }

    /// Change the environment with `f` and write it as one write to the
    /// inactive copy (or the only one). Nothing is written when `f` leaves
    /// the variables as they were. The lock is held from read to write.
    pub fn update(&mut self, f: impl FnOnce(&mut Environment) -> Result<()>) -> Result<()> {
        let _lock = self.lock()?;
        let loaded = self.load_locked()?;
        let mut env = loaded.env.clone();
        f(&mut env)?;
        if env == loaded.env {
            return Ok(());
        }
        let (target, flags) = if self.config.redundant() {
            (1 - loaded.current, loaded.flags.map(|f| f.wrapping_add(1)))
        } else {
            (0, None)
        };
        let image = encode_copy(&env, self.config.env_size(), flags).kind_context(
            Kind::Bootloader,
            format!(
                "writing the U-Boot environment described by {}",
                self.source
            ),
        )?;
        let loc = &self.config.copies[target];
        let offset = write_copy(loc, &image)?;
        log::debug!(
            "wrote {}{}",
            self.copy_name(target, offset),
            flags
                .map(|f| format!(" with flags {f}"))
                .unwrap_or_default()
        );
        Ok(())
    }

    fn update_boot(&mut self, f: impl FnOnce(&mut Boot)) -> Result<()> {
        let source = self.source.clone();
        self.update(|env| {
            let mut boot = Boot::from_env(env).kind_context(Kind::Bootloader, &source)?;
            f(&mut boot);
            if boot.order.is_empty() {
                bail!(
                    Bootloader,
                    "refusing to write an empty BOOT_ORDER to {source}: boot scripts read it as \"A B\" and would boot both slots"
                );
            }
            boot.store(env)
        })
    }
}

/// The model variables as the boot script sees them.
struct Boot {
    order: Vec<SlotName>,
    left: [u32; 2],
}

fn index(slot: SlotName) -> usize {
    match slot {
        SlotName::A => 0,
        SlotName::B => 1,
    }
}

/// A variable's text, `None` when missing or empty (the boot script's
/// `test -n` treats both alike).
fn text_var<'a>(env: &'a Environment, name: &str) -> Result<Option<&'a str>> {
    match env.get(name) {
        None | Some(b"") => Ok(None),
        Some(v) => std::str::from_utf8(v).map(Some).map_err(|_| {
            err!(
                Bootloader,
                "{name} is not text: {:?}",
                String::from_utf8_lossy(v)
            )
        }),
    }
}

impl Boot {
    fn from_env(env: &Environment) -> Result<Boot> {
        // Missing variables read as the shipped boot script initialises
        // them: only slot A, with full attempts; B is not bootable until
        // updraft has written and verified an image into it.
        let order = match text_var(env, VAR_ORDER)? {
            Some(t) => model::parse_order(t)?,
            None => vec![SlotName::A],
        };
        let mut left = [DEFAULT_LEFT, 0];
        for slot in [SlotName::A, SlotName::B] {
            let name = left_var(slot);
            if let Some(t) = text_var(env, name)? {
                if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                    bail!(Bootloader, "{name}={t:?} is not a count");
                }
                left[index(slot)] = t
                    .parse::<u32>()
                    .map_err(|_| err!(Bootloader, "{name}={t:?} is not a count"))?;
            }
        }
        Ok(Boot { order, left })
    }

    fn store(&self, env: &mut Environment) -> Result<()> {
        env.set(VAR_ORDER, &model::format_order(&self.order))?;
        for slot in [SlotName::A, SlotName::B] {
            env.set(left_var(slot), &self.left[index(slot)].to_string())?;
        }
        Ok(())
    }
}

fn check_tries(tries: u32) -> Result<()> {
    if tries == 0 || tries > MAX_TRIES {
        bail!(
            Bootloader,
            "{tries} tries cannot be stored in BOOT_x_LEFT: U-Boot boot scripts count with setexpr (hexadecimal) and test -gt (decimal), which agree only on 1 to {MAX_TRIES}"
        );
    }
    Ok(())
}

impl Bootloader for UbootBootloader {
    fn describe(&self) -> String {
        format!("uboot {}", self.source)
    }

    fn read(&mut self) -> Result<BootState> {
        let loaded = self.load()?;
        let boot = Boot::from_env(&loaded.env).kind_context(Kind::Bootloader, &self.source)?;
        let slot = |s: SlotName| SlotBoot {
            bootable: boot.order.contains(&s) && boot.left[index(s)] > 0,
            tries_left: boot.left[index(s)],
        };
        Ok(BootState {
            a: slot(SlotName::A),
            b: slot(SlotName::B),
            order: boot.order.clone(),
        })
    }

    fn disable(&mut self, slot: SlotName) -> Result<()> {
        self.update_boot(|b| {
            b.order = model::without(&b.order, slot);
            b.left[index(slot)] = 0;
        })
    }

    fn trial(&mut self, slot: SlotName, tries: u32) -> Result<()> {
        check_tries(tries)?;
        self.update_boot(|b| {
            b.order = model::first(&b.order, slot);
            b.left[index(slot)] = tries;
        })
    }

    fn mark_good(&mut self, slot: SlotName, tries: u32) -> Result<()> {
        check_tries(tries)?;
        self.update_boot(|b| {
            b.order = model::first(&b.order, slot);
            b.left[index(slot)] = tries;
        })
    }

    fn mark_bad(&mut self, slot: SlotName) -> Result<()> {
        self.update_boot(|b| {
            b.order = model::first(&model::without(&b.order, slot), slot.other());
            b.left[index(slot)] = 0;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Rng;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("updraft-uboot-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn env_of(vars: &[(&str, &str)]) -> Environment {
        let mut e = Environment::new();
        for (k, v) in vars {
            e.set(k, v).unwrap();
        }
        e
    }

    /// A backend over `copies` copies of `size` bytes in one file, with a
    /// private lock file.
    fn backend(
        dir: &Path,
        size: usize,
        copies: usize,
        env: &Environment,
    ) -> (UbootBootloader, PathBuf) {
        let dev = dir.join("env.img");
        let mut bytes = Vec::new();
        for _ in 0..copies {
            bytes.extend(encode_copy(env, size, (copies == 2).then_some(1)).unwrap());
        }
        std::fs::write(&dev, &bytes).unwrap();
        let config = FwEnvConfig {
            copies: (0..copies)
                .map(|i| EnvLocation {
                    device: dev.clone(),
                    offset: (i * size) as i64,
                    env_size: size,
                    sector_size: None,
                    sectors: None,
                })
                .collect(),
        };
        let mut bl = UbootBootloader::new(config, "test".into());
        bl.set_lock_file(dir.join("lock"));
        (bl, dev)
    }

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn entries_round_trip_byte_for_byte() {
        let mut data =
            b"bootcmd=run x\0foo=bar baz\0junk-without-equals\0BOOT_ORDER=A B\0\0".to_vec();
        data.resize(64, 0xff);
        let env = parse_env_data(&data).unwrap();
        assert_eq!(env.get("foo"), Some(&b"bar baz"[..]));
        assert_eq!(env.get("junk-without-equals"), None);
        let out = serialize_env_data(&env, 64).unwrap();
        assert_eq!(&out[..60], &data[..60]);
        assert!(out[60..].iter().all(|&b| b == 0));
    }

    #[test]
    fn set_replaces_in_place_and_appends_new_names() {
        let mut env = env_of(&[("a", "1"), ("BOOT_ORDER", "A B"), ("z", "2")]);
        env.set("BOOT_ORDER", "B A").unwrap();
        env.set("BOOT_B_LEFT", "3").unwrap();
        let entries: Vec<&[u8]> = env.entries().collect();
        assert_eq!(
            entries,
            vec![&b"a=1"[..], b"BOOT_ORDER=B A", b"z=2", b"BOOT_B_LEFT=3"]
        );
        assert!(env.set("a=b", "x").is_err());
        assert!(env.set("", "x").is_err());
        assert!(env.set("a", "x\0y").is_err());
    }

    #[test]
    fn duplicates_read_last_and_collapse_on_write() {
        let env = parse_env_data(b"x=1\0y=2\0x=3\0\0").unwrap();
        assert_eq!(env.get("x"), Some(&b"3"[..]));
        let mut env2 = env.clone();
        env2.set("x", "4").unwrap();
        let entries: Vec<&[u8]> = env2.entries().collect();
        assert_eq!(entries, vec![&b"x=4"[..], b"y=2"]);
    }

    #[test]
    fn hostile_data_areas() {
        // No terminator anywhere.
        let e = parse_env_data(b"abcdef").unwrap_err();
        assert_eq!(e.kind(), Kind::Malformed);
        assert!(e.to_string().contains("offset 0x0"), "{e}");
        // A second entry running off the end.
        assert!(parse_env_data(b"a=1\0bbbb").is_err());
        // Empty list, all-zero, all-0xff.
        assert_eq!(parse_env_data(&[0; 8]).unwrap(), Environment::new());
        assert!(parse_env_data(&[0xff; 8]).is_err());
        // A list filling the area exactly is read, but cannot be written back.
        let full = parse_env_data(b"a=1\0b=2\0").unwrap();
        assert_eq!(full.get("b"), Some(&b"2"[..]));
        assert!(serialize_env_data(&full, 8).is_err());
        assert!(decode_copy(&[1, 2, 3, 4], false).is_err());
        assert!(decode_copy(&[1, 2, 3, 4, 5], true).is_err());
        assert!(
            parse_image(&[0u8; 32], false).is_err(),
            "zero CRC over zero data is wrong"
        );
    }

    #[test]
    fn copies_encode_and_decode() {
        let env = env_of(&[("k", "v")]);
        let single = encode_copy(&env, 64, None).unwrap();
        assert_eq!(single.len(), 64);
        assert_eq!(&single[4..8], b"k=v\0");
        assert_eq!(parse_image(&single, false).unwrap(), env);
        let red = encode_copy(&env, 64, Some(7)).unwrap();
        assert_eq!(red[4], 7);
        assert_eq!(&red[5..9], b"k=v\0");
        assert_eq!(decode_copy(&red, true).unwrap().flags, Some(7));
        let mut bad = red.clone();
        bad[20] ^= 1;
        assert!(
            parse_image(&bad, true)
                .unwrap_err()
                .to_string()
                .contains("CRC mismatch")
        );
        assert!(encode_copy(&env_of(&[("k", &"v".repeat(100))]), 64, None).is_err());
    }

    #[test]
    fn copy_selection_follows_libubootenv() {
        assert_eq!(select_copy([false, false], [1, 2]), None);
        assert_eq!(select_copy([true, false], [1, 2]), Some(0));
        assert_eq!(select_copy([false, true], [9, 2]), Some(1));
        assert_eq!(select_copy([true, true], [1, 2]), Some(1));
        assert_eq!(select_copy([true, true], [3, 2]), Some(0));
        assert_eq!(select_copy([true, true], [5, 5]), Some(0));
        assert_eq!(select_copy([true, true], [255, 0]), Some(1), "wrapped");
        assert_eq!(select_copy([true, true], [0, 255]), Some(0), "wrapped");
        assert_eq!(
            select_copy([true, true], [254, 0]),
            Some(0),
            "only 255→0 wraps"
        );
        assert_eq!(select_copy([true, true], [255, 1]), Some(0));
    }

    #[test]
    fn config_lines_in_libubootenv_format() {
        let c = parse_fw_env_config(
            "# comment\n\n/dev/mmcblk0 0x3fe000 0x2000\n  /dev/mmcblk0\t-0x2000 2000 0x200 4 # trailing\n",
        )
        .unwrap();
        assert!(c.redundant());
        assert_eq!(c.copies[0].offset, 0x3fe000);
        assert_eq!(c.copies[0].env_size, 0x2000);
        assert_eq!(c.copies[1].offset, -0x2000);
        assert_eq!(c.copies[1].env_size, 0x2000, "sizes are hex without 0x too");
        assert_eq!(c.copies[1].sector_size, Some(0x200));
        assert_eq!(c.copies[1].sectors, Some(4));
        let single = parse_fw_env_config("/boot/uboot.env 0 0x4000\n").unwrap();
        assert!(!single.redundant());
        assert_eq!(
            parse_fw_env_config("/x 010 0x4000").unwrap().copies[0].offset,
            8,
            "octal"
        );
        assert_eq!(
            parse_fw_env_config("/x 16 0x4000").unwrap().copies[0].offset,
            16
        );
    }

    #[test]
    fn config_errors_name_the_line() {
        let cases = [
            ("", "no environment copy"),
            ("# only comments\n", "no environment copy"),
            (
                "/dev/mmcblk0 0x0\n",
                "line 1: expected DEVICE OFFSET ENVSIZE",
            ),
            ("uboot:\n  size: 0x4000\n", "YAML"),
            ("/x 0 0x4000\n/y zz 0x4000\n", "line 2: offset \"zz\""),
            ("/x 0 0x4000g\n", "size \"0x4000g\""),
            ("/x 0 0\n", "outside"),
            ("/x 0 0x10000000\n", "outside"),
            ("/x 0 0x4000 0x1000 2 1\n", "at most 5"),
            (
                "/x 0 0x4000\n/x 0x4000 0x4000\n/x 0x8000 0x4000\n",
                "line 3: a third",
            ),
            ("/x 0 0x4000\n/y 0 0x2000\n", "differ in size"),
            ("/x 0 0x4000\n/x 0x2000 0x4000\n", "overlap"),
            ("/dev/mtd1 0 0x4000\n", "MTD/UBI"),
            ("relative 0 0x4000\n", "absolute"),
            ("/x 0x 0x4000\n", "offset"),
            ("/x 0x8000000000000000 0x4000\n", "offset"),
            ("/x 0 0x4000 zz\n", "sector size"),
        ];
        for (text, want) in cases {
            let e = parse_fw_env_config(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn numbers_parse_as_c_does() {
        assert_eq!(parse_c_integer("0x10"), Some(16));
        assert_eq!(parse_c_integer("-0X10"), Some(-16));
        assert_eq!(parse_c_integer("0"), Some(0));
        assert_eq!(parse_c_integer("017"), Some(15));
        assert_eq!(parse_c_integer("08"), None);
        assert_eq!(parse_c_integer("+5"), Some(5));
        assert_eq!(parse_c_integer("0x+5"), None);
        assert_eq!(parse_c_integer("-"), None);
        assert_eq!(parse_hex("4000"), Some(0x4000));
        assert_eq!(parse_hex("0x"), None);
        assert_eq!(parse_hex("+1"), None);
    }

    #[test]
    fn emmc_boot_partitions_are_recognised() {
        assert!(is_emmc_boot_name("mmcblk0boot0"));
        assert!(is_emmc_boot_name("mmcblk12boot1"));
        assert!(!is_emmc_boot_name("mmcblk0"));
        assert!(!is_emmc_boot_name("mmcblk0p1"));
        assert!(!is_emmc_boot_name("mmcblkboot0"));
        assert!(!is_emmc_boot_name("mmcblk0boot"));
        assert!(!is_emmc_boot_name("mmcblk0boot0p1"));
        assert_eq!(
            emmc_force_ro_path(Path::new("/dev/mmcblk1boot0")),
            Some(PathBuf::from("/sys/block/mmcblk1boot0/force_ro"))
        );
        assert_eq!(emmc_force_ro_path(Path::new("/dev/sda")), None);
    }

    #[test]
    fn force_ro_is_cleared_for_the_write_and_restored() {
        let d = tmp("force-ro");
        let sw = d.join("force_ro");
        std::fs::write(&sw, "1\n").unwrap();
        {
            let guard = ForceRoGuard::clear(&sw).unwrap();
            assert!(guard.is_some());
            assert_eq!(std::fs::read_to_string(&sw).unwrap().trim(), "0");
        }
        assert_eq!(std::fs::read_to_string(&sw).unwrap().trim(), "1");
        // Already writable: left alone.
        std::fs::write(&sw, "0\n").unwrap();
        assert!(ForceRoGuard::clear(&sw).unwrap().is_none());
        assert_eq!(std::fs::read_to_string(&sw).unwrap().trim(), "0");
        assert!(ForceRoGuard::clear(&d.join("missing")).unwrap().is_none());
    }

    #[test]
    fn redundant_writes_alternate_and_wrap() {
        let d = tmp("alternate");
        let (mut bl, dev) = backend(&d, 256, 2, &env_of(&[("keep", "me")]));
        let mut seen_wrap = false;
        let mut last_flags = 1u8;
        for i in 0..300u32 {
            let slot = if i % 2 == 0 { SlotName::B } else { SlotName::A };
            bl.trial(slot, 1 + i % 9).unwrap();
            let loaded = bl.load().unwrap();
            let flags = loaded.flags.unwrap();
            assert_eq!(flags, last_flags.wrapping_add(1));
            seen_wrap |= flags == 0;
            last_flags = flags;
            assert_eq!(
                loaded.current,
                (i as usize + 1) % 2,
                "writes alternate copies"
            );
            let s = bl.read().unwrap();
            assert_eq!(s.order[0], slot);
            assert_eq!(s.slot(slot).tries_left, 1 + i % 9);
            assert_eq!(loaded.env.get("keep"), Some(&b"me"[..]));
        }
        assert!(seen_wrap);
        assert_eq!(std::fs::metadata(&dev).unwrap().len(), 512);
    }

    #[test]
    fn corrupt_copy_falls_back_and_is_the_one_overwritten() {
        let d = tmp("fallback");
        let (mut bl, dev) = backend(&d, 256, 2, &env_of(&[("BOOT_ORDER", "A B")]));
        bl.trial(SlotName::B, 3).unwrap(); // copy 2 now current, flags 2
        let mut bytes = std::fs::read(&dev).unwrap();
        bytes[256 + 40] ^= 0x55; // corrupt copy 2
        std::fs::write(&dev, &bytes).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A, SlotName::B], "copy 1 is used");
        bl.trial(SlotName::B, 2).unwrap();
        let after = std::fs::read(&dev).unwrap();
        assert_eq!(&after[..256], &bytes[..256], "the good copy is not touched");
        assert_eq!(bl.read().unwrap().b.tries_left, 2);
    }

    #[test]
    fn no_valid_copy_is_refused_and_left_alone() {
        let d = tmp("invalid");
        let (mut bl, dev) = backend(&d, 256, 2, &env_of(&[("BOOT_ORDER", "A B")]));
        let mut bytes = std::fs::read(&dev).unwrap();
        bytes[10] ^= 1;
        bytes[256 + 10] ^= 1;
        std::fs::write(&dev, &bytes).unwrap();
        let e = bl.trial(SlotName::B, 3).unwrap_err();
        assert_eq!(e.kind(), Kind::Bootloader);
        let msg = e.to_string();
        assert!(
            msg.contains("copy 1 at") && msg.contains("copy 2 at") && msg.contains("offset 0x100"),
            "{msg}"
        );
        assert!(msg.contains("CRC mismatch (stored 0x"), "{msg}");
        assert!(bl.read().is_err());
        assert_eq!(std::fs::read(&dev).unwrap(), bytes);
    }

    #[test]
    fn missing_variables_read_as_script_defaults_and_get_written() {
        let d = tmp("defaults");
        let (mut bl, _) = backend(&d, 256, 1, &env_of(&[("bootcmd", "run x")]));
        let s = bl.read().unwrap();
        // As the shipped boot script initialises them: A only, B empty.
        assert_eq!(s.order, vec![SlotName::A]);
        assert_eq!((s.a.tries_left, s.b.tries_left), (3, 0));
        assert!(s.a.bootable && !s.b.bootable);
        bl.disable(SlotName::B).unwrap();
        let env = bl.load().unwrap().env;
        let entries: Vec<&[u8]> = env.entries().collect();
        assert_eq!(
            entries,
            vec![
                &b"bootcmd=run x"[..],
                b"BOOT_ORDER=A",
                b"BOOT_A_LEFT=3",
                b"BOOT_B_LEFT=0"
            ]
        );
    }

    #[test]
    fn model_operations() {
        let d = tmp("model");
        let (mut bl, dev) = backend(&d, 512, 1, &Environment::new());
        bl.disable(SlotName::B).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A]);
        assert!(!s.b.bootable);
        assert_eq!(s.next_boot(), Some(SlotName::A));
        bl.trial(SlotName::B, 3).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::B, SlotName::A]);
        assert_eq!(s.next_boot(), Some(SlotName::B));
        bl.mark_good(SlotName::B, 3).unwrap();
        // Mark the padding (updraft writes zeros there) to see whether the
        // copy is rewritten.
        let env = bl.load().unwrap().env;
        let mut marked = encode_copy(&env, 512, None).unwrap();
        marked[4 + env.encoded_len()..].fill(0xaa);
        let crc = crc32(&marked[4..]).to_le_bytes();
        marked[..4].copy_from_slice(&crc);
        std::fs::write(&dev, &marked).unwrap();
        bl.mark_good(SlotName::B, 3).unwrap();
        assert_eq!(
            std::fs::read(&dev).unwrap(),
            marked,
            "no write when already good"
        );
        bl.mark_bad(SlotName::B).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A]);
        assert_eq!(s.b.tries_left, 0);
        assert_eq!(s.next_boot(), Some(SlotName::A));
        let e = bl.disable(SlotName::A).unwrap_err().to_string();
        assert!(e.contains("empty BOOT_ORDER"), "{e}");
        assert!(
            bl.trial(SlotName::B, 10)
                .unwrap_err()
                .to_string()
                .contains("1 to 9")
        );
        assert!(bl.mark_good(SlotName::B, 0).is_err());
    }

    #[test]
    fn malformed_model_variables_are_refused() {
        for (name, value, want) in [
            ("BOOT_ORDER", "A C", "unknown slot"),
            ("BOOT_A_LEFT", "x", "not a count"),
            ("BOOT_B_LEFT", "-1", "not a count"),
            ("BOOT_B_LEFT", "99999999999", "not a count"),
        ] {
            let d = tmp("malformed");
            let (mut bl, dev) = backend(&d, 256, 1, &env_of(&[(name, value)]));
            let before = std::fs::read(&dev).unwrap();
            let e = bl.read().unwrap_err().to_string();
            assert!(e.contains(want), "{name}={value}: {e}");
            assert!(bl.trial(SlotName::B, 3).is_err());
            assert_eq!(std::fs::read(&dev).unwrap(), before);
        }
    }

    #[test]
    fn devices_that_are_too_small_or_missing_are_reported() {
        let d = tmp("small");
        let dev = d.join("short.env");
        std::fs::write(&dev, [0u8; 100]).unwrap();
        let mut bl = UbootBootloader::new(
            parse_fw_env_config(&format!("{} 0x40 0x100\n", dev.display())).unwrap(),
            "t".into(),
        );
        bl.set_lock_file(d.join("lock"));
        let e = bl.read().unwrap_err().to_string();
        assert!(
            e.contains("holds 100 bytes") && e.contains("offset 0x40"),
            "{e}"
        );
        let mut bl = UbootBootloader::new(
            parse_fw_env_config(&format!("{} -0x100 0x100\n", dev.display())).unwrap(),
            "t".into(),
        );
        bl.set_lock_file(d.join("lock"));
        assert!(bl.read().unwrap_err().to_string().contains("not one"));
        let mut bl = UbootBootloader::new(
            parse_fw_env_config(&format!("{} 0 0x100\n", d.join("nope").display())).unwrap(),
            "t".into(),
        );
        bl.set_lock_file(d.join("lock"));
        assert!(bl.read().unwrap_err().to_string().contains("nope"));
    }

    #[test]
    fn a_held_lock_makes_the_backend_wait_then_fail_as_busy() {
        let d = tmp("lock");
        let (mut bl, dev) = backend(&d, 256, 1, &Environment::new());
        let holder = File::create(d.join("lock")).unwrap();
        // SAFETY: flock on our own descriptor.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
        bl.set_lock_timeout(Duration::from_millis(100));
        let before = std::fs::read(&dev).unwrap();
        let e = bl.trial(SlotName::B, 3).unwrap_err();
        assert_eq!(e.kind(), Kind::Busy);
        assert!(e.to_string().contains("lock"), "{e}");
        assert_eq!(std::fs::read(&dev).unwrap(), before);
        drop(holder);
        bl.trial(SlotName::B, 3).unwrap();
    }

    #[test]
    fn config_file_is_read_with_context() {
        let d = tmp("cfgfile");
        let p = d.join("fw_env.config");
        std::fs::write(&p, "/x 0 zz\n").unwrap();
        let e = UbootBootloader::from_config_file(&p)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with(&p.display().to_string()) && e.contains("line 1"),
            "{e}"
        );
        assert!(UbootBootloader::from_config_file(&d.join("missing")).is_err());
        std::fs::write(&p, "/boot/uboot.env 0 0x4000\n").unwrap();
        let bl = UbootBootloader::from_config_file(&p).unwrap();
        assert_eq!(bl.describe(), format!("uboot {}", p.display()));
    }

    /// `seed` with a few bytes replaced by interesting ones, maybe cut.
    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..1 + rng.below(6) {
            let i = rng.below(v.len());
            v[i] = match rng.below(6) {
                0 => 0,
                1 => b'=',
                2 => 0xff,
                3 => b' ',
                4 => b'\n',
                _ => rng.next() as u8,
            };
        }
        if rng.below(4) == 0 {
            v.truncate(rng.below(v.len() + 1));
        }
        v
    }

    #[test]
    fn mutated_copies_never_panic_and_what_parses_round_trips() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let env = env_of(&[
            ("bootcmd", "run x"),
            ("BOOT_ORDER", "A B"),
            ("BOOT_A_LEFT", "3"),
            ("BOOT_B_LEFT", "2"),
        ]);
        let seeds = [
            encode_copy(&env, 96, None).unwrap(),
            encode_copy(&env, 96, Some(1)).unwrap(),
        ];
        let mut parsed = 0;
        for round in 0..20_000 {
            let img = mutate(&mut rng, &seeds[round % 2]);
            for redundant in [false, true] {
                let _ = parse_image(&img, redundant);
                let Ok(c) = decode_copy(&img, redundant) else {
                    continue;
                };
                let _ = select_copy([c.crc_ok(), round % 3 == 0], [c.flags.unwrap_or(0), img[0]]);
                let Ok(e) = parse_env_data(c.data) else {
                    continue;
                };
                parsed += 1;
                let _ = Boot::from_env(&e);
                if let Ok(area) = serialize_env_data(&e, c.data.len()) {
                    assert_eq!(parse_env_data(&area).unwrap(), e);
                }
            }
        }
        assert!(
            parsed > 1000,
            "the mutations reach the entry parser ({parsed})"
        );
    }

    #[test]
    fn mutated_configs_never_panic() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let seed = b"# env\n/dev/mmcblk0 0x3fc000 0x2000 0x200 1\n/dev/mmcblk0 -0x2000 2000\n";
        let mut ok = 0;
        for _ in 0..20_000 {
            let text = mutate(&mut rng, seed);
            if let Ok(c) = parse_fw_env_config(&String::from_utf8_lossy(&text)) {
                ok += 1;
                assert!(matches!(c.copies.len(), 1 | 2));
                assert!(
                    c.copies
                        .iter()
                        .all(|l| (MIN_ENV_SIZE..=MAX_ENV_SIZE).contains(&l.env_size))
                );
            }
        }
        assert!(ok > 100, "some mutations stay valid ({ok})");
    }
}
