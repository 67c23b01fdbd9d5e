//! The Raspberry Pi firmware's `autoboot.txt` and its device-tree cells:
//! whatever the bytes, parsing names an error or gives partitions that are
//! not 0; what updraft writes for them fits the firmware's 512 bytes and
//! parses back to the same selection.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::bootloader::tryboot::{
    Autoboot, MAX_AUTOBOOT, format_autoboot, parse_autoboot, parse_cell,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(cell) = parse_cell(data, "partition") {
        assert_eq!(data.len(), 4);
        assert_eq!(cell.to_be_bytes(), data);
    }
    let Ok(a) = parse_autoboot(data, "autoboot.txt") else {
        return;
    };
    assert!(data.len() <= MAX_AUTOBOOT);
    assert!(a.default != 0 && a.tryboot != 0, "{a:?}");
    let written = Autoboot {
        tryboot_a_b: true,
        ..a
    };
    let text = format_autoboot(written);
    assert!(text.len() <= MAX_AUTOBOOT);
    assert_eq!(parse_autoboot(text.as_bytes(), "autoboot.txt").ok(), Some(written));
});
