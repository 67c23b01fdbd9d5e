//! The `grub` backend (placeholder until the native environment lands).

use super::{BootState, Bootloader};
use crate::bail;
use crate::error::Result;
use crate::slot::SlotName;

pub struct GrubBootloader {
    config: std::path::PathBuf,
}

impl GrubBootloader {
    pub fn new(path: std::path::PathBuf) -> Result<GrubBootloader> {
        Ok(GrubBootloader { config: path })
    }
}

impl Bootloader for GrubBootloader {
    fn describe(&self) -> String {
        format!("grub {}", self.config.display())
    }
    fn read(&mut self) -> Result<BootState> {
        bail!(Bootloader, "grub backend not available in this build")
    }
    fn disable(&mut self, _: SlotName) -> Result<()> {
        bail!(Bootloader, "grub backend not available in this build")
    }
    fn trial(&mut self, _: SlotName, _: u32) -> Result<()> {
        bail!(Bootloader, "grub backend not available in this build")
    }
    fn mark_good(&mut self, _: SlotName, _: u32) -> Result<()> {
        bail!(Bootloader, "grub backend not available in this build")
    }
    fn mark_bad(&mut self, _: SlotName) -> Result<()> {
        bail!(Bootloader, "grub backend not available in this build")
    }
}
