//! Signing DSSE envelopes with one or more release or root keys.

use ed25519_dalek::Signer;
use updraft::envelope::{Envelope, Signature, encode_base64, pae};

use crate::keys::{Key, Result};

/// Sign `payload` of `payload_type` with every key; returns the envelope
/// as pretty JSON bytes.
pub fn sign_envelope(payload_type: &str, payload: &[u8], keys: &[Key]) -> Result<Vec<u8>> {
    if keys.is_empty() {
        return Err("no signing key given".into());
    }
    let message = pae(payload_type, payload);
    let signatures = keys
        .iter()
        .map(|k| Signature {
            keyid: k.public.keyid(),
            sig: encode_base64(&k.signing.sign(&message).to_bytes()),
        })
        .collect();
    let env = Envelope {
        payload_type: payload_type.to_string(),
        payload: encode_base64(payload),
        signatures,
    };
    let mut out = serde_json::to_vec_pretty(&env).map_err(|e| e.to_string())?;
    out.push(b'\n');
    Ok(out)
}
