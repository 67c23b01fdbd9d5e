//! An application's generations on the data partition, and the switch
//! between them.
//!
//! ```text
//! <apps_dir>/<name>/
//! ├── gen/1/  gen/2/      generations; numbers only grow
//! ├── gen/3.partial/      one being written (never activated)
//! ├── current -> gen/2    the active generation
//! └── data/               the application's own, kept across generations
//! ```
//!
//! A generation becomes `gen/<N>` by one `rename(2)` once it is whole and
//! synced, and active by one more: a symlink `current.next` made beside
//! `current` and renamed over it, then the directory synced. A power cut
//! leaves `current` naming the old generation or the new one, never
//! nothing and never a partial tree. Activating the previous generation is
//! the same rename, which is why an app rolls back in well under a second.
//!
//! This module never decides which generation should be active, restarts
//! nothing, and never removes the active generation.

use std::path::{Path, PathBuf};

use super::index::Index;
use super::tree::{self, Blobs, Written};
use crate::error::{Context, Result};
use crate::{bail, err};

/// One application's directory.
#[derive(Debug, Clone)]
pub struct App {
    dir: PathBuf,
}

const CURRENT: &str = "current";
const CURRENT_NEXT: &str = "current.next";
const PARTIAL: &str = ".partial";

impl App {
    /// The application `name` (already checked to be a plain name) below
    /// `apps_dir`.
    pub fn new(apps_dir: &Path, name: &str) -> App {
        App {
            dir: apps_dir.join(name),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn gen_dir(&self) -> PathBuf {
        self.dir.join("gen")
    }

    /// The directory of generation `n`.
    pub fn path(&self, n: u64) -> PathBuf {
        self.gen_dir().join(n.to_string())
    }

    /// The generation directories present, in no order: each number, and
    /// whether it is partial (being written, or left by an attempt that
    /// stopped).
    fn scan(&self) -> Result<Vec<(u64, bool)>> {
        let dir = self.gen_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => bail!(Io, "reading {}: {e}", dir.display()),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let (number, partial) = match name.strip_suffix(PARTIAL) {
                Some(n) => (n, true),
                None => (name, false),
            };
            if let Ok(n) = number.parse::<u64>() {
                out.push((n, partial));
            }
        }
        Ok(out)
    }

    /// The whole generations present, oldest first.
    pub fn generations(&self) -> Result<Vec<u64>> {
        let mut out: Vec<u64> = self
            .scan()?
            .into_iter()
            .filter_map(|(n, partial)| (!partial).then_some(n))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// The active generation: what `current` names (`None`: nothing
    /// activated yet).
    pub fn active(&self) -> Result<Option<u64>> {
        let link = self.dir.join(CURRENT);
        let target = match std::fs::read_link(&link) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => bail!(Io, "reading {}: {e}", link.display()),
        };
        let n = target
            .strip_prefix("gen")
            .ok()
            .and_then(|rest| rest.to_str())
            .and_then(|s| s.parse::<u64>().ok());
        match n {
            Some(n) => Ok(Some(n)),
            None => bail!(
                Malformed,
                "{} names {}, not a generation",
                link.display(),
                target.display()
            ),
        }
    }

    /// Write generation `next` (one above every generation present, whole
    /// or partial) from `index`, reusing the active generation's files and
    /// those an interrupted attempt finished (the newest partial tree, each
    /// file checked by its hash as it is linked: a release tried again
    /// after a power cut or a failed download does not fetch them again);
    /// it is made whole by one rename, and not activated. Older partial
    /// trees are removed first, the one reused once the generation is
    /// whole.
    pub fn install(&self, index: &Index, blobs: &mut dyn Blobs) -> Result<(u64, Written)> {
        let gens = self.gen_dir();
        create_dir_durable(&self.dir.join("data"))?;
        create_dir_durable(&gens)?;
        let found = self.scan()?;
        let mut partials: Vec<u64> = found
            .iter()
            .filter(|(_, partial)| *partial)
            .map(|(n, _)| *n)
            .collect();
        partials.sort_unstable();
        let resumed = partials.pop().map(|n| gens.join(format!("{n}{PARTIAL}")));
        for n in partials {
            remove_tree(&gens.join(format!("{n}{PARTIAL}")))?;
        }
        let n = found.iter().map(|(n, _)| n + 1).max().unwrap_or(1);
        let partial = gens.join(format!("{n}{PARTIAL}"));
        let active = self.active()?.map(|a| self.path(a));
        let reuse: Vec<&Path> = active
            .iter()
            .chain(resumed.iter())
            .map(PathBuf::as_path)
            .collect();
        let written = tree::write(&partial, index, &reuse, blobs, tree::Style::Generation)?;
        let whole = self.path(n);
        std::fs::rename(&partial, &whole)
            .with_context(|| format!("renaming {} to {}", partial.display(), whole.display()))?;
        if let Some(r) = &resumed {
            remove_tree(r)?;
        }
        sync_dir(&gens)?;
        Ok((n, written))
    }

    /// Make generation `n` the active one; the generation it replaces.
    pub fn activate(&self, n: u64) -> Result<Option<u64>> {
        let whole = self.path(n);
        if !whole.is_dir() {
            bail!(Io, "{} is not a generation", whole.display());
        }
        let previous = self.active()?;
        let next = self.dir.join(CURRENT_NEXT);
        let _ = std::fs::remove_file(&next);
        std::os::unix::fs::symlink(Path::new("gen").join(n.to_string()), &next)
            .with_context(|| format!("creating {}", next.display()))?;
        let current = self.dir.join(CURRENT);
        std::fs::rename(&next, &current)
            .with_context(|| format!("renaming {} to {}", next.display(), current.display()))?;
        sync_dir(&self.dir)?;
        Ok(previous)
    }

    /// Make no generation active: `current` removed (an app installed for
    /// the first time, rolled back).
    pub fn deactivate(&self) -> Result<()> {
        let current = self.dir.join(CURRENT);
        match std::fs::remove_file(&current) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err!(Io, "removing {}: {e}", current.display())),
        }
    }

    /// Remove generation `n`, which must not be active.
    pub fn remove(&self, n: u64) -> Result<()> {
        if self.active()? == Some(n) {
            bail!(Io, "generation {n} of {} is active", self.dir.display());
        }
        let path = self.path(n);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => sync_dir(&self.gen_dir()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err!(Io, "removing {}: {e}", path.display())),
        }
    }

    /// Keep `keep` generations: the active one and the newest others;
    /// the ones removed, newest first.
    pub fn prune(&self, keep: usize) -> Result<Vec<u64>> {
        let active = self.active()?;
        let others_kept = match active {
            Some(_) => keep.saturating_sub(1),
            None => keep,
        };
        let mut others = 0usize;
        let mut removed = Vec::new();
        for n in self.generations()?.into_iter().rev() {
            if Some(n) == active {
                continue;
            }
            if others < others_kept {
                others += 1;
                continue;
            }
            self.remove(n)?;
            removed.push(n);
        }
        Ok(removed)
    }
}

