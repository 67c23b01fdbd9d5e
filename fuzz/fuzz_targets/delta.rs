//! Untrusted deltas through the device's streaming patcher: any input is
//! refused with an error or yields exactly what the `bsdiff` crate's
//! reference patcher yields, never a panic.
//!
//! The first byte picks the layer under attack: even, the input after it is
//! the delta file as downloaded (zstd framing, window, truncation, trailing
//! bytes); odd, it is the bsdiff stream, compressed here so the records
//! themselves are fuzzed and the result is checked against the reference.
//! The next two bytes give the signed size of the new image.
#![no_main]

use std::fs::File;
use std::io::Write;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

const OLD_LEN: usize = 4096;

fn old_bytes() -> &'static [u8] {
    static OLD: OnceLock<Vec<u8>> = OnceLock::new();
    OLD.get_or_init(|| (0..OLD_LEN).map(|i| (i * 7 % 251) as u8).collect())
}

fn old_file() -> Option<&'static File> {
    static FILE: OnceLock<Option<File>> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("updraft-fuzz-delta-{}", std::process::id()));
        std::fs::write(&path, old_bytes()).ok()?;
        let f = File::open(&path).ok();
        let _ = std::fs::remove_file(&path);
        f
    })
    .as_ref()
}

fuzz_target!(|data: &[u8]| {
    let Some(old) = old_file() else { return };
    let [mode, a, b, rest @ ..] = data else {
        return;
    };
    let new_len = u64::from(u16::from_le_bytes([*a, *b]));
    let raw_stream = mode & 1 == 1;
    let delta = if raw_stream {
        let Ok(mut enc) = zstd::stream::write::Encoder::new(Vec::new(), 1) else {
            return;
        };
        if enc.write_all(rest).is_err() {
            return;
        }
        let Ok(d) = enc.finish() else { return };
        d
    } else {
        rest.to_vec()
    };
    let mut out = Vec::new();
    let result = updraft::delta::apply(
        old,
        OLD_LEN as u64,
        &mut &delta[..],
        new_len,
        &mut |block: &[u8]| {
            assert!(block.len() <= updraft::delta::BLOCK);
            out.extend_from_slice(block);
            Ok(())
        },
    );
    if result.is_ok() {
        assert_eq!(out.len() as u64, new_len);
        if raw_stream {
            let mut expected = Vec::new();
            let reference = bsdiff::patch(old_bytes(), &mut &rest[..], &mut expected);
            assert!(
                reference.is_ok(),
                "accepted a stream the reference patcher refuses"
            );
            assert!(expected == out, "output differs from the reference patcher");
        }
    }
});
