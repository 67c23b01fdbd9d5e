//! The release description file `updraft-publish release --description`
//! reads: whatever its bytes, parsing names an error that starts with the
//! file's path, or gives a description whose every component name passes
//! the manifest's name check, whose every path is below the file's
//! directory unless it was absolute, and which holds at most 15
//! components besides its slot.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("/build/release.toml");
    match updraft_publish::description::parse(text, file) {
        Err(e) => assert!(e.starts_with("release description /build/release.toml: "), "{e}"),
        Ok(d) => {
            let components = d.apps.iter().chain(&d.commands);
            assert!(components.clone().count() <= 15);
            for c in components {
                assert!(updraft::manifest::component::check_name(&c.name).is_ok(), "{c:?}");
                assert!(c.dir.is_absolute(), "{c:?}: resolved against /build");
            }
            if let Some(name) = &d.slot_name {
                assert!(updraft::manifest::component::check_name(name).is_ok(), "{name:?}");
            }
        }
    }
});
