//! The daemon loop: timers, the control socket, signals and the watchdog
//! around the state machine.
//!
//! One thread does everything. It sleeps in `poll(2)` on the control socket
//! with a timeout that is the nearest deadline (next poll, next heartbeat,
//! next report delivery, next watchdog ping, a retry), so every wait is
//! bounded. When the machine has work (a download, an install, health
//! checks), the loop runs [`Machine::step`] and serves the socket from the
//! machine's tick callbacks instead, between chunks; blocking network calls
//! run on short-lived helper threads ([`crate::worker`]) so the tick keeps
//! coming even when a server stalls.
//!
//! SIGTERM and SIGINT set a flag; the next tick fails with
//! [`Kind::Stopped`], which leaves the machine in its persisted state (a
//! download resumes at the next start) and the loop exits. The handler also
//! writes a byte to a self-pipe that `poll(2)` watches, so a signal that
//! lands after the loop last looked at the flag (say, while a report was
//! being delivered) still ends the wait at once instead of up to a minute
//! later.
//!
//! This module schedules and dispatches. It never decides what an update
//! does: that is [`crate::machine`].

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::backoff::{self, Backoff};
use crate::config::Config;
use crate::control::{self, Client, ControlServer, Reply, Request};
use crate::err;
use crate::error::{Error, Kind, Result};
use crate::lock::StateLock;
use crate::machine::{CheckOutcome, Machine, Mode, Next};
use crate::metrics::Metrics;
use crate::notify;
use crate::progress::{self, Progress, Ticker};
use crate::source::Origin;
use crate::status::Status;
use crate::timestamp::Timestamp;

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
fn wake_pipe() -> Result<BorrowedFd<'static>> {
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
fn drain_wake_pipe(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a local buffer of the length given; the descriptor
    // is non-blocking, so this ends with EAGAIN once the pipe is empty.
    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

fn install_signal_handlers() -> Result<()> {
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

/// Watchdog pings at half the interval systemd asked for.
struct Watchdog {
    every: Option<Duration>,
    last: Instant,
}

impl Watchdog {
    fn new() -> Watchdog {
        Watchdog {
            every: notify::ping_interval(),
            last: Instant::now(),
        }
    }

    fn ping_if_due(&mut self) {
        if let Some(every) = self.every {
            if self.last.elapsed() >= every {
                notify::watchdog();
                self.last = Instant::now();
            }
        }
    }

    fn next(&self) -> Option<Instant> {
        self.every.map(|e| self.last + e)
    }
}

/// A request waiting for the loop.
enum Queued {
    Check(Option<Client>),
    Install(Client, String),
    Mark(Client, bool),
}

/// Everything the tick callback needs while the machine is busy.
struct Tick<'a> {
    ctl: &'a ControlServer,
    snapshot: &'a mut Status,
    queue: &'a mut VecDeque<Queued>,
    watchdog: &'a mut Watchdog,
    /// Operator commands interrupt this step (health checks).
    interruptible: bool,
    last_status: Instant,
}

impl Tick<'_> {
    /// Ping the watchdog, answer clients, and end the step on a stop
    /// request or (during health checks) an operator command.
    fn serve(&mut self) -> Result<()> {
        self.watchdog.ping_if_due();
        for client in self.ctl.accept_all() {
            dispatch(client, self.snapshot, self.queue);
        }
        if STOP.load(Ordering::SeqCst) {
            return Err(Error::new(Kind::Stopped, "stopping on request (SIGTERM)"));
        }
        if self.interruptible && self.queue.iter().any(|q| matches!(q, Queued::Mark(..))) {
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
            self.snapshot.progress = Some(p.clone());
        }
        if self.last_status.elapsed() >= Duration::from_secs(5) {
            notify::status(&format!(
                "{}: {}",
                self.snapshot.state,
                progress::progress_line(p)
            ));
            self.last_status = Instant::now();
        }
        self.serve()
    }

    /// Sleep in `poll(2)` on the control socket, the signal self-pipe and
    /// `fd` until one is ready, the watchdog is due, or `max` has passed.
    fn wait(&mut self, fd: Option<BorrowedFd<'_>>, max: Duration) -> Result<()> {
        if !STOP.load(Ordering::SeqCst) && self.queue.is_empty() {
            let until_ping = self
                .watchdog
                .next()
                .map(|w| w.saturating_duration_since(Instant::now()));
            sleep_until_event(self.ctl, fd, until_ping.map_or(max, |p| p.min(max)));
        }
        self.serve()
    }
}

