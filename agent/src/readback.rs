//! Reading a slot back from the medium while the rest of it is written.
//!
//! The read-back is the last check of an install: the bytes the device
//! returns for the target slot must hash to the signed image. Done after
//! the last write it costs a second pass over the whole slot, as long
//! again as the write on a typical eMMC. Yet every range the device has
//! completed is final: nothing will write it again during this install. So
//! a full install started at the first frame hands each completed range to
//! a reader thread (`updraft-verify`), which drops it from the page cache
//! (or reads it `O_DIRECT` on a block device) and hashes it in order, while
//! the state machine writes the next frames. After the final `fdatasync`
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
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};

use crate::direct_io::AlignedBuf;
use crate::error::{Error, Kind, Result};
use crate::hash::{Hasher, Sha256};
use crate::progress::{Progress, Ticker};
use crate::slot::SlotReader;
use crate::worker::TICK;

/// Bytes per read. Smaller than a whole-slot read-back's block: this buffer
/// lives beside the two frame buffers of the write, and direct reads of
/// half a MiB already keep an eMMC or SSD busy.
const BLOCK: usize = 512 * 1024;

/// A read-back in progress.
pub struct ReadBack {
    /// Offsets below which the slot is complete, in increasing order.
    ranges: Option<Sender<u64>>,
    result: Receiver<Result<(u64, Sha256)>>,
    /// The last offset handed over.
    sent: u64,
}

impl ReadBack {
    /// Start reading `slot` back from its first byte as ranges complete.
    pub fn start(slot: &Path) -> Result<ReadBack> {
        let reader = SlotReader::open(slot)?;
        let (ranges, ranges_rx) = channel::<u64>();
        let (result_tx, result) = channel();
        std::thread::Builder::new()
            .name("updraft-verify".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let _ = result_tx.send(read_ranges(&reader, &ranges_rx));
            })
            .map_err(|e| Error::new(Kind::Io, format!("starting the read-back thread: {e}")))?;
        Ok(ReadBack {
            ranges: Some(ranges),
            result,
            sent: 0,
        })
    }

    /// Everything below `offset` is complete on the device: read it back.
    pub fn complete_to(&mut self, offset: u64) {
        if offset > self.sent {
            if let Some(tx) = &self.ranges {
                // A thread that already failed has its error waiting in
                // `result`; `finish` reports it.
                let _ = tx.send(offset);
            }
            self.sent = offset;
        }
    }

    /// Wait for the read-back of the first `len` bytes (all complete and
    /// handed over) and return their hash, ticking while waiting.
    pub fn finish(mut self, len: u64, ticker: &mut dyn Ticker) -> Result<Sha256> {
        self.complete_to(len);
        // No more ranges: the thread ends once it has read the last one.
        self.ranges = None;
        let progress = Progress {
            phase: "verify".into(),
            total: len,
            ..Progress::default()
        };
        loop {
            match self.result.recv_timeout(TICK) {
                Ok(Ok((read, hash))) if read == len => return Ok(hash),
                Ok(Ok((read, _))) => {
                    return Err(Error::new(
                        Kind::Slot,
                        format!("the read-back stopped at byte {read} of {len}"),
                    ));
                }
                Ok(Err(e)) => return Err(e.wrap("reading the slot back")),
                Err(RecvTimeoutError::Timeout) => ticker.tick(&progress)?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::new(Kind::Io, "read-back thread ended unexpectedly"));
                }
            }
        }
    }
}

/// The thread's side: hash each new range in order until the sender goes
/// away; returns how far it read and the hash of it.
fn read_ranges(reader: &SlotReader, ranges: &Receiver<u64>) -> Result<(u64, Sha256)> {
    let mut h = Hasher::new();
    let mut buf = AlignedBuf::new(BLOCK);
    let mut done = 0u64;
    while let Ok(to) = ranges.recv() {
        reader.hash_range(&mut h, &mut buf, done, to, &mut |_| Ok(()))?;
        done = to;
    }
    Ok((done, h.finish()))
}
