//! Making a release: the framed full artifact, deltas, and the signed
//! manifest, written into a directory that can be served as it is.
//!
//! The full image is cut into frames of `frame_size` bytes (2 MiB by
//! default), each compressed as an independent zstd frame with a window no
//! larger than the frame and its content size recorded, so the device can
//! decode any frame alone with a few MiB of memory and resume a download at
//! any frame boundary. The frame table (compressed offset and length,
//! decoded length and sha256) goes into the signed manifest. Artifacts are
//! content-addressed (`artifacts/<sha256>.zst`, `.bsdiff.zst` for deltas),
//! so publishing a new release never changes a file a device may be
//! downloading; `manifest.json` is replaced last, atomically.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use updraft::hash::{Hasher, Sha256};
use updraft::manifest::component::{CommandPart, Component, Kind, Named, Part, TreePart, TreeSize};
use updraft::manifest::{
    self, Artifact, Delta, Frame, Image, MAX_FRAME_OUTPUT, MAX_WINDOW_LOG, Manifest, PAYLOAD_TYPE,
    Release, Rollout, SPEC_VERSION,
};
use updraft::timestamp::Timestamp;
use updraft::trust::{Anchor, KeySet, PublicKey, Trust};

use crate::keys::{Key, Result, latest_key_document, peek_key_document};
use crate::sign::sign_envelope;

/// Default decoded size of one artifact frame: 2 MiB. The device decodes
/// with three frame buffers in flight (two frames decoding on two cores
/// while a third is written) within 6 MiB, and its whole install within
/// 16 MiB of resident memory; frames of 4 MiB leave it one decoder. They
/// cost 2.7 % of artifact size on the benchmark image (docs/manifest.md,
/// "Choosing the level and frame size").
pub const DEFAULT_FRAME_SIZE: usize = 2 * 1024 * 1024;

/// Default zstd level of the full artifact and app blobs: 12, the last
/// level before zstd's slow strategies. On the benchmark's 256 MiB ext4
/// image, level 16 makes the artifact 3 % smaller in five times the time,
/// level 19 9 % smaller in eleven times (docs/manifest.md).
pub const DEFAULT_LEVEL: i32 = 12;

/// A delta is published only when it is at most this share of the full
/// artifact.
pub const DELTA_MAX_SHARE: f64 = 0.8;

/// The largest serial the publisher signs: 2^53 - 1, the largest integer
/// every JSON implementation reads exactly, and far beyond any real
/// sequence. A device accepts any u64, so a serial at the very top would
/// leave no room for a next release; this keeps that from happening by
/// mistake.
pub const MAX_SERIAL: u64 = (1 << 53) - 1;

/// A serial more than this far above the previous one needs
/// `--allow-serial-jump` (2^32: room for date- or time-based serials, and
/// no typo gets near [`MAX_SERIAL`] in fewer than two million releases).
pub const MAX_SERIAL_JUMP: u64 = 1 << 32;

/// A component of a release given on the command line:
/// `--app NAME[@VERSION]=DIR`, `--command NAME[@VERSION]=FILE`.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentSpec {
    pub name: String,
    /// The release's version when not given.
    pub version: Option<String>,
    /// The app's tree, or the command's payload.
    pub dir: PathBuf,
}

impl ComponentSpec {
    /// `NAME=PATH` or `NAME@VERSION=PATH`.
    pub fn parse(arg: &str) -> Result<ComponentSpec> {
        let Some((left, dir)) = arg.split_once('=') else {
            return Err(format!("{arg}: expected NAME=PATH or NAME@VERSION=PATH"));
        };
        let (name, version) = match left.split_once('@') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (left, None),
        };
        updraft::manifest::component::check_name(name).map_err(|e| format!("{arg}: {e}"))?;
        if dir.is_empty() {
            return Err(format!("{arg}: no path"));
        }
        Ok(ComponentSpec {
            name: name.to_string(),
            version,
            dir: PathBuf::from(dir),
        })
    }
}

