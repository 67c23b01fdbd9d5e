//! The update cycle: what each state does and where it goes next.
//!
//! This is the one place where the whole machine can be read. The states and
//! the legal transitions are defined in [`crate::state`]; here every state has
//! one action ([`Machine::step`]), and every action follows the same rule:
//! the transition is persisted *before* the side effect it announces, and
//! each side effect is safe to repeat. A process killed or a power cut at
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
//! ```
//!
//! The machine does not sleep, poll timers or serve sockets: it is driven by
//! the daemon loop ([`crate::daemon`]) or by the one-shot CLI, and it calls
//! the [`Ticker`] it is given during long work so they can.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bootloader::{self, BootState, Bootloader};
use crate::child::Watched;
use crate::clock;
use crate::config::{Config, RebootMode};
use crate::error::{Error, Kind, Result};
use crate::fetch::{Fetched, Fetcher};
use crate::fsutil::ensure_dir;
use crate::hash::Sha256;
use crate::health::{HealthRun, Verdict};
use crate::identity;
use crate::install;
use crate::manifest::{self, Freshness, Manifest};
use crate::progress::{Progress, Ticker};
use crate::reconcile::{Decision, reconcile};
use crate::report::{self, Pending};
use crate::rollout;
use crate::slot::{self, SlotName, SlotPair, SlotWriter};
use crate::source::{Origin, Source};
use crate::state::{Job, Method, RebootPurpose, State};
use crate::store::{Event, SlotRecord, Store};
use crate::timestamp::Timestamp;
use crate::trust::Trust;
use crate::{bail, err};

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
    /// Nothing to do, and why.
    NoChange(String),
}

/// Per-slot view for status.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SlotStatus {
    pub slot: SlotName,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256>,
    pub booted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootable: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tries_left: Option<u32>,
}

/// Everything `updraft status` shows.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Status {
    pub state: String,
    pub since: Timestamp,
    pub device_id: String,
    pub booted_slot: SlotName,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running_version: Option<String>,
    pub slots: Vec<SlotStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_boot: Option<SlotName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootloader_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<Job>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<u64>,
    pub keys_version: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_check: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_check: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub outbox: u64,
}

/// Consecutive transient download failures before a job is failed.
const MAX_DOWNLOAD_RETRIES: u32 = 8;

/// Seconds an ETag is used for conditional polls before one unconditional
/// fetch.
const ETAG_MAX_AGE: i64 = 6 * 3600;

/// How long the reboot command may run before it counts as failed.
const REBOOT_COMMAND_LIMIT: Duration = Duration::from_secs(60);

/// The longest a wait for a child sleeps before the status line and the
/// stop flag are looked at again.
const WAIT_SLICE: Duration = Duration::from_secs(1);

/// How far the clock may be behind a manifest's signing time.
const CLOCK_SKEW: i64 = 300;

/// The update state machine with everything it acts on.
pub struct Machine {
    pub cfg: Config,
    mode: Mode,
    store: Store,
    trust: Trust,
    boot: Box<dyn Bootloader>,
    fetcher: Option<Fetcher>,
    slots: SlotPair,
    booted: SlotName,
    boot_id: String,
    device_id: String,
    preferred: usize,
    health: Option<HealthRun>,
    reboot_requested: bool,
    waiting_logged: bool,
    download_failures: u32,
    /// Shown by status.
    pub last_error: Option<String>,
    pub last_check: Option<Timestamp>,
    pub next_check: Option<Timestamp>,
    pub progress: Option<Progress>,
    /// Set when a release commits: from the start of its job to the commit.
    pub last_install_duration: Option<Duration>,
}

