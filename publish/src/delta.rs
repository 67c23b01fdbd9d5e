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
//!   the indexed text, in pieces of at most [`DeltaOptions::index_part`]
//!   bytes so 32-bit indices suffice whatever the image size);
//! * a table of the first two or three bytes narrows every search, and the binary
//!   search skips the prefix both of its bounds share with the query;
//! * the new image is cut into fixed windows that are matched in parallel;
//!   the cut points, not the thread count, shape the output, so the same
//!   inputs always give the same delta.
//!
//! Memory is bounded by [`DeltaOptions::memory_budget`], whatever the image
//! sizes, with one of two plans chosen from the sizes alone:
//!
//! * **Whole image.** When both images, a suffix array over all of the old
//!   one and its bucket tables fit the budget (about 5 bytes per old byte
//!   plus 1 per new byte: a 256 MiB pair needs about 1.7 GiB), every window
//!   is matched against the whole old image. This finds the best matches
//!   and is what small and medium images get.
//! * **Regions.** Otherwise neither image is held in memory. One pass over
//!   the old image (read in pieces with positioned reads, never mapped)
//!   builds a sparse index of content-defined anchors: a gear hash over the
//!   last 64 bytes, an anchor where its top bits are zero and at least half
//!   the mean spacing after the previous one; the spacing grows with the
//!   image so the index never exceeds 1/16 of the budget, and a key seen
//!   more often than [`MAX_POSTINGS`] times (zeros, padding, common
//!   headers) is left out. Each window of the new image is then read and
//!   given the chunks of the old image at its own offset (where an
//!   unchanged image is); its anchors are looked up, and each one whose
//!   content is in none of those chunks votes for the chunk of the first
//!   offset its key was seen at (so votes for content repeated a few times
//!   gather on one copy). The chunks with at least [`MIN_VOTES`] votes, most-voted
//!   first, are added up to a cap of 1/16 of the budget; all are read, concatenated in old-offset order and given a suffix array of
//!   their own, and the window is matched against that. A match never
//!   spans two chunks that are not neighbours in the old image, and bytes
//!   outside the chosen chunks count as disagreeing when matches are grown;
//!   the diff bytes themselves are always taken from the old image, so a
//!   poor choice of chunks costs size, never correctness. At most as many
//!   windows are matched at once as the budget has room for (each costs
//!   about 5 times the chunk cap), and finished windows wait for the writer
//!   only a few at a time. The chunk choice depends on the inputs and the
//!   budget only, so the output is still the same whatever the thread
//!   count, and the same budget gives the same delta.
//!
//! This module runs on the build host only and must never be linked into
//! the device binary. It trusts its inputs (they are the publisher's own
//! images) but never panics on their sizes.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use updraft::manifest::MAX_WINDOW_LOG;
use zstd::zstd_safe::CParameter;

/// Matches are never grown past this many bytes in one search; longer
/// matches are found again from where this one stopped.
const MAX_MATCH: usize = 64 << 10;

/// An anchor key seen more often than this in the old image is left out of
/// its index: such content (zeros, padding, common headers) is almost
/// always at hand in the window's own region, and would otherwise pull
/// every window towards the same few copies.
pub const MAX_POSTINGS: usize = 4;

/// Votes an old chunk needs before a window is matched against it.
const MIN_VOTES: u32 = 2;

/// The default [`DeltaOptions::memory_budget`]: 2 GiB.
pub const DEFAULT_MEMORY_BUDGET: usize = 2 << 30;

/// How a delta is made.
#[derive(Debug, Clone)]
pub struct DeltaOptions {
    /// Worker threads matching windows of the new image; 0 means one per
    /// available core. The output does not depend on it.
    pub threads: usize,
    /// zstd level for the patch stream (1 to 22). The window stays at
    /// 2^[`MAX_WINDOW_LOG`] bytes whatever the level.
    pub zstd_level: i32,
    /// The new image is matched in windows of this many bytes (when matched
    /// in regions, at most half the region cap). Smaller windows spread
    /// better over threads and cost a few bytes of delta at each cut.
    pub window: usize,
    /// Largest piece of the old image indexed by one suffix array (at most
    /// 2^31 - 1 bytes). Matches do not span pieces.
    pub index_part: usize,
    /// Bytes of memory the generator plans to stay within (the images'
    /// sizes do not change it; the zstd encoder's own tables, about 100 MiB
    /// at level 19, come on top). A pair too large to index whole within it
    /// is matched region by region. The output depends on it.
    pub memory_budget: usize,
}

