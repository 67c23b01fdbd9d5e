//! The update cycle: what each state does and where it goes next.
//!
//! This is the one place where the whole machine can be read. The states and
//! the legal transitions are defined in [`crate::state`]; here every state has
//! one action ([`Machine::step`]), every transition goes through one entry
//! point (`enter`, and the `roll_back`, `fail` and `start_rollback` helpers
//! built on it), and every action follows the same rule:
//! the transition is persisted *before* the side effect it announces, and
//! each side effect is safe to repeat. Within a state, the job's progress
//! (frames known durable, the slot being written) is recorded by
//! `Store::update_state`, which refuses anything but the same state: a
//! change of state never bypasses `enter`. A process killed or a power cut at
//! any instant therefore restarts in the state last written and simply runs
//! that state's action again.
//!
//! ```text
//! check ───────► Downloading ─► Installing ─► Installed ─► Rebooting ─► (reboot)
//!   (serial, keys,  (target out of   (read back,    (trial boot    │
//!    policy; not    boot order at    slot record)   first)         ▼
//!    persisted)     the first write)
//!                       stream/verify)                          on_boot: same boot id → reboot again
//!                                                                        booted target → Testing
//!                                                                        booted old   → RolledBack
//! Testing ─► Committed (mark good) ─► Idle
//!         └► Rebooting(rollback: target bad, old first) ─► (reboot) ─► RolledBack ─► Idle
//! any failure before the switch ─► Failed(reason) ─► Idle
//! a newer image before the switch ─► Failed(superseded) ─► Downloading (the newer release)
//! ```
//!
//! The files beside this one hold the rest of the machine's methods, one
//! concern each: `check.rs` (what a verified manifest leads to),
//! `actions.rs` (the busy states' actions), `watch.rs` (a job's download
//! deadline, polls while it downloads, a valid manifest before the
//! switch), `policy.rs` (when the operator's policy lets a verified slot
//! be switched in: windows, `updraft apply`), `operator.rs` (operator
//! commands, reports, status). What a
//! start concludes is the pure [`crate::reconcile`]; fetching and
//! verifying a manifest is [`crate::poll`].
//!
//! The machine keeps no timers and serves no sockets: it is driven by the
//! daemon loop ([`crate::daemon`]) or by the one-shot CLI. During long work
//! it calls the [`Ticker`] it is given, and where it must wait (a health
//! check, the reboot command, the bootloader) it waits through
//! [`Ticker::wait`], so the driver sleeps in `poll(2)` and answers clients
//! meanwhile.

use std::time::Duration;

use crate::bootloader::{self, BootState, Bootloader};
use crate::channel::Followed;
use crate::child::{Failure, Watched};
use crate::config::{Config, RebootMode};
use crate::error::{Cause, Error, Kind, Result};
use crate::fetch::Fetcher;
use crate::fsutil::ensure_dir;
use crate::hash::Sha256;
use crate::health::{HealthRun, Verdict};
use crate::identity;
use crate::install;
use crate::manifest::{self, Manifest};
use crate::poll::{Polled, Poller, Verified};
use crate::progress::{Progress, Ticker};
use crate::reconcile::{Decision, reconcile};
use crate::report::{self, Pending};
use crate::rollout;
use crate::slot::{self, SlotName, SlotPair, SlotWriter};
use crate::source::{Origin, Source};
use crate::state::{Job, Method, RebootPurpose, State};
use crate::status::{self, BootView, Status};
use crate::store::{Event, SlotRecord, Store};
use crate::timestamp::Timestamp;
use crate::trust::Trust;
use crate::{bail, err};
use actions::spool_path;
use check::job_delta;
use retry::Recovery;
use server::Server;

mod actions;
mod check;
mod components;
mod fleet;
mod floor;
mod operator;
mod policy;
mod provenance;
mod retry;
mod server;
mod verdict;
mod watch;

pub use policy::Wait;

/// How the machine is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The long-running agent: reboots, runs health checks, commits.
    Daemon,
    /// `updraft install` without a daemon: stops once the slot is set up for
    /// its trial boot.
    Oneshot,
}

