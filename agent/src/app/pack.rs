//! An app's files inside a single-file bundle: the *pack*.
//!
//! A bundle cannot hold an app's blobs as entries of their own (a device
//! accepts at most [`crate::bundle::MAX_ENTRIES`], and a bundle read by
//! Range requests would cost one request per header), so each app of a
//! bundled release has one more entry, `artifacts/<index sha256>.pack`
//! ([`name`]): the content of every distinct file its signed index lists,
//! uncompressed, in the order the index first lists it. Where a file is
//! follows from signed values alone (the index's sizes and hashes,
//! [`Layout`]), so the bundle carries no table to trust: a pack that is
//! shorter or longer than the layout is refused when it is opened, and one
//! whose bytes are shuffled or changed fails the hash of the file read
//! from it, before the generation is switched in. The files are stored
//! uncompressed: the price of a layout that needs no unsigned offsets.
//!
//! [`PackBlobs`] reads the pack in the order the tree writer asks for files
//! (the index's), skipping the files the running generation already has:
//! it asks the source for the file it needs, and while the files asked
//! follow one another it asks for twice as much each time (up to
//! [`MAX_WINDOW`]), so a whole tree costs a few requests and one changed
//! file costs its own bytes; a gap of at most [`SKIP_READ`] bytes inside
//! what was asked is read through.
//!
//! This module never verifies a file (the tree writer hashes what it
//! reads) and never writes.

use std::collections::HashMap;
use std::io::Read;

use super::index::Index;
use super::tree::Blobs;
use crate::error::Result;
use crate::hash::Sha256;
use crate::manifest::Artifact;
use crate::source::Source;
use crate::{bail, err};

/// A gap between two files inside a range already asked that is read
/// through rather than asked for anew.
pub const SKIP_READ: u64 = 1 << 20;
/// The most asked of the source at once.
pub const MAX_WINDOW: u64 = 8 << 20;

/// The bundle entry holding the files of the app whose signed index is
/// `index`.
pub fn name(index: &Artifact) -> String {
    format!("artifacts/{}.pack", index.sha256.to_hex())
}

/// Where each distinct file of an index is in its pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The distinct files in pack order: hash, offset, size.
    pub files: Vec<(Sha256, u64, u64)>,
    at: HashMap<Sha256, usize>,
    /// The pack's length.
    pub total: u64,
}

impl Layout {
    /// The layout of `index`'s pack. An index that lists one hash with two
    /// sizes is refused (no pack can hold both).
    pub fn of(index: &Index) -> Result<Layout> {
        let mut files = Vec::new();
        let mut at = HashMap::new();
        let mut total: u64 = 0;
        for (path, size, sha256) in index.files() {
            if let Some(&i) = at.get(sha256) {
                let (_, _, known): (Sha256, u64, u64) = files[i];
                if known != size {
                    bail!(
                        Malformed,
                        "the index lists {path} as {size} bytes with the hash of a {known}-byte file"
                    );
                }
                continue;
            }
            at.insert(*sha256, files.len());
            files.push((*sha256, total, size));
            total = total
                .checked_add(size)
                .ok_or_else(|| err!(Malformed, "the index's files add up past 2^64 bytes"))?;
        }
        Ok(Layout { files, at, total })
    }

    /// The offset and size of the file hashing to `sha256`.
    pub fn find(&self, sha256: &Sha256) -> Option<(u64, u64)> {
        self.at
            .get(sha256)
            .map(|&i| (self.files[i].1, self.files[i].2))
    }
}

/// An app's files read from its pack in a bundle, counting the bytes read.
pub struct PackBlobs<'s> {
    source: &'s mut Source,
    entry: String,
    layout: Layout,
    stream: Option<Stream>,
    pub read_bytes: u64,
}

impl<'s> PackBlobs<'s> {
    pub fn new(source: &'s mut Source, index_artifact: &Artifact, index: &Index) -> Result<Self> {
        Ok(PackBlobs {
            source,
            entry: name(index_artifact),
            layout: Layout::of(index)?,
            stream: None,
            read_bytes: 0,
        })
    }
}

/// A range of the pack being read.
struct Stream {
    reader: Box<dyn Read + Send>,
    /// Where the reader is, where its range ends, and the range's length.
    pos: u64,
    end: u64,
    len: u64,
}