impl Default for DeltaOptions {
    fn default() -> Self {
        DeltaOptions {
            threads: 0,
            zstd_level: 19,
            window: 16 << 20,
            index_part: 1 << 30,
            memory_budget: DEFAULT_MEMORY_BUDGET,
        }
    }
}

/// An image read by offset: a byte slice, or a file read with positioned
/// reads (so that a large image is never wholly in memory).
pub trait Image: Sync {
    /// Length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fill `buf` from `offset`; the range lies within the image.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// The whole image, when it is already in memory.
    fn bytes(&self) -> Option<&[u8]> {
        None
    }
}

impl Image for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        let src = self
            .get(from..from.saturating_add(buf.len()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the image"))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl Image for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }
}

/// Write the zstd-wrapped bsdiff delta from `old` to `new` into `out`.
/// Returns the number of bytes written.
pub fn make(old: &[u8], new: &[u8], opts: &DeltaOptions, out: &mut dyn Write) -> io::Result<u64> {
    make_from(old, new, opts, out)
}

/// [`make`] for images of any kind, read as the plan needs: whole when
/// they fit the budget, by positioned reads otherwise.
pub fn make_from<O: Image + ?Sized, N: Image + ?Sized>(
    old: &O,
    new: &N,
    opts: &DeltaOptions,
    out: &mut dyn Write,
) -> io::Result<u64> {
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

/// Which plan [`make_from`] follows for images of these sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// One suffix array over the whole old image.
    Whole,
    /// Each window against chosen regions of the old image.
    Regions,
}

/// The plan for an `old_len`-byte old and a `new_len`-byte new image.
pub fn plan(old_len: u64, new_len: u64, opts: &DeltaOptions) -> Plan {
    let part = opts.index_part.clamp(1, i32::MAX as usize - 1) as u64;
    let parts = old_len.div_ceil(part);
    let buckets = if part.min(old_len) >= 16 << 20 {
        (4u64 << 24) * parts
    } else {
        (4u64 << 16) * parts
    };
    // Old image, its suffix array, the new image, bucket tables and the
    // writer's buffers.
    let need = old_len
        .saturating_mul(5)
        .saturating_add(new_len)
        .saturating_add(buckets)
        .saturating_add(64 << 20);
    if need <= opts.memory_budget as u64 {
        Plan::Whole
    } else {
        Plan::Regions
    }
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

fn size_of<I: Image + ?Sized>(image: &I, what: &str) -> io::Result<usize> {
    let len = image
        .size()
        .map_err(|e| io::Error::new(e.kind(), format!("the size of the {what} image: {e}")))?;
    usize::try_from(len).map_err(|_| invalid(format!("the {what} image is too large")))
}

/// The whole image in memory, borrowed when it already is.
fn whole<'a, I: Image + ?Sized>(image: &'a I, len: usize, what: &str) -> io::Result<Cow<'a, [u8]>> {
    if let Some(b) = image.bytes() {
        return Ok(Cow::Borrowed(b));
    }
    let mut buf = vec![0u8; len];
    for (i, piece) in buf.chunks_mut(8 << 20).enumerate() {
        image
            .read_at(piece, (i as u64) << 23)
            .map_err(|e| io::Error::new(e.kind(), format!("reading the {what} image: {e}")))?;
    }
    Ok(Cow::Owned(buf))
}

