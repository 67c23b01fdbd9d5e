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
//! The frame pipeline ([`crate::pipeline`]) adds one more stage on a
//! thread of its own, decoding, over the channels kept here.
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
use std::time::Duration;

use crate::error::{Error, Kind, Result};
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

/// What every channel of this module carries, boxed: a helper thread's
/// message of any kind, or the result of a [`Background`] or [`offload`]
/// call. std's channel code is generic over what it carries, and large;
/// one type through all of them keeps one copy of it in the binary.
/// [`channel`] gives each end its type back.
type Boxed = Box<dyn Any + Send>;

/// The sending end of a [`channel`] of `T`.
pub(crate) struct Outbox<T> {
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
    pub(crate) fn send(&self, v: T) -> std::result::Result<(), ()> {
        self.tx.send(Box::new(v)).map_err(|_| ())
    }

    /// Send `v` if there is room.
    pub(crate) fn try_send(&self, v: T) -> std::result::Result<(), TrySendError<()>> {
        self.tx.try_send(Box::new(v)).map_err(|e| match e {
            TrySendError::Full(_) => TrySendError::Full(()),
            TrySendError::Disconnected(_) => TrySendError::Disconnected(()),
        })
    }
}

/// The receiving end of a [`channel`] of `T` (only `T`s are ever sent on
/// it; anything else would read as the sender gone).
pub(crate) struct Inbox<T> {
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
    pub(crate) fn recv(&self) -> Option<T> {
        self.rx.recv().ok().and_then(Self::take)
    }

    pub(crate) fn recv_timeout(
        &self,
        timeout: Duration,
    ) -> std::result::Result<T, RecvTimeoutError> {
        Self::take(self.rx.recv_timeout(timeout)?).ok_or(RecvTimeoutError::Disconnected)
    }

    fn try_recv(&self) -> std::result::Result<T, TryRecvError> {
        Self::take(self.rx.try_recv()?).ok_or(TryRecvError::Disconnected)
    }
}

/// A channel of `T` holding at most `depth` values.
pub(crate) fn channel<T: Send + 'static>(depth: usize) -> (Outbox<T>, Inbox<T>) {
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
        let t = std::time::Instant::now();
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
