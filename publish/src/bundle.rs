//! `updraft-publish bundle`: a published release directory as one file.
//!
//! The bundle is a cpio "newc" archive whose entries follow the fixed order
//! the device's walker insists on (`updraft::bundle`): an SWUpdate-style
//! `sw-description` (so fleet servers that index such files accept it),
//! the signed `manifest.json`, every key document in `keys/`, then every
//! delta the manifest names and the framed image (small entries first, so
//! a device reading the bundle by Range requests finds most headers in its
//! first answer), then the trailer, padded to a 512-byte block as cpio
//! writes it.
//!
//! An artifact larger than the part size (at most what a newc entry holds,
//! 4 GiB − 1) is split into parts named `<url>`, `<url>.part-2`, … : the
//! image at zstd frame boundaries (every part holds whole frames), a delta
//! anywhere. The manifest is not changed: its signed sizes, hashes and
//! frame table cover the artifact as the parts put together.
//!
//! A release of components carries every component's artifact (a
//! command's payload, an app's index) and, for each app, its *pack*
//! (`updraft::app::pack`): the app's distinct files, decoded from their
//! blobs and checked against the signed index, one after the other in the
//! index's order, an entry that is split like an image when it is larger
//! than a part.
//!
//! This module copies bytes; it signs nothing and changes nothing in the
//! directory. It refuses a manifest that names an artifact by an absolute
//! URL (a bundle carries its artifacts), an artifact whose file differs
//! in size from the signed size, or a blob that is not the file its
//! app's index lists.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use updraft::app::pack::{self, Layout};
use updraft::bundle::{
    MANIFEST, MAX_ENTRIES, MAX_ENTRY_SIZE, MAX_NAME, SW_DESCRIPTION, TRAILER, continuation,
    data_padding, header, part_name,
};
use updraft::envelope::Envelope;
use updraft::manifest::component::TreePart;
use updraft::manifest::{Frame, Manifest};

use crate::keys::Result;

/// The default part size: the most a newc entry holds (4 GiB − 1).
pub const DEFAULT_PART_SIZE: u64 = MAX_ENTRY_SIZE;

/// What a bundle holds, for the command's summary.
pub struct Summary {
    pub version: String,
    pub entries: usize,
    pub bytes: u64,
    /// The artifacts stored in more than one part, and their part counts.
    pub split: Vec<(String, usize)>,
}

/// One entry to write: its name, and the bytes `offset .. offset + len`
/// of the file `path`.
struct Piece {
    name: String,
    path: PathBuf,
    offset: u64,
    len: u64,
}

/// The `sw-description` of a release: SWUpdate's syntax, read by servers
/// that index bundles (version and hardware compatibility). Not signed:
/// the device never reads it.
pub fn sw_description(m: &Manifest) -> String {
    let quoted = |s: &str| format!("\"{}\"", s.replace(['"', '\\'], "_"));
    let hw = m
        .release
        .compatible
        .iter()
        .map(|c| quoted(c))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "software =\n{{\n\tversion = {};\n\tdescription = {};\n\thardware-compatibility: [ {hw} ];\n}};\n",
        quoted(&m.release.version),
        quoted(&format!(
            "updraft release {} (manifest serial {})",
            m.release.version, m.serial
        )),
    )
}