impl Machine {
    /// Open the store, trust, bootloader and identity. The caller holds the
    /// state lock.
    pub fn open(cfg: Config, mode: Mode) -> Result<Machine> {
        ensure_dir(&cfg.system.state_dir, 0o755)?;
        let store = Store::open(&cfg.db_path())?;
        let trust = Trust::new(cfg.trust_anchor()?, store.key_document()?.as_deref())?;
        let boot = bootloader::from_config(&cfg)?;
        let booted = slot::booted_slot(&cfg.slots.cmdline)?;
        let boot_id = identity::boot_id(&cfg.system.boot_id_file)?;
        let device_id = identity::device_id(&cfg.device.id_file)?;
        let fetcher = if cfg.server.manifest_url.is_empty() && cfg.server.report_url.is_empty() {
            None
        } else {
            Some(Fetcher::new(&cfg.server)?)
        };
        let slots = SlotPair {
            a: cfg.slots.a.clone(),
            b: cfg.slots.b.clone(),
        };
        let preferred = store
            .get("preferred_mirror")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Ok(Machine {
            cfg,
            mode,
            store,
            trust,
            boot,
            fetcher,
            slots,
            booted,
            boot_id,
            device_id,
            preferred,
            health: None,
            reboot_requested: false,
            waiting_logged: false,
            download_failures: 0,
            last_error: None,
            last_check: None,
            next_check: None,
            progress: None,
            last_install_duration: None,
        })
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

    /// Reports are queued only when there is somewhere to send them.
    fn reports_enabled(&self) -> bool {
        !self.cfg.server.report_url.is_empty()
    }

    fn tries(&self) -> u32 {
        self.cfg.bootloader.tries
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
        if self.reports_enabled() {
            reports.push(report::state_change(&self.device_id, self.booted, &next));
            reports.extend(extra);
        }
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
        match (job, detail) {
            (Some(j), Some(d)) => log::info!(
                "{}: release {} slot {}: {d}",
                next.name(),
                j.version,
                j.target
            ),
            (Some(j), None) => {
                log::info!("{}: release {} slot {}", next.name(), j.version, j.target)
            }
            (None, Some(d)) => log::info!("{}: {d}", next.name()),
            (None, None) => log::debug!("{}", next.name()),
        }
        Ok(())
    }

    // ---- start of a process -------------------------------------------------

    /// Reconcile the persisted state with this boot (the table in
    /// [`crate::reconcile`]) and carry out what it decides. Called once
    /// when the process starts, before any step.
    pub fn on_boot(&mut self) -> Result<()> {
        let state = self.state()?;
        match reconcile(state, self.booted, &self.boot_id) {
            Decision::Resume => Ok(()),
            Decision::MarkBootedGood => self
                .boot
                .mark_good(self.booted, self.tries())
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
        if reject {
            self.store.reject(&job.image.sha256, &job.version, reason)?;
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

    /// The attempt failed before the device changed slot: `failed` with
    /// its install result, history `event`.
    fn fail(&mut self, job: Job, reason: &str, event: &str) -> Result<()> {
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

    /// The new slot is rejected (health checks, operator): remember the
    /// image as rejected, then `rebooting` back to the old slot.
    fn start_rollback(&mut self, mut job: Job, reason: &str) -> Result<()> {
        self.health = None;
        self.store.reject(&job.image.sha256, &job.version, reason)?;
        job.reason = Some(reason.to_string());
        job.purpose = Some(RebootPurpose::Rollback);
        job.boot_id = Some(self.boot_id.clone());
        self.enter(State::Rebooting(job), "rollback", Some(reason), vec![])
    }

    // ---- checking -------------------------------------------------------------

    /// Look for a release at `origin` (the configured server when `None`)
    /// and start installing it when it is new and applies. `operator` marks
    /// an explicit install: rollout and earlier rejections do not apply.
    pub fn check(
        &mut self,
        origin: Option<Origin>,
        operator: bool,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let default_origin = origin.is_none();
        let origin = match origin {
            Some(o) => o,
            None => {
                if self.cfg.server.manifest_url.is_empty() {
                    bail!(Config, "server.manifest_url is not set: nothing to poll");
                }
                Origin::parse(&self.cfg.server.manifest_url, &self.cfg.server.mirrors)
            }
        };
        if origin.is_remote() && self.fetcher.is_none() {
            self.fetcher = Some(Fetcher::new(&self.cfg.server)?);
        }
        self.last_check = Some(Timestamp::now());
        let state = self.state()?;
        // Checking is not persisted: a check that finds nothing to do
        // writes nothing (an idle poll costs no flash writes); only what a
        // check leads to is recorded.
        log::debug!("checking {}", origin.to_arg());
        let result = self.check_inner(&origin, default_origin, operator, &state, t);
        match &result {
            Ok(CheckOutcome::Started { .. }) => {}
            Ok(CheckOutcome::NoChange(why)) => log::info!("check: {why}"),
            Err(e) => {
                self.last_error = Some(e.to_string());
                // A repeated failure (same reason) folds in the outbox and
                // is not written to history again.
                let previous = self.store.get("last_check_error")?;
                if previous.as_deref() != Some(e.message()) {
                    let ev = Event {
                        event: "check-failed",
                        detail: Some(e.message()),
                        ..Event::default()
                    };
                    let r = report::check_failed(
                        &self.device_id,
                        self.booted,
                        e.kind().as_str(),
                        e.message(),
                    );
                    let enabled = self.reports_enabled();
                    self.store.atomically(|s| {
                        s.add_history(&ev)?;
                        if enabled {
                            s.push_report(&r.as_report())?;
                        }
                        s.set("last_check_error", e.message())
                    })?;
                } else if self.reports_enabled() {
                    let r = report::check_failed(
                        &self.device_id,
                        self.booted,
                        e.kind().as_str(),
                        e.message(),
                    );
                    self.store.push_report(&r.as_report())?;
                }
            }
        }
        if result.is_ok() {
            if self
                .store
                .get("last_check_error")?
                .is_some_and(|e| !e.is_empty())
            {
                self.store.set("last_check_error", "")?;
            }
            self.last_error = None;
        }
        result
    }

    fn check_inner(
        &mut self,
        origin: &Origin,
        default_origin: bool,
        operator: bool,
        state: &State,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let now = Timestamp::now();
        clock::check(now, self.store.time_floor()?)?;
        let etag = if default_origin {
            self.store.get("etag")?.filter(|e| !e.is_empty())
        } else {
            None
        };
        // A 304 only saves the transfer: the cached manifest is evaluated
        // again exactly as a fresh one would be, so an answer that was
        // interrupted (power cut, crash) before it was acted on is acted on
        // now.
        let cached = if default_origin {
            self.store.get("manifest_cache")?
        } else {
            None
        };
        // Not every server's ETag changes with the content (nginx's is the
        // modification second and the size): fetch unconditionally now and
        // then so a stale ETag cannot hide a new manifest for long.
        let fresh = self
            .store
            .get("etag_time")?
            .and_then(|t| t.parse::<i64>().ok())
            .is_some_and(|t| now.0 - t < ETAG_MAX_AGE);
        let etag = etag.filter(|_| cached.is_some() && fresh);
        let (raw, new_etag, fetched_body) = match self.fetch_manifest(origin, etag.as_deref(), t)? {
            Fetched::Body { bytes, etag } => (bytes, etag, true),
            Fetched::NotModified => match cached {
                Some(c) => (c.into_bytes(), etag, false),
                None => match self.fetch_manifest(origin, None, t)? {
                    Fetched::Body { bytes, etag } => (bytes, etag, true),
                    Fetched::NotModified => bail!(
                        Network,
                        "the server answered 304 to an unconditional request"
                    ),
                },
            },
        };
        // Look for a key document no manifest named yet every few hours, so
        // a revocation reaches devices even if manifests do not name it.
        let probe_keys = default_origin
            && self
                .store
                .get("keys_probe_time")?
                .and_then(|t| t.parse::<i64>().ok())
                .is_none_or(|t| now.0 - t >= ETAG_MAX_AGE);
        self.update_keys(origin, &raw, probe_keys, t)?;
        if probe_keys {
            self.store.set("keys_probe_time", &now.0.to_string())?;
        }
        let vm = manifest::verify(&raw, &self.trust)?;
        let m = vm.manifest;
        if now.0 + CLOCK_SKEW < m.issued.0 {
            bail!(
                Clock,
                "manifest serial {} was signed at {}, after the system clock ({now}): waiting for time synchronisation",
                m.serial,
                m.issued
            );
        }
        let freshness = m.check_policy(now, self.store.serial()?, &self.cfg.device.compatible)?;
        self.store.accept_manifest(m.serial, m.issued)?;
        if default_origin {
            // Cache what was verified, for the next 304.
            match std::str::from_utf8(&raw) {
                Ok(text) => {
                    if self.store.get("manifest_cache")?.as_deref() != Some(text) {
                        self.store.set("manifest_cache", text)?;
                    }
                    // Written only when something changed: an idle poll
                    // against a server without ETags writes nothing either.
                    let new = new_etag.as_deref().unwrap_or("");
                    if fetched_body && !new.is_empty() {
                        if self.store.get("etag")?.as_deref() != Some(new) || !fresh {
                            self.store.set("etag", new)?;
                            self.store.set("etag_time", &now.0.to_string())?;
                        }
                    } else if fetched_body && self.store.get("etag")?.is_some_and(|e| !e.is_empty())
                    {
                        self.store.set("etag", "")?;
                    }
                }
                Err(_) => self.store.set("etag", "")?,
            }
        }
        if let Some(job) = state.job().filter(|_| state.busy()) {
            if job.image == m.image {
                return Ok(CheckOutcome::NoChange(format!(
                    "release {} is already being installed into slot {} ({})",
                    job.version,
                    job.target,
                    state.name()
                )));
            }
            bail!(
                Busy,
                "an update to {} is in progress ({}); finish it before installing {}",
                job.version,
                state.name(),
                m.release.version
            );
        }
        if let Some(rec) = self.store.slot_record(self.booted)? {
            if rec.sha256 == m.image.sha256 && rec.size == m.image.size {
                let why = match freshness {
                    Freshness::Unchanged => format!(
                        "manifest serial {} is unchanged; release {} is running",
                        m.serial, m.release.version
                    ),
                    Freshness::New => format!(
                        "release {} (serial {}) is already running in slot {}",
                        m.release.version, m.serial, self.booted
                    ),
                };
                return Ok(CheckOutcome::NoChange(why));
            }
        }
        if let Some(reason) = self.store.rejected(&m.image.sha256)? {
            if !operator {
                return Ok(CheckOutcome::NoChange(format!(
                    "release {} was rolled back before ({reason}); it is not installed again automatically",
                    m.release.version
                )));
            }
            log::info!(
                "release {}: installing again on operator request despite an earlier rollback",
                m.release.version
            );
            self.store.unreject(&m.image.sha256)?;
        }
        if !operator {
            if let Some(r) = &m.release.rollout {
                if !rollout::eligible(&self.device_id, &m.release.version, r.percent) {
                    return Ok(CheckOutcome::NoChange(format!(
                        "release {} is rolled out to {}% of devices; this device is not selected",
                        m.release.version, r.percent
                    )));
                }
            }
        }
        self.plan(origin, &m, t)
    }

    /// Fetch the manifest (on a helper thread for remote origins).
    fn fetch_manifest(
        &mut self,
        origin: &Origin,
        etag: Option<&str>,
        t: &mut dyn Ticker,
    ) -> Result<Fetched> {
        match self.fetcher.clone() {
            Some(f) if origin.is_remote() => {
                let o = origin.clone();
                let pref = self.preferred;
                let etag = etag.map(str::to_string);
                let (res, pref) = crate::worker::offload(
                    "check",
                    move || {
                        let mut s = Source::new(o, Some(f), pref);
                        let r = s.manifest(etag.as_deref());
                        (r, s.preferred())
                    },
                    t,
                )?;
                self.set_preferred(pref)?;
                res
            }
            _ => Source::new(origin.clone(), None, 0).manifest(None),
        }
    }

    fn set_preferred(&mut self, pref: usize) -> Result<()> {
        if pref != self.preferred {
            self.preferred = pref;
            self.store.set("preferred_mirror", &pref.to_string())?;
        }
        Ok(())
    }

    /// Fetch and accept newer key documents the manifest calls for. With
    /// `probe`, also look for the next version when none is named, so a
    /// revocation reaches devices even if manifests do not name it (the
    /// caller does this every few hours, not on every poll).
    fn update_keys(
        &mut self,
        origin: &Origin,
        raw: &[u8],
        probe: bool,
        t: &mut dyn Ticker,
    ) -> Result<()> {
        let hint = manifest::keys_version_hint(raw);
        for _ in 0..64 {
            let Some(version) = self.trust.needs(hint) else {
                if probe && !self.trust.is_simple() {
                    self.probe_next_keys(origin, t);
                }
                return Ok(());
            };
            let doc = self.fetch_key_document(origin, version, t)?;
            self.accept_key_document(version, &doc)?;
        }
        bail!(Signature, "more than 64 key documents in one check")
    }

    fn fetch_key_document(
        &mut self,
        origin: &Origin,
        version: u64,
        t: &mut dyn Ticker,
    ) -> Result<Vec<u8>> {
        match self.fetcher.clone() {
            Some(f) if origin.is_remote() => {
                let o = origin.clone();
                let pref = self.preferred;
                crate::worker::offload(
                    "keys",
                    move || Source::new(o, Some(f), pref).key_document(version),
                    t,
                )?
            }
            _ => Source::new(origin.clone(), None, 0).key_document(version),
        }
    }

    fn accept_key_document(&mut self, version: u64, doc: &[u8]) -> Result<()> {
        let what = format!("key document keys/{version}.json");
        let accepted = self.trust.accept(doc, &what)?;
        let (v, release) = (accepted.version, accepted.release.len());
        self.store.put_key_document(v, doc)?;
        log::info!("accepted {what}: version {v}, {release} release key(s)");
        Ok(())
    }

    /// Look for key document N+1 that no manifest named yet. Absent is the
    /// normal case; anything wrong with it is logged, never fatal here.
    fn probe_next_keys(&mut self, origin: &Origin, t: &mut dyn Ticker) {
        let next = self.trust.version() + 1;
        match self.fetch_key_document(origin, next, t) {
            Ok(doc) => {
                if let Err(e) = self.accept_key_document(next, &doc) {
                    log::warn!("ignoring keys/{next}.json found beside the manifest: {e}");
                }
            }
            Err(e) => log::debug!("no keys/{next}.json yet: {e}"),
        }
    }

    /// Choose target slot and method, and start the job.
    fn plan(&mut self, origin: &Origin, m: &Manifest, t: &mut dyn Ticker) -> Result<CheckOutcome> {
        let target = self.booted.other();
        let target_path = self.slots.path(target).to_path_buf();
        let booted_path = self.slots.path(self.booted).to_path_buf();
        if slot::same_slot(&target_path, &booted_path)? {
            bail!(
                Slot,
                "slot {target} ({}) is the same device as the booted slot {} ({}): refusing to write it",
                target_path.display(),
                self.booted,
                booted_path.display()
            );
        }
        let capacity = slot::capacity(&target_path)?;
        if m.image.size > capacity {
            bail!(
                Slot,
                "release {} image is {} bytes, slot {target} ({}) holds only {capacity}",
                m.release.version,
                m.image.size,
                target_path.display()
            );
        }
        let mut method = Method::Full;
        let mut hashed: Vec<(u64, Option<Sha256>)> = Vec::new();
        for d in &m.deltas {
            let h = match hashed.iter().find(|(len, _)| *len == d.from_size) {
                Some((_, h)) => *h,
                None => {
                    let h = install::hash_slot_prefix(&booted_path, d.from_size, t)?;
                    hashed.push((d.from_size, h));
                    h
                }
            };
            if h == Some(d.from_sha256) {
                method = Method::Delta {
                    url: d.url.clone(),
                    size: d.size,
                };
                break;
            }
        }
        if !m.deltas.is_empty() && method == Method::Full {
            log::info!(
                "release {}: no delta matches the contents of slot {}; using the full image",
                m.release.version,
                self.booted
            );
        }
        let job = Job {
            id: report::new_key(),
            version: m.release.version.clone(),
            serial: m.serial,
            image: m.image,
            source: origin.to_arg(),
            target,
            method: method.clone(),
            started: Timestamp::now(),
            frames_durable: 0,
            writing: false,
            bytes_downloaded: 0,
            boot_id: None,
            purpose: None,
            reason: None,
            installed: None,
            stream_verified: false,
        };
        let payload =
            serde_json::to_string(m).map_err(|e| err!(Store, "encoding manifest: {e}"))?;
        self.store.set("job_manifest", &payload)?;
        let how = match &method {
            Method::Full => format!("full image, {} bytes", m.artifact.size),
            Method::Delta { size, .. } => format!("delta, {size} bytes"),
        };
        self.download_failures = 0;
        self.enter(State::Downloading(job), "download", Some(&how), vec![])?;
        Ok(CheckOutcome::Started {
            version: m.release.version.clone(),
            target,
            delta: matches!(method, Method::Delta { .. }),
        })
    }

    fn job_manifest(&self) -> Result<Manifest> {
        let text = self.store.get("job_manifest")?.ok_or_else(|| {
            err!(
                Store,
                "the manifest of the current job is missing from the database"
            )
        })?;
        serde_json::from_str(&text)
            .map_err(|e| err!(Store, "stored job manifest is unreadable: {e}"))
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
            State::Installed(job) => self.installed(job),
            State::Rebooting(job) => self.rebooting(job, t),
            State::Testing(job) => self.testing(job, t),
            State::Committed(job) => {
                self.boot.mark_good(job.target, self.tries())?;
                self.enter(State::Idle, "", None, vec![])?;
                Ok(Next::Continue)
            }
            State::RolledBack(job) => {
                self.boot.mark_bad(job.target)?;
                self.boot.mark_good(self.booted, self.tries())?;
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
                self.progress = None;
                Ok(n)
            }
            Err(e) if e.kind() == Kind::Stopped => Err(e),
            Err(e) => {
                let e = install::context(e, &job.version, job.target);
                self.last_error = Some(e.to_string());
                let transient = matches!(e.kind(), Kind::Network | Kind::Busy);
                if self.mode == Mode::Daemon
                    && transient
                    && self.download_failures < MAX_DOWNLOAD_RETRIES
                {
                    self.download_failures += 1;
                    log::warn!(
                        "{e} (attempt {} of {MAX_DOWNLOAD_RETRIES}; resuming later)",
                        self.download_failures
                    );
                    let delay = e.retry_after().unwrap_or_else(|| {
                        crate::backoff::full_jitter(
                            self.download_failures,
                            Duration::from_secs(5),
                            self.cfg.server.retry_max.0,
                        )
                    });
                    return Ok(Next::Retry(delay));
                }
                if let Method::Delta { .. } = &job.method {
                    if matches!(e.kind(), Kind::Integrity | Kind::Malformed) {
                        // A delta that cannot produce the image (a corrupt
                        // patch, a source that changed under it) is not the
                        // end of the update: the full image still is.
                        log::warn!(
                            "release {} slot {}: the delta failed ({e}); falling back to the full image",
                            job.version,
                            job.target
                        );
                        let mut full = self.state()?.job().cloned().unwrap_or(job);
                        if let Method::Delta { url, .. } = &full.method {
                            if let Ok(m) = self.job_manifest() {
                                if let Some(d) = m.deltas.iter().find(|d| &d.url == url) {
                                    let _ = std::fs::remove_file(spool_path(
                                        &self.cfg.system.state_dir,
                                        &d.sha256,
                                    ));
                                }
                            }
                        }
                        full.method = Method::Full;
                        full.writing = true;
                        full.frames_durable = 0;
                        let reason = format!("delta failed: {e}");
                        self.enter(
                            State::Downloading(full),
                            "delta-fallback",
                            Some(&reason),
                            vec![],
                        )?;
                        self.progress = None;
                        return Ok(Next::Continue);
                    }
                }
                let state_job = self.state()?.job().cloned().unwrap_or(job);
                self.fail(state_job, &e.to_string(), "failed")?;
                self.progress = None;
                Err(e)
            }
        }
    }

    fn download(&mut self, mut job: Job, t: &mut dyn Ticker) -> Result<Next> {
        let m = self.job_manifest()?;
        let target = self.slots.path(job.target).to_path_buf();
        let booted = self.slots.path(self.booted).to_path_buf();
        let origin = Origin::parse(&job.source, &self.cfg.server.mirrors);
        if origin.is_remote() && self.fetcher.is_none() {
            self.fetcher = Some(Fetcher::new(&self.cfg.server)?);
        }
        let mut tick = Tracker {
            inner: t,
            progress: &mut self.progress,
        };
        match job.method.clone() {
            Method::Full => {
                let mut writer = SlotWriter::open(&target, &booted, self.cfg.system.sync_bytes)?;
                let frames = &m.artifact.frames;
                let start = if job.writing || job.frames_durable > 0 {
                    let hint = (job.frames_durable as usize).min(frames.len());
                    let start = install::probe_frames(&target, frames, hint, &mut tick)?;
                    log::info!(
                        "release {} slot {}: resuming at frame {start} of {} ({} frames were durable)",
                        job.version,
                        job.target,
                        frames.len(),
                        hint
                    );
                    start
                } else {
                    0
                };
                // The target leaves the boot order right before the first
                // byte is written to it, so a half-written slot can never
                // be booted, and a download that never starts leaves it be.
                let (boot, store, slot) = (&mut self.boot, &self.store, job.target);
                let mut writing_job = job.clone();
                writing_job.writing = true;
                let mut before_write = || -> Result<()> {
                    boot.disable(slot)?;
                    store.forget_slot(slot)?;
                    store.update_state(&State::Downloading(writing_job.clone()))
                };
                let mut durable_job = job.clone();
                durable_job.writing = true;
                let mut on_durable = |n: u64| -> Result<()> {
                    durable_job.frames_durable = n;
                    store.update_state(&State::Downloading(durable_job.clone()))
                };
                let mut src = Source::new(origin, self.fetcher.clone(), self.preferred);
                let outcome = install::write_full(
                    &mut src,
                    &m,
                    &mut writer,
                    install::FullOptions {
                        start,
                        hash_image: !self.cfg.system.readback,
                    },
                    &mut tick,
                    install::WriteHooks {
                        before_write: &mut before_write,
                        on_durable: &mut on_durable,
                    },
                )?;
                let pref = src.preferred();
                writer.finish()?;
                job.frames_durable = frames.len() as u64;
                job.bytes_downloaded += outcome.bytes_read;
                job.stream_verified = outcome.hashed_in_stream && start == 0;
                self.set_preferred(pref)?;
            }
            Method::Delta { url, .. } => {
                let Some(d) = m.deltas.iter().find(|d| d.url == url).cloned() else {
                    bail!(Store, "the job's delta {url} is not in its manifest");
                };
                let spool = spool_path(&self.cfg.system.state_dir, &d.sha256);
                let mut src = Source::new(origin, self.fetcher.clone(), self.preferred);
                let n = install::download_delta(&mut src, &d, &spool, &mut tick)?;
                let pref = src.preferred();
                job.bytes_downloaded += n;
                self.set_preferred(pref)?;
            }
        }
        let what = match job.method {
            Method::Full => "all frames written; reading the slot back",
            Method::Delta { .. } => "delta downloaded and verified; applying it",
        };
        self.enter(State::Installing(job), "verify", Some(what), vec![])?;
        Ok(Next::Continue)
    }

    fn install(&mut self, mut job: Job, t: &mut dyn Ticker) -> Result<Next> {
        let m = self.job_manifest()?;
        let target = self.slots.path(job.target).to_path_buf();
        let booted = self.slots.path(self.booted).to_path_buf();
        let mut tick = Tracker {
            inner: t,
            progress: &mut self.progress,
        };
        match job.method.clone() {
            Method::Full => {
                if self.cfg.system.readback || !job.stream_verified {
                    install::verify_slot(&target, &m.image, &mut tick)?;
                }
            }
            Method::Delta { url, .. } => {
                let Some(d) = m.deltas.iter().find(|d| d.url == url).cloned() else {
                    bail!(Store, "the job's delta {url} is not in its manifest");
                };
                let spool = spool_path(&self.cfg.system.state_dir, &d.sha256);
                let mut writer = SlotWriter::open(&target, &booted, self.cfg.system.sync_bytes)?;
                // Out of the boot order before the patch writes a byte.
                self.boot.disable(job.target)?;
                self.store.forget_slot(job.target)?;
                install::apply_delta(
                    &booted,
                    d.from_size,
                    &spool,
                    &m.image,
                    &mut writer,
                    &mut tick,
                )?;
                writer.finish()?;
                if self.cfg.system.readback {
                    install::verify_slot(&target, &m.image, &mut tick)?;
                }
                let _ = std::fs::remove_file(&spool);
            }
        }
        self.store.set_slot_record(&SlotRecord {
            slot: job.target,
            version: job.version.clone(),
            sha256: m.image.sha256,
            size: m.image.size,
            installed: Timestamp::now(),
        })?;
        job.installed = Some(Timestamp::now());
        job.boot_id = Some(self.boot_id.clone());
        job.purpose = Some(RebootPurpose::Trial);
        let how = match job.method {
            Method::Full => "verified on the slot (full image)",
            Method::Delta { .. } => "verified on the slot (delta)",
        };
        self.enter(State::Installed(job), "installed", Some(how), vec![])?;
        Ok(Next::Continue)
    }

    fn installed(&mut self, mut job: Job) -> Result<Next> {
        self.boot.trial(job.target, self.tries())?;
        log::info!(
            "release {} slot {}: first in the boot order for a trial boot ({} tries)",
            job.version,
            job.target,
            self.tries()
        );
        if self.mode == Mode::Oneshot {
            return Ok(Next::Done);
        }
        job.boot_id = Some(self.boot_id.clone());
        job.purpose = Some(RebootPurpose::Trial);
        self.enter(
            State::Rebooting(job),
            "reboot",
            Some("into the new slot for its trial boot"),
            vec![],
        )?;
        Ok(Next::Continue)
    }

    fn rebooting(&mut self, job: Job, t: &mut dyn Ticker) -> Result<Next> {
        if job.purpose == Some(RebootPurpose::Rollback) {
            self.boot.mark_bad(job.target)?;
            self.boot.mark_good(job.target.other(), self.tries())?;
        }
        if self.mode == Mode::Oneshot {
            return Ok(Next::Done);
        }
        let into = match job.purpose {
            Some(RebootPurpose::Rollback) => job.target.other(),
            _ => job.target,
        };
        match self.cfg.system.reboot {
            RebootMode::Auto if !self.reboot_requested => {
                log::info!(
                    "release {} slot {}: rebooting into slot {into}",
                    job.version,
                    job.target
                );
                match run_reboot(&self.cfg.system.reboot_command, t) {
                    Ok(()) => self.reboot_requested = true,
                    // Asked again at the next step (the daemon steps a
                    // waiting reboot every few minutes).
                    Err(e) => {
                        log::error!("release {} slot {}: {e}", job.version, job.target);
                        self.last_error = Some(e.to_string());
                    }
                }
            }
            RebootMode::Manual if !self.waiting_logged => {
                self.waiting_logged = true;
                log::info!(
                    "release {} slot {}: waiting for an operator to reboot into slot {into} (system.reboot = \"manual\")",
                    job.version,
                    job.target
                );
            }
            _ => {}
        }
        Ok(Next::WaitReboot)
    }

    fn testing(&mut self, job: Job, t: &mut dyn Ticker) -> Result<Next> {
        if self.mode == Mode::Oneshot {
            bail!(
                Busy,
                "release {} in slot {} is under test: the daemon runs its health checks (or use updraft mark-good / mark-bad)",
                job.version,
                job.target
            );
        }
        if self.health.is_none() {
            let previous = self
                .store
                .slot_record(job.target.other())?
                .map(|r| r.version)
                .unwrap_or_default();
            let env = vec![
                ("UPDRAFT_SLOT".to_string(), job.target.as_str().to_string()),
                ("UPDRAFT_VERSION".to_string(), job.version.clone()),
                ("UPDRAFT_PREVIOUS_VERSION".to_string(), previous),
            ];
            self.health = Some(HealthRun::start(
                &self.cfg.health,
                &self.cfg.system.state_dir,
                env,
            )?);
            log::info!(
                "release {} slot {}: running health checks",
                job.version,
                job.target
            );
        }
        let progress = Progress {
            phase: "health".into(),
            ..Progress::default()
        };
        let verdict = loop {
            let Some(h) = self.health.as_mut() else {
                break Verdict::Fail("health run lost".into());
            };
            if let Some(v) = h.poll() {
                break v;
            }
            t.tick(&progress)?;
            // Asleep until the check exits, its time is up, or a client
            // calls; at least once a second for the status line.
            t.wait(h.wait_fd(), h.until_limit().min(WAIT_SLICE))?;
        };
        self.health = None;
        let verdict = match verdict {
            Verdict::Pass if self.cfg.health.check_server => self.server_reachable(t),
            v => v,
        };
        match verdict {
            Verdict::Pass => self.commit(job, "health checks passed"),
            Verdict::Fail(reason) => {
                self.start_rollback(job, &reason)?;
                Ok(Next::Continue)
            }
        }
    }

    fn server_reachable(&mut self, t: &mut dyn Ticker) -> Verdict {
        let Some(f) = self.fetcher.clone() else {
            return Verdict::Fail("health.check_server is set but no server is configured".into());
        };
        let url = self.cfg.server.manifest_url.clone();
        let r = crate::worker::offload(
            "health",
            move || {
                f.get_small(&url, manifest::MAX_MANIFEST_BYTES as u64, None)
                    .map(|_| ())
            },
            t,
        );
        match r {
            Ok(Ok(())) => Verdict::Pass,
            Ok(Err(e)) | Err(e) => Verdict::Fail(format!("update server unreachable: {e}")),
        }
    }

    fn commit(&mut self, job: Job, why: &str) -> Result<Next> {
        let took = Timestamp::now().0 - job.started.0;
        self.last_install_duration = Some(Duration::from_secs(took.max(0) as u64));
        let r = report::install_result(&self.device_id, self.booted, "committed", &job, None);
        self.enter(State::Committed(job), "committed", Some(why), vec![r])?;
        Ok(Next::Continue)
    }

    // ---- operator commands ----------------------------------------------------

    /// `updraft mark-good`: commit a slot under test, or re-mark the running
    /// slot good.
    pub fn mark_good(&mut self) -> Result<String> {
        match self.state()? {
            State::Testing(job) => {
                self.health = None;
                let msg = format!(
                    "release {} in slot {} marked good by the operator",
                    job.version, job.target
                );
                self.commit(job, "marked good by the operator")?;
                Ok(msg)
            }
            s if !s.busy() => {
                self.boot.mark_good(self.booted, self.tries())?;
                Ok(format!("slot {} marked good", self.booted))
            }
            s => bail!(Busy, "cannot mark good while {}", s.name()),
        }
    }

    /// `updraft mark-bad`: fail a slot under test (roll back), or cancel an
    /// installed release before its trial boot.
    pub fn mark_bad(&mut self) -> Result<String> {
        match self.state()? {
            State::Testing(job) => {
                let msg = format!(
                    "release {} in slot {} marked bad; rolling back to slot {}",
                    job.version,
                    job.target,
                    job.target.other()
                );
                self.start_rollback(job, "marked bad by the operator")?;
                Ok(msg)
            }
            State::Installed(job) | State::Rebooting(job)
                if job.purpose != Some(RebootPurpose::Rollback) =>
            {
                self.boot.mark_bad(job.target)?;
                let msg = format!(
                    "release {} in slot {}: trial boot cancelled",
                    job.version, job.target
                );
                self.fail(job, "trial boot cancelled by the operator", "cancelled")?;
                Ok(msg)
            }
            s => bail!(
                Busy,
                "nothing to mark bad: no release is under test (state {})",
                s.name()
            ),
        }
    }

    /// Queue a heartbeat report.
    pub fn heartbeat(&mut self) -> Result<()> {
        if !self.reports_enabled() {
            return Ok(());
        }
        let state = self.state()?;
        let running = self.store.slot_record(self.booted)?.map(|r| r.version);
        let r = report::heartbeat(&self.device_id, self.booted, &state, running.as_deref());
        self.store.push_report(&r.as_report())
    }

    /// Deliver queued reports, if a report URL is configured.
    pub fn deliver_reports(&mut self, t: &mut dyn Ticker) -> Result<usize> {
        let url = self.cfg.server.report_url.clone();
        if url.is_empty() {
            return Ok(0);
        }
        let Some(f) = self.fetcher.clone() else {
            return Ok(0);
        };
        report::deliver(&self.store, &f, &url, t)
    }

    // ---- status -----------------------------------------------------------------

    pub fn status(&mut self) -> Result<Status> {
        let (state, since) = self.store.state()?;
        let (boot, boot_err) = match self.boot.read() {
            Ok(b) => (Some(b), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let slots = self.slot_statuses(boot.as_ref())?;
        let running = slots
            .iter()
            .find(|s| s.booted)
            .and_then(|s| s.version.clone());
        Ok(Status {
            state: state.name().into(),
            since,
            device_id: self.device_id.clone(),
            booted_slot: self.booted,
            running_version: running,
            slots,
            next_boot: boot.as_ref().and_then(BootState::next_boot),
            bootloader_error: boot_err,
            job: state.job().cloned(),
            progress: self.progress.clone(),
            serial: self.store.serial()?,
            keys_version: self.trust.version(),
            last_check: self.last_check,
            next_check: self.next_check,
            last_error: self.last_error.clone(),
            outbox: self.store.outbox_len()?,
        })
    }

    fn slot_statuses(&self, boot: Option<&BootState>) -> Result<Vec<SlotStatus>> {
        [SlotName::A, SlotName::B]
            .into_iter()
            .map(|s| {
                let rec = self.store.slot_record(s)?;
                let b = boot.map(|b| b.slot(s));
                Ok(SlotStatus {
                    slot: s,
                    path: self.slots.path(s).display().to_string(),
                    version: rec.as_ref().map(|r| r.version.clone()),
                    sha256: rec.as_ref().map(|r| r.sha256),
                    booted: s == self.booted,
                    bootable: b.map(|b| b.bootable),
                    tries_left: b.map(|b| b.tries_left),
                })
            })
            .collect()
    }
}

/// Records the latest progress for status while forwarding ticks.
struct Tracker<'a> {
    inner: &'a mut dyn Ticker,
    progress: &'a mut Option<Progress>,
}

impl Ticker for Tracker<'_> {
    fn tick(&mut self, p: &Progress) -> Result<()> {
        *self.progress = Some(p.clone());
        self.inner.tick(p)
    }
}

/// Where a delta is downloaded before it is applied.
fn spool_path(state_dir: &std::path::Path, sha: &Sha256) -> std::path::PathBuf {
    state_dir.join(format!("delta-{}.partial", sha.short()))
}

/// Run the configured reboot command, bounded. The wait sleeps on the
/// command's pidfd through the ticker, so the daemon keeps answering.
fn run_reboot(cmd: &[String], t: &mut dyn Ticker) -> Result<()> {
    let Some((prog, args)) = cmd.split_first() else {
        bail!(Config, "system.reboot_command is empty");
    };
    let mut cmd = std::process::Command::new(prog);
    crate::notify::scrub(&mut cmd);
    cmd.args(args).stdin(std::process::Stdio::null());
    let mut child =
        Watched::spawn(&mut cmd).map_err(|e| err!(Io, "starting reboot command {prog}: {e}"))?;
    let deadline = std::time::Instant::now() + REBOOT_COMMAND_LIMIT;
    let progress = Progress {
        phase: "reboot".into(),
        ..Progress::default()
    };
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => bail!(Io, "reboot command {prog} failed: {status}"),
            Ok(None) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    child.kill();
                    bail!(
                        Io,
                        "reboot command {prog} did not finish within {} s",
                        REBOOT_COMMAND_LIMIT.as_secs()
                    );
                }
                if let Err(e) = t.tick(&progress) {
                    // Stopping: the command goes on (it is the reboot);
                    // this process does not wait for it.
                    return Err(e);
                }
                t.wait(child.fd(), left.min(WAIT_SLICE))?;
            }
            Err(e) => {
                return Err(Error::new(
                    Kind::Io,
                    format!("waiting for reboot command {prog}: {e}"),
                ));
            }
        }
    }
}
