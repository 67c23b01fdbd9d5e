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
    ///
    /// A signature entry that does not decode to 64 bytes (bad base64, empty,
    /// another length) counts as no signature, like one that verifies under
    /// none of the keys: anyone on the path can append entries, so refusing
    /// the whole envelope for one would let them block a validly signed
    /// document. When the threshold is not met, the error says how many
    /// entries were malformed and how many did not verify.
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
        let mut malformed: Vec<String> = Vec::new();
        for (i, s) in self.signatures.iter().enumerate() {
            let Some(sig_bytes) = signature_bytes(&s.sig) else {
                malformed.push((i + 1).to_string());
                continue;
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
            if !malformed.is_empty() {
                msg.push_str(&format!(
                    " ({} signature(s) are not 64-byte ed25519 signatures in base64 and were not counted: entry {})",
                    malformed.len(),
                    malformed.join(", ")
                ));
            }
            return Err(Error::new(Kind::Signature, msg));
        }
        Ok(Verified { payload, signers })
    }
}

/// The 64 bytes of an ed25519 signature in base64, or `None` for anything
/// else (not base64, empty, another length).
fn signature_bytes(text: &str) -> Option<[u8; 64]> {
    // 64 bytes are at most 88 characters of base64; longer text is not
    // worth decoding.
    if text.len() > 88 {
        return None;
    }
    let raw = decode_base64(text, "signature").ok()?;
    <[u8; 64]>::try_from(raw.as_slice()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{Signer, envelope};

    const TYPE: &str = "application/vnd.updraft.manifest+json";

    fn keys(signers: &[&Signer], threshold: usize) -> KeySet {
        KeySet::new(signers.iter().map(|s| s.public()).collect(), threshold).unwrap()
    }

    fn with_extra(env: &Envelope, sig: &str) -> Envelope {
        let mut env = env.clone();
        env.signatures.push(Signature {
            keyid: "garbage".into(),
            sig: sig.into(),
        });
        env
    }

    /// tuf-conformance `test_invalid_sig_in_valid_metadata`: a malformed
    /// entry next to signatures that meet the threshold is ignored, as one
    /// that verifies under no key is; it never refuses the envelope.
    #[test]
    fn a_malformed_extra_signature_counts_as_none() {
        let (a, b) = (Signer::new(1), Signer::new(2));
        let set = keys(&[&a, &b], 1);
        let good = envelope(TYPE, b"payload", &[&a]);
        let wrong = encode_base64(&[0x5a; 64]);
        let long = "A".repeat(10_000);
        for extra in [
            "",
            "c2hvcnQ=",
            "not base64 *",
            wrong.as_str(),
            long.as_str(),
        ] {
            let env = with_extra(&good, extra);
            let v = env.verify("manifest", TYPE, &set, "release keys").unwrap();
            assert_eq!(v.signers, vec![0], "extra {extra:?}");
            assert_eq!(v.payload, b"payload");
        }
        // The malformed entry first changes nothing either.
        let mut env = with_extra(&good, "");
        env.signatures.reverse();
        assert!(env.verify("manifest", TYPE, &set, "release keys").is_ok());
    }

    /// Below threshold, the refusal counts the malformed entries, so an
    /// operator sees why the signatures did not add up.
    #[test]
    fn below_threshold_the_refusal_names_the_malformed_entries() {
        let (a, b) = (Signer::new(1), Signer::new(2));
        let set = keys(&[&a, &b], 2);
        let env = with_extra(&with_extra(&envelope(TYPE, b"p", &[&a]), ""), "c2hvcnQ=");
        let e = env
            .verify("manifest", TYPE, &set, "release keys")
            .unwrap_err();
        assert_eq!(e.kind(), Kind::Signature);
        assert_eq!(
            e.message(),
            "manifest is signed by 1 of the 2 release keys, threshold is 2 \
             (2 signature(s) are not 64-byte ed25519 signatures in base64 and were not counted: entry 2, 3)"
        );
    }

    /// Duplicate signatures by one key count once (tuf-conformance
    /// `test_duplicate_sig_keyids`): they never add up to a threshold of 2,
    /// and at threshold 1 the one key that signed is enough.
    #[test]
    fn one_key_signing_twice_counts_once() {
        let (a, b) = (Signer::new(1), Signer::new(2));
        let env = envelope(TYPE, b"p", &[&a, &a]);
        let e = env
            .verify("manifest", TYPE, &keys(&[&a, &b], 2), "release keys")
            .unwrap_err();
        assert!(
            e.message()
                .starts_with("manifest is signed by 1 of the 2 release keys"),
            "{e}"
        );
        let v = env
            .verify("manifest", TYPE, &keys(&[&a, &b], 1), "release keys")
            .unwrap();
        assert_eq!(v.signers, vec![0]);
    }

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
