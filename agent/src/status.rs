//! The status view: what `updraft status` shows and the control socket
//! carries, as one serde type, so the CLI, the socket and the daemon's
//! snapshot cannot disagree about its fields. It includes how the last
//! install ended ([`LastInstall`]), read back from the history.
//!
//! The wire form is part of the contract (`docs/cli.md`): fields are only
//! ever added, and optional ones are left out when empty, so an older CLI
//! reads a newer daemon's answer and the reverse. This module builds views
//! from what it is given; it never reads the bootloader or decides anything.

use serde::{Deserialize, Serialize};

use crate::bootloader::BootState;
use crate::error::Result;
use crate::hash::Sha256;
use crate::inhibit::Inhibitor;
use crate::progress::Progress;
use crate::slot::{SlotName, SlotPair};
use crate::state::Job;
use crate::store::Store;
use crate::timestamp::Timestamp;

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

/// The boot selection as read for a status, or why it could not be read.
pub type BootView = std::result::Result<BootState, String>;

/// Everything `updraft status` shows.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Status {
    pub state: String,
    pub since: Timestamp,
    pub device_id: String,
    /// The device key that signs reports (its public half), or why it
    /// cannot be used; absent before the daemon made one (and from
    /// releases before signed reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::device_key::IdentityView>,
    /// The device's X25519 public key (base64), the line an operator adds
    /// to a recipient list for encrypted releases; absent before the
    /// daemon made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key: Option<String>,
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
    /// The highest manifest serial ever accepted.
    pub serial: Option<u64>,
    pub keys_version: u64,
    /// The serial floor of the channel followed under key document
    /// `keys_version`: a manifest must be at least this (equal is "no
    /// change"). Lower than `serial` after a key rotation reset the floors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<u64>,
    /// The channel followed and who chose it (absent from releases before
    /// channels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<crate::channel::Followed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_check: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_check: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub outbox: u64,
    /// Reports dropped from a full outbox since the database was made
    /// (install results never are); absent while none was.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outbox_dropped: u64,
    /// How the newest finished install ended; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_install: Option<LastInstall>,
    /// When the policy lets a verified slot be switched in; absent when
    /// it switches at once (`auto`, and releases before policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStatus>,
    /// The components running besides the slot, by name; absent before
    /// the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<crate::store::Running>,
    /// The hardware rollback floor (`[rollback]`); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_floor: Option<HardwareFloor>,
}

/// The hardware rollback floor as last read.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HardwareFloor {
    /// The counter: `tpm2 NV index 0x1500016`, `counter command PROGRAM`.
    pub counter: String,
    /// Its value: the lowest security version this device installs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    /// Why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `checked` (installs are held to the floor), `refused` (the counter
    /// cannot be read: nothing is installed) or `unchecked` (it cannot be
    /// read and `rollback.on_unreadable = "allow"`).
    pub installs: String,
    /// The security version of the release last committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_security_version: Option<u64>,
}

impl HardwareFloor {
    /// The view of `reading` of `counter`.
    pub fn of(
        counter: String,
        reading: &crate::rollback_counter::Reading,
        on_unreadable: crate::config::OnUnreadable,
        committed_security_version: Option<u64>,
    ) -> HardwareFloor {
        use crate::rollback_counter::Reading;
        let (value, error, installs) = match (reading, on_unreadable) {
            (Reading::Value(v), _) => (Some(*v), None, "checked"),
            (Reading::Unreadable(e), crate::config::OnUnreadable::Refuse) => {
                (None, Some(e.clone()), "refused")
            }
            (Reading::Unreadable(e), crate::config::OnUnreadable::Allow) => {
                (None, Some(e.clone()), "unchecked")
            }
        };
        HardwareFloor {
            counter,
            value,
            error,
            installs: installs.into(),
            committed_security_version,
        }
    }

    /// One line for `updraft status`.
    pub fn describe(&self) -> String {
        match (&self.value, &self.error) {
            (Some(v), _) => format!("{v} ({})", self.counter),
            (None, e) => format!(
                "UNREADABLE ({}): {}; installs {}",
                self.counter,
                e.as_deref().unwrap_or("no reading yet"),
                self.installs
            ),
        }
    }
}

/// The switch gate and what it waits for.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PolicyStatus {
    /// `auto`, `window` or `manual`: the stricter of `policy.switch` and
    /// `policy.reboot`.
    pub switch: String,
    /// What the job's switch or reboot waits for now: `window`,
    /// `operator`, `inhibitor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// `window` or `manual` when `policy.write` gates the download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<String>,
    /// A release seen but not downloaded yet: `policy.write` holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_release: Option<String>,
    /// Who inhibits, as last asked (only while a job waits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inhibitors: Vec<Inhibitor>,
    /// Since when inhibitors have held the job back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inhibited_since: Option<Timestamp>,
    /// Since when the verified slot of the job waits, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_since: Option<Timestamp>,
    /// The maintenance window open now, or the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowStatus>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WindowStatus {
    pub opens: Timestamp,
    pub closes: Timestamp,
    pub open: bool,
}

