//! Where a release comes from: a local directory (USB stick, offline
//! install), a bundle file (the same directory in one cpio archive, see
//! [`crate::bundle`]) on this machine or on a web server, a server with
//! mirrors, or a list of links (each file of the release at a URL of its
//! own, as a fleet server hands them out).
//!
//! The publisher writes a directory (`manifest.json`, `keys/N.json`,
//! `artifacts/…`); a [`Source`] reads that layout from wherever it is, so the
//! install pipeline never cares whether bytes come from a file or over
//! HTTPS. For servers it tries the primary and then each mirror in order when
//! one fails, and prefers the last one that worked next time. A local
//! artifact whose file size differs from the signed size is refused before a
//! byte is read. A bundle is walked anew for each request ([`Source::open`],
//! [`Source::manifest`], [`Source::key_document`]); a remote one through
//! bounded Range requests with a read-ahead buffer, so the walk, the manifest
//! and the key documents cost one request, plus one for each header that
//! lies beyond it (after a large artifact or part). An artifact split into
//! parts reads as one stream from any offset, from a file or by Range alike.
//!
//! This module moves bytes; it never verifies signatures or hashes.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::bundle::{self, Artifact, Entry, Index, ReadAt};
use crate::error::{Context, Error, Kind, Result};
use crate::fetch::{Fetched, Fetcher, RangeInfo, Ranged, join, split_url};
use crate::hash::truncate;
use crate::manifest::MAX_MANIFEST_BYTES;
use crate::trust::MAX_KEY_DOCUMENT_BYTES;
use crate::{bail, err};

/// The file name ending that makes an install argument a bundle.
pub const BUNDLE_SUFFIX: &str = ".updraft";
/// Marks an http(s) URL as a bundle whatever its path ends in (a fleet
/// server's download link): `bundle+https://…`.
pub const BUNDLE_URL_PREFIX: &str = "bundle+";
/// Marks a list of links: `links:` and the JSON of [`Origin::Links`].
pub const LINKS_PREFIX: &str = "links:";

/// The first Range request of a remote bundle: its headers, the manifest
/// and the key documents fit in it unless the manifest is large.
const HEAD_WINDOW: u64 = 256 * 1024;
/// A later request for a header (beyond a large entry): the header, its
/// name and what follows when it is small (the trailer).
const HOP_WINDOW: u64 = 16 * 1024;

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
    /// A bundle on a web server, read by Range requests. Mirrors do not
    /// apply.
    RemoteBundle { url: String },
    /// A release directory whose files are at arbitrary URLs: the
    /// manifest's, and for each relative name the manifest needs
    /// (`keys/N.json`, `artifacts/…`) the URL it is at. Mirrors do not
    /// apply.
    Links {
        manifest: String,
        files: BTreeMap<String, String>,
    },
    /// A `links:` argument (or stored source) that cannot be read: every
    /// request through it fails with `problem`.
    Invalid { arg: String, problem: String },
}

/// The manifest's URL and the files' of a `links:` origin, from its JSON
/// (`{"manifest":URL,"files":{NAME:URL,…}}`, nothing else in it).
fn links_of(json: &str) -> std::result::Result<(String, BTreeMap<String, String>), String> {
    let v: Value = serde_json::from_slice(json.as_bytes()).map_err(|e| e.to_string())?;
    let Value::Object(fields) = v else {
        return Err("expected an object".into());
    };
    if let Some(other) = fields.keys().find(|k| *k != "manifest" && *k != "files") {
        return Err(format!(
            "unknown field `{other}`, expected `manifest` or `files`"
        ));
    }
    let manifest = match fields.get("manifest") {
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err("`manifest` is not a string".into()),
        None => return Err("missing field `manifest`".into()),
    };
    let mut files = BTreeMap::new();
    match fields.get("files") {
        Some(Value::Object(listed)) => {
            for (name, url) in listed {
                let Value::String(url) = url else {
                    return Err(format!("`files.{name}` is not a string"));
                };
                files.insert(name.clone(), url.clone());
            }
        }
        Some(_) => return Err("`files` is not an object".into()),
        None => return Err("missing field `files`".into()),
    }
    Ok((manifest, files))
}

/// An http(s) URL.
fn is_http(arg: &str) -> bool {
    arg.starts_with("https://") || arg.starts_with("http://")
}

/// The path of an http(s) URL, without query and fragment.
fn url_path(url: &str) -> &str {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    let rest = &url[after_scheme..];
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    rest.find('/').map(|i| &rest[i..]).unwrap_or("")
}

