//! Degraded mode: what the daemon does when it cannot start.
//!
//! Some start failures are not cured by a restart: a configuration that
//! does not parse, a key file that is missing, a boot environment that
//! cannot be read, an empty device-id file. Exiting would hand them to the
//! service manager, which restarts the daemon every 30 s for ever: a device
//! that never polls or reports again and says why only in its journal. So
//! the daemon stays up, degraded, until the start succeeds:
//!
//! - every control request is answered with an error of kind `degraded`
//!   that names the reason (`updraft status` prints it and exits 3);
//! - systemd hears `READY=1` and `STATUS=degraded: …`, and the watchdog is
//!   fed, so neither a start timeout nor the watchdog turns the failure
//!   into a restart loop;
//! - a `degraded` report goes straight to `server.report_url` when the
//!   configuration could be read and names one (not through the outbox: the
//!   database may be what failed), when the reason changes and every
//!   `heartbeat_interval`;
//! - the start is tried again after a backoff (`system.degraded_retry`, one
//!   minute by default, doubling up to a quarter of an hour), the
//!   configuration read afresh, so a fix takes effect without a restart.
//!
//! - the booted slot is marked good again when nothing is being tried
//!   ([`keep_booted_good`]): boot scripts count every boot down (U-Boot's
//!   `BOOT_x_LEFT`, GRUB's `x_TRY`), so a committed slot left unmarked
//!   would be given up by the bootloader after as many degraded reboots as
//!   it has tries.
//!
//! That mark is the one write this module makes, and only when the
//! configuration parses and its slots and bootloader pass their checks
//! ([`Config::check_boot`]), the state lock is free, and the stored
//! state read through [`reconcile`] says what a normal start would: "mark
//! the booted slot good" (no install, no trial, no rollback under way). A
//! trial boot whose daemon cannot start is therefore never committed, and
//! a database that cannot be read marks nothing. While the bootloader is
//! waited for (a slow boot script), clients are answered and the watchdog
//! is fed, as in every other wait of this module ([`Serving`]). Otherwise nothing is
//! written: not a slot, not the database, not the configuration. Whatever
//! failed is left as it is for the operator
//! ([docs/operations.md](../../docs/operations.md), "Recovering a device").

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::front::{Watchdog, sleep_until_event};
use crate::config::{Config, System};
use crate::control::{ControlServer, Reply};
use crate::error::{Error, Kind, Result};
use crate::fetch::Fetcher;
use crate::lock::StateLock;
use crate::progress::{Progress, Ticker};
use crate::reconcile::{Decision, reconcile};
use crate::slot::SlotName;
use crate::state::State;
use crate::store::Store;
use crate::timestamp::Timestamp;
use crate::{bootloader, identity, notify, protect, report, signals};

/// How long a degraded daemon waits before it tries to start again.
pub(super) const RETRY_CAP: Duration = Duration::from_secs(15 * 60);

/// A start that failed, and what is known of the configuration.
pub(super) struct Failure {
    pub(super) error: Error,
    /// The configuration, when it could be read.
    pub(super) cfg: Option<Box<Config>>,
    /// Another process holds the state lock: the control socket is its.
    pub(super) lock_held: bool,
}

/// How degraded mode ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Time to try the start again.
    Retry,
    /// SIGTERM or SIGINT.
    Stop,
}

/// The delay before start attempt `attempt + 1` after `attempt` failed
/// ones: `base`, doubling, at most [`RETRY_CAP`] (and never below a
/// second).
pub(super) fn retry_delay(attempt: u32, base: Duration) -> Duration {
    crate::backoff::ceiling(attempt, base.max(Duration::from_secs(1)), RETRY_CAP)
}

/// Whether a degraded report is due: the reason changed, or a heartbeat
/// interval passed since the last one was sent.
pub(super) fn report_due(
    last: Option<(&str, Instant)>,
    reason: &str,
    now: Instant,
    every: Duration,
) -> bool {
    match last {
        None => true,
        Some((sent, at)) => sent != reason || now.saturating_duration_since(at) >= every,
    }
}

