//! What a TPM (or whatever sits at /dev/tpmrm0 or a software TPM's
//! socket) answers the hardware rollback floor's three commands. Whatever
//! the bytes, each parse gives an error or values its caller relies on:
//! a response whose header announced exactly the bytes that came, a
//! counter of 8 bytes, a public area whose size fits; a response code is
//! always named without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::rollback_counter::tpm_wire::{
    self as wire, WireError, parse_increment, parse_read_counter, parse_read_public,
};

fuzz_target!(|data: &[u8]| {
    let announced = wire::announced_size(data);
    if let Ok(n) = announced {
        assert!((wire::HEADER..=wire::MAX_RESPONSE).contains(&n));
    }
    let agrees = announced == Ok(data.len());
    for r in [
        parse_read_counter(data).map(|_| ()),
        parse_increment(data),
        parse_read_public(data).map(|_| ()),
    ] {
        match r {
            Ok(()) => assert!(agrees),
            Err(WireError::Code(rc)) => {
                assert!(agrees && rc != 0);
                assert!(!wire::rc_text(rc).is_empty());
            }
            Err(WireError::Malformed(why)) => assert!(!why.is_empty()),
        }
    }
});
