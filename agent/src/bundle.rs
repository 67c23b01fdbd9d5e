//! The single-file release bundle: a publisher's release directory in one
//! cpio "newc" archive (`updraft-publish bundle`, docs/manifest.md), so a
//! release can travel on a USB stick or be stored as one file by a fleet
//! server that indexes SWUpdate-style files.
//!
//! The archive's entries are, in this order and nothing else:
//!
//! 1. `sw-description`: the version and hardware compatibility in
//!    SWUpdate's syntax, for servers that index bundles; updraft never
//!    reads it (it is not signed);
//! 2. `manifest.json`: the signed manifest;
//! 3. `keys/N.json`: the key documents, any number;
//! 4. `artifacts/…`: the framed image and the deltas, any number; one
//!    larger than a newc entry holds (4 GiB − 1) is split into parts:
//!    the entry named by its url, then `<url>.part-2`, `<url>.part-3`, …
//!    right after it ([`PART_SUFFIX`]);
//! 5. `TRAILER!!!`, empty; whatever follows it (block padding) is ignored.
//!
//! This module owns walking the headers into an [`Index`] of entry names,
//! offsets and sizes. The headers are not signed, so the walk trusts
//! nothing: fixed names in a fixed order, no duplicates, names of at most
//! [`MAX_NAME`] bytes made of plain path segments, regular files only,
//! every size within the archive and, for the small entries, within the
//! caps the directory form has; the parts of a split artifact consecutive,
//! in order, without gaps and none of them empty. It must never read an
//! entry's data (the
//! caller reads only what it needs, at the offsets the index gives) and
//! never decide whether a release is good: the signed manifest does that,
//! and every artifact's length is checked against its signed size when it
//! is opened.

use crate::error::Result;
use crate::manifest::MAX_MANIFEST_BYTES;
use crate::trust::MAX_KEY_DOCUMENT_BYTES;
use crate::{bail, err};

/// The first entry's name.
pub const SW_DESCRIPTION: &str = "sw-description";
/// The second entry's name.
pub const MANIFEST: &str = "manifest.json";
/// The name of the entry that ends the archive.
pub const TRAILER: &str = "TRAILER!!!";
/// The longest entry name, without its terminating NUL.
pub const MAX_NAME: usize = 255;
/// The most entries a bundle may hold (a release has a handful).
pub const MAX_ENTRIES: usize = 256;
/// The largest `sw-description` accepted.
pub const MAX_SW_DESCRIPTION: u64 = 64 * 1024;
/// The bytes of a newc header before the name.
pub const HEADER_LEN: usize = 110;
/// The most bytes one entry holds: the newc filesize field is 32 bits.
pub const MAX_ENTRY_SIZE: u64 = u32::MAX as u64;
/// What follows an artifact's url in the names of its second and later
/// parts: `<url>.part-2`, `<url>.part-3`, … (the first part is the entry
/// named `<url>` itself).
pub const PART_SUFFIX: &str = ".part-";
/// The magic of a newc header without checksums.
const MAGIC: &[u8; 6] = b"070701";
/// `S_IFMT` and `S_IFREG` of a header's mode.
const TYPE_MASK: u32 = 0o170_000;
const REGULAR: u32 = 0o100_000;

/// Reads at absolute offsets of the bundle: a local file, or HTTP Range
/// requests.
pub trait ReadAt {
    /// Fill `buf` from `offset`, or fail (a short archive is an error).
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()>;
}

impl ReadAt for std::fs::File {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
            .map_err(|e| err!(Io, "reading {} bytes at offset {offset}: {e}", buf.len()))
    }
}

/// One file in the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Offset of the entry's first data byte in the bundle.
    pub offset: u64,
    pub size: u64,
}

/// The entries of a bundle, in archive order, without the trailer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Index {
    entries: Vec<Entry>,
}

