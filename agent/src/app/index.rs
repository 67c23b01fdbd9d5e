//! The app tree index: what a new generation of an application holds, as
//! the publisher listed it (see [docs/components.md](../../docs/components.md),
//! "The app tree index").
//!
//! The index is untrusted until its hash matched the signed manifest, and
//! even then it is a publisher's statement about paths the device will
//! create as root: every rule that keeps a tree inside its directory is
//! checked here, before anything is written. A path is relative, its
//! segments are neither empty nor `.` nor `..`; entries are sorted and
//! unique; every entry's directory is listed before it; a symlink's target
//! is relative and stays inside the tree; only files, directories and
//! symlinks exist, with modes `644`/`755` (files) and `755` (directories),
//! never setuid, setgid or sticky; the counts stay within what the
//! manifest signed.
//!
//! This module parses and checks; it never touches the file system (that
//! is [`super::tree`]). [`Index::to_lines`] writes the same format for the
//! publisher, so the two sides cannot disagree.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::bail;
use crate::error::Result;
use crate::hash::Sha256;

/// The longest path an entry may have, in bytes.
pub const MAX_PATH: usize = 4096;

/// The longest segment of a path, in bytes (`NAME_MAX`).
pub const MAX_SEGMENT: usize = 255;

/// The longest index line read, in bytes.
const MAX_LINE: usize = MAX_PATH * 2 + 512;

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A regular file of `size` bytes hashing to `sha256`.
    File {
        path: String,
        executable: bool,
        size: u64,
        sha256: Sha256,
    },
    /// A directory (mode 755).
    Dir { path: String },
    /// A symbolic link to `target`, relative and inside the tree.
    Symlink { path: String, target: String },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::File { path, .. } | Entry::Dir { path } | Entry::Symlink { path, .. } => path,
        }
    }
}

/// How much a tree may hold: the manifest's `tree` statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries of any kind.
    pub entries: u64,
    /// Bytes of all files together.
    pub bytes: u64,
}

/// A checked tree listing, in path order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    pub entries: Vec<Entry>,
    /// The bytes of all files together.
    pub bytes: u64,
}

/// An index line as written.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum Line {
    File {
        path: String,
        mode: String,
        size: u64,
        sha256: Sha256,
    },
    Dir {
        path: String,
        mode: String,
    },
    Symlink {
        path: String,
        target: String,
    },
}

/// Why `path` cannot be a path of a tree, if it cannot.
fn path_problem(path: &str) -> Option<String> {
    if path.is_empty() {
        return Some("is empty".into());
    }
    if path.len() > MAX_PATH {
        return Some(format!("is longer than {MAX_PATH} bytes"));
    }
    if path.starts_with('/') {
        return Some("is absolute".into());
    }
    if path.bytes().any(|b| b == 0 || b.is_ascii_control()) {
        return Some("holds a control character".into());
    }
    for seg in path.split('/') {
        match seg {
            "" => return Some("has an empty segment".into()),
            "." | ".." => return Some(format!("has a {seg:?} segment")),
            s if s.len() > MAX_SEGMENT => {
                return Some(format!("has a segment longer than {MAX_SEGMENT} bytes"));
            }
            _ => {}
        }
    }
    None
}

/// The directory part of `path` (`""` for an entry at the top).
fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// Whether `target`, a symlink's target read from directory `dir` of the
/// tree, stays inside the tree: relative, and never climbing above the
/// top (checked segment by segment, so `a/../../x` is caught even where
/// `a` would exist).
fn target_stays_inside(dir: &str, target: &str) -> bool {
    if target.is_empty() || target.starts_with('/') || target.len() > MAX_PATH {
        return false;
    }
    if target.bytes().any(|b| b == 0 || b.is_ascii_control()) {
        return false;
    }
    let mut depth: usize = if dir.is_empty() {
        0
    } else {
        dir.split('/').count()
    };
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => depth += 1,
        }
    }
    true
}

impl Index {
    /// The regular files, in index order: path, size and hash.
    pub fn files(&self) -> impl Iterator<Item = (&str, u64, &Sha256)> {
        self.entries.iter().filter_map(|e| match e {
            Entry::File {
                path, size, sha256, ..
            } => Some((path.as_str(), *size, sha256)),
            _ => None,
        })
    }

