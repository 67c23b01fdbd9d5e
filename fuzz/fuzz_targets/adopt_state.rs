//! What `updraft adopt` reads of another updater's files: RAUC's
//! `system.conf` and status file (GLib key files), Mender's JSON
//! configuration and its `device_type`/`artifact_info` lines. Whatever
//! the bytes, each parse gives an error naming the file, or values that
//! keep every rule adopt relies on: two distinct bootable slots with
//! absolute devices and distinct bootnames, a version of 1 to 128
//! characters without spaces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::adopt::{mender, rauc};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match rauc::parse_system(text, "system.conf") {
        Ok(s) => {
            assert!(!s.compatible.is_empty());
            assert!(s.pair[0].device.is_absolute() && s.pair[1].device.is_absolute());
            assert_ne!(s.pair[0].device, s.pair[1].device);
            assert_ne!(s.pair[0].bootname, s.pair[1].bootname);
            assert!(s.status_file.as_ref().is_none_or(|p| p.is_absolute()));
        }
        Err(e) => assert!(e.starts_with("system.conf"), "{e}"),
    }
    match rauc::slot_version(text, "central.raucs", "rootfs.0") {
        Ok(Some(v)) => assert!(!v.is_empty() && !v.chars().any(char::is_control)),
        Ok(None) => {}
        Err(e) => assert!(e.starts_with("central.raucs"), "{e}"),
    }
    match mender::parse_conf(&[("mender.conf", text)]) {
        Ok(r) => assert!(r.a.is_absolute() && r.b.is_absolute() && r.a != r.b),
        Err(e) => assert!(e.starts_with("mender.conf"), "{e}"),
    }
    match mender::parse_assignment(text, "artifact_info", "artifact_name") {
        Ok(v) => {
            assert!(!v.is_empty() && v.len() <= 128);
            assert!(!v.chars().any(|c| c.is_control() || c.is_whitespace()));
        }
        Err(e) => assert!(e.starts_with("artifact_info"), "{e}"),
    }
});
