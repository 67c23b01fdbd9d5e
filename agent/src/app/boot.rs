//! A slot's boot files: the `boot` component's tree (kernel, device
//! trees, firmware, `config.txt`) written into the directory the device
//! configures for the slot being installed
//! ([docs/components.md](../../docs/components.md)).
//!
//! Boot files are not switched on their own: the bootloader reads slot
//! A's directory when it boots slot A, so the slot's switch is theirs and
//! the slot's rollback leaves the booted slot's files as they were. That
//! is why this module only ever writes the directory of the slot that is
//! *not* booted, and why it may empty it first: that slot is out of the
//! boot order while it is written, and a write a power cut interrupts is
//! done again, whole, by the next attempt.
//!
//! The directory is often the mount point of a FAT partition, so the
//! tree is written in [`Style::BootFiles`]: no links, no modes, and an
//! index holding a symbolic link is refused before anything is removed.
//! Files the booted slot's directory holds with the listed size and hash
//! are copied from it instead of fetched.
//!
//! This module never touches the booted slot's directory, never follows
//! a link out of the slot's, never descends into another file system
//! mounted below it, and never changes the boot order.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::generation::sync_dir;
use super::index::{Entry, Index};
use super::tree::{self, Blobs, Style, Written};
use crate::error::{Context, Result};
use crate::{bail, err};

/// Refuse an index that boot files cannot hold, naming the first entry
/// that is a symbolic link.
pub fn check(index: &Index) -> Result<()> {
    match index
        .entries
        .iter()
        .find(|e| matches!(e, Entry::Symlink { .. }))
    {
        Some(e) => bail!(
            Malformed,
            "boot files are plain files and directories (a FAT partition holds no links): {} is a symbolic link",
            e.path()
        ),
        None => Ok(()),
    }
}

/// Write `index` as the boot files in `target` (the slot being installed),
/// copying from `booted` (the booted slot's) what it holds unchanged.
/// `target` is created when only its last segment is missing, and emptied
/// first.
pub fn install(
    target: &Path,
    booted: &Path,
    index: &Index,
    blobs: &mut dyn Blobs,
) -> Result<Written> {
    check(index)?;
    if !target.is_dir() {
        std::fs::create_dir(target).with_context(|| {
            format!(
                "creating {} (its parent must exist: a missing mount point is not made)",
                target.display()
            )
        })?;
        if let Some(parent) = target.parent() {
            sync_dir(parent)?;
        }
    }
    let meta = std::fs::metadata(target).with_context(|| format!("{}", target.display()))?;
    if let Ok(b) = std::fs::metadata(booted) {
        if (b.dev(), b.ino()) == (meta.dev(), meta.ino()) {
            bail!(
                Slot,
                "{} is the booted slot's boot directory {}: refusing to write it",
                target.display(),
                booted.display()
            );
        }
    }
    empty(target, meta.dev())?;
    tree::write(target, index, &[booted], blobs, Style::BootFiles)
}