/// What publishing one tree (an app, the slot's boot files) wrote.
#[derive(Debug)]
pub struct AppSummary {
    /// `app` or `boot`.
    pub kind: &'static str,
    pub name: String,
    pub entries: u64,
    pub bytes: u64,
    pub index_size: u64,
    pub blobs_written: u64,
    pub blob_bytes_written: u64,
}

pub struct ReleaseSpec {
    pub keys: Vec<Key>,
    pub version: String,
    pub compatible: Vec<String>,
    /// The new slot image; `None` keeps the slot of the release in `out`
    /// (a release of apps only).
    pub image: Option<PathBuf>,
    /// The slot component's name in a release of components.
    pub slot_name: String,
    pub apps: Vec<ComponentSpec>,
    /// The slot's boot files, a directory tree (at most one).
    pub boot: Option<ComponentSpec>,
    /// Payloads for command components' handlers.
    pub commands: Vec<ComponentSpec>,
    pub from: Vec<PathBuf>,
    pub serial: Option<u64>,
    /// Allow a serial more than [`MAX_SERIAL_JUMP`] above the previous one.
    pub allow_serial_jump: bool,
    /// The channel the manifest is signed for.
    pub channel: String,
    /// `--security-version`; `None` keeps the previous release's.
    pub security_version: Option<u64>,
    pub expires: Duration,
    pub rollout: Option<f64>,
    pub out: PathBuf,
    pub frame_size: usize,
    pub level: i32,
    pub threads: usize,
    /// Memory a delta is made within ([`crate::delta::DeltaOptions::memory_budget`]).
    pub delta_memory: usize,
    /// Sign a build provenance attestation with this builder key and
    /// builder id (`--attest-with`, `--builder-id`).
    pub attest: Option<(Key, String)>,
}

/// What was written.
#[derive(Debug)]
pub struct Summary {
    pub manifest: PathBuf,
    pub serial: u64,
    pub image_size: u64,
    pub artifact_size: u64,
    pub frames: usize,
    /// (source image, delta size) of published deltas.
    pub deltas: Vec<(PathBuf, u64)>,
    /// (source image, reason) of deltas not published.
    pub skipped: Vec<(PathBuf, String)>,
    pub apps: Vec<AppSummary>,
}

fn window_log(frame_size: usize) -> u32 {
    let mut log = 10;
    while (1usize << log) < frame_size && log < MAX_WINDOW_LOG {
        log += 1;
    }
    log
}

/// Compress one frame independently.
fn compress_frame(data: &[u8], level: i32, wlog: u32) -> Result<Vec<u8>> {
    use zstd::zstd_safe::CParameter;
    let mut c = zstd::bulk::Compressor::new(level).map_err(|e| format!("zstd: {e}"))?;
    for p in [
        CParameter::WindowLog(wlog),
        CParameter::ContentSizeFlag(true),
        CParameter::ChecksumFlag(false),
    ] {
        c.set_parameter(p)
            .map_err(|e| format!("zstd parameter: {e}"))?;
    }
    c.compress(data).map_err(|e| format!("zstd: {e}"))
}

/// Write `bytes` to `path` through a temporary file and rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("renaming {}: {e}", tmp.display()))
}

/// Build the framed artifact for `image` into `artifacts/`.
fn build_artifact(spec: &ReleaseSpec, image: &Path, artifacts: &Path) -> Result<(Image, Artifact)> {
    let mut input = File::open(image).map_err(|e| format!("opening {}: {e}", image.display()))?;
    frame_stream(
        &mut input,
        &image.display().to_string(),
        spec,
        artifacts,
        "zst",
    )
}

