//! A report as a fleet server received it, fed to
//! `updraft-publish verify-reports`: whatever its bytes, checking it ends
//! in a refusal that names what is wrong or in the signed facts of a
//! report the device key really signed (which random bytes never are),
//! and a DDI feedback's signature line parses or is refused by name. It
//! never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::device_key::DeviceKey;
use updraft_publish::reports::{self, Verifier};

fuzz_target!(|data: &[u8]| {
    let Ok(key) = DeviceKey::from_seed(&[5; 32]) else {
        return;
    };
    let keys = vec![key.public().clone()];
    match reports::check_report(data, &keys) {
        Err(e) => assert!(!e.is_empty()),
        // Only the key's holder makes a valid signature: the fuzzer
        // cannot, so an accepted report means the check is broken.
        Ok(s) => panic!("unsigned bytes accepted as counter {}", s.counter),
    }
    let mut v = Verifier::new(keys);
    for (name, bytes) in reports::split("fuzz", data) {
        let line = v.check(&name, &bytes);
        assert!(line.starts_with(&name), "{line}");
    }
    assert_eq!(v.refused, v.checked);
    // A DDI feedback's signature line: parsed or refused by name.
    if let Ok(text) = std::str::from_utf8(data) {
        match updraft::signed_report::parse_ddi_line(text) {
            Ok(l) => assert!(text.contains(&format!("counter={} ", l.counter))),
            Err(e) => assert!(!e.is_empty()),
        }
    }
});