impl Index {
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The entries that hold the artifact or delta `url`, in order. Inside
    /// a bundle a url is the name of its (first) entry (`artifacts/…`, as
    /// in the directory form); an absolute URL names nothing in the
    /// archive, nor does the name of a second or later part.
    pub fn artifact(&self, url: &str) -> Result<Artifact> {
        if url.contains("://") {
            bail!(
                Malformed,
                "the manifest names {url}, a URL, but a bundle holds its artifacts as entries"
            );
        }
        if let Some((base, n)) = continuation(url)? {
            bail!(
                Malformed,
                "the manifest names {url:?}, which in a bundle is part {n} of {base:?}, not an artifact"
            );
        }
        let first = self
            .entries
            .iter()
            .position(|e| e.name == url)
            .ok_or_else(|| {
                err!(
                    Malformed,
                    "the bundle has no entry {url:?} that the manifest names"
                )
            })?;
        let mut segments = vec![self.entries[first].clone()];
        for e in &self.entries[first + 1..] {
            if e.name != part_name(url, segments.len() + 1) {
                break;
            }
            segments.push(e.clone());
        }
        // Each part is below 2^32 bytes and there are at most MAX_ENTRIES.
        let size = segments.iter().map(|e| e.size).sum();
        Ok(Artifact {
            name: url.to_string(),
            segments,
            size,
        })
    }

    /// The manifest entry (always present in an index).
    pub fn manifest(&self) -> &Entry {
        &self.entries[1]
    }
}

/// An artifact or delta as the bundle holds it: one entry, or the parts
/// of a split one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    /// The url the manifest names (the first part's entry name).
    pub name: String,
    /// The entries holding it, in order; never empty.
    pub segments: Vec<Entry>,
    /// The sum of the segments' sizes (checked against the signed size by
    /// whoever opens it).
    pub size: u64,
}

impl Artifact {
    /// The byte ranges of the bundle (`(offset, length)`, none empty) that
    /// hold the artifact's bytes from `offset` to its end, in order: how a
    /// transfer resumed at `offset` reads it. Empty when `offset` is at or
    /// past the end.
    pub fn ranges(&self, offset: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut skip = offset;
        for e in &self.segments {
            if skip >= e.size {
                skip -= e.size;
                continue;
            }
            out.push((e.offset + skip, e.size - skip));
            skip = 0;
        }
        out
    }
}

/// The entry name of part `n` (from 1) of the artifact `url`: `url` itself
/// for the first part, `url.part-N` for the others.
pub fn part_name(url: &str, n: usize) -> String {
    if n <= 1 {
        url.to_string()
    } else {
        format!("{url}{PART_SUFFIX}{n}")
    }
}

/// When `name` ends in [`PART_SUFFIX`] and digits, the artifact it is a
/// part of and the part's number. The number must be 2 or more, written
/// without leading zeros: a name like `x.part-1` or `x.part-07` is refused
/// rather than read as an artifact of its own.
pub fn continuation(name: &str) -> Result<Option<(&str, usize)>> {
    let Some(at) = name.rfind(PART_SUFFIX) else {
        return Ok(None);
    };
    let digits = &name[at + PART_SUFFIX.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    let n = digits
        .parse::<usize>()
        .ok()
        .filter(|&n| n >= 2 && !digits.starts_with('0'));
    match n {
        Some(n) => Ok(Some((&name[..at], n))),
        None => bail!(
            Malformed,
            "bundle entry name {name:?} ends in {PART_SUFFIX}{digits}, which is not a part number \
             (parts after the first are numbered from 2, without leading zeros)"
        ),
    }
}

/// Where an entry sits in the fixed order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    SwDescription,
    Manifest,
    Key,
    Artifact,
}

fn part_of(name: &str) -> Result<Part> {
    if name == SW_DESCRIPTION {
        return Ok(Part::SwDescription);
    }
    if name == MANIFEST {
        return Ok(Part::Manifest);
    }
    if let Some(n) = name
        .strip_prefix("keys/")
        .and_then(|f| f.strip_suffix(".json"))
    {
        if !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Part::Key);
        }
    }
    if let Some(rest) = name.strip_prefix("artifacts/") {
        let plain = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
        };
        if rest.split('/').all(plain) {
            return Ok(Part::Artifact);
        }
    }
    bail!(
        Malformed,
        "bundle entry {name:?} is not one a bundle holds (sw-description, manifest.json, \
         keys/N.json, artifacts/…)"
    )
}

