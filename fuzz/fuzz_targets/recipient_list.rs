//! The publisher's recipient list (`--encrypt-to FILE`): base64 lines, PEM
//! blocks and comments in any mix must be accepted or refused with a line
//! number, never panic; what is accepted is distinct 32-byte keys, at
//! most the limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::encrypt::{MAX_LIST, parse_recipients};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_recipients(text) {
        Ok(keys) => {
            assert!(!keys.is_empty() && keys.len() <= MAX_LIST);
            for (i, k) in keys.iter().enumerate() {
                assert!(!keys[..i].contains(k));
            }
        }
        Err(e) => assert!(e.starts_with("line ") || e.contains("names no key"), "{e}"),
    }
});
