//! Untrusted manifest payloads past the signature: version 1 and version 2
//! (releases of components: names, kinds, the slot, app indexes and
//! command artifacts) must be accepted or refused, never panic, and what
//! is accepted must write back to a payload that parses to the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::manifest::{Manifest, component};

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Manifest::parse(data) else { return };
    let Ok(again) = component::to_payload(&m) else { return };
    assert_eq!(Manifest::parse(&again).ok(), Some(m));
});
