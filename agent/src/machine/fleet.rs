//! The machine driven by a hawkBit DDI server (`server.kind = "hawkbit"`):
//! what a poll of the controller base leads to, and what each transition
//! of a job the server assigned tells the server.
//!
//! A poll ([`Machine::check_fleet`]) reads the controller base and acts on
//! it in this order:
//!
//! 1. **configData**: the attributes the server keeps about the device
//!    (the committed release as `sw_version`, `compatible`, the booted
//!    slot, updraft's version) are queued when the server asks for them
//!    or when they changed since they were last queued;
//! 2. **cancelAction**: a job of the action to stop is ended at once if it
//!    has not been switched in (its download stops at the next frame), and
//!    the server is told `closed`/`success`; a job past its switch cannot
//!    be stopped: `rejected`;
//! 3. **deploymentBase**: a new action is read, its release located
//!    ([`crate::hawkbit::release_origin`]) and its signed manifest
//!    verified exactly as in static mode (signatures, key chain, channel,
//!    serial, expiry, compatibility); the server's listing must agree with
//!    it; then the same decision as a static poll's (`decide`): running
//!    already (closed with success, nothing installed), declined here
//!    before (closed with failure), or a job that carries the action.
//!    `download = "skip"` starts nothing; `"forced"` passes `policy.write`;
//!    `update` and `maintenanceWindow` are asked by the switch
//!    (`policy.rs`). A refused deployment (bad signature, a listing that
//!    disagrees, a malformed bundle) is closed with the reason; a network
//!    failure is tried again at the next poll. An operator's own install
//!    (`updraft install`) is neither taken over nor replaced: the action
//!    waits until it has ended.
//!
//! Every transition of a job with an action queues its feedback in the
//! same transaction ([`Machine::fleet_feedback`]): `proceeding` while it
//! downloads, verifies, reboots and is tested, `downloaded` once the slot
//! is written and verified (a download-only action ends there), `closed`
//! with `success` only after the commit, `closed` with `failure` and the
//! reason after a rollback or a failed install. Download progress goes as
//! folded `proceeding` feedback with `cnt` of `of`, at most one per tenth.
//! A download that loses the network is no failure: the action hears
//! `proceeding` with a note ("waiting for the network since …") once the
//! server can be reached again ([`Machine::tell_action`]), and the
//! download resumes where its verified frames end.
//!
//! This file decides what the server is told and what its documents lead
//! to; the requests themselves are [`crate::hawkbit`]'s.

use super::*;
use crate::ddi::{self, Action, Execution, Feedback, Finished, Handling};
use crate::hawkbit::{self, Answering, Controller};
use crate::worker::Background;

/// The most outbox rows looked through for a queued feedback (the outbox
/// of a DDI device holds a few per action).
const OUTBOX_SCAN: usize = 10_000;

/// Store key: the configData attributes as last queued (JSON).
const CONFIG_SENT: &str = "ddi_config";

/// The DDI mode's state, owned by [`Server::Ddi`](super::server::Server):
/// kept in memory for this run only (what must survive a restart is in the
/// job, `Job::ddi`, and the outbox).
pub(crate) struct Fleet {
    /// The DDI server's controller resource.
    pub(super) controller: Controller,
    /// The polling interval the DDI server asked for, within bounds.
    pub(super) sleep: Option<Duration>,
    /// The action the job a check is about to start carries.
    pub(super) action: Option<Action>,
    /// The configData went out once in this run (a server that keeps
    /// asking for it gets it once per start, unless it changes).
    config_sent: bool,
    /// The DDI server's cancel being carried out.
    stopping: Option<ddi::Cancel>,
    /// The deployment last read that waits (not started), by its link.
    seen: Option<Seen>,
}

impl Fleet {
    pub(super) fn new(controller: Controller) -> Fleet {
        Fleet {
            controller,
            sleep: None,
            action: None,
            config_sent: false,
            stopping: None,
            seen: None,
        }
    }
}

/// A deployment read before and still waiting, kept (in memory) so that
/// polls under the same link do not read it again.
pub(super) struct Seen {
    href: String,
    deployment: ddi::Deployment,
    /// The manifest it names, as fetched (verified again each time).
    manifest: Option<Vec<u8>>,
}

