//! What faces the outside while the machine works: the control socket,
//! the status snapshot clients are answered from, the requests queued for
//! the loop, the watchdog, and the tick callback that serves them between
//! chunks of work and sleeps in `poll(2)` when the machine waits.
//!
//! Requests that need the loop (a check, an install, mark-good/bad) are
//! queued here, never carried out: this module answers, queues and
//! sleeps, and must never change the machine's state.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::control::{self, Client, ControlServer, Reply, Request};
use crate::error::{Error, Kind, Result};
use crate::notify;
use crate::progress::{self, Progress, Ticker};
use crate::signals;
use crate::status::Status;

/// Watchdog pings at half the interval systemd asked for.
pub(super) struct Watchdog {
    pub(super) every: Option<Duration>,
    pub(super) last: Instant,
}

impl Watchdog {
    pub(super) fn new() -> Watchdog {
        Watchdog {
            every: notify::ping_interval(),
            last: Instant::now(),
        }
    }

    pub(super) fn ping_if_due(&mut self) {
        if let Some(every) = self.every {
            if self.last.elapsed() >= every {
                notify::watchdog();
                self.last = Instant::now();
            }
        }
    }

    pub(super) fn next(&self) -> Option<Instant> {
        self.every.map(|e| self.last + e)
    }
}

/// A request waiting for the loop.
pub(super) enum Queued {
    Check(Option<Client>),
    Install(Client, String),
    /// An operator's verdict on the running job.
    Verdict(Client, Verdict),
    Apply(Client),
    Channel(Client, Option<String>),
}

/// What an operator says about the running job: `mark-good`, `mark-bad`,
/// `cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Good,
    Bad,
    Cancel,
}

impl Queued {
    /// A command that changes state, as the loop's queue holds it; `None`
    /// for `status` and `history`, which are answered where they arrive.
    pub(super) fn of(client: Client) -> Option<Queued> {
        Some(match client.request.clone() {
            Request::Status | Request::History => return None,
            Request::Check => Queued::Check(Some(client)),
            Request::Install { manifest } => Queued::Install(client, manifest),
            Request::MarkGood => Queued::Verdict(client, Verdict::Good),
            Request::MarkBad => Queued::Verdict(client, Verdict::Bad),
            Request::Apply => Queued::Apply(client),
            Request::Cancel => Queued::Verdict(client, Verdict::Cancel),
            Request::Channel { name } => Queued::Channel(client, name),
        })
    }
}

/// What faces the outside while the machine works: the control socket,
/// the status clients are told, the requests waiting for the loop, the
/// watchdog.
pub(super) struct Front {
    pub(super) ctl: ControlServer,
    /// The last status built: what clients are told while the machine is
    /// busy or a new status is being built (the bootloader may take a
    /// while to read), with live progress.
    pub(super) snapshot: Status,
    pub(super) queue: VecDeque<Queued>,
    pub(super) watchdog: Watchdog,
}

impl Front {
    /// Refuse every queued command (the boot waits to be reconciled).
    pub(super) fn refuse_queue(&mut self) {
        let busy = Error::new(
            Kind::Busy,
            "the daemon is waiting for the bootloader (its lock is held or unusable; see the log) before it acts",
        );
        while let Some(q) = self.queue.pop_front() {
            match q {
                Queued::Check(Some(c))
                | Queued::Install(c, _)
                | Queued::Verdict(c, _)
                | Queued::Apply(c)
                | Queued::Channel(c, _) => c.reply(&Reply::error(&busy)),
                Queued::Check(None) => {}
            }
        }
    }
}

/// Which queued commands end the running step at its next tick, rather
/// than wait for it to end. The step is left in its persisted state, as
/// on a stop request, and the loop then carries the command out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interrupt {
    /// None: commands wait for the step.
    Never,
    /// `cancel` (a download, an install, the checks before a switch).
    Cancel,
    /// `cancel`, `mark-good` and `mark-bad` (health checks).
    Operator,
}

impl Interrupt {
    fn by(self, q: &Queued) -> bool {
        match (self, q) {
            (Interrupt::Never, _) => false,
            (_, Queued::Verdict(_, Verdict::Cancel)) => true,
            (Interrupt::Operator, Queued::Verdict(..)) => true,
            _ => false,
        }
    }
}

/// The tick callback while the machine is busy.
pub(super) struct Tick<'a> {
    pub(super) front: &'a mut Front,
    /// Which operator commands interrupt this step.
    pub(super) interrupt: Interrupt,
    /// Commands are refused as they arrive: the boot waits to be
    /// reconciled (the bootloader was busy). Otherwise they are queued for
    /// the loop.
    pub(super) refusing: bool,
    pub(super) last_status: Instant,
    /// Status requests waiting for the status being built; answered from
    /// `snapshot` once [`STATUS_PATIENCE`] has passed.
    pub(super) owed: Vec<Client>,
    pub(super) owed_by: Instant,
    /// The poll schedule, for a step that polls while it works (a
    /// download); `None` where nothing polls.
    pub(super) polls: Option<&'a mut super::Polls>,
}

/// How long a status request waits for the bootloader to be read before
/// it is answered with the selection as last read.
pub(super) const STATUS_PATIENCE: Duration = Duration::from_millis(500);

