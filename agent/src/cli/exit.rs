//! Exit statuses: the contract scripts rely on.
//!
//! A script that drives `updraft` wants to branch on what happened, not
//! parse English: "nothing to do" is not "a reboot finishes it", and
//! neither is "the policy holds it". This module owns the numbers and the
//! one decision behind them — when a job the command follows has reached
//! an outcome, read from the daemon's status — as pure functions over
//! values, tested row by row. It never talks to the daemon or prints.
//!
//! The numbers are stable from release 0.1 on (docs/cli.md, "Exit
//! status"). 0, 1, 2 and 3 are what every command has always returned;
//! 4, 5 and 6 describe a success more precisely and are returned only by
//! `check --wait` and `install --wait`, since scripts written earlier
//! treat every success as 0 (`updraft install X && reboot`).

use crate::error::Kind;
use crate::status::Status;

/// The command did what it was asked, to the end.
pub const DONE: u8 = 0;
/// It failed; stderr says why.
pub const FAILED: u8 = 1;
/// The command line was wrong.
pub const USAGE: u8 = 2;
/// The daemon runs degraded: it could not start its work.
pub const DEGRADED: u8 = 3;
/// Nothing to do: the release named is running, or not for this device.
pub const NOTHING_TO_DO: u8 = 4;
/// Installed and switched in: a reboot finishes it (the daemon's own, or
/// the operator's when no daemon runs).
pub const REBOOT_NEEDED: u8 = 5;
/// The policy holds it: a maintenance window, `updraft apply`, an
/// application's inhibitor.
pub const HELD: u8 = 6;

/// How a command that succeeded ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    NothingToDo,
    RebootNeeded,
    Held,
}

impl Outcome {
    /// The exit status: the precise one when the caller asked for it
    /// (`--wait`), else 0 for every success, as before.
    pub fn code(self, precise: bool) -> u8 {
        match (self, precise) {
            (_, false) | (Outcome::Done, true) => DONE,
            (Outcome::NothingToDo, true) => NOTHING_TO_DO,
            (Outcome::RebootNeeded, true) => REBOOT_NEEDED,
            (Outcome::Held, true) => HELD,
        }
    }
}

/// The exit status of an error.
pub fn failure(kind: Kind) -> u8 {
    match kind {
        Kind::Usage => USAGE,
        Kind::Degraded => DEGRADED,
        _ => FAILED,
    }
}

/// Where a followed job stands in a status snapshot.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Still on its way.
    Running,
    /// It reached an outcome; the text says what to print.
    Ended(Outcome, String),
    /// It failed or was rolled back; the text says why.
    Failed(String),
}

/// Whether the job installing `release` has reached an outcome, judged
/// from the daemon's status. `None`: the release was not seen in a job
/// yet (it may have ended between two looks), and the newest finished
/// install answers. Pure: the follow loop polls the daemon and asks this.
pub fn settled(release: Option<&str>, st: &Status) -> Progress {
    let job = st
        .job
        .as_ref()
        .map(|j| format!("release {} in slot {}", j.version, j.target))
        .unwrap_or_else(|| format!("release {}", release.unwrap_or("")));
    let waiting = st.policy.as_ref().and_then(|p| p.waiting_for.as_deref());
    match st.state.as_str() {
        "installed" => match waiting {
            Some(what) => Progress::Ended(
                Outcome::Held,
                format!("installed {job}; held by the policy: it waits for {what}"),
            ),
            None => Progress::Running,
        },
        "rebooting" => Progress::Ended(
            Outcome::RebootNeeded,
            format!("installed {job}; the daemon reboots into it for a trial boot"),
        ),
        "committed" => Progress::Ended(Outcome::Done, format!("{job} committed")),
        "idle" | "failed" => {
            let last = st
                .last_install
                .as_ref()
                .filter(|l| release.is_none_or(|r| l.release == r));
            match last {
                Some(l) if l.result == "committed" => {
                    Progress::Ended(Outcome::Done, format!("release {} committed", l.release))
                }
                Some(l) => Progress::Failed(format!(
                    "release {} {}: {}",
                    l.release,
                    l.result.replace('_', " "),
                    l.reason.as_deref().unwrap_or("see updraft history")
                )),
                None => Progress::Failed(format!(
                    "{job} did not install: {}",
                    st.last_error.as_deref().unwrap_or("see updraft history")
                )),
            }
        }
        // checking, downloading, installing, testing, rolling back, and
        // any state a later release adds: not an outcome yet.
        _ => Progress::Running,
    }
}