/// Position `stream` at `offset`, ready for `size` bytes: the open range
/// read through a gap of at most [`SKIP_READ`] bytes, or a new range asked
/// of `source` (twice the last one's length when it starts where that one
/// ended, else `size`); what is read through is added to `count`.
fn position(
    source: &mut Source,
    entry: &str,
    total: u64,
    stream: &mut Option<Stream>,
    count: &mut u64,
    (offset, size): (u64, u64),
) -> Result<()> {
    let reuse = matches!(stream, Some(s) if s.pos <= offset
        && offset - s.pos <= SKIP_READ
        && offset + size <= s.end);
    if !reuse {
        let window = match stream {
            Some(s) if s.end == offset => s.len.saturating_mul(2),
            _ => size,
        };
        let len = window.clamp(size, MAX_WINDOW.max(size)).min(total - offset);
        *stream = Some(Stream {
            reader: source.open_range(entry, offset, len, total)?,
            pos: offset,
            end: offset + len,
            len,
        });
    }
    let Some(s) = stream.as_mut() else {
        bail!(Io, "{entry}: not open");
    };
    let gap = offset - s.pos;
    if gap > 0 {
        let skipped = std::io::copy(&mut (&mut s.reader).take(gap), &mut std::io::sink())
            .map_err(|e| err!(Io, "{entry}: reading at {}: {e}", s.pos))?;
        *count += skipped;
        s.pos += skipped;
        if skipped != gap {
            bail!(
                Integrity,
                "{entry} ended at {} bytes, before its last file",
                s.pos
            );
        }
    }
    Ok(())
}

/// `left` bytes of the pack's stream, its position kept.
struct Slice<'a> {
    stream: &'a mut Stream,
    left: u64,
    count: &'a mut u64,
}

impl Read for Slice<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = (buf.len() as u64).min(self.left) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.stream.reader.read(&mut buf[..want])?;
        self.stream.pos += n as u64;
        self.left -= n as u64;
        *self.count += n as u64;
        Ok(n)
    }
}

impl Blobs for PackBlobs<'_> {
    fn open(&mut self, sha256: &Sha256, size: u64) -> Result<Box<dyn Read + '_>> {
        let Some((offset, packed)) = self.layout.find(sha256) else {
            bail!(
                Integrity,
                "{}: no file hashing to {}",
                self.entry,
                sha256.short()
            );
        };
        if packed != size {
            bail!(
                Integrity,
                "{}: the file hashing to {} is {packed} bytes in the index, {size} asked",
                self.entry,
                sha256.short()
            );
        }
        let PackBlobs {
            source,
            entry,
            layout,
            stream,
            read_bytes,
        } = self;
        position(
            source,
            entry,
            layout.total,
            stream,
            read_bytes,
            (offset, size),
        )?;
        let Some(stream) = stream.as_mut() else {
            bail!(Io, "{entry}: not open");
        };
        Ok(Box::new(Slice {
            stream,
            left: size,
            count: read_bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::index::Entry;

    fn file(path: &str, content: &[u8]) -> Entry {
        Entry::File {
            path: path.into(),
            executable: false,
            size: content.len() as u64,
            sha256: Sha256::of(content),
        }
    }

    fn index(entries: Vec<Entry>) -> Index {
        Index { entries, bytes: 0 }
    }

    #[test]
    fn each_distinct_file_follows_the_one_before_in_index_order() {
        let l = Layout::of(&index(vec![
            Entry::Dir { path: "bin".into() },
            file("bin/a", b"aaaa"),
            file("bin/b", b"bb"),
            Entry::Symlink {
                path: "bin/c".into(),
                target: "a".into(),
            },
            file("bin/d", b"aaaa"),
            file("e", b""),
            file("f", b"fff"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.total, 9);
        assert_eq!(l.find(&Sha256::of(b"aaaa")), Some((0, 4)));
        assert_eq!(l.find(&Sha256::of(b"bb")), Some((4, 2)));
        assert_eq!(l.find(&Sha256::of(b"")), Some((6, 0)));
        assert_eq!(l.find(&Sha256::of(b"fff")), Some((6, 3)));
        assert_eq!(l.files.len(), 4, "a repeated file is packed once");
        assert_eq!(l.find(&Sha256::of(b"zz")), None);
    }

    #[test]
    fn one_hash_listed_with_two_sizes_is_refused() {
        let mut liar = file("b", b"abc");
        if let Entry::File { size, .. } = &mut liar {
            *size = 5;
        }
        let e =
            Layout::of(&index(vec![file("a", b"abc"), liar])).expect_err("two sizes for one hash");
        assert!(e.to_string().contains("lists b as 5 bytes"), "{e}");
    }

    #[test]
    fn the_pack_is_named_after_the_signed_index() {
        let a = Artifact {
            url: "artifacts/x.index.zst".into(),
            size: 1,
            sha256: Sha256::of(b"index"),
            frames: Vec::new(),
        };
        assert_eq!(
            name(&a),
            format!("artifacts/{}.pack", Sha256::of(b"index").to_hex())
        );
    }
}
