//! Blocking network calls off the state machine's thread.
//!
//! updraft runs its state machine and control socket on one thread. A read
//! from a stalled TCP connection can block for the whole stall timeout, and
//! name resolution cannot be bounded at all from the calling thread; during
//! that time `updraft status` must still answer. So each blocking transfer
//! runs on a short-lived helper thread that owns the reader and hands
//! chunks over a small bounded channel; the state machine waits on the
//! channel with a timeout and ticks (serves the socket, pings the watchdog,
//! notices SIGTERM) while nothing arrives.
//!
//! A full install adds one more stage, [`Frames`]: decoding a zstd frame
//! costs about as much CPU as hashing its output, so frames are decoded on
//! their own thread while the state machine hashes and writes the previous
//! one. Only frames whose output matched the signed frame table are handed
//! over.
//!
//! Helper threads only read, decode and forward bytes. They never touch the
//! store, a slot or the bootloader (the one thread that reads a slot, for
//! the read-back, is [`crate::readback`]'s), and they are never joined while blocked:
//! if the state machine gives up, a thread ends on its own when its read
//! returns or fails, or when it finds nobody listening.

use std::any::Any;
use std::io::{self, Read};
use std::marker::PhantomData;
use std::sync::mpsc::{
    Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel,
};
use std::time::{Duration, Instant};

use crate::artifact::{FrameDecoder, check_output};
use crate::bail;
use crate::direct_io::AlignedBuf;
use crate::error::{Error, Kind, Result};
use crate::hash::{Hasher, Sha256};
use crate::manifest::Frame;
use crate::progress::{Progress, Ticker};
use crate::source::Source;

/// How long the state machine waits for data before ticking.
pub const TICK: Duration = Duration::from_millis(200);

/// Chunks in flight between the helper thread and the state machine.
const DEPTH: usize = 4;

/// What the helper thread sends.
enum Msg {
    /// The transfer is open; the base URL that answered.
    Opened(usize),
    Data(Vec<u8>),
    End,
    /// Opening failed (kind kept: an artifact longer than signed is an
    /// integrity error, not a network one).
    OpenFailed(Error),
    ReadFailed(io::Error),
}

/// A byte stream opened and read on a helper thread.
pub struct Feed {
    rx: Inbox<Msg>,
    chunk: Vec<u8>,
    pos: usize,
    ended: bool,
    preferred: Option<usize>,
}

impl Feed {
    /// Open `rel` at `offset` of its `total` signed bytes from `source`, and
    /// read it in chunks of `chunk` bytes, all on a helper thread: neither
    /// the request (name resolution, connect, headers) nor a stalled body
    /// blocks the caller.
    pub fn open(source: Source, rel: String, offset: u64, total: u64, chunk: usize) -> Feed {
        Feed::spawn_with(chunk, move || {
            let mut src = source;
            let reader = src.open(&rel, offset, total)?;
            Ok((reader, src.preferred()))
        })
    }

    /// Read an already open `reader` on a helper thread.
    #[cfg(test)]
    pub fn spawn(reader: Box<dyn Read + Send>, chunk: usize) -> Feed {
        Feed::spawn_with(chunk, move || Ok((reader, 0)))
    }

    fn spawn_with(
        chunk: usize,
        opener: impl FnOnce() -> Result<(Box<dyn Read + Send>, usize)> + Send + 'static,
    ) -> Feed {
        let (tx, rx) = channel::<Msg>(DEPTH);
        let spawned = std::thread::Builder::new()
            .name("updraft-fetch".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let mut reader = match opener() {
                    Ok((r, preferred)) => {
                        if tx.send(Msg::Opened(preferred)).is_err() {
                            return;
                        }
                        r
                    }
                    Err(e) => {
                        let _ = tx.send(Msg::OpenFailed(e));
                        return;
                    }
                };
                loop {
                    let mut buf = vec![0u8; chunk];
                    match reader.read(&mut buf) {
                        Ok(0) => {
                            let _ = tx.send(Msg::End);
                            return;
                        }
                        Ok(n) => {
                            buf.truncate(n);
                            if tx.send(Msg::Data(buf)).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            let _ = tx.send(Msg::ReadFailed(e));
                            return;
                        }
                    }
                }
            });
        let rx = match spawned {
            Ok(_) => rx,
            Err(e) => {
                let (tx, rx) = channel(1);
                let _ = tx.send(Msg::OpenFailed(Error::new(
                    Kind::Io,
                    format!("starting a transfer thread: {e}"),
                )));
                rx
            }
        };
        Feed {
            rx,
            chunk: Vec::new(),
            pos: 0,
            ended: false,
            preferred: None,
        }
    }

    /// The base URL index that served the transfer, once it is open.
    pub fn preferred(&self) -> Option<usize> {
        self.preferred
    }

    /// Copy available bytes into `buf`: `Some(n)` with n > 0 for data,
    /// `Some(0)` at the end of the stream, `None` when nothing arrived
    /// within [`TICK`] (the caller should tick and call again).
    pub fn read_some(&mut self, buf: &mut [u8]) -> Result<Option<usize>> {
        loop {
            if self.pos < self.chunk.len() {
                let n = (self.chunk.len() - self.pos).min(buf.len());
                buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(Some(n));
            }
            if self.ended {
                return Ok(Some(0));
            }
            match self.rx.recv_timeout(TICK) {
                Ok(Msg::Opened(p)) => self.preferred = Some(p),
                Ok(Msg::Data(data)) => {
                    self.chunk = data;
                    self.pos = 0;
                }
                Ok(Msg::End) => {
                    self.ended = true;
                    return Ok(Some(0));
                }
                Ok(Msg::OpenFailed(e)) => {
                    self.ended = true;
                    return Err(e);
                }
                Ok(Msg::ReadFailed(e)) => {
                    self.ended = true;
                    return Err(Error::new(Kind::Network, e.to_string()));
                }
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => {
                    self.ended = true;
                    return Err(Error::new(
                        Kind::Network,
                        "transfer thread ended unexpectedly",
                    ));
                }
            }
        }
    }

    /// Confirm the stream is fully consumed (for streams capped at their
    /// signed size, the helper reports the end right after the last byte).
    pub fn finish(mut self) -> Result<()> {
        let mut probe = [0u8; 1];
        loop {
            match self.read_some(&mut probe)? {
                Some(0) => return Ok(()),
                Some(_) => {
                    return Err(Error::new(
                        Kind::Integrity,
                        "more data than the signed size",
                    ));
                }
                None => continue,
            }
        }
    }
}

