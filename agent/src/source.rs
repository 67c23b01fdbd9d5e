//! Where a release comes from: a local directory (USB stick, offline
//! install), a bundle file (the same directory in one cpio archive, see
//! [`crate::bundle`]) or a server with mirrors.
//!
//! The publisher writes a directory (`manifest.json`, `keys/N.json`,
//! `artifacts/…`); a [`Source`] reads that layout from wherever it is, so the
//! install pipeline never cares whether bytes come from a file or over
//! HTTPS. For servers it tries the primary and then each mirror in order when
//! one fails, and prefers the last one that worked next time. A local
//! artifact whose file size differs from the signed size is refused before a
//! byte is read.
//!
//! This module moves bytes; it never verifies signatures or hashes.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::bundle::{self, Entry, Index};
use crate::error::{Context, Error, Kind, Result};
use crate::fetch::{Fetched, Fetcher, join, split_url};
use crate::manifest::MAX_MANIFEST_BYTES;
use crate::trust::MAX_KEY_DOCUMENT_BYTES;
use crate::{bail, err};

/// The file name ending that makes an install argument a bundle.
pub const BUNDLE_SUFFIX: &str = ".updraft";

/// Where the release directory is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A directory on this machine, and the manifest file in it.
    Local { dir: PathBuf, manifest: PathBuf },
    /// A bundle file on this machine (`*.updraft`).
    Bundle { path: PathBuf },
    /// Base URLs (primary first, then mirrors) and the manifest's file name.
    Remote {
        bases: Vec<String>,
        manifest: String,
    },
}

impl Origin {
    /// From a command-line argument or a stored job: an `http(s)://` URL,
    /// a path to a bundle (ending in [`BUNDLE_SUFFIX`]) or a path to a
    /// manifest file.
    pub fn parse(arg: &str, mirrors: &[String]) -> Origin {
        if arg.starts_with("https://") || arg.starts_with("http://") {
            let (base, name) = split_url(arg);
            let mut bases = vec![base];
            for m in mirrors {
                let m = if m.ends_with('/') {
                    m.clone()
                } else {
                    format!("{m}/")
                };
                if !bases.contains(&m) {
                    bases.push(m);
                }
            }
            Origin::Remote {
                bases,
                manifest: if name.is_empty() {
                    "manifest.json".into()
                } else {
                    name
                },
            }
        } else if arg.ends_with(BUNDLE_SUFFIX) {
            Origin::Bundle {
                path: PathBuf::from(arg),
            }
        } else {
            let path = PathBuf::from(arg);
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            Origin::Local {
                dir,
                manifest: path,
            }
        }
    }

    /// The string that [`Origin::parse`] turns back into this origin
    /// (mirrors come from the configuration).
    pub fn to_arg(&self) -> String {
        match self {
            Origin::Local { manifest, .. } => manifest.display().to_string(),
            Origin::Bundle { path } => path.display().to_string(),
            Origin::Remote { bases, manifest } => join(&bases[0], manifest),
        }
    }

    pub fn is_remote(&self) -> bool {
        matches!(self, Origin::Remote { .. })
    }
}

/// An open origin with the fetcher it needs. Cheap to clone (the fetcher
/// shares its connection pool), so a transfer can run on a helper thread.
#[derive(Clone)]
pub struct Source {
    origin: Origin,
    fetcher: Option<Fetcher>,
    preferred: usize,
}

impl Source {
    /// `fetcher` may be `None` for local origins.
    pub fn new(origin: Origin, fetcher: Option<Fetcher>, preferred: usize) -> Source {
        Source {
            origin,
            fetcher,
            preferred,
        }
    }

    /// Index of the base URL that last worked.
    pub fn preferred(&self) -> usize {
        self.preferred
    }

    pub fn describe(&self) -> String {
        self.origin.to_arg()
    }

    fn fetcher(&self) -> Result<Fetcher> {
        self.fetcher
            .clone()
            .ok_or_else(|| err!(Config, "no HTTPS client configured for {}", self.describe()))
    }