/// What the driver should do after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Call [`Machine::step`] again.
    Continue,
    /// Nothing in progress.
    Idle,
    /// A reboot is pending (requested, or waiting for an operator).
    WaitReboot,
    /// The one-shot install reached its end state.
    Done,
    /// A transient failure: step again after this delay.
    Retry(Duration),
    /// A verified slot held by the policy: step again after this delay
    /// (or at `updraft apply`); polls go on meanwhile.
    Hold(Duration),
}

/// Outcome of a check for a new release.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckOutcome {
    /// An install job started (state is now Downloading).
    Started {
        version: String,
        target: SlotName,
        delta: bool,
    },
    /// Nothing to do now, and why (the release is being installed, or
    /// waits for the policy; a later check may start it).
    NoChange(String),
    /// The release is the one running already (recorded, or found by
    /// [`crate::provision`] on a device fresh from the factory).
    Running(String),
    /// The release is not for this device: rolled back or cancelled here
    /// before, or outside its staged rollout.
    Declined(String),
    /// The release's slot runs already and its changed components were
    /// installed and committed within the check, without a reboot.
    Applied(String),
    /// The policy holds the release's download (`policy.write`: a
    /// maintenance window, or `updraft apply`); a later check starts it.
    Held(String),
}

impl CheckOutcome {
    /// Why nothing started, for an outcome that started nothing.
    pub fn why(&self) -> Option<&str> {
        match self {
            CheckOutcome::Started { .. } => None,
            CheckOutcome::NoChange(w)
            | CheckOutcome::Running(w)
            | CheckOutcome::Declined(w)
            | CheckOutcome::Applied(w)
            | CheckOutcome::Held(w) => Some(w),
        }
    }

    /// Its name on the control socket (`Reply::outcome`).
    pub fn name(&self) -> &'static str {
        match self {
            CheckOutcome::Started { .. } => "started",
            CheckOutcome::NoChange(_) => "no-change",
            CheckOutcome::Running(_) => "running",
            CheckOutcome::Declined(_) => "declined",
            CheckOutcome::Applied(_) => "applied",
            CheckOutcome::Held(_) => "held",
        }
    }
}

/// How long the reboot command may run before it counts as failed.
const REBOOT_COMMAND_LIMIT: Duration = Duration::from_secs(60);

/// The longest a wait for a child sleeps before the status line and the
/// stop flag are looked at again.
const WAIT_SLICE: Duration = Duration::from_secs(1);

/// The update state machine with everything it acts on.
pub struct Machine {
    pub cfg: Config,
    mode: Mode,
    store: Store,
    trust: Trust,
    /// The channel followed; `cfg.server`'s URLs point at it.
    channel: Followed,
    /// `manifest_url` and the mirrors as configured, `{channel}` unresolved.
    server_template: crate::config::Server,
    boot: Box<dyn Bootloader>,
    fetcher: Option<Fetcher>,
    slots: SlotPair,
    booted: SlotName,
    boot_id: String,
    device_id: String,
    /// The key reports are signed with, or why there is none.
    identity: crate::device_key::Identity,
    preferred: usize,
    health: Option<HealthRun>,
    /// The reboot command succeeded: when it was last run and how often.
    /// A reboot that does not come within `system.reboot_timeout` (doubled
    /// at each further ask) is warned about, reported and asked again.
    reboot_requested: Option<RebootAsked>,
    waiting_logged: bool,
    /// `updraft apply` came for this job: its hold lets the switch through
    /// (until it switches; a superseding job is not applied with it).
    apply_requested: Option<String>,
    /// The release `policy.write` holds, and the release `updraft apply`
    /// let through (that release only: an approval of 2.0 does not let 4.0
    /// in).
    write_waiting: Option<policy::WriteWait>,
    apply_write: Option<String>,
    /// The DDI action whose `forced` download passes `policy.write` in the
    /// check under way.
    forced_write: Option<String>,
    /// The applications' inhibitors, and who inhibited at the last look.
    inhibitors: crate::inhibit::Inhibitors,
    inhibited_now: Vec<crate::inhibit::Inhibitor>,
    /// What the held job (its id) waits for, as last logged and reported.
    waiting: Option<(String, policy::Wait)>,
    /// The job whose inhibitors were overridden by `policy.max_deferral`
    /// (logged once).
    deferral_logged: Option<String>,
    download_failures: u32,
    /// Shown by status.
    pub last_error: Option<String>,
    pub last_check: Option<Timestamp>,
    pub next_check: Option<Timestamp>,
    pub progress: Option<Progress>,
    /// Set when a release commits: from the start of its job to the commit.
    pub last_install_duration: Option<Duration>,
    /// The server this device answers to ([`server`]).
    server: Server,
    /// The copy of what must outlive the database ([`crate::protect`]).
    protection: crate::protect::Keeper,
    /// Since when the download has been failing for the network's sake.
    network_down_since: Option<Timestamp>,
    /// The hardware rollback floor, when `[rollback]` configures one.
    floor: Option<floor::HardwareFloor>,
    /// The builder keys of `[provenance]`, when configured.
    builders: Option<crate::keys::KeySet>,
}