/// Cut `input` (named `what` in errors) into frames of `spec.frame_size`,
/// compress them in parallel and write the artifact
/// `artifacts/<sha256>.<suffix>`: what it decodes to and the artifact.
fn frame_stream(
    input: &mut dyn Read,
    what: &str,
    spec: &ReleaseSpec,
    artifacts: &Path,
    suffix: &str,
) -> Result<(Image, Artifact)> {
    if spec.frame_size == 0 || spec.frame_size as u64 > MAX_FRAME_OUTPUT {
        return Err(format!(
            "frame size must be between 1 and {MAX_FRAME_OUTPUT} bytes"
        ));
    }
    let wlog = window_log(spec.frame_size);
    let tmp = artifacts.join(format!(".artifact.tmp.{}", std::process::id()));
    let mut out = File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let mut image_hash = Hasher::new();
    let mut artifact_hash = Hasher::new();
    let mut frames = Vec::new();
    let mut offset = 0u64;
    let mut image_size = 0u64;
    let threads = spec.threads.max(1);
    // Frames are compressed independently by `threads` workers, each
    // taking the next frame as soon as it is done with one (frames of
    // zeros take no time, frames of code the longest: a worker never waits
    // for another's frame). This thread reads the frames in order, and
    // hashes and appends them in order as they come back; at most two
    // frames per worker are read and not yet written.
    let in_flight_max = 2 * threads;
    std::thread::scope(|s| -> Result<()> {
        let (work_tx, work_rx) = std::sync::mpsc::sync_channel::<(usize, Vec<u8>)>(in_flight_max);
        let work_rx = std::sync::Arc::new(std::sync::Mutex::new(work_rx));
        // A worker also hashes its frame: the frame table's hash costs as
        // much as the image hash this thread keeps in order.
        type Done = (usize, Vec<u8>, Sha256, Result<Vec<u8>>);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<Done>();
        for _ in 0..threads {
            let work_rx = work_rx.clone();
            let done_tx = done_tx.clone();
            s.spawn(move || {
                loop {
                    let next = work_rx
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .recv();
                    let Ok((index, raw)) = next else { return };
                    let c = compress_frame(&raw, spec.level, wlog);
                    let sha = Sha256::of(&raw);
                    if done_tx.send((index, raw, sha, c)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let mut read = 0usize;
        let mut written = 0usize;
        let mut eof = false;
        let mut early: std::collections::BTreeMap<usize, (Vec<u8>, Sha256, Vec<u8>)> =
            Default::default();
        loop {
            while !eof && read - written < in_flight_max {
                let mut buf = vec![0u8; spec.frame_size];
                let n = read_full(input, &mut buf).map_err(|e| format!("reading {what}: {e}"))?;
                if n == 0 {
                    eof = true;
                    break;
                }
                buf.truncate(n);
                work_tx
                    .send((read, buf))
                    .map_err(|_| "the compression threads stopped".to_string())?;
                read += 1;
            }
            if written == read {
                break;
            }
            let (index, raw, sha, c) = done_rx
                .recv()
                .map_err(|_| "a compression thread stopped".to_string())?;
            early.insert(index, (raw, sha, c?));
            while let Some((raw, out_sha256, c)) = early.remove(&written) {
                image_hash.update(&raw);
                artifact_hash.update(&c);
                out.write_all(&c)
                    .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
                frames.push(Frame {
                    offset,
                    size: c.len() as u64,
                    out_size: raw.len() as u64,
                    out_sha256,
                });
                offset += c.len() as u64;
                image_size += raw.len() as u64;
                written += 1;
            }
        }
        // The workers end when the work channel closes.
        drop(work_tx);
        Ok(())
    })?;
    if image_size == 0 {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("{what} is empty"));
    }
    out.sync_all()
        .map_err(|e| format!("fsync {}: {e}", tmp.display()))?;
    let sha = artifact_hash.finish();
    let rel = format!("artifacts/{sha}.{suffix}");
    std::fs::rename(&tmp, spec.out.join(&rel)).map_err(|e| format!("renaming artifact: {e}"))?;
    Ok((
        Image {
            size: image_size,
            sha256: image_hash.finish(),
        },
        Artifact {
            url: rel,
            size: offset,
            sha256: sha,
            frames,
        },
    ))
}

/// Passes writes through, hashing them.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Hasher,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Size and sha256 of a file, read in pieces of at most 1 MiB (no larger
/// than the file: an app tree hashes thousands of small ones).
pub(crate) fn hash_file(path: &Path) -> Result<(u64, Sha256)> {
    let mut f = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut hasher = Hasher::new();
    let piece = f
        .metadata()
        .map_or(1 << 20, |m| m.len().saturating_add(1).clamp(4096, 1 << 20));
    let mut buf = vec![0u8; piece as usize];
    let mut size = 0u64;
    loop {
        let n =
            read_full(&mut f, &mut buf).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hasher.finish()))
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The serial of the manifest already in `dir`, verified before it is
/// counted on: a manifest that no key of this release line signed (planted,
/// corrupted, copied from elsewhere) must not become the base of the next
/// release's serial. It must carry a valid signature of a release key named
/// by a key document in `dir/keys/` (retired keys included: the previous
/// release may predate a rotation) or of a key signing now, and belong to
/// `channel` (one directory, one channel). `None` when there is no manifest
/// yet.
fn previous_serial(dir: &Path, keys: &[Key], channel: &str) -> Result<Option<u64>> {
    Ok(previous_manifest(dir, keys, channel)?.map(|m| m.serial))
}

/// The manifest already in `dir`, verified as [`previous_serial`] says.
fn previous_manifest(dir: &Path, keys: &[Key], channel: &str) -> Result<Option<Manifest>> {
    let path = dir.join("manifest.json");
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut pubs: Vec<PublicKey> = keys.iter().map(|k| k.public.clone()).collect();
    let newest = latest_key_document(dir)?.unwrap_or(0);
    for v in 1..=newest {
        let doc_path = dir.join("keys").join(format!("{v}.json"));
        let Ok(bytes) = std::fs::read(&doc_path) else {
            continue;
        };
        let body = peek_key_document(&bytes).map_err(|e| format!("{}: {e}", doc_path.display()))?;
        let set = body
            .release
            .to_keyset("release")
            .map_err(|e| format!("{}: {e}", doc_path.display()))?;
        pubs.extend(set.keys().iter().cloned());
    }
    let mut distinct: Vec<PublicKey> = Vec::new();
    for k in pubs {
        if !distinct.contains(&k) {
            distinct.push(k);
        }
    }
    distinct.truncate(updraft::trust::MAX_KEYS);
    let whose = "the keys given with --key and the release keys of keys/*.json";
    let set = KeySet::new(distinct, 1).map_err(|e| e.to_string())?;
    let trust = Trust::new(Anchor::Release(set));
    let m = manifest::verify(&raw, &trust)
        .map_err(|e| {
            format!(
                "{} does not verify against {whose} ({e}): refusing to count on from its serial; \
                 pass --serial N to set the serial",
                path.display()
            )
        })?
        .manifest;
    if let Some(c) = m.channel.as_deref().filter(|c| *c != channel) {
        return Err(format!(
            "{} is for channel {c}, not {channel}: one directory serves one channel",
            path.display()
        ));
    }
    Ok(Some(m))
}

/// The serial of the new manifest: `--serial` or the previous plus one,
/// checked against [`MAX_SERIAL`] and [`MAX_SERIAL_JUMP`].
fn choose_serial(spec: &ReleaseSpec) -> Result<u64> {
    let previous = match (
        previous_serial(&spec.out, &spec.keys, &spec.channel),
        spec.serial,
    ) {
        (Ok(p), _) => p,
        // An explicit serial does not need the previous one; say why its
        // checks against the previous are skipped.
        (Err(e), Some(_)) => {
            eprintln!("warning: {e}");
            None
        }
        (Err(e), None) => return Err(e),
    };
    let serial = match (spec.serial, previous) {
        (Some(s), _) => s,
        (None, Some(p)) => p
            .checked_add(1)
            .filter(|s| *s <= MAX_SERIAL)
            .ok_or_else(|| {
                format!(
                    "the previous serial {p} leaves no next serial (the largest is {MAX_SERIAL})"
                )
            })?,
        (None, None) => 1,
    };
    if serial == 0 || serial > MAX_SERIAL {
        return Err(format!(
            "serial {serial} is out of range: serials run from 1 to {MAX_SERIAL}"
        ));
    }
    if let Some(p) = previous {
        if serial > p && serial - p > MAX_SERIAL_JUMP && !spec.allow_serial_jump {
            return Err(format!(
                "serial {serial} jumps {} past the previous serial {p} (more than {MAX_SERIAL_JUMP}); \
                 devices can never go back below it: pass --allow-serial-jump if this is meant",
                serial - p
            ));
        }
    }
    Ok(serial)
}

/// The security version of the new manifest: `--security-version`, or
/// else that of the release already in `spec.out` (0 without one), so a
/// release that does not mean to change it never lowers it by omission.
fn choose_security_version(spec: &ReleaseSpec) -> Result<u64> {
    // A previous manifest that does not verify was reported by
    // `choose_serial` already; it sets nothing here either.
    let previous = previous_manifest(&spec.out, &spec.keys, &spec.channel)
        .ok()
        .flatten()
        .map(|m| m.security_version);
    security_version_for(spec.security_version, previous)
}

/// [`choose_security_version`]'s rule, given the value asked for and the
/// previous release's. Devices that committed a release refuse anything
/// below its security version, and advance their counter by at most
/// [`updraft::rollback_counter::MAX_STEP`] at once.
pub fn security_version_for(asked: Option<u64>, previous: Option<u64>) -> Result<u64> {
    const STEP: u64 = updraft::rollback_counter::MAX_STEP;
    match (asked, previous) {
        (Some(s), _) if s > MAX_SERIAL => Err(format!(
            "--security-version {s} is out of range: security versions run from 0 to {MAX_SERIAL}"
        )),
        (Some(s), Some(p)) if s < p => Err(format!(
            "--security-version {s} is below the security version {p} of the release in --out: \
             devices that committed it refuse anything lower"
        )),
        (Some(s), Some(p)) if s - p > STEP => Err(format!(
            "--security-version {s} is more than {STEP} above the previous {p}: \
             devices refuse a release their counter cannot be advanced to in one step"
        )),
        (Some(s), None) if s > STEP => Err(format!(
            "--security-version {s} is more than {STEP} above 0, where the counters of devices start: \
             they would refuse it"
        )),
        (Some(s), _) => Ok(s),
        (None, p) => Ok(p.unwrap_or(0)),
    }
}

/// nginx and Apache derive a file's ETag from its modification time in
/// whole seconds and its size. A manifest replaced within the same second by
/// one of the same size would keep its ETag, and devices polling with
/// `If-None-Match` would be told "not modified" until the next change. So a
/// new manifest always gets a later modification second than the one it
/// replaces.
fn keep_etag_fresh(path: &Path, previous: Option<std::time::SystemTime>) -> Result<()> {
    use std::time::{Duration, UNIX_EPOCH};
    let Some(prev) = previous else {
        return Ok(());
    };
    let secs = |t: std::time::SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let now = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if secs(now) <= secs(prev) {
        let later = UNIX_EPOCH + Duration::from_secs(secs(prev) + 1);
        std::fs::File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(later))
            .map_err(|e| format!("setting the modification time of {}: {e}", path.display()))?;
    }
    Ok(())
}

/// A serial is published once: two manifests of one serial naming different
/// images let whoever serves them switch devices between the two, which
/// the serial floor cannot refuse (devices warn of it). `--serial N` equal to the serial
/// of the manifest already in `DIR` is signed again only for the same
/// slot image (a renewed expiry, another rollout percentage).
fn check_serial_reuse(spec: &ReleaseSpec, serial: u64) -> Result<()> {
    let (Some(path), Some(_)) = (&spec.image, spec.serial) else {
        return Ok(());
    };
    let Ok(Some(previous)) = previous_manifest(&spec.out, &spec.keys, &spec.channel) else {
        return Ok(());
    };
    if previous.serial != serial {
        return Ok(());
    }
    let mut file = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hasher.finish() != previous.image.sha256 {
        return Err(format!(
            "serial {serial} is already published in {} for another image (release {}): \
             devices that accepted it could be switched between the two images; pass a higher --serial",
            spec.out.join("manifest.json").display(),
            previous.release.version
        ));
    }
    Ok(())
}

/// Make a release.
pub fn release(spec: &ReleaseSpec) -> Result<Summary> {
    if spec.compatible.is_empty() {
        return Err("--compatible is required".into());
    }
    manifest::check_channel_name(&spec.channel).map_err(|e| format!("--channel: {e}"))?;
    // Before the expensive part: a serial that cannot be used stops here.
    let serial = choose_serial(spec)?;
    check_serial_reuse(spec, serial)?;
    let security_version = choose_security_version(spec)?;
    let artifacts = spec.out.join("artifacts");
    std::fs::create_dir_all(&artifacts)
        .map_err(|e| format!("creating {}: {e}", artifacts.display()))?;
    let mut deltas = Vec::new();
    let mut published = Vec::new();
    let mut skipped = Vec::new();
    let (image, artifact, slot) = match &spec.image {
        Some(path) => {
            let (image, artifact) = build_artifact(spec, path, &artifacts)?;
            let slot = Named {
                name: spec.slot_name.clone(),
                version: spec.version.clone(),
            };
            (image, artifact, slot)
        }
        None => {
            let (image, artifact, slot, kept) = previous_slot(spec)?;
            deltas = kept;
            (image, artifact, slot)
        }
    };
    if let (Some(image_path), false) = (&spec.image, spec.from.is_empty()) {
        // Both images are read by offset as the delta plan needs, and the
        // delta goes to a file: memory stays within --delta-memory
        // whatever the image sizes.
        let new =
            File::open(image_path).map_err(|e| format!("opening {}: {e}", image_path.display()))?;
        for old_path in &spec.from {
            let old =
                File::open(old_path).map_err(|e| format!("opening {}: {e}", old_path.display()))?;
            let opts = crate::delta::DeltaOptions {
                threads: spec.threads,
                memory_budget: spec.delta_memory,
                ..crate::delta::DeltaOptions::default()
            };
            let tmp = artifacts.join(format!(".delta.tmp.{}", std::process::id()));
            let made = (|| -> Result<(u64, Sha256)> {
                let file =
                    File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
                let mut hashing = HashingWriter {
                    inner: std::io::BufWriter::new(file),
                    hasher: Hasher::new(),
                };
                let size = crate::delta::make_from(&old, &new, &opts, &mut hashing)
                    .map_err(|e| format!("delta from {}: {e}", old_path.display()))?;
                hashing
                    .inner
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .and_then(|f| f.sync_all())
                    .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
                Ok((size, hashing.hasher.finish()))
            })();
            let (size, sha) = match made {
                Ok(m) => m,
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            };
            let limit = (artifact.size as f64 * DELTA_MAX_SHARE) as u64;
            if size > limit {
                let _ = std::fs::remove_file(&tmp);
                skipped.push((
                    old_path.clone(),
                    format!(
                        "{size} bytes is not clearly smaller than the {}-byte full artifact",
                        artifact.size
                    ),
                ));
                continue;
            }
            let rel = format!("artifacts/{sha}.bsdiff.zst");
            std::fs::rename(&tmp, spec.out.join(&rel))
                .map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
            let (from_size, from_sha256) = hash_file(old_path)?;
            deltas.push(Delta {
                from_size,
                from_sha256,
                url: rel,
                size,
                sha256: sha,
            });
            published.push((old_path.clone(), size));
        }
    }
    let mut components = Vec::with_capacity(spec.apps.len() + 1);
    let mut apps = Vec::with_capacity(spec.apps.len() + 1);
    let trees = spec
        .boot
        .iter()
        .map(|b| (b, Kind::Boot))
        .chain(spec.apps.iter().map(|a| (a, Kind::App)));
    for (a, kind) in trees {
        let (component, summary) = publish_tree(spec, a, kind, &artifacts)?;
        components.push(component);
        apps.push(summary);
    }
    for c in &spec.commands {
        updraft::manifest::component::check_name(&c.name).map_err(|e| format!("--command: {e}"))?;
        let mut input =
            File::open(&c.dir).map_err(|e| format!("opening {}: {e}", c.dir.display()))?;
        let what = c.dir.display().to_string();
        let (_, artifact) = frame_stream(&mut input, &what, spec, &artifacts, "zst")?;
        components.push(Component {
            name: c.name.clone(),
            version: c.version.clone().unwrap_or_else(|| spec.version.clone()),
            part: Part::Command(CommandPart { artifact }),
        });
    }
    let issued = Timestamp::now();
    let of_components = !components.is_empty();
    let mut m = Manifest {
        spec_version: if of_components {
            updraft::manifest::component::SPEC_VERSION
        } else {
            SPEC_VERSION
        },
        serial,
        issued,
        expires: issued.plus(spec.expires),
        keys_version: latest_key_document(&spec.out)?,
        channel: Some(spec.channel.clone()),
        security_version,
        release: Release {
            version: spec.version.clone(),
            compatible: spec.compatible.clone(),
            rollout: spec.rollout.map(|percent| Rollout { percent }),
        },
        image,
        artifact,
        deltas,
        attestation: None,
        slot: of_components.then_some(slot),
        components,
    };
    if let Some((key, builder_id)) = &spec.attest {
        let inputs: Vec<(String, Sha256)> = m
            .deltas
            .iter()
            .map(|d| (format!("delta base of {}", d.url), d.from_sha256))
            .collect();
        crate::attest::attach(&mut m, &spec.out, key, builder_id, &inputs)?;
    }
    m.validate()
        .map_err(|e| format!("the release would not validate: {e}"))?;
    let payload = updraft::manifest::component::to_payload(&m).map_err(|e| e.to_string())?;
    let envelope = sign_envelope(PAYLOAD_TYPE, &payload, &spec.keys)?;
    let path = spec.out.join("manifest.json");
    let previous_mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    write_atomic(&path, &envelope)?;
    keep_etag_fresh(&path, previous_mtime)?;
    Ok(Summary {
        manifest: path,
        serial,
        image_size: m.image.size,
        artifact_size: m.artifact.size,
        frames: m.artifact.frames.len(),
        deltas: published,
        skipped,
        apps,
    })
}

/// The slot component of the release already in `spec.out`, for a release
/// that changes only its apps: a release describes everything a device
/// runs, and a device that runs this slot neither downloads nor reboots
/// for it. Its artifact must still be in `artifacts/`.
fn previous_slot(spec: &ReleaseSpec) -> Result<(Image, Artifact, Named, Vec<Delta>)> {
    if spec.apps.is_empty() && spec.commands.is_empty() && spec.boot.is_none() {
        return Err("--image is required (or --app, --boot or --command, to publish components beside the slot of the release in --out)".into());
    }
    if !spec.from.is_empty() {
        return Err("--from needs --image: a delta is made to a new image".into());
    }
    let path = spec.out.join("manifest.json");
    let Some(prev) = previous_manifest(&spec.out, &spec.keys, &spec.channel)? else {
        return Err(format!(
            "no --image, and no {} to take the slot component from: publish the slot with --image",
            path.display()
        ));
    };
    let artifact = spec.out.join(&prev.artifact.url);
    if !artifact.is_file() {
        return Err(format!(
            "{} names the slot artifact {}, which is not in {}: publish the slot with --image",
            path.display(),
            prev.artifact.url,
            spec.out.display()
        ));
    }
    let slot = prev.slot.clone().unwrap_or(Named {
        name: spec.slot_name.clone(),
        version: prev.release.version.clone(),
    });
    Ok((prev.image, prev.artifact, slot, prev.deltas))
}

/// Publish one tree, an app or the slot's boot files: its blobs into
/// `artifacts/blobs/`, its index framed like any artifact
/// (`artifacts/<sha256>.index.zst`).
fn publish_tree(
    spec: &ReleaseSpec,
    a: &ComponentSpec,
    kind: Kind,
    artifacts: &Path,
) -> Result<(Component, AppSummary)> {
    let label = kind.as_str();
    updraft::manifest::component::check_name(&a.name).map_err(|e| format!("--{label}: {e}"))?;
    let tree = crate::app::publish_tree(&a.dir, &artifacts.join("blobs"), spec.level)
        .map_err(|e| format!("{label} {}: {e}", a.name))?;
    if kind == Kind::Boot {
        updraft::app::boot::check(&tree.index)
            .map_err(|e| format!("boot {} ({}): {e}", a.name, a.dir.display()))?;
    }
    let what = format!("the index of {label} {}", a.name);
    let (_, index) = frame_stream(&mut &tree.lines[..], &what, spec, artifacts, "index.zst")?;
    let summary = AppSummary {
        kind: label,
        name: a.name.clone(),
        entries: tree.index.entries.len() as u64,
        bytes: tree.index.bytes,
        index_size: index.size,
        blobs_written: tree.blobs_written,
        blob_bytes_written: tree.blob_bytes_written,
    };
    let component = Component {
        name: a.name.clone(),
        version: a.version.clone().unwrap_or_else(|| spec.version.clone()),
        part: {
            let tree = TreePart {
                tree: TreeSize {
                    entries: summary.entries,
                    bytes: summary.bytes,
                },
                index,
                blobs: "artifacts/blobs/".into(),
            };
            if kind == Kind::Boot {
                Part::Boot(tree)
            } else {
                Part::App(tree)
            }
        },
    };
    Ok((component, summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_security_version_is_kept_from_the_previous_release_and_never_lowered() {
        // (asked, previous, Ok(value) or Err(part of the message))
        type Row = (
            Option<u64>,
            Option<u64>,
            std::result::Result<u64, &'static str>,
        );
        let rows: [Row; 10] = [
            (None, None, Ok(0)),
            (None, Some(4), Ok(4)),
            (Some(4), Some(4), Ok(4)),
            (Some(5), Some(4), Ok(5)),
            (Some(3), None, Ok(3)),
            (Some(3), Some(4), Err("is below the security version 4")),
            (Some(4 + 256), Some(4), Ok(260)),
            (
                Some(4 + 257),
                Some(4),
                Err("more than 256 above the previous 4"),
            ),
            (Some(257), None, Err("more than 256 above 0")),
            (Some(MAX_SERIAL + 1), None, Err("out of range")),
        ];
        for (asked, previous, want) in rows {
            let got = security_version_for(asked, previous);
            match (want, got) {
                (Ok(w), Ok(g)) => assert_eq!(g, w, "{asked:?} after {previous:?}"),
                (Err(part), Err(e)) => {
                    assert!(e.contains(part), "{asked:?} after {previous:?}: {e}")
                }
                (want, got) => panic!("{asked:?} after {previous:?}: want {want:?}, got {got:?}"),
            }
        }
    }
}