impl Origin {
    /// From a command-line argument or a stored job:
    /// * `links:{"manifest":URL,"files":{NAME:URL,…}}`: [`Origin::Links`];
    /// * `bundle+URL`, or an `http(s)://` URL whose path ends in
    ///   [`BUNDLE_SUFFIX`] (a query may follow): [`Origin::RemoteBundle`];
    /// * any other `http(s)://` URL: a manifest on a server, with `mirrors`;
    /// * a path ending in [`BUNDLE_SUFFIX`]: a bundle file;
    /// * any other path: a manifest file.
    ///
    /// `Origin::parse(&o.to_arg(), mirrors) == o` for every origin (the
    /// mirrors of a remote one being `mirrors`).
    pub fn parse(arg: &str, mirrors: &[String]) -> Origin {
        if let Some(json) = arg.strip_prefix(LINKS_PREFIX) {
            return match links_of(json) {
                Ok((manifest, files)) => Origin::Links { manifest, files },
                Err(e) => Origin::Invalid {
                    arg: arg.to_string(),
                    problem: format!(
                        "{} is not a list of links ({LINKS_PREFIX}{{\"manifest\":URL,\"files\":{{NAME:URL,…}}}}): {e}",
                        truncate(arg, 200)
                    ),
                },
            };
        }
        if let Some(url) = arg.strip_prefix(BUNDLE_URL_PREFIX) {
            return Origin::RemoteBundle {
                url: url.to_string(),
            };
        }
        if is_http(arg) {
            if url_path(arg).ends_with(BUNDLE_SUFFIX) {
                return Origin::RemoteBundle {
                    url: arg.to_string(),
                };
            }
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
            Origin::RemoteBundle { url } => {
                if is_http(url) && url_path(url).ends_with(BUNDLE_SUFFIX) {
                    url.clone()
                } else {
                    format!("{BUNDLE_URL_PREFIX}{url}")
                }
            }
            Origin::Links { manifest, files } => {
                let mut listed = Map::new();
                for (name, url) in files {
                    listed.insert(name.clone(), Value::String(url.clone()));
                }
                let mut json = Map::new();
                json.insert("manifest".into(), Value::String(manifest.clone()));
                json.insert("files".into(), Value::Object(listed));
                format!("{LINKS_PREFIX}{}", Value::Object(json))
            }
            Origin::Invalid { arg, .. } => arg.clone(),
        }
    }

    /// True when reading the release needs the network (and a
    /// [`Fetcher`]).
    pub fn is_remote(&self) -> bool {
        matches!(
            self,
            Origin::Remote { .. } | Origin::RemoteBundle { .. } | Origin::Links { .. }
        )
    }

    /// Whether a tree's files are read from its pack `pack`
    /// ([`crate::app::pack::name`]) rather than one blob each: always from
    /// a bundle, and from links that list the pack (a fleet server's
    /// software module holds an app's index and pack, not a file per blob).
    pub fn reads_pack(&self, pack: &str) -> bool {
        match self {
            Origin::Bundle { .. } | Origin::RemoteBundle { .. } => true,
            Origin::Links { files, .. } => files.contains_key(pack),
            _ => false,
        }
    }

    /// Why this origin cannot be read, for an argument refused up front.
    pub fn problem(&self) -> Option<&str> {
        match self {
            Origin::Invalid { problem, .. } => Some(problem),
            _ => None,
        }
    }
}

/// An open origin with the fetcher it needs. Cheap to clone (the fetcher
/// shares its connection pool), so a transfer can run on a helper thread.
#[derive(Clone)]
pub struct Source {
    origin: Origin,
    fetcher: Option<Fetcher>,
    preferred: usize,
    /// A bundle's headers, walked once for all the ranges read through
    /// this source.
    bundle: Option<Walked>,
}

/// A bundle whose headers were walked: the open file, or what the server's
/// first answer said of it.
#[derive(Clone)]
enum Walked {
    Local(Arc<File>, Index),
    Remote(Index, RangeInfo),
}

impl Source {
    /// `fetcher` may be `None` for local origins.
    pub fn new(origin: Origin, fetcher: Option<Fetcher>, preferred: usize) -> Source {
        Source {
            origin,
            fetcher,
            preferred,
            bundle: None,
        }
    }

    /// Index of the base URL that last worked.
    pub fn preferred(&self) -> usize {
        self.preferred
    }

