//! The operator's policy on when a verified slot is switched in and
//! rebooted into (`[policy] switch`, `reboot`, `windows`), `updraft
//! apply`, and the applications' inhibitors.
//!
//! The switch waits for the stricter of the two gates: with the reboot
//! gated, putting the slot first at once would let any power cut boot the
//! trial outside its window, so the switch is made right before the reboot.
//! A window allows the switch only with `health.timeout` plus
//! `policy.boot_time` left in it, so the trial boot and its checks fit.
//! `updraft apply` lets the next step through whatever the gate says.
//!
//! Once the gate lets it through, the application inhibitors
//! ([`crate::inhibit`]) are asked, before the switch and again right
//! before the reboot command: while one inhibits, the slot waits. They
//! hold it for at most `policy.max_deferral`, counted from the first time
//! one held this job (`Job::inhibited`); after that the gate alone
//! decides. `updraft apply` does not override an inhibitor: the
//! application said it is busy, and the operator can see who in the
//! status.
//!
//! Only the switch of a new release is held. The rollback reboot after a
//! failed health check and a fallback by the bootloader are never held:
//! they happen in other states, which do not ask this module. Neither is
//! a trial boot's health deadline cut off when its window closes.
//!
//! This module decides and records the hold (`Job::held`,
//! `Job::inhibited`, updates of the current row) and reports what the job
//! waits for when that changes; it makes no transition and switches
//! nothing.

use super::*;
use crate::config::Gate;
use crate::inhibit::{self, Inhibitor};
use crate::window::{Local, Span};

/// Longest sleep of a hold before it looks again: a clock set by NTP, a
/// changed zone or a new configuration count from then on.
const HOLD_RECHECK: Duration = Duration::from_secs(900);

/// How often inhibitors are asked again while one holds an update.
const INHIBIT_RECHECK: Duration = Duration::from_secs(10);

/// A release seen but not downloaded yet: `policy.write` holds it.
#[derive(Debug, Clone)]
pub(super) struct WriteWait {
    pub(super) version: String,
    pub(super) wait: Wait,
    /// When its window opens, if it waits for one.
    pub(super) opens: Option<Timestamp>,
}

/// What a held update waits for: in the status, reports and metrics, so a
/// fleet sees why a device has not converged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A maintenance window (`"window"` gate).
    Window,
    /// `updraft apply` (`"manual"` gate).
    Operator,
    /// An application inhibitor.
    Inhibitor,
    /// The DDI server: a download-only action (`update = skip`), or its
    /// maintenance window not open.
    Server,
}

impl Wait {
    /// What a held job waits for, told from what its row records alone
    /// (no inhibitor asked, no clock read): an inhibitor once one held it
    /// or when the gate lets it through, else the gate's own condition.
    pub fn of_held(job: &Job, gate: Gate) -> Wait {
        if job.inhibited.is_none() && fleet::action_holds(job).is_some() {
            return Wait::Server;
        }
        match (job.inhibited, gate) {
            (Some(_), _) | (None, Gate::Auto) => Wait::Inhibitor,
            (None, Gate::Manual) => Wait::Operator,
            (None, Gate::Window) => Wait::Window,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Wait::Window => "window",
            Wait::Operator => "operator",
            Wait::Inhibitor => "inhibitor",
            Wait::Server => "server",
        }
    }
}

/// What the policy says about the switch now.
#[derive(Debug)]
pub(super) enum Allowed {
    /// Switch now.
    Now,
    /// Wait for `wait`; look again after this long (until the next
    /// window, [`HOLD_RECHECK`], [`INHIBIT_RECHECK`]). `why` is for the
    /// log, the status and the report.
    Later {
        recheck: Duration,
        why: String,
        wait: Wait,
    },
}

/// Whether a DDI server's `forced` lets a job past the local `gate`: it
/// skips a maintenance window, never an operator's `manual` gate unless
/// `policy.server_may_force` lets the server decide.
pub(super) fn forced_passes(gate: Gate, server_may_force: bool) -> bool {
    match gate {
        Gate::Auto | Gate::Window => true,
        Gate::Manual => server_may_force,
    }
}

