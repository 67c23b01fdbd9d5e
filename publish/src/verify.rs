//! Checking a published release the way a device will, before devices do.
//!
//! `verify` checks the manifest signature against the given public keys,
//! validates the payload, then reads every artifact the manifest names from
//! the release directory: sizes, sha256, each frame's decoded sha256, the
//! whole image's sha256, and each delta's size and sha256; a release of
//! components also every app's index and blobs and every command's
//! payload, as a device reads them. `inspect` prints
//! what a manifest says without verifying anything.

use std::path::Path;

use std::io::Read;

use updraft::artifact::{FrameDecoder, VerifiedFrames};
use updraft::envelope::Envelope;
use updraft::hash::{Hasher, Sha256};
use updraft::manifest::component::{Component, Part};
use updraft::manifest::{self, Manifest};
use updraft::trust::{Anchor, KeySet, PublicKey, Trust};

use crate::keys::Result;
use crate::release::hash_file;

/// Verify `manifest_path` with `keys` (threshold `threshold`) and every
/// artifact beside it. Returns a summary line per check.
pub fn verify(
    manifest_path: &Path,
    keys: Vec<PublicKey>,
    threshold: usize,
    builders: Option<&KeySet>,
) -> Result<Vec<String>> {
    let raw = std::fs::read(manifest_path)
        .map_err(|e| format!("reading {}: {e}", manifest_path.display()))?;
    let set = KeySet::new(keys, threshold).map_err(|e| e.to_string())?;
    let trust = Trust::new(Anchor::Release(set));
    let vm = manifest::verify(&raw, &trust).map_err(|e| e.to_string())?;
    let m = vm.manifest;
    let dir = manifest_path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut lines = vec![format!(
        "signature ok: release {} serial {} for {}",
        m.release.version,
        m.serial,
        m.release.compatible.join(",")
    )];
    lines.push(check_artifact(dir, &m)?);
    for d in &m.deltas {
        if d.url.contains("://") {
            lines.push(format!("delta {}: remote, not checked", d.url));
            continue;
        }
        let p = dir.join(&d.url);
        let (len, sha) = hash_file(&p)?;
        if len != d.size || sha != d.sha256 {
            return Err(format!(
                "delta {}: {len} bytes sha256 {sha}, manifest says {} bytes sha256 {}",
                p.display(),
                d.size,
                d.sha256
            ));
        }
        lines.push(format!(
            "delta from {} ok: {} bytes",
            d.from_sha256.short(),
            d.size
        ));
    }
    for c in &m.components {
        lines.push(check_component(dir, c)?);
    }
    lines.extend(crate::attest::check(dir, &m, builders)?);
    if m.expires <= updraft::timestamp::Timestamp::now() {
        return Err(format!("manifest expired at {}", m.expires));
    }
    Ok(lines)
}

/// A component's artifacts read as a device reads them: a command's
/// payload frame by frame; an app's index, checked by the device's own
/// rules, and every file's blob decoded to its listed size and hash.
fn check_component(dir: &Path, c: &Component) -> Result<String> {
    let what = format!("component {}", c.name);
    let frames = |a: &updraft::manifest::Artifact| -> Result<Vec<u8>> {
        if a.url.contains("://") {
            return Err(format!(
                "{what}: {} is remote; verify it where it is served",
                a.url
            ));
        }
        let path = dir.join(&a.url);
        let file = std::fs::File::open(&path)
            .map_err(|e| format!("{what}: opening {}: {e}", path.display()))?;
        let mut r = VerifiedFrames::new(Box::new(file), a, &what).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        r.read_to_end(&mut out)
            .map_err(|e| format!("{what}: {e}"))?;
        Ok(out)
    };
    match &c.part {
        Part::Command(p) => {
            let payload = frames(&p.artifact)?;
            Ok(format!(
                "{what} ok: command payload of {} bytes, {} frames",
                payload.len(),
                p.artifact.frames.len()
            ))
        }
        Part::App(a) | Part::Boot(a) => {
            if a.index.url.contains("://") {
                return Err(format!(
                    "{what}: {} is remote; verify it where it is served",
                    a.index.url
                ));
            }
            let index = crate::app::read_index(dir, a, &what)?;
            if let Part::Boot(_) = c.part {
                updraft::app::boot::check(&index).map_err(|e| format!("{what}: {e}"))?;
            }
            let mut checked = 0u64;
            for file in index.files() {
                crate::app::decode_blob(dir, a, file, &what, &mut std::io::sink())?;
                checked += 1;
            }
            Ok(format!(
                "{what} ok: {} index of {} entries, {checked} file blobs decoded and hashed",
                c.kind().as_str(),
                index.entries.len()
            ))
        }
    }
}

