//! The update cycle as data: every state, what it carries, and which
//! transitions exist.
//!
//! ```text
//! Idle ─(check finds a release)→ Downloading → Installing → Installed → Rebooting
//!      → Testing (after boot, on the new slot) → Committed | RolledBack
//! any step before the switch → Failed(reason) → Idle (with backoff)
//! ```
//!
//! A check itself is not a persisted state: one that finds nothing to do
//! writes nothing. (`Checking` is kept for databases written by older
//! versions; a restart in it goes back to `Idle`.)
//!
//! The state is persisted (see [`crate::store`]) in one transaction per
//! transition, *before* the side effect the new state announces, and every
//! side effect is safe to repeat, so a restart in any state simply runs that
//! state's action again. What each state's action is lives in
//! [`crate::machine`]; this module only defines the states and the legal
//! moves between them, so the whole machine can be read in one screen.

use serde::{Deserialize, Serialize};

use crate::hash::Sha256;
use crate::manifest::Image;
use crate::slot::SlotName;
use crate::timestamp::Timestamp;

/// How the new image reaches the slot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Method {
    /// The full artifact, streamed frame by frame into the slot.
    Full,
    /// A delta against the active slot, downloaded to `state_dir` first.
    Delta { url: String, size: u64 },
}

/// Why the machine is rebooting.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RebootPurpose {
    /// Into the new slot, for its trial boot.
    Trial,
    /// Back into the old slot after the new one failed its health checks.
    Rollback,
}

/// One install attempt of one release into one slot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Job {
    /// Unique per attempt; reports about this job carry it.
    pub id: String,
    pub version: String,
    pub serial: u64,
    pub image: Image,
    /// Where the manifest came from (URL or path); artifacts resolve
    /// against it.
    pub source: String,
    /// The slot being written (never the booted one).
    pub target: SlotName,
    pub method: Method,
    pub started: Timestamp,
    /// Frames known durable in the target slot (resume hint).
    #[serde(default)]
    pub frames_durable: u64,
    /// Bytes have been written to the target slot: a restarted download
    /// first checks what is already there.
    #[serde(default)]
    pub writing: bool,
    /// Bytes fetched over the network for this job.
    #[serde(default)]
    pub bytes_downloaded: u64,
    /// Boot id when the install finished / the reboot was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<RebootPurpose>,
    /// Why the job failed or was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the image was verified on the slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed: Option<Timestamp>,
    /// The artifact and image hashes were checked while streaming from the
    /// first frame (no resume); otherwise the read-back is mandatory.
    #[serde(default)]
    pub stream_verified: bool,
    /// The image hash was checked on the bytes read back from the slot
    /// while streaming, so the read-back is done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_back: bool,
    /// When the download is abandoned if it has not finished: set when the
    /// download starts (and again on a fallback to the full image) from
    /// the signed size (`server.download_allowance` plus the size over
    /// `server.download_min_average_rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_deadline: Option<Timestamp>,
    /// Since when the verified slot waits for the policy (a maintenance
    /// window, `updraft apply`) before its switch. Set only in
    /// `installed`, before anything is switched; cleared in the same
    /// transaction that enters `rebooting`, after the switch. While it is
    /// set the slot is certainly out of the boot order, so a boot in the
    /// meantime concludes nothing about the image. An older release does
    /// not know it and switches at its next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Timestamp>,
    /// Since when application inhibitors have held the switch or reboot
    /// back (`policy.max_deferral` counts from here). Set in `installed`
    /// or `rebooting` the first time an inhibitor holds the job, kept
    /// while it waits. An older release does not know it and does not ask
    /// inhibitors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inhibited: Option<Timestamp>,
    /// The verified slot's trial boot is not yet known to be in the
    /// bootloader's environment: set in the transaction that enters
    /// `installed`, cleared in the one that records the switch (entering
    /// `rebooting`, or a one-shot install's `installed` again). A power cut
    /// in between may leave the environment switched or not, so a new boot
    /// of the old slot says nothing about the image: the switch is made
    /// again (at worst one trial more), and only a boot of the old slot
    /// after a recorded switch rejects the image. An older release does not
    /// know it and reads such a job as switched, as it always did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub awaiting_switch: bool,
    /// The fleet server's action that assigned this release
    /// (`server.kind = "hawkbit"`): where its feedback goes, and how the
    /// server wants it handled (download or update skipped, forced, a
    /// maintenance window). An older release does not know it and runs
    /// the job by its own policy alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddi: Option<crate::ddi::Action>,
    /// The release's other components that change with the slot (apps):
    /// written before the reboot, activated in the trial boot, committed
    /// or rolled back with the slot. An older release does not know them
    /// and runs the slot's job alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<Record>,
}