    pub fn describe(&self) -> String {
        match &self.origin {
            Origin::Links { manifest, files } => format!(
                "the manifest at {} and {} linked file(s)",
                truncate(manifest, 200),
                files.len()
            ),
            o => truncate(&o.to_arg(), 300).to_string(),
        }
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

    /// The manifest bytes; `etag` makes the request conditional (for a
    /// remote bundle, on the bundle's ETag).
    pub fn manifest(&mut self, etag: Option<&str>) -> Result<Fetched> {
        match &self.origin {
            Origin::Local { manifest, .. } => {
                read_capped(manifest, MAX_MANIFEST_BYTES as u64, "manifest")
                    .map(|bytes| Fetched::Body { bytes, etag: None })
            }
            Origin::Bundle { path } => {
                let (mut f, index) = open_bundle(path)?;
                read_entry(&mut f, &path.display().to_string(), index.manifest())
                    .map(|bytes| Fetched::Body { bytes, etag: None })
            }
            Origin::Remote { manifest, .. } => {
                let name = manifest.clone();
                let fetcher = self.fetcher()?;
                self.each_base(|base| {
                    fetcher.get_small(&join(base, &name), MAX_MANIFEST_BYTES as u64, etag)
                })
            }
            Origin::RemoteBundle { url } => {
                let Some(mut b) = HttpBundle::open(self.fetcher()?, url, etag)? else {
                    return Ok(Fetched::NotModified);
                };
                let index = b.index()?;
                let bytes = read_entry(&mut b, &url_name(url), index.manifest())?;
                Ok(Fetched::Body {
                    bytes,
                    etag: b.info.etag.clone(),
                })
            }
            Origin::Links { manifest, .. } => {
                self.fetcher()?
                    .get_small(manifest, MAX_MANIFEST_BYTES as u64, etag)
            }
            Origin::Invalid { problem, .. } => bail!(Malformed, "{problem}"),
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
                let what = path.display().to_string();
                read_entry(&mut f, &what, key_entry(&index, &rel, &what)?)
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
            Origin::RemoteBundle { url } => {
                let Some(mut b) = HttpBundle::open(self.fetcher()?, url, None)? else {
                    bail!(Network, "{rel}: unexpected 304");
                };
                let index = b.index()?;
                let what = url_name(url);
                read_entry(&mut b, &what, key_entry(&index, &rel, &what)?)
            }
            Origin::Links { files, .. } => {
                let url = link(files, &rel)?;
                match self
                    .fetcher()?
                    .get_small(&url, MAX_KEY_DOCUMENT_BYTES as u64, None)?
                {
                    Fetched::Body { bytes, .. } => Ok(bytes),
                    Fetched::NotModified => bail!(Network, "{rel}: unexpected 304"),
                }
            }
            Origin::Invalid { problem, .. } => bail!(Malformed, "{problem}"),
        }
    }

    /// Open `rel`, a resource of at most `cap` bytes whose exact size is
    /// not signed (an app's blob), from a directory, a server or the links
    /// of a fleet server's software modules.
    pub fn open_capped(&mut self, rel: &str, cap: u64) -> Result<Box<dyn Read + Send>> {
        match &self.origin {
            Origin::Local { dir, .. } => {
                let path = dir.join(rel);
                let (f, len) = open_with_len(&path)?;
                if len > cap {
                    bail!(
                        Integrity,
                        "{} is {len} bytes, more than the {cap} bytes its signed size allows",
                        path.display()
                    );
                }
                Ok(Box::new(f.take(cap)))
            }
            Origin::Remote { .. } => {
                let fetcher = self.fetcher()?;
                let rel = rel.to_string();
                let dl = self.each_base(|base| fetcher.open_capped(&join(base, &rel), cap))?;
                Ok(Box::new(dl))
            }
            Origin::Links { files, .. } => {
                let url = link(files, rel)?;
                Ok(Box::new(self.fetcher()?.open_capped(&url, cap)?))
            }
            Origin::Bundle { .. } | Origin::RemoteBundle { .. } => bail!(
                Config,
                "{rel}: app blobs are read from a release directory or server, not from {}",
                self.describe()
            ),
            Origin::Invalid { problem, .. } => bail!(Malformed, "{problem}"),
        }
    }

    /// Open `rel` (artifact or delta) at `offset`; the reader yields exactly
    /// `total - offset` bytes or fails.
    pub fn open(&mut self, rel: &str, offset: u64, total: u64) -> Result<Box<dyn Read + Send>> {
        self.open_within(rel, offset, total, None)
    }

    /// Open `len` bytes of `rel` (of `total` bytes) at `offset`: only they
    /// are asked of a server.
    pub fn open_range(
        &mut self,
        rel: &str,
        offset: u64,
        len: u64,
        total: u64,
    ) -> Result<Box<dyn Read + Send>> {
        if offset.checked_add(len).is_none_or(|end| end > total) {
            bail!(
                Malformed,
                "{rel}: {len} bytes at {offset} lie past its {total} bytes"
            );
        }
        self.open_within(rel, offset, total, Some(len))
    }

    fn open_within(
        &mut self,
        rel: &str,
        offset: u64,
        total: u64,
        len: Option<u64>,
    ) -> Result<Box<dyn Read + Send>> {
        let bounded = |r: Vec<(u64, u64)>| match len {
            Some(len) => within(r, len),
            None => r,
        };
        let reader: Box<dyn Read + Send> = match &self.origin {
            Origin::Local { dir, .. } => {
                let path = if rel.contains("://") {
                    bail!(
                        Config,
                        "{rel} is a URL, but the release was given as a local directory"
                    )
                } else {
                    dir.join(rel)
                };
                let (f, len) = open_with_len(&path)?;
                if len != total {
                    return Err(unsigned_size(&path.display().to_string(), len, total));
                }
                past_the_end(offset, total)?;
                Box::new(FileRange::new(Arc::new(f), offset, total - offset))
            }
            Origin::Bundle { path } => {
                let what = format!("bundle {}", path.display());
                let (file, index) = match self.bundle.take() {
                    Some(Walked::Local(file, index)) => (file, index),
                    _ => {
                        let (f, index) = open_bundle(path)?;
                        (Arc::new(f), index)
                    }
                };
                let artifact = bundle_artifact(&index, rel, total, &what);
                let ranges = artifact.map(|a| bounded(a.ranges(offset)));
                self.bundle = Some(Walked::Local(file.clone(), index));
                past_the_end(offset, total)?;
                return chain(ranges?, what, move |start, len| {
                    Ok(Box::new(FileRange::new(file.clone(), start, len)))
                });
            }
            Origin::Remote { .. } => {
                let fetcher = self.fetcher()?;
                let rel = rel.to_string();
                Box::new(self.each_base(|base| fetcher.open(&join(base, &rel), offset, total))?)
            }
            Origin::RemoteBundle { url } => {
                let url = url.clone();
                let fetcher = self.fetcher()?;
                let (index, first) = match self.bundle.take() {
                    Some(Walked::Remote(index, first)) => (index, first),
                    _ => {
                        let Some(mut b) = HttpBundle::open(fetcher.clone(), &url, None)? else {
                            bail!(Network, "{}: unexpected 304", url_name(&url));
                        };
                        (b.index()?, b.info)
                    }
                };
                let what = url_name(&url);
                let artifact = bundle_artifact(&index, rel, total, &what);
                let ranges = artifact.map(|a| bounded(a.ranges(offset)));
                self.bundle = Some(Walked::Remote(index, first.clone()));
                past_the_end(offset, total)?;
                return chain(ranges?, what, move |start, len| {
                    let (dl, info) = fetcher.open_range(&url, start, len)?;
                    same_bundle(&url, &first, &info)?;
                    Ok(Box::new(dl))
                });
            }
            Origin::Links { files, .. } => {
                let url = if !files.contains_key(rel) && rel.contains("://") {
                    rel.to_string()
                } else {
                    link(files, rel)?
                };
                Box::new(self.fetcher()?.open(&url, offset, total)?)
            }
            Origin::Invalid { problem, .. } => bail!(Malformed, "{problem}"),
        };
        Ok(match len {
            Some(len) => Box::new(reader.take(len)),
            None => reader,
        })
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

/// A resume offset must lie within the signed size.
fn past_the_end(offset: u64, total: u64) -> Result<()> {
    if offset > total {
        bail!(
            Integrity,
            "resume offset {offset} is past the signed size {total}"
        );
    }
    Ok(())
}

/// The artifact `rel` of a bundle's `index`, whose parts must add up to
/// the signed size `total`.
fn bundle_artifact(index: &Index, rel: &str, total: u64, what: &str) -> Result<Artifact> {
    let artifact = index.artifact(rel).with_context(|| what.to_string())?;
    if artifact.size != total {
        let parts = artifact.segments.len();
        let name = if parts > 1 {
            format!("{rel} in {what} ({parts} parts)")
        } else {
            format!("{rel} in {what}")
        };
        return Err(unsigned_size(&name, artifact.size, total));
    }
    Ok(artifact)
}

/// The key document entry `rel` of a bundle.
fn key_entry<'a>(index: &'a Index, rel: &str, what: &str) -> Result<&'a Entry> {
    index.get(rel).ok_or_else(|| {
        err!(
            Malformed,
            "bundle {what} holds no {rel} that the manifest needs"
        )
    })
}

/// The URL a list of links gives for `name`.
/// The URL of `name` in a `links:` origin: its own entry, or for a path
/// below `artifacts/` the entry of `artifacts/<its last segment>` (files
/// uploaded to a fleet server keep only their last path segment, and an
/// app's `artifacts/blobs/<sha256>.zst` is uploaded as `<sha256>.zst`;
/// what is read is checked against the signed hash either way).
fn link(files: &BTreeMap<String, String>, name: &str) -> Result<String> {
    let by_last_segment = || {
        let rest = name.strip_prefix("artifacts/")?;
        let last = rest.rsplit('/').next()?;
        files.get(&format!("artifacts/{last}"))
    };
    files
        .get(name)
        .or_else(by_last_segment)
        .cloned()
        .ok_or_else(|| {
            let known: Vec<&str> = files.keys().map(String::as_str).take(20).collect();
            err!(
                Malformed,
                "the release's links name no URL for {name:?}, which the manifest needs (links \
             given: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )
        })
}

/// A remote bundle as error messages name it.
fn url_name(url: &str) -> String {
    truncate(url, 200).to_string()
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

/// The data of a small entry (the index has checked it against its cap)
/// of the bundle `what`.
fn read_entry(r: &mut dyn ReadAt, what: &str, entry: &Entry) -> Result<Vec<u8>> {
    let len = usize::try_from(entry.size)
        .map_err(|_| err!(Malformed, "{} in bundle {what} is too large", entry.name))?;
    let mut bytes = vec![0u8; len];
    r.read_exact_at(entry.offset, &mut bytes)
        .with_context(|| format!("{} in bundle {what}", entry.name))?;
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

/// `len` bytes of a local file from `offset`, read with `pread` (the file
/// may be shared by the readers of several parts).
struct FileRange {
    file: Arc<File>,
    pos: u64,
    end: u64,
}

impl FileRange {
    fn new(file: Arc<File>, offset: u64, len: u64) -> FileRange {
        FileRange {
            file,
            pos: offset,
            end: offset.saturating_add(len),
        }
    }
}

impl Read for FileRange {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.end - self.pos).min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Opens `len` bytes of a bundle at an absolute offset.
type Opener = Box<dyn FnMut(u64, u64) -> Result<Box<dyn Read + Send>> + Send>;

/// The byte ranges of an artifact (its parts, from the resume offset) as
/// one stream: the first range is opened now, so that a refusal keeps its
/// kind, and each next one when the one before is used up. Each range
/// yields exactly its length or the stream fails.
struct Chain {
    ranges: VecDeque<(u64, u64)>,
    current: Option<(Box<dyn Read + Send>, u64)>,
    open: Opener,
    what: String,
}

/// The first `len` bytes of `ranges`.
fn within(ranges: Vec<(u64, u64)>, mut len: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (start, n) in ranges {
        if len == 0 {
            break;
        }
        let take = n.min(len);
        out.push((start, take));
        len -= take;
    }
    out
}

fn chain(
    ranges: Vec<(u64, u64)>,
    what: String,
    open: impl FnMut(u64, u64) -> Result<Box<dyn Read + Send>> + Send + 'static,
) -> Result<Box<dyn Read + Send>> {
    let mut c = Chain {
        ranges: ranges.into(),
        current: None,
        open: Box::new(open),
        what,
    };
    if let Some((start, len)) = c.ranges.pop_front() {
        c.current = Some(((c.open)(start, len)?, len));
    }
    Ok(Box::new(c))
}

impl Read for Chain {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some((reader, left)) = &mut self.current {
                if *left > 0 {
                    let want = (buf.len() as u64).min(*left) as usize;
                    let n = reader.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("{}: an artifact part ended {left} bytes early", self.what),
                        ));
                    }
                    *left -= n as u64;
                    return Ok(n);
                }
                self.current = None;
            }
            let Some((start, len)) = self.ranges.pop_front() else {
                return Ok(0);
            };
            let reader = (self.open)(start, len).map_err(|e| io::Error::other(e.to_string()))?;
            self.current = Some((reader, len));
        }
    }
}