impl Machine {
    /// Whether the policy lets `job`'s slot be switched in now. The first
    /// time it does not, `job.held` is set and written down.
    pub(super) fn hold(&mut self, job: &mut Job) -> Result<Allowed> {
        let gate = if self.apply_requested.as_deref() == Some(job.id.as_str()) {
            log::info!(
                "release {} slot {}: applied by the operator (updraft apply)",
                job.version,
                job.target
            );
            Allowed::Now
        } else if let Some(why) = fleet::action_holds(job) {
            Allowed::Later {
                recheck: self
                    .server
                    .sleep()
                    .unwrap_or(self.cfg.server.poll_interval.0)
                    .min(HOLD_RECHECK),
                why,
                wait: Wait::Server,
            }
        } else if let Some(action) = fleet::forced_action(job).filter(|_| {
            forced_passes(
                self.cfg.policy.switch_gate().0,
                self.cfg.policy.server_may_force,
            )
        }) {
            // The server's operator forced it: a window does not hold it
            // (application inhibitors still do).
            let (gate, key) = self.cfg.policy.switch_gate();
            if gate != Gate::Auto {
                log::info!(
                    "release {} slot {}: switched now, forced by DDI action {} ({key} = \"{}\" skipped)",
                    job.version,
                    job.target,
                    action,
                    gate.as_str()
                );
            }
            Allowed::Now
        } else {
            self.allowed_now(Timestamp::now())
        };
        let allowed = match gate {
            Allowed::Now => self.inhibitors_allow(job, State::Installed)?,
            later => later,
        };
        if let Allowed::Later { why, wait, .. } = &allowed {
            if job.held.is_none() {
                job.held = Some(Timestamp::now());
                self.store.update_state(&State::Installed(job.clone()))?;
                log::info!(
                    "release {} slot {}: verified; switch and reboot held: {why}",
                    job.version,
                    job.target
                );
                self.waiting = Some((job.id.clone(), *wait));
                self.report_wait(job, *wait, why)?;
            } else {
                self.note_wait(job, *wait, why)?;
            }
        } else {
            self.waiting = None;
        }
        Ok(allowed)
    }

    /// The application inhibitors for `job` in its current state (`row`
    /// rebuilds it for the update): `Now` when none inhibits, or when they
    /// have held it for `policy.max_deferral` already.
    pub(super) fn inhibitors_allow(
        &mut self,
        job: &mut Job,
        row: fn(Job) -> State,
    ) -> Result<Allowed> {
        let found = self.inhibitors.scan();
        self.inhibited_now.clone_from(&found);
        if found.is_empty() {
            return Ok(Allowed::Now);
        }
        let now = Timestamp::now();
        let since = match job.inhibited {
            Some(since) => since,
            None => {
                job.inhibited = Some(now);
                self.store.update_state(&row(job.clone()))?;
                now
            }
        };
        let who = found
            .iter()
            .map(Inhibitor::describe)
            .collect::<Vec<_>>()
            .join("; ");
        let max = self.cfg.policy.max_deferral.map(|d| d.0);
        if inhibit::deferral_over(since, now, max) {
            if self.deferral_logged.as_deref() != Some(job.id.as_str()) {
                self.deferral_logged = Some(job.id.clone());
                log::warn!(
                    "release {} slot {}: inhibited since {since}, longer than policy.max_deferral ({}); going ahead despite {who}",
                    job.version,
                    job.target,
                    crate::timestamp::format_duration(max.unwrap_or_default())
                );
            }
            return Ok(Allowed::Now);
        }
        Ok(Allowed::Later {
            recheck: INHIBIT_RECHECK,
            why: format!("inhibited by {who}"),
            wait: Wait::Inhibitor,
        })
    }

    /// A job already held waits for `wait` now: log and report it when
    /// that changed.
    pub(super) fn note_wait(&mut self, job: &Job, wait: Wait, why: &str) -> Result<()> {
        let now = Some((job.id.clone(), wait));
        if self.waiting == now {
            return Ok(());
        }
        self.waiting = now;
        log::info!(
            "release {} slot {}: waiting for {}: {why}",
            job.version,
            job.target,
            wait.as_str()
        );
        self.report_wait(job, wait, why)
    }

    fn report_wait(&mut self, job: &Job, wait: Wait, why: &str) -> Result<()> {
        let note = format!(
            "release {} slot {}: waiting for {} before the switch: {why}",
            job.version,
            job.target,
            wait.as_str()
        );
        if self.tell_action(job, &note)? {
            return Ok(());
        }
        if !self.server.takes(report::WAITING) {
            return Ok(());
        }
        let r = report::waiting(&self.device_id, self.booted, job, wait.as_str(), why);
        self.store.push_report(&r.as_report())
    }

    /// The gate alone, at `now`.
    fn allowed_now(&self, now: Timestamp) -> Allowed {
        let (gate, key) = self.cfg.policy.switch_gate();
        match gate {
            Gate::Auto => Allowed::Now,
            Gate::Manual => Allowed::Later {
                recheck: HOLD_RECHECK,
                why: format!("until an operator runs `updraft apply` ({key} = \"manual\")"),
                wait: Wait::Operator,
            },
            Gate::Window => {
                let need = self.cfg.health.timeout.0 + self.cfg.policy.boot_time.0;
                let windows = &self.cfg.policy.windows;
                Local::refresh();
                let wait_for = |s: Option<Span>, why: String| {
                    let recheck = s
                        .map(|s| Duration::from_secs((s.opens.0 - now.0).max(1) as u64))
                        .unwrap_or(HOLD_RECHECK)
                        .min(HOLD_RECHECK);
                    Allowed::Later {
                        recheck,
                        why,
                        wait: Wait::Window,
                    }
                };
                match windows.current_or_next(now, &Local) {
                    None => wait_for(None, "no maintenance window in policy.windows".into()),
                    Some(s) if s.opens <= now => {
                        let left = Duration::from_secs((s.closes.0 - now.0).max(0) as u64);
                        if left >= need {
                            Allowed::Now
                        } else {
                            let next = windows.current_or_next(s.closes, &Local);
                            wait_for(
                                next,
                                format!(
                                    "the window open until {} has {} left, a trial needs {} (health.timeout + policy.boot_time); next window {}",
                                    s.closes,
                                    crate::timestamp::format_duration(left),
                                    crate::timestamp::format_duration(need),
                                    next.map_or("none".to_string(), |n| n.opens.to_string())
                                ),
                            )
                        }
                    }
                    Some(s) => wait_for(
                        Some(s),
                        format!(
                            "until the maintenance window {} – {} ({key} = \"window\")",
                            s.opens, s.closes
                        ),
                    ),
                }
            }
        }
    }

