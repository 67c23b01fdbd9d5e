//! Untrusted key documents against provisioned root keys.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::trust::{Anchor, KeySet, PublicKey, Trust};

fuzz_target!(|data: &[u8]| {
    let Ok(key) = PublicKey::from_bytes(&[
        0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07, 0x3a,
        0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a,
    ]) else {
        return;
    };
    let Ok(set) = KeySet::new(vec![key], 1) else { return };
    let anchor = Anchor::Root { keys: set, version: 0 };
    let mut trust = Trust::new(anchor.clone());
    let _ = trust.accept(data, "fuzzed key document");
    // A stored chain: the input cut at NUL bytes into documents stored as
    // versions 1, 2, …, walked again from the provisioned roots.
    let stored: Vec<(u64, Vec<u8>)> = data
        .split(|b| *b == 0)
        .take(8)
        .zip(1u64..)
        .map(|(d, v)| (v, d.to_vec()))
        .collect();
    let (restored, discarded) = Trust::restore(anchor, &stored);
    assert!(restored.version() as usize + discarded.len() <= stored.len() + 1);
});