/// A reboot the reboot command accepted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RebootAsked {
    pub(crate) at: std::time::Instant,
    pub(crate) asks: u32,
}

/// When a reboot asked `asks` times, last at `at`, is overdue: after
/// `timeout`, doubling with each ask, at most an hour between asks (never
/// sooner than `timeout`).
pub(crate) fn reboot_overdue_at(asked: RebootAsked, timeout: Duration) -> std::time::Instant {
    let wait = crate::backoff::ceiling(asked.asks, timeout, Duration::from_secs(3600).max(timeout));
    asked.at + wait
}

impl Machine {
    /// Open the store, trust, bootloader and identity. The caller holds the
    /// state lock.
    pub fn open(mut cfg: Config, mode: Mode) -> Result<Machine> {
        ensure_dir(&cfg.system.state_dir, 0o755).map_err(|e| e.wrap("system.state_dir"))?;
        // Found now, not when the first release arrives: a slot path that
        // does not exist is named with its key.
        for (key, path) in [("slots.a", &cfg.slots.a), ("slots.b", &cfg.slots.b)] {
            if let Err(e) = std::fs::metadata(path) {
                bail!(Config, "{key}: {}: {e}", path.display());
            }
        }
        let (store, recovered) = crate::protect::open_store(&cfg.db_path())?;
        let trust = restore_trust(&cfg, &store)?;
        let builders = cfg.builder_keys()?;
        store.adopt_legacy_floor(trust.version())?;
        let server_template = cfg.server.clone();
        let channel = Followed::resolve(&cfg.server, &store)?;
        cfg.server.follow(&channel.name)?;
        let boot = bootloader::from_config(&cfg)?;
        let inhibitors = crate::inhibit::Inhibitors::new(&cfg.policy)?;
        let booted = crate::bootloader::booted_slot(&cfg)?;
        let boot_id = identity::boot_id(&cfg.system.boot_id_file)?;
        let device_id = identity::device_id(&cfg.device.id_file)?;
        let device_key = crate::device_key::load_or_create(&cfg.system.state_dir);
        let fetcher = if Server::needs_fetcher(&cfg.server) {
            Some(Fetcher::new(&cfg)?)
        } else {
            None
        };
        let server = Server::new(&cfg.server, &device_id, fetcher.as_ref());
        let slots = SlotPair {
            a: cfg.slots.a.clone(),
            b: cfg.slots.b.clone(),
        };
        let preferred = store
            .get("preferred_mirror")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if let Some(r) = &recovered {
            let what = r.describe(&cfg.db_path());
            let slot = booted.to_string();
            crate::logging::event(
                log::Level::Error,
                &crate::logging::EventFields {
                    event: "database-recovered",
                    slot: Some(&slot),
                    reason: Some(&what),
                    ..Default::default()
                },
                format_args!("{what}"),
            );
            let report = report::database_recovered(&device_id, booted, &what);
            store.atomically(|s| {
                s.add_history(&Event {
                    event: "database-recovered",
                    slot: Some(booted),
                    detail: Some(&what),
                    ..Event::default()
                })?;
                if !cfg.server.report_url.is_empty() {
                    s.push_report(&report.as_report())?;
                }
                Ok(())
            })?;
        }
        let protection = crate::protect::Keeper::new(&cfg.db_path());
        Ok(Machine {
            protection,
            network_down_since: None,
            floor: floor::HardwareFloor::from_config(&cfg),
            builders,
            cfg,
            mode,
            store,
            trust,
            channel,
            server_template,
            boot,
            fetcher,
            slots,
            booted,
            boot_id,
            device_id,
            identity: device_key,
            preferred,
            health: None,
            reboot_requested: None,
            waiting_logged: false,
            apply_requested: None,
            write_waiting: None,
            apply_write: None,
            forced_write: None,
            inhibitors,
            inhibited_now: Vec::new(),
            waiting: None,
            deferral_logged: None,
            download_failures: 0,
            last_error: None,
            last_check: None,
            next_check: None,
            progress: None,
            last_install_duration: None,
            server,
        })
    }

