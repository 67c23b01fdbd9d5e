//! The DDI documents a fleet server sends (controller base, deploymentBase,
//! cancelAction): whatever the bytes, each parser ends in a value that keeps
//! the module's limits (https links without credentials, plain action ids,
//! file names that are not paths, bounded counts) or in an error naming
//! what is wrong. It never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::ddi;

fn https(link: &str) {
    assert!(link.starts_with("https://") && link.len() <= ddi::MAX_URL);
    assert!(!link.chars().any(|c| c.is_whitespace() || c.is_control()));
}

fn id(s: &str) {
    assert!(!s.is_empty() && s.len() <= ddi::MAX_TOKEN);
    assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
}

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = ddi::controller_base(data) {
        for l in [&b.deployment, &b.cancel].into_iter().flatten() {
            https(&l.href);
            id(&l.action_id);
        }
        if let Some(c) = &b.config_data {
            https(c);
        }
    }
    match ddi::deployment(data) {
        Ok(d) => {
            id(&d.action_id);
            assert!(!d.chunks.is_empty() && d.chunks.len() <= ddi::MAX_CHUNKS);
            for c in &d.chunks {
                assert!(c.artifacts.len() <= ddi::MAX_ARTIFACTS);
                for a in &c.artifacts {
                    assert!(!a.filename.contains('/') && a.filename != "..");
                    if let Some(l) = &a.download {
                        https(l);
                    }
                }
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Ok(c) = ddi::cancel(data) {
        id(&c.action_id);
        id(&c.stop_id);
    }
});