/// Remove everything in `dir` (on device `dev`), never following a link;
/// a file system mounted below it is refused, not emptied.
fn empty(dir: &Path, dev: u64) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let path = entry.path();
        let meta =
            std::fs::symlink_metadata(&path).with_context(|| format!("{}", path.display()))?;
        if meta.is_dir() {
            if meta.dev() != dev {
                bail!(
                    Slot,
                    "{} is another file system mounted in the boot directory {}: refusing to empty it",
                    path.display(),
                    dir.display()
                );
            }
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .map_err(|e| err!(Io, "removing {}: {e}", path.display()))?;
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::Sha256;
    use crate::test_support::{Memory, scratch_dir};

    /// Boot files `files` (path, contents) below `overlays/` where the
    /// path has a slash, their blobs in `mem`.
    fn boot_tree(mem: &mut Memory, files: &[(&str, &[u8])]) -> Index {
        let mut entries = vec![Entry::Dir {
            path: "overlays".into(),
        }];
        for (path, bytes) in files {
            let sha256 = Sha256::of(bytes);
            mem.blobs.insert(sha256, bytes.to_vec());
            entries.push(Entry::File {
                path: path.to_string(),
                executable: false,
                size: bytes.len() as u64,
                sha256,
            });
        }
        entries.sort_by(|a, b| a.path().cmp(b.path()));
        let bytes = files.iter().map(|f| f.1.len() as u64).sum();
        Index { entries, bytes }
    }

    #[test]
    fn the_slots_directory_holds_exactly_the_listed_files_unchanged_ones_copied() {
        let root = scratch_dir("boot", "write");
        let (a, b) = (root.join("slot-a"), root.join("slot-b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(b.join("stale-dir")).unwrap();
        std::fs::write(a.join("kernel8.img"), b"kernel 1").unwrap();
        std::fs::write(a.join("config.txt"), b"arm_64bit=1\n").unwrap();
        std::fs::write(b.join("stale"), b"from the release before").unwrap();
        let mut mem = Memory::default();
        let index = boot_tree(
            &mut mem,
            &[
                ("config.txt", b"arm_64bit=1\n"),
                ("kernel8.img", b"kernel 2"),
                ("overlays/uart.dtbo", b"dtbo"),
            ],
        );
        let w = install(&b, &a, &index, &mut mem).unwrap();
        assert_eq!((w.reused, w.fetched), (1, 2));
        assert_eq!(std::fs::read(b.join("kernel8.img")).unwrap(), b"kernel 2");
        assert_eq!(
            std::fs::read(b.join("config.txt")).unwrap(),
            b"arm_64bit=1\n"
        );
        assert_eq!(
            std::fs::read(b.join("overlays/uart.dtbo")).unwrap(),
            b"dtbo"
        );
        assert!(!b.join("stale").exists() && !b.join("stale-dir").exists());
        assert!(!mem.opened.contains(&Sha256::of(b"arm_64bit=1\n")));
        // The booted slot's files are as they were.
        assert_eq!(std::fs::read(a.join("kernel8.img")).unwrap(), b"kernel 1");
    }

    #[test]
    fn a_booted_file_that_is_not_what_is_listed_is_fetched_not_copied() {
        let root = scratch_dir("boot", "changed");
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::write(a.join("config.txt"), b"arm_64bit=0\n").unwrap();
        let mut mem = Memory::default();
        let index = boot_tree(&mut mem, &[("config.txt", b"arm_64bit=1\n")]);
        let w = install(&b, &a, &index, &mut mem).unwrap();
        assert_eq!((w.reused, w.fetched), (0, 1));
        assert_eq!(
            std::fs::read(b.join("config.txt")).unwrap(),
            b"arm_64bit=1\n"
        );
    }

    #[test]
    fn a_symlink_is_refused_before_the_slots_directory_is_emptied() {
        let root = scratch_dir("boot", "link");
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("kept"), b"x").unwrap();
        let mut mem = Memory::default();
        let mut index = boot_tree(&mut mem, &[("config.txt", b"x")]);
        index.entries.push(Entry::Symlink {
            path: "zImage".into(),
            target: "config.txt".into(),
        });
        let e = install(&b, &a, &index, &mut mem).unwrap_err().to_string();
        assert!(e.contains("zImage is a symbolic link"), "{e}");
        assert!(b.join("kept").exists());
    }

    #[test]
    fn the_booted_slots_directory_is_never_written_even_through_a_link() {
        let root = scratch_dir("boot", "same");
        let a = root.join("a");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::write(a.join("kernel"), b"running").unwrap();
        std::os::unix::fs::symlink(&a, root.join("b")).unwrap();
        let mut mem = Memory::default();
        let index = boot_tree(&mut mem, &[("kernel", b"new")]);
        let e = install(&root.join("b"), &a, &index, &mut mem)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is the booted slot's boot directory"), "{e}");
        assert_eq!(std::fs::read(a.join("kernel")).unwrap(), b"running");
    }

    #[test]
    fn a_blob_that_lies_fails_the_write_naming_the_file() {
        let root = scratch_dir("boot", "lie");
        let (a, b) = (root.join("a"), root.join("b"));
        let mut mem = Memory::default();
        let index = boot_tree(&mut mem, &[("start4.elf", b"firmware")]);
        mem.lie
            .insert(Sha256::of(b"firmware"), b"evilware".to_vec());
        let e = install(&b, &a, &index, &mut mem).unwrap_err().to_string();
        assert!(e.contains("start4.elf") && e.contains("hashes to"), "{e}");
    }
}