/// Degraded-mode state kept across start attempts.
pub(super) struct Degraded {
    since: Timestamp,
    last_report: Option<(String, Instant)>,
    /// This boot's slot question is settled: marked good, or the stored
    /// state says it must not be.
    boot_settled: bool,
}

impl Degraded {
    pub(super) fn new() -> Degraded {
        Degraded {
            since: Timestamp::now(),
            last_report: None,
            boot_settled: false,
        }
    }

    /// Serve degraded until `until`, or until a signal asks the daemon to
    /// stop. The control socket is bound once and kept in `held` across
    /// start attempts (the next start takes it over).
    pub(super) fn wait(
        &mut self,
        f: &Failure,
        held: &mut Option<ControlServer>,
        until: Instant,
    ) -> Ended {
        let reason = f.error.to_string();
        let defaults = System::default();
        let system = f.cfg.as_ref().map_or(&defaults, |c| &c.system);
        notify::ready();
        notify::status(&format!("degraded: {reason}"));
        if f.lock_held {
            // Another updraft process holds the state: the socket is its.
            *held = None;
        } else if held.is_none() {
            match ControlServer::bind(&system.socket, system.socket_group.as_deref()) {
                Ok(c) => *held = Some(c),
                Err(e) => log::error!(
                    "degraded: the control socket {} cannot be served either: {e}",
                    system.socket.display()
                ),
            }
        }
        let mut serving = Serving {
            ctl: held.as_mut(),
            watchdog: Watchdog::new(),
            answer: format!(
                "degraded since {}: {reason}; starting again at the latest {}",
                self.since,
                next_start(until)
            ),
        };
        if let Some(cfg) = &f.cfg {
            if !f.lock_held && !self.boot_settled {
                self.boot_settled = settle_boot(cfg, &mut serving);
            }
            self.report(cfg, &f.error);
        }
        loop {
            serving.watchdog.ping_if_due();
            if signals::stop_requested() {
                return Ended::Stop;
            }
            let now = Instant::now();
            if now >= until {
                return Ended::Retry;
            }
            serving.sleep(&[], until.saturating_duration_since(now));
        }
    }

    /// Send a `degraded` report straight to the report server, on a thread
    /// of its own (the loop must go on answering and feeding the
    /// watchdog), when one is due.
    fn report(&mut self, cfg: &Config, error: &Error) {
        let reason = error.to_string();
        let now = Instant::now();
        let last = self.last_report.as_ref().map(|(r, at)| (r.as_str(), *at));
        if cfg.server.report_url.is_empty()
            || !report_due(last, &reason, now, cfg.server.heartbeat_interval.0)
        {
            return;
        }
        let fetcher = match Fetcher::new(cfg) {
            Ok(f) => f,
            Err(e) => {
                log::warn!("degraded: no report can be sent: {e}");
                return;
            }
        };
        self.last_report = Some((reason.clone(), now));
        let device = read_device_id(&cfg.device.id_file);
        let body = report::degraded(device.as_deref(), error, self.since);
        let url = cfg.server.report_url.clone();
        let spawned = std::thread::Builder::new()
            .name("degraded-report".into())
            .spawn(
                move || match fetcher.post_json(&url, &body.key, body.body.as_bytes()) {
                    Ok(_) => log::info!("degraded: reported to {url}"),
                    Err(e) => log::warn!("degraded: reporting to {url}: {e}"),
                },
            );
        if let Err(e) = spawned {
            log::warn!("degraded: no report can be sent: {e}");
        }
    }
}

/// What degraded mode serves while it waits, for its own timer or for the
/// bootloader (a slow boot script): clients are answered with the
/// degraded reason, the watchdog is fed, and a signal wakes it.
struct Serving<'a> {
    ctl: Option<&'a mut ControlServer>,
    watchdog: Watchdog,
    answer: String,
}

