//! A generation's file contents from a directory of blobs
//! (`<dir>/<sha256>.zst`, one zstd frame each): a release on a USB stick
//! or in a local directory, and the test harness's view of a server.
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
use crate::err;
use crate::error::Result;
use crate::hash::Sha256;
use crate::manifest::MAX_WINDOW_LOG;

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
