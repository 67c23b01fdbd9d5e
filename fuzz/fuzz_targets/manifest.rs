//! Untrusted manifest bytes: envelope parsing, signature counting and payload
//! validation must reject or accept, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::trust::{Anchor, KeySet, PublicKey, Trust};

fuzz_target!(|data: &[u8]| {
    // A fixed, valid key; the fuzzer cannot sign with it, so the interesting
    // paths are parsing and rejection.
    let Ok(key) = PublicKey::from_bytes(&[
        0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07, 0x3a,
        0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a,
    ]) else {
        return;
    };
    let Ok(set) = KeySet::new(vec![key], 1) else { return };
    let trust = Trust::new(Anchor::Release(set));
    let _ = updraft::manifest::keys_version_hint(data);
    let _ = updraft::manifest::verify(data, &trust);
    // The payload parser on its own, as if the signature had verified, and
    // the device's rules on what it accepts: channel, key epoch, policy.
    if let Ok(m) = updraft::manifest::Manifest::parse(data) {
        let _ = m.check_channel("stable");
        let _ = m.check_keys_version(Some(3));
        let _ = m.check_keys_version(None);
        let _ = m.check_policy(updraft::timestamp::Timestamp(1_800_000_000), Some(5), "rpi4");
        let _ = m.serial_reuse(Some(&updraft::hash::Sha256::of(data)));
    }
});
