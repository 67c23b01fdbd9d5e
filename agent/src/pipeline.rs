//! The frame pipeline: an artifact's frames fetched, decoded, verified and
//! handed to a sink, in bounded memory, resumable at any frame.
//!
//! ```text
//! Source ─► Feed (helper thread: network) ─► Frames (updraft-decode: frame table,
//!   zstd, artifact hash) ─► output hash vs frame table ─► Sink::write ─► sync points
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
use std::time::{Duration, Instant};

use crate::artifact::{FrameDecoder, check_output};
use crate::bail;
use crate::direct_io::AlignedBuf;
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
/// read. From frame 0 the artifact's hash is checked too.
pub fn stream(
    src: &mut Source,
    artifact: &Artifact,
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

/// What the decode thread sends.
enum FrameMsg {
    Read(u64),
    Frame(usize, AlignedBuf),
    End(Option<usize>),
    Failed(Error),
}

/// An artifact's frames, read from a [`Feed`] and decoded on a helper
/// thread (`updraft-decode`), so that decoding frame N+1 overlaps with
/// hashing and writing frame N.
///
/// The thread checks each compressed frame against the signed frame table
/// (size, header, window) and hashes the artifact; [`Frames::wait`] hashes
/// each decoded frame on the caller's thread and hands it over only when it
/// matches its signed `out_sha256`, so only verified frames come out.
/// Splitting the work so keeps both cores busy: decoding alone is about as
/// costly as hashing the output. Exactly two output buffers
/// circulate: the decode thread waits for the caller to give one back
/// ([`Frames::recycle`]) before it hands over the next frame, so memory is
/// bounded by two frames whatever the image size. The thread never touches
/// a slot; the caller writes, syncs and records progress in order.
struct Frames {
    /// The signed frame table, to check each decoded frame's hash.
    frames: Vec<Frame>,
    rx: Inbox<FrameMsg>,
    spare: Outbox<AlignedBuf>,
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
    ) -> Frames {
        let table = frames.clone();
        let (tx, rx) = channel::<FrameMsg>(1);
        let (spare, spare_rx) = channel::<AlignedBuf>(2);
        // The second buffer; the decoder allocates the first itself.
        let _ = spare.try_send(AlignedBuf::default());
        let errors = tx.clone();
        let spawned = std::thread::Builder::new()
            .name("updraft-decode".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let stage = DecodeStage {
                    tx: &tx,
                    spare: &spare_rx,
                    unreported: 0,
                    last_report: Instant::now(),
                };
                match stage.run(feed, &frames, start, artifact_sha256) {
                    Ok(Some(preferred)) => {
                        let _ = tx.send(FrameMsg::End(preferred));
                    }
                    // The caller went away: nothing to tell.
                    Ok(None) => {}
                    Err(e) => {
                        let _ = tx.send(FrameMsg::Failed(e));
                    }
                }
            });
        if let Err(e) = spawned {
            let _ = errors.try_send(FrameMsg::Failed(Error::new(
                Kind::Io,
                format!("starting the decode thread: {e}"),
            )));
        }
        Frames {
            frames: table,
            rx,
            spare,
            ended: false,
        }
    }

    /// The next event, waiting at most [`TICK`].
    fn wait(&mut self) -> Result<FrameEvent> {
        if self.ended {
            return Err(Error::new(Kind::Io, "artifact stream already ended"));
        }
        match self.rx.recv_timeout(TICK) {
            Ok(FrameMsg::Read(n)) => Ok(FrameEvent::Read(n)),
            Ok(FrameMsg::Frame(index, data)) => {
                // The output hash runs here, on the caller's thread, while
                // the decode thread already decodes the next frame.
                let checked = match self.frames.get(index) {
                    Some(f) => check_output(index, f, &data),
                    None => Err(Error::new(
                        Kind::Io,
                        format!("decode thread sent frame {index}, past the frame table"),
                    )),
                };
                if let Err(e) = checked {
                    self.ended = true;
                    return Err(e);
                }
                Ok(FrameEvent::Frame { index, data })
            }
            Ok(FrameMsg::End(preferred)) => {
                self.ended = true;
                Ok(FrameEvent::End { preferred })
            }
            Ok(FrameMsg::Failed(e)) => {
                self.ended = true;
                Err(e)
            }
            Err(RecvTimeoutError::Timeout) => Ok(FrameEvent::Idle),
            Err(RecvTimeoutError::Disconnected) => {
                self.ended = true;
                Err(Error::new(Kind::Io, "decode thread ended unexpectedly"))
            }
        }
    }

    /// Give a frame's buffer back once its bytes are written.
    fn recycle(&mut self, buf: AlignedBuf) {
        let _ = self.spare.try_send(buf);
    }
}

