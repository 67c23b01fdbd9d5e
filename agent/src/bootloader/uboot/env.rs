//! The U-Boot environment codec: the bytes of one environment copy and the
//! variables they hold.
//!
//! This module owns the on-medium format as U-Boot's `saveenv` and
//! libubootenv's `fw_printenv`/`fw_setenv` (0.3.x, Debian's
//! `libubootenv-tool`) read and write it. A copy is `envsize` bytes: a
//! little-endian CRC-32 (zlib's) of the data area, then, for a redundant
//! pair only, one flags byte, then the data area: entries `name=value`,
//! each ending in NUL, the list ending in an empty entry, zeros after it.
//! Of a redundant pair, [`select_copy`] picks the current copy exactly as
//! libubootenv does, so updraft and `fw_printenv` always agree on it.
//!
//! It is pure, bytes in and bytes out: it never opens a file or device,
//! never takes the lock and never chooses which copy to write. That keeps
//! every byte of an untrusted medium away from side effects, and lets the
//! fuzzer drive the whole format directly.
//!
//! It must never reorder, rewrite or drop an entry it was not asked to
//! change: [`Environment`] keeps the data area as bytes, so the variables
//! updraft does not own (`bootcmd`, a vendor's) are written back byte for
//! byte. And it refuses instead of repairing: an entry without its NUL, a
//! CRC mismatch or an environment that does not fit is an error, because a
//! "repaired" environment written back is how devices get bricked.

use crate::bail;
use crate::error::Result;

// ---------------------------------------------------------------------------
// CRC-32 (the zlib / IEEE 802.3 polynomial, reflected), as U-Boot stores it.

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static CRC_TABLE: [u32; 256] = crc_table();

/// CRC-32 of `data` as zlib's `crc32(0, data, len)` computes it.
pub(super) fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

// ---------------------------------------------------------------------------
// The variable list.

/// The variables of one environment copy, kept as the bytes of its data
/// area (`name=value\0` entries, in order, without the terminating empty
/// entry), so everything updraft does not change is written back byte for
/// byte. Entries without `=` are kept but are not variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// Entries, each followed by NUL; empty when there are none.
    data: Vec<u8>,
}

fn entry_name(entry: &[u8]) -> Option<&[u8]> {
    entry.iter().position(|&b| b == b'=').map(|i| &entry[..i])
}

impl Environment {
    /// An environment without variables.
    pub fn new() -> Environment {
        Environment::default()
    }

    /// The raw entries in order (`name=value`, without the NUL).
    pub fn entries(&self) -> impl Iterator<Item = &[u8]> {
        let body = self.data.strip_suffix(&[0]).unwrap_or(&[]);
        body.split(|&b| b == 0).filter(|e| !e.is_empty())
    }

    /// The value of `name`. Should the name appear more than once, the last
    /// one counts, as in U-Boot and libubootenv.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.entries()
            .filter(|e| entry_name(e) == Some(name.as_bytes()))
            .last()
            .map(|e| &e[name.len() + 1..])
    }

    /// Set `name` to `value`: in place where it exists (later duplicates are
    /// dropped), appended otherwise. Names must be non-empty without `=` or
    /// NUL; values must not contain NUL.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            bail!(Bootloader, "{name:?} is not a valid U-Boot variable name");
        }
        if value.contains('\0') {
            bail!(Bootloader, "the value for {name} contains a NUL byte");
        }
        let mut new_entry = Vec::with_capacity(name.len() + value.len() + 1);
        new_entry.extend_from_slice(name.as_bytes());
        new_entry.push(b'=');
        new_entry.extend_from_slice(value.as_bytes());
        let mut out = Vec::with_capacity(self.data.len() + new_entry.len() + 1);
        let mut placed = false;
        for e in self.entries() {
            if entry_name(e) == Some(name.as_bytes()) {
                if placed {
                    continue;
                }
                out.extend_from_slice(&new_entry);
                placed = true;
            } else {
                out.extend_from_slice(e);
            }
            out.push(0);
        }
        if !placed {
            out.extend_from_slice(&new_entry);
            out.push(0);
        }
        self.data = out;
        Ok(())
    }

    /// Remove every entry named `name`.
    pub fn remove(&mut self, name: &str) {
        let mut out = Vec::with_capacity(self.data.len());
        for e in self.entries() {
            if entry_name(e) != Some(name.as_bytes()) {
                out.extend_from_slice(e);
                out.push(0);
            }
        }
        self.data = out;
    }

    /// Bytes the list needs in a data area, the end marker included.
    pub fn encoded_len(&self) -> usize {
        self.data.len() + 1
    }
}

