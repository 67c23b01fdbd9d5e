//! Build provenance attestations: the in-toto Statement (v1) with a SLSA
//! provenance (v1) predicate that `updraft-publish release --attest-with`
//! signs with a builder key and writes beside the artifacts, and the
//! checks `verify` makes of it.
//!
//! The statement names every file a device may download from the release
//! and the image the slot ends up holding, exactly the hashes the device's
//! rule requires ([`updraft::manifest::provenance::required`]); the signed
//! manifest names the file (url, size, sha256) so it travels with the
//! release. The device's rule and parser are the `updraft` crate's, so the
//! two sides cannot disagree on what a statement must name.

use std::path::Path;

use serde_json::{Value, json};
use updraft::envelope::Envelope;
use updraft::hash::Sha256;
use updraft::manifest::Manifest;
use updraft::manifest::provenance::{
    self, AttestationRef, PAYLOAD_TYPE, PREDICATE_TYPE, STATEMENT_TYPE, Statement,
};
use updraft::trust::KeySet;

use crate::keys::{Key, Result};
use crate::release::write_atomic;
use crate::sign::sign_envelope;

/// The `buildType` of statements this publisher writes.
pub const BUILD_TYPE: &str = "https://updraft-ota.github.io/updraft-publish/release/v1";

/// The builder id used when none is given: the builder key's id.
pub fn default_builder_id(key: &Key) -> String {
    format!("urn:updraft:builder:{}", &key.public.keyid()[..16])
}

/// The statement's payload for `m` as built by `builder_id`: a subject for
/// each hash the device requires (named by the artifact's url, `image` for
/// the slot image), the release's parameters and the inputs it was built
/// from (`inputs`: name and sha256 of the image and of each older image a
/// delta starts from).
pub fn statement(m: &Manifest, builder_id: &str, inputs: &[(String, Sha256)]) -> Vec<u8> {
    let mut subjects =
        vec![json!({"name": "image", "digest": {"sha256": m.image.sha256.to_hex()}})];
    let mut urls = vec![m.artifact.url.clone()];
    urls.extend(m.deltas.iter().map(|d| d.url.clone()));
    urls.extend(m.components.iter().map(|c| c.artifact().url.clone()));
    for ((_, sha), url) in provenance::required(m).iter().skip(1).zip(urls) {
        subjects.push(json!({"name": url, "digest": {"sha256": sha.to_hex()}}));
    }
    let dependencies: Vec<Value> = inputs
        .iter()
        .map(|(name, sha)| json!({"name": name, "digest": {"sha256": sha.to_hex()}}))
        .collect();
    let v = json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "version": m.release.version,
                    "compatible": m.release.compatible,
                    "channel": m.channel,
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": builder_id},
                "metadata": {"finishedOn": m.issued.to_string()},
            },
        },
    });
    let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Sign the statement for `m` with `key`, write it to
/// `artifacts/<sha256>.intoto.json` under `out` and name it in `m`.
pub fn attach(
    m: &mut Manifest,
    out: &Path,
    key: &Key,
    builder_id: &str,
    inputs: &[(String, Sha256)],
) -> Result<()> {
    m.attestation = None;
    let payload = statement(m, builder_id, inputs);
    let envelope = sign_envelope(PAYLOAD_TYPE, &payload, std::slice::from_ref(key))?;
    let sha256 = Sha256::of(&envelope);
    let url = format!("artifacts/{sha256}.intoto.json");
    write_atomic(&out.join(&url), &envelope)?;
    m.attestation = Some(AttestationRef {
        url,
        size: envelope.len() as u64,
        sha256,
    });
    Ok(())
}

/// `verify`'s check: the attestation file beside the manifest has its
/// signed size and hash, names what the device requires, and (with
/// `builders`) is signed by them. A release without one passes only when
/// no builder keys are given.
pub fn check(dir: &Path, m: &Manifest, builders: Option<&KeySet>) -> Result<Option<String>> {
    let Some(at) = &m.attestation else {
        return match builders {
            Some(_) => Err("attestation missing: the manifest names none".into()),
            None => Ok(None),
        };
    };
    if at.url.contains("://") {
        return Ok(Some(format!("attestation {}: remote, not checked", at.url)));
    }
    let path = dir.join(&at.url);
    let raw = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    if raw.len() as u64 != at.size || Sha256::of(&raw) != at.sha256 {
        return Err(format!(
            "attestation {}: {} bytes sha256 {}, manifest says {} bytes sha256 {}",
            path.display(),
            raw.len(),
            Sha256::of(&raw),
            at.size,
            at.sha256
        ));
    }
    let statement = match builders {
        Some(keys) => provenance::verify(&raw, keys).map_err(|e| e.to_string())?,
        None => unverified(&raw)?,
    };
    provenance::attested(m, &statement).map_err(|e| e.to_string())?;
    Ok(Some(format!(
        "attestation ok: builder {}, {} subjects{}",
        statement.builder_id.as_deref().unwrap_or("(none)"),
        statement.subjects.len(),
        if builders.is_some() {
            ", signed by the builder key(s)"
        } else {
            "; signature not checked (no --builder-pub)"
        }
    )))
}

/// The statement of an attestation, without checking its signatures.
pub fn unverified(raw: &[u8]) -> Result<Statement> {
    let env = Envelope::parse(raw, "attestation").map_err(|e| e.to_string())?;
    if env.payload_type != PAYLOAD_TYPE {
        return Err(format!(
            "attestation has payloadType {:?}, expected {PAYLOAD_TYPE:?}",
            env.payload_type
        ));
    }
    let payload = env
        .payload_bytes("attestation")
        .map_err(|e| e.to_string())?;
    Statement::parse(&payload).map_err(|e| e.to_string())
}