impl<'a> Tick<'a> {
    pub(super) fn new(front: &'a mut Front, interrupt: Interrupt) -> Tick<'a> {
        Tick {
            front,
            interrupt,
            refusing: false,
            last_status: Instant::now(),
            owed: Vec::new(),
            owed_by: Instant::now() + STATUS_PATIENCE,
            polls: None,
        }
    }

    /// Ping the watchdog, answer clients, and end the step on a stop
    /// request or an operator command that interrupts it.
    pub(super) fn serve(&mut self) -> Result<()> {
        let front = &mut *self.front;
        front.watchdog.ping_if_due();
        if !self.owed.is_empty() && Instant::now() >= self.owed_by {
            let reply = Reply {
                ok: true,
                status: Some(front.snapshot.clone()),
                ..Reply::default()
            };
            for client in self.owed.drain(..) {
                client.reply(&reply);
            }
        }
        for client in front.ctl.accept_all() {
            dispatch(client, &front.snapshot, &mut front.queue);
        }
        if self.refusing {
            front.refuse_queue();
        }
        if signals::stop_requested() {
            return Err(Error::new(Kind::Stopped, "stopping on request (SIGTERM)"));
        }
        if front.queue.iter().any(|q| self.interrupt.by(q)) {
            return Err(Error::new(
                Kind::Stopped,
                "interrupted by an operator command",
            ));
        }
        Ok(())
    }
}

impl Ticker for Tick<'_> {
    fn tick(&mut self, p: &Progress) -> Result<()> {
        if p.total > 0 || p.phase == "health" {
            self.front.snapshot.progress = Some(p.clone());
        }
        if self.last_status.elapsed() >= Duration::from_secs(5) {
            notify::status(&format!(
                "{}: {}",
                self.front.snapshot.state,
                progress::progress_line(p)
            ));
            self.last_status = Instant::now();
        }
        self.serve()
    }

    /// Sleep in `poll(2)` on the control socket, the signal self-pipe and
    /// `fds` until one is ready, the watchdog is due, or `max` has passed.
    /// A stop request or an interrupting command already pending ends the
    /// wait before it sleeps; commands merely queued for after the step do
    /// not, or every wait of the step would return at once.
    fn wait(&mut self, fds: &[BorrowedFd<'_>], max: Duration) -> Result<()> {
        self.serve()?;
        let mut max = max;
        if let Some(w) = self.front.watchdog.next() {
            max = max.min(w.saturating_duration_since(Instant::now()));
        }
        if !self.owed.is_empty() {
            max = max.min(self.owed_by.saturating_duration_since(Instant::now()));
        }
        sleep_until_event(&self.front.ctl, fds, max);
        self.serve()
    }

    fn poll_due(&mut self) -> bool {
        self.polls.as_ref().is_some_and(|p| p.due(Instant::now()))
    }

    fn polled(&mut self, failure: Option<&Error>) {
        if let Some(p) = self.polls.as_mut() {
            p.after(failure);
            p.ended
                .push((crate::timestamp::Timestamp::now(), failure.map(Error::kind)));
        }
    }
}

/// Sleep in `poll(2)` on the control socket (the listener and every
/// connection with pending work), the signal self-pipe and `extra` (a
/// child's pidfd, its pipes) for at most `timeout`, and no later than the
/// nearest deadline of a client connection. True when the control server
/// has something to do: a client is waiting, or a connection is out of
/// time.
pub(super) fn sleep_until_event(
    ctl: &ControlServer,
    extra: &[BorrowedFd<'_>],
    timeout: Duration,
) -> bool {
    let wake = match signals::wake_pipe() {
        Ok(fd) => fd,
        Err(e) => {
            // Not reached: the pipe was made before the loop started.
            log::warn!("{e}");
            return false;
        }
    };
    let mut timeout = timeout;
    let due = ctl.next_deadline();
    if let Some(at) = due {
        timeout = timeout.min(at.saturating_duration_since(Instant::now()));
    }
    let set = ctl.poll_set();
    let mut fds = vec![PollFd::new(wake, PollFlags::POLLIN)];
    // SAFETY: the control server owns these descriptors and is borrowed,
    // unchanged, for the whole of this call.
    fds.extend(
        set.iter()
            .map(|(fd, ev)| PollFd::new(unsafe { BorrowedFd::borrow_raw(*fd) }, *ev)),
    );
    fds.extend(extra.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    // EINTR and a timeout are both just an early or a timely return.
    let _ = poll(&mut fds, PollTimeout::from(ms));
    let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
    if ready(&fds[0]) {
        signals::drain_wake_pipe(wake);
    }
    fds[1..=set.len()].iter().any(ready) || due.is_some_and(|at| Instant::now() >= at)
}

/// Answer what can be answered now; queue the rest.
pub(super) fn dispatch(client: Client, snapshot: &Status, queue: &mut VecDeque<Queued>) {
    if let Err(e) = control::authorize(&client) {
        log::warn!("control: {e}");
        client.reply(&Reply::error(&e));
        return;
    }
    match client.request {
        Request::Status => {
            let reply = Reply {
                ok: true,
                status: Some(snapshot.clone()),
                ..Reply::default()
            };
            client.reply(&reply);
        }
        Request::History => {
            // The store is in use by the running step; `updraft history`
            // reads the database directly.
            client.reply(&Reply::error(&Error::new(
                Kind::Busy,
                "an install is running; `updraft history` reads the database directly",
            )));
        }
        _ => queue.extend(Queued::of(client)),
    }
}
