//! Making a release: the framed full artifact, deltas, and the signed
//! manifest, written into a directory that can be served as it is.
//!
//! The full image is cut into frames of `frame_size` bytes (4 MiB by
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
use updraft::manifest::{
    Artifact, Delta, Frame, Image, MAX_FRAME_OUTPUT, MAX_WINDOW_LOG, Manifest, PAYLOAD_TYPE,
    Release, Rollout, SPEC_VERSION,
};
use updraft::timestamp::Timestamp;

use crate::keys::{Key, Result, latest_key_document};
use crate::sign::sign_envelope;

/// Default decoded size of one artifact frame.
pub const DEFAULT_FRAME_SIZE: usize = 4 * 1024 * 1024;

/// A delta is published only when it is at most this share of the full
/// artifact.
pub const DELTA_MAX_SHARE: f64 = 0.8;

pub struct ReleaseSpec {
    pub keys: Vec<Key>,
    pub version: String,
    pub compatible: Vec<String>,
    pub image: PathBuf,
    pub from: Vec<PathBuf>,
    pub serial: Option<u64>,
    pub expires: Duration,
    pub rollout: Option<f64>,
    pub out: PathBuf,
    pub frame_size: usize,
    pub level: i32,
    pub threads: usize,
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
fn build_artifact(spec: &ReleaseSpec, artifacts: &Path) -> Result<(Image, Artifact)> {
    if spec.frame_size == 0 || spec.frame_size as u64 > MAX_FRAME_OUTPUT {
        return Err(format!(
            "frame size must be between 1 and {MAX_FRAME_OUTPUT} bytes"
        ));
    }
    let mut input =
        File::open(&spec.image).map_err(|e| format!("opening {}: {e}", spec.image.display()))?;
    let wlog = window_log(spec.frame_size);
    let tmp = artifacts.join(format!(".artifact.tmp.{}", std::process::id()));
    let mut out = File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let mut image_hash = Hasher::new();
    let mut artifact_hash = Hasher::new();
    let mut frames = Vec::new();
    let mut offset = 0u64;
    let mut image_size = 0u64;
    let threads = spec.threads.max(1);
    loop {
        // Read up to `threads` frames, compress them in parallel, append.
        let mut batch: Vec<Vec<u8>> = Vec::new();
        for _ in 0..threads {
            let mut buf = vec![0u8; spec.frame_size];
            let n = read_full(&mut input, &mut buf)
                .map_err(|e| format!("reading {}: {e}", spec.image.display()))?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            batch.push(buf);
        }
        if batch.is_empty() {
            break;
        }
        let compressed: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|b| s.spawn(move || compress_frame(b, spec.level, wlog)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("compression thread panicked".into()))
                })
                .collect()
        });
        for (raw, c) in batch.iter().zip(compressed) {
            let c = c?;
            image_hash.update(raw);
            artifact_hash.update(&c);
            out.write_all(&c)
                .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
            frames.push(Frame {
                offset,
                size: c.len() as u64,
                out_size: raw.len() as u64,
                out_sha256: Sha256::of(raw),
            });
            offset += c.len() as u64;
            image_size += raw.len() as u64;
        }
    }
    if image_size == 0 {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("{} is empty", spec.image.display()));
    }
    out.sync_all()
        .map_err(|e| format!("fsync {}: {e}", tmp.display()))?;
    let sha = artifact_hash.finish();
    let rel = format!("artifacts/{sha}.zst");
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

/// The serial of the manifest already in `dir`, if any (not verified: the
/// publisher only uses it to count up).
fn previous_serial(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join("manifest.json")).ok()?;
    let env = updraft::envelope::Envelope::parse(&bytes, "manifest").ok()?;
    let payload = env.payload_bytes("manifest").ok()?;
    let v: serde_json::Value = serde_json::from_slice(&payload).ok()?;
    v.get("serial")?.as_u64()
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

/// Make a release.
pub fn release(spec: &ReleaseSpec) -> Result<Summary> {
    if spec.compatible.is_empty() {
        return Err("--compatible is required".into());
    }
    let artifacts = spec.out.join("artifacts");
    std::fs::create_dir_all(&artifacts)
        .map_err(|e| format!("creating {}: {e}", artifacts.display()))?;
    let (image, artifact) = build_artifact(spec, &artifacts)?;
    let mut deltas = Vec::new();
    let mut published = Vec::new();
    let mut skipped = Vec::new();
    if !spec.from.is_empty() {
        let new = std::fs::read(&spec.image)
            .map_err(|e| format!("reading {}: {e}", spec.image.display()))?;
        for old_path in &spec.from {
            let old = std::fs::read(old_path)
                .map_err(|e| format!("reading {}: {e}", old_path.display()))?;
            let mut bytes = Vec::new();
            let opts = crate::delta::DeltaOptions {
                threads: spec.threads,
                ..crate::delta::DeltaOptions::default()
            };
            crate::delta::make(&old, &new, &opts, &mut bytes)
                .map_err(|e| format!("delta from {}: {e}", old_path.display()))?;
            let limit = (artifact.size as f64 * DELTA_MAX_SHARE) as u64;
            if bytes.len() as u64 > limit {
                skipped.push((
                    old_path.clone(),
                    format!(
                        "{} bytes is not clearly smaller than the {}-byte full artifact",
                        bytes.len(),
                        artifact.size
                    ),
                ));
                continue;
            }
            let sha = Sha256::of(&bytes);
            let rel = format!("artifacts/{sha}.bsdiff.zst");
            write_atomic(&spec.out.join(&rel), &bytes)?;
            deltas.push(Delta {
                from_size: old.len() as u64,
                from_sha256: Sha256::of(&old),
                url: rel,
                size: bytes.len() as u64,
                sha256: sha,
            });
            published.push((old_path.clone(), bytes.len() as u64));
        }
    }
    let serial = match spec.serial {
        Some(s) => s,
        None => previous_serial(&spec.out).map(|s| s + 1).unwrap_or(1),
    };
    let issued = Timestamp::now();
    let m = Manifest {
        spec_version: SPEC_VERSION,
        serial,
        issued,
        expires: issued.plus(spec.expires),
        keys_version: latest_key_document(&spec.out)?,
        release: Release {
            version: spec.version.clone(),
            compatible: spec.compatible.clone(),
            rollout: spec.rollout.map(|percent| Rollout { percent }),
        },
        image,
        artifact,
        deltas,
    };
    m.validate()
        .map_err(|e| format!("the release would not validate: {e}"))?;
    let payload = serde_json::to_vec_pretty(&m).map_err(|e| e.to_string())?;
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
    })
}
