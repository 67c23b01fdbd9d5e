//! Sealed chunks: how an artifact that is one stream rather than a table of
//! frames (a delta) is encrypted, sealed and opened in fixed-size pieces.
//!
//! The plaintext (the delta's zstd-compressed patch) is cut into chunks of
//! [`CHUNK`] bytes, the last one shorter (or empty for an empty stream).
//! Each is sealed with ChaCha20-Poly1305 (RFC 8439) under a key derived for
//! that artifact alone: HKDF-SHA256 (RFC 5869) of the release's content key
//! with info `"updraft chunk v1"` and the artifact's label (a delta's is
//! `delta:<from_sha256>`), so a chunk moved between artifacts or releases
//! fails. Nonce = the chunk index (96-bit big-endian); AAD = the index
//! (64-bit big-endian) and one byte, 1 on the final chunk and 0 before it,
//! so a chunk moved within the artifact, a stream cut at a chunk boundary
//! and a chunk appended after the final one all fail their tag. The sealed
//! artifact is the chunks back to back, each followed by its 16-byte tag.
//!
//! This module owns the chunk format, the sealing writer (publisher) and
//! the opening reader (device). The reader holds one chunk in memory and
//! hands out a byte only after that chunk's tag verified; it must never
//! write plaintext anywhere, never allocate by a length read from the
//! input, and never report a stream whose final chunk it has not opened as
//! complete.

use std::io::{self, Read, Write};

use ring::aead::{Aad, LessSafeKey};

use super::{ContentKey, aead_key, nonce};
use crate::error::{Error, Kind, Result};
use crate::hash::Sha256;
use crate::manifest::encryption::{SCHEME, TAG_LEN};

/// Plaintext bytes per chunk (the last chunk may be shorter).
pub const CHUNK: usize = 1 << 20;

const CHUNK_INFO: &[u8] = b"updraft chunk v1";
const TAG: usize = TAG_LEN as usize;

/// The key of one chunk-sealed artifact: in memory only.
pub struct ChunkKey {
    key: LessSafeKey,
    label: String,
}

impl std::fmt::Debug for ChunkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkKey({})", self.label)
    }
}

/// The label of the delta whose source image has sha256 `from`.
pub fn delta_label(from: &Sha256) -> String {
    format!("delta:{from}")
}

fn aad(index: u64, last: bool) -> [u8; 9] {
    let mut a = [0u8; 9];
    a[..8].copy_from_slice(&index.to_be_bytes());
    a[8] = u8::from(last);
    a
}

impl ChunkKey {
    /// The key of the artifact `label` under `content`.
    pub fn derive(content: &ContentKey, label: &str) -> Result<ChunkKey> {
        Ok(ChunkKey {
            key: aead_key(
                SCHEME.as_bytes(),
                &content.0,
                &[CHUNK_INFO, label.as_bytes()],
            )?,
            label: label.to_string(),
        })
    }

    /// The key of the delta from the image with sha256 `from`.
    pub fn for_delta(content: &ContentKey, from: &Sha256) -> Result<ChunkKey> {
        ChunkKey::derive(content, &delta_label(from))
    }

    fn seal(&self, index: u64, last: bool, buf: &mut Vec<u8>) -> io::Result<()> {
        self.key
            .seal_in_place_append_tag(nonce(index as usize), Aad::from(aad(index, last)), buf)
            .map_err(|_| io::Error::other(format!("sealing chunk {index} failed")))
    }

    fn open<'b>(&self, index: u64, last: bool, buf: &'b mut [u8]) -> Result<&'b mut [u8]> {
        if buf.len() < TAG {
            return Err(Error::new(
                Kind::Integrity,
                format!(
                    "{} chunk {index} is {} bytes, shorter than its tag",
                    self.label,
                    buf.len()
                ),
            ));
        }
        self.key
            .open_in_place(nonce(index as usize), Aad::from(aad(index, last)), buf)
            .map_err(|_| {
                let place = if last { "final" } else { "not final" };
                Error::new(
                    Kind::Integrity,
                    format!(
                        "{} chunk {index} ({place}) does not decrypt under the release's key \
                         (altered, moved from another place or artifact, or the stream cut short)",
                        self.label
                    ),
                )
            })
    }
}

/// The sealed size of `plain` bytes.
pub fn sealed_size(plain: u64) -> u64 {
    let chunks = plain.div_ceil(CHUNK as u64).max(1);
    plain + chunks * TAG_LEN
}

/// Seals what is written to it into `inner` (publisher). A full chunk is
/// sealed only once a byte beyond it arrives, so the final flag is right;
/// [`SealWriter::finish`] seals the last chunk.
pub struct SealWriter<'k, W: Write> {
    key: &'k ChunkKey,
    inner: W,
    buf: Vec<u8>,
    index: u64,
    written: u64,
}