/// What [`Frames::wait`] yields.
#[derive(Debug)]
pub enum FrameEvent {
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
pub struct Frames {
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
    pub fn spawn(
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
    pub fn wait(&mut self) -> Result<FrameEvent> {
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
    pub fn recycle(&mut self, buf: AlignedBuf) {
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

/// What every channel of this module carries, boxed: a helper thread's
/// message of any kind, or the result of a [`Background`] or [`offload`]
/// call. std's channel code is generic over what it carries, and large;
/// one type through all of them keeps one copy of it in the binary.
/// [`channel`] gives each end its type back.
type Boxed = Box<dyn Any + Send>;

/// The sending end of a [`channel`] of `T`.
struct Outbox<T> {
    tx: SyncSender<Boxed>,
    of: PhantomData<fn(T)>,
}

impl<T> Clone for Outbox<T> {
    fn clone(&self) -> Self {
        Outbox {
            tx: self.tx.clone(),
            of: PhantomData,
        }
    }
}

impl<T: Send + 'static> Outbox<T> {
    /// Send `v`, waiting while the channel is full; `Err` when the
    /// receiving end is gone.
    fn send(&self, v: T) -> std::result::Result<(), ()> {
        self.tx.send(Box::new(v)).map_err(|_| ())
    }

    /// Send `v` if there is room.
    fn try_send(&self, v: T) -> std::result::Result<(), TrySendError<()>> {
        self.tx.try_send(Box::new(v)).map_err(|e| match e {
            TrySendError::Full(_) => TrySendError::Full(()),
            TrySendError::Disconnected(_) => TrySendError::Disconnected(()),
        })
    }
}

/// The receiving end of a [`channel`] of `T` (only `T`s are ever sent on
/// it; anything else would read as the sender gone).
struct Inbox<T> {
    rx: Receiver<Boxed>,
    of: PhantomData<fn() -> T>,
}

impl<T: 'static> Inbox<T> {
    fn of(rx: Receiver<Boxed>) -> Inbox<T> {
        Inbox {
            rx,
            of: PhantomData,
        }
    }

    fn take(v: Boxed) -> Option<T> {
        v.downcast::<T>().ok().map(|v| *v)
    }

    /// The next value; `None` once the sending end is gone.
    fn recv(&self) -> Option<T> {
        self.rx.recv().ok().and_then(Self::take)
    }

    fn recv_timeout(&self, timeout: Duration) -> std::result::Result<T, RecvTimeoutError> {
        Self::take(self.rx.recv_timeout(timeout)?).ok_or(RecvTimeoutError::Disconnected)
    }

    fn try_recv(&self) -> std::result::Result<T, TryRecvError> {
        Self::take(self.rx.try_recv()?).ok_or(TryRecvError::Disconnected)
    }
}

/// A channel of `T` holding at most `depth` values.
fn channel<T: Send + 'static>(depth: usize) -> (Outbox<T>, Inbox<T>) {
    let (tx, rx) = sync_channel(depth);
    (
        Outbox {
            tx,
            of: PhantomData,
        },
        Inbox::of(rx),
    )
}

/// A call to run on a helper thread, its result boxed.
type Call = Box<dyn FnOnce() -> Boxed + Send>;

/// `f` as a [`Call`].
fn boxed<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Call {
    Box::new(move || Box::new(f()) as Boxed)
}

/// The value a [`Call`] returned, as the type its caller made it with.
fn unbox<T: 'static>(v: Boxed, phase: &str) -> Result<T> {
    v.downcast::<T>().map(|v| *v).map_err(|_| {
        Error::new(
            Kind::Io,
            format!("{phase}: helper thread returned another type"),
        )
    })
}

/// Start `call` on a helper thread named `name`; its result arrives on
/// the receiver.
fn spawn_call(name: &str, call: Call) -> Result<Receiver<Boxed>> {
    let (tx, rx) = sync_channel(1);
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(256 * 1024)
        .spawn(move || {
            let _ = tx.send(call());
        })
        .map_err(|e| Error::new(Kind::Io, format!("starting thread {name}: {e}")))?;
    Ok(rx)
}

/// One blocking call running on a helper thread (`updraft-call`) while the
/// caller goes on with other work and looks for the result now and then
/// ([`Background::result`]), never waiting for it, or waits for it a tick
/// at a time ([`Background::wait`]). Dropping it abandons the call: the
/// thread ends on its own when the call returns.
pub struct Background<T> {
    rx: Inbox<T>,
}

impl<T: Send + 'static> Background<T> {
    pub fn spawn(f: impl FnOnce() -> T + Send + 'static) -> Result<Background<T>> {
        Background::spawn_named("updraft-call", f)
    }