/// Parse a data area (what follows the CRC and flags). The list ends at the
/// first empty entry, or exactly at the end of the area after a NUL; an
/// entry that runs off the end without its NUL is refused.
pub fn parse_env_data(data: &[u8]) -> Result<Environment> {
    let mut pos = 0;
    while pos < data.len() && data[pos] != 0 {
        let Some(len) = data[pos..].iter().position(|&b| b == 0) else {
            bail!(
                Malformed,
                "the entry at data offset {pos:#x} has no terminating NUL within the {} bytes of the data area",
                data.len()
            );
        };
        pos += len + 1;
    }
    Ok(Environment {
        data: data[..pos].to_vec(),
    })
}

/// The data area of `data_size` bytes holding `env`: the entries, the end
/// marker, and zeros after it (as U-Boot's `saveenv` fills it).
pub fn serialize_env_data(env: &Environment, data_size: usize) -> Result<Vec<u8>> {
    if env.encoded_len() > data_size {
        bail!(
            Bootloader,
            "the environment needs {} bytes but a copy holds only {data_size} bytes of data",
            env.encoded_len()
        );
    }
    let mut out = Vec::with_capacity(data_size);
    out.extend_from_slice(&env.data);
    out.resize(data_size, 0);
    Ok(out)
}

/// Bytes before the data area: the CRC, and the flags byte when redundant.
fn header_len(redundant: bool) -> usize {
    if redundant { 5 } else { 4 }
}

/// One copy as found on the medium.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodedCopy<'a> {
    pub stored_crc: u32,
    pub computed_crc: u32,
    /// The flags byte of a redundant copy.
    pub flags: Option<u8>,
    pub data: &'a [u8],
}

impl DecodedCopy<'_> {
    pub fn crc_ok(&self) -> bool {
        self.stored_crc == self.computed_crc
    }
}

/// Split a copy into header and data and check its CRC (not the entries).
pub fn decode_copy(image: &[u8], redundant: bool) -> Result<DecodedCopy<'_>> {
    let h = header_len(redundant);
    if image.len() <= h {
        bail!(
            Malformed,
            "an environment copy of {} bytes has no room for data",
            image.len()
        );
    }
    let stored_crc = u32::from_le_bytes([image[0], image[1], image[2], image[3]]);
    let data = &image[h..];
    Ok(DecodedCopy {
        stored_crc,
        computed_crc: crc32(data),
        flags: redundant.then_some(image[4]),
        data,
    })
}

/// A whole copy of `env_size` bytes: CRC, flags when `flags` is given (a
/// redundant copy), data area.
pub fn encode_copy(env: &Environment, env_size: usize, flags: Option<u8>) -> Result<Vec<u8>> {
    let h = header_len(flags.is_some());
    if env_size <= h {
        bail!(
            Bootloader,
            "an environment of {env_size} bytes has no room for data"
        );
    }
    let data = serialize_env_data(env, env_size - h)?;
    let mut out = Vec::with_capacity(env_size);
    out.extend_from_slice(&crc32(&data).to_le_bytes());
    if let Some(f) = flags {
        out.push(f);
    }
    out.extend_from_slice(&data);
    Ok(out)
}

/// Decode a whole copy: CRC checked, entries parsed.
pub fn parse_image(image: &[u8], redundant: bool) -> Result<Environment> {
    let c = decode_copy(image, redundant)?;
    if !c.crc_ok() {
        bail!(
            Malformed,
            "CRC mismatch (stored {:#010x}, computed {:#010x})",
            c.stored_crc,
            c.computed_crc
        );
    }
    parse_env_data(c.data)
}

