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
//! [`Watched::collect`] is the one bounded wait every program the daemon
//! runs goes through (the bootloader script, the rollback counter's
//! programs, the inhibit command, the reboot and health commands): it reads
//! whatever pipes the child has without blocking, keeps a capped copy of
//! each, sleeps on the pipes and the pidfd through the caller's wait (the
//! driver's ticker, or a plain `poll(2)`), and kills the child (its process
//! group, when it leads one) at the deadline. Callers only say what the
//! outcome means.
//!
//! No signal handler is involved: a SIGCHLD handler would interrupt the
//! blocking reads of the helper threads' transfers. This module never
//! decides what a child's result means, and never waits unbounded: reaping
//! happens in [`Watched::try_wait`], or in [`Watched::kill`], which is only
//! called after the child was told to end.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::error::Error;

/// Without a pidfd, once every pipe is closed, how often the exit is looked
/// for.
const NO_PIDFD_SLICE: Duration = Duration::from_millis(100);

/// A running child and, where the kernel has it, a descriptor that becomes
/// readable when it exits.
pub(crate) struct Watched {
    child: Child,
    pidfd: Option<OwnedFd>,
    /// Started as the leader of a process group of its own: a kill ends
    /// the group, with whatever the child started.
    group: bool,
}

/// One output stream of a child, capped.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    /// The first `cap` bytes it wrote.
    pub(crate) bytes: Vec<u8>,
    /// It wrote more than `cap` bytes.
    pub(crate) truncated: bool,
    open: bool,
    cap: usize,
}

/// What a child that exited left.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) status: ExitStatus,
    /// Empty when its standard output was not a pipe.
    pub(crate) stdout: Capture,
    /// Empty when its standard error was not a pipe.
    pub(crate) stderr: Capture,
}

/// How [`Watched::collect`] sleeps: until one of the descriptors is
/// readable or the duration has passed; an error ends the collection.
pub(crate) type Wait<'w> = dyn FnMut(&[BorrowedFd<'_>], Duration) -> Result<(), Error> + 'w;

/// Why [`Watched::collect`] ended without an exit status. The child was
/// killed and reaped in every case but [`Failure::Interrupted`].
#[derive(Debug)]
pub(crate) enum Failure {
    /// Reading its output failed.
    Read(io::Error),
    /// Asking whether it exited failed.
    Wait(io::Error),
    /// Still running at the deadline; what it had written on stderr.
    TimedOut(Capture),
    /// The caller's wait failed (the driver asked the step to end): the
    /// child is left running, as the caller may be stopping because of what
    /// the child does (a reboot command).
    Interrupted(Error),
}

impl Watched {
    /// Start `cmd` and open its pidfd.
    pub(crate) fn spawn(cmd: &mut Command) -> io::Result<Watched> {
        let child = cmd.spawn()?;
        let pidfd = pidfd_open(child.id());
        Ok(Watched {
            child,
            pidfd,
            group: false,
        })
    }

    /// Start `cmd` as the leader of a process group of its own, so that a
    /// kill also ends what it started.
    pub(crate) fn spawn_group(cmd: &mut Command) -> io::Result<Watched> {
        let mut w = Watched::spawn(cmd.process_group(0))?;
        w.group = true;
        Ok(w)
    }

    /// Wait for the child to exit, for at most `limit`, reading each of its
    /// piped outputs as it comes (the first `cap` bytes kept) so that a
    /// chatty child never blocks on a full pipe. `wait` sleeps until one of
    /// the descriptors it is given is readable or the duration has passed
    /// (the driver's ticker, or [`crate::progress::wait_readable`]).
    ///
    /// What the child wrote before exiting is still read; a background
    /// process it left holding the pipes is not waited for. On a
    /// [`Failure`] the child (its group) is killed and reaped, unless the
    /// caller's wait ended it.
    pub(crate) fn collect(
        &mut self,
        limit: Duration,
        cap: usize,
        wait: &mut Wait<'_>,
    ) -> Result<Finished, Failure> {
        let result = self.collect_inner(limit, cap, wait);
        if matches!(result, Err(ref f) if !matches!(f, Failure::Interrupted(_))) {
            self.kill();
        }
        result
    }

