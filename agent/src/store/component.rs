//! What the device runs of each component besides its slot, and the
//! release of components in progress: rows of the key/value table
//! (`component.<name>`, `component_rejected.<name>`, `components_job`),
//! keys the releases before components never read, so a rollback to one
//! of them leaves them be.

use serde::{Deserialize, Serialize};

use super::Store;
use crate::err;
use crate::error::Result;
use crate::hash::Sha256;
use crate::timestamp::Timestamp;

const RUNNING: &str = "component.";
const REJECTED: &str = "component_rejected.";
/// The release of components in progress.
pub const JOB: &str = "components_job";

/// What a device runs of one component.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Running {
    pub name: String,
    pub kind: String,
    pub version: String,
    /// The component's content ([`crate::manifest::component::Component::content`]).
    pub content: Sha256,
    /// An app's active generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The release it came with.
    pub release: String,
    pub installed: Timestamp,
}

impl Store {
    /// What runs of component `name`.
    pub fn running_component(&self, name: &str) -> Result<Option<Running>> {
        let key = format!("{RUNNING}{name}");
        let Some(text) = self.get(&key)? else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| err!(Store, "database value {key} is malformed: {e}"))
    }

    pub fn set_running_component(&self, r: &Running) -> Result<()> {
        let text = serde_json::to_string(r)
            .map_err(|e| err!(Store, "serialising component {}: {e}", r.name))?;
        self.set(&format!("{RUNNING}{}", r.name), &text)
    }

    /// Every component running, by name.
    pub fn running_components(&self) -> Result<Vec<Running>> {
        let mut stmt = self
            .conn
            .prepare("SELECT key, value FROM meta WHERE key LIKE 'component.%' ORDER BY key")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (key, text) = row?;
            let r: Running = serde_json::from_str(&text)
                .map_err(|e| err!(Store, "database value {key} is malformed: {e}"))?;
            out.push(r);
        }
        Ok(out)
    }

    /// The content of component `name` rolled back here, if one was.
    pub fn rejected_component(&self, name: &str) -> Result<Option<Sha256>> {
        Ok(self
            .get(&format!("{REJECTED}{name}"))?
            .and_then(|h| Sha256::from_hex(&h).ok()))
    }

    pub fn reject_component(&self, name: &str, content: &Sha256) -> Result<()> {
        self.set(&format!("{REJECTED}{name}"), &content.to_hex())
    }
}