fn check_artifact(dir: &Path, m: &Manifest) -> Result<String> {
    let a = &m.artifact;
    if a.url.contains("://") {
        return Ok(format!("artifact {}: remote, not checked", a.url));
    }
    let p = dir.join(&a.url);
    let data = std::fs::read(&p).map_err(|e| format!("reading {}: {e}", p.display()))?;
    if data.len() as u64 != a.size {
        return Err(format!(
            "artifact {} is {} bytes, manifest says {}",
            p.display(),
            data.len(),
            a.size
        ));
    }
    let sha = Sha256::of(&data);
    if sha != a.sha256 {
        return Err(format!(
            "artifact {} has sha256 {sha}, manifest says {}",
            p.display(),
            a.sha256
        ));
    }
    let mut dec = FrameDecoder::new().map_err(|e| e.to_string())?;
    let mut image = Hasher::new();
    for (i, f) in a.frames.iter().enumerate() {
        let chunk = &data[f.offset as usize..(f.offset + f.size) as usize];
        let out = dec.decode(i, f, chunk).map_err(|e| e.to_string())?;
        image.update(out);
    }
    let img = image.finish();
    if img != m.image.sha256 {
        return Err(format!(
            "image decodes to sha256 {img}, manifest says {}",
            m.image.sha256
        ));
    }
    Ok(format!(
        "artifact ok: {} frames, {} bytes compressed, image {} bytes sha256 {}",
        a.frames.len(),
        a.size,
        m.image.size,
        m.image.sha256
    ))
}

/// A human-readable description of a manifest (not verified).
pub fn inspect(path: &Path, json: bool) -> Result<String> {
    let raw = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let env = Envelope::parse(&raw, "manifest").map_err(|e| e.to_string())?;
    let payload = env.payload_bytes("manifest").map_err(|e| e.to_string())?;
    if env.payload_type == updraft::trust::KEYS_PAYLOAD_TYPE {
        let body = crate::keys::peek_key_document(&raw)?;
        return serde_json::to_string_pretty(&body).map_err(|e| e.to_string());
    }
    let m = Manifest::parse(&payload).map_err(|e| e.to_string())?;
    if json {
        let payload = updraft::manifest::component::to_payload(&m).map_err(|e| e.to_string())?;
        return String::from_utf8(payload).map_err(|e| e.to_string());
    }
    let mut s = String::new();
    s.push_str(&format!("release:      {}\n", m.release.version));
    s.push_str(&format!(
        "compatible:   {}\n",
        m.release.compatible.join(", ")
    ));
    if let Some(r) = &m.release.rollout {
        s.push_str(&format!("rollout:      {}%\n", r.percent));
    }
    s.push_str(&format!("serial:       {}\n", m.serial));
    s.push_str(&format!("issued:       {}\n", m.issued));
    s.push_str(&format!("expires:      {}\n", m.expires));
    if let Some(k) = m.keys_version {
        s.push_str(&format!("keys version: {k}\n"));
    }
    s.push_str(&format!(
        "image:        {} bytes, sha256 {}\n",
        m.image.size, m.image.sha256
    ));
    s.push_str(&format!(
        "artifact:     {} ({} bytes, {} frames)\n",
        m.artifact.url,
        m.artifact.size,
        m.artifact.frames.len()
    ));
    for d in &m.deltas {
        s.push_str(&format!(
            "delta:        {} ({} bytes) from {} bytes sha256 {}\n",
            d.url, d.size, d.from_size, d.from_sha256
        ));
    }
    for c in &m.components {
        let what = match &c.part {
            Part::App(a) | Part::Boot(a) => format!(
                "{}, index {} ({} entries, {} bytes)",
                c.kind().as_str(),
                a.index.url,
                a.tree.entries,
                a.tree.bytes
            ),
            Part::Command(p) => format!("command, {} ({} bytes)", p.artifact.url, p.artifact.size),
        };
        s.push_str(&format!("component:    {} {}: {what}\n", c.name, c.version));
    }
    if let Some(a) = &m.attestation {
        s.push_str(&format!(
            "attestation:  {} ({} bytes, sha256 {})\n",
            a.url, a.size, a.sha256
        ));
        let path = path.parent().unwrap_or(Path::new(".")).join(&a.url);
        if let Ok(st) = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|raw| crate::attest::unverified(&raw))
        {
            s.push_str(&format!(
                "builder:      {} ({} subjects, not verified)\n",
                st.builder_id.as_deref().unwrap_or("(none)"),
                st.subjects.len()
            ));
        }
    }
    for sig in &env.signatures {
        s.push_str(&format!("signature:    keyid {}\n", sig.keyid));
    }
    Ok(s)
}
