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
//! * a table of the first two or three bytes narrows every search, and the binary
//!   search skips the prefix both of its bounds share with the query;
//! * the new image is cut into fixed windows that are matched against the
//!   whole old image in parallel; the cut points, not the thread count,
//!   shape the output, so the same inputs always give the same delta.
//!
//! This module runs on the build host only and must never be linked into
//! the device binary. It trusts its inputs (they are the publisher's own
//! images) but never panics on their sizes.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

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
    let mut counted = Counted {
        inner: out,
        written: 0,
    };
    let mut enc = zstd::stream::write::Encoder::new(&mut counted, opts.zstd_level)?;
    enc.set_parameter(CParameter::WindowLog(MAX_WINDOW_LOG))?;
    enc.set_parameter(CParameter::ChecksumFlag(true))?;
    generate(old, new, opts, &mut enc)?;
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
    generate(old, new, opts, out)
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

/// Match the windows of the new image on worker threads while this thread
/// serialises (and the caller's writer compresses) finished windows in
/// order.
fn generate(old: &[u8], new: &[u8], opts: &DeltaOptions, out: &mut dyn Write) -> io::Result<()> {
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
    let workers = threads.clamp(1, windows.len().max(1));

    let done: Vec<Mutex<Option<Vec<Record>>>> = windows.iter().map(|_| Mutex::new(None)).collect();
    let ready = Condvar::new();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let lost = AtomicBool::new(false);

    let mut writer = StreamWriter::new(old, new, out);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                // Tell the serialising thread if this worker dies, so it
                // does not wait for a window that will never come.
                let _guard = PanicFlag {
                    flag: &lost,
                    ready: &ready,
                };
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(start, end)) = windows.get(i) else {
                        break;
                    };
                    let recs = scan_window(&index, new, start, end);
                    if let Ok(mut slot) = done[i].lock() {
                        *slot = Some(recs);
                    }
                    ready.notify_all();
                }
            });
        }
        let result = (|| {
            for (i, slot) in done.iter().enumerate() {
                let recs = {
                    let mut guard = slot
                        .lock()
                        .map_err(|_| io::Error::other("a delta worker thread panicked"))?;
                    loop {
                        if let Some(recs) = guard.take() {
                            break recs;
                        }
                        if lost.load(Ordering::Relaxed) {
                            return Err(io::Error::other("a delta worker thread panicked"));
                        }
                        guard = ready
                            .wait_timeout(guard, std::time::Duration::from_millis(100))
                            .map_err(|_| io::Error::other("a delta worker thread panicked"))?
                            .0;
                    }
                };
                debug_assert!(recs.first().is_none_or(|r| r.new_start == windows[i].0));
                for r in recs {
                    writer.push(r)?;
                }
            }
            writer.finish()
        })();
        if result.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        result
    })
}

/// Sets `flag` when dropped during a panic.
struct PanicFlag<'a> {
    flag: &'a AtomicBool,
    ready: &'a Condvar,
}

impl Drop for PanicFlag<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.flag.store(true, Ordering::Relaxed);
            self.ready.notify_all();
        }
    }
}

/// Serialises records as the bsdiff stream. A record's seek points at the
/// next record's old offset, so each is written once its successor is known.
struct StreamWriter<'a, 'w> {
    old: &'a [u8],
    new: &'a [u8],
    out: &'w mut dyn Write,
    pending: Option<Record>,
    /// Where the patcher's old position will be before the pending record.
    old_pos: usize,
    buf: Vec<u8>,
}

impl<'a, 'w> StreamWriter<'a, 'w> {
    fn new(old: &'a [u8], new: &'a [u8], out: &'w mut dyn Write) -> Self {
        StreamWriter {
            old,
            new,
            out,
            pending: None,
            old_pos: 0,
            buf: Vec::with_capacity(1 << 20),
        }
    }

    fn push(&mut self, r: Record) -> io::Result<()> {
        if let Some(p) = self.pending.take() {
            self.write(p, r.old_start)?;
        }
        self.pending = Some(r);
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        if let Some(p) = self.pending.take() {
            self.write(p, p.old_start + p.mix)?;
        }
        self.out.flush()
    }

    /// Write `r`, ending with a seek to old offset `next`.
    fn write(&mut self, r: Record, next: usize) -> io::Result<()> {
        // The stream starts at old offset 0; every seek lands where the
        // next record reads.
        if r.old_start != self.old_pos {
            return Err(io::Error::other(format!(
                "delta record at new offset {} reads old offset {}, the stream is at {}",
                r.new_start, r.old_start, self.old_pos
            )));
        }
        let after = r.old_start + r.mix;
        let seek = next as i64 - after as i64;
        self.buf.clear();
        self.buf.extend_from_slice(&encode(r.mix as i64));
        self.buf.extend_from_slice(&encode(r.copy as i64));
        self.buf.extend_from_slice(&encode(seek));
        self.out.write_all(&self.buf)?;
        let (new, old) = (self.new, self.old);
        for (n, o) in new[r.new_start..r.new_start + r.mix]
            .chunks(1 << 20)
            .zip(old[r.old_start..after].chunks(1 << 20))
        {
            self.buf.clear();
            self.buf
                .extend(n.iter().zip(o).map(|(n, o)| n.wrapping_sub(*o)));
            self.out.write_all(&self.buf)?;
        }
        let copy_start = r.new_start + r.mix;
        self.out.write_all(&new[copy_start..copy_start + r.copy])?;
        self.old_pos = next;
        Ok(())
    }
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
    /// Bytes of the bucket key.
    prefix: usize,
    /// `buckets[k]..buckets[k + 1]` is the range of `sa` whose suffixes start
    /// with the `prefix` bytes `k` (a suffix shorter than that counts as
    /// padded with zeros, which is where it sorts).
    buckets: Vec<u32>,
}