impl Serving<'_> {
    /// Sleep until one of `fds` is readable, a client or a signal needs
    /// attention, or `max` has passed; answer the clients, feed the
    /// watchdog.
    fn sleep(&mut self, fds: &[BorrowedFd<'_>], max: Duration) {
        let timeout = self.watchdog.next().map_or(max, |at| {
            max.min(at.saturating_duration_since(Instant::now()))
        });
        match self.ctl.as_deref_mut() {
            Some(c) => {
                if sleep_until_event(c, fds, timeout) {
                    for client in c.accept_all() {
                        client.reply(&Reply::error(&Error::new(Kind::Degraded, &*self.answer)));
                    }
                }
            }
            None => sleep_until_signal(fds, timeout),
        }
        self.watchdog.ping_if_due();
    }
}

impl Ticker for Serving<'_> {
    fn tick(&mut self, _: &Progress) -> Result<()> {
        self.watchdog.ping_if_due();
        Ok(())
    }

    fn wait(&mut self, fds: &[BorrowedFd<'_>], max: Duration) -> Result<()> {
        self.sleep(fds, max);
        Ok(())
    }
}

/// Mark the booted slot good if [`keep_booted_good`] finds it should be,
/// logging what was done. Whether the question is settled for this boot
/// (`false`: ask again at the next start attempt).
fn settle_boot(cfg: &Config, t: &mut dyn Ticker) -> bool {
    match keep_booted_good(cfg, t) {
        Ok(Some(slot)) => {
            log::info!("degraded: booted slot {slot} marked good again (no update under way)");
            true
        }
        Ok(None) => {
            log::warn!(
                "degraded: booted slot not marked good: the stored state has an update under way, \
                 which only a started daemon concludes"
            );
            true
        }
        Err(e) => {
            log::warn!("degraded: booted slot not marked good: {e}");
            false
        }
    }
}

/// Mark the booted slot good when a normal start would: the stored state,
/// read without writing, reconciled with this boot, says
/// [`Decision::MarkBootedGood`]. `Some(slot)` when it was marked (a
/// backend writes nothing when the selection is already right), `None`
/// when the stored state forbids it. Errors: the slots or the bootloader
/// are configured wrongly, the state lock is held, or the booted slot, the
/// boot id, the state or the bootloader cannot be read.
fn keep_booted_good(cfg: &Config, t: &mut dyn Ticker) -> Result<Option<SlotName>> {
    cfg.check_boot()?;
    // One-shot commands take the lock to install: never mark while one runs.
    let _lock = StateLock::acquire(&cfg.lock_path())?;
    let booted = bootloader::booted_slot(cfg)?;
    let boot_id = identity::boot_id(&cfg.system.boot_id_file)?;
    let state = stored_state(cfg)?;
    if !may_mark_good(state, booted, &boot_id) {
        return Ok(None);
    }
    bootloader::from_config(cfg)?
        .mark_good_with(booted, cfg.bootloader.tries, t)
        .map_err(|e| e.wrap(format!("marking booted slot {booted} good")))?;
    Ok(Some(booted))
}

/// The decision [`keep_booted_good`] carries out: what a start of the
/// daemon would do with this state in this boot, where only "mark the
/// booted slot good" is taken.
fn may_mark_good(state: State, booted: SlotName, boot_id: &str) -> bool {
    reconcile(state, booted, boot_id) == Decision::MarkBootedGood
}

/// The stored state, read only. No database and no protection copy is a
/// device that never installed anything (`Idle`); a database gone while
/// its copy is there is a state not known, an error.
fn stored_state(cfg: &Config) -> Result<State> {
    let db = cfg.db_path();
    if !db.exists() && !protect::path_beside(&db).exists() {
        return Ok(State::Idle);
    }
    let store = Store::open_readonly(&db)?;
    Ok(store.state()?.0)
}

/// The device id as the id file holds it, without creating one.
fn read_device_id(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let id = text.trim();
    (!id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_graphic()))
        .then(|| id.to_string())
}

