//! Writing a generation: the tree a checked [`Index`] lists, created below
//! a new directory without ever following a link.
//!
//! The daemon writes as root into a directory an application (or whoever
//! wrote the previous generation) could have changed, from a listing an
//! attacker may have shaped within the index rules. So every entry is
//! created relative to its directory's descriptor, opened segment by
//! segment with `O_NOFOLLOW | O_DIRECTORY`; files are created `O_EXCL |
//! O_NOFOLLOW` with their final mode; the bytes of each file are counted
//! and hashed as they are written and must be the listed size and hash. A
//! symlink the tree itself holds is created, never followed: the next
//! entry below it fails, as the index rules say it must.
//!
//! A file of the active generation with the listed size, executable bit
//! and hash is hard-linked instead of fetched (apps keep their state in
//! `data/`, not in a generation, so a file shared by two generations is
//! never written); the hash is taken through the new link, so what was
//! linked is what was checked.
//!
//! A slot's boot files ([`Style::BootFiles`]) are written the same way
//! into an empty directory that exists (often the mount point of a FAT
//! partition): no hard links (FAT has none, and two partitions share no
//! inode), so a file of the booted slot's boot files with the listed size
//! is copied, hashed as it is, instead of fetched; no modes (FAT keeps
//! none, and refuses to be told); no symlinks (the index is refused
//! before this module runs).
//!
//! This module never fetches (its [`Blobs`] does), never writes outside
//! the new directory, and never activates anything.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, symlinkat, unlinkat};

use super::index::{Entry, Index};
use crate::error::{Context, Result};
use crate::hash::{Hasher, Sha256};
use crate::{bail, err};

/// Where a file's bytes come from when no directory reused holds them.
pub trait Blobs {
    /// The bytes of the file listed with `sha256` and `size` (they are
    /// counted and hashed as they are written: a source that lies fails
    /// the generation).
    fn open(&mut self, sha256: &Sha256, size: u64) -> Result<Box<dyn Read + '_>>;
}

/// What writing a generation took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Files linked from the active generation, and their bytes.
    pub reused: u64,
    pub reused_bytes: u64,
    /// Files written from their blobs, and their bytes.
    pub fetched: u64,
    pub fetched_bytes: u64,
}

/// Where a tree lands, and so how it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// An app's generation: a new directory on the data partition, modes
    /// as listed, unchanged files hard-linked.
    Generation,
    /// A slot's boot files: an empty directory that exists, modes as the
    /// file system gives them, unchanged files copied.
    BootFiles,
}

/// Every open of the tree's files and directories: `openat` is glibc's
/// 32-bit-offset call on armv7, where a file of 2 GiB or more then fails
/// with `EOVERFLOW` unless the flag says the caller handles large files
/// (on 64-bit targets the flag is 0 and changes nothing).
const LARGE: OFlag = OFlag::O_LARGEFILE;

/// A directory of the tree, never through a link.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(LARGE)
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// A file of a generation being written: created here or not at all, never
/// through a link.
const NEW_FILE_FLAGS: OFlag = OFlag::O_WRONLY
    .union(LARGE)
    .union(OFlag::O_CREAT)
    .union(OFlag::O_EXCL)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// A file read to hash or link it, never through a link.
const READ_FLAGS: OFlag = OFlag::O_RDONLY
    .union(LARGE)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Open the directory `rel` (segments separated by `/`, `""` for `root`
/// itself) below `root`, never following a link.
fn open_dir(root: &OwnedFd, rel: &str) -> nix::Result<OwnedFd> {
    let mut fd = openat(root, ".", DIR_FLAGS, Mode::empty())?;
    for seg in rel.split('/').filter(|s| !s.is_empty()) {
        fd = openat(&fd, seg, DIR_FLAGS, Mode::empty())?;
    }
    Ok(fd)
}

/// `path` split into its directory and its last segment.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// The one directory descriptor kept open: entries come in path order, so
/// most share the directory of the entry before them.
struct DirCache {
    root: OwnedFd,
    /// The directory last asked for, by its path below `root`.
    last: (String, OwnedFd),
}

impl DirCache {
    fn new(root: OwnedFd) -> nix::Result<DirCache> {
        let top = open_dir(&root, "")?;
        Ok(DirCache {
            root,
            last: (String::new(), top),
        })
    }

    fn get(&mut self, rel: &str) -> nix::Result<&OwnedFd> {
        if self.last.0 != rel {
            self.last = (rel.to_string(), open_dir(&self.root, rel)?);
        }
        Ok(&self.last.1)
    }
}

/// Hash what `fd` holds, reading at most `limit + 1` bytes.
fn hash_fd(fd: OwnedFd, limit: u64) -> std::io::Result<(u64, Sha256)> {
    let mut f = File::from(fd).take(limit.saturating_add(1));
    let mut h = Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut n: u64 = 0;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, h.finish()))
}

