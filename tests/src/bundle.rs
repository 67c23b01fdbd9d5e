//! Release bundles taken apart and put together again, for the tests of
//! bundles: where each entry of a bundle made by `updraft-publish bundle`
//! lies, and hostile variants of it (entries reordered, dropped, doubled,
//! emptied, resized) written with the same header function the publisher
//! uses, with what the device must say about each.
//!
//! A good bundle is read with the device's own walker (`updraft::bundle`):
//! its input here is the publisher's output, not the hostile bytes under
//! test. This module never decides what a test asserts.

use std::path::Path;

use serde_json::json;
use updraft::bundle::{self, Index, TRAILER, data_padding, header};

use crate::device::Snapshot;

/// One entry: its name and its bytes.
pub type Entry = (String, Vec<u8>);

/// The index of a (good) bundle: its entries' names, offsets and sizes.
pub fn layout(path: &Path) -> Index {
    let mut f = std::fs::File::open(path).expect("opening a bundle");
    let len = f.metadata().expect("bundle metadata").len();
    bundle::index(&mut f, len).expect("a good bundle")
}

/// The entries of a (good) bundle, in archive order, with their bytes.
pub fn entries(path: &Path) -> Vec<Entry> {
    let bytes = std::fs::read(path).expect("reading a bundle");
    layout(path)
        .entries()
        .iter()
        .map(|e| {
            let at = e.offset as usize;
            (e.name.clone(), bytes[at..at + e.size as usize].to_vec())
        })
        .collect()
}

/// A cpio newc archive of `entries` and the trailer, padded to a 512-byte
/// block, as the publisher writes one.
pub fn archive(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, (name, data)) in entries.iter().enumerate() {
        out.extend(header(name, data.len() as u32, i as u32 + 1));
        out.extend_from_slice(data);
        out.extend(std::iter::repeat_n(0, data_padding(data.len() as u64)));
    }
    out.extend(header(TRAILER, 0, 0));
    out.extend(std::iter::repeat_n(0, (512 - out.len() % 512) % 512));
    out
}

/// Where entry `name` sits in `entries`.
pub fn position(entries: &[Entry], name: &str) -> usize {
    entries
        .iter()
        .position(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no entry {name:?} in the bundle"))
}

/// How far a hostile bundle gets.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Refused {
    /// At the walk of the headers, before the manifest is read: nothing
    /// changes at all.
    Walk,
    /// When the artifact is opened, after the manifest was accepted: the
    /// serial is stored, nothing is written to either slot.
    Open,
}

/// A hostile variant of a bundle whose image artifact is split.
pub struct Hostile {
    /// What is wrong with it.
    pub what: &'static str,
    pub bytes: Vec<u8>,
    /// What the device's error must say.
    pub needle: &'static str,
    pub refused: Refused,
}

impl Hostile {
    /// Check a refusal of this variant: its error `err`, and the device
    /// as it was `before` and is `after`.
    pub fn assert_refused(&self, err: &str, before: &Snapshot, after: &Snapshot) {
        let what = self.what;
        assert!(
            err.contains(self.needle),
            "{what}: the error says {:?}:\n{err}",
            self.needle
        );
        match self.refused {
            Refused::Walk => before.assert_unchanged(after),
            Refused::Open => {
                assert_eq!(before.slot_a, after.slot_a, "{what}: slot A changed");
                assert_eq!(before.slot_b, after.slot_b, "{what}: slot B changed");
                assert_eq!(before.boot_state, after.boot_state, "{what}");
                assert_eq!(after.state, json!("idle"), "{what}");
            }
        }
    }
}

/// Every hostile arrangement of the parts of a split artifact, made from
/// the `good` entries of a bundle whose artifact is in the entries
/// `parts` (at least three): parts out of order, a gap, a duplicate, an
/// empty part, a part running past the end of the file (the good bundle
/// cut to `cut` bytes, inside its last part), and parts adding up to more
/// or less than the signed size.
pub fn hostile_parts(good: &[Entry], parts: &[String], cut: usize) -> Vec<Hostile> {
    assert!(parts.len() >= 3, "{parts:?}");
    let at = |name: &str| position(good, name);
    let with = |edit: &dyn Fn(&mut Vec<Entry>)| {
        let mut e = good.to_vec();
        edit(&mut e);
        archive(&e)
    };
    let last = parts.len() - 1;
    let h = |what, bytes, needle, refused| Hostile {
        what,
        bytes,
        needle,
        refused,
    };
    vec![
        h(
            "parts out of order",
            with(&|e| e.swap(at(&parts[1]), at(&parts[2]))),
            "does not come right after",
            Refused::Walk,
        ),
        h(
            "a gap",
            with(&|e| {
                e.remove(at(&parts[1]));
            }),
            "does not come right after",
            Refused::Walk,
        ),
        h(
            "a duplicate part",
            with(&|e| {
                let p = e[at(&parts[1])].clone();
                e.insert(at(&parts[1]) + 1, p);
            }),
            "twice",
            Refused::Walk,
        ),
        h(
            "a part of size 0",
            with(&|e| e[at(&parts[1])].1.clear()),
            "is empty",
            Refused::Walk,
        ),
        h(
            "a part beyond the file",
            archive(good)[..cut].to_vec(),
            "past the bundle's end",
            Refused::Walk,
        ),
        h(
            "parts summing to more than the signed size",
            with(&|e| {
                let extra = (
                    format!("{}.part-{}", parts[0], parts.len() + 1),
                    vec![7u8; 9],
                );
                e.insert(at(&parts[last]) + 1, extra);
            }),
            "longer than signed",
            Refused::Open,
        ),
        h(
            "parts summing to less than the signed size",
            with(&|e| {
                e.remove(at(&parts[last]));
            }),
            "shorter than signed",
            Refused::Open,
        ),
    ]
}
