//! Public keys and key sets: the ed25519 keys updraft trusts, their PEM
//! and base64 forms, and a set of distinct keys with a threshold.
//!
//! Everything that turns bytes into a key lives here, so the envelope
//! check ([`crate::envelope`]) and the trust rules ([`crate::trust`]) share
//! one definition of a key and neither needs the other's internals. A key
//! set refuses duplicates and impossible thresholds when it is made, so a
//! threshold can never be met by one key counted twice.
//!
//! PEM framing is read by `rustls-pki-types` (already linked for TLS). The
//! SubjectPublicKeyInfo of an ed25519 key has exactly one DER encoding
//! (RFC 8410, section 4), so comparing the 12-byte prefix is a complete
//! check of the algorithm and the key length, not a shortcut.
//!
//! This module never decides what a key may sign.

use base64::Engine;
use ed25519_dalek::{Signature as EdSignature, VerifyingKey};
use rustls_pki_types::pem::{PemObject, SectionKind};

use crate::error::{Error, Kind, Result};
use crate::hash::Sha256;

/// At most this many keys per role.
pub const MAX_KEYS: usize = 32;

/// Decode base64 as DSSE allows it: standard or URL-safe alphabet, padded
/// or not. Anything else is an error naming `what`.
pub fn decode_base64(text: &str, what: &str) -> Result<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        if let Ok(bytes) = engine.decode(text) {
            return Ok(bytes);
        }
    }
    Err(Error::new(
        Kind::Malformed,
        format!("{what} is not valid base64"),
    ))
}

pub fn encode_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// DER prefix of an ed25519 SubjectPublicKeyInfo (RFC 8410), followed by the
// 32 raw key bytes.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// An ed25519 public key.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKey({})", self.keyid())
    }
}

impl PublicKey {
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey> {
        VerifyingKey::from_bytes(bytes)
            .map(|key| PublicKey { key })
            .map_err(|_| Error::new(Kind::Malformed, "not a valid ed25519 public key"))
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.key.as_bytes()
    }

    /// The key id: sha256 of the raw public key, hex. Only ever a hint.
    pub fn keyid(&self) -> String {
        Sha256::of(self.key.as_bytes()).to_hex()
    }

    /// Parse a PEM `PUBLIC KEY` (SubjectPublicKeyInfo, as `openssl pkey
    /// -pubout` writes for ed25519).
    pub fn from_pem(text: &str) -> Result<PublicKey> {
        let der = pem_body(text, "PUBLIC KEY")?;
        if der.len() != 44 || der[..12] != SPKI_PREFIX {
            return Err(Error::new(
                Kind::Malformed,
                "PEM PUBLIC KEY is not an ed25519 SubjectPublicKeyInfo",
            ));
        }
        let mut raw = [0u8; 32];
        raw.copy_from_slice(&der[12..]);
        PublicKey::from_bytes(&raw)
    }

    pub fn to_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.key.as_bytes());
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            encode_base64(&der)
        )
    }

    /// Read a `.pub` file.
    pub fn load(path: &std::path::Path) -> Result<PublicKey> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                Kind::Config,
                format!("reading public key {}: {e}", path.display()),
            )
        })?;
        PublicKey::from_pem(&text).map_err(|e| {
            e.wrap(format!("public key {}", path.display()))
                .with_kind(Kind::Config)
        })
    }

    /// Strict verification: rejects small-order keys and non-canonical
    /// signatures, so one key cannot produce two distinct valid signatures.
    pub fn verify(&self, message: &[u8], sig: &[u8; 64]) -> bool {
        let sig = EdSignature::from_bytes(sig);
        self.key.verify_strict(message, &sig).is_ok()
    }
}

/// Extract and decode the body of the first PEM block labelled `label`
/// (`PUBLIC KEY` or `PRIVATE KEY`); blocks with other labels are skipped.
pub fn pem_body(text: &str, label: &str) -> Result<Vec<u8>> {
    let wanted = match label {
        "PUBLIC KEY" => SectionKind::PublicKey,
        "PRIVATE KEY" => SectionKind::PrivateKey,
        other => {
            return Err(Error::new(
                Kind::Malformed,
                format!("PEM label {other:?} is not one updraft reads"),
            ));
        }
    };
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text.as_bytes()) {
        match section {
            Ok((kind, der)) if kind == wanted => return Ok(der),
            Ok(_) => {}
            Err(e) => {
                return Err(Error::new(
                    Kind::Malformed,
                    format!("PEM {label} block is malformed: {e}"),
                ));
            }
        }
    }
    Err(Error::new(
        Kind::Malformed,
        format!("no PEM {label} block found"),
    ))
}