impl<'k, W: Write> SealWriter<'k, W> {
    pub fn new(key: &'k ChunkKey, inner: W) -> Self {
        SealWriter {
            key,
            inner,
            buf: Vec::with_capacity(CHUNK + TAG),
            index: 0,
            written: 0,
        }
    }

    fn emit(&mut self, last: bool) -> io::Result<()> {
        self.key.seal(self.index, last, &mut self.buf)?;
        self.inner.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        self.index += 1;
        Ok(())
    }

    /// Seal the final chunk; the inner writer and the sealed bytes written.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        self.emit(true)?;
        self.inner.flush()?;
        Ok((self.inner, self.written))
    }
}

impl<W: Write> Write for SealWriter<'_, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if self.buf.len() == CHUNK {
            self.emit(false)?;
        }
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Opens a sealed stream read from `inner` (device): reads one chunk and
/// its tag, opens it, and hands out its plaintext. A chunk is final when
/// the input ends after it. On a refusal the reader returns an I/O error
/// and keeps the [`Error`] (kind `Integrity`) for [`OpenReader::failure`].
pub struct OpenReader<'k, R: Read> {
    key: &'k ChunkKey,
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    index: u64,
    carry: Option<u8>,
    done: bool,
    failure: Option<Error>,
    /// Set with `failure` and kept: a refused stream stays refused.
    refused: Option<String>,
}

impl<'k, R: Read> OpenReader<'k, R> {
    pub fn new(key: &'k ChunkKey, inner: R) -> Self {
        OpenReader {
            key,
            inner,
            buf: vec![0; CHUNK + TAG],
            start: 0,
            end: 0,
            index: 0,
            carry: None,
            done: false,
            failure: None,
            refused: None,
        }
    }

    /// Why the stream was refused, if it was.
    pub fn failure(&mut self) -> Option<Error> {
        self.failure.take()
    }

    /// True once the final chunk opened.
    pub fn complete(&self) -> bool {
        self.done
    }

