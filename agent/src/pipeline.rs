//! The frame pipeline: an artifact's frames fetched, decoded, verified and
//! handed to a sink, in bounded memory, resumable at any frame.
//!
//! ```text
//! Source ─► Feed (helper thread: network) ─► Frames (updraft-decode-N: frame
//!   table, artifact hash, zstd, output hash vs frame table) ─► in order ─►
//!   Sink::write ─► sync points
//! ```
//!
//! Any artifact of the manifest's framed format goes through here: today a
//! slot's full image ([`crate::install`] is its sink: the slot writer, the
//! read-back and the image hash); tomorrow a component's payload. What the
//! pipeline guarantees every sink: only frames whose decoded bytes matched
//! their signed hash reach it, in order; the artifact's own hash is checked
//! when the stream starts at frame 0; a sync point is offered at most
//! every eight frames the sink says it may sync after, and the frames known
//! durable there are told to the caller's checkpoint; a stream that stops
//! for any reason first makes what was written durable and tells it, so
//! the next attempt starts after it. Work is interleaved with
//! [`Ticker::tick`], so the daemon keeps serving and a stop interrupts the
//! stream at a frame boundary.
//!
//! The pipeline never decides where bytes go or what they mean: that is
//! the sink's.

use std::sync::mpsc::{RecvTimeoutError, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::artifact::FrameDecoder;
use crate::bail;
use crate::direct_io::AlignedBuf;
use crate::encrypt::FrameKey;
use crate::error::{Error, Kind, Result};
use crate::hash::{Hasher, Sha256};
use crate::manifest::{Artifact, Frame};
use crate::progress::{Meter, Ticker};
use crate::source::Source;
use crate::worker::{Feed, Inbox, Outbox, TICK, channel};

/// Bytes a [`Feed`] reads at a time for an artifact.
const READ_CHUNK: usize = 64 * 1024;

/// Frames written between two offered sync points, at most.
const SYNC_EVERY: usize = 8;

/// Where verified frames go.
pub trait Sink {
    /// Runs once, right before the first frame is handed over (a slot is
    /// taken out of the boot order there, waiting through `t`).
    fn prepare(&mut self, t: &mut dyn Ticker) -> Result<()>;

    /// Take frame `index`'s verified bytes. `true` when a sync point may
    /// follow (the bytes handed over so far end where the medium can be
    /// made durable).
    fn write(&mut self, index: usize, data: &[u8]) -> Result<bool>;

    /// Make everything written so far durable.
    fn sync(&mut self) -> Result<()>;
}

/// Frames on the medium, counted from the first frame of the artifact,
/// told after each sync point.
pub type Checkpoint<'a> = &'a mut dyn FnMut(u64) -> Result<()>;

/// Stream `artifact` from frame `start` into `sink`; the compressed bytes
/// read. From frame 0 the artifact's hash is checked too. With `key`, each
/// frame is checked against its signed ciphertext hash and decrypted
/// before it is decoded ([`crate::encrypt`]).
pub fn stream(
    src: &mut Source,
    artifact: &Artifact,
    key: Option<Arc<FrameKey>>,
    start: usize,
    sink: &mut dyn Sink,
    ticker: &mut dyn Ticker,
    on_durable: Checkpoint<'_>,
) -> Result<u64> {
    let frames = &artifact.frames;
    if start >= frames.len() {
        return Ok(0);
    }
    let offset = frames[start].offset;
    let feed = Feed::open(
        src.clone(),
        artifact.url.clone(),
        offset,
        artifact.size,
        READ_CHUNK,
    );
    let mut stream = Frames::spawn(
        feed,
        frames.clone(),
        start,
        (start == 0).then_some(artifact.sha256),
        key,
    );
    let mut meter = Meter::new("download", offset, artifact.size);
    let mut since_sync = 0usize;
    let mut prepared = false;
    let mut written = start as u64;
    let mut recorded = start as u64;
    let streamed = (|| -> Result<()> {
        loop {
            match stream.wait()? {
                FrameEvent::Read(n) => meter.advance(n),
                FrameEvent::Idle => {}
                FrameEvent::Frame { index, data } => {
                    if !prepared {
                        sink.prepare(&mut *ticker)?;
                        prepared = true;
                    }
                    let stepped = sink.write(index, &data)?;
                    written = (index + 1) as u64;
                    stream.recycle(data);
                    since_sync += 1;
                    if stepped && since_sync >= SYNC_EVERY {
                        sink.sync()?;
                        on_durable(written)?;
                        recorded = written;
                        since_sync = 0;
                    }
                }
                FrameEvent::End { preferred } => {
                    if let Some(p) = preferred {
                        src.set_preferred(p);
                    }
                    return Ok(());
                }
            }
            meter.tick(ticker)?;
        }
    })();
    if let Err(e) = streamed {
        // A stream that stops (the network, its deadline, a frame that
        // does not verify, a stop) keeps what it wrote: the frames written
        // since the last sync point are made durable and recorded, so that
        // whatever attempt comes next starts after them. Best effort: the
        // error is what the caller hears.
        if written > recorded && sink.sync().is_ok() {
            let _ = on_durable(written);
        }
        return Err(e);
    }
    Ok(artifact.size - offset)
}

/// What [`Frames::wait`] yields.
#[derive(Debug)]
enum FrameEvent {
    /// This many more compressed bytes arrived (progress only).
    Read(u64),
    /// Frame `index` decoded and matched its signed output hash.
    Frame { index: usize, data: AlignedBuf },
    /// Nothing happened within [`TICK`]: tick and ask again.
    Idle,
    /// Every frame was delivered, the stream ended at its signed size and,
    /// when asked for, the artifact hash matched. `preferred` is the base
    /// URL index that served the transfer.
    End { preferred: Option<usize> },
}

/// What the helper threads send the caller.
enum FrameMsg {
    Read(u64),
    Frame(usize, AlignedBuf),
    /// Every frame was handed to a decoder and the stream ended as signed.
    End(Option<usize>),
    /// Frame `.0` (the artifact's end: the frame count) cannot be
    /// delivered; the frames before it still can.
    Failed(usize, Error),
}

/// Decoded bytes the pipeline holds at most, in buffers of the largest
/// frame's output: two at the least, whatever the frames' size. Frames of
/// 2 MiB (the publisher's default) then keep three buffers in flight (two
/// decoding, one being written), frames of 4 MiB two. The budget is what
/// keeps a whole install within 16 MiB of resident memory.
const DECODED_BUDGET: usize = 6 << 20;

/// Decode threads at most.
const MAX_DECODERS: usize = 4;

/// How many frame buffers circulate and how many threads decode into
/// them, for frames of `max_out` bytes on `cores` processors. A decoder
/// holds one buffer while it decodes and the caller at least one while it
/// writes, so decoders number at most one less than the buffers.
fn shape(max_out: usize, cores: usize) -> (usize, usize) {
    let buffers = (DECODED_BUDGET / max_out.max(1)).max(2);
    let decoders = cores.min(buffers - 1).clamp(1, MAX_DECODERS);
    (buffers, decoders)
}

/// An artifact's frames, read from a [`Feed`] and decoded on one or more
/// helper threads (`updraft-decode-N`). Each thread takes a buffer, then
/// the next frame: it reads the frame's compressed bytes (hashing them
/// into the artifact hash, in order, under a lock), decodes them into the
/// buffer and checks the decoded bytes against the frame's signed
/// `out_sha256` before handing the frame over, so only verified frames
/// come out, in order ([`Frames::wait`] puts frames that finish early back
/// in order).
///
/// Decoding and hashing a frame cost about the same; with two cores and
/// small enough frames two threads keep both busy while the caller
/// writes: the write of frame N overlaps with the decoding of the next
/// ones. Memory is bounded by [`shape`]: a fixed number of output buffers
/// circulates and each thread holds one compressed frame. A thread takes
/// a buffer *before* it takes the next frame, so the lowest frame not yet
/// delivered always has a buffer and the pipeline cannot wedge with every
/// buffer held by frames waiting for it. The threads never touch a slot;
/// the caller writes, syncs and records progress in order.
struct Frames {
    rx: Inbox<FrameMsg>,
    spare: Outbox<AlignedBuf>,
    /// The next frame to hand over.
    next: usize,
    /// Frames decoded ahead of `next`.
    early: Vec<(usize, AlignedBuf)>,
    /// The end, once told: the transfer's preferred base URL.
    end: Option<Option<usize>>,
    /// The first frame that cannot be delivered, and why.
    failed: Option<(usize, Error)>,
    count: usize,
    ended: bool,
}

impl Frames {
    /// Decode `frames[start..]` from `feed`, which must be positioned at
    /// frame `start`. With `artifact_sha256`, the compressed stream (which
    /// then starts at frame 0) is hashed and checked at the end.
    fn spawn(
        feed: Feed,
        frames: Vec<Frame>,
        start: usize,
        artifact_sha256: Option<Sha256>,
        key: Option<Arc<FrameKey>>,
    ) -> Frames {
        let max_out = frames.iter().map(|f| f.out_size).max().unwrap_or(0) as usize;
        let max_in = frames.iter().map(|f| f.size).max().unwrap_or(0) as usize;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (buffers, decoders) = shape(max_out, cores);
        let count = frames.len();
        let (tx, rx) = channel::<FrameMsg>(buffers + 2);
        let (spare, spare_rx) = channel::<AlignedBuf>(buffers);
        for _ in 0..buffers {
            let _ = spare.try_send(AlignedBuf::default());
        }
        let spare_rx = Arc::new(Mutex::new(spare_rx));
        let reading = Arc::new(Mutex::new(Reading {
            feed: Some(feed),
            frames,
            next: start,
            artifact_hash: artifact_sha256.map(|want| (Hasher::new(), want)),
            progress: Unreported {
                bytes: 0,
                since: Instant::now(),
            },
            over: false,
        }));
        let mut out = Frames {
            rx,
            spare,
            next: start,
            early: Vec::new(),
            end: None,
            failed: None,
            count,
            ended: false,
        };
        for n in 0..decoders {
            let stage = DecodeStage {
                tx: tx.clone(),
                spare: spare_rx.clone(),
                reading: reading.clone(),
                max_in,
                key: key.clone(),
            };
            let spawned = std::thread::Builder::new()
                .name(format!("updraft-decode-{n}"))
                .stack_size(256 * 1024)
                .spawn(move || stage.run());
            if let Err(e) = spawned {
                if n == 0 {
                    out.failed = Some((
                        start,
                        Error::new(Kind::Io, format!("starting the decode thread: {e}")),
                    ));
                }
                // With one thread or more running, fewer only decode slower.
                break;
            }
        }
        out
    }

    /// The next event, waiting at most [`TICK`].
    fn wait(&mut self) -> Result<FrameEvent> {
        if self.ended {
            return Err(Error::new(Kind::Io, "artifact stream already ended"));
        }
        loop {
            if let Some(at) = self.early.iter().position(|(i, _)| *i == self.next) {
                let (index, data) = self.early.swap_remove(at);
                self.next += 1;
                return Ok(FrameEvent::Frame { index, data });
            }
            if self.failed.as_ref().is_some_and(|(at, _)| *at <= self.next) {
                self.ended = true;
                if let Some((_, e)) = self.failed.take() {
                    return Err(e);
                }
            }
            if self.next == self.count {
                if let Some(preferred) = self.end {
                    self.ended = true;
                    return Ok(FrameEvent::End { preferred });
                }
            }
            match self.rx.recv_timeout(TICK) {
                Ok(FrameMsg::Read(n)) => return Ok(FrameEvent::Read(n)),
                Ok(FrameMsg::Frame(index, data)) => {
                    if index < self.next || index >= self.count {
                        self.ended = true;
                        return Err(Error::new(
                            Kind::Io,
                            format!("a decode thread sent frame {index} out of turn"),
                        ));
                    }
                    self.early.push((index, data));
                }
                Ok(FrameMsg::End(preferred)) => self.end = Some(preferred),
                Ok(FrameMsg::Failed(at, e)) => {
                    if self.failed.as_ref().is_none_or(|(first, _)| at < *first) {
                        self.failed = Some((at, e));
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Ok(FrameEvent::Idle),
                Err(RecvTimeoutError::Disconnected) => {
                    self.ended = true;
                    return Err(Error::new(Kind::Io, "decode threads ended unexpectedly"));
                }
            }
        }
    }

    /// Give a frame's buffer back once its bytes are written.
    fn recycle(&mut self, buf: AlignedBuf) {
        let _ = self.spare.try_send(buf);
    }
}

/// The compressed stream, shared by the decode threads: one reads at a
/// time, so frames are taken, and the artifact hashed, in order.
struct Reading {
    /// `None` once the stream ended.
    feed: Option<Feed>,
    /// The signed frame table.
    frames: Vec<Frame>,
    /// The next frame to read.
    next: usize,
    /// The artifact's hash so far, and the signed one (from frame 0 only).
    artifact_hash: Option<(Hasher, Sha256)>,
    progress: Unreported,
    /// The end or a failure was told: no thread reads any more.
    over: bool,
}

/// Compressed bytes read but not yet reported, and when bytes last were.
struct Unreported {
    bytes: u64,
    since: Instant,
}

/// What a decode thread does next.
enum Next {
    Decode(usize, Frame),
    /// Nothing: the stream is over, or the caller went away.
    Stop,
}

/// How often progress is reported while a frame is read.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

impl Reading {
    /// Read the next frame into `compressed`, or tell the caller the end
    /// (or why not) once the last frame was read.
    fn take(&mut self, tx: &Outbox<FrameMsg>, compressed: &mut Vec<u8>) -> Next {
        if self.over {
            return Next::Stop;
        }
        let i = self.next;
        let Some(f) = self.frames.get(i).copied() else {
            self.over = true;
            let end = self.frames.len();
            let msg = match self.finish() {
                Ok(preferred) => FrameMsg::End(preferred),
                Err(e) => FrameMsg::Failed(end, e),
            };
            let _ = tx.send(msg);
            return Next::Stop;
        };
        compressed.clear();
        compressed.resize(f.size as usize, 0);
        match self.fill(tx, compressed) {
            Ok(true) => {}
            Ok(false) => {
                self.over = true;
                return Next::Stop;
            }
            Err(e) => {
                self.over = true;
                let e = e.wrap(format!("reading artifact frame {i} at offset {}", f.offset));
                let _ = tx.send(FrameMsg::Failed(i, e));
                return Next::Stop;
            }
        }
        if let Some((h, _)) = self.artifact_hash.as_mut() {
            h.update(compressed);
        }
        self.next += 1;
        if !self.progress.flush(tx, true) {
            self.over = true;
            return Next::Stop;
        }
        Next::Decode(i, f)
    }

    /// After the last frame: the stream ends at its signed size and, when
    /// asked for, the artifact hash matches; the preferred base URL.
    fn finish(&mut self) -> Result<Option<usize>> {
        let Some(feed) = self.feed.take() else {
            return Ok(None);
        };
        let preferred = feed.preferred();
        feed.finish()?;
        if let Some((h, want)) = self.artifact_hash.take() {
            let got = h.finish();
            if got != want {
                bail!(
                    Integrity,
                    "artifact sha256 is {got}, the manifest signs {want}"
                );
            }
        }
        Ok(preferred)
    }

    /// Fill `buf` from the feed; `Ok(false)` when the caller went away.
    fn fill(&mut self, tx: &Outbox<FrameMsg>, buf: &mut [u8]) -> Result<bool> {
        let Some(feed) = self.feed.as_mut() else {
            bail!(Io, "the artifact stream already ended");
        };
        let mut n = 0;
        while n < buf.len() {
            match feed.read_some(&mut buf[n..])? {
                Some(0) => bail!(Network, "stream ended {} bytes early", buf.len() - n),
                Some(k) => {
                    n += k;
                    self.progress.bytes += k as u64;
                    // Progress at most every PROGRESS_EVERY: each message
                    // wakes the state machine.
                    if self.progress.since.elapsed() >= PROGRESS_EVERY
                        && !self.progress.flush(tx, false)
                    {
                        return Ok(false);
                    }
                }
                // Stalled: make sure someone is still listening.
                None => {
                    if !self.progress.flush(tx, false) {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }
}

impl Unreported {
    /// Report the bytes without blocking (a full channel keeps them for
    /// later), or wait when `block`. False when the caller went away.
    fn flush(&mut self, tx: &Outbox<FrameMsg>, block: bool) -> bool {
        if block && self.bytes == 0 {
            return true;
        }
        let msg = FrameMsg::Read(self.bytes);
        // Err(true): not sent but still listened to (the channel is full).
        let sent = if block {
            tx.send(msg).map_err(|_| false)
        } else {
            tx.try_send(msg)
                .map_err(|e| matches!(e, TrySendError::Full(())))
        };
        match sent {
            Ok(()) => {
                self.bytes = 0;
                self.since = Instant::now();
                true
            }
            Err(listening) => listening,
        }
    }
}

/// A decode thread's side of [`Frames`].
struct DecodeStage {
    tx: Outbox<FrameMsg>,
    spare: Arc<Mutex<Inbox<AlignedBuf>>>,
    reading: Arc<Mutex<Reading>>,
    /// The largest compressed frame.
    max_in: usize,
    /// The artifact's frame key, when it is encrypted.
    key: Option<Arc<FrameKey>>,
}

impl DecodeStage {
    /// Take a buffer, then a frame; decode and verify it into the buffer
    /// and hand it over; until the frames or the caller end.
    fn run(self) {
        let mut decoder = match FrameDecoder::new() {
            Ok(d) => d,
            Err(e) => {
                let at = lock(&self.reading).next;
                let _ = self.tx.send(FrameMsg::Failed(at, e));
                return;
            }
        };
        // Sized once for the largest frame: growing it frame by frame
        // would leave the smaller buffers behind in the heap.
        let mut compressed = Vec::with_capacity(self.max_in);
        loop {
            let Some(mut out) = lock(&self.spare).recv() else {
                return;
            };
            let Next::Decode(index, f) = lock(&self.reading).take(&self.tx, &mut compressed) else {
                return;
            };
            let decoded = match self.key.as_deref() {
                // The ciphertext is checked against its signed hash and
                // the tag before a byte is decrypted; the zstd frame is
                // then checked as any other.
                Some(key) => key.open(index, f.out_size, &mut compressed).and_then(|n| {
                    let plain = Frame {
                        size: n as u64,
                        ..f
                    };
                    decoder.decode_into(index, &plain, &compressed[..n], &mut out)
                }),
                None => decoder.decode_into(index, &f, &compressed, &mut out),
            };
            let msg = match decoded {
                Ok(()) => FrameMsg::Frame(index, out),
                Err(e) => FrameMsg::Failed(index, e),
            };
            if self.tx.send(msg).is_err() {
                return;
            }
        }
    }
}

/// A shared value, locked; a thread that panicked holding it left no
/// partial state that matters (the stream then fails as a whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    /// `n` frames of `size` bytes each, compressed independently: the
    /// artifact bytes, the frame table, and the decoded image.
    fn artifact(n: usize, size: usize) -> (Vec<u8>, Vec<Frame>, Vec<u8>) {
        let image: Vec<u8> = (0..n * size).map(|i| (i * 7 / 3) as u8).collect();
        let mut art = Vec::new();
        let mut frames = Vec::new();
        for chunk in image.chunks(size) {
            let c = zstd::bulk::compress(chunk, 3).unwrap();
            frames.push(Frame {
                offset: art.len() as u64,
                size: c.len() as u64,
                out_size: chunk.len() as u64,
                out_sha256: Sha256::of(chunk),
            });
            art.extend_from_slice(&c);
        }
        (art, frames, image)
    }

    fn frames_over(art: &[u8], frames: &[Frame], sha: Option<Sha256>) -> Frames {
        let feed = Feed::spawn(Box::new(io::Cursor::new(art.to_vec())), 4096);
        Frames::spawn(feed, frames.to_vec(), 0, sha, None)
    }

    /// [`artifact`], each frame sealed under a content key: the
    /// ciphertext artifact, its frame table, the image and the opening key.
    fn sealed_artifact(n: usize, size: usize) -> (Vec<u8>, Vec<Frame>, Vec<u8>, Arc<FrameKey>) {
        use crate::encrypt::{ContentKey, SLOT_ARTIFACT};
        let (plain, frames, image) = artifact(n, size);
        let content = ContentKey::random().unwrap();
        let seal = FrameKey::derive(&content, SLOT_ARTIFACT, vec![]).unwrap();
        let (mut art, mut sealed, mut hashes) = (Vec::new(), Vec::new(), Vec::new());
        for (i, f) in frames.iter().enumerate() {
            let mut c = plain[f.offset as usize..(f.offset + f.size) as usize].to_vec();
            seal.seal(i, f.out_size, &mut c).unwrap();
            hashes.push(Sha256::of(&c));
            sealed.push(Frame {
                offset: art.len() as u64,
                size: c.len() as u64,
                ..*f
            });
            art.extend_from_slice(&c);
        }
        let open = FrameKey::derive(&content, SLOT_ARTIFACT, hashes).unwrap();
        (art, sealed, image, Arc::new(open))
    }

    /// The indices delivered before the stream ended, and how it ended.
    fn drain(mut s: Frames) -> (Vec<usize>, Vec<u8>, Result<()>) {
        let (mut good, mut out) = (Vec::new(), Vec::new());
        loop {
            match s.wait() {
                Ok(FrameEvent::Frame { index, data }) => {
                    good.push(index);
                    out.extend_from_slice(&data);
                    s.recycle(data);
                }
                Ok(FrameEvent::End { .. }) => return (good, out, Ok(())),
                Ok(_) => {}
                Err(e) => return (good, out, Err(e)),
            }
        }
    }

    #[test]
    fn sealed_frames_decrypt_and_a_tampered_swapped_or_truncated_one_never_reaches_the_sink() {
        let (art, frames, image, key) = sealed_artifact(5, 30_000);
        let over = |art: &[u8], start: usize| {
            let feed = Feed::spawn(
                Box::new(io::Cursor::new(
                    art[frames[start].offset as usize..].to_vec(),
                )),
                4096,
            );
            let sha = (start == 0).then(|| Sha256::of(art));
            Frames::spawn(feed, frames.clone(), start, sha, Some(key.clone()))
        };
        let (good, out, end) = drain(over(&art, 0));
        assert_eq!((good.len(), out == image, end.is_ok()), (5, true, true));
        // Resuming at a frame boundary decrypts from there.
        let (good, out, end) = drain(over(&art, 3));
        end.unwrap();
        assert_eq!(good, vec![3, 4]);
        assert_eq!(out, image[3 * 30_000..]);
        // A flipped ciphertext byte in frame 2.
        let mut tampered = art.clone();
        tampered[frames[2].offset as usize + 7] ^= 1;
        let (good, _, end) = drain(over(&tampered, 0));
        assert_eq!(good, vec![0, 1]);
        assert!(
            end.unwrap_err()
                .to_string()
                .contains("ciphertext hashes to")
        );
        // Frames 1 and 2 swapped (same sizes).
        let mut swapped = art.clone();
        let (f1, f2) = (frames[1], frames[2]);
        if f1.size == f2.size {
            let a = art[f1.offset as usize..(f1.offset + f1.size) as usize].to_vec();
            let b = art[f2.offset as usize..(f2.offset + f2.size) as usize].to_vec();
            swapped[f1.offset as usize..(f1.offset + f1.size) as usize].copy_from_slice(&b);
            swapped[f2.offset as usize..(f2.offset + f2.size) as usize].copy_from_slice(&a);
            let (good, _, end) = drain(over(&swapped, 0));
            assert_eq!(good, vec![0]);
            assert!(end.is_err());
        }
        // The artifact cut inside frame 4.
        let cut = &art[..art.len() - 5];
        let (good, _, end) = drain(over(cut, 0));
        assert_eq!(good, vec![0, 1, 2, 3]);
        assert!(end.is_err());
    }

    #[test]
    fn frames_arrive_verified_and_in_order_then_end() {
        let (art, frames, image) = artifact(6, 50_000);
        let mut s = frames_over(&art, &frames, Some(Sha256::of(&art)));
        let mut out = Vec::new();
        let mut next_index = 0;
        let mut read = 0;
        loop {
            match s.wait().unwrap() {
                FrameEvent::Frame { index, data } => {
                    assert_eq!(index, next_index);
                    next_index += 1;
                    out.extend_from_slice(&data);
                    s.recycle(data);
                }
                FrameEvent::Read(n) => read += n,
                FrameEvent::Idle => {}
                FrameEvent::End { .. } => break,
            }
        }
        assert_eq!(out, image);
        assert_eq!(read, art.len() as u64);
    }

    #[test]
    fn a_frame_that_does_not_verify_stops_the_stream_after_the_good_ones() {
        let (art, mut frames, _) = artifact(5, 30_000);
        frames[2].out_sha256 = Sha256::of(b"something else");
        let mut s = frames_over(&art, &frames, None);
        let mut good = Vec::new();
        let err = loop {
            match s.wait() {
                Ok(FrameEvent::Frame { index, data }) => {
                    good.push(index);
                    s.recycle(data);
                }
                Ok(FrameEvent::End { .. }) => panic!("a bad frame was accepted"),
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        assert_eq!(good, vec![0, 1]);
        assert_eq!(err.kind(), Kind::Integrity);
        assert!(err.to_string().contains("artifact frame 2"), "{err}");
    }

    #[test]
    fn a_wrong_artifact_hash_fails_at_the_end() {
        let (art, frames, _) = artifact(3, 20_000);
        let mut s = frames_over(&art, &frames, Some(Sha256::of(b"not it")));
        let err = loop {
            match s.wait() {
                Ok(FrameEvent::Frame { data, .. }) => s.recycle(data),
                Ok(FrameEvent::End { .. }) => panic!("the artifact hash was not checked"),
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("artifact sha256 is"), "{err}");
    }

    #[test]
    fn the_frame_size_decides_how_many_buffers_circulate_and_decoders_fill_them() {
        const MIB: usize = 1 << 20;
        // (largest frame output, cores) → (buffers, decoders)
        let rows = [
            ((4 * MIB, 2), (2, 1)),
            ((4 * MIB, 1), (2, 1)),
            ((2 * MIB, 2), (3, 2)),
            ((2 * MIB, 1), (3, 1)),
            ((2 * MIB, 8), (3, 2)),
            ((MIB, 2), (6, 2)),
            ((MIB, 8), (6, 4)),
            ((8 * MIB, 4), (2, 1)),
            ((16 * MIB, 2), (2, 1)),
            ((3 * MIB, 2), (2, 1)),
            ((0, 2), (DECODED_BUDGET, 2)),
        ];
        for ((max_out, cores), want) in rows {
            assert_eq!(
                shape(max_out, cores),
                want,
                "{max_out} bytes, {cores} cores"
            );
        }
    }

    #[test]
    fn no_more_buffers_are_out_than_the_shape_allows() {
        // Frames of a quarter of the budget: four buffers.
        let size = DECODED_BUDGET / 4;
        let (art, frames, image) = artifact(9, size);
        let mut s = frames_over(&art, &frames, None);
        let mut held = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < deadline {
            if let FrameEvent::Frame { index, data } = s.wait().unwrap() {
                held.push((index, data));
            }
        }
        // Every buffer is out: no fifth frame comes until one goes back.
        assert_eq!(
            held.iter().map(|h| h.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        let (_, data) = held.remove(0);
        s.recycle(data);
        let index = loop {
            if let FrameEvent::Frame { index, data } = s.wait().unwrap() {
                assert_eq!(&data[..], &image[4 * size..5 * size]);
                break index;
            }
        };
        assert_eq!(index, 4);
    }
}
