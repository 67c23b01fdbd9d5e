//! The signed `encryption` object of a manifest and its wrapped keys: any
//! JSON must be accepted or refused by the structural check, never panic;
//! for an accepted object, unwrapping with a device key (listed or not)
//! and opening a frame with the derived key fail cleanly or succeed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::encrypt::{FrameKey, SLOT_ARTIFACT, SecretKey, unwrap, unwrap_for};
use updraft::manifest::encryption::Encryption;

fuzz_target!(|data: &[u8]| {
    let Some((&frames, json)) = data.split_first() else {
        return;
    };
    let Ok(enc) = serde_json::from_slice::<Encryption>(json) else {
        return;
    };
    if enc.check(usize::from(frames)).is_err() {
        return;
    }
    let device = SecretKey::from_bytes([7; 32]);
    let _ = unwrap_for(&enc, &device);
    for (i, r) in enc.recipients.iter().enumerate() {
        let entry = r.decode(i).expect("checked entries decode");
        if let Ok(key) = unwrap(&entry, &device) {
            let fk = FrameKey::derive(&key, SLOT_ARTIFACT, enc.frame_sha256.clone())
                .expect("derivation of a 32-byte key");
            let mut buf = json.to_vec();
            let _ = fk.open(0, 1, &mut buf);
        }
    }
});
