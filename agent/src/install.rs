//! The install pipeline: bytes from a [`Source`] into the target slot,
//! verified at every stage, in bounded memory.
//!
//! ```text
//! full:   artifact ─► frame (signed length) ─► zstd decode ─► sha256 vs frame table ─► slot writer
//! delta:  delta ─► state_dir spool ─► sha256 ─► patcher(active slot, spool) ─► slot writer
//! both:   fdatasync ─► drop page cache ─► read back ─► sha256 vs image
//! ```
//!
//! A full install from the first frame reads each range back while later
//! frames are written ([`crate::readback`]); a resumed one, and a delta,
//! read the whole slot back after the write ([`verify_slot`]).
//!
//! Each stage is a small function over `Read`/`Write`-like parts, so the
//! order of checks can be read top to bottom. A frame is written only after
//! its output hash matched the signed frame table; a corrupt or hostile byte
//! stream therefore never reaches the slot beyond the last good frame. Work
//! is interleaved with [`Ticker::tick`] calls (at least every few hundred
//! milliseconds, including while the network is stalled), which is how the
//! daemon keeps answering its control socket and how a stop request
//! interrupts an install at a safe point.
//!
//! This module never touches the bootloader or the state machine: it is
//! told which slot to write and reports what it did. Deciding *whether* to
//! install, and making the slot bootable, belong to [`crate::machine`].

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::bail;
use crate::error::{Context, Error, Kind, Result};
use crate::hash::{Hasher, Sha256};
use crate::manifest::{Delta, Frame, Image, Manifest};
use crate::progress::{Meter, Ticker};
use crate::readback::ReadBack;
use crate::slot::{SlotReader, SlotWriter};
use crate::source::Source;
use crate::worker::Feed;

/// Chunk size for reading compressed data, so ticks stay frequent on slow
/// links.
const READ_CHUNK: usize = 64 * 1024;

/// Result of streaming the full artifact.
#[derive(Debug, Default)]
pub struct FullOutcome {
    /// Compressed bytes read from the source.
    pub bytes_read: u64,
    /// True when the whole artifact and image hashes were checked while
    /// streaming (the transfer started at frame 0).
    pub hashed_in_stream: bool,
    /// True when the image hash was checked on the bytes read back from
    /// the slot while streaming (nothing is left to read back).
    pub read_back: bool,
}

/// Output offset of frame `index` in the image.
pub fn frame_out_offset(frames: &[Frame], index: usize) -> u64 {
    frames[..index].iter().map(|f| f.out_size).sum()
}

/// Verify frames already on the slot from `from` onwards and return the
/// first one that does not match (resume point). Reads the slot only.
pub fn probe_frames(
    slot: &Path,
    frames: &[Frame],
    from: usize,
    ticker: &mut dyn Ticker,
) -> Result<usize> {
    let reader = SlotReader::open(slot)?;
    let max_out = frames.iter().map(|f| f.out_size).max().unwrap_or(0) as usize;
    let mut buf = vec![0u8; max_out];
    let mut pos = frame_out_offset(frames, from.min(frames.len()));
    let total: u64 = frames.iter().map(|f| f.out_size).sum();
    let mut meter = Meter::new("verify", pos, total);
    for (i, f) in frames.iter().enumerate().skip(from) {
        let n = f.out_size as usize;
        if pos + f.out_size > reader.capacity() {
            return Ok(i);
        }
        reader.read_exact_at(&mut buf[..n], pos)?;
        if Sha256::of(&buf[..n]) != f.out_sha256 {
            return Ok(i);
        }
        pos += f.out_size;
        meter.advance(f.out_size);
        meter.tick(ticker)?;
    }
    Ok(frames.len())
}

/// Where a full-image write starts and what it checks on the way.
#[derive(Debug, Clone, Copy)]
pub struct FullOptions {
    /// First frame to fetch (resume point).
    pub start: usize,
    /// Hash the whole image while streaming (when the slot will not be read
    /// back).
    pub hash_image: bool,
    /// Read the slot back while writing it (from frame 0 only), and check
    /// the image hash on what the medium returns.
    pub read_back: bool,
}

/// What the caller does at the two moments that matter to the state machine.
pub struct WriteHooks<'a> {
    /// Runs once, right before the first byte goes to the slot (the caller
    /// takes the slot out of the boot order there, waiting for the
    /// bootloader through the ticker it is given).
    pub before_write: &'a mut dyn FnMut(&mut dyn Ticker) -> Result<()>,
    /// Runs after each durable sync point with the number of frames known
    /// to be on the medium.
    pub on_durable: &'a mut dyn FnMut(u64) -> Result<()>,
}