    /// Parse and check an index (JSON lines, one entry per line, in path
    /// order) against `limits`. Every refusal names the line and the path.
    pub fn parse(bytes: &[u8], limits: Limits) -> Result<Index> {
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => bail!(
                Malformed,
                "app index: not UTF-8 at byte {}",
                e.valid_up_to()
            ),
        };
        let mut entries: Vec<Entry> = Vec::new();
        let mut dirs: HashSet<String> = HashSet::new();
        let mut total: u64 = 0;
        let mut previous: Option<String> = None;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if line.is_empty() {
                bail!(Malformed, "app index line {n}: empty line");
            }
            if line.len() > MAX_LINE {
                bail!(
                    Malformed,
                    "app index line {n}: longer than {MAX_LINE} bytes"
                );
            }
            if entries.len() as u64 >= limits.entries {
                bail!(
                    Malformed,
                    "app index line {n}: more than the {} entries the manifest signed",
                    limits.entries
                );
            }
            let parsed: Line = match serde_json::from_str(line) {
                Ok(l) => l,
                Err(e) => bail!(Malformed, "app index line {n}: {e}"),
            };
            let path = match &parsed {
                Line::File { path, .. } | Line::Dir { path, .. } | Line::Symlink { path, .. } => {
                    path.as_str()
                }
            };
            if let Some(why) = path_problem(path) {
                bail!(Malformed, "app index line {n}: path {path:?} {why}");
            }
            if let Some(p) = previous.as_deref() {
                if path <= p {
                    bail!(
                        Malformed,
                        "app index line {n}: path {path:?} is listed twice or out of order (after {p:?})"
                    );
                }
            }
            let dir = parent(path).to_owned();
            if !dir.is_empty() && !dirs.contains(&dir) {
                bail!(
                    Malformed,
                    "app index line {n}: path {path:?} is in {dir:?}, which is not a directory listed before it"
                );
            }
            let entry = match parsed {
                Line::File {
                    path,
                    mode,
                    size,
                    sha256,
                } => {
                    let executable = match mode.as_str() {
                        "644" => false,
                        "755" => true,
                        m => bail!(
                            Malformed,
                            "app index line {n}: file {path:?} has mode {m:?}; files are \"644\" or \"755\" (no setuid, setgid or sticky bits)"
                        ),
                    };
                    total = match total.checked_add(size) {
                        Some(t) if t <= limits.bytes => t,
                        _ => bail!(
                            Malformed,
                            "app index line {n}: file {path:?} takes the tree past the {} bytes the manifest signed",
                            limits.bytes
                        ),
                    };
                    Entry::File {
                        path,
                        executable,
                        size,
                        sha256,
                    }
                }
                Line::Dir { path, mode } => {
                    if mode != "755" {
                        bail!(
                            Malformed,
                            "app index line {n}: directory {path:?} has mode {mode:?}; directories are \"755\""
                        );
                    }
                    Entry::Dir { path }
                }
                Line::Symlink { path, target } => {
                    if !target_stays_inside(&dir, &target) {
                        bail!(
                            Malformed,
                            "app index line {n}: symlink {path:?} points at {target:?}, outside the tree"
                        );
                    }
                    Entry::Symlink { path, target }
                }
            };
            if let Entry::Dir { path } = &entry {
                dirs.insert(path.clone());
            }
            previous = Some(entry.path().to_string());
            entries.push(entry);
        }
        Ok(Index {
            entries,
            bytes: total,
        })
    }

    /// The index in its written form, for the publisher: one line per
    /// entry, in path order, each ending in `\n`.
    pub fn to_lines(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            let line = match e {
                Entry::File {
                    path,
                    executable,
                    size,
                    sha256,
                } => Line::File {
                    path: path.clone(),
                    mode: if *executable { "755" } else { "644" }.into(),
                    size: *size,
                    sha256: *sha256,
                },
                Entry::Dir { path } => Line::Dir {
                    path: path.clone(),
                    mode: "755".into(),
                },
                Entry::Symlink { path, target } => Line::Symlink {
                    path: path.clone(),
                    target: target.clone(),
                },
            };
            // A line of strings and integers always serialises.
            if let Ok(json) = serde_json::to_string(&line) {
                out.push_str(&json);
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        entries: 100,
        bytes: 1 << 20,
    };

    fn sha() -> String {
        Sha256::of(b"x").to_hex()
    }

    fn file(path: &str, mode: &str, size: u64) -> String {
        format!(
            r#"{{"type":"file","path":{path:?},"mode":"{mode}","size":{size},"sha256":"{}"}}"#,
            sha()
        )
    }

    fn dir(path: &str) -> String {
        format!(r#"{{"type":"dir","path":{path:?},"mode":"755"}}"#)
    }

    fn link(path: &str, target: &str) -> String {
        format!(r#"{{"type":"symlink","path":{path:?},"target":{target:?}}}"#)
    }

    fn parse(lines: &[String]) -> Result<Index> {
        Index::parse(format!("{}\n", lines.join("\n")).as_bytes(), LIMITS)
    }

    fn good() -> Vec<String> {
        vec![
            dir("bin"),
            file("bin/web", "755", 10),
            dir("lib"),
            link("lib/libweb.so", "libweb.so.3"),
            file("lib/libweb.so.3", "644", 20),
            link("share", "lib/../bin"),
        ]
    }

    #[test]
    fn a_good_tree_parses_and_writes_back_the_same_lines() {
        let idx = parse(&good()).expect("a good index");
        assert_eq!(idx.entries.len(), 6);
        assert_eq!(idx.bytes, 30);
        assert!(matches!(
            &idx.entries[1],
            Entry::File {
                executable: true,
                size: 10,
                ..
            }
        ));
        let again = Index::parse(idx.to_lines().as_bytes(), LIMITS).expect("round trip");
        assert_eq!(again, idx);
    }

    #[test]
    fn every_path_that_could_leave_the_tree_is_refused_with_its_reason() {
        // (the bad line inserted at the end, what the refusal says)
        let rows: Vec<(String, &str)> = vec![
            (file("/etc/shadow", "644", 1), "is absolute"),
            (file("z/../../etc/passwd", "644", 1), "\"..\" segment"),
            (file("z/./x", "644", 1), "\".\" segment"),
            (file("z//x", "644", 1), "empty segment"),
            (file("", "644", 1), "is empty"),
            (file("z\nx", "644", 1), "control character"),
            (
                file(&"a".repeat(MAX_SEGMENT + 1), "644", 1),
                "segment longer",
            ),
            (
                file(&"zz/".repeat(MAX_PATH / 3 + 1), "644", 1),
                "longer than",
            ),
            (link("zz", "/etc"), "outside the tree"),
            (link("zz", "../etc"), "outside the tree"),
            (link("zz", "bin/../../etc"), "outside the tree"),
            (link("zz", ""), "outside the tree"),
            (
                file("zzdir/x", "644", 1),
                "not a directory listed before it",
            ),
            (
                file("share/x", "644", 1),
                "not a directory listed before it",
            ),
            (file("zz", "4755", 1), "mode \"4755\""),
            (file("zz", "2755", 1), "mode \"2755\""),
            (file("zz", "777", 1), "mode \"777\""),
            (
                r#"{"type":"dir","path":"zz","mode":"1777"}"#.to_string(),
                "directories are",
            ),
            (
                r#"{"type":"char","path":"zz"}"#.to_string(),
                "unknown variant",
            ),
            (
                r#"{"type":"fifo","path":"zz"}"#.to_string(),
                "unknown variant",
            ),
            (
                r#"{"type":"hardlink","path":"zz","target":"bin/web"}"#.to_string(),
                "unknown variant",
            ),
            (
                format!(
                    r#"{{"type":"file","path":"zz","mode":"644","size":1,"sha256":"{}","uid":0}}"#,
                    sha()
                ),
                "unknown field",
            ),
            (file("bin/web", "644", 1), "listed twice or out of order"),
            (file("a", "644", 1), "listed twice or out of order"),
            (file("zz", "644", 2 << 20), "past the 1048576 bytes"),
            ("not json".to_string(), "line 7"),
        ];
        for (bad, says) in rows {
            let mut lines = good();
            lines.push(bad.clone());
            let e = parse(&lines).expect_err(&bad).to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.starts_with("app index line 7"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_signed_counts_bound_the_tree() {
        let lines: Vec<String> = (0..5).map(|i| file(&format!("f{i}"), "644", 1)).collect();
        let text = format!("{}\n", lines.join("\n"));
        let e = Index::parse(
            text.as_bytes(),
            Limits {
                entries: 4,
                bytes: 100,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("more than the 4 entries"), "{e}");
        let e = Index::parse(
            text.as_bytes(),
            Limits {
                entries: 10,
                bytes: 4,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("past the 4 bytes"), "{e}");
        assert!(
            Index::parse(
                text.as_bytes(),
                Limits {
                    entries: 5,
                    bytes: 5
                }
            )
            .is_ok()
        );
    }

    #[test]
    fn symlinks_may_climb_only_as_far_as_their_own_depth() {
        // (directory of the link, target) → stays inside
        let rows = [
            ("", "a", true),
            ("", "../a", false),
            ("a", "../b", true),
            ("a", "../../b", false),
            ("a/b", "../../c/./d", true),
            ("a/b", "x/../../../..", false),
            ("a", "/a", false),
            ("", "a/../..", false),
        ];
        for (dir, target, inside) in rows {
            assert_eq!(
                target_stays_inside(dir, target),
                inside,
                "{dir:?} {target:?}"
            );
        }
    }

    #[test]
    fn bytes_that_are_not_an_index_are_refused_not_panicked_on() {
        for bytes in [
            &b"\xff\xfe"[..],
            b"\n",
            b"{}",
            b"[1,2]",
            b"{\"type\":\"file\"}",
        ] {
            assert!(Index::parse(bytes, LIMITS).is_err(), "{bytes:?}");
        }
        assert_eq!(
            Index::parse(b"", LIMITS).map(|i| i.entries.len()).ok(),
            Some(0)
        );
    }

    /// The property the fuzz target `app_index` checks: an error, or an
    /// index that keeps every rule and writes back to itself.
    fn keeps_every_rule(bytes: &[u8]) -> bool {
        let Ok(index) = Index::parse(bytes, LIMITS) else {
            return false;
        };
        let mut dirs = HashSet::new();
        let mut previous: Option<&str> = None;
        for e in &index.entries {
            let path = e.path();
            assert!(path_problem(path).is_none(), "{path:?}");
            assert!(
                previous.is_none_or(|p| p < path),
                "{path:?} after {previous:?}"
            );
            if let Some((dir, _)) = path.rsplit_once('/') {
                assert!(dirs.contains(dir), "{path:?} below an unlisted directory");
            }
            match e {
                Entry::Dir { path } => {
                    dirs.insert(path.as_str());
                }
                Entry::Symlink { path, target } => {
                    assert!(
                        target_stays_inside(parent(path), target),
                        "{path:?} -> {target:?}"
                    );
                }
                Entry::File { .. } => {}
            }
            previous = Some(path);
        }
        let again = Index::parse(index.to_lines().as_bytes(), LIMITS);
        assert_eq!(again.as_ref().ok(), Some(&index), "{again:?}");
        true
    }

    #[test]
    fn hostile_bytes_are_errors_or_indexes_that_keep_every_rule() {
        use crate::test_support::{Rng, mutate};
        let seed = format!("{}\n", good().join("\n")).into_bytes();
        let mut parsed = 0;
        for n in 0..=seed.len() {
            parsed += usize::from(keeps_every_rule(&seed[..n]));
        }
        let mut rng = Rng(0x5eed_1dec);
        for _ in 0..3000 {
            let mut v = mutate(&mut rng, &seed);
            // Path characters, where they do the most harm.
            for _ in 0..rng.below(3) {
                let i = rng.below(v.len());
                if let Some(b) = v.get_mut(i) {
                    *b = [b'/', b'.', b'"', b'\\'][rng.below(4)];
                }
            }
            parsed += usize::from(keeps_every_rule(&v));
        }
        // Some inputs must get through, or the property was never checked.
        assert!(parsed > 10, "only {parsed} inputs parsed");
    }
}
