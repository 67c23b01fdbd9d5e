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
//! The helper thread only reads and forwards bytes. It never touches the
//! store, a slot or the bootloader, and it is never joined while blocked: if
//! the state machine gives up, the thread ends on its own when its read
//! returns or fails.

use std::io::{self, Read};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::Duration;

use crate::error::{Error, Kind, Result};
use crate::install::{Progress, Ticker};
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
    rx: Receiver<Msg>,
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
    pub fn spawn(reader: Box<dyn Read + Send>, chunk: usize) -> Feed {
        Feed::spawn_with(chunk, move || Ok((reader, 0)))
    }

    fn spawn_with(
        chunk: usize,
        opener: impl FnOnce() -> Result<(Box<dyn Read + Send>, usize)> + Send + 'static,
    ) -> Feed {
        let (tx, rx): (SyncSender<Msg>, _) = sync_channel(DEPTH);
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
                let (tx, rx) = sync_channel(1);
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

/// Run one blocking call on a helper thread, ticking while it runs.
pub fn offload<T: Send + 'static>(
    phase: &str,
    f: impl FnOnce() -> T + Send + 'static,
    ticker: &mut dyn Ticker,
) -> Result<T> {
    let (tx, rx) = sync_channel(1);
    std::thread::Builder::new()
        .name("updraft-call".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| Error::new(Kind::Io, format!("starting a helper thread: {e}")))?;
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
    use crate::install::NoTick;

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
