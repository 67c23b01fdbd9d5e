//! Applying a delta: a bsdiff patch stream wrapped in one zstd frame, turned
//! into the new image block by block, in bounded memory.
//!
//! The delta file is the `bsdiff` crate's patch stream compressed as a single
//! zstd frame whose window is at most 2^[`MAX_WINDOW_LOG`] bytes. The stream
//! is a sequence of records, each
//!
//! ```text
//! mix_len  u64 LE      bytes to produce by adding diff bytes to source bytes
//! copy_len u64 LE      bytes to copy verbatim from the patch
//! seek     i64 LE, sign and magnitude (bit 63 is the sign)
//! mix_len bytes        diff: new = diff + source (wrapping), from the source position
//! copy_len bytes       extra: new bytes as they are
//! ```
//!
//! after which the source position moves forward by `mix_len` and then by
//! `seek`. The stream starts at source position 0 and ends at a record
//! boundary.
//!
//! This module owns turning such a file into the new image and nothing else:
//! the caller has checked the delta's signed hash and the source's
//! `from_sha256`, and wires the sink to the slot writer, the image hasher and
//! progress. Memory is fixed whatever the image size: the zstd window (at most
//! 8 MiB), one output block of [`BLOCK`] bytes, one source window of
//! [`SOURCE_WINDOW`] bytes read with `pread`, and one input buffer.
//!
//! It must never map the source (an mmap of a 2 GiB slot counts in RSS as it
//! is touched), never write it, never allocate by a length read from the
//! patch, and never trust the patch: every length and seek is checked against
//! the source size and the signed new size before it is acted on, and any
//! violation is an [`Error`] of kind `Malformed` or `Integrity` that names the
//! record and the offsets, never a panic.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use zstd::zstd_safe::{self, DCtx, DParameter, InBuffer, OutBuffer};

use crate::artifact::parse_frame_header;
use crate::error::{Error, Result};
use crate::manifest::MAX_WINDOW_LOG;
use crate::{bail, err};

/// Output is handed to the sink in blocks of exactly this many bytes, except
/// the last, which may be shorter.
pub const BLOCK: usize = 1 << 20;

/// Source bytes are read with `pread` into one buffer of this size.
pub const SOURCE_WINDOW: usize = 1 << 20;

/// A source read for a short record still fetches this much, for the
/// records that follow it.
const MIN_SOURCE_READ: u64 = 16 << 10;

/// Compressed bytes are read from the delta into one buffer of this size.
const INPUT_BUFFER: usize = 128 << 10;

/// Size of a record's control block.
const CONTROL_LEN: usize = 24;

/// Records that produce no output are legitimate but rare (bsdiff emits at
/// most a few in a row); more than this many in a row are refused.
const MAX_IDLE_RECORDS: u32 = 1024;

/// The largest zstd frame header (magic, descriptor, window, dictionary id,
/// content size).
const MAX_FRAME_HEADER: usize = 18;

