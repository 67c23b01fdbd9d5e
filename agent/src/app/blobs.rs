//! A generation's file contents from blobs (`<sha256>.zst`, one zstd frame
//! each): in a directory ([`DirBlobs`]) or through a release's source, a
//! directory or a server ([`SourceBlobs`]); and the app's signed index
//! ([`fetch_index`]).
//!
//! Each blob is decoded as a stream with the window bounded by the
//! manifest's limit (8 MiB), whatever the frame header asks; the tree
//! writer counts and hashes what comes out, so a blob that decodes to more
//! or other bytes than listed fails the generation. This module never
//! verifies: that is [`super::tree`]'s.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use super::tree::Blobs;
use crate::artifact::VerifiedFrames;
use crate::err;
use crate::error::Result;
use crate::hash::Sha256;
use crate::manifest::{Artifact, MAX_WINDOW_LOG, compress_bound};
use crate::source::Source;

/// Blobs read from a directory, counting the compressed bytes read.
#[derive(Debug)]
pub struct DirBlobs {
    dir: PathBuf,
    /// Blob files opened, and the compressed bytes read from them.
    pub opened: u64,
    pub read_bytes: u64,
}

impl DirBlobs {
    pub fn new(dir: &Path) -> DirBlobs {
        DirBlobs {
            dir: dir.to_path_buf(),
            opened: 0,
            read_bytes: 0,
        }
    }
}

/// A reader that adds what it reads to a counter.
struct Counted<'a, R> {
    inner: R,
    count: &'a mut u64,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        *self.count += n as u64;
        Ok(n)
    }
}

impl Blobs for DirBlobs {
    fn open(&mut self, sha256: &Sha256, _size: u64) -> Result<Box<dyn Read + '_>> {
        let path = self.dir.join(format!("{}.zst", sha256.to_hex()));
        let file = File::open(&path).map_err(|e| err!(Io, "opening {}: {e}", path.display()))?;
        self.opened += 1;
        let counted = Counted {
            inner: file,
            count: &mut self.read_bytes,
        };
        let mut decoder = zstd::stream::read::Decoder::with_buffer(BufReader::new(counted))
            .map_err(|e| err!(Malformed, "{}: {e}", path.display()))?;
        decoder
            .window_log_max(MAX_WINDOW_LOG)
            .map_err(|e| err!(Malformed, "{}: {e}", path.display()))?;
        Ok(Box::new(decoder.single_frame()))
    }
}

/// Blobs read through a release's [`Source`] (a directory or a server):
/// `<prefix><sha256>.zst`, each at most as long as zstd can make the
/// listed size, counting the compressed bytes read.
pub struct SourceBlobs<'s> {
    source: &'s mut Source,
    prefix: String,
    pub read_bytes: u64,
}

impl<'s> SourceBlobs<'s> {
    /// `prefix`: the manifest's `blobs` (checked to end with `/`).
    pub fn new(source: &'s mut Source, prefix: &str) -> SourceBlobs<'s> {
        SourceBlobs {
            source,
            prefix: prefix.to_string(),
            read_bytes: 0,
        }
    }
}

impl Blobs for SourceBlobs<'_> {
    fn open(&mut self, sha256: &Sha256, size: u64) -> Result<Box<dyn Read + '_>> {
        let rel = format!("{}{}.zst", self.prefix, sha256.to_hex());
        let reader = self.source.open_capped(&rel, compress_bound(size))?;
        let counted = Counted {
            inner: reader,
            count: &mut self.read_bytes,
        };
        let mut decoder = zstd::stream::read::Decoder::with_buffer(BufReader::new(counted))
            .map_err(|e| err!(Malformed, "{rel}: {e}"))?;
        decoder
            .window_log_max(MAX_WINDOW_LOG)
            .map_err(|e| err!(Malformed, "{rel}: {e}"))?;
        Ok(Box::new(decoder.single_frame()))
    }
}

/// Download an app's index artifact (it is bounded by
/// [`crate::manifest::component::MAX_INDEX_BYTES`] decoded), each frame checked
/// against its signed hash and the whole against the artifact's, and
/// return the decoded index.
pub fn fetch_index(source: &mut Source, index: &Artifact, what: &str) -> Result<Vec<u8>> {
    let raw = source.open(&index.url, 0, index.size)?;
    let mut frames = VerifiedFrames::new(raw, index, what)?;
    let mut out = Vec::new();
    frames
        .read_to_end(&mut out)
        .map_err(|e| err!(Integrity, "{what}: reading {}: {e}", index.url))?;
    Ok(out)
}
