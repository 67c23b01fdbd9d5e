//! The A/B slot pair: which slot is booted, and reading and writing slots.
//!
//! A slot is a block device (a partition) or, for development and tests, a
//! regular file of fixed size standing in for one. This module owns opening
//! slots safely and moving bytes in and out of them:
//!
//! * A block device is opened for writing with `O_EXCL`, which the kernel
//!   refuses while the device is mounted or otherwise claimed, so updraft can
//!   never write a mounted filesystem.
//! * Writes go out in large blocks. Dirty data is bounded: every
//!   `sync_bytes` the writer starts write-back of what it just wrote
//!   (`sync_file_range`) and waits for the previous step, so the kernel
//!   writes while updraft decodes, and no single `fdatasync` stall is long.
//! * On a block device, aligned blocks bypass the page cache (`O_DIRECT`,
//!   see [`crate::direct_io`]): the device reads straight from updraft's
//!   buffers, and the read-back reads the medium. Regular files, and the
//!   unaligned end of an image, go through the page cache.
//! * At the end the data is made durable (`fdatasync`), the page cache for
//!   the slot is dropped (`BLKFLSBUF` / `POSIX_FADV_DONTNEED`), and the
//!   image is read back from the medium and hashed (while it is written, by
//!   [`crate::readback`], when the write started at the first byte).
//!
//! It must never decide *which* slot to write: that is the caller's, after
//! checking [`booted_slot`]. It refuses, as a last line of defence, to open
//! for writing a slot that is the same device as the booted one.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::direct_io::{self, AlignedBuf};
use crate::error::{Context, Error, Kind, Result};
use crate::hash::{Hasher, Sha256};
use crate::{bail, err};

/// One of the two slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum SlotName {
    A,
    B,
}

impl SlotName {
    pub fn other(self) -> SlotName {
        match self {
            SlotName::A => SlotName::B,
            SlotName::B => SlotName::A,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SlotName::A => "A",
            SlotName::B => "B",
        }
    }

    /// Accepts `A`/`B` in either case.
    pub fn parse(s: &str) -> Option<SlotName> {
        match s {
            "A" | "a" => Some(SlotName::A),
            "B" | "b" => Some(SlotName::B),
            _ => None,
        }
    }
}

impl std::fmt::Display for SlotName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The configured pair.
#[derive(Clone, Debug)]
pub struct SlotPair {
    pub a: PathBuf,
    pub b: PathBuf,
}

impl SlotPair {
    pub fn path(&self, s: SlotName) -> &Path {
        match s {
            SlotName::A => &self.a,
            SlotName::B => &self.b,
        }
    }
}

/// The booted slot, from `updraft.slot=A|B` on the kernel command line,
/// or else from `root=` naming one of the slots `a` and `b` (a device path,
/// `PARTUUID=`, `UUID=` or `LABEL=`, resolved through `/dev/disk/by-*`):
/// what another updater's boot script passes, which knows nothing of
/// updraft.
pub fn booted_slot(cmdline: &Path, a: &Path, b: &Path) -> Result<SlotName> {
    let text = std::fs::read_to_string(cmdline)
        .kind_context(Kind::Slot, format!("reading {}", cmdline.display()))?;
    if let Some(slot) = parse_cmdline(&text) {
        return Ok(slot);
    }
    let Some(root) = root_device(&text) else {
        bail!(
            Slot,
            "{} has no updraft.slot=A or updraft.slot=B and no root=: cannot tell which slot is booted",
            cmdline.display()
        );
    };
    let same = |slot: &Path| match (std::fs::canonicalize(&root), std::fs::canonicalize(slot)) {
        (Ok(r), Ok(s)) => r == s,
        _ => false,
    };
    if same(a) {
        Ok(SlotName::A)
    } else if same(b) {
        Ok(SlotName::B)
    } else {
        Err(err!(
            Slot,
            "{} has no updraft.slot= and its root={} is neither slot A ({}) nor slot B ({}): cannot tell which slot is booted",
            cmdline.display(),
            root.display(),
            a.display(),
            b.display()
        ))
    }
}