impl<'a> Index<'a> {
    /// Index `old` in pieces of at most `part` bytes, up to `threads` pieces
    /// at a time.
    fn build(old: &'a [u8], part: usize, threads: usize) -> io::Result<Index<'a>> {
        let part = part.clamp(1, i32::MAX as usize - 1);
        let pieces: Vec<usize> = (0..old.len()).step_by(part).collect();
        let mut parts: Vec<Option<io::Result<Part>>> = pieces.iter().map(|_| None).collect();
        for (bases, results) in pieces
            .chunks(threads.max(1))
            .zip(parts.chunks_mut(threads.max(1)))
        {
            std::thread::scope(|s| {
                for (&base, result) in bases.iter().zip(results.iter_mut()) {
                    let text = &old[base..old.len().min(base + part)];
                    s.spawn(move || *result = Some(Part::build(base, text)));
                }
            });
        }
        let parts = parts
            .into_iter()
            .map(|p| p.unwrap_or_else(|| Err(io::Error::other("a suffix array thread panicked"))))
            .collect::<io::Result<Vec<Part>>>()?;
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

/// Bucket key of the first `prefix` bytes of `s`, zero-padded.
fn key(s: &[u8], prefix: usize) -> usize {
    (0..prefix).fold(0, |k, i| {
        (k << 8) | usize::from(s.get(i).copied().unwrap_or(0))
    })
}

/// The suffix array of `text` (shorter than 2^31 bytes), by libsais.
fn suffix_array(text: &[u8]) -> Result<Vec<i32>, i32> {
    let n = i32::try_from(text.len()).map_err(|_| -1)?;
    let mut sa = vec![0i32; text.len()];
    // SAFETY: `text` holds `n` bytes and `sa` room for `n` entries with no
    // extra space (fs = 0); a null frequency table is allowed. libsais reads
    // only `text` and writes only `sa`, and returns before they are dropped.
    let rc = unsafe {
        libsais_sys::libsais::libsais(text.as_ptr(), sa.as_mut_ptr(), n, 0, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(rc);
    }
    Ok(sa)
}

fn common(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Part {
    fn build(base: usize, text: &[u8]) -> io::Result<Part> {
        let len = text.len();
        let sa = suffix_array(text).map_err(|code| {
            io::Error::other(format!(
                "libsais failed ({code}) on old bytes {base}..{}",
                base + len
            ))
        })?;
        // Three bytes narrow a search to a few hundred suffixes on a large
        // image; two are plenty (and much smaller) on a small one.
        let prefix = if len >= 16 << 20 { 3 } else { 2 };
        let mut buckets = vec![0u32; (1 << (8 * prefix)) + 1];
        for i in 0..len {
            buckets[key(&text[i..], prefix) + 1] += 1;
        }
        for k in 0..1 << (8 * prefix) {
            buckets[k + 1] += buckets[k];
        }
        Ok(Part {
            base,
            len,
            sa,
            prefix,
            buckets,
        })
    }

    fn search(&self, text: &[u8], q: &[u8]) -> (usize, usize) {
        // The suffixes whose keys start with q's first `n` bytes: when that
        // range is not empty the longest match is in it. An empty range
        // means the match is shorter than `n` bytes; try fewer.
        let mut n = self.prefix.min(q.len());
        let (lo, hi) = loop {
            let k = key(&q[..n], self.prefix);
            let span = 1 << (8 * (self.prefix - n));
            let (lo, hi) = (self.buckets[k] as usize, self.buckets[k + span] as usize);
            if lo < hi {
                break (lo, hi);
            }
            n -= 1;
            if n == 0 {
                return (0, 0);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Longest prefix of `q` found in any piece of `old`, by brute force.
    fn brute(old: &[u8], part: usize, q: &[u8]) -> usize {
        let q = &q[..q.len().min(MAX_MATCH)];
        let mut best = 0;
        for base in (0..old.len()).step_by(part) {
            let piece = &old[base..old.len().min(base + part)];
            for i in 0..piece.len() {
                best = best.max(common(&piece[i..], q));
            }
        }
        best
    }

    #[test]
    fn search_finds_the_longest_match_in_every_piece() {
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // A three-letter alphabet makes long and ambiguous matches common.
        let old: Vec<u8> = (0..3000).map(|_| b"abc"[(next() % 3) as usize]).collect();
        for part in [old.len(), 1000, 7] {
            let index = Index::build(&old, part, 2).unwrap();
            for _ in 0..300 {
                let len = (next() % 40) as usize;
                let q: Vec<u8> = if next() % 2 == 0 {
                    let at = (next() as usize) % (old.len() - len);
                    let mut q = old[at..at + len].to_vec();
                    q.extend((0..5).map(|_| b"abcd"[(next() % 4) as usize]));
                    q
                } else {
                    (0..len).map(|_| b"abcd"[(next() % 4) as usize]).collect()
                };
                let (pos, found) = index.search(&q);
                assert_eq!(
                    found,
                    brute(&old, part, &q),
                    "query {q:?}, pieces of {part}"
                );
                assert_eq!(
                    &old[pos..pos + found],
                    &q[..found],
                    "the reported offset holds the match"
                );
            }
        }
    }

    #[test]
    fn integers_are_sign_and_magnitude() {
        assert_eq!(encode(5), [5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode(-5), [5, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(encode(0), [0; 8]);
    }
}