/// Plan, then match the windows of the new image on worker threads while
/// this thread serialises (and the caller's writer compresses) finished
/// windows in order.
fn generate<O: Image + ?Sized, N: Image + ?Sized>(
    old: &O,
    new: &N,
    opts: &DeltaOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    if opts.window == 0 {
        return Err(invalid("delta window must not be 0".into()));
    }
    let threads = match opts.threads {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n,
    };
    let old_len = size_of(old, "old")?;
    let new_len = size_of(new, "new")?;
    match plan(old_len as u64, new_len as u64, opts) {
        Plan::Whole => {
            let old_bytes = whole(old, old_len, "old")?;
            let new_bytes = whole(new, new_len, "new")?;
            let (old_bytes, new_bytes) = (&*old_bytes, &*new_bytes);
            let index = Index::build(old_bytes, opts.index_part, threads)?;
            let windows = cut(new_len, opts.window);
            let view = WholeView { index: &index };
            run_windows(
                &windows,
                threads,
                windows.len(),
                |(start, end)| {
                    let w = Window {
                        bytes: &new_bytes[start..end],
                        start,
                    };
                    Ok((scan_window(&view, w), Cow::Borrowed(w.bytes)))
                },
                &mut StreamWriter::new(old_bytes, out),
            )
        }
        Plan::Regions => {
            let r = Regional::plan(old_len, opts);
            let anchors = Anchors::build(old, old_len, &r)?;
            let windows = cut(new_len, r.window);
            let workers = threads.clamp(1, r.workers);
            run_windows(
                &windows,
                workers,
                workers + 1,
                |(start, end)| {
                    let mut bytes = vec![0u8; end - start];
                    new.read_at(&mut bytes, start as u64).map_err(|e| {
                        io::Error::new(e.kind(), format!("reading new bytes {start}..{end}: {e}"))
                    })?;
                    let view = RegionView::build(old, old_len, &anchors, &r, &bytes, start)?;
                    let recs = scan_window(
                        &view,
                        Window {
                            bytes: &bytes,
                            start,
                        },
                    );
                    Ok((recs, Cow::Owned(bytes)))
                },
                &mut StreamWriter::new(old, out),
            )
        }
    }
}

/// `len` bytes cut into windows of `window` bytes: (start, end).
fn cut(len: usize, window: usize) -> Vec<(usize, usize)> {
    (0..len)
        .step_by(window.max(1))
        .map(|s| (s, len.min(s.saturating_add(window))))
        .collect()
}

/// A window's records and its bytes of the new image.
type Done<'a> = (Vec<Record>, Cow<'a, [u8]>);

/// Run `work` on each window on up to `workers` threads, never more than
/// `ahead` windows past the last one written, and hand the results to
/// `writer` in window order.
fn run_windows<'a, O: Image + ?Sized, F>(
    windows: &[(usize, usize)],
    workers: usize,
    ahead: usize,
    work: F,
    writer: &mut StreamWriter<'_, O>,
) -> io::Result<()>
where
    F: Fn((usize, usize)) -> io::Result<Done<'a>> + Sync,
{
    let workers = workers.clamp(1, windows.len().max(1));
    let ahead = ahead.max(1);
    let done: Vec<Mutex<Option<io::Result<Done<'a>>>>> =
        windows.iter().map(|_| Mutex::new(None)).collect();
    let ready = Condvar::new();
    let written = Mutex::new(0usize);
    let room = Condvar::new();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let lost = AtomicBool::new(false);
    let gone = || io::Error::other("a delta worker thread panicked");

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
                    let Some(&window) = windows.get(i) else {
                        break;
                    };
                    // Wait until the writer is close enough behind.
                    if let Ok(mut w) = written.lock() {
                        while i >= *w + ahead && !stop.load(Ordering::Relaxed) {
                            match room.wait_timeout(w, std::time::Duration::from_millis(100)) {
                                Ok((g, _)) => w = g,
                                Err(_) => return,
                            }
                        }
                    }
                    let result = work(window);
                    let failed = result.is_err();
                    if let Ok(mut slot) = done[i].lock() {
                        *slot = Some(result);
                    }
                    ready.notify_all();
                    if failed {
                        break;
                    }
                }
            });
        }
        let result = (|| {
            for (i, slot) in done.iter().enumerate() {
                let (recs, bytes) = {
                    let mut guard = slot.lock().map_err(|_| gone())?;
                    loop {
                        if let Some(result) = guard.take() {
                            break result?;
                        }
                        if lost.load(Ordering::Relaxed) {
                            return Err(gone());
                        }
                        guard = ready
                            .wait_timeout(guard, std::time::Duration::from_millis(100))
                            .map_err(|_| gone())?
                            .0;
                    }
                };
                debug_assert!(recs.first().is_none_or(|r| r.new_start == windows[i].0));
                let w = Window {
                    bytes: &bytes,
                    start: windows[i].0,
                };
                for r in recs {
                    writer.push(r, w)?;
                }
                if let Ok(mut w) = written.lock() {
                    *w = i + 1;
                }
                room.notify_all();
            }
            writer.finish()
        })();
        if result.is_err() {
            stop.store(true, Ordering::Relaxed);
            room.notify_all();
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

/// Bytes `start..start + bytes.len()` of the new image, indexed by their
/// offsets in the image.
#[derive(Clone, Copy)]
struct Window<'a> {
    bytes: &'a [u8],
    start: usize,
}