/// The slot's end of the frame pipeline: each verified frame written to
/// the slot, hashed into the image (when the slot will not be read back)
/// and, from frame 0 with a read-back, read back from the medium as the
/// device completes it.
struct SlotSink<'a, 'h> {
    writer: &'a mut SlotWriter,
    image_hash: Option<Hasher>,
    readback: Option<ReadBack>,
    before_write: &'h mut dyn FnMut(&mut dyn Ticker) -> Result<()>,
}

impl crate::pipeline::Sink for SlotSink<'_, '_> {
    fn prepare(&mut self, t: &mut dyn Ticker) -> Result<()> {
        (self.before_write)(t)
    }

    fn write(&mut self, _index: usize, data: &[u8]) -> Result<bool> {
        let writer = &mut *self.writer;
        let stepped = match self.image_hash.as_mut() {
            // The image hash of a frame runs while the frame is written: a
            // direct write leaves the processor idle until the device is
            // done, and the hash costs about as long.
            Some(h) => std::thread::scope(|s| {
                let hashing = std::thread::Builder::new()
                    .name("updraft-image-hash".into())
                    .stack_size(64 * 1024)
                    .spawn_scoped(s, || h.update(data))
                    .map_err(|e| Error::new(Kind::Io, format!("starting the image hash: {e}")))?;
                let stepped = writer.write_all(data);
                hashing
                    .join()
                    .map_err(|_| Error::new(Kind::Io, "the image hash panicked"))?;
                stepped
            })?,
            None => writer.write_all(data)?,
        };
        if let Some(rb) = self.readback.as_mut() {
            rb.complete_to(self.writer.completed());
        }
        Ok(stepped)
    }

    fn sync(&mut self) -> Result<()> {
        self.writer.sync()
    }
}

/// Stream the full artifact from frame `opts.start` into `writer`,
/// verifying each frame before writing it ([`crate::pipeline`]).
pub fn write_full(
    src: &mut Source,
    m: &Manifest,
    writer: &mut SlotWriter,
    opts: FullOptions,
    ticker: &mut dyn Ticker,
    hooks: WriteHooks<'_>,
) -> Result<FullOutcome> {
    let FullOptions {
        start,
        hash_image,
        read_back,
    } = opts;
    let WriteHooks {
        before_write,
        on_durable,
    } = hooks;
    let frames = &m.artifact.frames;
    if start >= frames.len() {
        return Ok(FullOutcome::default());
    }
    let from_zero = start == 0;
    // The whole-image hash is computed here only when the slot will not be
    // read back (the read-back checks it against the medium instead).
    let readback = if from_zero && read_back {
        Some(ReadBack::start(writer.path())?)
    } else {
        None
    };
    writer.seek(frame_out_offset(frames, start));
    let mut sink = SlotSink {
        writer,
        image_hash: (from_zero && hash_image).then(Hasher::new),
        readback,
        before_write,
    };
    let key = crate::encrypt::frame_key(m)?;
    let bytes_read =
        crate::pipeline::stream(src, &m.artifact, key, start, &mut sink, ticker, on_durable)?;
    let SlotSink {
        writer,
        image_hash,
        readback,
        ..
    } = sink;
    if let Some(h) = image_hash {
        let got = h.finish();
        if got != m.image.sha256 {
            bail!(
                Integrity,
                "image decodes to sha256 {got}, the manifest signs {} (the artifact itself verified)",
                m.image.sha256
            );
        }
    }
    let read_back = readback.is_some();
    if let Some(rb) = readback {
        writer.sync()?;
        let got = rb.finish(m.image.size, ticker)?;
        if got != m.image.sha256 {
            bail!(
                Integrity,
                "slot {} reads back sha256 {got}, expected {}",
                writer.path().display(),
                m.image.sha256
            );
        }
    }
    Ok(FullOutcome {
        bytes_read,
        hashed_in_stream: from_zero && (hash_image || read_back),
        read_back,
    })
}

/// Read the slot back from the medium and compare with the image hash.
pub fn verify_slot(slot: &Path, image: &Image, ticker: &mut dyn Ticker) -> Result<()> {
    let reader = SlotReader::open(slot)?;
    let mut meter = Meter::new("verify", 0, image.size);
    let got = reader.hash_prefix(image.size, &mut |done| {
        meter.advance(done - meter.done());
        meter.tick(ticker)
    })?;
    if got != image.sha256 {
        bail!(
            Integrity,
            "slot {} reads back sha256 {got}, expected {}",
            slot.display(),
            image.sha256
        );
    }
    Ok(())
}

/// Hash the first `len` bytes of a slot (delta source check).
pub fn hash_slot_prefix(slot: &Path, len: u64, ticker: &mut dyn Ticker) -> Result<Option<Sha256>> {
    let reader = SlotReader::open(slot)?;
    if reader.capacity() < len {
        return Ok(None);
    }
    let mut meter = Meter::new("hash-active", 0, len);
    let h = reader.hash_prefix(len, &mut |done| {
        meter.advance(done - meter.done());
        meter.tick(ticker)
    })?;
    Ok(Some(h))
}