    /// The polling interval the DDI server asked for at its last answer,
    /// clamped to [`crate::ddi::MIN_SLEEP`]..=[`crate::ddi::MAX_SLEEP`].
    pub fn server_sleep(&self) -> Option<Duration> {
        self.server.sleep()
    }

    /// Whether the daemon polls a server: a manifest URL, or a DDI server.
    pub fn polls_a_server(&self) -> bool {
        self.server.polled()
    }

    /// Whether the server is polled while a reboot is awaited: a DDI
    /// server's cancelAction is answered then (accepted before the reboot
    /// was requested, rejected after); and any server once the reboot is
    /// overdue, so that it sees the device alive and stuck (a poll starts
    /// no new work while a job is past its switch).
    pub fn polls_while_rebooting(&self) -> bool {
        self.server.polled_while_rebooting() || self.reboot_overdue()
    }

    /// Whether the reboot the command accepted has not come in time (or
    /// had to be asked for again already).
    pub fn reboot_overdue(&self) -> bool {
        self.reboot_requested.is_some_and(|a| a.asks > 1) || self.reboot_due_again()
    }

    /// Whether the reboot the command accepted is due to be asked for
    /// again now.
    pub(crate) fn reboot_due_again(&self) -> bool {
        self.reboot_recheck_at()
            .is_some_and(|at| std::time::Instant::now() >= at)
    }

    /// When the daemon must step a waiting reboot again: the moment it
    /// becomes overdue (`None`: nothing asked yet or no bound).
    pub fn reboot_recheck_at(&self) -> Option<std::time::Instant> {
        self.reboot_requested
            .map(|a| reboot_overdue_at(a, self.cfg.system.reboot_timeout.0))
    }

