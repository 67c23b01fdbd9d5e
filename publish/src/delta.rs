//! Generating deltas: the bsdiff patch stream from an old image to a new
//! one, wrapped in one zstd frame with a window the device accepts.
//!
//! The output is exactly what `updraft::delta::apply` reads (and what the
//! `bsdiff` crate's `patch` reads once decompressed): records of a control
//! block (`mix_len`, `copy_len`, `seek`), `mix_len` diff bytes and
//! `copy_len` extra bytes, in one zstd frame whose header records a window of
//! at most 2^[`MAX_WINDOW_LOG`] bytes.
//!
//! How the records are found follows bsdiff: for each position of the new
//! image, the longest exact match in the old image, found in a suffix array;
//! a match is taken when it explains at least 8 more bytes than carrying on
//! at the current offset, and each taken match is grown forwards and
//! backwards while at least half the bytes still agree, so code whose
//! addresses shifted becomes mostly-zero diff bytes that zstd packs well.
//! What differs from the reference implementation is speed and memory:
//!
//! * the suffix array is built by libsais (linear time, 4 bytes per byte of
//!   the old image, in pieces of at most [`DeltaOptions::index_part`] bytes
//!   so 32-bit indices suffice whatever the image size);
//! * a table of the first two bytes narrows every search, and the binary
//!   search skips the prefix both of its bounds share with the query;
//! * the new image is cut into fixed windows that are matched against the
//!   whole old image in parallel; the cut points, not the thread count,
//!   shape the output, so the same inputs always give the same delta.
//!
//! This module runs on the build host only and must never be linked into
//! the device binary. It trusts its inputs (they are the publisher's own
//! images) but never panics on their sizes.

use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use libsais::SuffixArrayConstruction;
use updraft::manifest::MAX_WINDOW_LOG;
use zstd::zstd_safe::CParameter;

/// Matches are never grown past this many bytes in one search; longer
/// matches are found again from where this one stopped.
const MAX_MATCH: usize = 64 << 10;

/// How a delta is made.
#[derive(Debug, Clone)]
pub struct DeltaOptions {
    /// Worker threads matching windows of the new image; 0 means one per
    /// available core. The output does not depend on it.
    pub threads: usize,
    /// zstd level for the patch stream (1 to 22). The window stays at
    /// 2^[`MAX_WINDOW_LOG`] bytes whatever the level.
    pub zstd_level: i32,
    /// The new image is matched in windows of this many bytes, each against
    /// the whole old image. Smaller windows spread better over threads and
    /// cost a few bytes of delta at each cut.
    pub window: usize,
    /// Largest piece of the old image indexed by one suffix array (at most
    /// 2^31 - 1 bytes). Matches do not span pieces.
    pub index_part: usize,
}

impl Default for DeltaOptions {
    fn default() -> Self {
        DeltaOptions {
            threads: 0,
            zstd_level: 19,
            window: 16 << 20,
            index_part: 1 << 30,
        }
    }
}

/// Write the zstd-wrapped bsdiff delta from `old` to `new` into `out`.
/// Returns the number of bytes written.
pub fn make(old: &[u8], new: &[u8], opts: &DeltaOptions, out: &mut dyn Write) -> io::Result<u64> {
    let records = diff(old, new, opts)?;
    let mut counted = Counted {
        inner: out,
        written: 0,
    };
    let mut enc = zstd::stream::write::Encoder::new(&mut counted, opts.zstd_level)?;
    enc.set_parameter(CParameter::WindowLog(MAX_WINDOW_LOG))?;
    enc.set_parameter(CParameter::ChecksumFlag(true))?;
    write_stream(old, new, &records, &mut enc)?;
    enc.finish()?;
    Ok(counted.written)
}

/// The uncompressed bsdiff patch stream, as the `bsdiff` crate's `patch`
/// reads it.
pub fn make_stream(
    old: &[u8],
    new: &[u8],
    opts: &DeltaOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let records = diff(old, new, opts)?;
    write_stream(old, new, &records, out)
}

/// One record, in absolute coordinates: `mix` bytes of the new image from
/// `new_start` are diffed against the old image from `old_start`, and the
/// `copy` bytes after them are carried as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    new_start: usize,
    old_start: usize,
    mix: usize,
    copy: usize,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Find the records covering the whole new image, in order.
