//! Mender's GRUB integration (`kind = "grub"`, `flow = "mender"`): the boot
//! selection in Mender's own pair of GRUB environment blocks, so a device
//! taken over from Mender keeps its `grub.cfg`.
//!
//! Mender's GRUB integration (grub-mender-grubenv, its documented layout
//! and scripts) keeps `mender_boot_part`, `upgrade_available` and
//! `bootcount` in two copies, `mender_grubenv1/env` and
//! `mender_grubenv2/env` under one directory, each a 1024-byte GRUB
//! environment block. Beside each copy a block `lock` holds `editing=1`
//! while that copy is being written and `editing=0` otherwise (its
//! `lock.sha256sum` is the checksum of the lock with `editing=0`, which
//! Mender's `fw_setenv` checks). At boot GRUB restores a copy whose lock
//! says it was being edited from the other one, reads copy 1, and while
//! `upgrade_available=1` counts the boot in `bootcount` (a second boot
//! switches `mender_boot_part` back and clears the flag).
//!
//! updraft writes the way Mender's client does: copy 2 first, then copy 1,
//! each between `editing=1` and `editing=0` in its lock, every block
//! rewritten in place and fsynced ([`super::grub::GrubBootloader::update`]).
//! A power cut at any instant leaves one copy whose lock says `editing=0`
//! with either the old or the new variables, and GRUB restores the other
//! from it. The variables' meaning is [`super::flow::Flow::Mender`]'s.
//!
//! It never creates the files (a device without them is not a Mender
//! device), and refuses when both locks say `editing=1` or a block does
//! not parse.

use std::path::{Path, PathBuf};

use super::flow::Flow;
use super::grub::{GrubBootloader, GrubEnv};
use super::{BootState, Bootloader, Change};
use crate::bail;
use crate::error::{Context, Kind, Result};
use crate::progress::Ticker;
use crate::slot::SlotName;

/// One copy: its environment block and its lock.
struct Copy {
    env: GrubBootloader,
    lock: GrubBootloader,
}

impl Copy {
    fn at(dir: &Path, n: u32) -> Result<Copy> {
        let d = dir.join(format!("mender_grubenv{n}"));
        Ok(Copy {
            env: GrubBootloader::new(d.join("env"))?,
            lock: GrubBootloader::new(d.join("lock"))?,
        })
    }