/// Apply a zstd-wrapped bsdiff delta.
///
/// `old` is the source (the active slot), read with `pread` within its first
/// `old_len` bytes and never written. `patch` is the delta file; it has been
/// hash-checked by the caller but is treated as hostile all the same. Exactly
/// `new_len` bytes are produced and handed to `sink` in order, in blocks of
/// [`BLOCK`] bytes (the last may be shorter). On error, what the sink has
/// received is a prefix of garbage and must not be used.
pub fn apply(
    old: &dyn ReadAt,
    old_len: u64,
    patch: &mut dyn Read,
    new_len: u64,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut stream = PatchStream::open(patch)?;
    let mut source = Source::new(old, old_len);
    let mut out = Output::new(new_len, sink);
    let mut old_pos: u64 = 0;
    let mut record: u64 = 0;
    let mut idle: u32 = 0;

    loop {
        let mut control = [0u8; CONTROL_LEN];
        let got = stream.read_full(&mut control)?;
        if got == 0 {
            break;
        }
        let at = out.produced;
        if got < CONTROL_LEN {
            return Err(stream.truncated(&format!(
                "inside the control block of record {record} (output offset {at})"
            )));
        }
        if at == new_len {
            bail!(
                Malformed,
                "delta record {record}: the delta continues after the last byte of the new image ({new_len} bytes)"
            );
        }
        let mix_len = u64::from_le_bytes(field(&control, 0));
        let copy_len = u64::from_le_bytes(field(&control, 8));
        let seek = signed(u64::from_le_bytes(field(&control, 16)));

        // A record that produces nothing only moves the source position; a
        // long run of them is a way to burn CPU, not a patch.
        if mix_len == 0 && copy_len == 0 {
            idle += 1;
            if idle > MAX_IDLE_RECORDS {
                bail!(
                    Malformed,
                    "delta record {record} at output offset {at}: more than {MAX_IDLE_RECORDS} records in a row produce no bytes"
                );
            }
        } else {
            idle = 0;
        }
        let room = new_len - at;
        if mix_len > room || copy_len > room - mix_len {
            bail!(
                Integrity,
                "delta record {record} at output offset {at}: {mix_len} diff bytes and {copy_len} extra bytes run past the end of the new image ({new_len} bytes)"
            );
        }
        if mix_len > old_len || old_pos > old_len - mix_len {
            bail!(
                Malformed,
                "delta record {record} at output offset {at}: {mix_len} diff bytes read the source from offset {old_pos}, past its end ({old_len} bytes)"
            );
        }
        let target = i128::from(old_pos) + i128::from(mix_len) + i128::from(seek);
        if target < 0 {
            bail!(
                Malformed,
                "delta record {record} at output offset {at}: seeks the source to offset {target}, before its start"
            );
        }
        if target > i128::from(old_len) {
            bail!(
                Malformed,
                "delta record {record} at output offset {at}: seeks the source to offset {target}, past its end ({old_len} bytes)"
            );
        }

        // Diff bytes, added to the source bytes at the same position.
        let mut left = mix_len;
        while left > 0 {
            let space = out.space();
            let from = source.window(old_pos, left)?;
            let n = (left.min(space.len() as u64) as usize).min(from.len());
            let dst = &mut space[..n];
            stream.read_exact(dst, || format!("in the diff bytes of record {record}"))?;
            for (d, o) in dst.iter_mut().zip(&from[..n]) {
                *d = d.wrapping_add(*o);
            }
            out.advance(n)?;
            old_pos += n as u64;
            left -= n as u64;
        }
        // Extra bytes, copied as they are.
        let mut left = copy_len;
        while left > 0 {
            let space = out.space();
            let n = left.min(space.len() as u64) as usize;
            stream.read_exact(&mut space[..n], || {
                format!("in the extra bytes of record {record}")
            })?;
            out.advance(n)?;
            left -= n as u64;
        }
        // In range: checked above.
        old_pos = target as u64;
        record += 1;
    }

    if out.produced != new_len {
        bail!(
            Integrity,
            "delta ends after {} of the new image's {new_len} bytes ({record} records)",
            out.produced
        );
    }
    stream.finish()?;
    out.flush()
}

fn field(control: &[u8; CONTROL_LEN], at: usize) -> [u8; 8] {
    let mut b = [0u8; 8];
    b.copy_from_slice(&control[at..at + 8]);
    b
}

/// A sign-and-magnitude 64-bit integer, as bsdiff writes seeks.
fn signed(raw: u64) -> i64 {
    let magnitude = (raw & !(1 << 63)) as i64;
    if raw & (1 << 63) != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// The decompressed patch stream: one zstd frame, read through a fixed input
/// buffer, with the window bounded before anything is allocated for it.
struct PatchStream<'a> {
    reader: &'a mut dyn Read,
    dctx: DCtx<'static>,
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Compressed bytes consumed by the decoder so far.
    consumed: u64,
    /// Decompressed bytes handed out so far.
    decoded: u64,
    input_eof: bool,
    frame_done: bool,
}

