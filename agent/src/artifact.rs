//! Full-image artifacts: a zstd stream of independent frames, each verified
//! against the signed frame table before a byte of it reaches a slot.
//!
//! The publisher cuts the image into frames of bounded output (2 MiB by
//! default) with a window no larger than the frame. The signed manifest lists
//! every frame's compressed offset and length and its decoded length and
//! sha256. [`FrameDecoder`] takes one frame's compressed bytes, checks that
//! they are exactly one zstd frame with an acceptable header, decodes it into
//! a buffer of the signed size and compares the hash. Only then does the
//! caller write it. Memory is a few buffers of one frame each
//! ([`crate::pipeline`] decides how many), whatever the image size.
//!
//! The frame header is parsed here rather than trusted to the decoder so a
//! frame asking for a large window is refused with a message naming the
//! window, before any allocation. This module treats every byte as hostile.

use crate::direct_io::AlignedBuf;
use crate::error::{Error, Kind, Result};
use crate::hash::Sha256;
use crate::manifest::{Frame, MAX_WINDOW_LOG};

const ZSTD_MAGIC: u32 = 0xFD2F_B528;

/// What a zstd frame header declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Window the decoder must keep, in bytes.
    pub window_size: u64,
    /// Decoded size, when the header carries it.
    pub content_size: Option<u64>,
    pub dictionary_id: u32,
    pub has_checksum: bool,
    /// Length of the header itself.
    pub header_len: usize,
}

