//! Untrusted artifact frames: header parsing and verified decoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::artifact::{FrameDecoder, parse_frame_header};
use updraft::hash::Sha256;
use updraft::manifest::Frame;

fuzz_target!(|data: &[u8]| {
    let _ = parse_frame_header(data);
    let Ok(mut dec) = FrameDecoder::new() else { return };
    let frame = Frame {
        offset: 0,
        size: data.len() as u64,
        out_size: 1 << 20,
        out_sha256: Sha256([0; 32]),
    };
    let _ = dec.decode(0, &frame, data);
});