impl Job {
    /// A job starting now: nothing fetched, written or booted yet.
    pub fn new(
        id: String,
        version: String,
        serial: u64,
        image: Image,
        source: String,
        target: SlotName,
        method: Method,
    ) -> Job {
        Job {
            id,
            version,
            serial,
            image,
            source,
            target,
            method,
            started: Timestamp::now(),
            frames_durable: 0,
            writing: false,
            bytes_downloaded: 0,
            boot_id: None,
            purpose: None,
            reason: None,
            installed: None,
            stream_verified: false,
            read_back: false,
            download_deadline: None,
            held: None,
            inhibited: None,
            awaiting_switch: false,
            ddi: None,
            components: Vec::new(),
        }
    }

    /// The switch to the verified slot is not recorded: the policy holds
    /// it (`held`, written by this release and older ones), or it was not
    /// yet known to be in the bootloader's environment (`awaiting_switch`).
    pub fn switch_pending(&self) -> bool {
        self.held.is_some() || self.awaiting_switch
    }
}

/// Where one component of a release in progress stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Its new generation is being written (or was, when the power went).
    Writing,
    /// Written and checked, not active.
    Written,
    /// Active, its units restarted; health not yet decided.
    Active,
}

/// One component of a release in progress.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Record {
    pub name: String,
    pub kind: String,
    pub version: String,
    pub content: Sha256,
    pub step: Step,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The generation active before (an app's rollback target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<u64>,
    /// Compressed bytes downloaded for it.
    #[serde(default)]
    pub bytes: u64,
}

/// A release of components in progress (`components_job`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ComponentsJob {
    pub release: String,
    pub serial: u64,
    pub started: Timestamp,
    pub components: Vec<Record>,
}

/// The persisted state of the update cycle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    /// Nothing in progress; waiting for the next poll.
    Idle,
    /// Fetching and verifying the manifest.
    Checking,
    /// Bytes are arriving: a full image streams through verification into
    /// the target slot, which leaves the boot order before the first byte
    /// is written to it; a delta is spooled to `state_dir`.
    Downloading(Job),
    /// All bytes are in (or a delta is being applied); verifying the slot.
    Installing(Job),
    /// The image is verified on the slot and the slot is first in the boot
    /// order for a counted trial boot.
    Installed(Job),
    /// A reboot was requested; `job.boot_id` tells whether it happened.
    Rebooting(Job),
    /// Booted into the new slot; health checks running.
    Testing(Job),
    /// The new slot passed and is marked good.
    Committed(Job),
    /// Back on the old slot; `job.reason` says why.
    RolledBack(Job),
    /// The attempt failed before the device changed slot.
    Failed {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job: Option<Job>,
    },
}

impl State {
    /// Every state's name as stored and reported, in the order of the
    /// update cycle (what [`State::name`] returns).
    pub const NAMES: [&'static str; 10] = [
        "idle",
        "checking",
        "downloading",
        "installing",
        "installed",
        "rebooting",
        "testing",
        "committed",
        "rolled_back",
        "failed",
    ];

