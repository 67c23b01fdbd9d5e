//! Untrusted provenance attestations: the in-toto statement as a device
//! reads it (after the builder signature, and as bytes of any kind before
//! it), and the whole envelope against a builder key. Whatever the bytes,
//! each is accepted or refused, never a panic; an accepted statement has
//! 1 to the maximum number of subjects with distinct names, and the rule
//! over it answers for any manifest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::keys::{KeySet, PublicKey};
use updraft::manifest::provenance::{self, MAX_SUBJECTS, Statement};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Statement::parse(data) {
        assert!(!s.subjects.is_empty() && s.subjects.len() <= MAX_SUBJECTS);
        let mut names: Vec<&str> = s.subjects.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), s.subjects.len());
    }
    let Ok(key) = PublicKey::from_bytes(&[0x3b; 32]) else {
        return;
    };
    let Ok(keys) = KeySet::new(vec![key], 1) else {
        return;
    };
    // No signature made by a fuzzer verifies; this walks the envelope's
    // bounds and refusals.
    assert!(provenance::verify(data, &keys).is_err());
});