impl<'a> Window<'a> {
    /// From new offset `at` to the end of the window.
    fn tail(&self, at: usize) -> &'a [u8] {
        &self.bytes[at - self.start..]
    }
}

impl std::ops::Index<usize> for Window<'_> {
    type Output = u8;

    fn index(&self, at: usize) -> &u8 {
        &self.bytes[at - self.start]
    }
}

/// Serialises records as the bsdiff stream. A record's seek points at the
/// next record's old offset, so each is written once its successor is known.
struct StreamWriter<'a, O: Image + ?Sized> {
    old: &'a O,
    out: &'a mut dyn Write,
    /// The pending record and its copy of the new bytes it covers.
    pending: Option<(Record, Vec<u8>)>,
    /// Where the patcher's old position will be before the pending record.
    old_pos: usize,
    buf: Vec<u8>,
    old_buf: Vec<u8>,
}

impl<'a, O: Image + ?Sized> StreamWriter<'a, O> {
    fn new(old: &'a O, out: &'a mut dyn Write) -> Self {
        StreamWriter {
            old,
            out,
            pending: None,
            old_pos: 0,
            buf: Vec::with_capacity(1 << 20),
            old_buf: Vec::new(),
        }
    }

    /// Queue `r`, whose new bytes lie in `w`, writing the one before it.
    fn push(&mut self, r: Record, w: Window<'_>) -> io::Result<()> {
        if let Some((p, bytes)) = self.pending.take() {
            self.write(p, &bytes, r.old_start)?;
        }
        let from = r.new_start - w.start;
        self.pending = Some((r, w.bytes[from..from + r.mix + r.copy].to_vec()));
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        if let Some((p, bytes)) = self.pending.take() {
            self.write(p, &bytes, p.old_start + p.mix)?;
        }
        self.out.flush()
    }

