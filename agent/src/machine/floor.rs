//! The hardware rollback floor in the update cycle: the install gate, the
//! advance after a commit and the catch-up at start.
//!
//! Why here: when the counter moves is a property of the cycle. It moves
//! only once a release is committed (its trial boot's health checks passed
//! and the commit is durable), to that release's security version, so a
//! release that is downloaded, tried or rolled back never raises it. A
//! power cut between the commit and the advance is caught up at the next
//! start ([`rollback_counter::catch_up`]); a counter above the running
//! release (the other order: advanced, then the commit record lost) gates
//! installs only, never booting. The rules themselves are the pure
//! functions of [`crate::rollback_counter`]; this file reads the counter,
//! logs and keeps the last reading for the status. It never fails a
//! commit or a start because the counter cannot be advanced.

use super::*;
use crate::config::OnUnreadable;
use crate::rollback_counter::{self, COMMITTED_SECURITY_VERSION, Counter, Reading};

/// The configured counter and what it last said.
pub(crate) struct HardwareFloor {
    counter: Box<dyn Counter>,
    on_unreadable: OnUnreadable,
    last: Option<Reading>,
}

impl HardwareFloor {
    pub(crate) fn from_config(cfg: &Config) -> Option<HardwareFloor> {
        rollback_counter::from_config(&cfg.rollback).map(|counter| HardwareFloor {
            counter,
            on_unreadable: cfg.rollback.on_unreadable,
            last: None,
        })
    }

    fn read(&mut self) -> Reading {
        let r = rollback_counter::read_reading(self.counter.as_mut());
        self.last = Some(r.clone());
        r
    }
}

impl Machine {
    /// The install gate: `m` may be installed only at or above the
    /// counter, and, unless the operator allowed it, only while the counter
    /// can be read.
    pub(super) fn gate_install(&mut self, m: &Manifest) -> Result<()> {
        let Some(floor) = self.floor.as_mut() else {
            return Ok(());
        };
        let reading = floor.read();
        let describe = floor.counter.describe();
        if let Some(warning) = rollback_counter::admit(
            &m.release.version,
            m.security_version,
            &describe,
            &reading,
            floor.on_unreadable,
        )? {
            log::warn!("{warning}");
        }
        Ok(())
    }

    /// `job` is committed: record its security version, then move the
    /// counter up to it. A counter that cannot be advanced is logged and
    /// shown by status; the next start tries again.
    pub(super) fn advance_floor_after_commit(&mut self, job: &Job) -> Result<()> {
        let m = match self.job_manifest() {
            Ok(m) if m.image == job.image => m,
            Ok(_) | Err(_) => {
                log::warn!(
                    "release {} slot {}: its manifest is no longer stored; the hardware floor is not advanced for it",
                    job.version,
                    job.target
                );
                return Ok(());
            }
        };
        self.committed_floor(&job.version, m.security_version)
    }

    /// Release `release` of `security_version` is committed (its slot, or
    /// its components without a reboot): record its security version,
    /// then move the counter up to it.
    pub(super) fn committed_floor(&mut self, release: &str, security_version: u64) -> Result<()> {
        self.store
            .set(COMMITTED_SECURITY_VERSION, &security_version.to_string())?;
        self.advance_floor(Some(security_version), release, "committed");
        Ok(())
    }

    /// At start: advance the counter to the committed release's security
    /// version if a power cut came between the commit and the advance.
    pub(super) fn catch_up_floor(&mut self) {
        let committed = rollback_counter::committed_security_version(&self.store);
        let running = self
            .store
            .slot_record(self.booted)
            .ok()
            .flatten()
            .map(|r| r.version)
            .unwrap_or_else(|| "unknown".into());
        self.advance_floor(committed, &running, "start");
    }

    fn advance_floor(&mut self, committed: Option<u64>, release: &str, when: &str) {
        let Some(floor) = self.floor.as_mut() else {
            return;
        };
        let describe = floor.counter.describe();
        let value = match floor.read() {
            Reading::Value(v) => v,
            Reading::Unreadable(why) => {
                log::error!(
                    "hardware floor: release {release}: {describe} cannot be read at {when}: {why}; installs are {}",
                    match floor.on_unreadable {
                        OnUnreadable::Refuse => "refused until it can",
                        OnUnreadable::Allow => "unchecked until it can",
                    }
                );
                return;
            }
        };
        let Some(target) = rollback_counter::catch_up(committed, value) else {
            return;
        };
        match floor.counter.advance_to(target) {
            Ok(now) => {
                floor.last = Some(Reading::Value(now));
                log::info!(
                    "hardware floor: release {release}: {describe} advanced from {value} to {now} ({when}, security version {target})"
                );
            }
            Err(e) => {
                floor.last = Some(Reading::Unreadable(format!("advancing to {target}: {e}")));
                log::error!(
                    "hardware floor: release {release}: advancing {describe} from {value} to {target} ({when}): {e}; tried again at the next start"
                );
            }
        }
    }

    /// The floor for the status view.
    pub(super) fn floor_status(&self) -> Option<status::HardwareFloor> {
        let floor = self.floor.as_ref()?;
        let reading = floor
            .last
            .clone()
            .unwrap_or_else(|| Reading::Unreadable("not read yet".into()));
        Some(status::HardwareFloor::of(
            floor.counter.describe(),
            &reading,
            floor.on_unreadable,
            rollback_counter::committed_security_version(&self.store),
        ))
    }
}
