//! The headers of a release bundle (cpio newc): whatever the bytes, the
//! walk ends in an index whose entries lie inside the input, in the fixed
//! order, without duplicates and within their caps, or in an error naming
//! what is wrong. It never reads past the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::bundle::{self, MANIFEST, ReadAt, SW_DESCRIPTION};

struct Input<'a>(&'a [u8]);

impl ReadAt for Input<'_> {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> updraft::error::Result<()> {
        let start = usize::try_from(offset).expect("offsets the walk asks for fit in usize");
        let end = start + buf.len();
        assert!(end <= self.0.len(), "the walk read past the input: {start}..{end}");
        buf.copy_from_slice(&self.0[start..end]);
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    match bundle::index(&mut Input(data), len) {
        Ok(index) => {
            let e = index.entries();
            assert!(e.len() >= 2);
            assert_eq!(e[0].name, SW_DESCRIPTION);
            assert_eq!(e[1].name, MANIFEST);
            for (i, a) in e.iter().enumerate() {
                assert!(a.offset + a.size <= len);
                assert_eq!(a.offset % 4, 0);
                assert!(e[..i].iter().all(|b| b.name != a.name));
                assert!(a.name.len() <= bundle::MAX_NAME);
            }
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
