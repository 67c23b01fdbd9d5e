//! Inhibitor files and logind's inhibitor state: whatever bytes they
//! hold, the reason kept is one short line without control characters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::inhibit::{REASON_MAX, read_untrusted};

fuzz_target!(|data: &[u8]| {
    let (reason, _blocks) = read_untrusted(data);
    if let Some(r) = reason {
        assert!(!r.is_empty());
        assert!(r.chars().count() <= REASON_MAX);
        assert!(!r.chars().any(char::is_control));
        assert_eq!(r.trim(), r);
    }
});
