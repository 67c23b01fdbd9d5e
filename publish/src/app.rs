//! Publishing an application tree: the index a device checks and the
//! content-addressed blobs it fetches ([docs/components.md](../../docs/components.md)).
//!
//! A directory on the build host becomes an index (one JSON line per path,
//! [`updraft::app::index`]'s format, written by its own code) and one blob
//! per distinct file content, `<blobs>/<sha256>.zst`: one zstd frame with
//! its content size and a window of at most 8 MiB, so a device decodes it
//! streaming with a bounded window. A blob already present is not written
//! again, so releases of the same application share every unchanged file.
//!
//! The publisher refuses what a device refuses, naming the path: device
//! nodes, FIFOs and sockets; setuid, setgid and sticky bits; symlinks that
//! leave the tree. Modes are normalised to what the index can say: `755`
//! for a file any execute bit is set on and for directories, `644` for the
//! other files. The index is parsed back with the device's own parser
//! before anything is reported done.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use updraft::app::index::{Entry, Index, Limits};
use updraft::artifact::VerifiedFrames;
use updraft::hash::{Hasher, Sha256};
use updraft::manifest::MAX_WINDOW_LOG;
use updraft::manifest::component::TreePart;

use crate::keys::Result;
use crate::release::hash_file;

/// A published tree.
#[derive(Debug)]
pub struct Tree {
    pub index: Index,
    /// The index as written (the bytes a device hashes).
    pub lines: Vec<u8>,
    /// Blobs written now, and their compressed bytes.
    pub blobs_written: u64,
    pub blob_bytes_written: u64,
}

/// Every path below `root`, relative, `/`-separated, unsorted.
fn walk(root: &Path) -> Result<Vec<(String, PathBuf, std::fs::Metadata)>> {
    let mut out = Vec::new();
    let mut todo = vec![(String::new(), root.to_path_buf())];
    while let Some((rel, dir)) = todo.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(format!(
                    "{}: a file name that is not UTF-8",
                    entry.path().display()
                ));
            };
            let path = if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            };
            let meta = std::fs::symlink_metadata(entry.path())
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
            if meta.is_dir() {
                todo.push((path.clone(), entry.path()));
            }
            out.push((path, entry.path(), meta));
        }
    }
    Ok(out)
}

/// Compress the file at `src` into the blob `dest` (one frame, content
/// size recorded, window at most 8 MiB), through a temporary file.
fn write_blob(src: &Path, dest: &Path, level: i32) -> Result<u64> {
    use zstd::zstd_safe::CParameter;
    let tmp = dest.with_extension(format!("tmp.{}", std::process::id()));
    let out = File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let size = std::fs::metadata(src)
        .map_err(|e| format!("{}: {e}", src.display()))?
        .len();
    let mut enc =
        zstd::stream::write::Encoder::new(out, level).map_err(|e| format!("zstd: {e}"))?;
    for p in [
        CParameter::WindowLog(MAX_WINDOW_LOG),
        CParameter::ContentSizeFlag(true),
        CParameter::ChecksumFlag(false),
    ] {
        enc.set_parameter(p)
            .map_err(|e| format!("zstd parameter: {e}"))?;
    }
    enc.set_pledged_src_size(Some(size))
        .map_err(|e| format!("zstd: {e}"))?;
    let mut input = File::open(src).map_err(|e| format!("opening {}: {e}", src.display()))?;
    std::io::copy(&mut input, &mut enc)
        .map_err(|e| format!("compressing {}: {e}", src.display()))?;
    let mut out = enc.finish().map_err(|e| format!("zstd: {e}"))?;
    out.flush()
        .and_then(|_| out.sync_all())
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    let written = out
        .metadata()
        .map_err(|e| format!("{}: {e}", tmp.display()))?
        .len();
    std::fs::rename(&tmp, dest).map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
    Ok(written)
}

/// Publish the tree at `src`: its index, and its blobs into `blobs`
/// (created if needed; blobs already there are kept).
pub fn publish_tree(src: &Path, blobs: &Path, level: i32) -> Result<Tree> {
    if !src.is_dir() {
        return Err(format!("{} is not a directory", src.display()));
    }
    std::fs::create_dir_all(blobs).map_err(|e| format!("creating {}: {e}", blobs.display()))?;
    let mut found = walk(src)?;
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut entries = Vec::with_capacity(found.len());
    let (mut written, mut written_bytes, mut total) = (0u64, 0u64, 0u64);
    for (path, full, meta) in found {
        let mode = meta.permissions().mode();
        if mode & 0o7000 != 0 {
            return Err(format!(
                "{}: mode {:o} has a setuid, setgid or sticky bit, which an app tree never has",
                full.display(),
                mode & 0o7777
            ));
        }
        let ft = meta.file_type();
        let entry = if ft.is_dir() {
            Entry::Dir { path }
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&full)
                .map_err(|e| format!("reading {}: {e}", full.display()))?;
            let Some(target) = target.to_str() else {
                return Err(format!(
                    "{}: a link target that is not UTF-8",
                    full.display()
                ));
            };
            Entry::Symlink {
                path,
                target: target.to_string(),
            }
        } else if ft.is_file() {
            let (size, sha256) = hash_file(&full)?;
            if size != meta.size() {
                return Err(format!("{} changed while it was read", full.display()));
            }
            let blob = blobs.join(format!("{}.zst", sha256.to_hex()));
            if !blob.exists() {
                written_bytes += write_blob(&full, &blob, level)?;
                written += 1;
            }
            total += size;
            Entry::File {
                path,
                executable: mode & 0o111 != 0,
                size,
                sha256,
            }
        } else {
            return Err(format!(
                "{}: a device node, FIFO or socket, which an app tree never holds",
                full.display()
            ));
        };
        entries.push(entry);
    }
    let index = Index {
        entries,
        bytes: total,
    };
    let lines = index.to_lines().into_bytes();
    // The device's own rules, on the bytes it will read.
    let limits = Limits {
        entries: index.entries.len() as u64,
        bytes: total,
    };
    let checked = Index::parse(&lines, limits).map_err(|e| format!("{}: {e}", src.display()))?;
    if checked != index {
        return Err(format!(
            "{}: the index does not read back as written",
            src.display()
        ));
    }
    Ok(Tree {
        index,
        lines,
        blobs_written: written,
        blob_bytes_written: written_bytes,
    })
}