/// Write the release in `dir` (its `manifest.json`, `keys/`, artifacts)
/// to the bundle `out`, splitting an artifact larger than `part_size`
/// bytes (1 to [`MAX_ENTRY_SIZE`]) into parts.
pub fn bundle(dir: &Path, out: &Path, part_size: u64) -> Result<Summary> {
    if !(1..=MAX_ENTRY_SIZE).contains(&part_size) {
        return Err(format!(
            "the part size {part_size} is not between 1 and {MAX_ENTRY_SIZE} bytes (what a cpio \
             newc entry holds)"
        ));
    }
    let (raw, m) = read_manifest(dir)?;
    let mut pieces: Vec<Piece> = Vec::new();
    for (n, path) in key_documents(dir)? {
        let len = file_len(&path)?;
        pieces.push(Piece {
            name: format!("keys/{n}.json"),
            path,
            offset: 0,
            len,
        });
    }
    let mut artifacts: Vec<(String, u64, Option<&[Frame]>, PathBuf)> = m
        .deltas
        .iter()
        .map(|d| (d.url.clone(), d.size, None, dir.join(&d.url)))
        .collect();
    // The attestation first: small, and a device requiring it reads it
    // before any artifact.
    if let Some(a) = &m.attestation {
        artifacts.insert(0, (a.url.clone(), a.size, None, dir.join(&a.url)));
    }
    artifacts.push((
        m.artifact.url.clone(),
        m.artifact.size,
        Some(m.artifact.frames.as_slice()),
        dir.join(&m.artifact.url),
    ));
    // Every other component's artifact, and a tree's files (an app's, the
    // boot files) as its pack.
    let mut packs = Packs(Vec::new());
    for c in &m.components {
        let a = c.artifact();
        artifacts.push((
            a.url.clone(),
            a.size,
            Some(a.frames.as_slice()),
            dir.join(&a.url),
        ));
        if let Some(app) = c.tree() {
            let path = out.with_extension(format!("{}.pack.{}", c.name, std::process::id()));
            packs.0.push(path.clone());
            let size = write_pack(dir, &c.name, app, &path)?;
            artifacts.push((pack::name(&app.index), size, None, path));
        }
    }
    let mut split = Vec::new();
    for (url, size, frames, path) in artifacts {
        let url = url.as_str();
        if url.contains("://") || !url.starts_with("artifacts/") {
            return Err(format!(
                "the manifest names {url}; a bundle carries its artifacts, so every url must be \
                 a path under artifacts/ in {}",
                dir.display()
            ));
        }
        if !matches!(continuation(url), Ok(None)) {
            return Err(format!(
                "the manifest names {url}, which ends like the name of an artifact's part \
                 (.part-N) in a bundle: it cannot be bundled"
            ));
        }
        let len = file_len(&path)?;
        if len != size {
            return Err(format!(
                "{} is {len} bytes but the manifest signs {size}",
                path.display()
            ));
        }
        let cuts = cuts(size, part_size, frames).map_err(|e| format!("{url}: {e}"))?;
        if cuts.len() > 1 {
            split.push((url.to_string(), cuts.len()));
        }
        for (i, (offset, len)) in cuts.into_iter().enumerate() {
            let name = part_name(url, i + 1);
            if name.len() > MAX_NAME {
                return Err(format!(
                    "the bundle entry name {name} is longer than {MAX_NAME} bytes"
                ));
            }
            pieces.push(Piece {
                name,
                path: path.clone(),
                offset,
                len,
            });
        }
    }
    if pieces.len() + 2 > MAX_ENTRIES {
        return Err(format!(
            "the bundle would hold {} entries, more than a device accepts ({MAX_ENTRIES}): \
             raise --part-size",
            pieces.len() + 2
        ));
    }

    let tmp = out.with_extension(format!("partial.{}", std::process::id()));
    let result = write(&tmp, &sw_description(&m), &raw, &pieces);
    let bytes = match result {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
    Ok(Summary {
        version: m.release.version.clone(),
        entries: pieces.len() + 2,
        bytes,
        split,
    })
}

/// `dir/manifest.json` as written, and the release it names (its
/// signatures are not checked here: `verify` does that, and the device
/// does).
pub(crate) fn read_manifest(dir: &Path) -> Result<(Vec<u8>, Manifest)> {
    let manifest_path = dir.join(MANIFEST);
    let raw = std::fs::read(&manifest_path)
        .map_err(|e| format!("reading {}: {e}", manifest_path.display()))?;
    let env = Envelope::parse(&raw, "manifest").map_err(|e| e.to_string())?;
    let payload = env.payload_bytes("manifest").map_err(|e| e.to_string())?;
    let m = Manifest::parse(&payload).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    Ok((raw, m))
}

/// The temporary pack files of a bundle being written, removed when it is
/// done, whatever the outcome.
struct Packs(Vec<PathBuf>);

impl Drop for Packs {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Write the pack of app `name` (`updraft::app::pack`) to `path`: every
/// distinct file of its signed index, decoded from its blob in `dir` and
/// checked against the index's hash, in the index's order. Its length.
pub(crate) fn write_pack(dir: &Path, name: &str, app: &TreePart, path: &Path) -> Result<u64> {
    let what = format!("app {name}");
    let index = crate::app::read_index(dir, app, &what)?;
    let layout = Layout::of(&index).map_err(|e| format!("{what}: {e}"))?;
    let out = File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let mut w = BufWriter::new(out);
    // Each distinct content once, in the order the index first lists it:
    // the files in index order, a content already written skipped.
    let mut done = std::collections::HashSet::new();
    for file in index.files() {
        if done.insert(*file.2) {
            crate::app::decode_blob(dir, app, file, &what, &mut w)?;
        }
    }
    w.flush()
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(layout.total)
}

fn file_len(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len())
}

/// The parts (`offset`, `len`) an artifact of `size` bytes is stored in,
/// none larger than `part_size`: one when it fits, else cut at frame
/// boundaries when `frames` (the signed frame table, tiling the artifact)
/// is given, or every `part_size` bytes.
fn cuts(size: u64, part_size: u64, frames: Option<&[Frame]>) -> Result<Vec<(u64, u64)>> {
    if size <= part_size {
        return Ok(vec![(0, size)]);
    }
    let Some(frames) = frames else {
        let mut out = Vec::new();
        let mut at = 0;
        while at < size {
            let len = part_size.min(size - at);
            out.push((at, len));
            at += len;
        }
        return Ok(out);
    };
    let mut out = Vec::new();
    let (mut start, mut len) = (0u64, 0u64);
    for (i, f) in frames.iter().enumerate() {
        if f.offset != start + len {
            return Err(format!(
                "frame {i} starts at {}, not where the frame before it ends",
                f.offset
            ));
        }
        if f.size > part_size {
            return Err(format!(
                "frame {i} is {} bytes, more than the part size {part_size}: parts hold whole \
                 frames",
                f.size
            ));
        }
        if len + f.size > part_size {
            out.push((start, len));
            (start, len) = (f.offset, 0);
        }
        len += f.size;
    }
    if start + len != size {
        return Err(format!(
            "the frames end at {}, the artifact at {size}",
            start + len
        ));
    }
    out.push((start, len));
    Ok(out)
}

/// `keys/N.json` in `dir`, by N.
pub(crate) fn key_documents(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let keys = dir.join("keys");
    let mut out = Vec::new();
    let listing = match std::fs::read_dir(&keys) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(format!("listing {}: {e}", keys.display())),
    };
    for entry in listing {
        let entry = entry.map_err(|e| format!("listing {}: {e}", keys.display()))?;
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((n, entry.path()));
    }
    out.sort();
    Ok(out)
}