    /// Write `r` (whose new bytes are `new`), ending with a seek to old
    /// offset `next`.
    fn write(&mut self, r: Record, new: &[u8], next: usize) -> io::Result<()> {
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
        for (i, n) in new[..r.mix].chunks(1 << 20).enumerate() {
            let at = r.old_start + (i << 20);
            let o: &[u8] = match self.old.bytes() {
                Some(b) => &b[at..at + n.len()],
                None => {
                    self.old_buf.resize(n.len(), 0);
                    self.old
                        .read_at(&mut self.old_buf, at as u64)
                        .map_err(|e| {
                            io::Error::new(e.kind(), format!("reading old bytes at {at}: {e}"))
                        })?;
                    &self.old_buf
                }
            };
            self.buf.clear();
            self.buf
                .extend(n.iter().zip(o).map(|(n, o)| n.wrapping_sub(*o)));
            self.out.write_all(&self.buf)?;
        }
        self.out.write_all(&new[r.mix..r.mix + r.copy])?;
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

/// What a window's scan sees of the old image.
trait View: Sync {
    /// Length of the old image.
    fn len(&self) -> usize;
    /// The old byte at `at`, if the view holds it (bytes it does not hold
    /// count as disagreeing).
    fn byte(&self, at: usize) -> Option<u8>;
    /// The longest match for `query` (at most [`MAX_MATCH`] bytes of it):
    /// (old offset, length).
    fn search(&self, query: &[u8]) -> (usize, usize);
}

/// The whole old image.
struct WholeView<'a, 'b> {
    index: &'a Index<'b>,
}

impl View for WholeView<'_, '_> {
    fn len(&self) -> usize {
        self.index.old.len()
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.index.old.get(at).copied()
    }

    fn search(&self, query: &[u8]) -> (usize, usize) {
        self.index.search(query)
    }
}

/// The sizes of the region plan, from the budget and the old image's size.
#[derive(Debug, Clone, Copy)]
struct Regional {
    /// Bytes of the new image matched at a time.
    window: usize,
    /// The old image is chosen from in chunks of 2^`chunk_shift` bytes.
    chunk_shift: u32,
    /// Most bytes of the old image one window is matched against.
    cap: usize,
    /// An anchor has the top `bits` bits of its gear hash zero...
    bits: u32,
    /// ...and comes at least this many bytes after the previous one.
    min_gap: usize,
    /// Windows matched at once.
    workers: usize,
}

impl Regional {
    fn plan(old_len: usize, opts: &DeltaOptions) -> Regional {
        let budget = opts.memory_budget.max(1 << 20);
        let cap = (budget / 16).clamp(64 << 10, 256 << 20);
        let chunk = ((cap / 64).clamp(4 << 10, 256 << 10) + 1).next_power_of_two() / 2;
        let chunk_shift = chunk.trailing_zeros();
        let cap = cap / chunk * chunk;
        let window = opts.window.min(cap / 2).max(chunk);
        // Anchors are at least `min_gap` apart, so there are at most
        // old_len / min_gap of them, at 16 bytes each, in 1/16 of the budget.
        let index_budget = budget / 16;
        let entries = (index_budget / 16).max(1);
        let spacing = (old_len.saturating_mul(2) / entries)
            .max(256)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX / 2 + 1);
        let min_gap = spacing / 2;
        let bits = min_gap.trailing_zeros();
        let buckets = if cap >= 16 << 20 { 4 << 24 } else { 4 << 16 };
        let per_window = window * 2 + cap * 5 + buckets + (old_len >> chunk_shift) * 16;
        let spare = budget.saturating_sub(index_budget + budget / 16);
        Regional {
            window,
            chunk_shift,
            cap,
            bits,
            min_gap,
            workers: (spare / per_window.max(1)).max(1),
        }
    }
}

/// 256 fixed pseudo-random words for the gear hash (splitmix64 from a
/// fixed seed), so anchors depend on content alone.
const GEAR: [u64; 256] = gear_table();

const fn gear_table() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut x: u64 = 0x5EED_0F0D_E17A_0001;
    let mut i = 0;
    while i < 256 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        table[i] = z ^ (z >> 31);
        i += 1;
    }
    table
}

/// A gear hash run over a stream: each byte shifts the hash left one bit
/// and adds the byte's word, so the hash depends on the last 64 bytes only.
struct Gear {
    hash: u64,
    since: usize,
}

impl Gear {
    fn new() -> Gear {
        Gear { hash: 0, since: 0 }
    }

    /// Feed `data`, found at offset `base`, calling `anchor(key, offset)`
    /// for each anchor (the offset of its last byte).
    fn feed(&mut self, data: &[u8], base: usize, r: &Regional, anchor: &mut dyn FnMut(u64, usize)) {
        let shift = 64 - r.bits;
        for (i, &b) in data.iter().enumerate() {
            self.hash = (self.hash << 1).wrapping_add(GEAR[usize::from(b)]);
            self.since += 1;
            if self.since >= r.min_gap && self.hash >> shift == 0 {
                anchor(self.hash, base + i);
                self.since = 0;
            }
        }
    }
}

/// The old image's anchors, sorted by key, without the keys seen more than
/// [`MAX_POSTINGS`] times.
struct Anchors {
    entries: Vec<(u64, u64)>,
}