/// Why the DDI server holds `job`'s switch, if it does: a download-only
/// action, or a maintenance window that is not open.
pub(super) fn action_holds(job: &Job) -> Option<String> {
    use crate::ddi::MaintenanceWindow;
    let a = job.ddi.as_ref()?;
    if a.update == Handling::Skip {
        return Some(format!(
            "the DDI server asked for a download only (action {}, update = skip)",
            a.id
        ));
    }
    if a.maintenance_window == Some(MaintenanceWindow::Unavailable) {
        return Some(format!(
            "the DDI server's maintenance window for action {} is not open",
            a.id
        ));
    }
    None
}

/// The action of `job`, when its server forced the update (`update =
/// forced`): its id.
pub(super) fn forced_action(job: &Job) -> Option<&str> {
    job.ddi
        .as_ref()
        .filter(|a| a.update == Handling::Forced)
        .map(|a| a.id.as_str())
}

/// The feedback closing a cancelAction the device carried out.
pub(super) fn cancel_closed(cancel: &ddi::Cancel, detail: String) -> Pending {
    hawkbit::feedback(
        Answering::Cancel,
        &feedback_now(
            &cancel.action_id,
            Execution::Closed,
            Finished::Success,
            None,
            vec![detail],
        ),
    )
}

/// The milliseconds since the epoch, for feedback timestamps.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A feedback on `action` made now.
pub(super) fn feedback_now(
    action: &str,
    execution: Execution,
    finished: Finished,
    progress: Option<(u64, u64)>,
    details: Vec<String>,
) -> Feedback {
    Feedback {
        action_id: action.to_string(),
        execution,
        finished,
        progress,
        details,
        timestamp_ms: now_ms(),
    }
}

impl Machine {
    /// Whether this device is driven by a DDI server.
    pub(super) fn fleet_mode(&self) -> bool {
        self.server.fleet().is_some()
    }

    /// The DDI mode's state; an error outside that mode.
    fn fleet(&mut self) -> Result<&mut Fleet> {
        self.server
            .fleet_mut()
            .ok_or_else(|| err!(Config, "server.kind is not \"hawkbit\""))
    }

    /// The DDI server's cancel being carried out, if any.
    pub(super) fn stopping(&self) -> Option<&ddi::Cancel> {
        self.server.fleet().and_then(|f| f.stopping.as_ref())
    }

    /// Record the cancel being carried out (`None`: an operator's, or none).
    pub(super) fn set_stopping(&mut self, c: Option<ddi::Cancel>) {
        if let Some(f) = self.server.fleet_mut() {
            f.stopping = c;
        }
    }

    /// One poll of the DDI server (see the module documentation).
    pub(super) fn check_fleet(&mut self, t: &mut dyn Ticker) -> Result<CheckOutcome> {
        let c = self.fleet()?.controller.clone();
        let base = {
            let c = c.clone();
            crate::worker::offload("check", move || c.base(), t)??
        };
        let sleep = base.sleep.map(|d| self.cfg.server.clamp_sleep(d));
        self.fleet()?.sleep = sleep;
        self.queue_config_data(base.config_data.is_some())?;
        let state = self.state()?;
        if let Some(link) = &base.cancel {
            let cancel = {
                let (c, l) = (c.clone(), link.clone());
                crate::worker::offload("check", move || c.cancel(&l), t)??
            };
            return self.server_cancel(&cancel, &state, t);
        }
        let Some(link) = base.deployment else {
            return Ok(CheckOutcome::NoChange(
                "the DDI server has no action for this device".into(),
            ));
        };
        self.server_deployment(&c, &link, &state, t)
    }