fn write(tmp: &Path, sw_description: &str, manifest: &[u8], pieces: &[Piece]) -> Result<u64> {
    let f = File::create(tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let mut w = Counted {
        inner: BufWriter::new(f),
        n: 0,
    };
    let fail = |e: std::io::Error| format!("writing {}: {e}", tmp.display());
    let mut ino = 1;
    for (name, bytes) in [
        (SW_DESCRIPTION, sw_description.as_bytes()),
        (MANIFEST, manifest),
    ] {
        w.entry(name, bytes.len() as u64, ino, &mut &bytes[..])
            .map_err(fail)?;
        ino += 1;
    }
    for p in pieces {
        let mut src =
            File::open(&p.path).map_err(|e| format!("opening {}: {e}", p.path.display()))?;
        if p.len > MAX_ENTRY_SIZE {
            return Err(format!(
                "{} is {} bytes: a cpio newc entry holds at most {MAX_ENTRY_SIZE} bytes",
                p.path.display(),
                p.len
            ));
        }
        src.seek(SeekFrom::Start(p.offset))
            .map_err(|e| format!("seeking {}: {e}", p.path.display()))?;
        w.entry(&p.name, p.len, ino, &mut src).map_err(fail)?;
        ino += 1;
    }
    w.write_all(&header(TRAILER, 0, 0)).map_err(fail)?;
    let block = (512 - w.n % 512) % 512;
    w.write_all(&vec![0u8; block as usize]).map_err(fail)?;
    let n = w.n;
    let f = w.inner.into_inner().map_err(|e| fail(e.into_error()))?;
    f.sync_all().map_err(fail)?;
    Ok(n)
}

/// A writer that counts what went through it.
struct Counted<W: Write> {
    inner: W,
    n: u64,
}

impl<W: Write> Counted<W> {
    fn entry(
        &mut self,
        name: &str,
        len: u64,
        ino: u32,
        src: &mut dyn std::io::Read,
    ) -> std::io::Result<()> {
        let size = u32::try_from(len).map_err(std::io::Error::other)?;
        self.write_all(&header(name, size, ino))?;
        let copied = std::io::copy(&mut std::io::Read::take(src, len), self)?;
        if copied != len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{name}: {copied} of {len} bytes"),
            ));
        }
        self.write_all(&[0u8; 3][..data_padding(len)])
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use updraft::hash::Sha256;

    fn frames(sizes: &[u64]) -> Vec<Frame> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&size| {
                let f = Frame {
                    offset: at,
                    size,
                    out_size: 1,
                    out_sha256: Sha256::of(b""),
                };
                at += size;
                f
            })
            .collect()
    }

    #[test]
    fn an_image_is_cut_at_frame_boundaries() {
        let f = frames(&[4, 4, 3, 5, 1]);
        assert_eq!(cuts(17, 100, Some(&f)).unwrap(), vec![(0, 17)]);
        assert_eq!(
            cuts(17, 8, Some(&f)).unwrap(),
            vec![(0, 8), (8, 8), (16, 1)]
        );
        assert_eq!(
            cuts(17, 5, Some(&f)).unwrap(),
            vec![(0, 4), (4, 4), (8, 3), (11, 5), (16, 1)]
        );
        let e = cuts(17, 4, Some(&f)).unwrap_err();
        assert!(e.contains("frame 3 is 5 bytes"), "{e}");
    }

    #[test]
    fn a_delta_is_cut_anywhere() {
        assert_eq!(cuts(10, 4, None).unwrap(), vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(cuts(8, 4, None).unwrap(), vec![(0, 4), (4, 4)]);
        assert_eq!(cuts(0, 4, None).unwrap(), vec![(0, 0)]);
    }
}
