//! The signed `encryption` object of a manifest and its wrapped keys, and
//! the chunk opener of a sealed delta: any JSON must be accepted or refused
//! by the structural check, never panic; for an accepted object, unwrapping
//! with a device key (listed or not) and opening a frame with the derived
//! key fail cleanly or succeed. Any bytes opened as a sealed delta are
//! refused, and a sealed stream with the input spliced in opens to what was
//! sealed or is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::encrypt::chunks::{ChunkKey, open_all, seal_all};
use updraft::encrypt::{ContentKey, FrameKey, SLOT_ARTIFACT, SecretKey, unwrap, unwrap_for};
use updraft::hash::Sha256;
use updraft::manifest::encryption::Encryption;

fn chunks(data: &[u8]) {
    let Ok(content) = ContentKey::random() else {
        return;
    };
    let key = ChunkKey::for_delta(&content, &Sha256::of(b"source")).expect("derivation");
    // Bytes nobody sealed under this key never open.
    assert!(open_all(&key, data).is_err());
    // A sealed stream with the input written over part of it.
    let plain: Vec<u8> = data.iter().rev().copied().collect();
    let mut sealed = seal_all(&key, &plain).expect("sealing in memory");
    let at = data.first().map_or(0, |&b| usize::from(b)) % sealed.len().max(1);
    let end = (at + data.len()).min(sealed.len());
    sealed[at..end].copy_from_slice(&data[..end - at]);
    if data.len() % 3 == 0 {
        sealed.truncate(data.len() % (sealed.len() + 1));
    }
    if let Ok(out) = open_all(&key, &sealed) {
        assert_eq!(out, plain);
    }
}

fuzz_target!(|data: &[u8]| {
    chunks(data);
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