    /// Remember which base URL worked (from a transfer run on a clone).
    pub fn set_preferred(&mut self, preferred: usize) {
        self.preferred = preferred;
    }

    /// Try each base in turn, starting at the preferred one; remember the
    /// one that answered. Errors other than network errors stop the search
    /// (a signature problem on one mirror is not fixed by another).
    fn each_base<T>(&mut self, mut f: impl FnMut(&str) -> Result<T>) -> Result<T> {
        let Origin::Remote { bases, .. } = &self.origin else {
            bail!(Config, "not a remote origin");
        };
        let bases = bases.clone();
        let n = bases.len();
        let start = self.preferred.min(n.saturating_sub(1));
        let mut errors: Vec<String> = Vec::new();
        let mut last: Option<Error> = None;
        for i in 0..n {
            let idx = (start + i) % n;
            match f(&bases[idx]) {
                Ok(v) => {
                    if idx != self.preferred {
                        log::info!("using mirror {}", bases[idx]);
                    }
                    self.preferred = idx;
                    return Ok(v);
                }
                Err(e) if e.kind() == Kind::Network && n > 1 => {
                    log::warn!("{e}");
                    errors.push(e.to_string());
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        let retry = last.as_ref().and_then(|e| e.retry_after());
        let mut e = Error::new(
            Kind::Network,
            if errors.len() > 1 {
                format!("all {} servers failed: {}", errors.len(), errors.join("; "))
            } else {
                errors
                    .pop()
                    .unwrap_or_else(|| "no server configured".into())
            },
        );
        if let Some(d) = retry {
            e = e.with_retry_after(d);
        }
        Err(e)
    }

    /// The manifest bytes; `etag` makes the request conditional.
    pub fn manifest(&mut self, etag: Option<&str>) -> Result<Fetched> {
        match &self.origin {
            Origin::Local { manifest, .. } => {
                read_capped(manifest, MAX_MANIFEST_BYTES as u64, "manifest")
                    .map(|bytes| Fetched::Body { bytes, etag: None })
            }
            Origin::Bundle { path } => {
                let (mut f, index) = open_bundle(path)?;
                read_entry(&mut f, path, index.manifest())
                    .map(|bytes| Fetched::Body { bytes, etag: None })
            }
            Origin::Remote { manifest, .. } => {
                let name = manifest.clone();
                let fetcher = self.fetcher()?;
                self.each_base(|base| {
                    fetcher.get_small(&join(base, &name), MAX_MANIFEST_BYTES as u64, etag)
                })
            }
        }
    }

    /// Key document `keys/N.json` beside the manifest.
    pub fn key_document(&mut self, version: u64) -> Result<Vec<u8>> {
        let rel = format!("keys/{version}.json");
        match &self.origin {
            Origin::Local { dir, .. } => read_capped(
                &dir.join(&rel),
                MAX_KEY_DOCUMENT_BYTES as u64,
                "key document",
            ),
            Origin::Bundle { path } => {
                let (mut f, index) = open_bundle(path)?;
                let entry = index.get(&rel).ok_or_else(|| {
                    err!(
                        Malformed,
                        "bundle {} holds no {rel} that the manifest needs",
                        path.display()
                    )
                })?;
                read_entry(&mut f, path, entry)
            }
            Origin::Remote { .. } => {
                let fetcher = self.fetcher()?;
                match self.each_base(|base| {
                    fetcher.get_small(&join(base, &rel), MAX_KEY_DOCUMENT_BYTES as u64, None)
                })? {
                    Fetched::Body { bytes, .. } => Ok(bytes),
                    Fetched::NotModified => bail!(Network, "{rel}: unexpected 304"),
                }
            }
        }
    }

    /// Open `rel` (artifact or delta) at `offset`; the reader yields exactly
    /// `total - offset` bytes or fails.
    pub fn open(&mut self, rel: &str, offset: u64, total: u64) -> Result<Box<dyn Read + Send>> {
        match &self.origin {
            Origin::Local { dir, .. } => {
                let path = if rel.contains("://") {
                    bail!(
                        Config,
                        "{rel} is a URL, but the release was given as a local directory"
                    )
                } else {
                    dir.join(rel)
                };
                let mut f =
                    File::open(&path).map_err(|e| err!(Io, "opening {}: {e}", path.display()))?;
                let len = f
                    .metadata()
                    .map_err(|e| err!(Io, "{}: {e}", path.display()))?
                    .len();
                if len != total {
                    return Err(unsigned_size(&path.display().to_string(), len, total));
                }
                f.seek(SeekFrom::Start(offset))
                    .map_err(|e| err!(Io, "seeking {}: {e}", path.display()))?;
                Ok(Box::new(f.take(total - offset)))
            }
            Origin::Bundle { path } => {
                let (mut f, index) = open_bundle(path)?;
                let entry = index
                    .artifact(rel)
                    .with_context(|| format!("bundle {}", path.display()))?;
                if entry.size != total {
                    let what = format!("{rel} in bundle {}", path.display());
                    return Err(unsigned_size(&what, entry.size, total));
                }
                f.seek(SeekFrom::Start(entry.offset + offset))
                    .map_err(|e| err!(Io, "seeking {}: {e}", path.display()))?;
                Ok(Box::new(f.take(total - offset)))
            }
            Origin::Remote { .. } => {
                let fetcher = self.fetcher()?;
                let rel = rel.to_string();
                let dl = self.each_base(|base| fetcher.open(&join(base, &rel), offset, total))?;
                Ok(Box::new(dl))
            }
        }
    }
}

/// `what` holds `len` bytes where the manifest signs `total`.
fn unsigned_size(what: &str, len: u64, total: u64) -> Error {
    let how = if len > total { "longer" } else { "shorter" };
    err!(
        Integrity,
        "{what} is {len} bytes but the signed size is {total} ({how} than signed)"
    )
}

/// Open a bundle file and walk its headers.
fn open_bundle(path: &Path) -> Result<(File, Index)> {
    let mut f = File::open(path).map_err(|e| err!(Io, "opening bundle {}: {e}", path.display()))?;
    let len = f
        .metadata()
        .map_err(|e| err!(Io, "bundle {}: {e}", path.display()))?
        .len();
    let index = bundle::index(&mut f, len).with_context(|| format!("bundle {}", path.display()))?;
    Ok((f, index))
}

/// The data of a small entry (the index has checked it against its cap).
fn read_entry(f: &mut File, path: &Path, entry: &Entry) -> Result<Vec<u8>> {
    let len = usize::try_from(entry.size).map_err(|_| {
        err!(
            Malformed,
            "{} in bundle {} is too large",
            entry.name,
            path.display()
        )
    })?;
    let mut bytes = vec![0u8; len];
    bundle::ReadAt::read_exact_at(f, entry.offset, &mut bytes)
        .with_context(|| format!("{} in bundle {}", entry.name, path.display()))?;
    Ok(bytes)
}

/// Read a whole local file of at most `cap` bytes.
fn read_capped(path: &Path, cap: u64, what: &str) -> Result<Vec<u8>> {
    let f = File::open(path).map_err(|e| err!(Io, "opening {what} {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err!(Io, "reading {what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > cap {
        bail!(
            Malformed,
            "{what} {} is larger than the {cap}-byte limit",
            path.display()
        );
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_round_trip() {
        let o = Origin::parse(
            "https://h/stable/manifest.json",
            &["https://m/stable".into()],
        );
        assert_eq!(
            o,
            Origin::Remote {
                bases: vec!["https://h/stable/".into(), "https://m/stable/".into()],
                manifest: "manifest.json".into()
            }
        );
        assert_eq!(o.to_arg(), "https://h/stable/manifest.json");
        let l = Origin::parse("/media/usb/release/manifest.json", &[]);
        assert_eq!(l.to_arg(), "/media/usb/release/manifest.json");
        assert!(!l.is_remote());
    }
}
