//! The `uboot` backend (placeholder until the native environment lands).

use std::path::Path;

use super::{BootState, Bootloader};
use crate::bail;
use crate::error::Result;
use crate::slot::SlotName;

pub struct UbootBootloader {
    config: std::path::PathBuf,
}

impl UbootBootloader {
    pub fn from_config_file(path: &Path) -> Result<UbootBootloader> {
        Ok(UbootBootloader {
            config: path.to_path_buf(),
        })
    }
}

impl Bootloader for UbootBootloader {
    fn describe(&self) -> String {
        format!("uboot {}", self.config.display())
    }
    fn read(&mut self) -> Result<BootState> {
        bail!(Bootloader, "uboot backend not available in this build")
    }
    fn disable(&mut self, _: SlotName) -> Result<()> {
        bail!(Bootloader, "uboot backend not available in this build")
    }
    fn trial(&mut self, _: SlotName, _: u32) -> Result<()> {
        bail!(Bootloader, "uboot backend not available in this build")
    }
    fn mark_good(&mut self, _: SlotName, _: u32) -> Result<()> {
        bail!(Bootloader, "uboot backend not available in this build")
    }
    fn mark_bad(&mut self, _: SlotName) -> Result<()> {
        bail!(Bootloader, "uboot backend not available in this build")
    }
}
