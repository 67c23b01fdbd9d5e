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
//! SIGTERM and SIGINT set a flag ([`crate::signals`]); the next tick fails
//! with [`Kind::Stopped`], which leaves the machine in its persisted state
//! (a download resumes at the next start) and the loop exits. Every sleep
//! also watches the signals' self-pipe, so a signal that lands after the
//! loop last looked at the flag (say, while a report was being delivered)
//! still ends the wait at once instead of up to a minute later. A status
//! request is answered from [`Front`]'s snapshot whenever building a fresh
//! one would wait (a busy step, a slow bootloader read).
//!
//! A bootloader found busy at start (libubootenv's lock held, or a lock
//! file that is not root's) does not end the daemon: it starts, serves its
//! socket, refuses changing commands as busy, and reconciles the boot
//! again with a backoff; nothing else runs until that succeeded. Nothing
//! here ever waits for a socket client ([`crate::control`] holds their
//! connections; the sleeps include them).
//!
//! Polls follow their timer ([`Polls`]) while nothing is in progress and
//! also while a job downloads: between the download's steps from the loop,
//! and during a step through the tick ([`crate::progress::Ticker::poll_due`]),
//! so a newer release can supersede a download that takes days.
//!
//! This module schedules and dispatches. It never decides what an update
//! does: that is [`crate::machine`].

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff};
use crate::config::Config;
use crate::control::{self, Client, ControlServer, Reply, Request};
use crate::error::{Error, Kind, Result};
use crate::lock::StateLock;
use crate::machine::{CheckOutcome, Machine, Mode, Next};
use crate::memory;
use crate::metrics::Metrics;
use crate::notify;
use crate::progress;
use crate::signals;
use crate::source::Origin;
use crate::state::State;
use crate::status::{BootView, Status};
use crate::timestamp::Timestamp;
use degraded::{Degraded, Failure};
use delivery::Delivery;
use front::{Front, Interrupt, Queued, Tick, Verdict, Watchdog, sleep_until_event};

mod degraded;
mod delivery;
mod front;

/// Run the daemon with the configuration at `config` until SIGTERM. A
/// start that fails leaves it degraded ([`degraded`]): it answers, feeds
/// the watchdog, reports, and starts again after a backoff, so no start
/// failure becomes a restart loop.
pub fn serve(config: &Path) -> Result<()> {
    // The allocator is tuned by cli::run, before any thread exists.
    signals::install()?;
    let mut attempts: u32 = 0;
    let mut degraded: Option<Degraded> = None;
    let mut held: Option<ControlServer> = None;
    loop {
        // A configuration refused by its checks still says where the
        // socket is and where reports go.
        let started = Config::load(config).map_err(|e| Failure {
            error: e,
            cfg: Config::load_unchecked(config).map(Box::new),
            lock_held: false,
        });
        let failure = match started.and_then(|cfg| start(cfg, &mut held)) {
            Ok((lock, mut d)) => {
                if degraded.is_some() {
                    log::warn!("started after {attempts} failed attempt(s): no longer degraded");
                }
                log::info!(
                    "updraft {} started: booted slot {}, device {}, state {}",
                    env!("CARGO_PKG_VERSION"),
                    d.m.booted(),
                    d.m.device_id(),
                    d.m.state()?.name()
                );
                notify::ready();
                notify::status("running");
                let r = d.run();
                notify::stopping();
                log::info!("updraft stopped");
                drop(lock);
                return r;
            }
            Err(f) => f,
        };
        if !degraded::degrades(&failure.error) {
            return Err(failure.error);
        }
        attempts = attempts.saturating_add(1);
        let base = failure.cfg.as_ref().map_or_else(
            || crate::config::System::default().degraded_retry.0,
            |c| c.system.degraded_retry.0,
        );
        let delay = degraded::retry_delay(attempts, base);
        let reason = failure.error.to_string();
        crate::logging::event(
            log::Level::Error,
            &crate::logging::EventFields {
                event: "degraded",
                reason: Some(&reason),
                ..Default::default()
            },
            format_args!(
                "updraft {} cannot start: {reason}; running degraded (status answers, nothing is updated), starting again in {}",
                env!("CARGO_PKG_VERSION"),
                crate::timestamp::format_duration(delay)
            ),
        );
        let d = degraded.get_or_insert_with(Degraded::new);
        if d.wait(&failure, &mut held, Instant::now() + delay) == degraded::Ended::Stop {
            log::info!("updraft stopped (degraded)");
            return Ok(());
        }
    }
}