/// Without `--wait`, `install` follows the job until it leaves the
/// download and install states, whatever comes next: the slot is written.
pub fn written(_release: Option<&str>, st: &Status) -> Progress {
    match st.state.as_str() {
        "checking" | "downloading" | "installing" => Progress::Running,
        "failed" | "idle" => Progress::Failed(format!(
            "install failed: {}",
            st.last_error.as_deref().unwrap_or("see updraft history")
        )),
        other => {
            let job = st
                .job
                .as_ref()
                .map(|j| format!("release {} in slot {}", j.version, j.target));
            Progress::Ended(
                Outcome::Done,
                format!(
                    "installed {} (daemon state: {other})",
                    job.unwrap_or_default()
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::SlotName;
    use crate::status::{LastInstall, PolicyStatus};
    use crate::timestamp::Timestamp;
    use serde_json::json;

    /// A status as the daemon sends it, with the fields every one has.
    fn status(state: &str) -> Status {
        serde_json::from_value(json!({
            "state": state,
            "since": "2026-12-07T10:00:00Z",
            "device_id": "gw-17",
            "booted_slot": "A",
            "slots": [],
            "keys_version": 1,
            "outbox": 0
        }))
        .expect("a status with every required field")
    }

    fn last(release: &str, result: &str, reason: &str) -> Option<LastInstall> {
        Some(LastInstall {
            release: release.into(),
            result: result.into(),
            reason: Some(reason.into()),
            time: Timestamp(0),
            slot: Some(SlotName::B),
        })
    }

    #[test]
    fn statuses_are_the_documented_numbers() {
        let rows = [
            (Outcome::Done, true, 0),
            (Outcome::NothingToDo, true, 4),
            (Outcome::RebootNeeded, true, 5),
            (Outcome::Held, true, 6),
            (Outcome::Done, false, 0),
            (Outcome::NothingToDo, false, 0),
            (Outcome::RebootNeeded, false, 0),
            (Outcome::Held, false, 0),
        ];
        for (outcome, precise, code) in rows {
            assert_eq!(outcome.code(precise), code, "{outcome:?} precise={precise}");
        }
        assert_eq!(failure(Kind::Usage), 2);
        assert_eq!(failure(Kind::Degraded), 3);
        for k in [Kind::Io, Kind::Signature, Kind::Busy, Kind::Config] {
            assert_eq!(failure(k), 1, "{k:?}");
        }
    }

    #[test]
    fn a_job_on_its_way_has_no_outcome_yet() {
        for state in [
            "checking",
            "downloading",
            "installing",
            "installed",
            "testing",
            "rolling_back",
            "a-state-of-a-later-release",
        ] {
            assert_eq!(
                settled(Some("1.1"), &status(state)),
                Progress::Running,
                "{state}"
            );
        }
    }

    #[test]
    fn without_wait_an_install_ends_once_its_slot_is_written() {
        for state in ["checking", "downloading", "installing"] {
            assert_eq!(written(None, &status(state)), Progress::Running, "{state}");
        }
        let mut failed = status("failed");
        failed.last_error = Some("sha256 mismatch in frame 3".into());
        assert_eq!(
            written(None, &failed),
            Progress::Failed("install failed: sha256 mismatch in frame 3".into())
        );
        for state in ["installed", "rebooting", "testing"] {
            assert!(
                matches!(
                    written(None, &status(state)),
                    Progress::Ended(Outcome::Done, _)
                ),
                "{state}"
            );
        }
    }

    #[test]
    fn each_resting_point_is_its_outcome() {
        let mut held = status("installed");
        held.policy = Some(PolicyStatus {
            switch: "window".into(),
            waiting_for: Some("window".into()),
            write: None,
            pending_release: None,
            inhibitors: Vec::new(),
            inhibited_since: None,
            held_since: None,
            window: None,
        });
        let mut committed_idle = status("idle");
        committed_idle.last_install = last("1.1", "committed", "health checks passed");
        let mut rolled_back = status("idle");
        rolled_back.last_install = last("1.1", "rolled_back", "health check 20-app failed");
        let mut failed = status("failed");
        failed.last_install = last("1.1", "failed", "sha256 mismatch");
        let mut other_release = status("idle");
        other_release.last_install = last("1.0", "committed", "");
        other_release.last_error = Some("manifest serial 4 is older than stored serial 5".into());

        let outcome = |st: &Status| match settled(Some("1.1"), st) {
            Progress::Ended(o, _) => Some(o),
            _ => None,
        };
        assert_eq!(outcome(&held), Some(Outcome::Held));
        // A job that ended between two looks: the newest install answers.
        assert_eq!(
            settled(None, &committed_idle),
            Progress::Ended(Outcome::Done, "release 1.1 committed".into())
        );
        assert_eq!(outcome(&status("rebooting")), Some(Outcome::RebootNeeded));
        assert_eq!(outcome(&status("committed")), Some(Outcome::Done));
        assert_eq!(outcome(&committed_idle), Some(Outcome::Done));
        assert_eq!(
            settled(Some("1.1"), &rolled_back),
            Progress::Failed("release 1.1 rolled back: health check 20-app failed".into())
        );
        assert_eq!(
            settled(Some("1.1"), &failed),
            Progress::Failed("release 1.1 failed: sha256 mismatch".into())
        );
        assert_eq!(
            settled(Some("1.1"), &other_release),
            Progress::Failed(
                "release 1.1 did not install: manifest serial 4 is older than stored serial 5"
                    .into()
            )
        );
    }
}