/// Write `index`'s tree into `dest`, which must not exist yet (a
/// generation) or be empty (boot files); files a directory of `reuse`
/// (the active generation and an interrupted attempt's, the booted
/// slot's boot files) holds with the same size and hash, and for a
/// generation the same executable bit, are linked or copied from the
/// first that does. On error `dest` is left as far as it got, for the
/// caller to remove or to reuse.
pub fn write(
    dest: &Path,
    index: &Index,
    reuse: &[&Path],
    blobs: &mut dyn Blobs,
    style: Style,
) -> Result<Written> {
    if style == Style::Generation {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(dest)
            .with_context(|| format!("creating {}", dest.display()))?;
    }
    let open = |p: &Path| {
        openat(nix::fcntl::AT_FDCWD, p, DIR_FLAGS, Mode::empty()).and_then(DirCache::new)
    };
    let mut dirs = open(dest).with_context(|| format!("opening {}", dest.display()))?;
    // A directory that cannot be opened gives nothing.
    let mut reuse_dirs: Vec<DirCache> = reuse.iter().filter_map(|p| open(p).ok()).collect();
    let mut written = Written::default();
    for entry in &index.entries {
        let path = entry.path();
        let (dir, leaf) = split(path);
        let at = |e: nix::Error| err!(Io, "{}: {path}: {e}", dest.display());
        match entry {
            Entry::Dir { .. } => {
                let parent = dirs.get(dir).map_err(at)?;
                mkdirat(parent, leaf, Mode::from_bits_truncate(0o755)).map_err(at)?;
            }
            Entry::Symlink { target, .. } => {
                let parent = dirs.get(dir).map_err(at)?;
                symlinkat(target.as_str(), parent, leaf).map_err(at)?;
            }
            Entry::File {
                executable,
                size,
                sha256,
                ..
            } => {
                let mode = if *executable { 0o755 } else { 0o644 };
                let mut reused = false;
                for r in reuse_dirs.iter_mut() {
                    reused = match style {
                        Style::Generation => {
                            link_same(r, &mut dirs, dir, leaf, mode, *size, sha256)?
                        }
                        Style::BootFiles => copy_same(r, &mut dirs, dir, leaf, *size, sha256)?,
                    };
                    if reused {
                        break;
                    }
                }
                if reused {
                    written.reused += 1;
                    written.reused_bytes += size;
                    continue;
                }
                let parent = dirs.get(dir).map_err(at)?;
                let fd = openat(parent, leaf, NEW_FILE_FLAGS, Mode::from_bits_truncate(mode))
                    .map_err(at)?;
                let mut file = File::from(fd);
                if style == Style::Generation {
                    // The umask must not narrow the listed mode.
                    file.set_permissions(std::fs::Permissions::from_mode(mode))
                        .with_context(|| format!("{}: {path}", dest.display()))?;
                }
                let n = copy_checked(blobs.open(sha256, *size)?, &mut file, *size, sha256)
                    .map_err(|e| e.wrap(format!("{}: {path}", dest.display())))?;
                file.sync_all()
                    .with_context(|| format!("{}: {path}", dest.display()))?;
                written.fetched += 1;
                written.fetched_bytes += n;
            }
        }
    }
    // Every directory's entries made durable, deepest first: a file's data
    // is synced as it is written, and a name only counts once its
    // directory is (POSIX promises no more; `syncfs` is not passed on by
    // every file system, FUSE among them).
    for entry in index.entries.iter().rev() {
        if let Entry::Dir { .. } = entry {
            let path = entry.path();
            let fd = open_dir(&dirs.root, path)
                .map_err(|e| err!(Io, "{}: {path}: {e}", dest.display()))?;
            nix::unistd::fsync(&fd)
                .map_err(|e| err!(Io, "syncing {}: {path}: {e}", dest.display()))?;
        }
    }
    nix::unistd::fsync(&dirs.root).with_context(|| format!("syncing {}", dest.display()))?;
    Ok(written)
}