/// Everything before the loop: the state lock, the machine, the control
/// socket, this boot's reconciliation. What fails here degrades the
/// daemon.
///
/// `held`: the control socket degraded mode served (bound here at the
/// first start), taken over only once nothing can fail any more, so that
/// clients never find the socket gone between two start attempts (they
/// would read the device without the daemon) and a client that connected
/// during a start that fails is answered by degraded mode, not cut off.
fn start(
    cfg: Config,
    held: &mut Option<ControlServer>,
) -> std::result::Result<(StateLock, Daemon), Failure> {
    let fail = |error: Error, cfg: &Config| Failure {
        lock_held: error.kind() == Kind::Busy,
        error,
        cfg: Some(Box::new(cfg.clone())),
    };
    let lock = StateLock::acquire(&cfg.lock_path()).map_err(|e| fail(e, &cfg))?;
    let started = (|| {
        let mut machine = Machine::open(cfg.clone(), Mode::Daemon)?;
        // The socket stays in `held` until nothing can fail any more: a
        // start that fails after this leaves it listening for degraded
        // mode, so a client that connected meanwhile is answered, never
        // cut off with the socket.
        if held.is_none() {
            *held = Some(ControlServer::bind(
                &cfg.system.socket,
                cfg.system.socket_group.as_deref(),
            )?);
        }
        // Applications must find the inhibit directory; without it nothing
        // can inhibit, which is no reason not to update.
        if let Err(e) = crate::inhibit::prepare_dir(&cfg.policy) {
            log::warn!("{e}; inhibitor files cannot be placed there");
        }
        // Before the daemon serves: reconciliation and the first status may
        // wait for the bootloader (within its own timeouts); clients that
        // connect meanwhile are answered once it is done, and systemd hears
        // READY=1 only then.
        //
        // A busy bootloader (its lock held by someone else) is not a reason
        // to stop: any user holding the lock could keep that going. The
        // daemon starts, serves its socket, and tries again with a backoff;
        // nothing else runs until it succeeded.
        let boot_pending = match machine.on_boot() {
            Ok(()) => None,
            Err(e) if e.kind() == Kind::Busy => Some(e),
            Err(e) => return Err(e),
        };
        // A bootloader just found busy is not waited for a second time.
        let boot_view = match &boot_pending {
            Some(e) => Err(e.to_string()),
            None => machine.read_boot(&mut progress::NoTick),
        };
        let snapshot = machine.status(&boot_view)?;
        let Some(ctl) = held.take() else {
            crate::bail!(
                Io,
                "the control socket {} is not open",
                cfg.system.socket.display()
            );
        };
        let mut d = Daemon::new(machine, ctl, cfg.clone(), boot_view, snapshot);
        if let Some(e) = &boot_pending {
            d.postpone_boot(e);
        }
        Ok(d)
    })();
    match started {
        Ok(d) => Ok((lock, d)),
        // The lock was ours: the socket is free for degraded mode.
        Err(e) => Err(Failure {
            error: e,
            cfg: Some(Box::new(cfg)),
            lock_held: false,
        }),
    }
}

