//! Progress of long work, and the callback that lets the driver breathe.
//!
//! The state machine runs long steps (a download, a read-back, a delta,
//! health checks) on the daemon's one thread. It calls a [`Ticker`] between
//! chunks of work so the driver can answer its control socket, ping the
//! watchdog and notice a stop request, and it calls [`Ticker::wait`]
//! instead of sleeping, so a wait for a child process or a deadline sleeps
//! in `poll(2)` rather than in a loop. [`Progress`] is what those calls
//! carry, [`Meter`] paces them within a phase, and [`progress_line`] is its
//! one-line rendering for terminals and `STATUS=`.
//!
//! This module owns no policy: it never decides what to do with a tick.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What is happening, for status and progress output.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// `download`, `verify`, `hash-active`, `apply`, `health`, `check`,
    /// `keys`, `report`.
    pub phase: String,
    pub done: u64,
    pub total: u64,
    /// Bytes per second over the phase so far.
    pub rate: u64,
    /// Seconds left at that rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta: Option<u64>,
}

/// Called between chunks of work. Returning an error (e.g. [`Kind::Stopped`])
/// interrupts the pipeline at that point; everything done so far is safe to
/// resume from.
pub trait Ticker {
    fn tick(&mut self, progress: &Progress) -> Result<()>;

    /// Sleep until one of `fds` becomes readable (a child's pidfd, see
    /// [`crate::child`]; a pipe from it), something the driver watches
    /// needs attention (the daemon: a control client, a signal), or `max`
    /// has passed. The daemon serves its socket and watchdog during the
    /// wait, so a state that waits for a child or a deadline costs no
    /// wake-ups in between.
    ///
    /// The default, for one-shot commands and tests, waits on `fds` alone.
    fn wait(&mut self, fds: &[BorrowedFd<'_>], max: Duration) -> Result<()> {
        wait_readable(fds, max);
        Ok(())
    }

    /// Whether the driver's poll timer has passed, so that a long step (a
    /// download) looks for a newer release meanwhile. The default, for
    /// one-shot commands and tests: never.
    fn poll_due(&mut self) -> bool {
        false
    }

    /// How a check started because [`Ticker::poll_due`] said so ended:
    /// `None` when it succeeded, else its error. The driver schedules the
    /// next one.
    fn polled(&mut self, _failure: Option<&Error>) {}
}

/// Sleep until one of `fds` is readable or hung up, or `max` has passed
/// (interrupted early by a signal, which the caller's loop copes with like
/// any early return).
pub(crate) fn wait_readable(fds: &[BorrowedFd<'_>], max: Duration) {
    if fds.is_empty() {
        std::thread::sleep(max);
        return;
    }
    let ms = u16::try_from(max.as_millis()).unwrap_or(u16::MAX);
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    let _ = poll(&mut polled, PollTimeout::from(ms));
}

/// The waits of an operation that must run to its end once started: a
/// bootloader command, the bootloader's lock. A boot selection half
/// written because a stop request arrived is worse than a stop that waits
/// for the operation's own bounded timeout, so these waits serve the
/// driver through its ticker until the driver asks to stop or to
/// interrupt, and from then on sleep on their descriptors alone; the
/// request is acted on at the next tick, after the operation.
pub struct Uninterrupted<'a> {
    ticker: &'a mut dyn Ticker,
    serving: bool,
}

impl<'a> Uninterrupted<'a> {
    pub fn new(ticker: &'a mut dyn Ticker) -> Uninterrupted<'a> {
        Uninterrupted {
            ticker,
            serving: true,
        }
    }

    /// As [`Ticker::wait`], never failing. After the driver's first
    /// request to end the step the ticker is no longer called (it would
    /// return at once every time, a spin).
    pub fn wait(&mut self, fds: &[BorrowedFd<'_>], max: Duration) {
        if self.serving {
            if self.ticker.wait(fds, max).is_err() {
                self.serving = false;
            }
            return;
        }
        wait_readable(fds, max);
    }
}

/// A ticker that does nothing (tests, tools).
pub struct NoTick;

impl Ticker for NoTick {
    fn tick(&mut self, _: &Progress) -> Result<()> {
        Ok(())
    }
}

/// Tracks one phase's progress and paces ticks.
pub struct Meter {
    progress: Progress,
    started: Instant,
    base: u64,
}

impl Meter {
    pub fn new(phase: &str, done: u64, total: u64) -> Meter {
        Meter {
            progress: Progress {
                phase: phase.into(),
                done,
                total,
                rate: 0,
                eta: None,
            },
            started: Instant::now(),
            base: done,
        }
    }

    pub fn advance(&mut self, n: u64) {
        self.progress.done += n;
    }

    /// Units done so far in this phase.
    pub fn done(&self) -> u64 {
        self.progress.done
    }

    pub fn tick(&mut self, t: &mut dyn Ticker) -> Result<()> {
        let secs = self.started.elapsed().as_secs_f64();
        let moved = self.progress.done.saturating_sub(self.base);
        if secs > 0.5 {
            self.progress.rate = (moved as f64 / secs) as u64;
            self.progress.eta = (self.progress.rate > 0).then(|| {
                self.progress.total.saturating_sub(self.progress.done) / self.progress.rate
            });
        }
        t.tick(&self.progress)
    }
}

/// `download 45% 12.0 MiB of 26.7 MiB, 3.2 MiB/s, 5 s left`
pub fn progress_line(p: &Progress) -> String {
    let pct = p.done.saturating_mul(100).checked_div(p.total).unwrap_or(0);
    let mut s = format!("{} {pct}% {} of {}", p.phase, mib(p.done), mib(p.total));
    if p.rate > 0 {
        s.push_str(&format!(", {}/s", mib(p.rate)));
    }
    if let Some(eta) = p.eta {
        s.push_str(&format!(", {eta} s left"));
    }
    s
}

/// `12.0 MiB`
pub(crate) fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1_048_576.0)
}