impl Anchors {
    fn build<O: Image + ?Sized>(old: &O, old_len: usize, r: &Regional) -> io::Result<Anchors> {
        let mut entries: Vec<(u64, u64)> =
            Vec::with_capacity(old_len / (r.min_gap * 2).max(1) + 1024);
        let mut gear = Gear::new();
        let mut buf = vec![0u8; 8 << 20];
        let mut at = 0usize;
        while at < old_len {
            let n = buf.len().min(old_len - at);
            old.read_at(&mut buf[..n], at as u64).map_err(|e| {
                io::Error::new(e.kind(), format!("reading old bytes {at}..{}: {e}", at + n))
            })?;
            gear.feed(&buf[..n], at, r, &mut |key, pos| {
                entries.push((key, pos as u64));
            });
            at += n;
        }
        entries.sort_unstable();
        // Keys seen too often are dropped: they would vote every window
        // towards the same few early copies.
        let mut kept = 0usize;
        let mut i = 0usize;
        while i < entries.len() {
            let key = entries[i].0;
            let n = entries[i..].iter().take_while(|e| e.0 == key).count();
            if n <= MAX_POSTINGS {
                entries.copy_within(i..i + n, kept);
                kept += n;
            }
            i += n;
        }
        entries.truncate(kept);
        entries.shrink_to_fit();
        Ok(Anchors { entries })
    }

    /// Old offsets of the anchors with this key.
    fn find(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let from = self.entries.partition_point(|e| e.0 < key);
        self.entries[from..]
            .iter()
            .take_while(move |e| e.0 == key)
            .map(|e| e.1 as usize)
    }
}

/// The chunks of the old image one window is matched against, with a
/// suffix array over their concatenation.
struct RegionView {
    old_len: usize,
    chunk_shift: u32,
    /// Offset in `text` of each chunk of the old image, or `u32::MAX`.
    table: Vec<u32>,
    /// (offset in `text`, old offset, length) of each run of neighbouring
    /// chunks, in order.
    runs: Vec<(usize, usize, usize)>,
    text: Vec<u8>,
    part: Option<Part>,
}

impl RegionView {
    fn build<O: Image + ?Sized>(
        old: &O,
        old_len: usize,
        anchors: &Anchors,
        r: &Regional,
        new: &[u8],
        start: usize,
    ) -> io::Result<RegionView> {
        let shift = r.chunk_shift;
        let chunks = old_len.div_ceil(1 << shift);
        let chunk_len = |c: usize| (1usize << shift).min(old_len - (c << shift));
        let mut chosen = vec![false; chunks];
        let mut total = 0usize;
        // Where an unchanged image would be first, then by votes.
        if start < old_len {
            let last = (old_len.min(start + new.len()) - 1) >> shift;
            for (c, pick) in chosen
                .iter_mut()
                .enumerate()
                .take(last + 1)
                .skip(start >> shift)
            {
                if total + chunk_len(c) > r.cap {
                    break;
                }
                *pick = true;
                total += chunk_len(c);
            }
        }
        // An anchor whose content is already at hand does not vote; one
        // that is not votes for the first offset it was seen at, so the
        // votes for repeated content gather on one copy.
        let mut votes = vec![0u32; chunks];
        let mut gear = Gear::new();
        gear.feed(new, start, r, &mut |key, _| {
            let mut first = None;
            for at in anchors.find(key) {
                if chosen[at >> shift] {
                    return;
                }
                first = first.or(Some(at >> shift));
            }
            if let Some(c) = first {
                votes[c] += 1;
            }
        });
        // A single vote is as likely a common header as moved content.
        let mut ranked: Vec<(u32, usize)> = votes
            .iter()
            .enumerate()
            .filter(|&(_, &v)| v >= MIN_VOTES)
            .map(|(c, &v)| (v, c))
            .collect();
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, c) in ranked {
            if total + chunk_len(c) <= r.cap {
                chosen[c] = true;
                total += chunk_len(c);
            }
        }
        drop(votes);