/// When the configured server is polled next, and the backoff after failed
/// polls: one schedule for the loop's polls and those a download makes
/// through its tick.
struct Polls {
    /// `None`: no `server.manifest_url`, never polled.
    next: Option<Instant>,
    backoff: Backoff,
    interval: Duration,
    jitter: Duration,
    /// Checks that ended during a step, for the metrics: when, and the
    /// kind of error of a failed one.
    ended: Vec<(Timestamp, Option<Kind>)>,
}

impl Polls {
    fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|at| now >= at)
    }

    /// Schedule the next poll after one that ended with `failure`: the
    /// jittered interval after a success, the backoff after a failure (no
    /// later than the interval, or the server's `Retry-After` if longer),
    /// 30 s while the clock cannot be trusted.
    fn after(&mut self, failure: Option<&Error>) {
        let next = match failure {
            None => {
                self.backoff.succeed();
                backoff::poll_delay(self.interval, self.jitter)
            }
            Some(e) if e.kind() == Kind::Clock => Duration::from_secs(30),
            Some(e) => self
                .backoff
                .fail(e.retry_after())
                .min(self.interval.max(e.retry_after().unwrap_or_default())),
        };
        if self.next.is_some() {
            self.next = Some(Instant::now() + next);
        }
    }
}

/// Memory freed by a round of work (a poll, a delivery, a step, a client)
/// is handed back before a sleep at least this long.
const RELEASE_BEFORE_SLEEP: Duration = Duration::from_secs(1);

/// First wait before reconciling the boot again after a busy bootloader.
const BOOT_RETRY_BASE: Duration = Duration::from_secs(5);

/// Longest wait between those attempts.
const BOOT_RETRY_MAX: Duration = Duration::from_secs(60);

struct Daemon {
    m: Machine,
    /// When this boot is to be reconciled again ([`Machine::on_boot`] found
    /// the bootloader busy); nothing else runs meanwhile.
    boot_retry: Option<Instant>,
    boot_backoff: Backoff,
    front: Front,
    cfg: Config,
    /// The boot selection as last read, for the front's snapshot.
    boot_view: BootView,
    polls: Polls,
    /// The state after the last step was `downloading` (a download waits
    /// for its retry): polls go on meanwhile.
    downloading: bool,
    /// The last step held a verified slot for the policy: polls go on, and
    /// one that finds another image supersedes it.
    held: bool,
    /// The last step waits for the reboot: a DDI server is polled
    /// meanwhile, so its cancelAction is answered.
    rebooting: bool,
    next_heartbeat: Instant,
    /// When reports are sent ([`delivery`]): whatever is queued — a
    /// transition's reports, a heartbeat, a failed check — goes out at the
    /// next turn of the loop once its time has come; a failed delivery
    /// backs off, a successful poll may end that wait.
    delivery: Delivery,
    next_step: Instant,
    /// Install attempts that failed in a row: the next poll (which would
    /// start the same release again) waits longer each time.
    install_failures: u32,
    machine_active: bool,
    metrics: Metrics,
    /// Body bytes the fetcher had counted at the last metrics update.
    downloaded_seen: u64,
    /// Work was done since memory was last handed back
    /// ([`Daemon::release_memory`]).
    release_due: bool,
}

impl Daemon {
    fn new(
        m: Machine,
        ctl: ControlServer,
        cfg: Config,
        boot_view: BootView,
        snapshot: Status,
    ) -> Daemon {
        if let Some(w) = cfg
            .system
            .metrics_file
            .as_deref()
            .and_then(crate::metrics::shared_directory)
        {
            log::warn!("{w}");
        }
        let now = Instant::now();
        let s = &cfg.server;
        let next_poll = m
            .polls_a_server()
            .then(|| now + backoff::first_poll_delay(s.jitter()));
        let retry_base = Duration::from_secs(10).min(s.poll_interval.0);
        Daemon {
            boot_retry: None,
            boot_backoff: Backoff::new(BOOT_RETRY_BASE, BOOT_RETRY_MAX),
            polls: Polls {
                next: next_poll,
                backoff: Backoff::new(retry_base, s.retry_max.0),
                interval: s.poll_interval.0,
                jitter: s.jitter(),
                ended: Vec::new(),
            },
            downloading: false,
            held: false,
            rebooting: false,
            next_heartbeat: now
                + backoff::poll_delay(s.heartbeat_interval.0, s.heartbeat_interval.0 / 10),
            delivery: Delivery::new(now, retry_base, s.retry_max.0),
            next_step: now,
            install_failures: 0,
            machine_active: true,
            metrics: Metrics::new(),
            downloaded_seen: 0,
            release_due: true,
            front: Front {
                ctl,
                snapshot,
                queue: VecDeque::new(),
                watchdog: Watchdog::new(),
            },
            boot_view,
            m,
            cfg,
        }
    }

