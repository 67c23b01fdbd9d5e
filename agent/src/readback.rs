//! Reading a slot back from the medium while the rest of it is written.
//!
//! The read-back is the last check of an install: the bytes the device
//! returns for the target slot must hash to the signed image. Done after
//! the last write it costs a second pass over the whole slot, as long
//! again as the write on a typical eMMC. Yet every range the device has
//! completed is final: nothing will write it again during this install. So
//! a full install started at the first frame hands each completed range to
//! a reader thread (`updraft-verify`), which drops it from the page cache
//! (or reads it `O_DIRECT` on a block device) and hands each block to a
//! hashing thread (`updraft-verify-hash`), while the state machine writes
//! the next frames. Reading and hashing overlap: a direct read leaves the
//! processor idle while the device works, and the hash of a block costs
//! about as long as its read, so done in turn they took twice as long as
//! either (measured: the read-back outlasted the write by 0.2 s on a
//! 256 MiB image). After the final `fdatasync`
//! only the last range is left to read, and the verdict is the same as a
//! read-back of the whole slot after the write: the hash of what the
//! medium returns, from the first byte to the image size.
//!
//! The thread only reads the slot; it never writes it, the store or the
//! bootloader. It ends on its own when the state machine drops the
//! [`ReadBack`] (an install that failed or was stopped), after the block it
//! is reading. Resumed installs do not use it: they read the whole slot
//! back after the write ([`crate::install::verify_slot`]).

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};

use crate::direct_io::AlignedBuf;
use crate::error::{Error, Kind, Result};
use crate::hash::{Hasher, Sha256};
use crate::progress::{Progress, Ticker};
use crate::slot::SlotReader;
use crate::worker::{Background, TICK};

/// Bytes per read. Smaller than a whole-slot read-back's block: two of
/// these live beside the frame buffers of the write, and direct reads of
/// a quarter MiB, one always queued while the other is hashed, keep an
/// eMMC or SSD busy.
const BLOCK: usize = 256 * 1024;

/// How far the slot is complete, handed from the state machine to the
/// reader thread: the offset below which every byte is final, and whether
/// more will come.
#[derive(Default)]
struct Watermark {
    mark: Mutex<(u64, bool)>,
    moved: Condvar,
}

impl Watermark {
    fn set(&self, offset: u64, last: bool) {
        let mut m = self.mark.lock().unwrap_or_else(PoisonError::into_inner);
        m.0 = m.0.max(offset);
        m.1 |= last;
        self.moved.notify_one();
    }

    /// Wait until the mark is past `done` or no more will come; the mark
    /// then (`None` when it stays at `done` for good).
    fn past(&self, done: u64) -> Option<u64> {
        let mut m = self.mark.lock().unwrap_or_else(PoisonError::into_inner);
        while m.0 <= done && !m.1 {
            m = self.moved.wait(m).unwrap_or_else(PoisonError::into_inner);
        }
        (m.0 > done).then_some(m.0)
    }
}

/// A read-back in progress.
pub struct ReadBack {
    /// Offsets below which the slot is complete, increasing.
    complete: Arc<Watermark>,
    result: Background<Result<(u64, Sha256)>>,
    /// The last offset handed over.
    sent: u64,
}

impl ReadBack {
    /// Start reading `slot` back from its first byte as ranges complete.
    pub fn start(slot: &Path) -> Result<ReadBack> {
        let reader = SlotReader::open(slot)?;
        let complete = Arc::new(Watermark::default());
        let mark = complete.clone();
        let result = Background::spawn_named("updraft-verify", move || read_ranges(&reader, &mark))
            .map_err(|e| e.wrap("starting the read-back"))?;
        Ok(ReadBack {
            complete,
            result,
            sent: 0,
        })
    }

    /// Everything below `offset` is complete on the device: read it back.
    pub fn complete_to(&mut self, offset: u64) {
        if offset > self.sent {
            // A thread that already failed has its error waiting in
            // `result`; `finish` reports it.
            self.complete.set(offset, false);
            self.sent = offset;
        }
    }

    /// Wait for the read-back of the first `len` bytes (all complete and
    /// handed over) and return their hash, ticking while waiting.
    pub fn finish(mut self, len: u64, ticker: &mut dyn Ticker) -> Result<Sha256> {
        self.complete_to(len);
        // No more ranges: the thread ends once it has read the last one.
        self.complete.set(len, true);
        let progress = Progress {
            phase: "verify".into(),
            total: len,
            ..Progress::default()
        };
        loop {
            match self.result.wait(TICK) {
                Ok(Some(Ok((read, hash)))) if read == len => return Ok(hash),
                Ok(Some(Ok((read, _)))) => {
                    return Err(Error::new(
                        Kind::Slot,
                        format!("the read-back stopped at byte {read} of {len}"),
                    ));
                }
                Ok(Some(Err(e))) => return Err(e.wrap("reading the slot back")),
                Ok(None) => ticker.tick(&progress)?,
                Err(e) => return Err(e.wrap("read-back")),
            }
        }
    }
}

impl Drop for ReadBack {
    /// An install that failed or was stopped: the thread ends once it has
    /// read what was handed over.
    fn drop(&mut self) {
        self.complete.set(self.sent, true);
    }
}

/// The thread's side: read each new range in order until no more come,
/// handing every block to a hashing thread; returns how far it read and
/// the hash of it. Two blocks circulate: one read while the other is
/// hashed.
fn read_ranges(reader: &SlotReader, complete: &Watermark) -> Result<(u64, Sha256)> {
    let (full, full_rx) = mpsc::sync_channel::<(AlignedBuf, usize)>(1);
    let (empty, empty_rx) = mpsc::sync_channel::<AlignedBuf>(2);
    for _ in 0..2 {
        let _ = empty.send(AlignedBuf::new(BLOCK));
    }
    std::thread::scope(|s| {
        let hasher = std::thread::Builder::new()
            .name("updraft-verify-hash".into())
            .stack_size(64 * 1024)
            .spawn_scoped(s, move || {
                let mut h = Hasher::new();
                for (buf, n) in full_rx {
                    h.update(&buf[..n]);
                    if empty.send(buf).is_err() {
                        break;
                    }
                }
                h.finish()
            })
            .map_err(|e| Error::new(Kind::Io, format!("starting the read-back hash: {e}")))?;
        let read = (|| -> Result<u64> {
            let mut done = 0u64;
            while let Some(to) = complete.past(done) {
                let mut off = done;
                while off < to {
                    let n = (to - off).min(BLOCK as u64) as usize;
                    let Ok(mut buf) = empty_rx.recv() else {
                        return Err(Error::new(Kind::Io, "the read-back hash stopped"));
                    };
                    reader.read_back(&mut buf, off, n)?;
                    if full.send((buf, n)).is_err() {
                        return Err(Error::new(Kind::Io, "the read-back hash stopped"));
                    }
                    off += n as u64;
                }
                done = to;
            }
            Ok(done)
        })();
        drop(full);
        let hash = hasher
            .join()
            .map_err(|_| Error::new(Kind::Io, "the read-back hash panicked"))?;
        Ok((read?, hash))
    })
}