/// Remove the tree `path` (a partial generation), never following a link.
fn remove_tree(path: &Path) -> Result<()> {
    std::fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
}

/// Create `dir` and any missing parent, each made durable in its parent
/// (a directory only exists after a power cut once its parent is synced).
fn create_dir_durable(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) else {
        bail!(Io, "{} has no parent directory", dir.display());
    };
    create_dir_durable(parent)?;
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => bail!(Io, "creating {}: {e}", dir.display()),
    }
    sync_dir(parent)
}

/// `fsync` a directory, so that the renames in it are durable.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use crate::app::index::{Entry, Index};
    use crate::hash::Sha256;
    use crate::test_support::{Memory, scratch_dir};

    /// A tree of `files` (path, contents, executable) with the
    /// directories they need and a symlink, its blobs in `mem`.
    fn tree(mem: &mut Memory, files: &[(&str, &[u8], bool)]) -> Index {
        let mut entries = vec![Entry::Dir { path: "bin".into() }];
        for (path, bytes, executable) in files {
            let sha256 = Sha256::of(bytes);
            mem.blobs.insert(sha256, bytes.to_vec());
            entries.push(Entry::File {
                path: path.to_string(),
                executable: *executable,
                size: bytes.len() as u64,
                sha256,
            });
        }
        entries.push(Entry::Symlink {
            path: "run".into(),
            target: "bin/web".into(),
        });
        entries.sort_by(|a, b| a.path().cmp(b.path()));
        let bytes = files.iter().map(|f| f.1.len() as u64).sum();
        Index { entries, bytes }
    }

    #[test]
    fn a_generation_is_written_whole_then_activated_and_rolled_back_by_a_rename() {
        let root = scratch_dir("app", "cycle");
        let app = App::new(&root, "web");
        let mut mem = Memory::default();
        let v1 = tree(
            &mut mem,
            &[("bin/web", b"web 1.3", true), ("conf", b"port=80", false)],
        );
        let (n1, w1) = app.install(&v1, &mut mem).unwrap();
        assert_eq!((n1, w1.fetched, w1.reused), (1, 2, 0));
        assert_eq!(app.active().unwrap(), None, "installed is not active");
        assert_eq!(app.activate(n1).unwrap(), None);
        let cur = root.join("web/current");
        assert_eq!(std::fs::read(cur.join("bin/web")).unwrap(), b"web 1.3");
        assert_eq!(
            std::fs::read_link(cur.join("run")).unwrap(),
            Path::new("bin/web")
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&cur.join("bin/web")), 0o755);
        assert_eq!(mode(&cur.join("conf")), 0o644);
        assert!(root.join("web/data").is_dir());

        // 1.4 changes one file: the other is linked, not fetched.
        mem.opened.clear();
        let v2 = tree(
            &mut mem,
            &[("bin/web", b"web 1.4", true), ("conf", b"port=80", false)],
        );
        let (n2, w2) = app.install(&v2, &mut mem).unwrap();
        assert_eq!((n2, w2.fetched, w2.reused, w2.reused_bytes), (2, 1, 1, 7));
        assert_eq!(mem.opened, vec![Sha256::of(b"web 1.4")]);
        let ino = |p: PathBuf| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(app.path(1).join("conf")), ino(app.path(2).join("conf")));
        assert_eq!(app.activate(n2).unwrap(), Some(1));
        assert_eq!(std::fs::read(cur.join("bin/web")).unwrap(), b"web 1.4");
        // Rolling back is the same switch.
        assert_eq!(app.activate(1).unwrap(), Some(2));
        assert_eq!(std::fs::read(cur.join("bin/web")).unwrap(), b"web 1.3");
        assert_eq!(app.active().unwrap(), Some(1));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_blob_that_is_not_what_the_index_lists_fails_the_generation_naming_the_file() {
        let root = scratch_dir("app", "lies");
        let app = App::new(&root, "web");
        let rows: [(&[u8], &str); 3] = [
            (b"web 1.3 and more", "more than the 7 bytes"),
            (b"web", "holds 3 bytes, not the 7"),
            (b"WEB 1.3", "hashes to"),
        ];
        for (served, says) in rows {
            let mut mem = Memory::default();
            let idx = tree(&mut mem, &[("bin/web", b"web 1.3", true)]);
            mem.lie.insert(Sha256::of(b"web 1.3"), served.to_vec());
            let e = app.install(&idx, &mut mem).unwrap_err();
            assert!(
                e.to_string().contains("bin/web") && e.to_string().contains(says),
                "{e}"
            );
            assert_eq!(e.kind(), crate::error::Kind::Integrity);
            assert_eq!(
                app.generations().unwrap(),
                Vec::<u64>::new(),
                "no whole generation"
            );
        }
        // The next attempt goes on above the partial trees, and removes
        // them once its generation is whole.
        let mut mem = Memory::default();
        let idx = tree(&mut mem, &[("bin/web", b"web 1.3", true)]);
        let (n, _) = app.install(&idx, &mut mem).unwrap();
        assert_eq!(n, 4);
        let left: Vec<String> = std::fs::read_dir(root.join("web/gen"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["4"]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn an_interrupted_install_is_resumed_without_fetching_what_it_finished() {
        let root = scratch_dir("app", "resume");
        let app = App::new(&root, "web");
        let mut mem = Memory::default();
        let files: [(&str, &[u8], bool); 3] = [
            ("bin/a", b"first file", false),
            ("bin/b", b"second file", false),
            ("bin/web", b"web 1.3", true),
        ];
        let idx = tree(&mut mem, &files);
        // The last file's blob cannot be had: the attempt fails after
        // writing the others.
        let last = mem.blobs.remove(&Sha256::of(b"web 1.3")).unwrap();
        assert!(app.install(&idx, &mut mem).is_err());
        assert_eq!(mem.opened.len(), 3);
        mem.blobs.insert(Sha256::of(b"web 1.3"), last);
        mem.opened.clear();
        let (n, w) = app.install(&idx, &mut mem).unwrap();
        assert_eq!(
            mem.opened,
            [Sha256::of(b"web 1.3")],
            "only what was not finished"
        );
        assert_eq!((w.reused, w.fetched), (2, 1));
        assert_eq!(
            std::fs::read(app.path(n).join("bin/b")).unwrap(),
            b"second file"
        );
        let left: Vec<String> = std::fs::read_dir(root.join("web/gen"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, [n.to_string()], "the partial tree is gone");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_changed_file_in_the_active_generation_is_fetched_not_linked() {
        let root = scratch_dir("app", "tampered");
        let app = App::new(&root, "web");
        let mut mem = Memory::default();
        let idx = tree(&mut mem, &[("bin/web", b"web 1.3", true)]);
        let (n, _) = app.install(&idx, &mut mem).unwrap();
        app.activate(n).unwrap();
        // Same size, other bytes: the hash through the new link differs.
        std::fs::write(app.path(n).join("bin/web"), b"WEB 1.3").unwrap();
        let (n2, w) = app.install(&idx, &mut mem).unwrap();
        assert_eq!((w.fetched, w.reused), (1, 0));
        assert_eq!(
            std::fs::read(app.path(n2).join("bin/web")).unwrap(),
            b"web 1.3"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn pruning_keeps_the_active_generation_and_the_newest_others() {
        let root = scratch_dir("app", "prune");
        let app = App::new(&root, "web");
        let mut mem = Memory::default();
        for i in 0..4u8 {
            let idx = tree(&mut mem, &[("bin/web", &[b'0' + i], true)]);
            app.install(&idx, &mut mem).unwrap();
        }
        app.activate(2).unwrap();
        assert_eq!(app.prune(2).unwrap(), vec![3, 1]);
        assert_eq!(app.generations().unwrap(), vec![2, 4]);
        assert!(app.remove(2).is_err(), "the active generation stays");
        assert_eq!(app.prune(1).unwrap(), vec![4]);
        assert_eq!(app.generations().unwrap(), vec![2]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_link_planted_in_the_active_generation_is_never_followed() {
        let root = scratch_dir("app", "planted");
        let app = App::new(&root, "web");
        let mut mem = Memory::default();
        let idx = tree(&mut mem, &[("bin/web", b"web 1.3", true)]);
        let (n, _) = app.install(&idx, &mut mem).unwrap();
        app.activate(n).unwrap();
        // Someone replaces the active generation's bin/ with a link to a
        // directory of their own holding a file of the listed size, mode
        // and hash.
        let outside = root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("web"), b"web 1.3").unwrap();
        std::fs::set_permissions(outside.join("web"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::remove_dir_all(app.path(n).join("bin")).unwrap();
        std::os::unix::fs::symlink(&outside, app.path(n).join("bin")).unwrap();
        let (n2, w) = app.install(&idx, &mut mem).unwrap();
        assert_eq!(
            (w.fetched, w.reused),
            (1, 0),
            "linked through a planted symlink"
        );
        let ino = |p: PathBuf| std::fs::symlink_metadata(p).unwrap().ino();
        assert_ne!(ino(app.path(n2).join("bin/web")), ino(outside.join("web")));
        assert!(
            std::fs::symlink_metadata(app.path(n2).join("bin"))
                .unwrap()
                .is_dir()
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