/// When the next start is tried, for the operator.
fn next_start(until: Instant) -> Timestamp {
    let left = until.saturating_duration_since(Instant::now());
    Timestamp(Timestamp::now().0 + left.as_secs() as i64)
}

/// Sleep without a control socket until one of `fds` is readable, a
/// signal arrives or `timeout` has passed.
fn sleep_until_signal(fds: &[BorrowedFd<'_>], timeout: Duration) {
    let Ok(wake) = signals::wake_pipe() else {
        crate::progress::wait_readable(fds, timeout.min(Duration::from_secs(1)));
        return;
    };
    let mut polled = vec![nix::poll::PollFd::new(wake, nix::poll::PollFlags::POLLIN)];
    polled.extend(
        fds.iter()
            .map(|fd| nix::poll::PollFd::new(*fd, nix::poll::PollFlags::POLLIN)),
    );
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let _ = nix::poll::poll(&mut polled, nix::poll::PollTimeout::from(ms));
    signals::drain_wake_pipe(wake);
}

/// Whether `e` leaves the daemon degraded rather than ending it.
pub(super) fn degrades(e: &Error) -> bool {
    e.kind() != Kind::Stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_is_tried_again_ever_later_up_to_a_quarter_hour() {
        let base = Duration::from_secs(60);
        let d: Vec<u64> = (1..=6).map(|a| retry_delay(a, base).as_secs()).collect();
        assert_eq!(d, [60, 120, 240, 480, 900, 900]);
        // A zero base (a test configuration) still waits a second.
        assert_eq!(retry_delay(1, Duration::ZERO), Duration::from_secs(1));
    }

    #[test]
    fn a_report_goes_when_the_reason_changes_or_a_heartbeat_interval_passed() {
        let t0 = Instant::now();
        let hour = Duration::from_secs(3600);
        // (last report, reason now, seconds since) → due
        let rows: [(Option<&str>, &str, u64, bool); 5] = [
            (None, "a", 0, true),
            (Some("a"), "a", 10, false),
            (Some("a"), "a", 3600, true),
            (Some("a"), "b", 10, true),
            (Some("a"), "a", 3599, false),
        ];
        for (last, reason, after, want) in rows {
            let now = t0 + Duration::from_secs(after);
            assert_eq!(
                report_due(last.map(|r| (r, t0)), reason, now, hour),
                want,
                "last {last:?}, reason {reason}, {after} s later"
            );
        }
    }

    #[test]
    fn a_degraded_start_marks_the_booted_slot_good_only_outside_an_update() {
        use crate::state::RebootPurpose;
        use crate::test_support::job_into;
        let trial = |boot: &str| {
            let mut j = job_into(SlotName::B);
            j.boot_id = Some(boot.into());
            j.purpose = Some(RebootPurpose::Trial);
            j
        };
        // (stored state, booted slot) in boot "boot-2" → marked good
        let rows: Vec<(State, SlotName, bool)> = vec![
            (State::Idle, SlotName::A, true),
            (State::Committed(trial("boot-1")), SlotName::B, true),
            (State::RolledBack(trial("boot-1")), SlotName::A, true),
            (
                State::Failed {
                    reason: "x".into(),
                    job: None,
                },
                SlotName::A,
                true,
            ),
            // The trial booted: only a started daemon may test and commit.
            (State::Rebooting(trial("boot-1")), SlotName::B, false),
            (State::Testing(trial("boot-1")), SlotName::B, false),
            (State::Testing(trial("boot-2")), SlotName::B, false),
            // Back on the old slot: a rollback a started daemon records.
            (State::Rebooting(trial("boot-1")), SlotName::A, false),
            // The reboot has not happened yet.
            (State::Rebooting(trial("boot-2")), SlotName::A, false),
            // A download in progress.
            (State::Downloading(trial("boot-1")), SlotName::A, false),
        ];
        for (state, booted, want) in rows {
            let name = state.name();
            assert_eq!(
                may_mark_good(state, booted, "boot-2"),
                want,
                "{name} booted {booted}"
            );
        }
    }
}
