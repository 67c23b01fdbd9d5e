//! The signed `encryption` object of an encrypted release (manifest
//! `spec_version` 3): who can read the artifact, and the hash of every
//! ciphertext frame.
//!
//! This module owns the schema and its structural rules only. It is pure:
//! it never unwraps a key or decrypts a byte (that is [`crate::encrypt`]'s),
//! so a manifest that passes here is merely well formed, not readable by
//! this device.
//!
//! Why a new spec_version: an updraft that predates encryption ignores
//! unknown JSON fields, and would otherwise take the ciphertext for a
//! zstd stream. Version 3 makes every older updraft refuse the manifest
//! with "spec_version 3 is not supported" before it downloads anything.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Kind, Result};
use crate::hash::Sha256;
use crate::keys::decode_base64;

/// The manifest version of an encrypted release: the layout of version 1
/// plus a required `encryption` object.
pub const SPEC_VERSION: u32 = 3;

/// The one scheme this build reads: X25519 key agreement, HKDF-SHA256,
/// ChaCha20-Poly1305 (RFC 7748, RFC 5869, RFC 8439).
pub const SCHEME: &str = "x25519-hkdf-sha256-chacha20poly1305-v1";

/// Bytes an AEAD tag adds to each frame.
pub const TAG_LEN: u64 = 16;

/// At most this many recipients.
pub const MAX_RECIPIENTS: usize = 1024;

/// How the artifact is encrypted, signed with the rest of the manifest.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Encryption {
    pub scheme: String,
    /// The content key, wrapped for each recipient.
    pub recipients: Vec<Recipient>,
    /// sha256 of each ciphertext frame of the slot artifact, in order:
    /// a frame is checked against it before it is decrypted.
    pub frame_sha256: Vec<Sha256>,
}

/// The content key wrapped for one X25519 public key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Recipient {
    /// sha256 of the recipient's 32-byte public key.
    pub id: Sha256,
    /// The publisher's ephemeral X25519 public key (base64, 32 bytes).
    pub ephemeral: String,
    /// The sealed content key (base64, 32 bytes and a 16-byte tag).
    pub wrapped: String,
}

/// A recipient entry with its fields decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrappedKey {
    pub id: Sha256,
    pub ephemeral: [u8; 32],
    pub wrapped: [u8; 48],
}

impl Recipient {
    /// Decode the base64 fields; `i` names the entry in errors.
    pub fn decode(&self, i: usize) -> Result<WrappedKey> {
        let bad = |msg: String| {
            Error::new(
                Kind::Malformed,
                format!("manifest: encryption.recipients[{i}]: {msg}"),
            )
        };
        let eph = decode_base64(&self.ephemeral, "ephemeral").map_err(|e| bad(e.to_string()))?;
        let wrapped = decode_base64(&self.wrapped, "wrapped").map_err(|e| bad(e.to_string()))?;
        let ephemeral: [u8; 32] = eph
            .as_slice()
            .try_into()
            .map_err(|_| bad(format!("ephemeral key is {} bytes, not 32", eph.len())))?;
        let wrapped: [u8; 48] = wrapped
            .as_slice()
            .try_into()
            .map_err(|_| bad(format!("wrapped key is {} bytes, not 48", wrapped.len())))?;
        Ok(WrappedKey {
            id: self.id,
            ephemeral,
            wrapped,
        })
    }
}

impl Encryption {
    /// The structural rules, against the slot artifact's frame count.
    pub fn check(&self, frames: usize) -> Result<()> {
        let bad = |msg: String| Err(Error::new(Kind::Malformed, format!("manifest: {msg}")));
        if self.scheme != SCHEME {
            return Err(Error::new(
                Kind::Policy,
                format!(
                    "manifest: encryption scheme {:?} is not supported (this updraft reads {SCHEME})",
                    crate::hash::truncate(&self.scheme, 80)
                ),
            ));
        }
        if self.recipients.is_empty() || self.recipients.len() > MAX_RECIPIENTS {
            return bad(format!(
                "encryption lists {} recipients; 1 to {MAX_RECIPIENTS} are accepted",
                self.recipients.len()
            ));
        }
        for (i, r) in self.recipients.iter().enumerate() {
            r.decode(i)?;
            if self.recipients[..i].iter().any(|o| o.id == r.id) {
                return bad(format!(
                    "encryption.recipients[{i}]: recipient {} is listed twice",
                    r.id.short()
                ));
            }
        }
        if self.frame_sha256.len() != frames {
            return bad(format!(
                "encryption.frame_sha256 lists {} hashes for {frames} artifact frames",
                self.frame_sha256.len()
            ));
        }
        Ok(())
    }

    /// The entry for recipient `id`, decoded.
    pub fn entry_for(&self, id: &Sha256) -> Result<Option<WrappedKey>> {
        match self.recipients.iter().position(|r| r.id == *id) {
            Some(i) => self.recipients[i].decode(i).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::encode_base64;

    fn recipient(n: u8) -> Recipient {
        Recipient {
            id: Sha256::of(&[n]),
            ephemeral: encode_base64(&[n; 32]),
            wrapped: encode_base64(&[n; 48]),
        }
    }

    fn sample() -> Encryption {
        Encryption {
            scheme: SCHEME.into(),
            recipients: vec![recipient(1), recipient(2)],
            frame_sha256: vec![Sha256::of(b"a"), Sha256::of(b"b")],
        }
    }

    #[test]
    fn a_well_formed_object_passes() {
        sample().check(2).unwrap();
        assert_eq!(
            sample()
                .entry_for(&Sha256::of(&[2]))
                .unwrap()
                .unwrap()
                .ephemeral,
            [2; 32]
        );
        assert!(sample().entry_for(&Sha256::of(&[3])).unwrap().is_none());
    }

    #[test]
    fn hostile_objects_are_refused_with_the_field_named() {
        type Edit = fn(&mut Encryption);
        let rows: &[(Edit, usize, &str)] = &[
            (
                |e| e.scheme = "rot13".into(),
                2,
                "scheme \"rot13\" is not supported",
            ),
            (|e| e.recipients.clear(), 2, "lists 0 recipients"),
            (
                |e| e.recipients[1] = recipient(1),
                2,
                "recipients[1]: recipient",
            ),
            (
                |e| e.recipients[0].ephemeral = "@@".into(),
                2,
                "recipients[0]",
            ),
            (
                |e| e.recipients[0].ephemeral = encode_base64(&[0; 31]),
                2,
                "ephemeral key is 31 bytes",
            ),
            (
                |e| e.recipients[1].wrapped = encode_base64(&[0; 32]),
                2,
                "wrapped key is 32 bytes",
            ),
            (|_| {}, 3, "lists 2 hashes for 3 artifact frames"),
            (
                |e| e.recipients = (0..=MAX_RECIPIENTS).map(|i| recipient(i as u8)).collect(),
                2,
                "1025 recipients",
            ),
        ];
        for (edit, frames, want) in rows {
            let mut e = sample();
            edit(&mut e);
            let err = e.check(*frames).unwrap_err().to_string();
            assert!(err.contains(want), "{err} should contain {want}");
        }
    }
}