    fn run(&mut self) -> Result<()> {
        loop {
            if signals::stop_requested() {
                return Ok(());
            }
            self.front.watchdog.ping_if_due();
            if let Some(at) = self.boot_retry {
                if Instant::now() >= at {
                    self.retry_boot()?;
                }
                if self.boot_retry.is_some() {
                    self.front.refuse_queue();
                    self.wait();
                    continue;
                }
            }
            let now = Instant::now();
            if self.machine_active && now >= self.next_step {
                match self.step() {
                    Ok(()) => {}
                    Err(e) if e.kind() == Kind::Stopped && signals::stop_requested() => {
                        return Ok(());
                    }
                    Err(e) if e.kind() == Kind::Stopped => {}
                    Err(e) => {
                        let e = self.full_disk(&e).unwrap_or(e);
                        log::error!("{e}");
                        self.metrics.record_error(e.kind());
                        self.next_step = Instant::now() + Duration::from_secs(30);
                    }
                }
            }
            self.run_queue();
            let now = Instant::now();
            if self.polls.due(now) && self.loop_polls() {
                self.poll_server(None, None);
            }
            if now >= self.next_heartbeat {
                if let Err(e) = self.m.heartbeat() {
                    log::warn!("queueing heartbeat: {e}");
                }
                let hb = self.cfg.server.heartbeat_interval.0;
                self.next_heartbeat = Instant::now() + backoff::poll_delay(hb, hb / 10);
            }
            self.m.bound_outbox();
            self.m.protect();
            if Instant::now() >= self.delivery.next {
                // Anything queued since the last turn, heartbeats included.
                self.deliver();
            }
            self.wait();
        }
    }

    /// The bootloader was busy reconciling this boot: try again later and
    /// do nothing else meanwhile. The first retry comes after
    /// [`BOOT_RETRY_BASE`], later ones back off with jitter (at least 1 s).
    fn postpone_boot(&mut self, e: &Error) {
        let backoff = self.boot_backoff.fail(None);
        let d = match self.boot_retry {
            None => BOOT_RETRY_BASE,
            Some(_) => backoff.max(Duration::from_secs(1)),
        };
        log::warn!(
            "reconciling this boot: {e}; trying again in {}",
            crate::timestamp::format_duration(d)
        );
        self.boot_retry = Some(Instant::now() + d);
        self.machine_active = false;
    }