    /// Whether the lock says the copy is whole (`editing=0`), or why it
    /// says nothing: a lock that cannot be read is no `editing=0` to GRUB's
    /// `load_env` either.
    fn whole(&self) -> std::result::Result<(), String> {
        match self.lock.load() {
            Ok(lock) => match lock.get("editing").as_deref() {
                Some(b"0") => Ok(()),
                _ => Err("its lock says it was being written".into()),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    /// Write `vars` into the copy between `editing=1` and `editing=0`.
    fn write(&mut self, vars: &GrubEnv) -> Result<()> {
        self.lock.update(|l| l.set("editing", "1"))?;
        self.env.update(|e| {
            for name in MENDER_VARS {
                match vars.get(name) {
                    Some(v) => e.set(name, &String::from_utf8_lossy(&v))?,
                    None => e.unset(name),
                }
            }
            Ok(())
        })?;
        self.lock.update(|l| l.set("editing", "0"))
    }
}

/// The variables Mender's GRUB script saves, and updraft writes.
const MENDER_VARS: [&str; 4] = [
    "mender_boot_part",
    "mender_boot_part_hex",
    "upgrade_available",
    "bootcount",
];

pub struct MenderGrubBootloader {
    dir: PathBuf,
    flow: Flow,
    copies: [Copy; 2],
}

impl MenderGrubBootloader {
    /// Mender's environment under `dir` (the directory holding
    /// `mender_grubenv1/` and `mender_grubenv2/`); slots A and B are the
    /// root partitions `partitions`.
    pub fn new(dir: PathBuf, partitions: [u32; 2]) -> Result<MenderGrubBootloader> {
        let copies = [Copy::at(&dir, 1)?, Copy::at(&dir, 2)?];
        Ok(MenderGrubBootloader {
            dir,
            flow: Flow::Mender { partitions },
            copies,
        })
    }

    fn what(&self) -> String {
        format!("Mender's GRUB environment in {}", self.dir.display())
    }

    /// The current variables: copy 1, unless its lock says it was being
    /// written (then copy 2), as GRUB reads them; and whether both copies
    /// hold the same block.
    fn load(&self) -> Result<(GrubEnv, bool)> {
        let from = match (self.copies[0].whole(), self.copies[1].whole()) {
            (Ok(()), _) => 0,
            (_, Ok(())) => 1,
            (Err(one), Err(two)) => bail!(
                Bootloader,
                "neither copy's lock says editing=0 (copy 1: {one}; copy 2: {two}); refusing to guess"
            ),
        };
        let current = self.copies[from].env.load()?;
        let same = self.copies[1 - from]
            .env
            .load()
            .is_ok_and(|other| other == current);
        Ok((current, same))
    }

    fn change(&mut self, change: Change) -> Result<()> {
        let what = self.what();
        let (before, copies_agree) = self.load().kind_context(Kind::Bootloader, &what)?;
        let mut vars = before.clone();
        self.flow
            .apply(&mut vars, change, 1)
            .kind_context(Kind::Bootloader, &what)?;
        if vars == before && copies_agree {
            return Ok(());
        }
        // As Mender's client: copy 2, then copy 1.
        for i in [1, 0] {
            self.copies[i]
                .write(&vars)
                .kind_context(Kind::Bootloader, &what)?;
        }
        Ok(())
    }
}

impl Bootloader for MenderGrubBootloader {
    fn describe(&self) -> String {
        format!("grub (Mender) {}", self.dir.display())
    }

    fn read_with(&mut self, _: &mut dyn Ticker) -> Result<BootState> {
        let what = self.what();
        let (vars, _) = self.load().kind_context(Kind::Bootloader, &what)?;
        self.flow.read(&vars).kind_context(Kind::Bootloader, &what)
    }

    fn disable_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::Disable(slot))
    }

    fn trial_with(&mut self, slot: SlotName, _tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::Trial(slot))
    }

    fn trial_tries(&self, _tries: u32) -> u32 {
        1
    }