/// Sleep in `poll(2)` on the control socket, the signal self-pipe and
/// `extra` (a child's pidfd) for at most `timeout`. True when a client is
/// waiting to be served.
fn sleep_until_event(
    ctl: &ControlServer,
    extra: Option<BorrowedFd<'_>>,
    timeout: Duration,
) -> bool {
    let wake = match wake_pipe() {
        Ok(fd) => fd,
        Err(e) => {
            // Not reached: the pipe was made before the loop started.
            log::warn!("{e}");
            return false;
        }
    };
    let mut fds = vec![
        PollFd::new(ctl.fd(), PollFlags::POLLIN),
        PollFd::new(wake, PollFlags::POLLIN),
    ];
    if let Some(fd) = extra {
        fds.push(PollFd::new(fd, PollFlags::POLLIN));
    }
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    // EINTR and a timeout are both just an early or a timely return.
    let _ = poll(&mut fds, PollTimeout::from(ms));
    let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
    if ready(&fds[1]) {
        drain_wake_pipe(wake);
    }
    ready(&fds[0])
}

/// Answer what can be answered now; queue the rest.
fn dispatch(client: Client, snapshot: &Status, queue: &mut VecDeque<Queued>) {
    if let Err(e) = control::authorize(&client) {
        log::warn!("control: {e}");
        client.reply(&Reply::error(&e));
        return;
    }
    match client.request.clone() {
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
        Request::Check => queue.push_back(Queued::Check(Some(client))),
        Request::Install { manifest } => queue.push_back(Queued::Install(client, manifest)),
        Request::MarkGood => queue.push_back(Queued::Mark(client, true)),
        Request::MarkBad => queue.push_back(Queued::Mark(client, false)),
    }
}

/// Run the daemon until SIGTERM.
pub fn run(cfg: Config) -> Result<()> {
    let _lock = StateLock::acquire(&cfg.lock_path())?;
    install_signal_handlers()?;
    let mut machine = Machine::open(cfg.clone(), Mode::Daemon)?;
    let ctl = ControlServer::bind(&cfg.system.socket, cfg.system.socket_group.as_deref())?;
    machine.on_boot()?;
    let mut d = Daemon::new(machine, ctl, cfg);
    log::info!(
        "updraft {} started: booted slot {}, device {}, state {}",
        env!("CARGO_PKG_VERSION"),
        d.m.booted(),
        d.m.device_id(),
        d.m.state()?.name()
    );
    notify::ready();
    let r = d.run();
    notify::stopping();
    log::info!("updraft stopped");
    r
}

struct Daemon {
    m: Machine,
    ctl: ControlServer,
    cfg: Config,
    queue: VecDeque<Queued>,
    watchdog: Watchdog,
    next_poll: Option<Instant>,
    next_heartbeat: Instant,
    /// Reports are not sent before this instant: it moves only when
    /// delivery fails (backoff). Whatever is queued — a transition's
    /// reports, a heartbeat, a failed check — goes out at the next turn of
    /// the loop once it has passed.
    next_delivery: Instant,
    next_step: Instant,
    poll_backoff: Backoff,
    delivery_backoff: Backoff,
    /// Install attempts that failed in a row: the next poll (which would
    /// start the same release again) waits longer each time.
    install_failures: u32,
    machine_active: bool,
    metrics: Metrics,
    /// Body bytes the fetcher had counted at the last metrics update.
    downloaded_seen: u64,
}

impl Daemon {
    fn new(m: Machine, ctl: ControlServer, cfg: Config) -> Daemon {
        let now = Instant::now();
        let s = &cfg.server;
        let next_poll =
            (!s.manifest_url.is_empty()).then(|| now + backoff::first_poll_delay(s.jitter()));
        let retry_base = Duration::from_secs(10).min(s.poll_interval.0);
        Daemon {
            next_poll,
            next_heartbeat: now
                + backoff::poll_delay(s.heartbeat_interval.0, s.heartbeat_interval.0 / 10),
            next_delivery: now,
            next_step: now,
            poll_backoff: Backoff::new(retry_base, s.retry_max.0),
            install_failures: 0,
            delivery_backoff: Backoff::new(retry_base, s.retry_max.0),
            machine_active: true,
            metrics: Metrics::new(),
            downloaded_seen: 0,
            queue: VecDeque::new(),
            watchdog: Watchdog::new(),
            m,
            ctl,
            cfg,
        }
    }

