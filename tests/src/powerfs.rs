//! A FUSE filesystem whose power can be cut: after power-on it holds exactly
//! what POSIX promises to be durable, and nothing more.
//!
//! SIGKILL is not a power cut (the page cache survives it). Power-cut tests
//! put the slot files, the bootloader environment and updraft's `state_dir`
//! on a [`PowerFs`], run the real daemon and tools against it, cut the power
//! at a chosen mutating operation, kill the processes, power on and check
//! what is left. This module owns that filesystem; it never touches files
//! outside its mount point (apart from `/dev/fuse` and the fuse control
//! filesystem) and never makes anything durable that was not synced.
//!
//! # Durability model
//!
//! The filesystem lives in memory (regular files, directories, symlinks,
//! hard links). Every inode has a *current* state, which all operations see,
//! and a *durable* state, which is all that survives a cut:
//!
//! - `fsync`/`fdatasync` on a file makes its current data, size and
//!   attributes durable (both behave like `fsync`). Nothing else does: not
//!   `close`, `sync_file_range`, `posix_fadvise`, nor `sync()`/`syncfs()`
//!   (stricter than a disk filesystem, where `sync()` persists everything).
//! - A directory's entries (create, mknod, mkdir, symlink, link, unlink,
//!   rmdir, rename in or out of it) become durable only when that directory
//!   is fsynced, all of its entries at once. This is the strict POSIX
//!   reading: a file created and fsynced in a directory that was never
//!   fsynced is gone after a cut; a rename is durable once both directories
//!   are synced (only the target synced: both names exist afterwards; only
//!   the source synced: neither). A new inode is durable as what it was
//!   created as: an empty file, an empty directory, a symlink.
//! - Renames are atomic in the current namespace.
//! - At power-on the tree is rebuilt from the root through durable entries;
//!   every inode reached comes back in its durable state (a file whose data
//!   was never synced is empty), everything else is gone. Link counts follow
//!   the durable entries. A directory named by two durable entries (moved
//!   between two directories that were both synced mid-way) keeps only the
//!   first name in walk order.
//!
//! The model drops *every* change that was not synced. It never persists
//! some unsynced writes early or out of order, as a real disk may, so
//! software that relies on write ordering without fsync is not caught here;
//! what survives is assembled only from the states that files and
//! directories had when they were last synced.
//!
//! # Power
//!
//! Mutating operations are counted: every FUSE request of kind write,
//! setattr (truncate, chmod, chown, utimes), create, mknod, mkdir, symlink,
//! link, unlink, rmdir, rename, fallocate, fsync, fsyncdir that arrives
//! while the power is on, whether or not it succeeds (the kernel splits a
//! large `write(2)` into requests of at most 1 MiB, each one op).
//! [`PowerFs::arm_cut_after`]`(n)` cuts the power right after the n-th such
//! request from now has been applied and answered; from then on every
//! request fails with EIO and nothing changes. EIO rather than blocking: a
//! blocked request would hang the test itself whenever it touches the mount
//! (SQLite used in-process, a fixture read), while EIO lets every caller fail
//! fast so the test can SIGKILL and reap its children.
//!
//! The price: processes run on after the cut, and some software takes an
//! EIO for success. SQLite counts a directory it cannot open for its
//! post-delete directory fsync as synced, so a COMMIT can return OK after
//! the cut without being durable; libubootenv's `fw_setenv` exits 0 when its
//! fsync fails. Only results observed while [`PowerFs::is_dead`] was still
//! false prove anything: check it *after* seeing a result. Reads of pages
//! the kernel cached for a file opened before the cut may also still
//! succeed; nothing read that way can be written back here.
//!
//! [`PowerFs::restore_power`] unmounts (detaching the mount and aborting the
//! FUSE connection if a process still holds it, mounting the fuse control
//! filesystem if needed), reverts every inode to its durable state and
//! mounts a fresh connection at the same path, so no page, attribute or
//! dentry the kernel cached before the cut is visible. Writes reach the
//! server synchronously: no writeback cache is negotiated, and entries and
//! attributes are sent with a zero TTL, so after a cut even `stat` fails.
//! `flock` and POSIX locks are left to the kernel, which enforces them across
//! processes on this mount (they vanish at power-on, as with a reboot).
//! Shared writable `mmap` works through the page cache and reaches the
//! server when the kernel writes the pages back (`msync`, `fsync`).
//!
//! Mounting needs root and `/dev/fuse` ([`unavailable`] says why not).
//! `UPDRAFT_POWERFS_TRACE=1` logs every mutating request, numbered, on
//! stderr, which shows where a cut landed.

mod fuse;
mod model;
mod mount;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use self::fuse::{FuseFs, Shared, State, lock};
use self::model::Model;
use self::mount::Mounted;

