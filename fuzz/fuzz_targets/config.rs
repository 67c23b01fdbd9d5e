//! The configuration reader (TOML subset and key checks): any bytes give a
//! configuration or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = updraft::toml_subset::parse(text);
        let _ = updraft::config::Config::parse(text);
    }
});