fn diff(old: &[u8], new: &[u8], opts: &DeltaOptions) -> io::Result<Vec<Record>> {
    if opts.window == 0 {
        return Err(invalid("delta window must not be 0".into()));
    }
    let threads = match opts.threads {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n,
    };
    let index = Index::build(old, opts.index_part, threads)?;
    let windows: Vec<(usize, usize)> = (0..new.len())
        .step_by(opts.window)
        .map(|s| (s, new.len().min(s.saturating_add(opts.window))))
        .collect();
    let threads = threads.clamp(1, windows.len().max(1));

    let results: Vec<Mutex<Vec<Record>>> = windows.iter().map(|_| Mutex::new(Vec::new())).collect();
    let next = AtomicUsize::new(0);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(start, end)) = windows.get(i) else {
                break;
            };
            let recs = scan_window(&index, new, start, end);
            if let Ok(mut slot) = results[i].lock() {
                *slot = recs;
            }
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    let mut records = Vec::new();
    for r in results {
        let recs = r
            .into_inner()
            .map_err(|_| io::Error::other("a delta worker thread panicked"))?;
        records.extend(recs);
    }
    Ok(records)
}

/// Serialise `records` as the bsdiff stream.
fn write_stream(old: &[u8], new: &[u8], records: &[Record], out: &mut dyn Write) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 20);
    let mut old_pos = 0usize;
    for (i, r) in records.iter().enumerate() {
        // The stream starts at old offset 0 and each record ends with a
        // seek to where the next one reads.
        if r.old_start != old_pos {
            return Err(io::Error::other(format!(
                "delta record {i} reads old offset {}, the stream is at {old_pos}",
                r.old_start
            )));
        }
        let after = r.old_start + r.mix;
        let next = records.get(i + 1).map_or(after, |n| n.old_start);
        let seek = next as i64 - after as i64;
        buf.clear();
        buf.extend_from_slice(&encode(r.mix as i64));
        buf.extend_from_slice(&encode(r.copy as i64));
        buf.extend_from_slice(&encode(seek));
        out.write_all(&buf)?;
        for (n, o) in new[r.new_start..r.new_start + r.mix]
            .chunks(1 << 20)
            .zip(old[r.old_start..after].chunks(1 << 20))
        {
            buf.clear();
            buf.extend(n.iter().zip(o).map(|(n, o)| n.wrapping_sub(*o)));
            out.write_all(&buf)?;
        }
        let copy_start = r.new_start + r.mix;
        out.write_all(&new[copy_start..copy_start + r.copy])?;
        old_pos = next;
    }
    Ok(())
}

/// Sign and magnitude, little-endian, as bsdiff writes integers.
fn encode(x: i64) -> [u8; 8] {
    let raw = if x < 0 {
        x.unsigned_abs() | (1 << 63)
    } else {
        x as u64
    };
    raw.to_le_bytes()
}

/// Suffix arrays over the old image, in pieces.
struct Index<'a> {
    old: &'a [u8],
    parts: Vec<Part>,
}

struct Part {
    /// Offset of the piece in the old image.
    base: usize,
    len: usize,
    /// Suffix array of the piece (offsets relative to `base`).
    sa: Vec<i32>,
    /// `buckets[k]..buckets[k + 1]` is the range of `sa` whose suffixes start
    /// with the two bytes `k` (a last, single byte `b` counts as `b, 0`).
    buckets: Vec<u32>,
}