/// Which copy of a redundant pair is current, given which have a valid CRC
/// and their flags bytes, exactly as libubootenv's `libuboot_load` decides
/// for incremental flags (files, block devices): the only valid one; of two
/// valid ones the one with the higher flags, except that 0 beats 255 (the
/// counter wrapped); equal flags select copy 0. `None` when neither is valid.
pub fn select_copy(valid: [bool; 2], flags: [u8; 2]) -> Option<usize> {
    match valid {
        [false, false] => None,
        [true, false] => Some(0),
        [false, true] => Some(1),
        [true, true] => Some(match flags {
            [0xff, 0] => 1,
            [0, 0xff] => 0,
            [f0, f1] if f1 > f0 => 1,
            _ => 0,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;
    use crate::test_support::uboot_env as env_of;

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn entries_round_trip_byte_for_byte() {
        let mut data =
            b"bootcmd=run x\0foo=bar baz\0junk-without-equals\0BOOT_ORDER=A B\0\0".to_vec();
        data.resize(64, 0xff);
        let env = parse_env_data(&data).unwrap();
        assert_eq!(env.get("foo"), Some(&b"bar baz"[..]));
        assert_eq!(env.get("junk-without-equals"), None);
        let out = serialize_env_data(&env, 64).unwrap();
        assert_eq!(&out[..60], &data[..60]);
        assert!(out[60..].iter().all(|&b| b == 0));
    }

    #[test]
    fn set_replaces_in_place_and_appends_new_names() {
        let mut env = env_of(&[("a", "1"), ("BOOT_ORDER", "A B"), ("z", "2")]);
        env.set("BOOT_ORDER", "B A").unwrap();
        env.set("BOOT_B_LEFT", "3").unwrap();
        let entries: Vec<&[u8]> = env.entries().collect();
        assert_eq!(
            entries,
            vec![&b"a=1"[..], b"BOOT_ORDER=B A", b"z=2", b"BOOT_B_LEFT=3"]
        );
        assert!(env.set("a=b", "x").is_err());
        assert!(env.set("", "x").is_err());
        assert!(env.set("a", "x\0y").is_err());
    }

    #[test]
    fn duplicates_read_last_and_collapse_on_write() {
        let env = parse_env_data(b"x=1\0y=2\0x=3\0\0").unwrap();
        assert_eq!(env.get("x"), Some(&b"3"[..]));
        let mut env2 = env.clone();
        env2.set("x", "4").unwrap();
        let entries: Vec<&[u8]> = env2.entries().collect();
        assert_eq!(entries, vec![&b"x=4"[..], b"y=2"]);
    }

    #[test]
    fn hostile_data_areas() {
        // No terminator anywhere.
        let e = parse_env_data(b"abcdef").unwrap_err();
        assert_eq!(e.kind(), Kind::Malformed);
        assert!(e.to_string().contains("offset 0x0"), "{e}");
        // A second entry running off the end.
        assert!(parse_env_data(b"a=1\0bbbb").is_err());
        // Empty list, all-zero, all-0xff.
        assert_eq!(parse_env_data(&[0; 8]).unwrap(), Environment::new());
        assert!(parse_env_data(&[0xff; 8]).is_err());
        // A list filling the area exactly is read, but cannot be written back.
        let full = parse_env_data(b"a=1\0b=2\0").unwrap();
        assert_eq!(full.get("b"), Some(&b"2"[..]));
        assert!(serialize_env_data(&full, 8).is_err());
        assert!(decode_copy(&[1, 2, 3, 4], false).is_err());
        assert!(decode_copy(&[1, 2, 3, 4, 5], true).is_err());
        assert!(
            parse_image(&[0u8; 32], false).is_err(),
            "zero CRC over zero data is wrong"
        );
    }

    #[test]
    fn copies_encode_and_decode() {
        let env = env_of(&[("k", "v")]);
        let single = encode_copy(&env, 64, None).unwrap();
        assert_eq!(single.len(), 64);
        assert_eq!(&single[4..8], b"k=v\0");
        assert_eq!(parse_image(&single, false).unwrap(), env);
        let red = encode_copy(&env, 64, Some(7)).unwrap();
        assert_eq!(red[4], 7);
        assert_eq!(&red[5..9], b"k=v\0");
        assert_eq!(decode_copy(&red, true).unwrap().flags, Some(7));
        let mut bad = red.clone();
        bad[20] ^= 1;
        assert!(
            parse_image(&bad, true)
                .unwrap_err()
                .to_string()
                .contains("CRC mismatch")
        );
        assert!(encode_copy(&env_of(&[("k", &"v".repeat(100))]), 64, None).is_err());
    }

    #[test]
    fn copy_selection_follows_libubootenv() {
        assert_eq!(select_copy([false, false], [1, 2]), None);
        assert_eq!(select_copy([true, false], [1, 2]), Some(0));
        assert_eq!(select_copy([false, true], [9, 2]), Some(1));
        assert_eq!(select_copy([true, true], [1, 2]), Some(1));
        assert_eq!(select_copy([true, true], [3, 2]), Some(0));
        assert_eq!(select_copy([true, true], [5, 5]), Some(0));
        assert_eq!(select_copy([true, true], [255, 0]), Some(1), "wrapped");
        assert_eq!(select_copy([true, true], [0, 255]), Some(0), "wrapped");
        assert_eq!(
            select_copy([true, true], [254, 0]),
            Some(0),
            "only 255→0 wraps"
        );
        assert_eq!(select_copy([true, true], [255, 1]), Some(0));
    }
}
