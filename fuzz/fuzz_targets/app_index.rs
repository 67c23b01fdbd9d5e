//! The app tree index, the listing of paths a device creates as root for
//! a new application generation: whatever its bytes, parsing names an
//! error or gives an index whose every path is relative, free of `.`/`..`
//! segments, listed once in order below a directory listed before it, and
//! which writes back to lines that parse to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::app::index::{Entry, Index, Limits};

const LIMITS: Limits = Limits {
    entries: 10_000,
    bytes: 1 << 40,
};

fuzz_target!(|data: &[u8]| {
    let Ok(index) = Index::parse(data, LIMITS) else {
        return;
    };
    let mut dirs = std::collections::HashSet::new();
    let mut previous: Option<&str> = None;
    for e in &index.entries {
        let path = e.path();
        assert!(!path.starts_with('/'), "{path:?}");
        assert!(path.split('/').all(|s| !s.is_empty() && s != "." && s != ".."), "{path:?}");
        assert!(previous.is_none_or(|p| p < path), "{path:?} after {previous:?}");
        if let Some((dir, _)) = path.rsplit_once('/') {
            assert!(dirs.contains(dir), "{path:?} below an unlisted directory");
        }
        if let Entry::Dir { path } = e {
            dirs.insert(path.as_str());
        }
        previous = Some(path);
    }
    let again = Index::parse(index.to_lines().as_bytes(), LIMITS);
    assert_eq!(again.as_ref().ok(), Some(&index), "{again:?}");
});
