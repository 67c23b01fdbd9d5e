//! The `file` backend: boot selection in a small text file.
//!
//! For development, demos and tests, and for boards whose boot scripts read
//! a plain file. The file holds the U-Boot variables (`BOOT_ORDER`,
//! `BOOT_A_LEFT`, `BOOT_B_LEFT`) one per line as `NAME=value`, so a script
//! written for the `uboot` backend reads it the same way. Writes are atomic
//! (temporary file, fsync, rename). A missing file reads as the U-Boot
//! default of the boot scripts (`A` only, full attempts); a malformed one is refused, never
//! rewritten.

use std::path::PathBuf;

use super::{BootState, Bootloader, SlotBoot, model};
use crate::error::{Context, Kind, Result};
use crate::fsutil::atomic_write;
use crate::progress::Ticker;
use crate::slot::SlotName;
use crate::{bail, err};

pub struct FileBootloader {
    path: PathBuf,
}

/// Attempts a missing file starts with, as U-Boot boot scripts default them.
const DEFAULT_LEFT: u32 = 3;

impl FileBootloader {
    pub fn new(path: PathBuf) -> FileBootloader {
        FileBootloader { path }
    }

    fn load(&self) -> Result<(Vec<SlotName>, u32, u32)> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // As the boot scripts initialise a fresh environment: slot A
                // only, with full attempts.
                return Ok((vec![SlotName::A], DEFAULT_LEFT, 0));
            }
            Err(e) => {
                return Err(crate::error::Error::from(e)
                    .wrap(format!("reading boot state {}", self.path.display()))
                    .with_kind(Kind::Bootloader));
            }
        };
        let mut order = None;
        let mut a = None;
        let mut b = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                bail!(
                    Bootloader,
                    "boot state {} line {}: expected NAME=value",
                    self.path.display(),
                    n + 1
                );
            };
            let left = |v: &str| {
                v.trim().parse::<u32>().map_err(|_| {
                    err!(
                        Bootloader,
                        "boot state {} line {}: {k}={v:?} is not a count",
                        self.path.display(),
                        n + 1
                    )
                })
            };
            match k.trim() {
                "BOOT_ORDER" => {
                    order = Some(
                        model::parse_order(v)
                            .context(format!("boot state {}", self.path.display()))?,
                    )
                }
                "BOOT_A_LEFT" => a = Some(left(v)?),
                "BOOT_B_LEFT" => b = Some(left(v)?),
                _ => {}
            }
        }
        match (order, a, b) {
            (Some(o), Some(a), Some(b)) => Ok((o, a, b)),
            _ => bail!(
                Bootloader,
                "boot state {} lacks BOOT_ORDER, BOOT_A_LEFT or BOOT_B_LEFT: refusing to guess",
                self.path.display()
            ),
        }
    }

    fn store(&self, order: &[SlotName], a: u32, b: u32) -> Result<()> {
        let text = format!(
            "# updraft boot selection (bootloader kind = \"file\")\nBOOT_ORDER={}\nBOOT_A_LEFT={a}\nBOOT_B_LEFT={b}\n",
            model::format_order(order)
        );
        atomic_write(&self.path, text.as_bytes(), 0o644).kind_context(
            Kind::Bootloader,
            format!("writing boot state {}", self.path.display()),
        )
    }

    fn update(&mut self, f: impl FnOnce(&mut Vec<SlotName>, &mut u32, &mut u32)) -> Result<()> {
        let (mut order, mut a, mut b) = self.load()?;
        let before = (order.clone(), a, b);
        f(&mut order, &mut a, &mut b);
        if before == (order.clone(), a, b) && self.path.exists() {
            return Ok(());
        }
        self.store(&order, a, b)
    }
}

fn left_of<'a>(slot: SlotName, a: &'a mut u32, b: &'a mut u32) -> &'a mut u32 {
    match slot {
        SlotName::A => a,
        SlotName::B => b,
    }
}

impl Bootloader for FileBootloader {
    fn describe(&self) -> String {
        format!("file {}", self.path.display())
    }

    fn read_with(&mut self, _: &mut dyn Ticker) -> Result<BootState> {
        let (order, a, b) = self.load()?;
        let boot = |s: SlotName, left: u32| SlotBoot {
            bootable: order.contains(&s) && left > 0,
            tries_left: left,
        };
        Ok(BootState {
            a: boot(SlotName::A, a),
            b: boot(SlotName::B, b),
            order,
        })
    }

    fn disable_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.update(|order, a, b| {
            *order = model::without(order, slot);
            *left_of(slot, a, b) = 0;
        })
    }

    fn trial_with(&mut self, slot: SlotName, tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.update(|order, a, b| {
            *order = model::first(order, slot);
            *left_of(slot, a, b) = tries;
        })
    }

    fn mark_good_with(&mut self, slot: SlotName, tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.update(|order, a, b| {
            *order = model::first(order, slot);
            *left_of(slot, a, b) = tries;
        })
    }

    fn mark_bad_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.update(|order, a, b| {
            *order = model::first(&model::without(order, slot), slot.other());
            *left_of(slot, a, b) = 0;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("updraft-bootfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("boot.state")
    }

    #[test]
    fn trial_then_good_then_bad() {
        let p = tmp("cycle");
        let mut bl = FileBootloader::new(p.clone());
        crate::test_support::disable_then_trial_b(&mut bl);
        bl.mark_bad(SlotName::B).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.next_boot(), Some(SlotName::A));
        assert!(!s.b.bootable);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("BOOT_ORDER=A\n"), "{text}");
    }

    #[test]
    fn malformed_state_is_refused_and_kept() {
        let p = tmp("bad");
        std::fs::write(&p, "BOOT_ORDER=A X\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n").unwrap();
        let mut bl = FileBootloader::new(p.clone());
        assert!(bl.read().is_err());
        assert!(bl.trial(SlotName::B, 3).is_err());
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "BOOT_ORDER=A X\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n"
        );
        std::fs::write(&p, "BOOT_ORDER=A B\n").unwrap();
        assert!(
            bl.read()
                .unwrap_err()
                .to_string()
                .contains("refusing to guess")
        );
    }
}