    /// Whether the write gate (`policy.write`) lets `version` be
    /// downloaded now. When it does not, what it waits for is kept for the
    /// status and [`Machine::write_waits_until`], and `Some(why)` returned.
    /// An operator's `updraft apply` lets the next one through.
    pub(super) fn write_held(&mut self, version: &str) -> Option<String> {
        let now = Timestamp::now();
        let held = match self.cfg.policy.write {
            Gate::Auto => None,
            _ if self.apply_write.as_deref() == Some(version) => {
                self.apply_write = None;
                log::info!(
                    "release {version}: downloading now, applied by the operator (updraft apply)"
                );
                None
            }
            gate if self.forced_write.is_some() => {
                log::info!(
                    "release {version}: downloading now, forced by DDI action {} (policy.write = \"{}\" skipped)",
                    self.forced_write.as_deref().unwrap_or_default(),
                    gate.as_str()
                );
                None
            }
            Gate::Manual => Some((
                format!(
                    "release {version} waits for `updraft apply` to be downloaded (policy.write = \"manual\")"
                ),
                Wait::Operator,
                None,
            )),
            Gate::Window => {
                Local::refresh();
                match self.cfg.policy.windows.current_or_next(now, &Local) {
                    Some(s) if s.opens <= now => None,
                    Some(s) => Some((
                        format!(
                            "release {version} is downloaded in the next maintenance window, {} – {} (policy.write = \"window\")",
                            s.opens, s.closes
                        ),
                        Wait::Window,
                        Some(s.opens),
                    )),
                    None => Some((
                        format!(
                            "release {version} waits for a maintenance window; policy.windows has none"
                        ),
                        Wait::Window,
                        None,
                    )),
                }
            }
        };
        match held {
            None => {
                self.write_waiting = None;
                None
            }
            Some((why, wait, opens)) => {
                self.write_waiting = Some(WriteWait {
                    version: version.to_string(),
                    wait,
                    opens,
                });
                Some(why)
            }
        }
    }

    /// When the release waiting for its write window may be downloaded:
    /// the daemon checks again then rather than at its next poll.
    pub fn write_waits_until(&self) -> Option<Timestamp> {
        self.write_waiting.as_ref().and_then(|w| w.opens)
    }

    /// `updraft apply`: let a held switch through at the next step, or a
    /// write `policy.write` holds at the next check.
    pub fn apply(&mut self) -> Result<String> {
        match self.state()? {
            State::Installed(job) if job.held.is_some() => {
                self.apply_requested = Some(job.id.clone());
                if self.waiting == Some((job.id.clone(), Wait::Inhibitor)) {
                    let who: Vec<_> = self.inhibited_now.iter().map(|i| i.who.as_str()).collect();
                    return Ok(format!(
                        "release {}: applied, but inhibited by {}: slot {} is switched in and rebooted into when they finish (or after policy.max_deferral)",
                        job.version,
                        who.join(", "),
                        job.target
                    ));
                }
                Ok(format!(
                    "release {}: switching to slot {} and rebooting",
                    job.version, job.target
                ))
            }
            State::Installed(job) => Ok(format!(
                "release {}: not held; slot {} is switched in at the next step",
                job.version, job.target
            )),
            State::Idle if self.write_waiting.is_some() => {
                let version = self
                    .write_waiting
                    .as_ref()
                    .map_or("", |w| w.version.as_str());
                let msg =
                    format!("release {version}: downloading it now, policy.write notwithstanding");
                self.apply_write = Some(version.to_string());
                Ok(msg)
            }
            other => bail!(
                Busy,
                "nothing waits to be applied (state {}): `updraft apply` switches a release that was written and held by the policy, or starts one policy.write holds",
                other.name()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_forced_skips_windows_never_a_manual_gate_unless_allowed() {
        // (gate, policy.server_may_force) → forced passes
        let rows = [
            (Gate::Auto, false, true),
            (Gate::Window, false, true),
            (Gate::Manual, false, false),
            (Gate::Auto, true, true),
            (Gate::Window, true, true),
            (Gate::Manual, true, true),
        ];
        for (gate, may, want) in rows {
            assert_eq!(
                forced_passes(gate, may),
                want,
                "{gate:?}, server_may_force {may}"
            );
        }
    }
}
