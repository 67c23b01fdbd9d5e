//! The headers of a release bundle (cpio newc): whatever the bytes, the
//! walk ends in an index whose entries lie inside the input, in the fixed
//! order, without duplicates and within their caps, or in an error naming
//! what is wrong. It never reads past the input. Every artifact the index
//! resolves is its parts in order (`<url>`, `<url>.part-2`, …, consecutive
//! entries, none empty when there are several), adding up to its size, and
//! reading it from any offset covers exactly the rest of it, inside the
//! input; the name of a later part resolves to nothing.
//!
//! Raw bytes rarely get past the first header, so each input is also read
//! as a recipe for an archive of well-formed headers ([`built`]): entries
//! from a small set of names (split artifacts among them) in any order,
//! with any small sizes, some header bytes flipped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::bundle::{
    self, MANIFEST, ReadAt, SW_DESCRIPTION, TRAILER, continuation, data_padding, header, part_name,
};

struct Input<'a>(&'a [u8]);

impl ReadAt for Input<'_> {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> updraft::error::Result<()> {
        let start = usize::try_from(offset).expect("offsets the walk asks for fit in usize");
        let end = start + buf.len();
        assert!(
            end <= self.0.len(),
            "the walk read past the input: {start}..{end}"
        );
        buf.copy_from_slice(&self.0[start..end]);
        Ok(())
    }
}

/// An archive made from `recipe`: each 2-byte record is an entry, its
/// name from a small table by the first byte (part numbers from its high
/// bits) and its size the second byte; a 0xFF record ends the records and
/// the bytes after it, in pairs (offset, value), are written over the
/// archive.
fn built(recipe: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = recipe;
    let mut ino = 1;
    while let [k, size, tail @ ..] = rest {
        rest = tail;
        if *k == 0xFF {
            break;
        }
        let n = usize::from(k >> 3);
        let name = match k % 8 {
            0 => SW_DESCRIPTION.to_string(),
            1 => MANIFEST.to_string(),
            2 => format!("keys/{n}.json"),
            3 => "artifacts/a.zst".to_string(),
            4 => part_name("artifacts/a.zst", n),
            5 => "artifacts/b".to_string(),
            6 => format!("artifacts/b.part-0{n}"),
            _ => part_name("artifacts/b", n),
        };
        out.extend(header(&name, u32::from(*size), ino));
        out.extend(std::iter::repeat_n(*k, usize::from(*size)));
        out.extend(std::iter::repeat_n(0, data_padding(u64::from(*size))));
        ino += 1;
    }
    out.extend(header(TRAILER, 0, 0));
    for pair in rest.chunks_exact(2) {
        let at = usize::from(pair[0]) * out.len() / 256;
        out[at] = pair[1];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    check(data);
    check(&built(data));
});

fn check(data: &[u8]) {
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
            for (i, entry) in e.iter().enumerate() {
                if !entry.name.starts_with("artifacts/") {
                    continue;
                }
                match continuation(&entry.name) {
                    Ok(None) => {}
                    Ok(Some((base, n))) => {
                        // A later part follows the part before it.
                        assert_eq!(e[i - 1].name, part_name(base, n - 1));
                        assert!(entry.size > 0 && e[i - 1].size > 0);
                        assert!(index.artifact(&entry.name).is_err());
                        continue;
                    }
                    Err(err) => panic!("the walk accepted {:?}: {err}", entry.name),
                }
                let a = index
                    .artifact(&entry.name)
                    .expect("an artifact entry resolves");
                assert_eq!(a.segments[0], *entry);
                for (k, s) in a.segments.iter().enumerate() {
                    assert_eq!(s.name, part_name(&entry.name, k + 1));
                    assert_eq!(e[i + k], *s);
                    assert!(a.segments.len() == 1 || s.size > 0);
                }
                assert_eq!(a.size, a.segments.iter().map(|s| s.size).sum::<u64>());
                for offset in [0, 1, a.size / 2, a.size.saturating_sub(1), a.size] {
                    let r = a.ranges(offset);
                    let covered: u64 = r.iter().map(|&(_, n)| n).sum();
                    assert_eq!(covered, a.size - offset.min(a.size));
                    for (at, n) in r {
                        assert!(n > 0 && at + n <= len);
                    }
                }
            }
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
}
