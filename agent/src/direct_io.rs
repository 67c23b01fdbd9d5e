//! Direct I/O to block-device slots: page-aligned buffers, and when a
//! transfer may bypass the page cache.
//!
//! Writing an image through the page cache copies every byte twice in the
//! kernel (into the cache, and out of it again for the read-back) and makes
//! the kernel's write-back, not updraft, decide when bytes reach the medium.
//! On a block-device slot updraft therefore opens a second descriptor with
//! `O_DIRECT` and moves whole aligned blocks through it: the device reads
//! from and writes into updraft's own buffers, and a read-back through it
//! reads the medium, never a cached copy.
//!
//! `O_DIRECT` needs the buffer address, the file offset and the length to
//! be multiples of the device's logical block size. [`AlignedBuf`] gives
//! buffers whose start is aligned to [`ALIGN`] without `unsafe` (it
//! over-allocates and starts at the first aligned byte); [`split`] cuts a
//! transfer into the aligned part that may go direct and the rest, which
//! goes through the ordinary descriptor. Both descriptors name the same
//! device, so `fdatasync` on either makes both kinds of write durable.
//!
//! This module never decides what is written where, and never opens a
//! regular file with `O_DIRECT` (file-backed slots are for development and
//! tests, on file systems that may not support it): see [`crate::slot`].

use std::fs::{File, OpenOptions};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Alignment of [`AlignedBuf`] and the smallest direct transfer unit: the
/// page size, which is at least the logical block size of every device
/// updraft expects (512 or 4096 bytes).
pub const ALIGN: usize = 4096;

/// A byte buffer of a fixed length whose first byte is [`ALIGN`]-aligned.
/// It never reallocates once made, so the alignment holds for its life.
#[derive(Default)]
pub struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> AlignedBuf {
        let bytes = vec![0u8; len + ALIGN];
        let start = bytes.as_ptr().align_offset(ALIGN).min(ALIGN);
        AlignedBuf { bytes, start, len }
    }

    /// Bytes the buffer can hold without being made anew.
    fn spare(&self) -> usize {
        self.bytes.len().saturating_sub(self.start)
    }

    /// Make the buffer `len` bytes long, allocating a larger one only when
    /// it cannot hold them. The contents are unspecified afterwards.
    pub fn set_len(&mut self, len: usize) {
        if self.spare() < len {
            *self = AlignedBuf::new(len);
        } else {
            self.len = len;
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// How many leading bytes of a transfer from `buf` at file offset `offset`
/// may go through an `O_DIRECT` descriptor: all whole [`ALIGN`] units when
/// the offset and the address are aligned, otherwise none.
pub fn split(buf: &[u8], offset: u64) -> usize {
    if offset % ALIGN as u64 != 0 || (buf.as_ptr() as usize) % ALIGN != 0 {
        return 0;
    }
    buf.len() / ALIGN * ALIGN
}

/// Open `path` (a block device) a second time with `O_DIRECT`, for reading
/// or for reading and writing. `None` when the kernel refuses, in which case
/// every transfer goes through the page cache as before.
pub fn open(path: &Path, write: bool) -> Option<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let unit = logical_block_size(&file)?;
    if unit == 0 || unit > ALIGN || !unit.is_power_of_two() {
        return None;
    }
    Some(file)
}

/// Where the kernel refused a direct transfer for a reason the buffered
/// path does not share (alignment rules stricter than expected).
pub fn refused(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

// _IO(0x12, 104)
const BLKSSZGET: libc::c_ulong = 0x1268;

fn logical_block_size(f: &File) -> Option<usize> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer we pass.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKSSZGET, &mut size as *mut libc::c_int) };
    if rc != 0 {
        return None;
    }
    usize::try_from(size).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_aligned_and_keep_their_length() {
        for len in [0, 1, 4095, 4096, 1 << 20] {
            let b = AlignedBuf::new(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0, "len {len}");
        }
    }

    #[test]
    fn set_len_reuses_the_buffer_when_it_fits() {
        let mut b = AlignedBuf::new(8192);
        let p = b.as_ptr();
        b.set_len(100);
        assert_eq!(b.len(), 100);
        assert_eq!(b.as_ptr(), p);
        b.set_len(8192);
        assert_eq!(b.as_ptr(), p);
        b.set_len(1 << 20);
        assert_eq!(b.len(), 1 << 20);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
    }

    #[test]
    fn only_whole_aligned_units_go_direct() {
        let b = AlignedBuf::new(3 * ALIGN + 100);
        assert_eq!(split(&b, 0), 3 * ALIGN);
        assert_eq!(split(&b, ALIGN as u64 * 7), 3 * ALIGN);
        assert_eq!(split(&b, 512), 0, "unaligned offset");
        assert_eq!(split(&b[1..], 0), 0, "unaligned address");
        assert_eq!(split(&b[..100], 0), 0, "shorter than a unit");
    }
}
