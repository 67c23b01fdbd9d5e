//! The state lock: one updraft process acts on a device at a time.
//!
//! The daemon holds an exclusive `flock` on `state_dir/updraft.lock` for its
//! whole life; a one-shot `updraft install` takes the same lock, so it can
//! never race a running daemon (with a daemon running, the CLI hands the
//! job to it over the control socket instead). The lock is released by the
//! kernel when the process exits, however it exits.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::Result;
use crate::fsutil::ensure_dir;
use crate::{bail, err};

/// A held lock; released on drop or exit.
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Take the lock without waiting.
    pub fn acquire(path: &Path) -> Result<StateLock> {
        if let Some(dir) = path.parent() {
            ensure_dir(dir, 0o755)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| err!(Io, "opening lock {}: {e}", path.display()))?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                bail!(
                    Busy,
                    "another updraft process holds {} (is the daemon running?)",
                    path.display()
                );
            }
            bail!(Io, "locking {}: {e}", path.display());
        }
        Ok(StateLock { _file: file })
    }
}