impl<'a> PatchStream<'a> {
    fn open(reader: &'a mut dyn Read) -> Result<PatchStream<'a>> {
        let mut stream = PatchStream {
            reader,
            dctx: DCtx::create(),
            input: vec![0; INPUT_BUFFER],
            start: 0,
            end: 0,
            consumed: 0,
            decoded: 0,
            input_eof: false,
            frame_done: false,
        };
        while stream.end < MAX_FRAME_HEADER && !stream.input_eof {
            stream.refill()?;
        }
        if stream.end == 0 {
            bail!(Malformed, "delta is empty: it holds no zstd frame");
        }
        let header =
            parse_frame_header(&stream.input[..stream.end]).map_err(|e| e.wrap("delta"))?;
        let limit = 1u64 << MAX_WINDOW_LOG;
        if header.window_size > limit {
            bail!(
                Malformed,
                "delta: zstd window of {} bytes exceeds the device limit of {limit} bytes (windowLog {MAX_WINDOW_LOG})",
                header.window_size
            );
        }
        if header.dictionary_id != 0 {
            bail!(
                Malformed,
                "delta: zstd frame needs dictionary {}",
                header.dictionary_id
            );
        }
        stream
            .dctx
            .set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))
            .map_err(|code| {
                err!(
                    Io,
                    "configuring the zstd decoder: {}",
                    zstd_safe::get_error_name(code)
                )
            })?;
        Ok(stream)
    }

    /// Read more compressed bytes into the (drained) input buffer.
    fn refill(&mut self) -> Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        loop {
            match self.reader.read(&mut self.input[self.end..]) {
                Ok(0) => {
                    self.input_eof = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::from(e).wrap("reading the delta")),
            }
        }
    }

    /// Decode into `out` (not empty). Returns 0 only at the end of the frame.
    fn read(&mut self, out: &mut [u8]) -> Result<usize> {
        loop {
            if self.frame_done {
                return Ok(0);
            }
            if self.start == self.end && !self.input_eof {
                self.refill()?;
            }
            let mut inb = InBuffer::around(&self.input[self.start..self.end]);
            let mut outb = OutBuffer::around(&mut *out);
            let hint = self
                .dctx
                .decompress_stream(&mut outb, &mut inb)
                .map_err(|code| {
                    err!(
                        Malformed,
                        "delta: corrupt zstd frame at compressed offset {}: {}",
                        self.consumed,
                        zstd_safe::get_error_name(code)
                    )
                })?;
            let used = inb.pos();
            let n = outb.pos();
            self.start += used;
            self.consumed += used as u64;
            self.decoded += n as u64;
            if hint == 0 {
                self.frame_done = true;
            }
            if n > 0 {
                return Ok(n);
            }
            if self.frame_done {
                return Ok(0);
            }
            if used == 0 {
                if self.start == self.end && self.input_eof {
                    return Err(self.truncated("inside the zstd frame"));
                }
                if self.start < self.end {
                    // zstd consumes input whenever it has room to write;
                    // refuse rather than spin if it ever does not.
                    bail!(
                        Malformed,
                        "delta: the zstd decoder stalled at compressed offset {}",
                        self.consumed
                    );
                }
            }
        }
    }

    /// Fill `out` unless the stream ends first; returns how much was read.
    fn read_full(&mut self, out: &mut [u8]) -> Result<usize> {
        let mut got = 0;
        while got < out.len() {
            let n = self.read(&mut out[got..])?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    }

    fn read_exact(&mut self, out: &mut [u8], what: impl FnOnce() -> String) -> Result<()> {
        if self.read_full(out)? < out.len() {
            return Err(self.truncated(&what()));
        }
        Ok(())
    }

    fn truncated(&self, what: &str) -> Error {
        err!(
            Malformed,
            "delta is truncated {what}: the {} frame ends after {} compressed bytes and {} patch bytes",
            if self.frame_done {
                "zstd"
            } else {
                "incomplete zstd"
            },
            self.consumed,
            self.decoded
        )
    }

    /// After the last record: the frame must be complete and nothing may
    /// follow it.
    fn finish(&mut self) -> Result<()> {
        if !self.frame_done {
            return Err(self.truncated("after the last record"));
        }
        if self.start == self.end && !self.input_eof {
            self.refill()?;
        }
        if self.start < self.end {
            bail!(
                Malformed,
                "delta has trailing bytes after its zstd frame (frame ends at compressed offset {})",
                self.consumed
            );
        }
        Ok(())
    }
}

/// Where a delta's source is read from, at offsets. On a device that is
/// the active slot's [`crate::slot::SlotReader`], which reads what the
/// medium holds, the same bytes the source hash was checked on; a plain
/// [`File`] (the publisher's check, tests) reads through the page cache.
pub trait ReadAt {
    /// Fill `buf` with the source's bytes from `offset` on.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        FileExt::read_exact_at(self, buf, offset).map_err(Error::from)
    }
}

