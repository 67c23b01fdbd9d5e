//! DSSE envelopes: the signed wrapper around manifests and key documents.
//!
//! An envelope is `{"payloadType", "payload" (base64), "signatures": [{"keyid",
//! "sig"}]}`; each signature is ed25519 over the DSSE pre-authentication
//! encoding (PAE) of the type and the raw payload bytes, so no JSON is ever
//! canonicalised. This module owns parsing and counting signatures against a
//! [`KeySet`]; it must never interpret the payload, and it never trusts a
//! `keyid`: the threshold counts distinct public keys whose signature
//! verified.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Kind, Result};
use crate::hash::truncate;
use crate::keys::KeySet;
pub use crate::keys::{decode_base64, encode_base64};

/// At most this many signatures are examined; more is an error, not a
/// reason to spend CPU.
pub const MAX_SIGNATURES: usize = 16;

/// One entry of `signatures`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Signature {
    #[serde(default)]
    pub keyid: String,
    pub sig: String,
}

/// The envelope as it travels.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub payload: String,
    pub signatures: Vec<Signature>,
}

/// The DSSE v1 pre-authentication encoding.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + payload_type.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

/// The outcome of a successful verification.
#[derive(Debug)]
pub struct Verified {
    /// The payload bytes exactly as signed.
    pub payload: Vec<u8>,
    /// Indices into the key set of the keys that signed.
    pub signers: Vec<usize>,
}

impl Envelope {
    /// Parse an envelope from untrusted bytes. `what` names it in errors
    /// ("manifest", "key document keys/3.json").
    pub fn parse(bytes: &[u8], what: &str) -> Result<Envelope> {
        let env: Envelope = serde_json::from_slice(bytes).map_err(|e| {
            Error::new(
                Kind::Malformed,
                format!("{what} is not a valid DSSE envelope: {e}"),
            )
        })?;
        if env.signatures.is_empty() {
            return Err(Error::new(
                Kind::Signature,
                format!("{what} carries no signatures"),
            ));
        }
        if env.signatures.len() > MAX_SIGNATURES {
            return Err(Error::new(
                Kind::Malformed,
                format!(
                    "{what} carries {} signatures, at most {MAX_SIGNATURES} are accepted",
                    env.signatures.len()
                ),
            ));
        }
        Ok(env)
    }

    /// The payload bytes, decoded but not yet trusted.
    pub fn payload_bytes(&self, what: &str) -> Result<Vec<u8>> {
        decode_base64(&self.payload, &format!("{what} payload"))
    }

    /// Check the payload type, then count the distinct keys of `keys` that
    /// signed, and require the threshold. `role` names the key set in errors
    /// ("release keys of key document v3").
    pub fn verify(
        &self,
        what: &str,
        payload_type: &str,
        keys: &KeySet,
        role: &str,
    ) -> Result<Verified> {
        if self.payload_type != payload_type {
            return Err(Error::new(
                Kind::Signature,
                format!(
                    "{what} has payloadType {:?}, expected {payload_type:?}",
                    truncate(&self.payload_type, 80)
                ),
            ));
        }
        let payload = self.payload_bytes(what)?;
        let message = pae(&self.payload_type, &payload);
        let mut signers: Vec<usize> = Vec::new();
        let mut unknown: Vec<String> = Vec::new();
        for (i, s) in self.signatures.iter().enumerate() {
            let raw = decode_base64(&s.sig, &format!("{what} signature {}", i + 1))?;
            let Ok(sig_bytes) = <[u8; 64]>::try_from(raw.as_slice()) else {
                return Err(Error::new(
                    Kind::Malformed,
                    format!(
                        "{what} signature {} is {} bytes, an ed25519 signature is 64",
                        i + 1,
                        raw.len()
                    ),
                ));
            };
            match keys.find_signer(&message, &sig_bytes) {
                Some(k) => {
                    if !signers.contains(&k) {
                        signers.push(k);
                    }
                }
                None => unknown.push(truncate(&s.keyid, 16).to_string()),
            }
        }
        if signers.len() < keys.threshold() {
            let mut msg = format!(
                "{what} is signed by {} of the {} {role}, threshold is {}",
                signers.len(),
                keys.len(),
                keys.threshold()
            );
            if !unknown.is_empty() {
                msg.push_str(&format!(
                    " ({} signature(s) did not verify with any of them: keyid {})",
                    unknown.len(),
                    unknown.join(", ")
                ));
            }
            return Err(Error::new(Kind::Signature, msg));
        }
        Ok(Verified { payload, signers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_dsse_spec_example() {
        // From the DSSE protocol description.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }

    #[test]
    fn base64_variants() {
        assert_eq!(decode_base64("aGk=", "x").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk", "x").unwrap(), b"hi");
        assert_eq!(decode_base64("-_8", "x").unwrap(), vec![0xfb, 0xff]);
        let e = decode_base64("a*b", "manifest payload").unwrap_err();
        assert_eq!(e.to_string(), "manifest payload is not valid base64");
    }

    #[test]
    fn parse_rejects_structure() {
        assert!(Envelope::parse(b"{", "m").is_err());
        assert!(
            Envelope::parse(br#"{"payloadType":"t","payload":"","signatures":[]}"#, "m").is_err()
        );
        let many = format!(
            r#"{{"payloadType":"t","payload":"","signatures":[{}]}}"#,
            vec![r#"{"keyid":"","sig":""}"#; 17].join(",")
        );
        let e = Envelope::parse(many.as_bytes(), "m").unwrap_err();
        assert!(e.to_string().contains("17 signatures"), "{e}");
    }
}
