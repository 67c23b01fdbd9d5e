//! `updraft-publish modules`: a published release of components as the
//! software modules of a hawkBit distribution set, one directory per
//! component, ready to upload ([docs/fleet-server.md](../../docs/fleet-server.md)).
//!
//! A fleet server keeps a module's files by their file name alone, and a
//! module holds few of them (hawkBit's default quota is 50 per module), so
//! an app is never uploaded as a blob per file: its module holds its
//! signed index and its *pack* (`updraft::app::pack`), every distinct file
//! one after the other where the signed index puts it, which the device
//! reads by Range requests, asking only for the files it lacks. The
//! slot's module holds `manifest.json`, the key documents and the slot's
//! artifact and deltas; a command's module its payload.
//!
//! This module copies bytes and writes packs; it signs nothing and changes
//! nothing in the release directory. A file the manifest names by an
//! absolute URL is refused: the module carries it.

use std::path::{Path, PathBuf};

use updraft::app::pack;
use updraft::bundle::MANIFEST;
use updraft::manifest::component::Part;

use crate::bundle::{key_documents, read_manifest, write_pack};
use crate::keys::Result;

/// One software module written: the component it carries and its files.
pub struct Module {
    /// The component's name and version: the module's.
    pub name: String,
    pub version: String,
    /// hawkBit's module type for it: `os` (the slot), `application`.
    pub kind: &'static str,
    pub files: Vec<PathBuf>,
}

/// Write the release in `dir` as one directory per component below `out`
/// (which must not exist), each file under its last path segment.
pub fn modules(dir: &Path, out: &Path) -> Result<Vec<Module>> {
    let (_, m) = read_manifest(dir)?;
    let Some(slot) = &m.slot else {
        return Err(format!(
            "{}: a release of one image (spec_version 1) is one software module: upload the release directory's files, or its bundle",
            dir.join(MANIFEST).display()
        ));
    };
    std::fs::create_dir(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let mut written = Vec::new();

    let mut os: Vec<PathBuf> = vec![dir.join(MANIFEST)];
    os.extend(key_documents(dir)?.into_iter().map(|(_, p)| p));
    os.push(dir.join(&m.artifact.url));
    os.extend(m.deltas.iter().map(|d| dir.join(&d.url)));
    // The provenance attestation travels with the slot, where a device
    // that requires one looks for it among the action's files.
    os.extend(m.attestation.iter().map(|a| dir.join(&a.url)));
    written.push(module(out, &slot.name, &slot.version, "os", &os)?);

    for c in &m.components {
        let files = match &c.part {
            Part::Command(p) => vec![dir.join(&p.artifact.url)],
            Part::App(t) | Part::Boot(t) => {
                let at = out.join(format!(".{}.pack", c.name));
                write_pack(dir, &c.name, t, &at)?;
                let packed = at.with_file_name(last_segment(&pack::name(&t.index)));
                std::fs::rename(&at, &packed)
                    .map_err(|e| format!("renaming {}: {e}", at.display()))?;
                vec![dir.join(&t.index.url), packed]
            }
        };
        written.push(module(out, &c.name, &c.version, "application", &files)?);
    }
    Ok(written)
}

/// Copy (or, for a pack written beside it, move) `files` into
/// `out/<name>/` under their last path segments.
fn module(
    out: &Path,
    name: &str,
    version: &str,
    kind: &'static str,
    files: &[PathBuf],
) -> Result<Module> {
    let into = out.join(name);
    std::fs::create_dir(&into).map_err(|e| format!("creating {}: {e}", into.display()))?;
    let mut placed = Vec::with_capacity(files.len());
    for f in files {
        let rel = f.to_string_lossy();
        if rel.contains("://") {
            return Err(format!(
                "component {name}: {rel} is a URL; a software module carries its files"
            ));
        }
        let dest = into.join(last_segment(&rel));
        if f.parent() == Some(out) {
            std::fs::rename(f, &dest)
        } else {
            std::fs::copy(f, &dest).map(|_| ())
        }
        .map_err(|e| {
            format!(
                "component {name}: {} to {}: {e}",
                f.display(),
                dest.display()
            )
        })?;
        placed.push(dest);
    }
    Ok(Module {
        name: name.to_string(),
        version: version.to_string(),
        kind,
        files: placed,
    })
}

fn last_segment(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