    /// Whether reports wait to be delivered somewhere.
    pub fn delivers_reports(&self) -> bool {
        self.server.delivers()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn booted(&self) -> SlotName {
        self.booted
    }

    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    pub fn fetcher(&self) -> Option<&Fetcher> {
        self.fetcher.as_ref()
    }

    pub fn state(&self) -> Result<State> {
        Ok(self.store.state()?.0)
    }

    /// Bring the protected copy of the floors, key documents, rejected
    /// images and slot records up to date (written only when they changed).
    pub fn protect(&mut self) {
        if let Err(e) = self.protection.save(&self.store) {
            log::warn!("keeping the protected copy of the database's floors: {e}");
        }
    }

    /// Keep the outbox within its bounds ([`report::bound_outbox`]); what
    /// had to be dropped is logged for the operator.
    pub fn bound_outbox(&self) {
        match report::bound_outbox(&self.store) {
            Ok(None) => {}
            Ok(Some(d)) => log::warn!(
                "outbox full (more than {} reports or {} bytes): dropped the {} oldest undelivered report(s) ({}), {} in all; install results are kept",
                report::OUTBOX_MAX_ROWS,
                report::OUTBOX_MAX_BYTES,
                d.rows,
                d.kinds.join(", "),
                d.total
            ),
            Err(e) => log::warn!("bounding the outbox: {e}"),
        }
    }

    /// Whether the reports go to the server a poll talks to (see
    /// [`Server::reports_go_to_the_polled_server`]).
    pub fn reports_go_to_the_polled_server(&self) -> bool {
        self.server
            .reports_go_to_the_polled_server(&self.cfg.server)
    }

    fn tries(&self) -> u32 {
        self.cfg.bootloader.tries
    }

    /// The attempts a trial boot gets: `bootloader.tries`, as the
    /// bootloader counts them.
    pub fn trial_tries(&self) -> u32 {
        self.boot.trial_tries(self.tries())
    }

    /// Persist a transition with its history line and reports, and log it.
    fn enter(
        &mut self,
        next: State,
        event: &str,
        detail: Option<&str>,
        extra: Vec<Pending>,
    ) -> Result<()> {
        let mut reports = Vec::new();
        if self.server.takes(report::STATE) {
            reports.push(report::state_change(&self.device_id, self.booted, &next));
        }
        if self.fleet_mode() {
            reports.extend(self.fleet_feedback(&next, detail)?);
        }
        // Extras go where this device reports: DDI feedback to a DDI
        // server, the rest to `report_url`.
        reports.extend(extra.into_iter().filter(|p| self.server.takes(p.kind)));
        let refs: Vec<_> = reports.iter().map(Pending::as_report).collect();
        let job = next.job();
        let ev = Event {
            event,
            release: job.map(|j| j.version.as_str()),
            slot: job.map(|j| j.target),
            detail,
        };
        // Settling back to idle is reported but not worth a history line.
        let ev = (!event.is_empty()).then_some(&ev);
        self.store.transition(&next, ev, &refs)?;
        let level = transition_level(next.name(), event);
        if event.is_empty() {
            log::debug!("{}", next.name());
        } else {
            let slot = job.map(|j| j.target.to_string());
            let fields = crate::logging::EventFields {
                event,
                release: job.map(|j| j.version.as_str()),
                slot: slot.as_deref(),
                component: None,
                reason: detail,
            };
            let about = match job {
                Some(j) => format!(": release {} slot {}", j.version, j.target),
                None => String::new(),
            };
            let detail = detail.map(|d| format!(": {d}")).unwrap_or_default();
            crate::logging::event(
                level,
                &fields,
                format_args!("{}{about}{detail}", next.name()),
            );
        }
        Ok(())
    }

    // ---- start of a process -------------------------------------------------

    /// Reconcile the persisted state with this boot (the table in
    /// [`crate::reconcile`]) and carry out what it decides. Called once
    /// when the process starts, before any step.
    pub fn on_boot(&mut self) -> Result<()> {
        self.on_boot_with(&mut crate::progress::NoTick)
    }

    /// [`Machine::on_boot`], serving the driver through `t` while the
    /// bootloader is waited for (a held lock).
    pub fn on_boot_with(&mut self, t: &mut dyn Ticker) -> Result<()> {
        self.recover_components(t)?;
        if self.mode == Mode::Daemon {
            self.catch_up_floor();
        }
        let state = self.state()?;
        match reconcile(state, self.booted, &self.boot_id) {
            Decision::Resume => Ok(()),
            Decision::MarkBootedGood => self
                .boot
                .mark_good_with(self.booted, self.tries(), t)
                .map_err(|e| e.wrap(format!("marking booted slot {} good", self.booted))),
            Decision::Settle => self.enter(State::Idle, "check-interrupted", None, vec![]),
            Decision::Test { job, why } => {
                self.enter(State::Testing(job), "trial-boot", Some(why), vec![])
            }
            Decision::RollBack {
                job,
                reason,
                reject,
            } => self.roll_back(job, &reason, reject),
            Decision::RetryRollback { job } => {
                log::error!(
                    "release {} slot {}: still booted into the rejected slot after the rollback reboot; rolling back again",
                    job.version,
                    job.target
                );
                self.enter(
                    State::Rebooting(job),
                    "rollback-retry",
                    Some("still on the rejected slot"),
                    vec![],
                )
            }
            Decision::Fail { job, reason } => self.fail(job, &reason, "failed"),
        }
    }

    /// The job is back on the old slot: `rolled_back`, with its install
    /// result. With `reject`, the image is remembered as rejected first, so
    /// a crash in between cannot lose the rejection.
    fn roll_back(&mut self, mut job: Job, reason: &str, reject: bool) -> Result<()> {
        self.undo_job_components(&job);
        if reject {
            self.reject_job(&job, reason)?;
            job.reason = Some(reason.to_string());
        }
        let r = report::install_result(
            &self.device_id,
            self.booted,
            "rolled_back",
            &job,
            Some(reason),
        );
        self.enter(State::RolledBack(job), "rolled-back", Some(reason), vec![r])
    }

    /// Remember `job`'s image and the components it changed as rejected,
    /// in one transaction: neither is installed again unless the operator
    /// asks (a release of boot files over the slot already running rejects
    /// that slot's image too, and is declined by its boot files).
    fn reject_job(&self, job: &Job, reason: &str) -> Result<()> {
        self.store.atomically(|s| {
            s.reject(&job.image.sha256, &job.version, reason)?;
            for r in &job.components {
                s.reject_component(&r.name, &r.content)?;
            }
            Ok(())
        })
    }

    /// The attempt failed before the device changed slot: `failed` with
    /// its install result, history `event`.
    fn fail(&mut self, job: Job, reason: &str, event: &str) -> Result<()> {
        self.keep_partial_write(&job)?;
        self.undo_job_components(&job);
        let r = report::install_result(&self.device_id, self.booted, "failed", &job, Some(reason));
        self.enter(
            State::Failed {
                reason: reason.to_string(),
                job: Some(job),
            },
            event,
            Some(reason),
            vec![r],
        )
    }

    /// A full-image download that ended before its last frame (past its
    /// deadline, a frame the server corrupted): its durable frames stay on
    /// the slot for the next job writing the same artifact there, which
    /// resumes after them instead of at frame 0 ([`Store::partial_write`]).
    fn keep_partial_write(&self, job: &Job) -> Result<()> {
        if !matches!(job.method, Method::Full) || !job.writing || job.frames_durable == 0 {
            return Ok(());
        }
        let Ok(m) = self.job_manifest() else {
            return Ok(());
        };
        if job.frames_durable >= m.artifact.frames.len() as u64 {
            // Written whole and failed after: nothing to resume.
            return Ok(());
        }
        self.store
            .set_partial_write(job.target, &m.artifact.sha256, job.frames_durable)
    }

    /// The new slot is rejected (health checks, operator): remember the
    /// image as rejected, then `rebooting` back to the old slot.
    fn start_rollback(&mut self, mut job: Job, reason: &str) -> Result<()> {
        self.health = None;
        // The apps go back before the slot does: the old slot boots with
        // the generations it ran.
        self.undo_job_components(&job);
        self.reject_job(&job, reason)?;
        job.reason = Some(reason.to_string());
        job.purpose = Some(RebootPurpose::Rollback);
        job.boot_id = Some(self.boot_id.clone());
        self.enter(State::Rebooting(job), "rollback", Some(reason), vec![])
    }

    // ---- the state actions ------------------------------------------------------

    /// Run the current state's action once.
    pub fn step(&mut self, t: &mut dyn Ticker) -> Result<Next> {
        let state = self.state()?;
        match state {
            State::Idle => Ok(Next::Idle),
            State::Checking => {
                self.enter(State::Idle, "check-interrupted", None, vec![])?;
                Ok(Next::Continue)
            }
            State::Downloading(job) => self.guard(job, t, Machine::download),
            State::Installing(job) => self.guard(job, t, Machine::install),
            State::Installed(job) => self.installed(job, t),
            State::Rebooting(job) => self.rebooting(job, t),
            State::Testing(job) => self.testing(job, t),
            State::Committed(job) => {
                self.boot.mark_good_with(job.target, self.tries(), t)?;
                self.advance_floor_after_commit(&job)?;
                self.enter(State::Idle, "", None, vec![])?;
                Ok(Next::Continue)
            }
            State::RolledBack(job) => {
                self.boot.mark_bad_with(job.target, t)?;
                self.boot.mark_good_with(self.booted, self.tries(), t)?;
                self.enter(State::Idle, "", None, vec![])?;
                Ok(Next::Continue)
            }
            State::Failed { .. } => {
                self.enter(State::Idle, "", None, vec![])?;
                Ok(Next::Continue)
            }
        }
    }

    /// Run a download/install action; decide between retrying, stopping and
    /// failing the job.
    fn guard(
        &mut self,
        job: Job,
        t: &mut dyn Ticker,
        action: fn(&mut Machine, Job, &mut dyn Ticker) -> Result<Next>,
    ) -> Result<Next> {
        match action(self, job.clone(), t) {
            Ok(n) => {
                self.download_failures = 0;
                self.network_down_since = None;
                self.progress = None;
                Ok(n)
            }
            Err(e) if e.kind() == Kind::Stopped => Err(e),
            Err(e) => {
                let e = install::context(e, &job.version, job.target);
                self.last_error = Some(e.to_string());
                let past_deadline = job.download_deadline.is_some_and(|d| Timestamp::now() >= d)
                    && matches!(self.state(), Ok(State::Downloading(_)));
                let recovery = retry::after_failure(retry::Failed {
                    kind: e.kind(),
                    cause: e.cause(),
                    failures: self.download_failures,
                    daemon: self.mode == Mode::Daemon,
                    past_deadline,
                    delta: matches!(job.method, Method::Delta { .. }),
                });
                let e = match (recovery, job.download_deadline) {
                    (Recovery::Fail { deadline: true }, Some(d))
                        if e.cause() != Some(Cause::Deadline) =>
                    {
                        e.append(format!("the download deadline {d} has passed: not retried"))
                            .with_cause(Cause::Deadline)
                    }
                    _ => e,
                };
                match recovery {
                    Recovery::Retry => self.retry_download(&job, &e),
                    Recovery::FullImage => self.fall_back_to_full(job, &e),
                    Recovery::Fail { .. } => {
                        let state_job = self.state()?.job().cloned().unwrap_or(job);
                        self.fail(state_job, &e.to_string(), "failed")?;
                        self.progress = None;
                        Err(e)
                    }
                }
            }
        }
    }

    /// [`Recovery::Retry`]: the job goes on after a backoff (or the
    /// server's `Retry-After`); the first failure of an outage is noted
    /// for the server, and the status says since when the network is gone.
    fn retry_download(&mut self, job: &Job, e: &Error) -> Result<Next> {
        self.download_failures = self.download_failures.saturating_add(1);
        let first = self.network_down_since.is_none();
        let since = *self.network_down_since.get_or_insert_with(Timestamp::now);
        let delay = retry::delay(
            e.retry_after(),
            self.download_failures,
            self.cfg.server.retry_max.0,
        );
        let until = match job.download_deadline {
            Some(d) => format!("until its deadline {d}"),
            None => "with no deadline".into(),
        };
        log::warn!(
            "{e} (attempt {}, failing since {since}; resuming {until})",
            self.download_failures
        );
        let waiting = format!("waiting for the network since {since}: {e}");
        if first {
            // The action hears it once it can be reached again.
            self.tell_action(
                job,
                &format!("{waiting}; the download resumes when it returns"),
            )?;
        }
        self.last_error = Some(waiting);
        Ok(Next::Retry(delay))
    }

    /// [`Recovery::FullImage`]: a delta that cannot produce the image (a
    /// corrupt patch, a source that changed under it) is not the end of the
    /// update: the full image still is, with a deadline of its own.
    fn fall_back_to_full(&mut self, job: Job, e: &Error) -> Result<Next> {
        log::warn!(
            "release {} slot {}: the delta failed ({e}); falling back to the full image",
            job.version,
            job.target
        );
        let mut full = self.state()?.job().cloned().unwrap_or(job);
        if let Method::Delta { url, .. } = &full.method {
            if let Ok(d) = self.job_manifest().and_then(|m| job_delta(&m, url)) {
                let spool = spool_path(&self.cfg.system.state_dir, &d.sha256);
                let _ = std::fs::remove_file(spool);
            }
        }
        full.method = Method::Full;
        full.writing = true;
        full.frames_durable = 0;
        if let Ok(m) = self.job_manifest() {
            let time = self.cfg.download_time(m.artifact.size);
            full.download_deadline = Some(Timestamp::now().plus(time));
        }
        let reason = format!("delta failed: {e}");
        self.enter(
            State::Downloading(full),
            "delta-fallback",
            Some(&reason),
            vec![],
        )?;
        self.progress = None;
        Ok(Next::Continue)
    }

    /// The slot under test passed: the bootloader keeps it first, and only
    /// then does the database say `committed` (with the committed report).
    /// In this order a power cut between the two leaves `testing` in the
    /// database and the new slot good in the bootloader: the next boot
    /// comes back to it and tests it again. The other way round, a cut
    /// left a committed release (and its report) whose slot the bootloader
    /// had not made permanent, and the next boot fell back to the old slot.
    fn commit(&mut self, job: Job, why: &str, t: &mut dyn Ticker) -> Result<Next> {
        self.boot
            .mark_good_with(job.target, self.tries(), t)
            .map_err(|e| {
                e.wrap(format!(
                    "release {} slot {}: marking the slot good to commit it",
                    job.version, job.target
                ))
            })?;
        let took = Timestamp::now().0 - job.started.0;
        self.last_install_duration = Some(Duration::from_secs(took.max(0) as u64));
        let r = report::install_result(&self.device_id, self.booted, "committed", &job, None);
        let why = if job.components.is_empty() {
            why.to_string()
        } else {
            let done = self.commit_records(&job.version, &job.components)?;
            format!("{why}; component(s) {}", done.join(", "))
        };
        self.enter(State::Committed(job), "committed", Some(&why), vec![r])?;
        Ok(Next::Continue)
    }
}

/// The provisioned anchor and the stored key documents that still chain
/// from it. A stored document that does not (the device was provisioned
/// again with other root keys) is forgotten with a warning, so neither this
/// release nor an older one after a rollback trusts it again.
pub(crate) fn restore_trust(cfg: &Config, store: &Store) -> Result<Trust> {
    let (trust, discarded) = Trust::restore(cfg.trust_anchor()?, &store.key_documents()?);
    for d in discarded {
        log::warn!(
            "discarding stored key document v{}: {}",
            d.version,
            d.reason
        );
        store.forget_key_document(d.version)?;
    }
    Ok(trust)
}

/// How loud the log line of a transition into the state named `next`, by
/// `event`, is: what an operator must act on at WARNING (an attempt that
/// failed, a rollback starting, retried or done), the rest of the cycle at
/// INFO. An attempt superseded by a newer release or cancelled by an
/// operator was decided on purpose and stays at INFO.
pub(crate) fn transition_level(next: &str, event: &str) -> log::Level {
    match (next, event) {
        ("failed", "failed")
        | ("rolled_back", _)
        | ("rebooting", "rollback" | "rollback-retry") => log::Level::Warn,
        _ => log::Level::Info,
    }
}

#[cfg(test)]
mod level_tests {
    use super::transition_level;

    #[test]
    fn operators_see_failures_and_rollbacks_at_warning() {
        use log::Level::{Info, Warn};
        let rows = [
            ("failed", "failed", Warn),
            ("failed", "superseded", Info),
            ("failed", "cancelled", Info),
            ("rolled_back", "rolled-back", Warn),
            ("rebooting", "rollback", Warn),
            ("rebooting", "rollback-retry", Warn),
            ("rebooting", "reboot", Info),
            ("committed", "committed", Info),
            ("downloading", "download", Info),
            ("testing", "trial-boot", Info),
        ];
        for (next, event, level) in rows {
            assert_eq!(transition_level(next, event), level, "{next} by {event}");
        }
    }
}