    /// The controller base names an action: act on it unless it is the
    /// job's own (whose handling is read again when the server changed it)
    /// or was closed here already.
    fn server_deployment(
        &mut self,
        c: &Controller,
        link: &ddi::ActionLink,
        state: &State,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let id = &link.action_id;
        let current = state.job().filter(|_| state.busy());
        if let Some(job) = current.filter(|j| j.ddi.as_ref().is_some_and(|a| &a.id == id)) {
            let known = job.ddi.as_ref().is_some_and(|a| a.href == link.href);
            if !known {
                let d = {
                    let (c, l) = (c.clone(), link.clone());
                    crate::worker::offload("check", move || c.deployment(&l), t)??
                };
                let action = Action::of(&d, &link.href);
                log::info!(
                    "release {} slot {}: action {id} now has download = {}, update = {}, maintenance window {}",
                    job.version,
                    job.target,
                    handling(action.download),
                    handling(action.update),
                    window(&action)
                );
                let mut job = job.clone();
                job.ddi = Some(action);
                self.store.update_state(&with_job(state, job))?;
            }
            return Ok(CheckOutcome::NoChange(format!(
                "action {id} is in progress ({})",
                state.name()
            )));
        }
        if self.closing_queued(id)? {
            return Ok(CheckOutcome::NoChange(format!(
                "action {id} was closed here; waiting for the server to take its feedback"
            )));
        }
        // An action seen before under the same link (it waits for
        // `download = skip` to change, or for the local write policy) is
        // not read again: every read of a deploymentBase, and every
        // download of its manifest without a Range, is an entry of the
        // action's history on a hawkBit server, which keeps at most
        // `maxStatusEntriesPerAction` of them.
        let seen = self.fleet()?.seen.take().filter(|s| s.href == link.href);
        let (d, manifest) = match seen {
            Some(s) => (Ok(s.deployment), s.manifest),
            None => {
                let (c, l) = (c.clone(), link.clone());
                (
                    crate::worker::offload("check", move || c.deployment(&l), t)?,
                    None,
                )
            }
        };
        let action = match &d {
            Ok(d) => Action::of(d, &link.href),
            Err(_) => Action {
                id: id.clone(),
                href: link.href.clone(),
                download: Handling::Attempt,
                update: Handling::Attempt,
                maintenance_window: None,
            },
        };
        match self.deployment_outcome(d, manifest, &action, state, t) {
            Ok(outcome) => Ok(outcome),
            Err(e) if refusal(&e) => {
                log::error!("action {id}: {e}; closing it with failure");
                self.close_action(&action.id, Finished::Failure, vec![e.to_string()])?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// What a deployment the server assigns leads to.
    fn deployment_outcome(
        &mut self,
        d: Result<ddi::Deployment>,
        manifest: Option<Vec<u8>>,
        action: &Action,
        state: &State,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let d = d?;
        let id = &action.id;
        if d.download == Handling::Skip {
            self.fleet()?.seen = Some(Seen {
                href: action.href.clone(),
                deployment: d,
                manifest: None,
            });
            return Ok(CheckOutcome::NoChange(format!(
                "action {id}: the server asks not to download yet (download = skip)"
            )));
        }
        let origin = hawkbit::release_origin(&d)?;
        let raw = match manifest {
            Some(bytes) => bytes,
            None => {
                let (o, f) = (origin.clone(), self.fetcher.clone());
                let fetched = crate::worker::offload(
                    "check",
                    move || crate::source::Source::new(o, f, 0).manifest(None),
                    t,
                )??;
                match fetched {
                    crate::fetch::Fetched::Body { bytes, .. } => bytes,
                    crate::fetch::Fetched::NotModified => bail!(
                        Network,
                        "action {id}: the manifest was answered 304 to an unconditional request"
                    ),
                }
            }
        };
        let mut poller = self.poller();
        let answer = Ok(crate::fetch::Fetched::Body {
            bytes: raw.clone(),
            etag: None,
        });
        let verified = match poller.verified_from(&origin, false, Some(answer), t)? {
            Polled::Verified(v) => *v,
            Polled::Stale(why) => return Ok(CheckOutcome::NoChange(why)),
        };
        hawkbit::check_listing(&d, &verified.manifest)?;
        let m = &verified.manifest;
        log::info!(
            "action {id}: release {} (serial {}), download = {}, update = {}, maintenance window {}",
            m.release.version,
            m.serial,
            handling(action.download),
            handling(action.update),
            window(action)
        );
        if let Some(job) = state.job().filter(|_| state.busy()) {
            if job.ddi.is_none() {
                // An operator's install (`updraft install`) is the
                // operator's: the server neither takes it over (for the
                // same image) nor replaces it. Its action is looked at
                // again once the install has ended.
                return Ok(CheckOutcome::NoChange(format!(
                    "action {id} waits: the operator's install of release {} is in progress ({})",
                    job.version,
                    state.name()
                )));
            }
            if job.image == m.image {
                // Assigned again (say, a download-only action followed by
                // one that installs): the job in progress carries it now.
                let mut job = job.clone();
                let previous = job.ddi.replace(action.clone());
                self.store.update_state(&with_job(state, job.clone()))?;
                if let Some(p) = previous.filter(|p| p.id != *id) {
                    log::info!(
                        "release {} slot {}: action {id} takes over from action {}",
                        job.version,
                        job.target,
                        p.id
                    );
                }
                return Ok(CheckOutcome::NoChange(format!(
                    "action {id}: release {} is being installed into slot {} ({})",
                    job.version,
                    job.target,
                    state.name()
                )));
            }
            let early = matches!(
                state,
                State::Downloading(_) | State::Installing(_) | State::Installed(_)
            );
            if !early {
                return Ok(CheckOutcome::NoChange(format!(
                    "action {id} waits: release {} is past its switch ({})",
                    job.version,
                    state.name()
                )));
            }
        }
        // The job this check starts carries the action; `forced` lets the
        // download past `policy.write` (an operator's `updraft apply`
        // that this release did not use is kept).
        self.fleet()?.action = Some(action.clone());
        let forced = action.download == Handling::Forced
            && policy::forced_passes(self.cfg.policy.write, self.cfg.policy.server_may_force);
        if forced {
            self.forced_write = Some(id.clone());
        }
        let supersedes = state.job().is_some_and(|_| state.busy());
        let outcome = if supersedes {
            self.supersede(&origin, verified, t)
        } else {
            self.decide(&origin, false, state, verified, t)
        };
        self.fleet()?.action = None;
        self.forced_write = None;
        match outcome? {
            waits @ (CheckOutcome::NoChange(_) | CheckOutcome::Held(_)) => {
                // Waits (for the local write policy): looked at again
                // from what was read now.
                self.fleet()?.seen = Some(Seen {
                    href: action.href.clone(),
                    deployment: d,
                    manifest: Some(raw),
                });
                Ok(waits)
            }
            done @ (CheckOutcome::Running(_) | CheckOutcome::Applied(_)) => {
                let why = done.why().unwrap_or_default().to_string();
                self.close_action(id, Finished::Success, vec![why])?;
                Ok(done)
            }
            CheckOutcome::Declined(why) => {
                self.close_action(id, Finished::Failure, vec![why.clone()])?;
                Ok(CheckOutcome::Declined(why))
            }
            other => Ok(other),
        }
    }

    /// The server asks to stop action `cancel.stop_id`.
    fn server_cancel(
        &mut self,
        cancel: &ddi::Cancel,
        state: &State,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let stop = &cancel.stop_id;
        let job = state
            .job()
            .filter(|_| state.busy())
            .filter(|j| j.ddi.as_ref().is_some_and(|a| &a.id == stop));
        let Some(job) = job.cloned() else {
            // Nothing of it runs here: it never started (skipped, waiting
            // for a window) or it ended. An action closed here already
            // cannot be cancelled any more.
            if self.closing_queued(stop)? {
                let why = format!("action {stop} has ended on this device already");
                self.answer_cancel(cancel, Execution::Rejected, Finished::Failure, &why)?;
                return Ok(CheckOutcome::NoChange(why));
            }
            let why = format!("action {stop} cancelled by the server before it started here");
            self.answer_cancel(cancel, Execution::Closed, Finished::Success, &why)?;
            return Ok(CheckOutcome::NoChange(why));
        };
        match self.stop_job(Some(cancel), t) {
            Ok(msg) => Ok(CheckOutcome::NoChange(msg)),
            Err(e) if e.kind() == Kind::Busy => {
                let why = format!(
                    "release {} slot {}: cannot be cancelled past its switch: {e}",
                    job.version, job.target
                );
                log::warn!("action {stop}: {why}");
                self.answer_cancel(cancel, Execution::Rejected, Finished::Failure, &why)?;
                Ok(CheckOutcome::NoChange(why))
            }
            Err(e) => Err(e),
        }
    }

    /// A download stopped by the server's cancel: end the job.
    pub(super) fn server_cancelled(
        &mut self,
        cancel: &ddi::Cancel,
        t: &mut dyn Ticker,
    ) -> Result<Next> {
        let state = self.state()?;
        self.server_cancel(cancel, &state, t)?;
        Ok(Next::Continue)
    }

    /// Answer a cancelAction.
    fn answer_cancel(
        &mut self,
        cancel: &ddi::Cancel,
        execution: Execution,
        finished: Finished,
        why: &str,
    ) -> Result<()> {
        let f = feedback_now(
            &cancel.action_id,
            execution,
            finished,
            None,
            vec![why.to_string()],
        );
        self.store
            .push_report(&hawkbit::feedback(Answering::Cancel, &f).as_report())
    }

    /// Close `action` with `finished` and `details`, outside any job.
    fn close_action(
        &mut self,
        action: &str,
        finished: Finished,
        details: Vec<String>,
    ) -> Result<()> {
        self.queue_feedback(action, Execution::Closed, finished, details)
    }

    /// Queue a feedback on `action` (the deployment channel, no progress).
    fn queue_feedback(
        &mut self,
        action: &str,
        execution: Execution,
        finished: Finished,
        details: Vec<String>,
    ) -> Result<()> {
        let f = feedback_now(action, execution, finished, None, details);
        let row = hawkbit::feedback(Answering::Deployment, &f);
        self.store.push_report(&row.as_report())
    }

    /// Tell the action `job` belongs to `note` as `proceeding` feedback
    /// (an outage, a wait for the policy: never a failure of the action);
    /// whether there was one to tell (a job the DDI server assigned).
    pub(super) fn tell_action(&mut self, job: &Job, note: &str) -> Result<bool> {
        let Some(action) = job.ddi.as_ref().filter(|_| self.fleet_mode()) else {
            return Ok(false);
        };
        let id = action.id.clone();
        self.queue_feedback(
            &id,
            Execution::Proceeding,
            Finished::None,
            vec![note.to_string()],
        )?;
        Ok(true)
    }

    /// Whether a feedback closing `action` waits in the outbox: until the
    /// server has it, a controller base that still names the action does
    /// not start it again. (Once it is delivered, an action offered again
    /// is the server's decision: gooseBit offers a software again under
    /// the same id.)
    fn closing_queued(&self, action: &str) -> Result<bool> {
        Ok(self
            .store
            .outbox_peek(OUTBOX_SCAN)?
            .iter()
            .any(|e| hawkbit::closes(e, action)))
    }

    /// The attributes the server keeps about this device. `sw_version` is
    /// the committed release: a release under its trial boot is not
    /// reported as running until it commits. Each component besides the
    /// slot adds `component.<name>` = its committed version.
    /// `sent` is the attributes last queued (`CONFIG_SENT`).
    fn config_attributes(
        &self,
        state: &State,
        sent: Option<&str>,
    ) -> Result<Vec<(String, String)>> {
        let committed_slot = match state {
            State::Testing(j) => j.target.other(),
            State::Rebooting(j) if j.purpose == Some(RebootPurpose::Rollback) => j.target.other(),
            _ => self.booted,
        };
        // Recorded, or named by the image's release marker (a device
        // fresh from the factory, before any manifest confirmed it). The
        // marker is the booted image's: under a trial boot of the other
        // slot, the committed release is the one last reported, which the
        // trial did not change.
        let running = match self.store.slot_record(committed_slot)? {
            Some(r) => r.version,
            None if committed_slot == self.booted => {
                match crate::provision::read_marker(&self.cfg.device.release_file) {
                    Ok(Some(m)) => m.version,
                    _ => "unknown".into(),
                }
            }
            None => sent
                .and_then(|text| sent_attribute(text, "sw_version"))
                .unwrap_or_else(|| "unknown".into()),
        };
        let compatible = self.cfg.device.compatible.clone();
        let mut attrs: Vec<(String, String)> = [
            ("sw_version", running),
            ("compatible", compatible.clone()),
            // SWUpdate's name for it, which gooseBit matches against the
            // hardware compatibility of a software.
            ("hw_revision", compatible),
            ("booted_slot", self.booted.as_str().to_string()),
            ("updraft_version", env!("CARGO_PKG_VERSION").to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for c in self.store.running_components()? {
            attrs.push((format!("component.{}", c.name), c.version));
        }
        // The key that signs this device's feedback (raw, in hex: the
        // attribute alphabet has no room for base64).
        if let Some(key) = self.identity.key() {
            attrs.push((
                "device_key".into(),
                crate::hash::hex(key.public().as_bytes()),
            ));
        }
        Ok(attrs)
    }

    /// The configData row for `state`, when the server asks (`asked`,
    /// once per run) or the attributes changed since they were last
    /// queued; `None` otherwise. Marks them queued.
    fn config_row(&mut self, state: &State, asked: bool) -> Result<Option<Pending>> {
        let sent = self.store.get(CONFIG_SENT)?;
        let attrs = self.config_attributes(state, sent.as_deref())?;
        let text =
            serde_json::to_string(&attrs).map_err(|e| err!(Store, "encoding configData: {e}"))?;
        let changed = sent.as_deref() != Some(text.as_str());
        let owed = asked && !self.fleet()?.config_sent;
        if !changed && !owed {
            return Ok(None);
        }
        let pairs: Vec<(&str, &str)> = attrs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let row = hawkbit::config_data(&pairs)?;
        if changed {
            self.store.set(CONFIG_SENT, &text)?;
        }
        self.fleet()?.config_sent = true;
        Ok(Some(row))
    }

    fn queue_config_data(&mut self, asked: bool) -> Result<()> {
        let state = self.state()?;
        if let Some(row) = self.config_row(&state, asked)? {
            self.store.push_report(&row.as_report())?;
        }
        Ok(())
    }

    /// The feedback a transition into `next` sends, for a job the server
    /// assigned (see the module documentation).
    pub(super) fn fleet_feedback(
        &mut self,
        next: &State,
        detail: Option<&str>,
    ) -> Result<Vec<Pending>> {
        let Some(job) = next.job() else {
            return Ok(Vec::new());
        };
        let Some(action) = &job.ddi else {
            return Ok(Vec::new());
        };
        let (v, slot) = (&job.version, job.target);
        let with = |head: String| -> Vec<String> {
            std::iter::once(head)
                .chain(detail.map(str::to_string))
                .collect()
        };
        let (execution, finished, details) = match next {
            State::Downloading(j) => (
                Execution::Proceeding,
                Finished::None,
                with(format!(
                    "downloading release {v} into slot {slot} ({})",
                    match j.method {
                        Method::Full => "full image",
                        Method::Delta { .. } => "delta",
                    }
                )),
            ),
            State::Installing(_) => (
                Execution::Proceeding,
                Finished::None,
                with(format!("release {v}: verifying slot {slot}")),
            ),
            State::Installed(_) => (
                Execution::Downloaded,
                Finished::None,
                with(format!("release {v} written to slot {slot} and verified")),
            ),
            State::Rebooting(j) if j.purpose == Some(RebootPurpose::Rollback) => (
                Execution::Proceeding,
                Finished::None,
                with(format!(
                    "release {v}: rolling back to slot {}",
                    slot.other()
                )),
            ),
            State::Rebooting(_) => (
                Execution::Proceeding,
                Finished::None,
                with(format!(
                    "release {v}: rebooting into slot {slot} for its trial boot"
                )),
            ),
            State::Testing(_) => (
                Execution::Proceeding,
                Finished::None,
                with(format!(
                    "release {v}: booted slot {slot}, running health checks"
                )),
            ),
            State::Committed(_) => (
                Execution::Closed,
                Finished::Success,
                with(format!("release {v} committed in slot {slot}")),
            ),
            State::RolledBack(_) => (
                Execution::Closed,
                Finished::Failure,
                with(format!("release {v} rolled back to slot {}", slot.other())),
            ),
            // Stopped by the server's cancel: that is answered on the
            // cancelAction, not here.
            State::Failed { .. } if self.stopping().is_some() => return Ok(Vec::new()),
            State::Failed { reason, .. } => (
                Execution::Closed,
                Finished::Failure,
                vec![format!("release {v}: {reason}")],
            ),
            State::Idle | State::Checking => return Ok(Vec::new()),
        };
        let mut rows = vec![hawkbit::feedback(
            Answering::Deployment,
            &feedback_now(&action.id, execution, finished, None, details),
        )];
        if execution == Execution::Closed {
            if let Some(row) = self.config_row(next, false)? {
                rows.push(row);
            }
        }
        Ok(rows)
    }
}

/// Whether a failure to act on a deployment is the deployment's fault (it
/// is closed with the reason) rather than a passing one (tried again at
/// the next poll).
fn refusal(e: &Error) -> bool {
    !matches!(
        e.kind(),
        Kind::Network | Kind::Busy | Kind::Clock | Kind::Stopped | Kind::Io | Kind::Store
    )
}

/// `state` with `job` in it (same state).
fn with_job(state: &State, job: Job) -> State {
    match state {
        State::Downloading(_) => State::Downloading(job),
        State::Installing(_) => State::Installing(job),
        State::Installed(_) => State::Installed(job),
        State::Rebooting(_) => State::Rebooting(job),
        State::Testing(_) => State::Testing(job),
        State::Committed(_) => State::Committed(job),
        State::RolledBack(_) => State::RolledBack(job),
        other => other.clone(),
    }
}

fn handling(h: Handling) -> &'static str {
    match h {
        Handling::Skip => "skip",
        Handling::Attempt => "attempt",
        Handling::Forced => "forced",
    }
}

fn window(a: &Action) -> &'static str {
    match a.maintenance_window {
        None => "none",
        Some(ddi::MaintenanceWindow::Available) => "available",
        Some(ddi::MaintenanceWindow::Unavailable) => "unavailable",
    }
}

/// How long the outbox rests after a delivery failed during a download.
const SEND_RETRY: Duration = Duration::from_secs(30);

/// Keeps the DDI server in the picture while a job of one of its actions
/// downloads (a download may take days): polls it, so a cancelAction stops
/// the download at the next frame; queues the download's progress as
/// folded feedback; and delivers the outbox meanwhile, one row at a time
/// on a helper thread, so the server sees the progress as it happens.
pub(super) struct FleetWatch<'a> {
    pub(super) controller: Controller,
    pub(super) store: &'a Store,
    pub(super) action: String,
    /// The tenth of the download last reported.
    pub(super) reported: Option<u64>,
    pub(super) pending: Option<Background<Result<Option<ddi::Cancel>>>>,
    /// The key feedback is signed with, if the device has one.
    pub(super) key: Option<&'a crate::device_key::DeviceKey>,
    /// The outbox row being sent (its sequence number and report
    /// counter), and the call.
    pub(super) sending: Option<(i64, Option<u64>, Background<Result<hawkbit::Sent>>)>,
    /// No delivery before this instant (after a failure).
    pub(super) send_after: Option<std::time::Instant>,
    /// Where a cancel of this job's action is left for the caller.
    pub(super) found: &'a mut Option<ddi::Cancel>,
}

impl FleetWatch<'_> {
    pub(super) fn tick(&mut self, p: &Progress, t: &mut dyn Ticker) -> Result<()> {
        if let Some(c) = self.found.as_ref() {
            return Err(cancelled(c));
        }
        self.deliver()?;
        if p.phase == "download" && p.total > 0 {
            let tenth = (p.done.min(p.total) * 10) / p.total;
            if self.reported.is_none_or(|r| tenth > r) {
                self.reported = Some(tenth);
                let f = feedback_now(
                    &self.action,
                    Execution::Proceeding,
                    Finished::None,
                    Some((tenth * 10, 100)),
                    vec![format!(
                        "Downloaded {}% ({} of {} bytes)",
                        tenth * 10,
                        p.done.min(p.total),
                        p.total
                    )],
                );
                let in_flight = self.sending.as_ref().map(|(seq, _, _)| *seq);
                self.store
                    .push_report_besides(&hawkbit::progress(&f).as_report(), in_flight)?;
            }
        }
        let Some(call) = self.pending.as_ref() else {
            if t.poll_due() {
                let c = self.controller.clone();
                match Background::spawn(move || -> Result<Option<ddi::Cancel>> {
                    let base = c.base()?;
                    match base.cancel {
                        Some(link) => c.cancel(&link).map(Some),
                        None => Ok(None),
                    }
                }) {
                    Ok(call) => self.pending = Some(call),
                    Err(e) => t.polled(Some(&e)),
                }
            }
            return Ok(());
        };
        match call.result() {
            Ok(None) => Ok(()),
            Ok(Some(answer)) => {
                self.pending = None;
                match answer {
                    Ok(Some(c)) if c.stop_id == self.action => {
                        t.polled(None);
                        log::info!(
                            "action {}: the server cancels it (cancelAction {}); stopping the download",
                            self.action,
                            c.action_id
                        );
                        let e = cancelled(&c);
                        *self.found = Some(c);
                        Err(e)
                    }
                    Ok(_) => {
                        t.polled(None);
                        Ok(())
                    }
                    Err(e) => {
                        log::warn!(
                            "DDI poll during the download of action {}: {e}; the download goes on",
                            self.action
                        );
                        t.polled(Some(&e));
                        Ok(())
                    }
                }
            }
            Err(e) => {
                self.pending = None;
                t.polled(Some(&e));
                Ok(())
            }
        }
    }
}

impl FleetWatch<'_> {
    /// Look at the row being sent, or send the oldest queued one.
    fn deliver(&mut self) -> Result<()> {
        if let Some((seq, counter, call)) = &self.sending {
            let (seq, counter) = (*seq, *counter);
            match call.result() {
                Ok(None) => return Ok(()),
                Ok(Some(Ok(sent))) => {
                    self.sending = None;
                    if let hawkbit::Sent::Refused(status) = sent {
                        log::error!(
                            "outbox row {seq}: the DDI server refused it with {status}; dropped"
                        );
                    }
                    self.store.outbox_ack_delivered(seq, counter)?;
                }
                Ok(Some(Err(e))) | Err(e) => {
                    self.sending = None;
                    log::warn!(
                        "delivering feedback during the download of action {}: {e}; trying again later",
                        self.action
                    );
                    self.send_after = Some(std::time::Instant::now() + SEND_RETRY);
                }
            }
            return Ok(());
        }
        if self
            .send_after
            .is_some_and(|at| std::time::Instant::now() < at)
        {
            return Ok(());
        }
        let Some(row) = self.store.outbox_peek(1)?.pop() else {
            return Ok(());
        };
        if !hawkbit::is_ddi_kind(&row.kind) {
            // Left for the loop, which drops rows of static mode.
            return Ok(());
        }
        let c = self.controller.clone();
        let (seq, counter) = (row.seq, row.counter);
        let row = hawkbit::signed(&row, self.key, self.store.report_counter_delivered()?);
        match Background::spawn(move || c.send(&row)) {
            Ok(call) => self.sending = Some((seq, counter, call)),
            Err(e) => {
                log::warn!("delivering feedback: {e}");
                self.send_after = Some(std::time::Instant::now() + SEND_RETRY);
            }
        }
        Ok(())
    }
}

fn cancelled(c: &ddi::Cancel) -> Error {
    Error::new(
        Kind::Stopped,
        format!(
            "cancelled by the DDI server (cancelAction {} for action {})",
            c.action_id, c.stop_id
        ),
    )
}

/// The value of `key` in attributes as `config_row` stores them; an
/// unreadable value (an older encoding) only means nothing is known.
fn sent_attribute(text: &str, key: &str) -> Option<String> {
    let attrs: Vec<(String, String)> = serde_json::from_str(text).unwrap_or_default();
    attrs.into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}