impl PolicyStatus {
    /// What `policy` says at `now` about `job` (or `pending_release`, a
    /// release the write gate holds), waiting for `waiting_for` with
    /// `inhibitors`; `None` with every gate `auto` and nothing held.
    pub fn of(
        policy: &crate::config::Policy,
        job: Option<&Job>,
        pending_release: Option<&str>,
        waiting_for: Option<&str>,
        inhibitors: &[Inhibitor],
        now: Timestamp,
    ) -> Option<PolicyStatus> {
        use crate::config::Gate;
        let (gate, _) = policy.switch_gate();
        if gate == Gate::Auto && policy.write == Gate::Auto && waiting_for.is_none() {
            return None;
        }
        // The zone as the last hold decision (which re-reads it) saw it.
        let window = policy
            .windows
            .current_or_next(now, &crate::window::Local)
            .map(|s| WindowStatus {
                opens: s.opens,
                closes: s.closes,
                open: s.opens <= now,
            });
        Some(PolicyStatus {
            switch: gate.as_str().into(),
            write: (policy.write != Gate::Auto).then(|| policy.write.as_str().to_string()),
            pending_release: pending_release.map(str::to_string),
            waiting_for: waiting_for.map(str::to_string),
            inhibitors: if waiting_for.is_some() {
                inhibitors.to_vec()
            } else {
                Vec::new()
            },
            inhibited_since: job.and_then(|j| j.inhibited),
            held_since: job.and_then(|j| j.held),
            window,
        })
    }
}

/// How the newest finished install job ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LastInstall {
    /// The release the job installed.
    pub release: String,
    /// `committed`, `rolled_back` or `failed`: the `result` of its install
    /// report.
    pub result: String,
    /// Why: the health checks passed, what failed, who cancelled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it ended.
    pub time: Timestamp,
    /// The slot the job wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<SlotName>,
}

/// History events that end an install job, and the result each stands for.
const JOB_ENDS: [(&str, &str); 5] = [
    ("committed", "committed"),
    ("rolled-back", "rolled_back"),
    ("failed", "failed"),
    // `updraft cancel`, or mark-bad before the trial boot.
    ("cancelled", "cancelled"),
    // A newer release replaced the job before its switch.
    ("superseded", "failed"),
];

/// The last install's outcome, from the newest history line that ends a
/// job (the history keeps the newest 1000 lines).
pub(crate) fn last_install(store: &Store) -> Result<Option<LastInstall>> {
    let events = JOB_ENDS.map(|(event, _)| event);
    Ok(store.newest_event(&events)?.map(|e| LastInstall {
        result: JOB_ENDS
            .iter()
            .find(|(event, _)| *event == e.event)
            .map_or("failed", |(_, result)| result)
            .to_string(),
        release: e.release.unwrap_or_default(),
        reason: e.detail,
        time: e.time,
        slot: e.slot.as_deref().and_then(SlotName::parse),
    }))
}

/// The release the booted slot runs: the one recorded for it, or else the
/// one its release marker names (a device fresh from the factory, or one
/// `updraft adopt` took over, before a manifest named that release). A
/// marker that cannot be read names nothing here; the check that reads it
/// says why.
pub(crate) fn running_version(slots: &[SlotStatus], marker: &std::path::Path) -> Option<String> {
    let booted = slots.iter().find(|s| s.booted)?;
    booted.version.clone().or_else(|| {
        crate::provision::read_marker(marker)
            .ok()
            .flatten()
            .map(|m| m.version)
    })
}

/// Both slots as the store and the bootloader (when it could be read)
/// know them.
pub(crate) fn slots(
    store: &Store,
    pair: &SlotPair,
    booted: SlotName,
    boot: Option<&BootState>,
) -> Result<Vec<SlotStatus>> {
    [SlotName::A, SlotName::B]
        .into_iter()
        .map(|s| {
            let rec = store.slot_record(s)?;
            let b = boot.map(|b| b.slot(s));
            Ok(SlotStatus {
                slot: s,
                path: pair.path(s).display().to_string(),
                version: rec.as_ref().map(|r| r.version.clone()),
                sha256: rec.as_ref().map(|r| r.sha256),
                booted: s == booted,
                bootable: b.map(|b| b.bootable),
                tries_left: b.map(|b| b.tries_left),
            })
        })
        .collect()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Event;

    #[test]
    fn the_last_install_is_the_newest_end_of_a_job() {
        let d = std::env::temp_dir().join(format!("updraft-status-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let store = Store::open(&d.join("updraft.db")).unwrap();
        assert_eq!(last_install(&store).unwrap(), None);
        let add = |event, release, detail| {
            store
                .add_history(&Event {
                    event,
                    release: Some(release),
                    slot: Some(SlotName::B),
                    detail: Some(detail),
                })
                .unwrap()
        };
        add("committed", "1.0", "health checks passed");
        add("rollback", "2.0", "health check 20-app failed");
        add("rolled-back", "2.0", "health check 20-app failed");
        let l = last_install(&store).unwrap().unwrap();
        assert_eq!(
            (
                l.release.as_str(),
                l.result.as_str(),
                l.reason.as_deref(),
                l.slot
            ),
            (
                "2.0",
                "rolled_back",
                Some("health check 20-app failed"),
                Some(SlotName::B)
            )
        );
        // Starting the next job does not hide how the last one ended.
        add("download", "3.0", "full image");
        assert_eq!(last_install(&store).unwrap().unwrap().release, "2.0");
        // A cancelled job is neither committed nor failed.
        add(
            "cancelled",
            "3.0",
            "cancelled by the operator: switched back before the reboot",
        );
        let l = last_install(&store).unwrap().unwrap();
        assert_eq!(
            (l.release.as_str(), l.result.as_str()),
            ("3.0", "cancelled")
        );
        add("failed", "4.0", "artifact sha256 mismatch");
        let l = last_install(&store).unwrap().unwrap();
        assert_eq!((l.release.as_str(), l.result.as_str()), ("4.0", "failed"));
        // A job a newer release replaced ended there, as failed.
        add("superseded", "5.0", "superseded by release 6.0 serial 9");
        add("download", "6.0", "full image");
        let l = last_install(&store).unwrap().unwrap();
        assert_eq!(
            (l.release.as_str(), l.result.as_str(), l.reason.as_deref()),
            ("5.0", "failed", Some("superseded by release 6.0 serial 9"))
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