/// The source, read with `pread` through one window.
struct Source<'a> {
    file: &'a dyn ReadAt,
    len: u64,
    buf: Vec<u8>,
    /// Source offset of `buf[0]`.
    at: u64,
    filled: usize,
}

impl<'a> Source<'a> {
    fn new(file: &'a dyn ReadAt, len: u64) -> Source<'a> {
        Source {
            file,
            len,
            buf: Vec::new(),
            at: 0,
            filled: 0,
        }
    }

    /// Source bytes from `pos` on: at least one, when `pos < len`, and up
    /// to `want` when they fit the window. The caller has checked that `pos`
    /// is inside the source.
    fn window(&mut self, pos: u64, want: u64) -> Result<&[u8]> {
        let inside = pos >= self.at && pos - self.at < self.filled as u64;
        if !inside {
            if self.buf.is_empty() {
                self.buf = vec![0; SOURCE_WINDOW];
            }
            // Read what the record needs (records are often short and
            // scattered), but never less than a few pages.
            let n = want
                .max(MIN_SOURCE_READ)
                .min(SOURCE_WINDOW as u64)
                .min(self.len.saturating_sub(pos)) as usize;
            self.file
                .read_exact_at(&mut self.buf[..n], pos)
                .map_err(|e| {
                    e.wrap(format!(
                        "reading {n} bytes of the delta's source at offset {pos}"
                    ))
                })?;
            self.at = pos;
            self.filled = n;
        }
        let from = (pos - self.at) as usize;
        Ok(&self.buf[from..self.filled])
    }
}

/// The output block and the sink it drains into.
struct Output<'a> {
    block: Vec<u8>,
    fill: usize,
    produced: u64,
    new_len: u64,
    sink: &'a mut dyn FnMut(&[u8]) -> Result<()>,
}

