//! The `script` backend (placeholder until the native environment lands).

use super::{BootState, Bootloader};
use crate::bail;
use crate::error::Result;
use crate::slot::SlotName;

pub struct ScriptBootloader {
    config: std::path::PathBuf,
}

impl ScriptBootloader {
    pub fn new(path: std::path::PathBuf) -> Result<ScriptBootloader> {
        Ok(ScriptBootloader { config: path })
    }
}

impl Bootloader for ScriptBootloader {
    fn describe(&self) -> String {
        format!("script {}", self.config.display())
    }
    fn read(&mut self) -> Result<BootState> {
        bail!(Bootloader, "script backend not available in this build")
    }
    fn disable(&mut self, _: SlotName) -> Result<()> {
        bail!(Bootloader, "script backend not available in this build")
    }
    fn trial(&mut self, _: SlotName, _: u32) -> Result<()> {
        bail!(Bootloader, "script backend not available in this build")
    }
    fn mark_good(&mut self, _: SlotName, _: u32) -> Result<()> {
        bail!(Bootloader, "script backend not available in this build")
    }
    fn mark_bad(&mut self, _: SlotName) -> Result<()> {
        bail!(Bootloader, "script backend not available in this build")
    }
}
