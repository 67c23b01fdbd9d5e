//! Who this device is and which boot it is in.
//!
//! * The **device id** identifies the device in reports and decides staged
//!   rollout. It lives in `device.id_file` on the data partition so it
//!   survives slot switches. It is created once: derived from
//!   `/etc/machine-id` when present (hashed with an updraft-specific prefix,
//!   as systemd recommends for application ids, so the machine id itself is
//!   never disclosed), else random.
//! * The **boot id** (`/proc/sys/kernel/random/boot_id`) changes on every
//!   boot; comparing the stored one with the current one is how updraft
//!   tells a daemon restart from a reboot.

use std::path::Path;

use crate::error::{Context, Kind, Result};
use crate::fsutil::{atomic_write, ensure_dir};
use crate::hash::{Sha256, hex};
use crate::{bail, err};

/// Read the device id, creating it on first use.
pub fn device_id(id_file: &Path) -> Result<String> {
    match std::fs::read_to_string(id_file) {
        Ok(s) => {
            let id = s.trim();
            if id.is_empty() || id.len() > 128 || !id.chars().all(|c| c.is_ascii_graphic()) {
                bail!(
                    Config,
                    "device id file {} does not hold a printable id",
                    id_file.display()
                );
            }
            Ok(id.to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = new_device_id()?;
            if let Some(dir) = id_file.parent() {
                ensure_dir(dir, 0o755)?;
            }
            atomic_write(id_file, format!("{id}\n").as_bytes(), 0o644)
                .with_context(|| format!("creating device id file {}", id_file.display()))?;
            log::info!("created device id {id} in {}", id_file.display());
            Ok(id)
        }
        Err(e) => Err(crate::error::Error::from(e)
            .wrap(format!("reading device id file {}", id_file.display()))
            .with_kind(Kind::Config)),
    }
}

fn new_device_id() -> Result<String> {
    if let Ok(mid) = std::fs::read_to_string("/etc/machine-id") {
        let mid = mid.trim();
        if mid.len() == 32 && mid.chars().all(|c| c.is_ascii_hexdigit()) {
            let mut input = b"updraft device id\0".to_vec();
            input.extend_from_slice(mid.as_bytes());
            return Ok(Sha256::of(&input).to_hex()[..32].to_string());
        }
    }
    Ok(hex(&crate::random::bytes::<16>()?))
}

/// The current boot id.
pub fn boot_id(path: &Path) -> Result<String> {
    let s = std::fs::read_to_string(path)
        .map_err(|e| err!(Config, "reading boot id {}: {e}", path.display()))?;
    let id = s.trim();
    if id.is_empty() || id.len() > 128 {
        bail!(
            Config,
            "boot id file {} is empty or malformed",
            path.display()
        );
    }
    Ok(id.to_string())
}