/// The largest an entry of `part` may be; an artifact is bounded by the
/// 32-bit size field alone (and its signed size, checked when opened).
fn cap(part: Part) -> Option<u64> {
    match part {
        Part::SwDescription => Some(MAX_SW_DESCRIPTION),
        Part::Manifest => Some(MAX_MANIFEST_BYTES as u64),
        Part::Key => Some(MAX_KEY_DOCUMENT_BYTES as u64),
        Part::Artifact => None,
    }
}

/// The rules for the parts of a split artifact, checked at entry `name`
/// of `size` bytes that follows `previous`: a second or later part comes
/// right after the part before it, and neither is empty.
fn check_part(name: &str, size: u64, previous: Option<&Entry>) -> Result<()> {
    let Some((base, n)) = continuation(name)? else {
        return Ok(());
    };
    let before = part_name(base, n - 1);
    match previous {
        Some(p) if p.name == before => {
            if p.size == 0 {
                bail!(
                    Malformed,
                    "bundle entry {before:?} is empty, but {name:?} continues it: no part of a \
                     split artifact is empty"
                );
            }
        }
        _ => bail!(
            Malformed,
            "bundle entry {name:?} is part {n} of {base:?}, but it does not come right after \
             {before:?} (parts come one after the other, in order, with none missing)"
        ),
    }
    if size == 0 {
        bail!(
            Malformed,
            "bundle entry {name:?} is empty: no part of a split artifact is empty"
        );
    }
    Ok(())
}

/// `n` rounded up to a multiple of 4.
fn pad4(n: u64) -> Option<u64> {
    n.checked_add(3).map(|v| v & !3)
}

/// One 8-digit hexadecimal header field.
fn hex_field(header: &[u8], i: usize, what: &str, at: u64) -> Result<u32> {
    let start = 6 + 8 * i;
    let digits = &header[start..start + 8];
    let text = std::str::from_utf8(digits).unwrap_or("");
    if text.len() != 8 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            Malformed,
            "bundle header at offset {at}: its {what} field {:?} is not 8 hexadecimal digits",
            String::from_utf8_lossy(digits)
        );
    }
    u32::from_str_radix(text, 16)
        .map_err(|e| err!(Malformed, "bundle header at offset {at}: {what}: {e}"))
}