/// The device `root=` names (the last one wins), as a path.
fn root_device(cmdline: &str) -> Option<PathBuf> {
    let root = cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("root="))
        .next_back()?;
    let by = |dir: &str, id: &str| Path::new("/dev/disk").join(dir).join(id);
    Some(if let Some(id) = root.strip_prefix("PARTUUID=") {
        by("by-partuuid", &id.to_ascii_lowercase())
    } else if let Some(id) = root.strip_prefix("UUID=") {
        by("by-uuid", &id.to_ascii_lowercase())
    } else if let Some(id) = root.strip_prefix("LABEL=") {
        by("by-label", id)
    } else {
        PathBuf::from(root)
    })
}

/// The last `updraft.slot=` wins, as with kernel parameters.
pub fn parse_cmdline(text: &str) -> Option<SlotName> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("updraft.slot="))
        .next_back()
        .and_then(SlotName::parse)
}

/// Identity of a file or device, to detect two paths naming the same slot.
fn identity(path: &Path) -> Result<(bool, u64, u64)> {
    let md =
        std::fs::metadata(path).kind_context(Kind::Slot, format!("slot {}", path.display()))?;
    if md.file_type().is_block_device() {
        Ok((true, md.rdev(), 0))
    } else {
        Ok((false, md.dev(), md.ino()))
    }
}

/// True when both paths are the same device or file.
pub fn same_slot(a: &Path, b: &Path) -> Result<bool> {
    Ok(identity(a)? == identity(b)?)
}

/// Capacity in bytes of a slot (block device size, or file length).
pub fn capacity(path: &Path) -> Result<u64> {
    let f =
        File::open(path).kind_context(Kind::Slot, format!("opening slot {}", path.display()))?;
    capacity_of(&f, path)
}

/// Size in bytes of an opened slot, a block device or a regular file.
pub(crate) fn capacity_of(f: &File, path: &Path) -> Result<u64> {
    let md = f
        .metadata()
        .kind_context(Kind::Slot, format!("slot {}", path.display()))?;
    if md.file_type().is_block_device() {
        let mut size: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer we pass.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
        if rc != 0 {
            return Err(Error::from(io::Error::last_os_error())
                .wrap(format!("reading the size of {}", path.display()))
                .with_kind(Kind::Slot));
        }
        Ok(size)
    } else if md.file_type().is_file() {
        Ok(md.len())
    } else {
        bail!(
            Slot,
            "slot {} is neither a block device nor a regular file",
            path.display()
        )
    }
}

// _IOR(0x12, 114, size_t) and _IO(0x12, 97)
const BLKGETSIZE64: libc::c_ulong = if cfg!(target_pointer_width = "64") {
    0x8008_1272
} else {
    0x8004_1272
};
const BLKFLSBUF: libc::c_ulong = 0x1261;

/// A slot opened for writing.
pub struct SlotWriter {
    file: File,
    /// The same device opened `O_DIRECT` (transfers in whole
    /// [`direct_io::ALIGN`] units).
    direct: Option<File>,
    path: PathBuf,
    block: bool,
    capacity: u64,
    /// Next write position.
    pos: u64,
    /// Write-back has been started for everything below this.
    started: u64,
    /// Write-back has completed for everything below this.
    written_back: u64,
    /// Everything below this is known durable.
    durable: u64,
    /// The device has completed the writes of everything below this (it
    /// may still hold them in a volatile cache until the next sync).
    completed: u64,
    sync_bytes: u64,
}

