//! SHA-256 digests as values.
//!
//! Every hash updraft compares (images, artifacts, frames, deltas, slot
//! contents) is a [`Sha256`]: 32 bytes that print and parse as lower-case
//! hex, so a mismatch in a log line can be compared by eye with
//! `sha256sum`. Hashing itself goes through [`Hasher`], the one place that
//! picks the implementation.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Digest;

use crate::error::{Error, Kind};

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    /// Hash a byte slice in one go.
    pub fn of(bytes: &[u8]) -> Sha256 {
        let mut h = Hasher::new();
        h.update(bytes);
        h.finish()
    }

    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parse 64 hex digits (either case).
    pub fn from_hex(s: &str) -> Result<Sha256, Error> {
        let bytes = unhex(s).ok_or_else(|| {
            Error::new(
                Kind::Malformed,
                format!("{:?} is not a sha256 (64 hex digits)", truncate(s, 80)),
            )
        })?;
        let arr: [u8; 32] = bytes.try_into().map_err(|_| {
            Error::new(
                Kind::Malformed,
                format!("{:?} is not a sha256 (64 hex digits)", truncate(s, 80)),
            )
        })?;
        Ok(Sha256(arr))
    }

    /// The first 12 hex digits, for log lines.
    pub fn short(&self) -> String {
        hex(&self.0[..6])
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({})", self.to_hex())
    }
}

impl Serialize for Sha256 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Sha256 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Sha256::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

/// Incremental SHA-256.
#[derive(Clone, Default)]
pub struct Hasher(sha2::Sha256);

impl Hasher {
    pub fn new() -> Hasher {
        Hasher(sha2::Sha256::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Sha256 {
        Sha256(self.0.finalize().into())
    }
}

/// Lower-case hex of any byte string.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Decode hex (either case); `None` on odd length or a non-hex digit.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// Cut untrusted text for inclusion in an error message.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        assert_eq!(
            Sha256::of(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn hex_round_trip_and_rejects() {
        let h = Sha256::of(b"x");
        assert_eq!(Sha256::from_hex(&h.to_hex()).unwrap(), h);
        assert_eq!(
            Sha256::from_hex(&h.to_hex().to_uppercase()).unwrap(),
            h,
            "upper case accepted"
        );
        assert!(Sha256::from_hex("abc").is_err());
        assert!(Sha256::from_hex(&"g".repeat(64)).is_err());
        assert!(Sha256::from_hex(&"a".repeat(62)).is_err());
        assert!(Sha256::from_hex("é").is_err());
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("ééé", 3), "é");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