/// Parse the header of the zstd frame at the start of `buf`.
pub fn parse_frame_header(buf: &[u8]) -> Result<FrameHeader> {
    let malformed = |why: &str| Error::new(Kind::Malformed, format!("zstd frame header: {why}"));
    if buf.len() < 6 {
        return Err(malformed("truncated"));
    }
    let magic = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if magic != ZSTD_MAGIC {
        return Err(malformed(&format!("bad magic {magic:#010x}")));
    }
    let fhd = buf[4];
    let fcs_flag = fhd >> 6;
    let single_segment = fhd & 0x20 != 0;
    if fhd & 0x08 != 0 {
        return Err(malformed("reserved bit set"));
    }
    let has_checksum = fhd & 0x04 != 0;
    let did_len = match fhd & 0x03 {
        0 => 0,
        1 => 1,
        2 => 2,
        _ => 4,
    };
    let fcs_len = match fcs_flag {
        0 if single_segment => 1,
        0 => 0,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let mut pos = 5;
    let window_from_descriptor = if single_segment {
        None
    } else {
        let wd = buf[pos];
        pos += 1;
        let exponent = u64::from(wd >> 3);
        let mantissa = u64::from(wd & 7);
        let window_log = 10 + exponent;
        let base = 1u64 << window_log;
        Some(base + (base / 8) * mantissa)
    };
    let header_len = pos + did_len + fcs_len;
    if buf.len() < header_len {
        return Err(malformed("truncated"));
    }
    let le = |b: &[u8]| {
        b.iter()
            .rev()
            .fold(0u64, |acc, x| (acc << 8) | u64::from(*x))
    };
    let dictionary_id = le(&buf[pos..pos + did_len]) as u32;
    pos += did_len;
    let content_size = match fcs_len {
        0 => None,
        2 => Some(le(&buf[pos..pos + 2]) + 256),
        n => Some(le(&buf[pos..pos + n])),
    };
    let window_size = match (window_from_descriptor, content_size) {
        (Some(w), _) => w,
        (None, Some(c)) => c,
        (None, None) => return Err(malformed("single-segment frame without content size")),
    };
    Ok(FrameHeader {
        window_size,
        content_size,
        dictionary_id,
        has_checksum,
        header_len,
    })
}

/// Decodes and verifies frames.
pub struct FrameDecoder {
    dctx: zstd::bulk::Decompressor<'static>,
    /// [`decode`](Self::decode)'s output, made on first use. Aligned, so a
    /// block-device slot can take it without a copy.
    out: AlignedBuf,
    max_window: u64,
}

impl FrameDecoder {
    pub fn new() -> Result<FrameDecoder> {
        let mut dctx = zstd::bulk::Decompressor::new()
            .map_err(|e| Error::new(Kind::Io, format!("creating zstd decoder: {e}")))?;
        dctx.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(MAX_WINDOW_LOG))
            .map_err(|e| Error::new(Kind::Io, format!("configuring zstd decoder: {e}")))?;
        Ok(FrameDecoder {
            dctx,
            out: AlignedBuf::default(),
            max_window: 1u64 << MAX_WINDOW_LOG,
        })
    }

    /// Verify that `compressed` is exactly the signed frame `index`, decode
    /// it, and check its output hash. Returns the decoded bytes.
    pub fn decode(&mut self, index: usize, frame: &Frame, compressed: &[u8]) -> Result<&[u8]> {
        let mut out = std::mem::take(&mut self.out);
        let decoded = self.decode_into(index, frame, compressed, &mut out);
        self.out = out;
        decoded?;
        Ok(&self.out)
    }

    /// [`decode`](Self::decode) into `out`, a buffer of the caller's, made
    /// as long as the frame's output: several decoders can then share a
    /// pool of buffers. `out`'s contents are unspecified on error.
    pub fn decode_into(
        &mut self,
        index: usize,
        frame: &Frame,
        compressed: &[u8],
        out: &mut AlignedBuf,
    ) -> Result<()> {
        let ctx = |e: Error| e.wrap(format!("artifact frame {index}"));
        if compressed.len() as u64 != frame.size {
            return Err(ctx(Error::new(
                Kind::Integrity,
                format!(
                    "got {} bytes, the signed frame is {}",
                    compressed.len(),
                    frame.size
                ),
            )));
        }
        let header = parse_frame_header(compressed).map_err(ctx)?;
        if header.window_size > self.max_window {
            return Err(ctx(Error::new(
                Kind::Malformed,
                format!(
                    "zstd window of {} bytes exceeds the device limit of {} bytes",
                    header.window_size, self.max_window
                ),
            )));
        }
        if header.dictionary_id != 0 {
            return Err(ctx(Error::new(
                Kind::Malformed,
                "zstd frame needs a dictionary",
            )));
        }
        if let Some(c) = header.content_size {
            if c != frame.out_size {
                return Err(ctx(Error::new(
                    Kind::Integrity,
                    format!(
                        "zstd header declares {c} bytes, the signed frame decodes to {}",
                        frame.out_size
                    ),
                )));
            }
        }
        match zstd::zstd_safe::find_frame_compressed_size(compressed) {
            Ok(n) if n == compressed.len() => {}
            Ok(n) => {
                return Err(ctx(Error::new(
                    Kind::Integrity,
                    format!(
                        "holds a {n}-byte zstd frame followed by {} more bytes",
                        compressed.len() - n
                    ),
                )));
            }
            Err(code) => {
                return Err(ctx(Error::new(
                    Kind::Malformed,
                    format!(
                        "corrupt zstd frame: {}",
                        zstd::zstd_safe::get_error_name(code)
                    ),
                )));
            }
        }
        let want = frame.out_size as usize;
        out.set_len(want);
        // The decoder writes into the buffer and no further, so a frame
        // that decodes to more than expected fails here instead of
        // allocating.
        let n = self
            .dctx
            .decompress_to_buffer(compressed, &mut out[..])
            .map_err(|e| {
                ctx(Error::new(
                    Kind::Malformed,
                    format!("corrupt zstd frame: {e}"),
                ))
            })?;
        if n as u64 != frame.out_size {
            return Err(ctx(Error::new(
                Kind::Integrity,
                format!("decodes to {n} bytes, signed {}", frame.out_size),
            )));
        }
        check_output(index, frame, out)
    }
}

/// Check that `data`, the decoded frame `index`, hashes to its signed
/// `out_sha256`.
pub fn check_output(index: usize, frame: &Frame, data: &[u8]) -> Result<()> {
    let got = Sha256::of(data);
    if got != frame.out_sha256 {
        return Err(Error::new(
            Kind::Integrity,
            format!("decodes to sha256 {got}, signed {}", frame.out_sha256),
        )
        .wrap(format!("artifact frame {index}")));
    }
    Ok(())
}

/// A framed artifact read as what it decodes to, for a consumer that
/// takes a stream (a `command` component's handler, an app's index). No
/// byte of a frame is returned before the whole frame decoded to its
/// signed length and hash; the artifact's own hash is checked at its end.
/// A failure is an [`std::io::ErrorKind::InvalidData`] error naming
/// `what` and the frame. Memory: one frame, compressed and decoded.
pub struct VerifiedFrames {
    inner: Box<dyn std::io::Read + Send>,
    frames: Vec<Frame>,
    sha256: Sha256,
    what: String,
    next: usize,
    out: Vec<u8>,
    pos: usize,
    whole: crate::hash::Hasher,
    dctx: zstd::bulk::Decompressor<'static>,
}