    /// Reconcile this boot again after the bootloader was busy.
    /// Another busy bootloader backs off further; any other failure ends
    /// the daemon, as it would have at start.
    fn retry_boot(&mut self) -> Result<()> {
        let r = {
            let mut tick = Tick::new(&mut self.front, Interrupt::Never);
            tick.refusing = true;
            self.m.on_boot_with(&mut tick)
        };
        match r {
            Ok(()) => {
                log::info!("reconciled this boot: the bootloader answered");
                self.boot_retry = None;
                self.boot_backoff.succeed();
                self.machine_active = true;
                self.next_step = Instant::now();
                if let Err(e) = self.status() {
                    log::warn!("reading the status: {e}");
                }
                Ok(())
            }
            Err(e) if e.kind() == Kind::Stopped => Ok(()),
            Err(e) if e.kind() == Kind::Busy => {
                self.postpone_boot(&e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the loop polls when the timer says so: while nothing is in
    /// progress, while a download waits for its next step, and while the
    /// policy holds a verified slot. (During a step, the download polls
    /// through its tick.)
    fn loop_polls(&self) -> bool {
        !self.machine_active
            || self.downloading
            || self.held
            || (self.rebooting && self.m.polls_while_rebooting())
    }

    /// Sleep in poll(2) until the nearest deadline or a client connects.
    fn wait(&mut self) {
        // Polls wait while the machine is busy (the loop polls only when
        // it is not), so a poll deadline that passed meanwhile must not
        // end this wait: it would end every wait at once. Nor, while the
        // boot waits to be reconciled, may anything that waits with it.
        let pending = self.boot_retry.is_some();
        let mut deadline = Instant::now() + Duration::from_secs(60);
        if !pending {
            deadline = deadline.min(self.next_heartbeat);
        }
        match self.polls.next {
            Some(p) if self.loop_polls() && !pending => deadline = deadline.min(p),
            _ => {}
        }
        if self.machine_active && !pending {
            deadline = deadline.min(self.next_step);
        }
        if !pending && self.outbox_pending() {
            deadline = deadline.min(self.delivery.next);
        }
        if let Some(w) = self.front.watchdog.next() {
            deadline = deadline.min(w);
        }
        if let Some(at) = self.boot_retry {
            deadline = deadline.min(at);
        }
        if !self.front.queue.is_empty() || signals::stop_requested() {
            return;
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        if self.release_due && timeout >= RELEASE_BEFORE_SLEEP {
            self.release_memory();
        }
        if sleep_until_event(&self.front.ctl, &[], timeout) {
            self.serve_idle();
        }
    }

    /// Before a long sleep: let the store drop its page cache and the
    /// allocator return free pages to the kernel (see [`crate::memory`]).
    fn release_memory(&mut self) {
        self.release_due = false;
        if let Err(e) = self.m.store().shrink_memory() {
            log::debug!("shrinking the store's memory: {e}");
        }
        memory::release_idle();
    }

    /// Serve clients while the machine is idle: status is built fresh.
    fn serve_idle(&mut self) {
        self.release_due = true;
        let mut owed = Vec::new();
        for client in self.front.ctl.accept_all() {
            if let Err(e) = control::authorize(&client) {
                log::warn!("control: {e}");
                client.reply(&Reply::error(&e));
                continue;
            }
            match client.request {
                Request::Status => owed.push(client),
                Request::History => match self.m.store().history(200) {
                    Ok(h) => client.reply(&Reply {
                        ok: true,
                        history: Some(h),
                        ..Reply::default()
                    }),
                    Err(e) => client.reply(&Reply::error(&e)),
                },
                _ => self.front.queue.extend(Queued::of(client)),
            }
        }
        if !owed.is_empty() {
            let _ = self.refresh_status(owed);
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
                self.metrics.set_components(
                    st.components
                        .iter()
                        .map(|c| (c.name.clone(), c.kind.clone(), c.version.clone()))
                        .collect(),
                );
                self.metrics.set_outbox_depth(st.outbox);
                let policy = st.policy.as_ref();
                self.metrics
                    .set_held_since(policy.and_then(|p| p.held_since));
                self.metrics.set_waiting(
                    policy.and_then(|p| p.waiting_for.as_deref()),
                    policy.map_or(0, |p| p.inhibitors.len()),
                );
            }
            Err(e) => log::warn!("metrics: reading the status: {e}"),
        }
        if let Err(e) = self.metrics.write(&path) {
            log::warn!("writing metrics {}: {e}", path.display());
        }
    }

    fn status(&mut self) -> Result<Status> {
        self.refresh_status(Vec::new())
    }

    /// Make the snapshot clients are told the store as it is now, with
    /// the bootloader's selection as last read (no bootloader read).
    fn refresh_snapshot(&mut self) -> Result<()> {
        self.m.next_check = self
            .polls
            .next
            .map(|at| Timestamp::now().plus(at.saturating_duration_since(Instant::now())));
        self.front.snapshot = self.m.status(&self.boot_view)?;
        Ok(())
    }

    /// Build a fresh status and answer `owed`, the status requests waiting
    /// for it. What is known without the bootloader (the store as it is
    /// now, the selection as last read) becomes the snapshot first; the
    /// bootloader read that follows may wait (an operator's script, a
    /// held lock), and meanwhile clients are answered from that snapshot,
    /// `owed` too once [`STATUS_PATIENCE`] has passed.
    fn refresh_status(&mut self, mut owed: Vec<Client>) -> Result<Status> {
        let built = match self.refresh_snapshot() {
            Ok(()) => {
                let mut tick = Tick::new(&mut self.front, Interrupt::Never);
                tick.owed = owed;
                self.boot_view = self.m.read_boot(&mut tick);
                owed = std::mem::take(&mut tick.owed);
                self.m.status(&self.boot_view)
            }
            Err(e) => Err(e),
        };
        let reply = match &built {
            Ok(st) => {
                self.front.snapshot = st.clone();
                Reply {
                    ok: true,
                    status: Some(st.clone()),
                    ..Reply::default()
                }
            }
            Err(e) => Reply::error(e),
        };
        for client in owed {
            client.reply(&reply);
        }
        built
    }

    /// A database write that found its filesystem full, as an error that
    /// says which file could not grow and where (SQLite says only "database
    /// or disk is full"); `None` for any other error. Nothing is lost: the
    /// transaction was rolled back, and the work is tried again.
    fn full_disk(&self, e: &Error) -> Option<Error> {
        (e.no_space() && e.kind() == Kind::Store).then(|| {
            Error::new(
                e.kind(),
                format!(
                    "no space left for the database {} (and its journal) in {}; free space there: {e}",
                    self.cfg.db_path().display(),
                    self.cfg.system.state_dir.display()
                ),
            )
        })
    }

    /// Run the machine's current action once, serving the socket meanwhile.
    fn step(&mut self) -> Result<()> {
        self.release_due = true;
        // A held release steps every few seconds and changes nothing the
        // bootloader holds meanwhile: it is not read again for it.
        if self.held {
            self.refresh_snapshot()?;
        } else {
            self.status()?;
        }
        let interrupt = match self.front.snapshot.state.as_str() {
            "testing" => Interrupt::Operator,
            "downloading" | "installing" | "installed" => Interrupt::Cancel,
            _ => Interrupt::Never,
        };
        let mut tick = Tick::new(&mut self.front, interrupt);
        tick.polls = Some(&mut self.polls);
        let next = self.m.step(&mut tick);
        for (at, failure) in std::mem::take(&mut self.polls.ended) {
            self.metrics.record_check(at, failure.is_none());
            if let Some(kind) = failure {
                self.metrics.record_error(kind);
                if kind == Kind::Signature {
                    self.metrics.record_signature_failure();
                }
            }
        }
        self.update_metrics();
        let state = self.m.state().map(|s| s.name());
        self.downloading = matches!(state, Ok("downloading"));
        match state {
            Ok("failed") => {
                // The same release would be started again at the next poll:
                // back off, growing with each failed attempt, so a broken
                // artifact is not fetched by the whole fleet every interval.
                self.install_failures = self.install_failures.saturating_add(1);
                let interval = self.cfg.server.poll_interval.0;
                let cap = Duration::from_secs(24 * 3600).max(interval);
                let delay = backoff::poll_delay(interval, self.cfg.server.jitter())
                    + backoff::full_jitter(self.install_failures, interval, cap);
                log::warn!(
                    "install attempt {} failed; next check in {}",
                    self.install_failures,
                    crate::timestamp::format_duration(delay)
                );
                if self.polls.next.is_some() {
                    self.polls.next = Some(Instant::now() + delay);
                }
            }
            Ok("installed" | "committed") => self.install_failures = 0,
            _ => {}
        }
        let next = next?;
        self.held = matches!(next, Next::Hold(_));
        self.rebooting = matches!(next, Next::WaitReboot);
        notify::status(&format!("state {}", self.m.state()?.name()));
        match next {
            Next::Continue => self.next_step = Instant::now(),
            Next::Idle => self.machine_active = false,
            Next::Done => self.machine_active = false,
            Next::WaitReboot => {
                let mut at = Instant::now() + Duration::from_secs(300);
                if let Some(overdue) = self.m.reboot_recheck_at() {
                    at = at.min(overdue.max(Instant::now()));
                }
                self.next_step = at;
            }
            Next::Retry(d) => {
                log::info!("retrying in {}", crate::timestamp::format_duration(d));
                self.next_step = Instant::now() + d;
            }
            Next::Hold(d) => self.next_step = Instant::now() + d,
        }
        Ok(())
    }

    fn run_queue(&mut self) {
        while let Some(q) = self.front.queue.pop_front() {
            match q {
                Queued::Check(client) => {
                    if self.machine_active && !self.held {
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
                            c.reply(&Reply {
                                outcome: Some("busy".into()),
                                ..Reply::ok(what)
                            });
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
                    let mirrors = if manifest == self.m.cfg.server.manifest_url {
                        self.m.cfg.server.mirrors.clone()
                    } else {
                        Vec::new()
                    };
                    self.poll_server(Some(Origin::parse(&manifest, &mirrors)), Some(client));
                }
                Queued::Verdict(client, verdict) => {
                    let mut tick = Tick::new(&mut self.front, Interrupt::Never);
                    let r = match verdict {
                        Verdict::Good => self.m.mark_good(&mut tick),
                        Verdict::Bad => self.m.mark_bad(&mut tick),
                        Verdict::Cancel => self.m.cancel(&mut tick),
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
                Queued::Apply(client) => match self.m.apply() {
                    Ok(msg) => {
                        log::info!("{msg}");
                        self.next_step = Instant::now();
                        // A write the policy held starts at the next check.
                        if !self.machine_active && self.polls.next.is_some() {
                            self.polls.next = Some(Instant::now());
                        }
                        client.reply(&Reply::ok(msg));
                    }
                    Err(e) => client.reply(&Reply::error(&e)),
                },
                Queued::Channel(client, name) => match self.m.choose_channel(name.as_deref()) {
                    Ok(msg) => {
                        // The new channel's manifest is looked at now.
                        if self.polls.next.is_some() {
                            self.polls.next = Some(Instant::now());
                        }
                        client.reply(&Reply::ok(msg));
                    }
                    Err(e) => client.reply(&Reply::error(&e)),
                },
            }
        }
    }

    /// Check for a release (the configured server, or an operator's
    /// manifest), answer the client that asked, and schedule the next poll.
    fn poll_server(&mut self, origin: Option<Origin>, client: Option<Client>) {
        self.release_due = true;
        let operator = origin.is_some();
        if let Err(e) = self.status() {
            if let Some(c) = client {
                c.reply(&Reply::error(&e));
            }
            return;
        }
        self.front.snapshot.state = "checking".into();
        let result = {
            let mut tick = Tick::new(&mut self.front, Interrupt::Never);
            self.m.check(origin, operator, &mut tick)
        };
        let reply = match &result {
            Ok(CheckOutcome::Started {
                version,
                target,
                delta,
            }) => {
                self.machine_active = true;
                self.next_step = Instant::now();
                Reply {
                    ok: true,
                    started: Some(true),
                    outcome: Some("started".into()),
                    message: Some(format!(
                        "installing release {version} into slot {target} ({})",
                        if *delta { "delta" } else { "full image" }
                    )),
                    ..Reply::default()
                }
            }
            Ok(outcome) => Reply {
                ok: true,
                started: Some(false),
                outcome: Some(outcome.name().into()),
                message: outcome.why().map(str::to_string),
                ..Reply::default()
            },
            Err(e) => {
                let named = self.full_disk(e);
                let e = named.as_ref().unwrap_or(e);
                let reason = e.to_string();
                crate::logging::event(
                    log::Level::Warn,
                    &crate::logging::EventFields {
                        event: "check-failed",
                        reason: Some(&reason),
                        ..Default::default()
                    },
                    format_args!("check failed: {reason}"),
                );
                self.metrics.record_error(e.kind());
                if e.kind() == Kind::Signature {
                    self.metrics.record_signature_failure();
                }
                Reply::error(e)
            }
        };
        self.follow_server_sleep();
        self.polls.after(result.as_ref().err());
        // The configured server answered: reports queued during an outage
        // follow now, not at the end of a backoff that grew meanwhile.
        if result.is_ok() && !operator && self.outbox_pending() {
            let rule = self
                .delivery
                .poll_answered(self.m.reports_go_to_the_polled_server());
            if rule != delivery::AfterPoll::Keep {
                log::info!("the server answered a poll: delivering the queued reports now");
            }
        }
        // A held job may be let through by what the poll learnt (a DDI
        // action's window opened), and a job may have been ended by it (a
        // DDI cancelAction): the machine steps again now.
        if self.held || self.rebooting || matches!(self.m.state(), Ok(State::Failed { .. })) {
            self.machine_active = true;
            self.next_step = Instant::now();
        }
        // A release waiting for its write window is looked at again when
        // the window opens, not an interval later.
        if let (Some(at), Some(next)) = (self.m.write_waits_until(), self.polls.next) {
            let wait = Duration::from_secs(u64::try_from(at.0 - Timestamp::now().0).unwrap_or(0));
            self.polls.next = Some(next.min(Instant::now() + wait));
        }
        if let Some(c) = client {
            c.reply(&reply);
        }
        self.metrics.record_check(Timestamp::now(), reply.ok);
        self.update_metrics();
    }

    /// Whether reports wait in the outbox and a server to send them to.
    fn outbox_pending(&self) -> bool {
        self.m.delivers_reports() && self.m.store().outbox_len().unwrap_or(0) > 0
    }

    /// A DDI server's polling interval (already within its bounds) is the
    /// interval from now on, with the configured jitter (a quarter of it
    /// when none is configured, never more than the interval).
    fn follow_server_sleep(&mut self) {
        if let Some(sleep) = self.m.server_sleep() {
            self.polls.interval = sleep;
            self.polls.jitter = self
                .cfg
                .server
                .poll_jitter
                .map_or(sleep / 4, |j| j.0.min(sleep));
        }
    }

    fn deliver(&mut self) {
        if !self.outbox_pending() {
            return;
        }
        self.release_due = true;
        if let Err(e) = self.status() {
            log::warn!("report delivery postponed: reading the status: {e}");
            self.delivery.postpone(Duration::from_secs(30));
            return;
        }
        let mut tick = Tick::new(&mut self.front, Interrupt::Never);
        match self.m.deliver_reports(&mut tick) {
            Ok(n) => {
                if n > 0 {
                    log::info!("delivered {n} report(s)");
                }
                self.delivery.succeeded();
            }
            Err(e) if e.kind() == Kind::Stopped => {}
            Err(e) => {
                let d = self.delivery.failed(e.retry_after());
                log::warn!(
                    "report delivery failed ({e}); {} report(s) kept, next attempt in {}",
                    self.m.store().outbox_len().unwrap_or(0),
                    crate::timestamp::format_duration(d)
                );
            }
        }
    }
}