    pub fn name(&self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Checking => "checking",
            State::Downloading(_) => "downloading",
            State::Installing(_) => "installing",
            State::Installed(_) => "installed",
            State::Rebooting(_) => "rebooting",
            State::Testing(_) => "testing",
            State::Committed(_) => "committed",
            State::RolledBack(_) => "rolled_back",
            State::Failed { .. } => "failed",
        }
    }

    /// A state as the store keeps it (the JSON its `Serialize` writes:
    /// `{"state": NAME, ...job fields}` or `{"state": "failed", "reason":
    /// ..., "job": {...}}`). The same documents as the derived
    /// `Deserialize`, read without serde's buffering of internally tagged
    /// enums: the job is read straight from the bytes, by the deserializer
    /// `updraft status` reads the daemon's job with, so the binary holds
    /// one of them rather than two.
    pub fn from_json(bytes: &[u8]) -> serde_json::Result<State> {
        use serde::de::Error as _;
        /// The fields of `failed`.
        #[derive(Deserialize)]
        struct Failed {
            reason: String,
            #[serde(default)]
            job: Option<Job>,
        }
        let tagged: serde_json::Value = serde_json::from_slice(bytes)?;
        let Some(tag) = tagged.get("state") else {
            return Err(serde_json::Error::missing_field("state"));
        };
        let Some(tag) = tag.as_str() else {
            return Err(serde_json::Error::custom("`state` is not a string"));
        };
        let job = || serde_json::from_slice::<Job>(bytes);
        Ok(match tag {
            "idle" => State::Idle,
            "checking" => State::Checking,
            "downloading" => State::Downloading(job()?),
            "installing" => State::Installing(job()?),
            "installed" => State::Installed(job()?),
            "rebooting" => State::Rebooting(job()?),
            "testing" => State::Testing(job()?),
            "committed" => State::Committed(job()?),
            "rolled_back" => State::RolledBack(job()?),
            "failed" => {
                let f: Failed = serde_json::from_slice(bytes)?;
                State::Failed {
                    reason: f.reason,
                    job: f.job,
                }
            }
            other => {
                return Err(serde_json::Error::unknown_variant(other, &State::NAMES));
            }
        })
    }

    pub fn job(&self) -> Option<&Job> {
        match self {
            State::Downloading(j)
            | State::Installing(j)
            | State::Installed(j)
            | State::Rebooting(j)
            | State::Testing(j)
            | State::Committed(j)
            | State::RolledBack(j) => Some(j),
            State::Failed { job, .. } => job.as_ref(),
            State::Idle | State::Checking => None,
        }
    }

    /// True while a slot may be half-written or a reboot outcome is
    /// pending: a new install must not start.
    pub fn busy(&self) -> bool {
        !matches!(
            self,
            State::Idle
                | State::Checking
                | State::Committed(_)
                | State::RolledBack(_)
                | State::Failed { .. }
        )
    }

    /// Every legal move. Anything else is a bug and is refused by the store.
    pub fn can_become(&self, next: &State) -> bool {
        use State::*;
        matches!(
            (self, next),
            (Idle | Committed(_) | RolledBack(_) | Failed { .. }, Idle)
                | (
                    Idle | Committed(_) | RolledBack(_) | Failed { .. },
                    Checking
                )
                | (Checking, Idle)
                | (Checking, Downloading(_))
                | (
                    Idle | Committed(_) | RolledBack(_) | Failed { .. },
                    Downloading(_)
                )
                | (Downloading(_), Downloading(_))
                | (Downloading(_), Installing(_))
                | (Installing(_), Downloading(_))
                | (Installing(_), Installed(_))
                | (Installed(_), Rebooting(_))
                | (Installed(_), Testing(_))
                | (Installed(_), RolledBack(_))
                | (Rebooting(_), Rebooting(_))
                | (Rebooting(_), Testing(_))
                | (Rebooting(_), RolledBack(_))
                | (Testing(_), Testing(_))
                | (Testing(_), Committed(_))
                | (Testing(_), Rebooting(_))
                | (Testing(_), RolledBack(_))
                | (
                    Checking | Downloading(_) | Installing(_) | Installed(_),
                    Failed { .. }
                )
                | (Rebooting(_) | Testing(_), Failed { .. })
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::job_into;

    fn job() -> Job {
        job_into(SlotName::B)
    }

    #[test]
    fn from_json_reads_what_serialize_writes_as_the_derived_deserialize_does() {
        let mut full = job();
        full.boot_id = Some("b".into());
        full.purpose = Some(RebootPurpose::Rollback);
        full.reason = Some("r".into());
        full.ddi = Some(crate::ddi::Action {
            id: "5".into(),
            href: "https://h/c/v1/d/deploymentBase/5?c=1".into(),
            download: crate::ddi::Handling::Forced,
            update: crate::ddi::Handling::Attempt,
            maintenance_window: Some(crate::ddi::MaintenanceWindow::Available),
        });
        full.installed = Some(Timestamp(7));
        full.method = Method::Delta {
            url: "artifacts/d.zst".into(),
            size: 9,
        };
        let states = [
            State::Idle,
            State::Checking,
            State::Downloading(job()),
            State::Installing(job()),
            State::Installed(full.clone()),
            State::Rebooting(full.clone()),
            State::Testing(job()),
            State::Committed(job()),
            State::RolledBack(full.clone()),
            State::Failed {
                reason: "no space".into(),
                job: None,
            },
            State::Failed {
                reason: "bad".into(),
                job: Some(full),
            },
        ];
        for s in states {
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(State::from_json(text.as_bytes()).unwrap(), s, "{text}");
            assert_eq!(serde_json::from_str::<State>(&text).unwrap(), s, "{text}");
        }
        // Older databases: a tag anywhere, unknown fields ignored.
        let idle = State::from_json(br#"{"since":1,"state":"idle"}"#).unwrap();
        assert_eq!(idle, State::Idle);
        for bad in [
            &br#"{"state":"sleeping"}"#[..],
            br#"{"reason":"x"}"#,
            br#"{"state":1}"#,
            br#"{"state":"failed"}"#,
            br#"{"state":"downloading","id":"j"}"#,
            b"not json",
        ] {
            let e = State::from_json(bad).unwrap_err();
            assert!(serde_json::from_slice::<State>(bad).is_err(), "{e}");
        }
    }
}
