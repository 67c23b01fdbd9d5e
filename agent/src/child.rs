//! Child processes the daemon waits for (health checks, the reboot
//! command), watched without busy polling.
//!
//! A [`Watched`] child carries a pidfd (`pidfd_open(2)`, Linux 5.3 and
//! later) that becomes readable when the child exits, so the daemon thread
//! can sleep in `poll(2)` on it together with the control socket and wake
//! exactly when the child is done, while still answering clients. On an
//! older kernel (or an emulator without the call) there is no pidfd; the
//! waiter then falls back to its bounded timeout (about a second), which is
//! slower to notice the exit but never spins.
//!
//! No signal handler is involved: a SIGCHLD handler would interrupt the
//! blocking reads of the helper threads' transfers. This module never
//! decides what a child's result means, and never waits unbounded: reaping
//! happens in [`Watched::try_wait`], or in [`Watched::kill`], which is only
//! called after the child was told to end.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, ExitStatus};

/// A running child and, where the kernel has it, a descriptor that becomes
/// readable when it exits.
pub(crate) struct Watched {
    child: Child,
    pidfd: Option<OwnedFd>,
}

impl Watched {
    /// Start `cmd` and open its pidfd.
    pub(crate) fn spawn(cmd: &mut Command) -> io::Result<Watched> {
        let child = cmd.spawn()?;
        let pidfd = pidfd_open(child.id());
        Ok(Watched { child, pidfd })
    }

    /// Readable once the child has exited; `None` without pidfd support.
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(AsFd::as_fd)
    }

    /// The child itself, for its pipes and its pid. Reaping it through
    /// this (`wait`) is the caller's business and ends what the pidfd
    /// says.
    pub(crate) fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The exit status if the child has exited (reaping it), without
    /// blocking.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// SIGKILL the child and reap it (a killed child exits at once).
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pidfd_open(pid, 0)`; `None` when the kernel does not have it (ENOSYS
/// before 5.3) or the process is already gone.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    let fd = libc::c_int::try_from(fd).ok()?;
    // SAFETY: the descriptor was just created for us and is owned by no one
    // else. pidfds are opened close-on-exec by the kernel.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

    #[test]
    fn the_pidfd_wakes_a_poll_when_the_child_exits() {
        let mut w =
            Watched::spawn(Command::new("sh").args(["-c", "sleep 0.3"])).expect("starting sh");
        assert_eq!(w.try_wait().expect("try_wait"), None);
        let Some(fd) = w.fd() else {
            // An old kernel or an emulator without pidfd_open: the
            // fallback is the caller's timeout, nothing to test here.
            eprintln!("pidfd_open is not available here");
            w.kill();
            return;
        };
        // A timeout far beyond the child's life: poll returns 1 only
        // because the exit made the pidfd readable.
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let n = poll(&mut fds, PollTimeout::from(30_000u16)).expect("poll");
        assert_eq!(n, 1, "the pidfd became readable");
        let status = w.try_wait().expect("try_wait").expect("exited");
        assert!(status.success());
    }

    #[test]
    fn a_killed_child_is_reaped() {
        let mut w =
            Watched::spawn(Command::new("sh").args(["-c", "sleep 30"])).expect("starting sh");
        w.kill();
        assert!(w.try_wait().expect("try_wait").is_some());
    }
}
