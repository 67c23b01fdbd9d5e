//! The release marker of a provisioned root filesystem: whatever text it
//! holds, it parses to a release of 1 to 128 printable characters (and an
//! optional well-formed sha256) or to an error naming what is wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::provision::parse_marker;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_marker(text) {
        Ok(m) => {
            assert!(!m.version.is_empty() && m.version.len() <= 128);
            assert!(!m.version.chars().any(char::is_control));
        }
        Err(e) => assert!(!e.is_empty()),
    }
});