    fn read_some(&mut self, at: usize) -> io::Result<usize> {
        loop {
            match self.inner.read(&mut self.buf[at..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }

    fn next_chunk(&mut self) -> io::Result<()> {
        let mut len = 0;
        if let Some(b) = self.carry.take() {
            self.buf[0] = b;
            len = 1;
        }
        while len < self.buf.len() {
            let n = self.read_some(len)?;
            if n == 0 {
                break;
            }
            len += n;
        }
        let mut last = len < self.buf.len();
        if !last {
            // Full: final only if nothing follows.
            let mut one = [0u8; 1];
            let n = loop {
                match self.inner.read(&mut one) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    other => break other?,
                }
            };
            if n == 0 {
                last = true;
            } else {
                self.carry = Some(one[0]);
            }
        }
        match self.key.open(self.index, last, &mut self.buf[..len]) {
            Ok(plain) => {
                self.start = 0;
                self.end = plain.len();
                self.index += 1;
                self.done = last;
                Ok(())
            }
            Err(e) => {
                let msg = e.to_string();
                self.refused = Some(msg.clone());
                self.failure = Some(e);
                self.done = true;
                self.start = 0;
                self.end = 0;
                Err(io::Error::new(io::ErrorKind::InvalidData, msg))
            }
        }
    }
}

impl<R: Read> Read for OpenReader<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.start == self.end {
            if self.done {
                if let Some(msg) = &self.refused {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, msg.clone()));
                }
                return Ok(0);
            }
            self.next_chunk()?;
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

/// Seal `plain` whole (tests, fuzzing).
pub fn seal_all(key: &ChunkKey, plain: &[u8]) -> io::Result<Vec<u8>> {
    let mut w = SealWriter::new(key, Vec::new());
    w.write_all(plain)?;
    Ok(w.finish()?.0)
}

/// Open `sealed` whole, refusing what [`OpenReader`] refuses (tests, fuzzing).
pub fn open_all(key: &ChunkKey, sealed: &[u8]) -> Result<Vec<u8>> {
    let mut r = OpenReader::new(key, sealed);
    let mut out = Vec::new();
    match r.read_to_end(&mut out) {
        Ok(_) if r.complete() => Ok(out),
        Ok(_) => Err(Error::new(
            Kind::Integrity,
            "the sealed stream has no final chunk",
        )),
        Err(e) => Err(r.failure().unwrap_or_else(|| Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(content: u8, from: &[u8]) -> ChunkKey {
        ChunkKey::for_delta(&ContentKey([content; 32]), &Sha256::of(from)).unwrap()
    }

    fn plain(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    const T: usize = CHUNK + TAG;

    #[test]
    fn sealed_streams_open_to_what_was_sealed_at_every_size_around_a_chunk() {
        let k = key(1, b"old");
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 5] {
            let p = plain(len);
            let s = seal_all(&k, &p).unwrap();
            assert_eq!(s.len() as u64, sealed_size(len as u64), "len {len}");
            assert_eq!(open_all(&k, &s).unwrap(), p, "len {len}");
        }
    }

    #[test]
    fn altered_moved_cut_or_extended_streams_are_refused() {
        let k = key(1, b"old");
        let p = plain(2 * CHUNK + 100);
        let s = seal_all(&k, &p).unwrap();
        let other = seal_all(&key(1, b"other source"), &p).unwrap();
        let one_chunk = seal_all(&k, &plain(CHUNK)).unwrap();
        // Rows: what was done to the sealed stream, what the refusal says.
        type Edit = Box<dyn Fn(&mut Vec<u8>)>;
        let rows: Vec<(&str, Edit, &str)> = vec![
            (
                "a byte flipped in chunk 1",
                Box::new(|b| b[T + 7] ^= 1),
                "chunk 1 (not final)",
            ),
            (
                "a tag byte flipped",
                Box::new(|b| b[T - 1] ^= 0x80),
                "chunk 0 (not final)",
            ),
            (
                "chunks 0 and 1 swapped",
                Box::new(|b| {
                    let (a, c) = b.split_at_mut(T);
                    a.swap_with_slice(&mut c[..T]);
                }),
                "chunk 0 (not final)",
            ),
            (
                "chunk 1 taken from the delta of another source",
                Box::new(move |b| b[T..2 * T].copy_from_slice(&other[T..2 * T])),
                "chunk 1 (not final)",
            ),
            (
                "cut at a chunk boundary",
                Box::new(|b| b.truncate(2 * T)),
                "chunk 1 (final)",
            ),
            (
                "cut inside a chunk",
                Box::new(|b| b.truncate(T + 40)),
                "chunk 1 (final)",
            ),
            (
                "cut to less than a tag",
                Box::new(|b| b.truncate(T + 3)),
                "shorter than its tag",
            ),
            (
                "a byte appended",
                Box::new(|b| b.push(0)),
                "chunk 2 (final)",
            ),
            (
                "a chunk appended after the final one",
                Box::new(|b| {
                    let extra = b[..T].to_vec();
                    b.extend_from_slice(&extra);
                }),
                "chunk 2 (not final)",
            ),
        ];
        for (what, edit, want) in rows {
            let mut b = s.clone();
            edit(&mut b);
            let e = open_all(&k, &b).unwrap_err();
            assert_eq!(e.kind(), Kind::Integrity, "{what}");
            assert!(e.to_string().contains(want), "{what}: {e}");
        }
        // The final flag: a one-chunk stream's only chunk, sealed final,
        // does not open in the place of a first chunk of more.
        let mut longer = one_chunk[..T].to_vec();
        longer.extend_from_slice(&s[T..]);
        assert!(open_all(&k, &longer).is_err());
        // Another release's key, or the full image's derivation, does not open it.
        assert!(open_all(&key(2, b"old"), &s).is_err());
        let slot = ChunkKey::derive(&ContentKey([1; 32]), super::super::SLOT_ARTIFACT).unwrap();
        assert!(open_all(&slot, &s).is_err());
    }

    #[test]
    fn nothing_of_a_bad_chunk_is_handed_out() {
        let k = key(1, b"old");
        let p = plain(CHUNK + 10);
        let mut s = seal_all(&k, &p).unwrap();
        s[T + 2] ^= 1;
        let mut r = OpenReader::new(&k, s.as_slice());
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let e = loop {
            match r.read(&mut buf) {
                Ok(0) => panic!("the altered stream ended cleanly"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break e,
            }
        };
        assert_eq!(got, p[..CHUNK], "only the verified chunk 0 came out");
        assert!(e.to_string().contains("chunk 1"), "{e}");
        assert_eq!(r.failure().unwrap().kind(), Kind::Integrity);
        // And the reader stays refused.
        assert!(r.read(&mut buf).is_err());
    }

    #[test]
    fn mutated_sealed_streams_are_refused_or_open_to_the_plaintext() {
        use crate::test_support::{Rng, mutate};
        let k = key(3, b"old");
        let p = plain(300);
        let s = seal_all(&k, &p).unwrap();
        let mut rng = Rng(0xc4a9_5eed);
        for _ in 0..500 {
            let m = mutate(&mut rng, &s);
            if let Ok(out) = open_all(&k, &m) {
                assert_eq!(out, p);
            }
        }
    }
}