/// Bytes of a bundle kept from one Range answer.
struct Window {
    start: u64,
    bytes: Vec<u8>,
}

impl Window {
    /// `len` bytes at `offset`, when all of them are here.
    fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let from = usize::try_from(offset.checked_sub(self.start)?).ok()?;
        self.bytes.get(from..from.checked_add(len)?)
    }
}

/// A bundle on a web server, read at offsets by bounded Range requests
/// through the [`Fetcher`]. The first answer covers [`HEAD_WINDOW`] bytes
/// (headers, manifest, key documents) and is kept; a read outside it asks
/// for at least [`HOP_WINDOW`] bytes, kept until the next such read. Every
/// answer must describe the same file (size, and ETag when given) as the
/// first: a bundle replaced on the server while it is read is an error.
struct HttpBundle {
    fetcher: Fetcher,
    url: String,
    info: RangeInfo,
    head: Window,
    last: Option<Window>,
}

impl HttpBundle {
    /// The first request; `None` when `etag` is given and still current.
    fn open(fetcher: Fetcher, url: &str, etag: Option<&str>) -> Result<Option<HttpBundle>> {
        let what = || format!("bundle {}", url_name(url));
        match fetcher
            .get_range(url, 0, HEAD_WINDOW, etag)
            .with_context(what)?
        {
            Ranged::NotModified => Ok(None),
            Ranged::Part { bytes, info } => Ok(Some(HttpBundle {
                fetcher,
                url: url.to_string(),
                info,
                head: Window { start: 0, bytes },
                last: None,
            })),
        }
    }