impl<'a> Output<'a> {
    fn new(new_len: u64, sink: &'a mut dyn FnMut(&[u8]) -> Result<()>) -> Output<'a> {
        let size = new_len.min(BLOCK as u64) as usize;
        Output {
            block: vec![0; size],
            fill: 0,
            produced: 0,
            new_len,
            sink,
        }
    }

    /// The unfilled part of the block (not empty while output is owed).
    fn space(&mut self) -> &mut [u8] {
        &mut self.block[self.fill..]
    }

    fn advance(&mut self, n: usize) -> Result<()> {
        self.fill += n;
        self.produced += n as u64;
        if self.fill == self.block.len() {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.fill > 0 {
            let end = self.produced;
            (self.sink)(&self.block[..self.fill]).map_err(|e| {
                e.wrap(format!(
                    "writing new image bytes up to offset {end} of {}",
                    self.new_len
                ))
            })?;
            self.fill = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;
    use crate::hash::{Hasher, Sha256};
    use crate::test_support::Rng;
    use std::io::Write;
    use zstd::zstd_safe::CParameter;

    /// The source as the device sees it: a file opened read-only.
    fn source(bytes: &[u8]) -> File {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("updraft-delta-{}-{n}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let f = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    fn compress_with_window(stream: &[u8], window_log: u32) -> Vec<u8> {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.set_parameter(CParameter::WindowLog(window_log))
            .unwrap();
        enc.set_parameter(CParameter::ChecksumFlag(true)).unwrap();
        enc.write_all(stream).unwrap();
        enc.finish().unwrap()
    }

    fn compress(stream: &[u8]) -> Vec<u8> {
        compress_with_window(stream, MAX_WINDOW_LOG)
    }

    fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
        let mut stream = Vec::new();
        bsdiff::diff(old, new, &mut stream).unwrap();
        stream
    }

    fn oracle(old: &[u8], stream: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        bsdiff::patch(old, &mut &stream[..], &mut out)?;
        Ok(out)
    }

    /// Apply `delta` to `old`, collecting what the sink receives.
    fn apply_to(old: &File, old_len: u64, delta: &[u8], new_len: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        apply(old, old_len, &mut &delta[..], new_len, &mut |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }

    fn run(old: &[u8], delta: &[u8], new_len: u64) -> Result<Vec<u8>> {
        apply_to(&source(old), old.len() as u64, delta, new_len)
    }

    fn control(mix: u64, copy: u64, seek: i64) -> Vec<u8> {
        let seek = if seek < 0 {
            seek.unsigned_abs() | 1 << 63
        } else {
            seek as u64
        };
        [mix.to_le_bytes(), copy.to_le_bytes(), seek.to_le_bytes()].concat()
    }

    fn record(mix: &[u8], copy: &[u8], seek: i64) -> Vec<u8> {
        [
            control(mix.len() as u64, copy.len() as u64, seek),
            mix.to_vec(),
            copy.to_vec(),
        ]
        .concat()
    }

    /// An old image and an edited new one: insertions, deletions, moved
    /// blocks, byte flips, empty and identical images.
    fn pair(rng: &mut Rng, case: usize) -> (Vec<u8>, Vec<u8>) {
        let size = rng.below(20_000);
        // Text-like data, so matches exist and bsdiff has work to do.
        let old: Vec<u8> = (0..size)
            .map(|_| b"abcdefgh\0\x01"[rng.below(10)])
            .collect();
        let mut new = old.clone();
        match case % 8 {
            0 => return (Vec::new(), rng.bytes(size)),
            1 => return (old, Vec::new()),
            2 => return (old.clone(), old),
            3 => {
                for _ in 0..1 + rng.below(20) {
                    let at = rng.below(new.len() + 1);
                    let ins = {
                        let n = rng.below(300);
                        rng.bytes(n)
                    };
                    new.splice(at..at, ins);
                }
            }
            4 => {
                for _ in 0..1 + rng.below(20) {
                    let at = rng.below(new.len() + 1);
                    let end = (at + rng.below(500)).min(new.len());
                    new.drain(at..end);
                }
            }
            5 => {
                for _ in 0..1 + rng.below(5) {
                    let a = rng.below(new.len() + 1);
                    let b = (a + rng.below(3000)).min(new.len());
                    let block: Vec<u8> = new.drain(a..b).collect();
                    let at = rng.below(new.len() + 1);
                    new.splice(at..at, block);
                }
            }
            6 => {
                for _ in 0..rng.below(200) {
                    if !new.is_empty() {
                        let at = rng.below(new.len());
                        new[at] ^= 1 << rng.below(8);
                    }
                }
            }
            _ => return (old, rng.bytes(size / 2)),
        }
        (old, new)
    }

    #[test]
    fn streaming_apply_matches_the_bsdiff_crate_on_edited_images() {
        let mut rng = Rng(0x5eed_0001);
        for case in 0..160 {
            let (old, new) = pair(&mut rng, case);
            let stream = bsdiff(&old, &new);
            let expected = oracle(&old, &stream).unwrap();
            assert_eq!(expected, new, "case {case}: the oracle itself");
            let got = run(&old, &compress(&stream), new.len() as u64).unwrap_or_else(|e| {
                panic!("case {case} ({} -> {} bytes): {e}", old.len(), new.len())
            });
            assert!(
                got == expected,
                "case {case}: output differs from bsdiff::patch"
            );
        }
    }

    /// Valid but unusual streams: seeks backwards and forwards, empty
    /// records, a diff read right up to the end of the source.
    #[test]
    fn streaming_apply_matches_the_bsdiff_crate_on_arbitrary_valid_streams() {
        let mut rng = Rng(0x5eed_0002);
        for case in 0..300 {
            let old = {
                let n = rng.below(5000);
                rng.bytes(n)
            };
            let mut stream = Vec::new();
            let mut pos = 0usize;
            let mut produced = 0usize;
            for _ in 0..rng.below(12) {
                let mix = rng.below(old.len() - pos + 1).min(3000);
                let copy = rng.below(2500);
                let after = pos + mix;
                let target = rng.below(old.len() + 1);
                stream.extend(record(
                    &rng.bytes(mix),
                    &rng.bytes(copy),
                    target as i64 - after as i64,
                ));
                pos = target;
                produced += mix + copy;
            }
            let expected = oracle(&old, &stream).unwrap();
            assert_eq!(expected.len(), produced);
            let got = run(&old, &compress(&stream), produced as u64)
                .unwrap_or_else(|e| panic!("case {case}: {e}"));
            assert!(
                got == expected,
                "case {case}: output differs from bsdiff::patch"
            );
        }
    }

    /// Whatever a mutated stream does, the patcher never accepts what the
    /// reference patcher refuses, and never disagrees with it on the bytes.
    #[test]
    fn mutated_streams_are_refused_or_agree_with_the_bsdiff_crate() {
        let mut rng = Rng(0x5eed_0003);
        for case in 0..400 {
            let (old, new) = pair(&mut rng, 3 + case % 4);
            let mut stream = bsdiff(&old, &new);
            if stream.is_empty() {
                continue;
            }
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(stream.len());
                match rng.below(3) {
                    0 => stream[at] = rng.next() as u8,
                    1 => stream.truncate(at),
                    _ => stream[at] ^= 0x80,
                }
                if stream.is_empty() {
                    break;
                }
            }
            let ours = run(&old, &compress(&stream), new.len() as u64);
            match (ours, oracle(&old, &stream)) {
                (Ok(got), Ok(expected)) => assert!(got == expected, "case {case}: bytes differ"),
                (Ok(_), Err(e)) => {
                    panic!("case {case}: accepted a stream bsdiff::patch refuses ({e})")
                }
                (Err(e), _) => assert!(
                    matches!(e.kind(), Kind::Malformed | Kind::Integrity),
                    "case {case}: {e}"
                ),
            }
        }
    }

    #[test]
    fn output_reaches_the_sink_in_full_blocks() {
        let old = vec![7u8; 3 * BLOCK];
        let mut new = old.clone();
        new[5] = 1;
        new.truncate(2 * BLOCK + BLOCK / 2);
        let stream = record(&vec![0u8; new.len()], &[], 0);
        let mut sizes = Vec::new();
        let f = source(&old);
        let delta = compress(&stream);
        let mut hasher = Hasher::new();
        apply(
            &f,
            old.len() as u64,
            &mut &delta[..],
            new.len() as u64,
            &mut |b: &[u8]| {
                sizes.push(b.len());
                hasher.update(b);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(sizes, [BLOCK, BLOCK, BLOCK / 2]);
        assert_eq!(hasher.finish(), Sha256::of(&old[..new.len()]));
    }

    #[test]
    fn empty_new_image_from_an_empty_stream() {
        assert_eq!(run(b"old", &compress(&[]), 0).unwrap(), b"");
    }

    fn refused(old: &[u8], delta: &[u8], new_len: u64, kind: Kind, needle: &str) {
        let e = run(old, delta, new_len).expect_err("hostile delta accepted");
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(needle), "{needle:?} not in: {e}");
    }

    #[test]
    fn a_seek_before_the_start_of_the_source_is_refused() {
        let stream = [record(b"\0\0", b"x", -3), record(b"\0", b"", 0)].concat();
        refused(
            b"abcd",
            &compress(&stream),
            4,
            Kind::Malformed,
            "seeks the source to offset -1, before its start",
        );
    }

    #[test]
    fn a_seek_past_the_end_of_the_source_is_refused() {
        let stream = record(b"\0\0", b"x", 3);
        refused(
            b"abcd",
            &compress(&stream),
            3,
            Kind::Malformed,
            "seeks the source to offset 5, past its end (4 bytes)",
        );
    }

    #[test]
    fn a_diff_reading_past_the_end_of_the_source_is_refused() {
        let stream = [record(b"\0\0\0", b"", 0), record(b"\0\0", b"", 0)].concat();
        refused(
            b"abcd",
            &compress(&stream),
            5,
            Kind::Malformed,
            "record 1 at output offset 3: 2 diff bytes read the source from offset 3, past its end (4 bytes)",
        );
    }

    #[test]
    fn lengths_that_overflow_are_refused_before_anything_is_read() {
        for (mix, copy) in [
            (u64::MAX, 0),
            (0, u64::MAX),
            (1 << 63, 0),
            (2, u64::MAX - 1),
            (u64::MAX, u64::MAX),
        ] {
            let stream = [control(mix, copy, 0), vec![0; 64]].concat();
            refused(
                b"abcd",
                &compress(&stream),
                10,
                Kind::Integrity,
                "run past the end of the new image (10 bytes)",
            );
        }
        let stream = control(0, 0, i64::MIN + 1);
        refused(
            b"abcd",
            &compress(&stream),
            1,
            Kind::Malformed,
            "before its start",
        );
        let stream = control(0, 0, i64::MAX);
        refused(
            b"abcd",
            &compress(&stream),
            1,
            Kind::Malformed,
            "past its end",
        );
    }

    #[test]
    fn a_flood_of_empty_records_is_refused() {
        let mut stream = record(b"\0", b"", 0);
        for _ in 0..5 {
            stream.extend(control(0, 0, 1));
            stream.extend(control(0, 0, -1));
        }
        stream.extend(record(b"\0", b"", 0));
        assert_eq!(
            run(b"abcd", &compress(&stream), 2).unwrap(),
            b"ab",
            "a few empty records are fine"
        );
        let mut flood = record(b"\0", b"", 0);
        for _ in 0..=MAX_IDLE_RECORDS {
            flood.extend(control(0, 0, 0));
        }
        flood.extend(record(b"\0", b"", 0));
        refused(
            b"abcd",
            &compress(&flood),
            2,
            Kind::Malformed,
            "more than 1024 records in a row produce no bytes",
        );
    }

    #[test]
    fn output_beyond_the_signed_size_is_refused() {
        let stream = record(b"\0\0\0\0", b"xyz", 0);
        refused(
            b"abcd",
            &compress(&stream),
            6,
            Kind::Integrity,
            "run past the end of the new image (6 bytes)",
        );
    }

    #[test]
    fn output_short_of_the_signed_size_is_refused() {
        let stream = record(b"\0\0\0\0", b"xyz", 0);
        refused(
            b"abcd",
            &compress(&stream),
            8,
            Kind::Integrity,
            "delta ends after 7 of the new image's 8 bytes",
        );
    }

    #[test]
    fn records_after_the_last_byte_are_refused() {
        let stream = [record(b"\0\0", b"", 0), record(b"", b"", 0)].concat();
        refused(
            b"abcd",
            &compress(&stream),
            2,
            Kind::Malformed,
            "continues after the last byte of the new image",
        );
    }

    #[test]
    fn every_truncation_of_a_delta_is_refused() {
        let old: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let mut new = old.clone();
        new.splice(1000..1000, b"inserted bytes".iter().copied());
        new[30_000] ^= 0xff;
        let delta = compress(&bsdiff(&old, &new));
        assert_eq!(run(&old, &delta, new.len() as u64).unwrap(), new);
        for cut in 0..delta.len() {
            let e =
                run(&old, &delta[..cut], new.len() as u64).expect_err("truncated delta accepted");
            assert_eq!(e.kind(), Kind::Malformed, "cut at {cut}: {e}");
        }
    }

    #[test]
    fn a_stream_truncated_inside_a_record_names_the_place() {
        let full = record(b"\0\0\0\0", b"xyz", 0);
        refused(
            b"abcd",
            &compress(&full[..10]),
            7,
            Kind::Malformed,
            "truncated inside the control block of record 0",
        );
        refused(
            b"abcd",
            &compress(&full[..26]),
            7,
            Kind::Malformed,
            "truncated in the diff bytes of record 0",
        );
        refused(
            b"abcd",
            &compress(&full[..29]),
            7,
            Kind::Malformed,
            "truncated in the extra bytes of record 0",
        );
    }

    #[test]
    fn trailing_bytes_after_the_frame_are_refused() {
        let mut delta = compress(&record(b"\0\0", b"", 0));
        delta.extend_from_slice(b"garbage");
        refused(
            b"abcd",
            &delta,
            2,
            Kind::Malformed,
            "trailing bytes after its zstd frame",
        );
        let mut two = compress(&record(b"\0\0", b"", 0));
        two.extend(compress(&[]));
        refused(
            b"abcd",
            &two,
            2,
            Kind::Malformed,
            "trailing bytes after its zstd frame",
        );
    }

    #[test]
    fn a_zstd_window_above_the_limit_is_refused() {
        let delta = compress_with_window(&record(b"\0\0", b"", 0), MAX_WINDOW_LOG + 1);
        let header = parse_frame_header(&delta).unwrap();
        assert!(
            header.window_size > 1 << MAX_WINDOW_LOG,
            "test delta must declare a big window"
        );
        refused(
            b"abcd",
            &delta,
            2,
            Kind::Malformed,
            "exceeds the device limit of 8388608 bytes",
        );
    }

    #[test]
    fn input_that_is_not_a_zstd_frame_is_refused() {
        refused(b"abcd", b"", 0, Kind::Malformed, "delta is empty");
        refused(
            b"abcd",
            &record(b"\0\0", b"", 0),
            2,
            Kind::Malformed,
            "bad magic",
        );
        let mut delta = compress(&record(b"\0\0\0\0", b"xyz", 0));
        let mid = delta.len() / 2 + 2;
        delta[mid] ^= 0x55;
        let e = run(b"abcd", &delta, 7).expect_err("corrupt frame accepted");
        assert_eq!(e.kind(), Kind::Malformed, "{e}");
    }

    /// A delta for another source of the same size applies cleanly, and the
    /// caller, which hashes what the sink receives, sees the wrong image.
    #[test]
    fn a_delta_for_another_source_is_caught_by_the_output_hash() {
        let old: Vec<u8> = (0..40_000u32).map(|i| (i * 31 % 253) as u8).collect();
        let mut new = old.clone();
        new[100..200].fill(9);
        let delta = compress(&bsdiff(&old, &new));
        let mut other = old.clone();
        other[20_000] ^= 1;
        let f = source(&other);
        let mut hasher = Hasher::new();
        let result = apply(
            &f,
            other.len() as u64,
            &mut &delta[..],
            new.len() as u64,
            &mut |b: &[u8]| {
                hasher.update(b);
                Ok(())
            },
        );
        assert!(result.is_ok(), "{result:?}");
        assert_ne!(hasher.finish(), Sha256::of(&new));
    }

    /// A slot is usually larger than the image it holds: only the first
    /// `old_len` bytes are the source.
    #[test]
    fn bytes_past_old_len_are_not_part_of_the_source() {
        let slot = source(b"abcdEFGH");
        let ok = compress(&record(&[0u8; 4], b"", 0));
        assert_eq!(apply_to(&slot, 4, &ok, 4).unwrap(), b"abcd");
        let e = apply_to(&slot, 4, &compress(&record(&[0u8; 5], b"", 0)), 5).unwrap_err();
        assert_eq!(e.kind(), Kind::Malformed);
        assert!(e.to_string().contains("past its end (4 bytes)"), "{e}");
    }

    #[test]
    fn a_source_shorter_than_declared_is_an_io_error() {
        let stream = record(&[0u8; 8], b"", 0);
        let e = apply_to(&source(b"abcd"), 8, &compress(&stream), 8).unwrap_err();
        assert_eq!(e.kind(), Kind::Io, "{e}");
        assert!(
            e.to_string()
                .contains("reading 8 bytes of the delta's source at offset 0"),
            "{e}"
        );
    }

    #[test]
    fn a_failing_sink_stops_the_apply_with_its_error() {
        let stream = record(b"\0\0\0\0", b"", 0);
        let delta = compress(&stream);
        let e = apply(
            &source(b"abcd"),
            4,
            &mut &delta[..],
            4,
            &mut |_: &[u8]| Err(err!(Slot, "disk full")),
        )
        .unwrap_err();
        assert_eq!(e.kind(), Kind::Slot);
        assert_eq!(
            e.to_string(),
            "writing new image bytes up to offset 4 of 4: disk full"
        );
    }

    /// The source is only ever read: after a run of valid and hostile
    /// deltas its bytes are what they were.
    #[test]
    fn the_source_is_never_written() {
        let old: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
        let path = std::env::temp_dir().join(format!("updraft-delta-ro-{}", std::process::id()));
        std::fs::write(&path, &old).unwrap();
        let f = File::open(&path).unwrap();
        let mut new = old.clone();
        new.reverse();
        let deltas = [
            compress(&bsdiff(&old, &new)),
            compress(&record(b"\0\0", b"x", -9)),
            compress(&record(&[1u8; 10], b"", 1 << 40)),
            compress(&control(u64::MAX, 0, 0)),
        ];
        for d in &deltas {
            let _ = apply_to(&f, old.len() as u64, d, new.len() as u64);
        }
        let after = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(after == old, "the source changed");
    }
}