/// Download a delta into `spool`, resuming a partial file with a Range
/// request, and verify its hash before anything parses it.
pub fn download_delta(
    src: &mut Source,
    d: &Delta,
    spool: &Path,
    ticker: &mut dyn Ticker,
) -> Result<u64> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(spool)
        .with_context(|| format!("opening delta spool {}", spool.display()))?;
    let mut have = file
        .metadata()
        .with_context(|| format!("{}", spool.display()))?
        .len();
    if have > d.size {
        file.set_len(0)?;
        have = 0;
    }
    let mut fetched = 0;
    if have < d.size {
        file.seek(SeekFrom::Start(have))?;
        let mut feed = Feed::open(src.clone(), d.url.clone(), have, d.size, READ_CHUNK);
        let mut meter = Meter::new("download", have, d.size);
        let mut buf = vec![0u8; READ_CHUNK];
        while have < d.size {
            let want = ((d.size - have) as usize).min(READ_CHUNK);
            match feed.read_some(&mut buf[..want])? {
                Some(0) => bail!(Network, "delta stream ended {} bytes early", d.size - have),
                Some(n) => {
                    file.write_all(&buf[..n])
                        .with_context(|| format!("writing delta spool {}", spool.display()))?;
                    have += n as u64;
                    fetched += n as u64;
                    meter.advance(n as u64);
                }
                None => {}
            }
            meter.tick(ticker)?;
        }
        if let Some(p) = feed.preferred() {
            src.set_preferred(p);
        }
        feed.finish()?;
        file.sync_data()
            .with_context(|| format!("fsync delta spool {}", spool.display()))?;
    }
    file.seek(SeekFrom::Start(0))?;
    let mut h = Hasher::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let got = h.finish();
    if got != d.sha256 {
        drop(file);
        let _ = std::fs::remove_file(spool);
        bail!(
            Integrity,
            "delta sha256 is {got}, the manifest signs {}",
            d.sha256
        );
    }
    Ok(fetched)
}

/// Apply a verified delta from the active slot into `writer`, hashing the
/// output; fails unless it is exactly the signed image. With `key` (an
/// encrypted release) the spool holds the sealed delta: it is opened chunk
/// by chunk as the patcher reads it, and nothing of a chunk whose tag does
/// not verify reaches the patcher.
pub fn apply_delta(
    active: &Path,
    from_size: u64,
    spool: &Path,
    image: &Image,
    key: Option<&crate::encrypt::chunks::ChunkKey>,
    writer: &mut SlotWriter,
    ticker: &mut dyn Ticker,
) -> Result<()> {
    let old = SlotReader::open(active)?;
    if old.capacity() < from_size {
        bail!(
            Slot,
            "active slot {} is smaller than the delta's source",
            active.display()
        );
    }
    let file = File::open(spool).with_context(|| format!("opening delta {}", spool.display()))?;
    let mut plain = None;
    let mut sealed = None;
    let patch: &mut dyn Read = match key {
        None => plain.insert(io::BufReader::with_capacity(256 * 1024, file)),
        Some(k) => sealed.insert(crate::encrypt::chunks::OpenReader::new(k, file)),
    };
    let mut hash = Hasher::new();
    let mut meter = Meter::new("apply", 0, image.size);
    writer.seek(0);
    let mut sink = |block: &[u8]| -> Result<()> {
        hash.update(block);
        writer.write_all(block)?;
        meter.advance(block.len() as u64);
        meter.tick(ticker)
    };
    let applied = crate::delta::apply(&old, from_size, patch, image.size, &mut sink);
    if let Some(r) = sealed.as_mut() {
        // A refused chunk: its own error (kind Integrity) rather than the
        // patcher's read error, so the delta falls back as a corrupt one does.
        if let Some(why) = r.failure() {
            return Err(why.wrap(format!("opening the sealed delta {}", spool.display())));
        }
        applied?;
        if !r.complete() {
            bail!(
                Integrity,
                "delta {}: the patch ended before the final sealed chunk",
                spool.display()
            );
        }
    } else {
        applied?;
    }
    let got = hash.finish();
    if got != image.sha256 {
        bail!(
            Integrity,
            "delta output has sha256 {got}, the manifest signs {} (delta made for another source?)",
            image.sha256
        );
    }
    Ok(())
}

/// Keep an error's kind, but say which release and slot it concerns.
pub fn context(e: Error, version: &str, slot: crate::slot::SlotName) -> Error {
    e.wrap(format!("release {version} into slot {slot}"))
}
