//! `updraft-publish bundle`: a published release directory as one file.
//!
//! The bundle is a cpio "newc" archive whose entries follow the fixed order
//! the device's walker insists on (`updraft::bundle`): an SWUpdate-style
//! `sw-description` (so fleet servers that index such files accept it),
//! the signed `manifest.json`, every key document in `keys/`, then the
//! framed image and every delta the manifest names, then the trailer,
//! padded to a 512-byte block as cpio writes it.
//!
//! This module copies bytes; it signs nothing and changes nothing in the
//! directory. It refuses a manifest that names an artifact by an absolute
//! URL (a bundle carries its artifacts), or an artifact whose file differs
//! in size from the signed size.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use updraft::bundle::{MANIFEST, SW_DESCRIPTION, TRAILER, data_padding, header};
use updraft::envelope::Envelope;
use updraft::manifest::Manifest;

use crate::keys::Result;

/// What a bundle holds, for the command's summary.
pub struct Summary {
    pub version: String,
    pub entries: usize,
    pub bytes: u64,
}

/// The `sw-description` of a release: SWUpdate's syntax, read by servers
/// that index bundles (version and hardware compatibility). Not signed:
/// the device never reads it.
pub fn sw_description(m: &Manifest) -> String {
    let quoted = |s: &str| format!("\"{}\"", s.replace(['"', '\\'], "_"));
    let hw = m
        .release
        .compatible
        .iter()
        .map(|c| quoted(c))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "software =\n{{\n\tversion = {};\n\tdescription = {};\n\thardware-compatibility: [ {hw} ];\n}};\n",
        quoted(&m.release.version),
        quoted(&format!(
            "updraft release {} (manifest serial {})",
            m.release.version, m.serial
        )),
    )
}

/// Write the release in `dir` (its `manifest.json`, `keys/`, artifacts)
/// to the bundle `out`.
pub fn bundle(dir: &Path, out: &Path) -> Result<Summary> {
    let manifest_path = dir.join(MANIFEST);
    let raw = std::fs::read(&manifest_path)
        .map_err(|e| format!("reading {}: {e}", manifest_path.display()))?;
    let env = Envelope::parse(&raw, "manifest").map_err(|e| e.to_string())?;
    let payload = env.payload_bytes("manifest").map_err(|e| e.to_string())?;
    let m = Manifest::parse(&payload).map_err(|e| format!("{}: {e}", manifest_path.display()))?;

    let mut files: Vec<(String, PathBuf, Option<u64>)> = Vec::new();
    for (n, path) in key_documents(dir)? {
        files.push((format!("keys/{n}.json"), path, None));
    }
    let mut artifacts = vec![(m.artifact.url.as_str(), m.artifact.size)];
    artifacts.extend(m.deltas.iter().map(|d| (d.url.as_str(), d.size)));
    for (url, size) in artifacts {
        if url.contains("://") || !url.starts_with("artifacts/") {
            return Err(format!(
                "the manifest names {url}; a bundle carries its artifacts, so every url must be \
                 a path under artifacts/ in {}",
                dir.display()
            ));
        }
        files.push((url.to_string(), dir.join(url), Some(size)));
    }

    let tmp = out.with_extension(format!("partial.{}", std::process::id()));
    let result = write(&tmp, &sw_description(&m), &raw, &files);
    let bytes = match result {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
    Ok(Summary {
        version: m.release.version.clone(),
        entries: files.len() + 2,
        bytes,
    })
}

/// `keys/N.json` in `dir`, by N.
fn key_documents(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let keys = dir.join("keys");
    let mut out = Vec::new();
    let listing = match std::fs::read_dir(&keys) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(format!("listing {}: {e}", keys.display())),
    };
    for entry in listing {
        let entry = entry.map_err(|e| format!("listing {}: {e}", keys.display()))?;
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((n, entry.path()));
    }
    out.sort();
    Ok(out)
}

fn write(
    tmp: &Path,
    sw_description: &str,
    manifest: &[u8],
    files: &[(String, PathBuf, Option<u64>)],
) -> Result<u64> {
    let f = File::create(tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let mut w = Counted {
        inner: BufWriter::new(f),
        n: 0,
    };
    let fail = |e: std::io::Error| format!("writing {}: {e}", tmp.display());
    let mut ino = 1;
    for (name, bytes) in [
        (SW_DESCRIPTION, sw_description.as_bytes()),
        (MANIFEST, manifest),
    ] {
        w.entry(name, bytes.len() as u64, ino, &mut &bytes[..])
            .map_err(fail)?;
        ino += 1;
    }
    for (name, path, signed) in files {
        let mut src = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
        let len = src
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if let Some(size) = signed {
            if len != *size {
                return Err(format!(
                    "{} is {len} bytes but the manifest signs {size}",
                    path.display()
                ));
            }
        }
        if len > u64::from(u32::MAX) {
            return Err(format!(
                "{} is {len} bytes: a cpio newc entry holds at most {} bytes",
                path.display(),
                u32::MAX
            ));
        }
        w.entry(name, len, ino, &mut src).map_err(fail)?;
        ino += 1;
    }
    w.write_all(&header(TRAILER, 0, 0)).map_err(fail)?;
    let block = (512 - w.n % 512) % 512;
    w.write_all(&vec![0u8; block as usize]).map_err(fail)?;
    let n = w.n;
    let f = w.inner.into_inner().map_err(|e| fail(e.into_error()))?;
    f.sync_all().map_err(fail)?;
    Ok(n)
}

/// A writer that counts what went through it.
struct Counted<W: Write> {
    inner: W,
    n: u64,
}

impl<W: Write> Counted<W> {
    fn entry(
        &mut self,
        name: &str,
        len: u64,
        ino: u32,
        src: &mut dyn std::io::Read,
    ) -> std::io::Result<()> {
        let size = u32::try_from(len).map_err(std::io::Error::other)?;
        self.write_all(&header(name, size, ino))?;
        let copied = std::io::copy(&mut std::io::Read::take(src, len), self)?;
        if copied != len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{name}: {copied} of {len} bytes"),
            ));
        }
        self.write_all(&[0u8; 3][..data_padding(len)])
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