impl SlotWriter {
    /// Open `path` for writing without truncating. A block device is opened
    /// `O_EXCL`, which fails while it is mounted. `booted` is the booted
    /// slot's path: writing the same device is refused.
    pub fn open(path: &Path, booted: &Path, sync_bytes: u64) -> Result<SlotWriter> {
        if same_slot(path, booted)? {
            bail!(
                Slot,
                "slot {} is the same device as the booted slot {}: refusing to write it",
                path.display(),
                booted.display()
            );
        }
        let md =
            std::fs::metadata(path).kind_context(Kind::Slot, format!("slot {}", path.display()))?;
        let block = md.file_type().is_block_device();
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if block {
            opts.custom_flags(libc::O_EXCL | libc::O_CLOEXEC);
        } else {
            opts.custom_flags(libc::O_CLOEXEC);
        }
        let file = opts.open(path).map_err(|e| {
            if block && e.raw_os_error() == Some(libc::EBUSY) {
                err!(
                    Slot,
                    "slot {} is in use (mounted or held open exclusively): refusing to write it",
                    path.display()
                )
            } else {
                Error::from(e)
                    .wrap(format!("opening slot {} for writing", path.display()))
                    .with_kind(Kind::Slot)
            }
        })?;
        let capacity = capacity_of(&file, path)?;
        let direct = if block {
            direct_io::open(path, true)
        } else {
            None
        };
        Ok(SlotWriter {
            file,
            direct,
            path: path.to_path_buf(),
            block,
            capacity,
            pos: 0,
            started: 0,
            written_back: 0,
            durable: 0,
            completed: 0,
            sync_bytes,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Everything below this offset has reached the medium.
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// Everything below this offset has been handed to the device and the
    /// device has completed the writes: reading it back now reads what the
    /// device stored (no page cache holds newer bytes).
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Continue writing at `offset` (resume). Data below it is taken as
    /// already durable.
    pub fn seek(&mut self, offset: u64) {
        self.pos = offset;
        self.started = offset;
        self.written_back = offset;
        self.durable = offset;
        self.completed = offset;
    }

    /// Write `data` at the current position. Returns true when a write-back
    /// step was taken (a good moment to [`sync`](Self::sync) and record
    /// progress).
    pub fn write_all(&mut self, data: &[u8]) -> Result<bool> {
        let end = self.pos.saturating_add(data.len() as u64);
        if end > self.capacity {
            bail!(
                Slot,
                "write past the end of slot {} ({} bytes)",
                self.path.display(),
                self.capacity
            );
        }
        let direct = self.write_direct(data)?;
        if direct < data.len() {
            let at = self.pos + direct as u64;
            self.file.write_all_at(&data[direct..], at).kind_context(
                Kind::Slot,
                format!("writing slot {} at offset {at}", self.path.display()),
            )?;
        } else if self.completed == self.pos {
            // A direct write is complete when it returns.
            self.completed = end;
        }
        self.pos = end;
        if self.pos - self.started >= self.sync_bytes {
            return self.step();
        }
        Ok(false)
    }

    /// Write the aligned leading part of `data` at the current position
    /// through the direct descriptor; returns how many bytes it took (0
    /// when there is none, or nothing is aligned). A device that refuses
    /// the alignment gets every later byte through the page cache.
    fn write_direct(&mut self, data: &[u8]) -> Result<usize> {
        let Some(file) = &self.direct else {
            return Ok(0);
        };
        let n = direct_io::split(data, self.pos);
        if n == 0 {
            return Ok(0);
        }
        match file.write_all_at(&data[..n], self.pos) {
            Ok(()) => Ok(n),
            Err(e) if direct_io::refused(&e) => {
                log::warn!(
                    "slot {}: the device refused a direct write ({e}); writing through the page cache",
                    self.path.display()
                );
                self.direct = None;
                Ok(0)
            }
            Err(e) => Err(Error::from(e)
                .wrap(format!(
                    "writing slot {} at offset {}",
                    self.path.display(),
                    self.pos
                ))
                .with_kind(Kind::Slot)),
        }
    }

    /// One bounded write-back step: wait for the range started last time,
    /// then start write-back of what was written since. Nothing here
    /// flushes the device's volatile cache; only [`sync`](Self::sync) and
    /// [`finish`](Self::finish) make data durable.
    fn step(&mut self) -> Result<bool> {
        let fd = self.file.as_raw_fd();
        sync_range(
            fd,
            self.written_back,
            self.started - self.written_back,
            WAIT_ALL,
        )
        .with_context(|| format!("flushing slot {}", self.path.display()))?;
        self.written_back = self.started;
        self.completed = self.completed.max(self.written_back);
        sync_range(
            fd,
            self.started,
            self.pos - self.started,
            libc::SYNC_FILE_RANGE_WRITE,
        )
        .with_context(|| format!("flushing slot {}", self.path.display()))?;
        self.started = self.pos;
        Ok(true)
    }

    /// Make everything durable and drop the slot from the page cache, so a
    /// following read-back reads the medium.
    pub fn finish(mut self) -> Result<()> {
        self.file
            .sync_data()
            .kind_context(Kind::Slot, format!("fdatasync {}", self.path.display()))?;
        self.durable = self.pos;
        self.completed = self.pos;
        drop_cache(&self.file, self.block);
        Ok(())
    }

    /// Make everything written so far durable (before recording progress
    /// that relies on it).
    pub fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .kind_context(Kind::Slot, format!("fdatasync {}", self.path.display()))?;
        self.started = self.pos;
        self.written_back = self.pos;
        self.durable = self.pos;
        self.completed = self.pos;
        Ok(())
    }
}

const WAIT_ALL: libc::c_uint = libc::SYNC_FILE_RANGE_WAIT_BEFORE
    | libc::SYNC_FILE_RANGE_WRITE
    | libc::SYNC_FILE_RANGE_WAIT_AFTER;

fn sync_range(fd: i32, offset: u64, len: u64, flags: libc::c_uint) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: plain syscall on a file descriptor we own.
    let rc =
        unsafe { libc::sync_file_range(fd, offset as libc::off64_t, len as libc::off64_t, flags) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // Some filesystems (FUSE, network) do not implement it: fall back.
        if matches!(
            e.raw_os_error(),
            Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
        ) {
            // SAFETY: as above.
            if unsafe { libc::fdatasync(fd) } != 0 {
                return Err(Error::from(io::Error::last_os_error()).with_kind(Kind::Slot));
            }
            return Ok(());
        }
        return Err(Error::from(e).with_kind(Kind::Slot));
    }
    Ok(())
}

/// Ask the kernel to forget cached pages of a slot. Best effort: failure
/// only means the read-back may be served from memory.
pub fn drop_cache(file: &File, block: bool) {
    let fd = file.as_raw_fd();
    if block {
        // SAFETY: BLKFLSBUF takes no argument beyond the fd.
        unsafe { libc::ioctl(fd, BLKFLSBUF, 0) };
    }
    drop_range(file, 0, 0);
}

/// Ask the kernel to forget the cached pages of one range of a slot (they
/// are clean once their write-back completed; `len` 0 means to the end).
/// Best effort, as [`drop_cache`].
pub fn drop_range(file: &File, offset: u64, len: u64) {
    let fd = file.as_raw_fd();
    // SAFETY: advisory call on our fd.
    // The 64-bit variant: a 32-bit off_t would wrap past 2 GiB on armv7.
    unsafe {
        libc::posix_fadvise64(
            fd,
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
}

/// A slot opened for reading (the active slot as a delta source, or any
/// slot for read-back).
pub struct SlotReader {
    file: File,
    /// The same device opened `O_DIRECT` (transfers in whole
    /// [`direct_io::ALIGN`] units).
    direct: Option<File>,
    path: PathBuf,
    block: bool,
    capacity: u64,
    /// Aligned bounce buffer for reads of the medium into the caller's
    /// unaligned buffers ([`SlotReader::read_medium_at`]); empty until
    /// first used.
    bounce: RefCell<AlignedBuf>,
}

/// Bytes the bounce buffer of a [`SlotReader`] holds at most: a delta's
/// source is read through it in pieces of this size.
const BOUNCE: usize = 256 * 1024;

impl SlotReader {
    pub fn open(path: &Path) -> Result<SlotReader> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .kind_context(
                Kind::Slot,
                format!("opening slot {} for reading", path.display()),
            )?;
        let block = file
            .metadata()
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let capacity = capacity_of(&file, path)?;
        let direct = if block {
            direct_io::open(path, false)
        } else {
            None
        };
        Ok(SlotReader {
            file,
            direct,
            path: path.to_path_buf(),
            block,
            capacity,
            bounce: RefCell::new(AlignedBuf::default()),
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read exactly `buf.len()` bytes at `offset`.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_exact_at(buf, offset).kind_context(
            Kind::Slot,
            format!("reading slot {} at offset {offset}", self.path.display()),
        )
    }

    /// Hash the first `len` bytes, reading in large blocks; `tick` is called
    /// with the bytes read so far between blocks.
    pub fn hash_prefix(&self, len: u64, tick: &mut dyn FnMut(u64) -> Result<()>) -> Result<Sha256> {
        let mut h = Hasher::new();
        let mut buf = AlignedBuf::new(READ_BLOCK);
        self.hash_range(&mut h, &mut buf, 0, len, tick)?;
        if self.block || len > 0 {
            // Reading a whole slot should not push everything else out of
            // the page cache.
            drop_cache(&self.file, false);
        }
        Ok(h.finish())
    }

    /// Feed the bytes from `from` to `to` into `h`, read from the medium:
    /// through the direct descriptor where the device has one (rounding the
    /// last read up to a whole unit when the slot is large enough), and
    /// otherwise through the page cache after dropping the range from it.
    /// `tick` gets the offset reached after each block.
    pub fn hash_range(
        &self,
        h: &mut Hasher,
        buf: &mut AlignedBuf,
        from: u64,
        to: u64,
        tick: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        if to > self.capacity {
            bail!(
                Slot,
                "slot {} holds {} bytes, fewer than the {to} to hash",
                self.path.display(),
                self.capacity
            );
        }
        if self.direct.is_none() && to > from {
            drop_range(&self.file, from, to - from);
        }
        let mut off = from;
        while off < to {
            let n = (to - off).min(buf.len() as u64) as usize;
            self.read_block(&mut buf[..], off, n)?;
            h.update(&buf[..n]);
            off += n as u64;
            tick(off)?;
        }
        Ok(())
    }

    /// Read `n` bytes at `off` into `buf` from the medium, as
    /// [`hash_range`](Self::hash_range) reads them (the range is dropped
    /// from the page cache first where there is no direct descriptor), for
    /// a caller that hashes on another thread.
    pub fn read_back(&self, buf: &mut AlignedBuf, off: u64, n: usize) -> Result<()> {
        if off.saturating_add(n as u64) > self.capacity || n > buf.len() {
            bail!(
                Slot,
                "slot {} holds {} bytes, fewer than the {} to read back",
                self.path.display(),
                self.capacity,
                off.saturating_add(n as u64)
            );
        }
        if self.direct.is_none() && n > 0 {
            drop_range(&self.file, off, n as u64);
        }
        self.read_block(&mut buf[..], off, n)
    }

    /// Read exactly `buf.len()` bytes at `offset` as the medium holds
    /// them: every whole [`direct_io::ALIGN`] unit inside the slot through
    /// the direct descriptor, where the device has one, and only the rest
    /// (a last partial unit) through the page cache; these are the bytes
    /// [`SlotReader::hash_range`] hashes. The page cache of a block device
    /// can differ from the medium: a mounted ext4 keeps its journal
    /// superblock changed in memory and never writes it, so a delta applied
    /// from the cached bytes of a running root would not produce the image
    /// the source hash promised. Without a direct descriptor (a file, or a
    /// device that refuses `O_DIRECT`) the page cache is all there is.
    pub fn read_medium_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let Some(direct) = &self.direct else {
            return self.read_exact_at(buf, offset);
        };
        let unit = direct_io::ALIGN as u64;
        let units_end = self.capacity / unit * unit;
        let end = offset.saturating_add(buf.len() as u64);
        let mut bounce = self.bounce.borrow_mut();
        let mut pos = offset;
        while pos < end {
            let done = (pos - offset) as usize;
            if pos >= units_end {
                return self.read_exact_at(&mut buf[done..], pos);
            }
            let start = pos / unit * unit;
            let stop = end.min(units_end).div_ceil(unit) * unit;
            let stop = stop.min(start + BOUNCE as u64);
            bounce.set_len((stop - start) as usize);
            match direct.read_exact_at(&mut bounce[..], start) {
                Ok(()) => {}
                Err(e) if direct_io::refused(&e) => {
                    return self.read_exact_at(&mut buf[done..], pos);
                }
                Err(e) => {
                    return Err(Error::from(e)
                        .wrap(format!(
                            "reading slot {} at offset {start}",
                            self.path.display()
                        ))
                        .with_kind(Kind::Slot));
                }
            }
            let from = (pos - start) as usize;
            let take = (stop.min(end) - pos) as usize;
            buf[done..done + take].copy_from_slice(&bounce[from..from + take]);
            pos += take as u64;
        }
        Ok(())
    }

    /// Read `n` bytes at `off` into the start of `buf`, direct when the
    /// offset is aligned and a whole number of units (at most `buf.len()`)
    /// covering them fits in the slot; otherwise as
    /// [`SlotReader::read_medium_at`] reads them.
    fn read_block(&self, buf: &mut [u8], off: u64, n: usize) -> Result<()> {
        if let Some(file) = &self.direct {
            let whole = n.div_ceil(direct_io::ALIGN) * direct_io::ALIGN;
            if whole <= buf.len()
                && off.saturating_add(whole as u64) <= self.capacity
                && direct_io::split(&buf[..whole], off) == whole
            {
                match file.read_exact_at(&mut buf[..whole], off) {
                    Ok(()) => return Ok(()),
                    Err(e) if direct_io::refused(&e) => {}
                    Err(e) => {
                        return Err(Error::from(e)
                            .wrap(format!(
                                "reading slot {} at offset {off}",
                                self.path.display()
                            ))
                            .with_kind(Kind::Slot));
                    }
                }
            }
        }
        self.read_medium_at(&mut buf[..n], off)
    }
}

impl crate::delta::ReadAt for SlotReader {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_medium_at(buf, offset)
    }
}

/// Block size for reading slots back.
pub const READ_BLOCK: usize = 1024 * 1024;

/// Read into `buf` until it is full or the reader ends; returns the count.
pub fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_parsing() {
        assert_eq!(
            parse_cmdline("root=/dev/x updraft.slot=B quiet"),
            Some(SlotName::B)
        );
        assert_eq!(
            parse_cmdline("updraft.slot=A updraft.slot=b"),
            Some(SlotName::B)
        );
        assert_eq!(parse_cmdline("updraft.slot=C"), None);
        assert_eq!(parse_cmdline("root=/dev/x"), None);
        assert_eq!(parse_cmdline("xupdraft.slot=A"), None);
    }

    #[test]
    fn without_updraft_slot_the_root_device_names_the_booted_slot() {
        let d = crate::test_support::scratch_dir("slot", "root");
        let (a, b) = (d.join("mmcblk0p2"), d.join("mmcblk0p3"));
        std::fs::write(&a, "").unwrap();
        std::fs::write(&b, "").unwrap();
        let link = d.join("by-partuuid-3");
        std::os::unix::fs::symlink(&b, &link).unwrap();
        let cmdline = d.join("cmdline");
        // (command line, booted slot or the error's words)
        let rows: [(String, Result<SlotName, &str>); 6] = [
            (format!("root={} rootwait", a.display()), Ok(SlotName::A)),
            (format!("root={} rw", link.display()), Ok(SlotName::B)),
            (
                format!("root={} updraft.slot=A", b.display()),
                Ok(SlotName::A),
            ),
            (
                format!("root=/dev/sda9 root={}", b.display()),
                Ok(SlotName::B),
            ),
            (
                "root=/dev/nonexistent9".into(),
                Err("root=/dev/nonexistent9 is neither slot A"),
            ),
            (
                "console=ttyS0".into(),
                Err("no updraft.slot=A or updraft.slot=B and no root="),
            ),
        ];
        for (line, want) in rows {
            std::fs::write(&cmdline, &line).unwrap();
            match (booted_slot(&cmdline, &a, &b), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{line}"),
                (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{line}: {e}"),
                (got, want) => panic!("{line}: {got:?}, expected {want:?}"),
            }
        }
    }
}