/// The decode thread's side of [`Frames`].
struct DecodeStage<'a> {
    tx: &'a Outbox<FrameMsg>,
    spare: &'a Inbox<AlignedBuf>,
    /// Compressed bytes read but not yet reported.
    unreported: u64,
    last_report: Instant,
}

/// How often the decode thread reports bytes read while inside a frame.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

impl DecodeStage<'_> {
    /// `Ok(Some(preferred))` when every frame went out, `Ok(None)` when the
    /// caller stopped listening.
    fn run(
        mut self,
        mut feed: Feed,
        frames: &[Frame],
        start: usize,
        artifact_sha256: Option<Sha256>,
    ) -> Result<Option<Option<usize>>> {
        let max_out = frames.iter().map(|f| f.out_size).max().unwrap_or(0) as usize;
        let max_in = frames.iter().map(|f| f.size).max().unwrap_or(0) as usize;
        let mut decoder = FrameDecoder::new(max_out)?;
        let mut compressed = vec![0u8; max_in];
        let mut artifact_hash = artifact_sha256.map(|_| Hasher::new());
        for (i, f) in frames.iter().enumerate().skip(start) {
            let buf = &mut compressed[..f.size as usize];
            match self.fill(&mut feed, buf) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(e) => {
                    return Err(
                        e.wrap(format!("reading artifact frame {i} at offset {}", f.offset))
                    );
                }
            }
            if let Some(h) = artifact_hash.as_mut() {
                h.update(buf);
            }
            decoder.decode_unhashed(i, f, buf)?;
            let Some(spare) = self.spare.recv() else {
                return Ok(None);
            };
            let data = decoder.take_output(spare);
            self.flush_progress(true);
            if self.tx.send(FrameMsg::Frame(i, data)).is_err() {
                return Ok(None);
            }
        }
        let preferred = feed.preferred();
        feed.finish()?;
        if let (Some(h), Some(want)) = (artifact_hash, artifact_sha256) {
            let got = h.finish();
            if got != want {
                bail!(
                    Integrity,
                    "artifact sha256 is {got}, the manifest signs {want}"
                );
            }
        }
        Ok(Some(preferred))
    }

    /// Fill `buf` from `feed`; `Ok(false)` when the caller went away.
    fn fill(&mut self, feed: &mut Feed, buf: &mut [u8]) -> Result<bool> {
        let mut n = 0;
        while n < buf.len() {
            match feed.read_some(&mut buf[n..])? {
                Some(0) => bail!(Network, "stream ended {} bytes early", buf.len() - n),
                Some(k) => {
                    n += k;
                    self.unreported += k as u64;
                    // Progress at most every PROGRESS_EVERY: each message
                    // wakes the state machine.
                    if self.last_report.elapsed() >= PROGRESS_EVERY && !self.flush_progress(false) {
                        return Ok(false);
                    }
                }
                // Stalled: make sure someone is still listening.
                None => {
                    if !self.flush_progress(false) {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Report unreported bytes without blocking (a full channel keeps them
    /// for later), or wait when `block`. False when the caller went away.
    fn flush_progress(&mut self, block: bool) -> bool {
        if block && self.unreported == 0 {
            return true;
        }
        let msg = FrameMsg::Read(self.unreported);
        // Err(true): not sent but still listened to (the channel is full).
        let sent = if block {
            self.tx.send(msg).map_err(|_| false)
        } else {
            self.tx
                .try_send(msg)
                .map_err(|e| matches!(e, TrySendError::Full(())))
        };
        match sent {
            Ok(()) => {
                self.unreported = 0;
                self.last_report = Instant::now();
                true
            }
            Err(listening) => listening,
        }
    }
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
        Frames::spawn(feed, frames.to_vec(), 0, sha)
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
    fn no_third_buffer_is_made_while_two_are_out() {
        let (art, frames, _) = artifact(4, 40_000);
        let mut s = frames_over(&art, &frames, None);
        let mut held = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if let FrameEvent::Frame { index, data } = s.wait().unwrap() {
                held.push((index, data));
            }
        }
        // The decoder owns one buffer and the caller holds the other: frame
        // 1 waits until a buffer comes back.
        assert_eq!(held.iter().map(|h| h.0).collect::<Vec<_>>(), vec![0]);
        let (_, data) = held.pop().unwrap();
        s.recycle(data);
        let index = loop {
            if let FrameEvent::Frame { index, .. } = s.wait().unwrap() {
                break index;
            }
        };
        assert_eq!(index, 1);
    }
}