    fn run(&mut self) -> Result<()> {
        loop {
            if STOP.load(Ordering::SeqCst) {
                return Ok(());
            }
            self.watchdog.ping_if_due();
            let now = Instant::now();
            if self.machine_active && now >= self.next_step {
                match self.step() {
                    Ok(()) => {}
                    Err(e) if e.kind() == Kind::Stopped && STOP.load(Ordering::SeqCst) => {
                        return Ok(());
                    }
                    Err(e) if e.kind() == Kind::Stopped => {}
                    Err(e) => {
                        log::error!("{e}");
                        self.metrics.record_error(e.kind());
                        self.next_step = Instant::now() + Duration::from_secs(30);
                    }
                }
            }
            self.run_queue();
            let now = Instant::now();
            if let Some(at) = self.next_poll {
                if now >= at && !self.machine_active {
                    self.poll_server(None, None);
                }
            }
            if now >= self.next_heartbeat {
                if let Err(e) = self.m.heartbeat() {
                    log::warn!("queueing heartbeat: {e}");
                }
                let hb = self.cfg.server.heartbeat_interval.0;
                self.next_heartbeat = Instant::now() + backoff::poll_delay(hb, hb / 10);
            }
            if Instant::now() >= self.next_delivery {
                // Anything queued since the last turn, heartbeats included.
                self.deliver();
            }
            self.wait();
        }
    }