/// The signed index of a published app, read from the release directory
/// `dir` with every frame checked against the manifest, and parsed by the
/// device's own rules.
pub fn read_index(dir: &Path, app: &TreePart, what: &str) -> Result<Index> {
    let path = dir.join(&app.index.url);
    let f = File::open(&path).map_err(|e| format!("{what}: opening {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut VerifiedFrames::new(Box::new(f), &app.index, what).map_err(|e| e.to_string())?,
        &mut bytes,
    )
    .map_err(|e| format!("{what}: reading its index {}: {e}", path.display()))?;
    let limits = Limits {
        entries: app.tree.entries,
        bytes: app.tree.bytes,
    };
    Index::parse(&bytes, limits).map_err(|e| format!("{what}: {e}"))
}

/// Decode the blob of the file `path` (`size` bytes, `sha256`) of a
/// published app into `out`, streaming with the device's window limit,
/// and check that it is the file the index lists.
pub fn decode_blob(
    dir: &Path,
    app: &TreePart,
    (path, size, sha256): (&str, u64, &Sha256),
    what: &str,
    out: &mut dyn Write,
) -> Result<()> {
    let blob = dir.join(format!("{}{}.zst", app.blobs, sha256.to_hex()));
    let file = File::open(&blob)
        .map_err(|e| format!("{what}: {path}: opening {}: {e}", blob.display()))?;
    let mut dec = zstd::stream::read::Decoder::new(file)
        .and_then(|mut d| d.window_log_max(MAX_WINDOW_LOG).map(|_| d))
        .map_err(|e| format!("{what}: {path}: {e}"))?;
    let mut h = Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let k = std::io::Read::read(&mut dec, &mut buf)
            .map_err(|e| format!("{what}: {path}: {}: {e}", blob.display()))?;
        if k == 0 {
            break;
        }
        n += k as u64;
        h.update(&buf[..k]);
        out.write_all(&buf[..k])
            .map_err(|e| format!("{what}: {path}: writing: {e}"))?;
    }
    if n != size || h.finish() != *sha256 {
        return Err(format!(
            "{what}: {path}: {} does not decode to the {size} listed bytes of sha256 {}",
            blob.display(),
            sha256.short()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("updraft-publish-app-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_tree_becomes_an_index_the_device_reads_and_blobs_shared_across_releases() {
        let d = scratch("tree");
        let src = d.join("src");
        std::fs::create_dir_all(src.join("bin")).unwrap();
        std::fs::write(src.join("bin/web"), b"web").unwrap();
        std::fs::set_permissions(src.join("bin/web"), std::fs::Permissions::from_mode(0o750))
            .unwrap();
        std::fs::write(src.join("conf"), b"port=80").unwrap();
        std::fs::write(src.join("conf.bak"), b"port=80").unwrap();
        std::os::unix::fs::symlink("bin/web", src.join("run")).unwrap();
        let t = publish_tree(&src, &d.join("blobs"), 3).unwrap();
        let paths: Vec<&str> = t.index.entries.iter().map(Entry::path).collect();
        assert_eq!(paths, ["bin", "bin/web", "conf", "conf.bak", "run"]);
        assert!(matches!(
            t.index.entries[1],
            Entry::File {
                executable: true,
                ..
            }
        ));
        // Two files with one content share one blob.
        assert_eq!(t.blobs_written, 2);
        let again = publish_tree(&src, &d.join("blobs"), 3).unwrap();
        assert_eq!((again.blobs_written, again.lines), (0, t.lines));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn what_a_device_refuses_is_refused_here_naming_the_path() {
        let d = scratch("refused");
        let src = d.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", src.join("escape")).unwrap();
        let e = publish_tree(&src, &d.join("blobs"), 3).unwrap_err();
        assert!(
            e.contains("outside the tree") && e.contains("escape"),
            "{e}"
        );
        std::fs::remove_file(src.join("escape")).unwrap();
        std::fs::write(src.join("suid"), b"x").unwrap();
        std::fs::set_permissions(src.join("suid"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        let e = publish_tree(&src, &d.join("blobs"), 3).unwrap_err();
        assert!(e.contains("suid") && e.contains("setuid"), "{e}");
        std::fs::remove_file(src.join("suid")).unwrap();
        nix_mkfifo(&src.join("pipe"));
        let e = publish_tree(&src, &d.join("blobs"), 3).unwrap_err();
        assert!(e.contains("pipe") && e.contains("FIFO"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    fn nix_mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }
}