/// Counters for reports; cumulative over the life of a [`PowerFs`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerStats {
    /// Mutating requests seen while powered (see the module docs).
    pub mutating_ops: u64,
    /// File `fsync`/`fdatasync` requests applied.
    pub fsyncs: u64,
    /// Directory fsync requests applied.
    pub dir_fsyncs: u64,
    /// Bytes accepted by write requests.
    pub bytes_written: u64,
    /// Power cuts so far.
    pub cuts: u64,
    /// What the most recent cut threw away.
    pub last_cut: Option<CutReport>,
}

/// What one power cut threw away, measured at the instant of the cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CutReport {
    /// The mutating-op count at which the power failed.
    pub after_op: u64,
    /// File bytes that will not read back: bytes written since the last
    /// fsync of files whose name is durable, plus the whole size of files
    /// whose name is not.
    pub bytes_dropped: u64,
    /// Directory entries not yet made durable (created, removed or renamed).
    pub entries_reverted: u64,
}

/// Why a [`PowerFs`] cannot be mounted here, or `None` if it can.
pub fn unavailable() -> Option<String> {
    if !crate::skip::is_root() {
        return Some("mounting a FUSE filesystem directly needs root".into());
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => None,
        Err(e) => Some(format!("cannot open /dev/fuse: {e}")),
    }
}

/// An in-memory filesystem mounted with FUSE whose power can be cut.
/// Dropping it unmounts it.
#[derive(Debug)]
pub struct PowerFs {
    shared: Shared,
    mountpoint: PathBuf,
    mounted: Option<Mounted>,
}

impl PowerFs {
    /// Mount an empty, powered filesystem at `mountpoint` (an existing
    /// directory). The root directory belongs to the calling user.
    pub fn mount(mountpoint: &Path) -> io::Result<PowerFs> {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let shared = Arc::new(Mutex::new(State::new(Model::new(uid, gid))));
        let mounted = mount::mount(mountpoint, FuseFs::new(Arc::clone(&shared), 0))?;
        Ok(PowerFs {
            shared,
            mountpoint: mountpoint.to_path_buf(),
            mounted: Some(mounted),
        })
    }

    /// Where the filesystem is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Mutating requests seen so far (the count [`arm_cut_after`] refers to).
    ///
    /// [`arm_cut_after`]: PowerFs::arm_cut_after
    pub fn mutating_ops(&self) -> u64 {
        lock(&self.shared).stats.mutating_ops
    }

    /// Cut the power right after the `n`-th mutating request from now has
    /// been applied; `n == 0` cuts now. Replaces an earlier armed cut; does
    /// nothing while the power is off.
    pub fn arm_cut_after(&self, n: u64) {
        let mut state = lock(&self.shared);
        if state.dead {
            return;
        }
        if n == 0 {
            state.cut();
        } else {
            state.cut_at = Some(state.stats.mutating_ops + n);
        }
    }

    /// Kill `pid` (SIGKILL) at the instant of the next cut, before the
    /// request that triggered it is answered: the process can do nothing
    /// after the power fails, as on real hardware.
    pub fn kill_on_cut(&self, pid: u32) {
        lock(&self.shared).victims.push(pid as i32);
    }

    /// Forget the processes registered with [`PowerFs::kill_on_cut`].
    pub fn clear_kill_on_cut(&self) {
        lock(&self.shared).victims.clear();
    }

    /// Cancel an armed cut.
    pub fn disarm(&self) {
        lock(&self.shared).cut_at = None;
    }

    /// Cut the power now.
    pub fn cut_now(&self) {
        lock(&self.shared).cut();
    }

    /// True once the power is off (cut now, or an armed cut was reached).
    pub fn is_dead(&self) -> bool {
        lock(&self.shared).dead
    }

    /// Make everything durable now, as a clean shutdown would: for setting
    /// up fixtures before the interesting part of a test. Not a filesystem
    /// request, so not counted. Does nothing while the power is off.
    pub fn sync_all(&self) {
        let mut state = lock(&self.shared);
        if !state.dead {
            state.model.sync_all();
        }
    }

    /// Power on: cut first if the power is still on, unmount, revert every
    /// file and directory to its durable state and mount afresh. Processes
    /// that used the filesystem must be killed before; any still holding it
    /// get ENOTCONN from the old, aborted connection.
    pub fn restore_power(&mut self) -> io::Result<()> {
        self.cut_now();
        if let Some(mounted) = self.mounted.take() {
            mounted.unmount()?;
        }
        let generation = {
            let mut state = lock(&self.shared);
            state.model.power_on();
            state.dirs.clear();
            state.dead = false;
            state.cut_at = None;
            state.generation += 1;
            state.generation
        };
        let fs = FuseFs::new(Arc::clone(&self.shared), generation);
        self.mounted = Some(mount::mount(&self.mountpoint, fs)?);
        Ok(())
    }

    /// Counters for reports.
    pub fn stats(&self) -> PowerStats {
        lock(&self.shared).stats
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        // Mounted's own Drop unmounts; do it here to keep the order explicit.
        if let Some(mounted) = self.mounted.take() {
            if let Err(e) = mounted.unmount() {
                eprintln!("powerfs: {e}");
            }
        }
    }
}
