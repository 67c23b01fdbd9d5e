//! The operator's policy on when a verified slot is switched in and
//! rebooted into (`[policy] switch`, `reboot`, `windows`), and
//! `updraft apply`.
//!
//! The switch waits for the stricter of the two gates: with the reboot
//! gated, putting the slot first at once would let any power cut boot the
//! trial outside its window, so the switch is made right before the reboot.
//! A window allows the switch only with `health.timeout` plus
//! `policy.boot_time` left in it, so the trial boot and its checks fit.
//! `updraft apply` lets the next step through whatever the gate says.
//!
//! Only the switch of a new release is held. The rollback reboot after a
//! failed health check and a fallback by the bootloader are never held:
//! they happen in other states, which do not ask this module. Neither is
//! a trial boot's health deadline cut off when its window closes.
//!
//! This module decides and records the hold (`Job::held`, an update of the
//! `installed` row); it makes no transition and switches nothing.

use super::*;
use crate::config::Gate;
use crate::window::{Local, Span};

/// Longest sleep of a hold before it looks again: a clock set by NTP, a
/// changed zone or a new configuration count from then on.
const HOLD_RECHECK: Duration = Duration::from_secs(900);

/// What the policy says about the switch now.
#[derive(Debug)]
pub(super) enum Allowed {
    /// Switch now.
    Now,
    /// Wait; look again after this long (until the next window, or
    /// [`HOLD_RECHECK`]). `why` is for the log and the status.
    Later { recheck: Duration, why: String },
}

impl Machine {
    /// Whether the policy lets `job`'s slot be switched in now. The first
    /// time it does not, `job.held` is set and written down.
    pub(super) fn hold(&mut self, job: &mut Job) -> Result<Allowed> {
        let allowed = if self.apply_requested.as_deref() == Some(job.id.as_str()) {
            log::info!(
                "release {} slot {}: applied by the operator (updraft apply)",
                job.version,
                job.target
            );
            Allowed::Now
        } else {
            self.allowed_now(Timestamp::now())
        };
        if let Allowed::Later { why, .. } = &allowed {
            if job.held.is_none() {
                job.held = Some(Timestamp::now());
                self.store.update_state(&State::Installed(job.clone()))?;
                log::info!(
                    "release {} slot {}: verified; switch and reboot held: {why}",
                    job.version,
                    job.target
                );
            }
        }
        Ok(allowed)
    }

    /// The gate alone, at `now`.
    fn allowed_now(&self, now: Timestamp) -> Allowed {
        let (gate, key) = self.cfg.policy.switch_gate();
        match gate {
            Gate::Auto => Allowed::Now,
            Gate::Manual => Allowed::Later {
                recheck: HOLD_RECHECK,
                why: format!("until an operator runs `updraft apply` ({key} = \"manual\")"),
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
                    Allowed::Later { recheck, why }
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

    /// `updraft apply`: let a held switch through at the next step.
    pub fn apply(&mut self) -> Result<String> {
        match self.state()? {
            State::Installed(job) if job.held.is_some() => {
                self.apply_requested = Some(job.id.clone());
                Ok(format!(
                    "release {}: switching to slot {} and rebooting",
                    job.version, job.target
                ))
            }
            State::Installed(job) => Ok(format!(
                "release {}: not held; slot {} is switched in at the next step",
                job.version, job.target
            )),
            other => bail!(
                Busy,
                "nothing waits to be applied (state {}): `updraft apply` switches a release that was written and held by the policy",
                other.name()
            ),
        }
    }
}
