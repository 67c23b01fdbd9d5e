//! SIGTERM and SIGINT for the daemon: a flag, and a self-pipe that wakes
//! `poll(2)`.
//!
//! The handler only stores to an atomic and writes one byte to a pipe
//! (both async-signal-safe). The flag is what ends a step (the next tick
//! fails with `Kind::Stopped`); the pipe makes a signal that lands after
//! the loop last looked at the flag end its sleep at once instead of at
//! its next deadline. SIGPIPE is ignored, so a client that goes away
//! mid-reply cannot kill the daemon. This module never decides what a stop
//! means: that is the daemon loop's business.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::err;
use crate::error::Result;

/// Whether SIGTERM or SIGINT has arrived.
pub(crate) fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

static STOP: AtomicBool = AtomicBool::new(false);

/// The self-pipe: the signal handler writes to the second end, the loop
/// polls the first. Made once and kept for the life of the process.
static WAKE: OnceLock<(OwnedFd, OwnedFd)> = OnceLock::new();

/// The write end of [`WAKE`] as the signal handler sees it (-1: none yet).
static WAKE_WRITE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    let fd = WAKE_WRITE.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; `fd` is the non-blocking
        // write end of a pipe that is never closed. A full pipe (EAGAIN)
        // already wakes the loop, so the result does not matter.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
}

/// The read end of the self-pipe, made on first use.
pub(crate) fn wake_pipe() -> Result<BorrowedFd<'static>> {
    if let Some((r, _)) = WAKE.get() {
        return Ok(r.as_fd());
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(err!(
            Io,
            "creating the signal wake-up pipe: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: both descriptors were just created and are owned by nobody
    // else.
    let pair = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (r, w) = WAKE.get_or_init(|| pair);
    WAKE_WRITE.store(w.as_raw_fd(), Ordering::SeqCst);
    Ok(r.as_fd())
}

/// Empty the self-pipe after it woke `poll(2)`.
pub(crate) fn drain_wake_pipe(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a local buffer of the length given; the descriptor
    // is non-blocking, so this ends with EAGAIN once the pipe is empty.
    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

pub(crate) fn install() -> Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    wake_pipe()?;
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(sig, &action) }
            .map_err(|e| err!(Io, "installing the {sig} handler: {e}"))?;
    }
    // A client that goes away mid-reply must not kill the daemon.
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // SAFETY: ignoring SIGPIPE is always sound.
    unsafe { sigaction(Signal::SIGPIPE, &ignore) }
        .map_err(|e| err!(Io, "ignoring SIGPIPE: {e}"))?;
    Ok(())
}