    /// Walk the headers.
    fn index(&mut self) -> Result<Index> {
        let len = self.info.total;
        let url = url_name(&self.url);
        bundle::index(self, len).with_context(|| format!("bundle {url}"))
    }
}

/// An answer for `url` must describe the file the first one did.
fn same_bundle(url: &str, first: &RangeInfo, now: &RangeInfo) -> Result<()> {
    let etags_differ = matches!((&first.etag, &now.etag), (Some(a), Some(b)) if a != b);
    if first.total != now.total || etags_differ {
        bail!(
            Network,
            "bundle {} changed on the server while it was being read ({} bytes, ETag {}; now \
             {} bytes, ETag {})",
            url_name(url),
            first.total,
            first.etag.as_deref().unwrap_or("none"),
            now.total,
            now.etag.as_deref().unwrap_or("none")
        );
    }
    Ok(())
}

impl ReadAt for HttpBundle {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        let total = self.info.total;
        if offset.checked_add(len).is_none_or(|end| end > total) {
            bail!(
                Malformed,
                "reading {len} bytes at offset {offset}: past the bundle's end at byte {total}"
            );
        }
        if buf.is_empty() {
            return Ok(());
        }
        for w in std::iter::once(&self.head).chain(self.last.as_ref()) {
            if let Some(b) = w.get(offset, buf.len()) {
                buf.copy_from_slice(b);
                return Ok(());
            }
        }
        let want = len.max(HOP_WINDOW).min(total - offset);
        let (bytes, info) = match self.fetcher.get_range(&self.url, offset, want, None)? {
            Ranged::Part { bytes, info } => (bytes, info),
            Ranged::NotModified => bail!(Network, "{}: unexpected 304", url_name(&self.url)),
        };
        same_bundle(&self.url, &self.info, &info)?;
        let w = Window {
            start: offset,
            bytes,
        };
        let got = w.get(offset, buf.len()).ok_or_else(|| {
            err!(
                Network,
                "{}: the answer for bytes from {offset} holds fewer than {len}",
                url_name(&self.url)
            )
        })?;
        buf.copy_from_slice(got);
        self.last = Some(w);
        Ok(())
    }
}