/// A set of distinct public keys with the number that must sign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<PublicKey>,
    threshold: usize,
}

impl KeySet {
    /// Keys must be distinct and the threshold between 1 and their number.
    pub fn new(keys: Vec<PublicKey>, threshold: usize) -> Result<KeySet> {
        if keys.is_empty() {
            return Err(Error::new(Kind::Malformed, "key set is empty"));
        }
        if keys.len() > MAX_KEYS {
            return Err(Error::new(
                Kind::Malformed,
                format!(
                    "key set has {} keys, at most {MAX_KEYS} are allowed",
                    keys.len()
                ),
            ));
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].contains(k) {
                return Err(Error::new(
                    Kind::Malformed,
                    format!("key {} is listed twice", k.keyid()),
                ));
            }
        }
        if threshold == 0 || threshold > keys.len() {
            return Err(Error::new(
                Kind::Malformed,
                format!(
                    "threshold {threshold} is impossible with {} key(s)",
                    keys.len()
                ),
            ));
        }
        Ok(KeySet { keys, threshold })
    }

    pub fn keys(&self) -> &[PublicKey] {
        &self.keys
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn threshold(&self) -> usize {
        self.threshold
    }

    /// Index of the key that made `sig` over `message`, if any.
    pub fn find_signer(&self, message: &[u8], sig: &[u8; 64]) -> Option<usize> {
        self.keys.iter().position(|k| k.verify(message, sig))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PublicKey {
        PublicKey::from_bytes(
            ed25519_dalek::SigningKey::from_bytes(&[7; 32])
                .verifying_key()
                .as_bytes(),
        )
        .expect("a valid key")
    }

    #[test]
    fn a_public_key_survives_pem() {
        let k = key();
        assert_eq!(PublicKey::from_pem(&k.to_pem()).unwrap(), k);
        // Text around the block and other blocks before it are skipped.
        let noisy = format!(
            "comment\n-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n{}",
            k.to_pem()
        );
        assert_eq!(PublicKey::from_pem(&noisy).unwrap(), k);
    }

    #[test]
    fn hostile_pem_is_refused_with_its_reason() {
        let pem = key().to_pem();
        let cases = [
            (String::new(), "no PEM PUBLIC KEY block found"),
            (
                pem.replace("PUBLIC KEY", "PRIVATE KEY"),
                "no PEM PUBLIC KEY block found",
            ),
            (
                pem.replace("-----END PUBLIC KEY-----\n", ""),
                "PEM PUBLIC KEY block is malformed",
            ),
            (
                pem.replace("MCow", "M*ow"),
                "PEM PUBLIC KEY block is malformed",
            ),
            (
                format!(
                    "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                    encode_base64(&[0u8; 44])
                ),
                "not an ed25519 SubjectPublicKeyInfo",
            ),
            (
                format!(
                    "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                    encode_base64(&SPKI_PREFIX)
                ),
                "not an ed25519 SubjectPublicKeyInfo",
            ),
        ];
        for (text, why) in cases {
            let e = PublicKey::from_pem(&text).unwrap_err();
            assert_eq!(e.kind(), Kind::Malformed, "{text:?}");
            assert!(e.message().contains(why), "{text:?}: {e}");
        }
        assert!(pem_body(&pem, "CERTIFICATE").is_err());
    }

    #[test]
    fn key_sets_refuse_duplicates_and_impossible_thresholds() {
        let k = key();
        assert!(KeySet::new(vec![k.clone(), k.clone()], 1).is_err());
        assert!(KeySet::new(vec![k.clone()], 0).is_err());
        assert!(KeySet::new(vec![k.clone()], 2).is_err());
        assert!(KeySet::new(vec![], 1).is_err());
        assert_eq!(KeySet::new(vec![k], 1).unwrap().threshold(), 1);
    }
}