        let mut table = vec![u32::MAX; chunks];
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        let mut text = vec![0u8; total];
        let mut filled = 0usize;
        let mut c = 0usize;
        while c < chunks {
            if !chosen[c] {
                c += 1;
                continue;
            }
            let first = c;
            while c < chunks && chosen[c] {
                table[c] = (filled + ((c - first) << shift)) as u32;
                c += 1;
            }
            let from = first << shift;
            let len = old_len.min(c << shift) - from;
            old.read_at(&mut text[filled..filled + len], from as u64)
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("reading old bytes {from}..{}: {e}", from + len),
                    )
                })?;
            runs.push((filled, from, len));
            filled += len;
        }
        let part = if text.is_empty() {
            None
        } else {
            Some(Part::build(0, &text)?)
        };
        Ok(RegionView {
            old_len,
            chunk_shift: shift,
            table,
            runs,
            text,
            part,
        })
    }
}

impl View for RegionView {
    fn len(&self) -> usize {
        self.old_len
    }

    fn byte(&self, at: usize) -> Option<u8> {
        if at >= self.old_len {
            return None;
        }
        let t = self.table[at >> self.chunk_shift];
        if t == u32::MAX {
            return None;
        }
        let within = at & ((1 << self.chunk_shift) - 1);
        Some(self.text[t as usize + within])
    }