    fn mark_good_with(&mut self, slot: SlotName, _tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::MarkGood(slot))
    }

    fn mark_bad_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::MarkBad(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootloader::grub::{GRUBENV_SIZE, serialize_grubenv};
    use crate::test_support::scratch_dir;

    fn block(vars: &[(&str, &str)]) -> Vec<u8> {
        let mut env = super::super::grub::parse_grubenv(&{
            let mut b = b"# GRUB Environment Block\n".to_vec();
            b.resize(GRUBENV_SIZE, b'#');
            b
        })
        .unwrap();
        for (k, v) in vars {
            env.set(k, v).unwrap();
        }
        serialize_grubenv(&env).unwrap()
    }

    /// Mender's layout under a fresh directory: both copies holding
    /// `vars`, both locks `editing=0`.
    fn layout(name: &str, vars: &[(&str, &str)]) -> PathBuf {
        let dir = scratch_dir("mender-grubenv", name);
        for n in [1, 2] {
            let d = dir.join(format!("mender_grubenv{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("env"), block(vars)).unwrap();
            std::fs::write(d.join("lock"), block(&[("editing", "0")])).unwrap();
        }
        dir
    }

    fn vars_of(dir: &Path, n: u32) -> Vec<String> {
        let bytes = std::fs::read(dir.join(format!("mender_grubenv{n}/env"))).unwrap();
        let env = super::super::grub::parse_grubenv(&bytes).unwrap();
        ["mender_boot_part", "upgrade_available", "bootcount"]
            .iter()
            .map(|v| String::from_utf8_lossy(&env.get(v).unwrap_or_default()).into_owned())
            .collect()
    }

    const RUNNING_2: &[(&str, &str)] = &[
        ("mender_boot_part", "2"),
        ("upgrade_available", "0"),
        ("bootcount", "0"),
        ("mender_systemd_machine_id", "0123"),
    ];

    #[test]
    fn a_trial_and_its_commit_are_written_to_both_copies_and_locks_end_unlocked() {
        let dir = layout("cycle", RUNNING_2);
        let lock_before = std::fs::read(dir.join("mender_grubenv1/lock")).unwrap();
        let mut bl = MenderGrubBootloader::new(dir.clone(), [2, 3]).unwrap();
        bl.disable(SlotName::B).unwrap();
        bl.trial(SlotName::B, 3).unwrap();
        for n in [1, 2] {
            assert_eq!(vars_of(&dir, n), ["3", "1", "0"]);
            assert_eq!(
                std::fs::read(dir.join(format!("mender_grubenv{n}/lock"))).unwrap(),
                lock_before,
                "the lock ends as it began, so its checksum still holds"
            );
        }
        assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::B));
        bl.mark_good(SlotName::B, 3).unwrap();
        assert_eq!(vars_of(&dir, 1), ["3", "0", "0"]);
        assert_eq!(vars_of(&dir, 2), ["3", "0", "0"]);
        let env = std::fs::read(dir.join("mender_grubenv1/env")).unwrap();
        assert!(
            String::from_utf8_lossy(&env).contains("mender_systemd_machine_id=0123"),
            "a variable updraft does not own is kept"
        );
    }

    #[test]
    fn a_copy_left_half_written_is_not_read_and_is_rewritten() {
        let dir = layout("half", RUNNING_2);
        // A cut while copy 1 was written: its lock says editing=1 and its
        // variables are garbage; copy 2 holds the truth.
        std::fs::write(dir.join("mender_grubenv1/lock"), block(&[("editing", "1")])).unwrap();
        std::fs::write(
            dir.join("mender_grubenv1/env"),
            block(&[("mender_boot_part", "9")]),
        )
        .unwrap();
        let mut bl = MenderGrubBootloader::new(dir.clone(), [2, 3]).unwrap();
        assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::A));
        bl.mark_good(SlotName::A, 3).unwrap();
        assert_eq!(vars_of(&dir, 1), ["2", "0", "0"]);
        let lock = std::fs::read(dir.join("mender_grubenv1/lock")).unwrap();
        assert_eq!(lock, block(&[("editing", "0")]));
    }

    #[test]
    fn a_lock_that_does_not_parse_makes_its_copy_the_one_not_read() {
        let dir = layout("torn", RUNNING_2);
        std::fs::write(dir.join("mender_grubenv2/lock"), b"\x00garbage").unwrap();
        std::fs::write(
            dir.join("mender_grubenv2/env"),
            block(&[("mender_boot_part", "3")]),
        )
        .unwrap();
        let mut bl = MenderGrubBootloader::new(dir.clone(), [2, 3]).unwrap();
        assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::A));
        // Writing rewrites the broken lock in place only if it parses; it
        // does not, so the write is refused and copy 1 stays as it was.
        assert!(bl.trial(SlotName::B, 1).is_err());
        assert_eq!(vars_of(&dir, 1), ["2", "0", "0"]);
    }

    #[test]
    fn both_copies_mid_write_or_missing_files_are_refused_and_left_alone() {
        let dir = layout("both", RUNNING_2);
        for n in [1, 2] {
            std::fs::write(
                dir.join(format!("mender_grubenv{n}/lock")),
                block(&[("editing", "1")]),
            )
            .unwrap();
        }
        let mut bl = MenderGrubBootloader::new(dir.clone(), [2, 3]).unwrap();
        let e = bl.trial(SlotName::B, 1).unwrap_err().to_string();
        assert!(e.contains("neither copy's lock says editing=0"), "{e}");
        assert_eq!(vars_of(&dir, 2), ["2", "0", "0"]);
        let empty = scratch_dir("mender-grubenv", "missing");
        let e = MenderGrubBootloader::new(empty.clone(), [2, 3])
            .unwrap()
            .read()
            .unwrap_err()
            .to_string();
        assert!(e.contains("mender_grubenv1"), "{e}");
        assert!(
            !empty.join("mender_grubenv1").exists(),
            "nothing is created"
        );
    }
}
