//! The status view: what `updraft status` shows and the control socket
//! carries, as one serde type, so the CLI, the socket and the daemon's
//! snapshot cannot disagree about its fields.
//!
//! The wire form is part of the contract (`docs/cli.md`): fields are only
//! ever added, and optional ones are left out when empty, so an older CLI
//! reads a newer daemon's answer and the reverse. This module builds views
//! from what it is given; it never reads the bootloader or decides anything.

use serde::{Deserialize, Serialize};

use crate::bootloader::BootState;
use crate::error::Result;
use crate::hash::Sha256;
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