/// Walk the headers of a bundle of `len` bytes.
pub fn index(r: &mut dyn ReadAt, len: u64) -> Result<Index> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut at: u64 = 0;
    let mut last = None;
    loop {
        if entries.len() > MAX_ENTRIES {
            bail!(Malformed, "bundle has more than {MAX_ENTRIES} entries");
        }
        let header_end = at + HEADER_LEN as u64;
        if header_end > len {
            bail!(
                Malformed,
                "bundle ends at byte {len} inside the header at offset {at} (no {TRAILER} entry)"
            );
        }
        let mut header = [0u8; HEADER_LEN];
        r.read_exact_at(at, &mut header)?;
        if &header[..6] != MAGIC {
            bail!(
                Malformed,
                "bundle header at offset {at} starts with {:?}, not the cpio newc magic 070701",
                String::from_utf8_lossy(&header[..6])
            );
        }
        let mode = hex_field(&header, 1, "mode", at)?;
        let size = u64::from(hex_field(&header, 6, "filesize", at)?);
        let name_size = hex_field(&header, 11, "namesize", at)? as usize;
        let check = hex_field(&header, 12, "check", at)?;
        if check != 0 {
            bail!(
                Malformed,
                "bundle header at offset {at} has check {check:#x}; newc headers carry 0"
            );
        }
        if !(2..=MAX_NAME + 1).contains(&name_size) {
            bail!(
                Malformed,
                "bundle header at offset {at} has a {name_size}-byte name (1 to {MAX_NAME} \
                 bytes and a NUL)"
            );
        }
        let name_end = header_end + name_size as u64;
        if name_end > len {
            bail!(
                Malformed,
                "bundle ends at byte {len} inside the name at offset {header_end}"
            );
        }
        let mut raw = vec![0u8; name_size];
        r.read_exact_at(header_end, &mut raw)?;
        if raw.pop() != Some(0) || raw.contains(&0) {
            bail!(
                Malformed,
                "bundle entry name at offset {header_end} is not one NUL-terminated string"
            );
        }
        let name = String::from_utf8(raw).map_err(|_| {
            err!(
                Malformed,
                "bundle entry name at offset {header_end} is not UTF-8"
            )
        })?;
        let data = pad4(name_end).ok_or_else(|| err!(Malformed, "bundle offsets overflow"))?;
        if name == TRAILER {
            if size != 0 {
                bail!(Malformed, "the bundle's {TRAILER} entry holds {size} bytes");
            }
            break;
        }
        let part = part_of(&name)?;
        if mode & TYPE_MASK != REGULAR {
            bail!(
                Malformed,
                "bundle entry {name:?} has mode {mode:o}: only regular files belong in a bundle"
            );
        }
        match (entries.len(), part) {
            (0, Part::SwDescription) | (1, Part::Manifest) => {}
            (0, _) => bail!(
                Malformed,
                "bundle entry {name:?} comes first, but a bundle starts with {SW_DESCRIPTION}"
            ),
            (1, _) => bail!(
                Malformed,
                "bundle entry {name:?} comes second, but {MANIFEST} must follow {SW_DESCRIPTION}"
            ),
            (_, Part::Key | Part::Artifact) => {
                if last.is_some_and(|l| part < l) {
                    bail!(
                        Malformed,
                        "bundle entry {name:?} comes after an artifact: key documents come first"
                    );
                }
            }
            (_, _) => bail!(Malformed, "bundle holds a second {name:?}"),
        }
        if entries.iter().any(|e| e.name == name) {
            bail!(Malformed, "bundle holds {name:?} twice");
        }
        if part == Part::Artifact {
            check_part(&name, size, entries.last())?;
        }
        if let Some(cap) = cap(part).filter(|&cap| size > cap) {
            bail!(
                Malformed,
                "bundle entry {name:?} is {size} bytes, above its {cap}-byte limit"
            );
        }
        let end = data
            .checked_add(size)
            .ok_or_else(|| err!(Malformed, "bundle offsets overflow"))?;
        if end > len {
            bail!(
                Malformed,
                "bundle entry {name:?} claims {size} bytes from offset {data}, past the bundle's \
                 end at byte {len}"
            );
        }
        entries.push(Entry {
            name,
            offset: data,
            size,
        });
        last = Some(part);
        at = pad4(end).ok_or_else(|| err!(Malformed, "bundle offsets overflow"))?;
    }
    if entries.len() < 2 {
        bail!(
            Malformed,
            "bundle ends before its {}",
            if entries.is_empty() {
                SW_DESCRIPTION
            } else {
                MANIFEST
            }
        );
    }
    Ok(Index { entries })
}

