//! libfaketime, the test's control of a process's clock: preloaded into
//! an `updraft` process (`LD_PRELOAD`, `FAKETIME`), it moves that process's
//! wall clock and nothing else. It cannot be preloaded into a binary that
//! runs under qemu-user.

use std::path::PathBuf;

/// The preloadable library, where Debian's `libfaketime` puts it.
pub fn library() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}