    fn collect_inner(
        &mut self,
        limit: Duration,
        cap: usize,
        wait: &mut Wait<'_>,
    ) -> Result<Finished, Failure> {
        let deadline = Instant::now() + limit;
        let mut out_pipe: Option<ChildStdout> = self.child.stdout.take();
        let mut err_pipe: Option<ChildStderr> = self.child.stderr.take();
        let mut stdout = Capture::new(cap, out_pipe.is_some());
        let mut stderr = Capture::new(cap, err_pipe.is_some());
        for fd in out_pipe
            .iter()
            .map(AsRawFd::as_raw_fd)
            .chain(err_pipe.iter().map(AsRawFd::as_raw_fd))
        {
            set_nonblocking(fd).map_err(Failure::Read)?;
        }
        loop {
            if let Some(status) = self.child.try_wait().map_err(Failure::Wait)? {
                stdout.drain(out_pipe.as_mut()).map_err(Failure::Read)?;
                stderr.drain(err_pipe.as_mut()).map_err(Failure::Read)?;
                return Ok(Finished {
                    status,
                    stdout,
                    stderr,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Failure::TimedOut(stderr));
            }
            let mut left = deadline - now;
            // A closed pipe polls as hung up at once: only open ones are
            // watched, so the wait sleeps until there is something to do.
            let mut fds = Vec::with_capacity(3);
            if let Some(p) = out_pipe.as_ref().filter(|_| stdout.open) {
                fds.push(p.as_fd());
            }
            if let Some(p) = err_pipe.as_ref().filter(|_| stderr.open) {
                fds.push(p.as_fd());
            }
            match self.fd() {
                Some(fd) => fds.push(fd),
                None if fds.is_empty() => left = left.min(NO_PIDFD_SLICE),
                None => {}
            }
            wait(&fds, left).map_err(Failure::Interrupted)?;
            stdout.drain(out_pipe.as_mut()).map_err(Failure::Read)?;
            stderr.drain(err_pipe.as_mut()).map_err(Failure::Read)?;
        }
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

    /// SIGKILL the child (its process group, when it leads one) and reap
    /// it (a killed child exits at once). Only called before the child was
    /// reaped, so its pid, and group id, cannot have been reused.
    pub(crate) fn kill(&mut self) {
        match i32::try_from(self.child.id()) {
            // SAFETY: signals the process group this child leads (started
            // by `spawn_group`), i.e. only what updraft started.
            Ok(pid) if self.group => unsafe {
                libc::kill(-pid, libc::SIGKILL);
            },
            _ => {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

impl Capture {
    fn new(cap: usize, open: bool) -> Capture {
        Capture {
            bytes: Vec::new(),
            truncated: false,
            open,
            cap,
        }
    }

    /// Read what the pipe has now, keeping up to the cap; marks its end.
    fn drain(&mut self, pipe: Option<&mut impl Read>) -> io::Result<()> {
        let Some(pipe) = pipe else {
            return Ok(());
        };
        let mut buf = [0u8; 8192];
        // Bounded, so a child that writes without pause cannot keep the
        // deadline from being looked at.
        for _ in 0..64 {
            if !self.open {
                break;
            }
            match pipe.read(&mut buf) {
                Ok(0) => self.open = false,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.bytes.len());
                    if n > room {
                        self.truncated = true;
                    }
                    self.bytes.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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

    fn no_tick() -> impl FnMut(&[BorrowedFd<'_>], Duration) -> Result<(), Error> {
        |fds, left| {
            crate::progress::wait_readable(fds, left);
            Ok(())
        }
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    }

    #[test]
    fn collect_keeps_both_outputs_and_the_exit_status() {
        let mut w = Watched::spawn_group(&mut sh("echo out; echo err >&2; exit 3")).expect("sh");
        let f = w
            .collect(Duration::from_secs(30), 1024, &mut no_tick())
            .expect("collected");
        assert_eq!(f.status.code(), Some(3));
        assert_eq!(f.stdout.bytes, b"out\n");
        assert_eq!(f.stderr.bytes, b"err\n");
        assert!(!f.stdout.truncated && !f.stderr.truncated);
    }

    #[test]
    fn collect_caps_what_it_keeps_and_never_blocks_the_child() {
        // 1 MiB, far beyond a pipe's buffer: the child finishes only if
        // the pipe is read while it runs.
        let mut w = Watched::spawn_group(&mut sh("head -c 1048576 /dev/zero")).expect("sh");
        let f = w
            .collect(Duration::from_secs(60), 100, &mut no_tick())
            .expect("collected");
        assert!(f.status.success());
        assert_eq!(f.stdout.bytes.len(), 100);
        assert!(f.stdout.truncated);
    }

    #[test]
    fn collect_kills_the_whole_group_at_the_deadline() {
        // The grandchild holds the pipes; it must not outlive the deadline
        // nor keep the wait going.
        let mut w =
            Watched::spawn_group(&mut sh("echo started >&2; sleep 30 & sleep 30")).expect("sh");
        let started = Instant::now();
        let f = w.collect(Duration::from_millis(500), 1024, &mut no_tick());
        let Err(Failure::TimedOut(stderr)) = f else {
            panic!("expected a timeout, got {f:?}");
        };
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the deadline held"
        );
        assert_eq!(stderr.bytes, b"started\n");
        assert!(w.try_wait().expect("try_wait").is_some(), "reaped");
    }

    #[test]
    fn a_failing_wait_leaves_the_child_to_the_caller() {
        let mut w = Watched::spawn_group(&mut sh("sleep 30")).expect("sh");
        let f = w.collect(Duration::from_secs(30), 0, &mut |_, _| {
            Err(Error::new(crate::error::Kind::Io, "asked to stop"))
        });
        assert!(matches!(f, Err(Failure::Interrupted(_))), "{f:?}");
        assert_eq!(w.try_wait().expect("try_wait"), None, "still running");
        w.kill();
    }

    #[test]
    fn a_killed_child_is_reaped() {
        let mut w =
            Watched::spawn(Command::new("sh").args(["-c", "sleep 30"])).expect("starting sh");
        w.kill();
        assert!(w.try_wait().expect("try_wait").is_some());
    }
}