/// One newc header and name for an entry of `size` bytes, padded so the
/// data that follows starts at a multiple of 4 (for a header that starts
/// at one). For the publisher, and for tests.
pub fn header(name: &str, size: u32, ino: u32) -> Vec<u8> {
    let mode = if name == TRAILER { 0 } else { REGULAR | 0o644 };
    let nlink = u32::from(name != TRAILER);
    let name_size = name.len() as u32 + 1;
    let fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, name_size, 0];
    let mut out = Vec::with_capacity(HEADER_LEN + name.len() + 4);
    out.extend_from_slice(MAGIC);
    for f in fields {
        out.extend_from_slice(format!("{f:08X}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

/// The zero bytes that pad `size` bytes of data to a multiple of 4.
pub fn data_padding(size: u64) -> usize {
    ((4 - size % 4) % 4) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;

    struct Bytes(Vec<u8>);

    impl ReadAt for Bytes {
        fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            let end = start.saturating_add(buf.len());
            let src = self
                .0
                .get(start..end)
                .ok_or_else(|| err!(Io, "short read at {offset}"))?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    fn archive(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, (name, data)) in entries.iter().enumerate() {
            out.extend(header(name, data.len() as u32, i as u32 + 1));
            out.extend_from_slice(data);
            out.extend(std::iter::repeat_n(0, data_padding(data.len() as u64)));
        }
        out.extend(header(TRAILER, 0, 0));
        out.extend(std::iter::repeat_n(0, 512 - out.len() % 512));
        out
    }

    fn walk(bytes: Vec<u8>) -> Result<Index> {
        let len = bytes.len() as u64;
        index(&mut Bytes(bytes), len)
    }

    fn refused(bytes: Vec<u8>, needle: &str) {
        match walk(bytes) {
            Ok(i) => panic!("accepted {:?}", i.entries()),
            Err(e) => {
                assert_eq!(e.kind(), Kind::Malformed, "{e}");
                assert!(e.to_string().contains(needle), "{e}");
            }
        }
    }

    const GOOD: &[(&str, &[u8])] = &[
        ("sw-description", b"software = { version = \"1.0\"; };\n"),
        ("manifest.json", b"{\"signed\":{}}"),
        ("keys/1.json", b"{}"),
        ("artifacts/abc.img.zst", b"frames!"),
        ("artifacts/deltas/abc-def.delta", b"d"),
    ];

    #[test]
    fn entries_are_found_at_their_offsets() {
        let bytes = archive(GOOD);
        let i = walk(bytes.clone()).unwrap();
        let names: Vec<&str> = i.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sw-description",
                "manifest.json",
                "keys/1.json",
                "artifacts/abc.img.zst",
                "artifacts/deltas/abc-def.delta"
            ]
        );
        for (e, (_, data)) in i.entries().iter().zip(GOOD) {
            assert_eq!(e.offset % 4, 0, "{e:?}");
            let at = e.offset as usize;
            assert_eq!(&bytes[at..at + e.size as usize], *data, "{e:?}");
        }
        assert_eq!(i.manifest().name, "manifest.json");
        assert_eq!(i.artifact("artifacts/abc.img.zst").unwrap().size, 7);
    }

    #[test]
    fn an_absolute_or_unknown_artifact_url_names_no_entry() {
        let i = walk(archive(GOOD)).unwrap();
        let e = i.artifact("https://cdn.example/abc.img.zst").unwrap_err();
        assert!(e.to_string().contains("a URL"), "{e}");
        let e = i.artifact("artifacts/other.img.zst").unwrap_err();
        assert!(e.to_string().contains("no entry"), "{e}");
    }

    #[test]
    fn the_order_is_fixed() {
        refused(archive(&[GOOD[1], GOOD[0]]), "comes first");
        refused(archive(&[GOOD[0], GOOD[2], GOOD[1]]), "comes second");
        refused(
            archive(&[GOOD[0], GOOD[1], GOOD[3], GOOD[2]]),
            "comes after an artifact",
        );
        refused(archive(&[GOOD[0], GOOD[1], GOOD[1]]), "second");
        refused(archive(&[GOOD[0], GOOD[1], GOOD[3], GOOD[3]]), "twice");
        refused(archive(&[GOOD[0]]), "before its manifest.json");
        refused(archive(&[]), "before its sw-description");
    }

    #[test]
    fn names_outside_the_layout_are_refused() {
        for name in [
            "artifacts/../etc/passwd",
            "/manifest.json",
            "artifacts/",
            "artifacts//x",
            "artifacts/a b",
            "keys/x.json",
            "keys/1.json/x",
            "etc/shadow",
        ] {
            refused(
                archive(&[GOOD[0], GOOD[1], (name, b"x")]),
                "not one a bundle holds",
            );
        }
    }

    #[test]
    fn sizes_past_the_end_or_above_the_caps_are_refused() {
        let mut bytes = archive(GOOD);
        // The artifact's filesize field claims far more than the archive.
        let i = walk(bytes.clone()).unwrap();
        let e = i.get("artifacts/abc.img.zst").unwrap().clone();
        let name_len = e.name.len() + 1;
        let header_at = (e.offset as usize) - ((HEADER_LEN + name_len + 3) & !3);
        let field = header_at + 6 + 8 * 6;
        bytes[field..field + 8].copy_from_slice(b"7FFFFFFF");
        refused(bytes, "past the bundle's end");

        let big = vec![b' '; MAX_KEY_DOCUMENT_BYTES + 1];
        refused(
            archive(&[GOOD[0], GOOD[1], ("keys/2.json", &big)]),
            "above its",
        );
    }

    #[test]
    fn a_truncated_or_garbled_archive_is_refused() {
        let bytes = archive(GOOD);
        let i = walk(bytes.clone()).unwrap();
        let cut = i.entries()[2].offset as usize + 1;
        refused(bytes[..cut].to_vec(), "past the bundle's end");
        refused(bytes[..50].to_vec(), "inside the header");
        let mut bad = bytes.clone();
        bad[0] = b'1';
        refused(bad, "magic");
        let mut bad = bytes.clone();
        bad[6 + 8] = b'g';
        refused(bad, "not 8 hexadecimal digits");
        let mut no_trailer = archive(GOOD);
        let t = no_trailer
            .windows(TRAILER.len())
            .position(|w| w == TRAILER.as_bytes())
            .unwrap();
        no_trailer.truncate(t - HEADER_LEN);
        refused(no_trailer, "no TRAILER!!!");
    }

    #[test]
    fn only_regular_files_belong() {
        let mut bytes = archive(GOOD);
        // The manifest's header is the second; make it a directory.
        let i = walk(bytes.clone()).unwrap();
        let m = i.manifest().clone();
        let header_at = (m.offset as usize) - ((HEADER_LEN + m.name.len() + 1 + 3) & !3);
        bytes[header_at + 14..header_at + 22].copy_from_slice(b"000041ED");
        refused(bytes, "only regular files");
    }

    const SPLIT: &[(&str, &[u8])] = &[
        ("sw-description", b"software = { version = \"1.0\"; };\n"),
        ("manifest.json", b"{\"signed\":{}}"),
        ("artifacts/d.delta", b"d"),
        ("artifacts/img.zst", b"abcd"),
        ("artifacts/img.zst.part-2", b"efg"),
        ("artifacts/img.zst.part-3", b"hi"),
    ];

    /// The artifact's bytes from `offset`, read through its ranges.
    fn read_from(bytes: &[u8], a: &Artifact, offset: u64) -> Vec<u8> {
        a.ranges(offset)
            .iter()
            .flat_map(|&(at, len)| bytes[at as usize..(at + len) as usize].to_vec())
            .collect()
    }

    #[test]
    fn a_split_artifact_is_its_parts_in_order() {
        let bytes = archive(SPLIT);
        let i = walk(bytes.clone()).unwrap();
        let a = i.artifact("artifacts/img.zst").unwrap();
        let names: Vec<&str> = a.segments.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "artifacts/img.zst",
                "artifacts/img.zst.part-2",
                "artifacts/img.zst.part-3"
            ]
        );
        assert_eq!(a.size, 9);
        for offset in 0..=9 {
            assert_eq!(
                read_from(&bytes, &a, offset),
                &b"abcdefghi"[offset as usize..],
                "resumed at {offset}"
            );
        }
        assert!(a.ranges(9).is_empty());
        assert!(a.ranges(10).is_empty());
        assert!(a.ranges(4).iter().all(|&(_, len)| len > 0));
        let d = i.artifact("artifacts/d.delta").unwrap();
        assert_eq!((d.segments.len(), d.size), (1, 1));
        let e = i.artifact("artifacts/img.zst.part-2").unwrap_err();
        assert!(e.to_string().contains("part 2 of"), "{e}");
    }

    #[test]
    fn parts_out_of_order_with_gaps_duplicates_or_empty_are_refused() {
        let [sw, m, d, p1, p2, p3] = SPLIT else {
            unreachable!()
        };
        let head = |rest: &[(&'static str, &'static [u8])]| {
            let mut v = vec![*sw, *m];
            v.extend_from_slice(rest);
            archive(&v)
        };
        refused(head(&[*p1, *p3, *p2]), "does not come right after");
        refused(head(&[*p1, *p3]), "does not come right after");
        refused(head(&[*p2, *p1]), "does not come right after");
        refused(head(&[*p1, *d, *p2, *p3]), "does not come right after");
        refused(head(&[*p1, *p2, *p2]), "twice");
        refused(
            head(&[*p1, ("artifacts/img.zst.part-2", b""), *p3]),
            "is empty",
        );
        refused(head(&[("artifacts/img.zst", b""), *p2]), "is empty");
        for bad in [
            "artifacts/img.zst.part-1",
            "artifacts/img.zst.part-0",
            "artifacts/img.zst.part-02",
        ] {
            refused(head(&[*p1, (bad, b"x")]), "not a part number");
        }
        // A part whose size runs past the end of the file.
        let mut bytes = archive(SPLIT);
        let i = walk(bytes.clone()).unwrap();
        let e = i.get("artifacts/img.zst.part-3").unwrap().clone();
        let header_at = (e.offset as usize) - ((HEADER_LEN + e.name.len() + 1 + 3) & !3);
        let field = header_at + 6 + 8 * 6;
        bytes[field..field + 8].copy_from_slice(b"00100000");
        refused(bytes, "past the bundle's end");
    }

    /// A bundle of `len` bytes that exists only as its headers: everything
    /// else reads as zeros. Lets the walk meet offsets past 4 GiB without
    /// a file that large.
    struct Sparse {
        len: u64,
        chunks: Vec<(u64, Vec<u8>)>,
    }

    impl ReadAt for Sparse {
        fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
            let end = offset + buf.len() as u64;
            if end > self.len {
                bail!(Io, "short read at {offset}");
            }
            buf.fill(0);
            for (at, bytes) in &self.chunks {
                let c_end = at + bytes.len() as u64;
                let (from, to) = (offset.max(*at), end.min(c_end));
                if from < to {
                    buf[(from - offset) as usize..(to - offset) as usize]
                        .copy_from_slice(&bytes[(from - at) as usize..(to - at) as usize]);
                }
            }
            Ok(())
        }
    }

    #[test]
    fn parts_past_4_gib_are_found_at_64_bit_offsets() {
        let sizes: &[(&str, u64)] = &[
            ("sw-description", 3),
            ("manifest.json", 2),
            ("artifacts/big.zst", MAX_ENTRY_SIZE),
            ("artifacts/big.zst.part-2", MAX_ENTRY_SIZE),
            ("artifacts/big.zst.part-3", 5),
        ];
        let mut chunks = Vec::new();
        let mut at = 0u64;
        for (i, (name, size)) in sizes.iter().enumerate() {
            let h = header(name, *size as u32, i as u32 + 1);
            let len = h.len() as u64;
            chunks.push((at, h));
            at = (at + len + size + 3) & !3;
        }
        chunks.push((at, header(TRAILER, 0, 0)));
        let len = at + 512;
        let i = index(&mut Sparse { len, chunks }, len).unwrap();
        let a = i.artifact("artifacts/big.zst").unwrap();
        assert_eq!(a.size, 2 * MAX_ENTRY_SIZE + 5);
        let last = &a.segments[2];
        assert!(last.offset > 2 * MAX_ENTRY_SIZE, "{last:?}");
        let from = MAX_ENTRY_SIZE + 7;
        let r = a.ranges(from);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], (a.segments[1].offset + 7, MAX_ENTRY_SIZE - 7));
        assert_eq!(r[1], (last.offset, 5));
        assert_eq!(a.ranges(2 * MAX_ENTRY_SIZE + 4), vec![(last.offset + 4, 1)]);
    }
}