/// A local file of a release, opened, and its length.
fn open_with_len(path: &std::path::Path) -> Result<(File, u64)> {
    let f = File::open(path).map_err(|e| err!(Io, "opening {}: {e}", path.display()))?;
    let len = f
        .metadata()
        .map_err(|e| err!(Io, "{}: {e}", path.display()))?
        .len();
    Ok((f, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::{MAX_ENTRY_SIZE, TRAILER, data_padding, header};
    use crate::test_support::scratch_dir;

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

    #[test]
    fn every_origin_reads_back_from_its_argument() {
        let mirrors = vec!["https://m/stable/".to_string()];
        let files: BTreeMap<String, String> = [
            ("keys/1.json", "https://fleet/dl/7?name=keys%2F1.json"),
            ("artifacts/ab.zst", "https://cdn.example/x/\"q\",y z"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        let origins = [
            Origin::parse("/media/usb/release/manifest.json", &[]),
            Origin::parse("/media/usb/release-1.1.updraft", &[]),
            Origin::parse("https://h/stable/manifest.json", &mirrors),
            Origin::RemoteBundle {
                url: "https://h/r/release-1.1.updraft".into(),
            },
            Origin::RemoteBundle {
                url: "https://h/r/release-1.1.updraft?token=a&b=c".into(),
            },
            Origin::RemoteBundle {
                url: "https://fleet/download/1234".into(),
            },
            Origin::RemoteBundle {
                url: "https://fleet/download/x.updraft/more".into(),
            },
            Origin::Links {
                manifest: "https://fleet/dl/1?name=manifest.json".into(),
                files,
            },
            Origin::Links {
                manifest: "https://fleet/m".into(),
                files: BTreeMap::new(),
            },
            Origin::parse("links:{not json", &[]),
        ];
        for o in origins {
            let arg = o.to_arg();
            assert_eq!(Origin::parse(&arg, &mirrors), o, "{arg}");
        }
    }

    #[test]
    fn bundle_urls_are_told_apart_by_their_path() {
        let remote = |arg: &str| match Origin::parse(arg, &[]) {
            Origin::RemoteBundle { url } => Some(url),
            _ => None,
        };
        assert_eq!(
            remote("https://h/a/release.updraft").as_deref(),
            Some("https://h/a/release.updraft")
        );
        assert!(remote("https://h/a/release.updraft?sig=1#f").is_some());
        assert!(remote("http://h/a/release.updraft").is_some());
        assert_eq!(
            remote("bundle+https://fleet/dl/9").as_deref(),
            Some("https://fleet/dl/9")
        );
        assert_eq!(
            Origin::parse("bundle+https://fleet/dl/9", &[]).to_arg(),
            "bundle+https://fleet/dl/9"
        );
        assert!(remote("https://h/a/manifest.json").is_none());
        assert!(remote("https://h/a/manifest.json?x=.updraft").is_none());
        assert!(remote("https://h.updraft").is_none());
        assert!(Origin::parse("https://h/r.updraft", &[]).is_remote());
        assert!(!Origin::parse("/media/usb/r.updraft", &[]).is_remote());
    }

    #[test]
    fn a_broken_list_of_links_fails_every_request_with_its_problem() {
        let o = Origin::parse("links:{\"manifest\":\"https://x\"}", &[]);
        let problem = o.problem().expect("refused").to_string();
        assert!(problem.contains("files"), "{problem}");
        assert!(!o.is_remote());
        let mut s = Source::new(o, None, 0);
        let e = s.manifest(None).unwrap_err();
        assert_eq!(e.kind(), Kind::Malformed);
        assert!(s.open("artifacts/x", 0, 1).is_err());
        assert!(s.key_document(1).is_err());
    }

    #[test]
    fn a_missing_link_is_named() {
        let mut s = Source::new(
            Origin::Links {
                manifest: "https://fleet/m".into(),
                files: BTreeMap::new(),
            },
            None,
            0,
        );
        let e = s.open("artifacts/ab.zst", 0, 10).err().unwrap();
        assert!(e.to_string().contains("\"artifacts/ab.zst\""), "{e}");
        let e = s.key_document(3).unwrap_err();
        assert!(e.to_string().contains("keys/3.json"), "{e}");
    }

    #[test]
    fn a_link_below_artifacts_is_found_by_its_last_segment() {
        let files: BTreeMap<String, String> = [
            ("artifacts/ab.zst", "https://cdn/ab.zst"),
            ("keys/3.json", "https://cdn/3.json"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            link(&files, "artifacts/blobs/ab.zst").unwrap(),
            "https://cdn/ab.zst"
        );
        assert_eq!(
            link(&files, "artifacts/ab.zst").unwrap(),
            "https://cdn/ab.zst"
        );
        // Only below artifacts/: a key document keeps its own name.
        assert!(link(&files, "keys/ab.zst").is_err());
        assert!(link(&files, "other/ab.zst").is_err());
    }

    /// Write a bundle of `entries` (name, bytes) to `path`.
    fn write_bundle(path: &Path, entries: &[(&str, &[u8])]) {
        let mut out = Vec::new();
        for (i, (name, data)) in entries.iter().enumerate() {
            out.extend(header(name, data.len() as u32, i as u32 + 1));
            out.extend_from_slice(data);
            out.extend(std::iter::repeat_n(0, data_padding(data.len() as u64)));
        }
        out.extend(header(TRAILER, 0, 0));
        std::fs::write(path, out).unwrap();
    }

    fn read_all(mut r: Box<dyn Read + Send>) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        r.read_to_end(&mut v)?;
        Ok(v)
    }

    #[test]
    fn a_split_artifact_reads_across_its_parts_from_any_offset() {
        let dir = scratch_dir("source", "split");
        let path = dir.join("r.updraft");
        write_bundle(
            &path,
            &[
                ("sw-description", b"x"),
                ("manifest.json", b"{}"),
                ("keys/1.json", b"{\"k\":1}"),
                ("artifacts/a.zst", b"01234"),
                ("artifacts/a.zst.part-2", b"567"),
                ("artifacts/a.zst.part-3", b"89"),
            ],
        );
        let mut s = Source::new(Origin::Bundle { path: path.clone() }, None, 0);
        for offset in 0..=10 {
            let got = read_all(s.open("artifacts/a.zst", offset, 10).unwrap()).unwrap();
            assert_eq!(got, &b"0123456789"[offset as usize..], "from {offset}");
        }
        assert_eq!(s.key_document(1).unwrap(), b"{\"k\":1}");
        let e = s.open("artifacts/a.zst", 11, 10).err().unwrap();
        assert_eq!(e.kind(), Kind::Integrity, "{e}");
        for signed in [9, 11] {
            let e = s.open("artifacts/a.zst", 0, signed).err().unwrap();
            assert_eq!(e.kind(), Kind::Integrity, "{e}");
            assert!(e.to_string().contains("3 parts"), "{e}");
        }
        // The file loses its tail after the walk: the stream fails, it
        // does not end short.
        let r = s.open("artifacts/a.zst", 0, 10).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len - 130).unwrap();
        let e = read_all(r).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    /// A sparse bundle file past 8 GiB, holding an artifact in three
    /// parts (two of the largest size an entry holds): what is read at
    /// any offset, near the 4 GiB lines and at the end, is what was
    /// written there. Takes a few KiB of disk.
    #[test]
    fn parts_past_4_gib_read_at_64_bit_offsets() {
        let dir = scratch_dir("source", "sparse");
        let path = dir.join("big.updraft");
        let mut f = File::create(&path).unwrap();
        let mut at = 0u64;
        let put = |f: &mut File, at: &mut u64, bytes: &[u8]| {
            f.write_all_at(bytes, *at).unwrap();
            *at += bytes.len() as u64;
        };
        put(&mut f, &mut at, &header("sw-description", 0, 1));
        put(&mut f, &mut at, &header("manifest.json", 2, 2));
        put(&mut f, &mut at, b"{}\0\0");
        let sizes = [MAX_ENTRY_SIZE, MAX_ENTRY_SIZE, 6];
        let mut starts = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            let name = bundle::part_name("artifacts/big.zst", i + 1);
            put(&mut f, &mut at, &header(&name, *size as u32, 3 + i as u32));
            starts.push(at);
            // Each part begins and ends with a mark.
            f.write_all_at(format!("<{}", i + 1).as_bytes(), at)
                .unwrap();
            f.write_all_at(format!("{}>", i + 1).as_bytes(), at + size - 2)
                .unwrap();
            at = (at + size + 3) & !3;
        }
        put(&mut f, &mut at, &header(TRAILER, 0, 0));
        f.set_len(at + 100).unwrap();
        drop(f);
        let total: u64 = sizes.iter().sum();
        let mut s = Source::new(Origin::Bundle { path }, None, 0);
        let read = |s: &mut Source, offset: u64, n: usize| {
            let mut r = s.open("artifacts/big.zst", offset, total).unwrap();
            let mut buf = vec![0u8; n];
            r.read_exact(&mut buf).unwrap();
            buf
        };
        assert_eq!(read(&mut s, 0, 2), b"<1");
        // Across the end of part 1 (past 4 GiB in the file) into part 2.
        assert_eq!(read(&mut s, MAX_ENTRY_SIZE - 2, 4), b"1><2");
        assert_eq!(read(&mut s, 2 * MAX_ENTRY_SIZE - 2, 8), b"2><3\x00\x003>");
        assert!(starts[2] > 2 * MAX_ENTRY_SIZE);
        let tail = read_all(s.open("artifacts/big.zst", total - 3, total).unwrap()).unwrap();
        assert_eq!(tail, b"\x003>");
    }
}