    /// Sleep in poll(2) until the nearest deadline or a client connects.
    fn wait(&mut self) {
        let mut deadline = self
            .next_heartbeat
            .min(Instant::now() + Duration::from_secs(60));
        // Polls wait while the machine is busy (the loop polls only when
        // it is not), so a poll deadline that passed meanwhile must not
        // end this wait: it would end every wait at once.
        match self.next_poll {
            Some(p) if !self.machine_active => deadline = deadline.min(p),
            _ => {}
        }
        if self.machine_active {
            deadline = deadline.min(self.next_step);
        }
        if self.outbox_pending() {
            deadline = deadline.min(self.next_delivery);
        }
        if let Some(w) = self.watchdog.next() {
            deadline = deadline.min(w);
        }
        if !self.queue.is_empty() || STOP.load(Ordering::SeqCst) {
            return;
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        if sleep_until_event(&self.ctl, None, timeout) {
            self.serve_idle();
        }
    }

    /// Serve clients while the machine is idle: status is built fresh.
    fn serve_idle(&mut self) {
        for client in self.ctl.accept_all() {
            if let Err(e) = control::authorize(&client) {
                log::warn!("control: {e}");
                client.reply(&Reply::error(&e));
                continue;
            }
            match client.request.clone() {
                Request::Status => match self.status() {
                    Ok(st) => client.reply(&Reply {
                        ok: true,
                        status: Some(st),
                        ..Reply::default()
                    }),
                    Err(e) => client.reply(&Reply::error(&e)),
                },
                Request::History => match self.m.store().history(200) {
                    Ok(h) => client.reply(&Reply {
                        ok: true,
                        history: Some(h),
                        ..Reply::default()
                    }),
                    Err(e) => client.reply(&Reply::error(&e)),
                },
                Request::Check => self.queue.push_back(Queued::Check(Some(client))),
                Request::Install { manifest } => {
                    self.queue.push_back(Queued::Install(client, manifest))
                }
                Request::MarkGood => self.queue.push_back(Queued::Mark(client, true)),
                Request::MarkBad => self.queue.push_back(Queued::Mark(client, false)),
            }
        }
    }

    /// Refresh the metrics from the machine and write the metrics file,
    /// when one is configured. Failures are logged, never fatal.
    fn update_metrics(&mut self) {
        let Some(path) = self.cfg.system.metrics_file.clone() else {
            return;
        };
        if let Some(f) = self.m.fetcher() {
            let total = f.counters.body_bytes.load(Ordering::Relaxed);
            self.metrics
                .add_downloaded(total.saturating_sub(self.downloaded_seen));
            self.downloaded_seen = total;
        }
        if let Some(d) = self.m.last_install_duration.take() {
            self.metrics.set_last_install_duration(d);
        }
        match self.status() {
            Ok(st) => {
                self.metrics.set_state(&st.state);
                self.metrics.set_booted_slot(st.booted_slot);
                for s in &st.slots {
                    self.metrics.set_release(s.slot, s.version.as_deref());
                }
                self.metrics.set_outbox_depth(st.outbox);
            }
            Err(e) => log::warn!("metrics: reading the status: {e}"),
        }
        if let Err(e) = self.metrics.write(&path) {
            log::warn!("writing metrics {}: {e}", path.display());
        }
    }

    fn status(&mut self) -> Result<Status> {
        self.m.next_check = self
            .next_poll
            .map(|at| Timestamp::now().plus(at.saturating_duration_since(Instant::now())));
        self.m.status()
    }

    /// Run the machine's current action once, serving the socket meanwhile.
    fn step(&mut self) -> Result<()> {
        let mut snapshot = self.status()?;
        let interruptible = snapshot.state == "testing";
        let mut tick = Tick {
            ctl: &self.ctl,
            snapshot: &mut snapshot,
            queue: &mut self.queue,
            watchdog: &mut self.watchdog,
            interruptible,
            last_status: Instant::now(),
        };
        let next = self.m.step(&mut tick);
        self.update_metrics();
        match self.m.state().map(|s| s.name()) {
            Ok("failed") => {
                // The same release would be started again at the next poll:
                // back off, growing with each failed attempt, so a broken
                // artifact is not fetched by the whole fleet every interval.
                self.install_failures = self.install_failures.saturating_add(1);
                let interval = self.cfg.server.poll_interval.0;
                let cap = Duration::from_secs(24 * 3600).max(interval);
                let delay = backoff::poll_delay(interval, self.cfg.server.jitter())
                    + backoff::full_jitter(self.install_failures, interval, cap);
                log::info!(
                    "install attempt {} failed; next check in {}",
                    self.install_failures,
                    crate::timestamp::format_duration(delay)
                );
                if self.next_poll.is_some() {
                    self.next_poll = Some(Instant::now() + delay);
                }
            }
            Ok("installed" | "committed") => self.install_failures = 0,
            _ => {}
        }
        let next = next?;
        notify::status(&format!("state {}", self.m.state()?.name()));
        match next {
            Next::Continue => self.next_step = Instant::now(),
            Next::Idle => self.machine_active = false,
            Next::Done => self.machine_active = false,
            Next::WaitReboot => self.next_step = Instant::now() + Duration::from_secs(300),
            Next::Retry(d) => {
                log::info!("retrying in {}", crate::timestamp::format_duration(d));
                self.next_step = Instant::now() + d;
            }
        }
        Ok(())
    }

    fn run_queue(&mut self) {
        while let Some(q) = self.queue.pop_front() {
            match q {
                Queued::Check(client) => {
                    if self.machine_active {
                        // Nothing to poll for while an update runs; say
                        // which (not an error: the check is moot).
                        if let Some(c) = client {
                            let what = match self.m.state() {
                                Ok(st) => match st.job() {
                                    Some(j) => format!(
                                        "an update is in progress: release {} into slot {} ({})",
                                        j.version,
                                        j.target,
                                        st.name()
                                    ),
                                    None => format!("an update is in progress ({})", st.name()),
                                },
                                Err(e) => format!("an update is in progress ({e})"),
                            };
                            c.reply(&Reply::ok(what));
                        }
                        continue;
                    }
                    self.poll_server(None, client);
                }
                Queued::Install(client, manifest) => {
                    if self.machine_active && !self.m.state().map(|s| !s.busy()).unwrap_or(false) {
                        client.reply(&Reply::error(&Error::new(
                            Kind::Busy,
                            "an update is in progress",
                        )));
                        continue;
                    }
                    let mirrors = if manifest == self.cfg.server.manifest_url {
                        self.cfg.server.mirrors.clone()
                    } else {
                        Vec::new()
                    };
                    self.poll_server(Some(Origin::parse(&manifest, &mirrors)), Some(client));
                }
                Queued::Mark(client, good) => {
                    let r = if good {
                        self.m.mark_good()
                    } else {
                        self.m.mark_bad()
                    };
                    match r {
                        Ok(msg) => {
                            log::info!("{msg}");
                            self.machine_active = true;
                            self.next_step = Instant::now();
                            client.reply(&Reply::ok(msg));
                        }
                        Err(e) => client.reply(&Reply::error(&e)),
                    }
                }
            }
        }
    }

    /// Check for a release (the configured server, or an operator's
    /// manifest), answer the client that asked, and schedule the next poll.
    fn poll_server(&mut self, origin: Option<Origin>, client: Option<Client>) {
        let operator = origin.is_some();
        let mut snapshot = match self.status() {
            Ok(s) => s,
            Err(e) => {
                if let Some(c) = client {
                    c.reply(&Reply::error(&e));
                }
                return;
            }
        };
        snapshot.state = "checking".into();
        let result = {
            let mut tick = Tick {
                ctl: &self.ctl,
                snapshot: &mut snapshot,
                queue: &mut self.queue,
                watchdog: &mut self.watchdog,
                interruptible: false,
                last_status: Instant::now(),
            };
            self.m.check(origin, operator, &mut tick)
        };
        let s = self.cfg.server.clone();
        let mut next = backoff::poll_delay(s.poll_interval.0, s.jitter());
        let reply = match result {
            Ok(CheckOutcome::Started {
                version,
                target,
                delta,
            }) => {
                self.poll_backoff.succeed();
                self.machine_active = true;
                self.next_step = Instant::now();
                Reply {
                    ok: true,
                    started: Some(true),
                    message: Some(format!(
                        "installing release {version} into slot {target} ({})",
                        if delta { "delta" } else { "full image" }
                    )),
                    ..Reply::default()
                }
            }
            Ok(CheckOutcome::NoChange(why)) => {
                self.poll_backoff.succeed();
                Reply {
                    ok: true,
                    started: Some(false),
                    message: Some(why),
                    ..Reply::default()
                }
            }
            Err(e) => {
                log::warn!("check failed: {e}");
                self.metrics.record_error(e.kind());
                if e.kind() == Kind::Signature {
                    self.metrics.record_signature_failure();
                }
                next = match e.kind() {
                    Kind::Clock => Duration::from_secs(30),
                    _ => self
                        .poll_backoff
                        .fail(e.retry_after())
                        .min(s.poll_interval.0.max(e.retry_after().unwrap_or_default())),
                };
                Reply::error(&e)
            }
        };
        if let Some(c) = client {
            c.reply(&reply);
        }
        self.metrics.record_check(Timestamp::now(), reply.ok);
        self.update_metrics();
        if !s.manifest_url.is_empty() {
            self.next_poll = Some(Instant::now() + next);
        }
    }

    /// Whether reports wait in the outbox and a server to send them to.
    fn outbox_pending(&self) -> bool {
        !self.cfg.server.report_url.is_empty() && self.m.store().outbox_len().unwrap_or(0) > 0
    }

    fn deliver(&mut self) {
        if !self.outbox_pending() {
            return;
        }
        let mut snapshot = match self.status() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("report delivery postponed: reading the status: {e}");
                self.next_delivery = Instant::now() + Duration::from_secs(30);
                return;
            }
        };
        let mut tick = Tick {
            ctl: &self.ctl,
            snapshot: &mut snapshot,
            queue: &mut self.queue,
            watchdog: &mut self.watchdog,
            interruptible: false,
            last_status: Instant::now(),
        };
        match self.m.deliver_reports(&mut tick) {
            Ok(n) => {
                if n > 0 {
                    log::info!("delivered {n} report(s)");
                }
                self.delivery_backoff.succeed();
            }
            Err(e) if e.kind() == Kind::Stopped => {}
            Err(e) => {
                let d = self.delivery_backoff.fail(e.retry_after());
                log::warn!(
                    "report delivery failed ({e}); {} report(s) kept, next attempt in {}",
                    self.m.store().outbox_len().unwrap_or(0),
                    crate::timestamp::format_duration(d)
                );
                self.next_delivery = Instant::now() + d;
            }
        }
    }
}