    fn search(&self, query: &[u8]) -> (usize, usize) {
        let q = &query[..query.len().min(MAX_MATCH)];
        let Some(part) = &self.part else {
            return (0, 0);
        };
        if q.is_empty() {
            return (0, 0);
        }
        let (at, len) = part.search(&self.text, q);
        if len == 0 {
            return (0, 0);
        }
        // A match ends where its run of neighbouring chunks does.
        let i = self.runs.partition_point(|r| r.0 <= at) - 1;
        let (text_start, old_start, run_len) = self.runs[i];
        (
            old_start + (at - text_start),
            len.min(text_start + run_len - at),
        )
    }
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

/// bsdiff's scan over one window of the new image, matched against what
/// `view` sees of the old image. The first record reads the old image from `start` (clamped to its
/// length), which is where an unchanged image would be.
fn scan_window<V: View>(view: &V, new: Window<'_>) -> Vec<Record> {
    let (start, end) = (new.start, new.start + new.bytes.len());
    let old_len = view.len();
    let same = |n: usize, offset: isize| -> bool {
        let o = n as isize + offset;
        o >= 0 && view.byte(o as usize) == Some(new[n])
    };
    let mut records = Vec::new();

    let mut scan = start;
    let mut len = 0usize;
    let mut pos = 0usize;
    let mut last_scan = start;
    let mut last_pos = start.min(old_len);
    let mut last_offset = last_pos as isize - last_scan as isize;

    while scan < end {
        let mut old_score = 0usize;
        scan += len;
        let mut scored_to = scan;
        while scan < end {
            (pos, len) = view.search(new.tail(scan));
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
            while last_scan + i < scan && last_pos + i < old_len {
                if view.byte(last_pos + i) == Some(new[last_scan + i]) {
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
                if view.byte(pos - i) == Some(new[scan - i]) {
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
                if view.byte(last_pos + forward - overlap + i)
                    == Some(new[last_scan + forward - overlap + i])
                {
                    s += 1;
                }
                if view.byte(pos - backward + i) == Some(new[scan - backward + i]) {
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

    /// A 12 MiB old image of compressible, repetitive and zero content and
    /// a new one with bytes changed, inserted, deleted and moved from far
    /// away.
    fn pair() -> (Vec<u8>, Vec<u8>) {
        let mut x: u64 = 0x0dd5_eed5_1234_5678;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let words: Vec<Vec<u8>> = (0..512)
            .map(|_| {
                (0..2 + next() % 9)
                    .map(|_| b'a' + (next() % 26) as u8)
                    .collect()
            })
            .collect();
        let mut old = Vec::with_capacity(12 << 20);
        while old.len() < 12 << 20 {
            match next() % 8 {
                0 => old.extend(std::iter::repeat_n(0u8, (next() % 65536) as usize)),
                1 if old.len() > 1 << 20 => {
                    // A copy of earlier content, as repeated files are.
                    let at = (next() as usize) % (old.len() - 65536);
                    let len = 4096 + (next() % 60000) as usize;
                    old.extend_from_within(at..at + len);
                }
                _ => {
                    for _ in 0..200 {
                        old.extend_from_slice(&words[(next() % 512) as usize]);
                        old.push(b' ');
                    }
                }
            }
        }
        old.truncate(12 << 20);
        let mut new = old.clone();
        for _ in 0..40 {
            let at = (next() as usize) % (new.len() - 100_000);
            match next() % 4 {
                0 => new[at..at + 200]
                    .iter_mut()
                    .for_each(|b| *b = b.wrapping_add(1)),
                1 => {
                    let ins: Vec<u8> = (0..1000).map(|_| next() as u8).collect();
                    new.splice(at..at, ins);
                }
                2 => {
                    new.drain(at..at + 3000);
                }
                _ => {
                    let from = (next() as usize) % (old.len() - 50_000);
                    new.splice(at..at, old[from..from + 50_000].iter().copied());
                }
            }
        }
        (old, new)
    }

    /// Apply `delta` to `old` as the device does.
    fn device_apply(old: &[u8], delta: &[u8], new_len: usize) -> Vec<u8> {
        let path = std::env::temp_dir().join(format!(
            "updraft-delta-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, old).unwrap();
        let file = File::open(&path).unwrap();
        let mut out = Vec::new();
        let mut patch = delta;
        let result = updraft::delta::apply(
            &file,
            old.len() as u64,
            &mut patch,
            new_len as u64,
            &mut |b: &[u8]| {
                out.extend_from_slice(b);
                Ok(())
            },
        );
        let _ = std::fs::remove_file(&path);
        result.unwrap();
        out
    }

    #[test]
    fn regions_rebuild_the_new_image_whatever_the_thread_count() {
        let (old, new) = pair();
        let opts = |threads| DeltaOptions {
            threads,
            memory_budget: 64 << 20,
            ..DeltaOptions::default()
        };
        assert_eq!(
            plan(old.len() as u64, new.len() as u64, &opts(1)),
            Plan::Regions
        );
        let r = Regional::plan(old.len(), &opts(2));
        assert!(r.workers >= 2, "two windows are matched at once: {r:?}");
        assert!(
            r.cap < old.len() / 2,
            "a window sees part of the old image: {r:?}"
        );
        let mut one = Vec::new();
        make(&old, &new, &opts(1), &mut one).unwrap();
        let mut two = Vec::new();
        make(&old, &new, &opts(2), &mut two).unwrap();
        assert!(one == two, "the delta depends on the thread count");
        assert!(
            device_apply(&old, &one, new.len()) == new,
            "the delta does not rebuild the new image"
        );

        // Matching the whole image does better, but regions come close.
        let mut whole = Vec::new();
        make(&old, &new, &DeltaOptions::default(), &mut whole).unwrap();
        assert!(device_apply(&old, &whole, new.len()) == new);
        assert!(
            one.len() < whole.len() * 3 / 2 + 4096,
            "regions {} bytes, whole image {} bytes",
            one.len(),
            whole.len()
        );
    }

    #[test]
    fn files_are_read_by_offset() {
        let (old, new) = pair();
        let dir = std::env::temp_dir();
        let (po, pn) = (
            dir.join(format!("updraft-delta-old-{}", std::process::id())),
            dir.join(format!("updraft-delta-new-{}", std::process::id())),
        );
        std::fs::write(&po, &old).unwrap();
        std::fs::write(&pn, &new).unwrap();
        let (fo, fnew) = (File::open(&po).unwrap(), File::open(&pn).unwrap());
        for budget in [64 << 20, DEFAULT_MEMORY_BUDGET] {
            let opts = DeltaOptions {
                threads: 2,
                memory_budget: budget,
                ..DeltaOptions::default()
            };
            let mut from_files = Vec::new();
            make_from(&fo, &fnew, &opts, &mut from_files).unwrap();
            let mut from_memory = Vec::new();
            make(&old, &new, &opts, &mut from_memory).unwrap();
            assert!(from_files == from_memory, "budget {budget}");
        }
        let _ = std::fs::remove_file(&po);
        let _ = std::fs::remove_file(&pn);
    }

    #[test]
    fn integers_are_sign_and_magnitude() {
        assert_eq!(encode(5), [5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode(-5), [5, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(encode(0), [0; 8]);
    }
}