    /// [`Background::spawn`] on a thread named `name`.
    pub fn spawn_named(
        name: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Background<T>> {
        Ok(Background {
            rx: Inbox::of(spawn_call(name, boxed(f))?),
        })
    }

    /// The call's result once it returned, `Ok(None)` while it runs.
    pub fn result(&self) -> Result<Option<T>> {
        match self.rx.try_recv() {
            Ok(v) => Ok(Some(v)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => {
                Err(Error::new(Kind::Io, "helper thread ended without a result"))
            }
        }
    }

    /// The call's result if it returns within `timeout`, `Ok(None)` if not.
    pub fn wait(&self, timeout: Duration) -> Result<Option<T>> {
        match self.rx.recv_timeout(timeout) {
            Ok(v) => Ok(Some(v)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(Error::new(Kind::Io, "helper thread ended without a result"))
            }
        }
    }
}

/// Run one blocking call on a helper thread, ticking while it runs.
pub fn offload<T: Send + 'static>(
    phase: &str,
    f: impl FnOnce() -> T + Send + 'static,
    ticker: &mut dyn Ticker,
) -> Result<T> {
    unbox(offload_call(phase, boxed(f), ticker)?, phase)
}

/// [`offload`] of a boxed call.
fn offload_call(phase: &str, call: Call, ticker: &mut dyn Ticker) -> Result<Boxed> {
    let rx = spawn_call("updraft-call", call)?;
    let progress = Progress {
        phase: phase.into(),
        ..Progress::default()
    };
    loop {
        match rx.recv_timeout(TICK) {
            Ok(v) => return Ok(v),
            Err(RecvTimeoutError::Timeout) => ticker.tick(&progress)?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::new(
                    Kind::Io,
                    format!("{phase}: helper thread ended without a result"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoTick;

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

    #[test]
    fn feed_delivers_everything_then_ends() {
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut f = Feed::spawn(Box::new(io::Cursor::new(data.clone())), 4096);
        let mut out = Vec::new();
        let mut buf = [0u8; 1000];
        loop {
            match f.read_some(&mut buf).unwrap() {
                Some(0) => break,
                Some(n) => out.extend_from_slice(&buf[..n]),
                None => {}
            }
        }
        assert_eq!(out, data);
    }

    #[test]
    fn feed_reports_read_errors() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "reset by peer",
                ))
            }
        }
        let mut f = Feed::spawn(Box::new(Broken), 16);
        let mut buf = [0u8; 16];
        let e = loop {
            match f.read_some(&mut buf) {
                Err(e) => break e,
                Ok(None) => continue,
                Ok(Some(_)) => panic!("data from a broken reader"),
            }
        };
        assert_eq!(e.kind(), Kind::Network);
        assert!(e.to_string().contains("reset by peer"));
    }

    #[test]
    fn a_background_call_is_looked_at_without_waiting() {
        let (go, wait) = sync_channel::<()>(0);
        let call = Background::spawn(move || {
            let _ = wait.recv();
            7
        })
        .unwrap();
        assert_eq!(call.result().unwrap(), None);
        go.send(()).unwrap();
        let t = Instant::now();
        let v = loop {
            if let Some(v) = call.result().unwrap() {
                break v;
            }
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(v, 7);
    }

    #[test]
    fn offload_ticks_while_waiting() {
        struct Count(u32);
        impl Ticker for Count {
            fn tick(&mut self, _: &Progress) -> Result<()> {
                self.0 += 1;
                Ok(())
            }
        }
        let mut c = Count(0);
        let v = offload(
            "t",
            || {
                std::thread::sleep(Duration::from_millis(700));
                7
            },
            &mut c,
        )
        .unwrap();
        assert_eq!(v, 7);
        assert!(c.0 >= 1, "ticked {} times", c.0);
        assert_eq!(offload("t", || 1, &mut NoTick).unwrap(), 1);
    }
}