impl VerifiedFrames {
    /// `inner` yields the artifact's bytes from its start.
    pub fn new(
        inner: Box<dyn std::io::Read + Send>,
        artifact: &crate::manifest::Artifact,
        what: &str,
    ) -> Result<VerifiedFrames> {
        let mut dctx = zstd::bulk::Decompressor::new()
            .map_err(|e| Error::new(Kind::Malformed, format!("{what}: zstd: {e}")))?;
        dctx.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(MAX_WINDOW_LOG))
            .map_err(|e| Error::new(Kind::Malformed, format!("{what}: zstd: {e}")))?;
        Ok(VerifiedFrames {
            inner,
            frames: artifact.frames.clone(),
            sha256: artifact.sha256,
            what: what.to_string(),
            next: 0,
            out: Vec::new(),
            pos: 0,
            whole: crate::hash::Hasher::new(),
            dctx,
        })
    }

    fn invalid(&self, why: String) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {why}", self.what),
        )
    }

    /// Decode the next frame into `out`; false at the end.
    fn next_frame(&mut self) -> std::io::Result<bool> {
        let Some(f) = self.frames.get(self.next).copied() else {
            return Ok(false);
        };
        let i = self.next;
        let mut compressed = vec![0u8; f.size as usize];
        self.inner.read_exact(&mut compressed)?;
        self.whole.update(&compressed);
        self.out = self
            .dctx
            .decompress(&compressed, f.out_size as usize)
            .map_err(|e| self.invalid(format!("frame {i} does not decode: {e}")))?;
        if self.out.len() as u64 != f.out_size || check_output(i, &f, &self.out).is_err() {
            return Err(self.invalid(format!("frame {i} does not decode to its signed bytes")));
        }
        self.pos = 0;
        self.next += 1;
        if self.next == self.frames.len() {
            let got = std::mem::take(&mut self.whole).finish();
            if got != self.sha256 {
                return Err(self.invalid(format!(
                    "the artifact hashes to {}, not the signed {}",
                    got.short(),
                    self.sha256.short()
                )));
            }
        }
        Ok(true)
    }
}

impl std::io::Read for VerifiedFrames {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.out.len() {
            if !self.next_frame()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.out.len() - self.pos);
        buf[..n].copy_from_slice(&self.out[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compress(data: &[u8], level: i32) -> Vec<u8> {
        zstd::bulk::compress(data, level).unwrap()
    }

    fn frame_for(data: &[u8], c: &[u8]) -> Frame {
        Frame {
            offset: 0,
            size: c.len() as u64,
            out_size: data.len() as u64,
            out_sha256: Sha256::of(data),
        }
    }

    #[test]
    fn header_of_a_real_frame() {
        let data = vec![7u8; 100_000];
        let c = compress(&data, 3);
        let h = parse_frame_header(&c).unwrap();
        assert_eq!(h.content_size, Some(100_000));
        assert!(h.window_size >= 100_000 || h.window_size >= 1 << 10);
    }

    #[test]
    fn decodes_and_verifies() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let c = compress(&data, 3);
        let f = frame_for(&data, &c);
        let mut d = FrameDecoder::new().unwrap();
        assert_eq!(d.decode(0, &f, &c).unwrap(), &data[..]);
    }

    #[test]
    fn wrong_hash_is_named() {
        let data = vec![1u8; 5000];
        let c = compress(&data, 3);
        let mut f = frame_for(&data, &c);
        f.out_sha256 = Sha256::of(b"other");
        let mut d = FrameDecoder::new().unwrap();
        let e = d.decode(3, &f, &c).unwrap_err();
        assert_eq!(e.kind(), Kind::Integrity);
        assert!(
            e.to_string()
                .starts_with("artifact frame 3: decodes to sha256"),
            "{e}"
        );
    }

    #[test]
    fn two_frames_in_one_slot_are_refused() {
        let data = vec![1u8; 5000];
        let mut c = compress(&data, 3);
        let c2 = compress(&data, 3);
        c.extend_from_slice(&c2);
        let f = frame_for(&data, &c);
        let mut d = FrameDecoder::new().unwrap();
        let e = d.decode(0, &f, &c).unwrap_err();
        assert!(e.to_string().contains("followed by"), "{e}");
    }

    #[test]
    fn garbage_never_panics() {
        let mut d = FrameDecoder::new().unwrap();
        let f = Frame {
            offset: 0,
            size: 0,
            out_size: 4096,
            out_sha256: Sha256::of(b""),
        };
        for len in 0..64 {
            let mut buf: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            if len >= 4 {
                buf[..4].copy_from_slice(&ZSTD_MAGIC.to_le_bytes());
            }
            let f = Frame {
                size: buf.len() as u64,
                ..f
            };
            assert!(d.decode(0, &f, &buf).is_err());
        }
    }
}