/// Copy `from` into `to`, at most `size` bytes; the bytes must be exactly
/// `size` long and hash to `sha256`.
fn copy_checked(
    mut from: Box<dyn Read + '_>,
    to: &mut File,
    size: u64,
    sha256: &Sha256,
) -> Result<u64> {
    let mut h = Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut n: u64 = 0;
    loop {
        let k = from.read(&mut buf).context("reading its blob")?;
        if k == 0 {
            break;
        }
        n += k as u64;
        if n > size {
            bail!(
                Integrity,
                "its blob holds more than the {size} bytes listed"
            );
        }
        h.update(&buf[..k]);
        to.write_all(&buf[..k]).context("writing")?;
    }
    if n != size {
        bail!(Integrity, "its blob holds {n} bytes, not the {size} listed");
    }
    let got = h.finish();
    if got != *sha256 {
        bail!(
            Integrity,
            "its blob hashes to {}, not the listed {}",
            got.short(),
            sha256.short()
        );
    }
    Ok(n)
}

/// `dir/leaf` below `from` opened without following a link, when it is a
/// regular file of `size` bytes; `None` for anything else.
fn open_regular(
    from: &mut DirCache,
    dir: &str,
    leaf: &str,
    size: u64,
) -> Option<(File, std::fs::Metadata)> {
    let src_dir = from.get(dir).ok()?;
    let fd = openat(src_dir, leaf, READ_FLAGS, Mode::empty()).ok()?;
    let file = File::from(fd);
    let meta = file.metadata().ok()?;
    (meta.is_file() && meta.len() == size).then_some((file, meta))
}

/// Copy `dir/leaf` of the booted slot's boot files into the new ones when
/// it is a regular file of `size` bytes hashing to `sha256` (hashed as it
/// is copied). Whether it was copied; a file that does not qualify is no
/// error, and what was written of it is removed.
fn copy_same(
    from: &mut DirCache,
    to: &mut DirCache,
    dir: &str,
    leaf: &str,
    size: u64,
    sha256: &Sha256,
) -> Result<bool> {
    let Some((src, _)) = open_regular(from, dir, leaf, size) else {
        return Ok(false);
    };
    let dst_dir = to.get(dir).map_err(|e| err!(Io, "{dir}: {e}"))?;
    let fd = openat(
        dst_dir,
        leaf,
        NEW_FILE_FLAGS,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| err!(Io, "{dir}/{leaf}: {e}"))?;
    let mut file = File::from(fd);
    match copy_checked(Box::new(src), &mut file, size, sha256) {
        Ok(_) => {
            file.sync_all()
                .with_context(|| format!("syncing {dir}/{leaf}"))?;
            Ok(true)
        }
        Err(_) => {
            drop(file);
            let dst_dir = to.get(dir).map_err(|e| err!(Io, "{dir}: {e}"))?;
            unlinkat(dst_dir, leaf, UnlinkatFlags::NoRemoveDir)
                .map_err(|e| err!(Io, "removing a copy that did not match {dir}/{leaf}: {e}"))?;
            Ok(false)
        }
    }
}

/// Link `dir/leaf` of the active generation into the new one when it is a
/// regular file of `size` bytes, mode `mode` and hash `sha256` (checked
/// through the new link). Whether it was linked; a file that does not
/// qualify is no error.
fn link_same(
    from: &mut DirCache,
    to: &mut DirCache,
    dir: &str,
    leaf: &str,
    mode: u32,
    size: u64,
    sha256: &Sha256,
) -> Result<bool> {
    let Some((_, meta)) = open_regular(from, dir, leaf, size) else {
        return Ok(false);
    };
    if meta.mode() & 0o7777 != mode {
        return Ok(false);
    }
    let Ok(src_dir) = from.get(dir) else {
        return Ok(false);
    };
    let Ok(dst_dir) = to.get(dir) else {
        return Ok(false);
    };
    // linkat without AT_SYMLINK_FOLLOW links the entry itself, never what
    // a symlink swapped in since would point at.
    if linkat(src_dir, leaf, dst_dir, leaf, AtFlags::empty()).is_err() {
        return Ok(false);
    }
    let linked = openat(dst_dir, leaf, READ_FLAGS, Mode::empty())
        .ok()
        .and_then(|fd| {
            let meta = File::from(fd.try_clone().ok()?).metadata().ok()?;
            (meta.is_file() && meta.mode() & 0o7777 == mode)
                .then(|| hash_fd(fd, size).ok())
                .flatten()
        });
    if linked == Some((size, *sha256)) {
        return Ok(true);
    }
    unlinkat(dst_dir, leaf, UnlinkatFlags::NoRemoveDir)
        .map_err(|e| err!(Io, "removing a link that did not match {dir}/{leaf}: {e}"))?;
    Ok(false)
}