impl<'a> Index<'a> {
    fn build(old: &'a [u8], part: usize, threads: usize) -> io::Result<Index<'a>> {
        let threads = libsais::ThreadCount::fixed(threads.clamp(1, usize::from(u16::MAX)) as u16);
        let part = part.clamp(1, i32::MAX as usize - 1);
        let mut parts = Vec::new();
        let mut base = 0;
        while base < old.len() {
            let len = part.min(old.len() - base);
            let text = &old[base..base + len];
            let sa: Vec<i32> = SuffixArrayConstruction::for_text(text)
                .in_owned_buffer32()
                .multi_threaded(threads)
                .run()
                .map_err(|e| {
                    io::Error::other(format!(
                        "suffix array of old bytes {base}..{}: {e:?}",
                        base + len
                    ))
                })?
                .into_vec();
            let mut buckets = vec![0u32; (1 << 16) + 1];
            for i in 0..len {
                buckets[key(&text[i..]) + 1] += 1;
            }
            for k in 0..1 << 16 {
                buckets[k + 1] += buckets[k];
            }
            parts.push(Part {
                base,
                len,
                sa,
                buckets,
            });
            base += len;
        }
        Ok(Index { old, parts })
    }

    /// The longest match for `query` (at most [`MAX_MATCH`] bytes of it) in
    /// the old image: (old offset, length).
    fn search(&self, query: &[u8]) -> (usize, usize) {
        let q = &query[..query.len().min(MAX_MATCH)];
        let mut best = (0, 0);
        if q.is_empty() {
            return best;
        }
        for p in &self.parts {
            let (pos, len) = p.search(&self.old[p.base..p.base + p.len], q);
            if len > best.1 {
                best = (p.base + pos, len);
                if len == q.len() {
                    break;
                }
            }
        }
        best
    }
}

/// Bucket key of the first two bytes of `s` (not empty).
fn key(s: &[u8]) -> usize {
    (usize::from(s[0]) << 8) | usize::from(s.get(1).copied().unwrap_or(0))
}

fn common(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Part {
    fn search(&self, text: &[u8], q: &[u8]) -> (usize, usize) {
        let (lo, hi) = if q.len() >= 2 {
            let k = key(q);
            (self.buckets[k] as usize, self.buckets[k + 1] as usize)
        } else {
            let k = usize::from(q[0]) << 8;
            (self.buckets[k] as usize, self.buckets[k + 256] as usize)
        };
        // Invariant: suffixes in [lo, l) sort before q, those in [r, hi) at
        // or after it; q shares `left` bytes with sa[l - 1] and `right` with
        // sa[r], so every suffix in between shares at least the smaller.
        let (mut l, mut r) = (lo, hi);
        let (mut left, mut right) = (0usize, 0usize);
        while l < r {
            let mid = l + (r - l) / 2;
            let at = self.sa[mid] as usize;
            let s = &text[at..];
            let skip = left.min(right);
            let k = skip + common(&s[skip.min(s.len())..], &q[skip..]);
            if k == q.len() {
                return (at, k);
            }
            if k == s.len() || s[k] < q[k] {
                l = mid + 1;
                left = k;
            } else {
                r = mid;
                right = k;
            }
        }
        let mut best = (0, 0);
        if l > lo {
            best = (self.sa[l - 1] as usize, left);
        }
        if l < hi && right > best.1 {
            best = (self.sa[l] as usize, right);
        }
        best
    }
}

/// bsdiff's scan over `new[start..end]`, matched against the whole old
/// image. The first record reads the old image from `start` (clamped to its
/// length), which is where an unchanged image would be.
fn scan_window(index: &Index<'_>, new_all: &[u8], start: usize, end: usize) -> Vec<Record> {
    let old = index.old;
    let new = &new_all[..end];
    let same = |n: usize, offset: isize| -> bool {
        let o = n as isize + offset;
        o >= 0 && (o as usize) < old.len() && old[o as usize] == new[n]
    };
    let mut records = Vec::new();

    let mut scan = start;
    let mut len = 0usize;
    let mut pos = 0usize;
    let mut last_scan = start;
    let mut last_pos = start.min(old.len());
    let mut last_offset = last_pos as isize - last_scan as isize;

    while scan < end {
        let mut old_score = 0usize;
        scan += len;
        let mut scored_to = scan;
        while scan < end {
            (pos, len) = index.search(&new[scan..]);
            // How many of the match's bytes the current offset explains.
            while scored_to < scan + len {
                if same(scored_to, last_offset) {
                    old_score += 1;
                }
                scored_to += 1;
            }
            if (len == old_score && len != 0) || len > old_score + 8 {
                break;
            }
            if same(scan, last_offset) {
                old_score = old_score.saturating_sub(1);
            }
            scan += 1;
        }
        if len == old_score && scan != end {
            // The match is what the current offset gives anyway.
            continue;
        }

        // Grow the previous match forwards while at least half agrees.
        let mut forward = 0usize;
        {
            let (mut s, mut best) = (0isize, 0isize);
            let mut i = 0usize;
            while last_scan + i < scan && last_pos + i < old.len() {
                if old[last_pos + i] == new[last_scan + i] {
                    s += 1;
                }
                i += 1;
                if s * 2 - i as isize > best * 2 - forward as isize {
                    best = s;
                    forward = i;
                }
            }
        }
        // Grow the new match backwards likewise.
        let mut backward = 0usize;
        if scan < end {
            let (mut s, mut best) = (0isize, 0isize);
            let mut i = 1usize;
            while scan >= last_scan + i && pos >= i {
                if old[pos - i] == new[scan - i] {
                    s += 1;
                }
                if s * 2 - i as isize > best * 2 - backward as isize {
                    best = s;
                    backward = i;
                }
                i += 1;
            }
        }
        // Where the two overlap, split at the point that keeps most agreement.
        if last_scan + forward > scan - backward {
            let overlap = last_scan + forward - (scan - backward);
            let (mut s, mut best, mut keep) = (0isize, 0isize, 0usize);
            for i in 0..overlap {
                if new[last_scan + forward - overlap + i] == old[last_pos + forward - overlap + i] {
                    s += 1;
                }
                if new[scan - backward + i] == old[pos - backward + i] {
                    s -= 1;
                }
                if s > best {
                    best = s;
                    keep = i + 1;
                }
            }
            forward = forward + keep - overlap;
            backward -= keep;
        }

        records.push(Record {
            new_start: last_scan,
            old_start: last_pos,
            mix: forward,
            copy: (scan - backward) - (last_scan + forward),
        });
        last_scan = scan - backward;
        last_pos = pos - backward;
        last_offset = pos as isize - scan as isize;
    }
    records
}

struct Counted<'a> {
    inner: &'a mut dyn Write,
    written: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
