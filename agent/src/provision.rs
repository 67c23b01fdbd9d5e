//! What a freshly provisioned device already runs.
//!
//! A device leaves the factory flashed with a release, but its store
//! records no install: without more, its first poll would download the
//! very image it booted into the other slot and reboot into it, and a whole
//! fleet's first contact would be a needless full download and reboot.
//! So when no install is recorded for the booted slot, the machine asks
//! this module whether the slot already holds the release a manifest
//! names, in this order:
//!
//! 1. **The release marker** (`device.release_file`, by default
//!    `/etc/updraft/release`): a small file the image build writes into
//!    the root filesystem, naming the release the image is (and, where the
//!    build knows it, the image's sha256; an image cannot contain its own
//!    hash, so this is for markers placed outside the image, e.g. on a
//!    factory-written partition). A read-write root filesystem never
//!    hashes equal to its image, so the marker is the primary evidence.
//! 2. **The slot's bytes**, only without a marker: the first `image.size`
//!    bytes of the booted slot are read frame by frame and each frame's
//!    bytes compared with its signed `out_sha256`, stopping at the first
//!    frame that differs. The frames cover the image exactly and each
//!    hash is signed, so all of them matching is the signed image; a slot
//!    holding anything else (any other release: its first frame holds the
//!    file system's superblock) costs one frame, not the whole slot, which
//!    on an SD card at 20 MB/s is minutes for a 4 GiB slot, paid by every
//!    fresh device's first update. The read runs on a helper thread at
//!    idle I/O priority while the state machine ticks (the socket and the
//!    watchdog are served), and its verdict is cached per slot and image
//!    in the store, so a slot is read at most once for an image.
//!
//! The marker is as trusted as the root filesystem that carries it (the
//! code running there is that image's); it is read with a size cap and
//! parsed strictly, and a malformed one is reported, never guessed at.
//!
//! This module reads the marker and the booted slot; it never writes a
//! slot, the store or the bootloader, and it decides nothing: recording
//! the release as running is the machine's (`machine::check`).

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Kind, Result};
use crate::hash::Sha256;
use crate::manifest::Frame;
use crate::progress::Ticker;
use crate::worker::offload;

/// The largest release marker read: a few lines of text.
pub const MARKER_MAX: u64 = 4096;

/// The marker's key naming the release (`UPDRAFT_RELEASE=1.0`).
const RELEASE_KEY: &str = "UPDRAFT_RELEASE";
/// The marker's optional key naming the image's sha256.
const SHA256_KEY: &str = "UPDRAFT_IMAGE_SHA256";

/// A release marker: what the image build says the root filesystem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The release version, as the manifest's `release.version` names it.
    pub version: String,
    /// The image's sha256, when the marker names it.
    pub sha256: Option<Sha256>,
}

/// Read the release marker at `path`: `None` when there is none; an error
/// naming the file (and the line) when it cannot be read or parsed.
pub fn read_marker(path: &Path) -> Result<Option<Marker>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::new(
                Kind::Io,
                format!("release marker {}: {e}", path.display()),
            ));
        }
    };
    let mut text = String::new();
    file.take(MARKER_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| {
            Error::new(
                Kind::Config,
                format!("release marker {}: {e}", path.display()),
            )
        })?;
    if text.len() as u64 > MARKER_MAX {
        return Err(Error::new(
            Kind::Config,
            format!(
                "release marker {}: longer than {MARKER_MAX} bytes",
                path.display()
            ),
        ));
    }
    parse_marker(&text).map(Some).map_err(|e| {
        Error::new(
            Kind::Config,
            format!("release marker {}: {e}", path.display()),
        )
    })
}

/// Parse a release marker: `KEY=VALUE` lines (`os-release` style, values
/// optionally in double quotes), `#` comments and blank lines.
/// `UPDRAFT_RELEASE` is required, `UPDRAFT_IMAGE_SHA256` optional; other
/// keys are left for other tools. Errors name the line.
pub fn parse_marker(text: &str) -> std::result::Result<Marker, String> {
    let mut version = None;
    let mut sha256 = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = n + 1;
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {n}: expected KEY=VALUE"));
        };
        let value = unquote(value.trim()).ok_or_else(|| format!("line {n}: unbalanced quotes"))?;
        let slot = match key.trim() {
            RELEASE_KEY => &mut version,
            SHA256_KEY => &mut sha256,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("line {n}: {} given twice", key.trim()));
        }
        *slot = Some(value.to_string());
    }
    let version = version.ok_or_else(|| format!("no {RELEASE_KEY} line"))?;
    if version.is_empty() || version.len() > 128 || version.chars().any(char::is_control) {
        return Err(format!(
            "{RELEASE_KEY} must be 1 to 128 printable characters"
        ));
    }
    let sha256 = sha256
        .map(|s| Sha256::from_hex(&s).map_err(|e| format!("{SHA256_KEY}: {e}")))
        .transpose()?;
    Ok(Marker { version, sha256 })
}

/// `value` without one pair of surrounding double quotes; `None` when a
/// quote is left open.
fn unquote(value: &str) -> Option<&str> {
    match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"'),
        None if value.ends_with('"') => None,
        None => Some(value),
    }
}

/// Whether the slot at `path` holds the image the signed `frames`
/// describe: each frame's bytes hash to its `out_sha256`, read in order
/// and stopping at the first that does not (or that the slot is too small
/// to hold). Read on a helper thread at idle I/O priority while `ticker`
/// ticks.
pub fn booted_slot_holds(path: &Path, frames: &[Frame], ticker: &mut dyn Ticker) -> Result<bool> {
    let path = path.to_path_buf();
    let frames = frames.to_vec();
    offload(
        "reading the booted slot",
        move || {
            idle_io_priority();
            let first_differing =
                crate::install::probe_frames(&path, &frames, 0, &mut crate::progress::NoTick)?;
            Ok(first_differing == frames.len())
        },
        ticker,
    )?
}

/// Put the calling thread in the idle I/O scheduling class, so hashing a
/// whole slot never competes with the application for the medium. Best
/// effort: a kernel or scheduler without I/O classes just reads sooner.
fn idle_io_priority() {
    // linux/ioprio.h: IOPRIO_WHO_PROCESS with who 0 is the calling thread;
    // the class sits above the 13 bits of the level.
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    const IOPRIO_CLASS_IDLE: libc::c_int = 3;
    const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
    // SAFETY: ioprio_set takes three integers and touches no memory of
    // ours; its result is only informational here.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
        )
    };
    if r != 0 {
        log::debug!(
            "hashing the booted slot at normal I/O priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_marker_names_the_release_and_optionally_the_image() {
        let m = parse_marker("# built by the image recipe\nUPDRAFT_RELEASE=1.0\n").unwrap();
        assert_eq!(m.version, "1.0");
        assert_eq!(m.sha256, None);
        let m = parse_marker(&format!(
            "NAME=\"Acme\"\nUPDRAFT_RELEASE=\"2.1-rc1\"\n\nUPDRAFT_IMAGE_SHA256={SHA}\n"
        ))
        .unwrap();
        assert_eq!(m.version, "2.1-rc1");
        assert_eq!(m.sha256.map(|s| s.to_hex()), Some(SHA.to_string()));
    }

    #[test]
    fn a_malformed_marker_is_refused_naming_the_line() {
        let cases: &[(&str, &str)] = &[
            ("", "no UPDRAFT_RELEASE line"),
            ("NAME=x\n", "no UPDRAFT_RELEASE line"),
            ("UPDRAFT_RELEASE=1.0\njunk\n", "line 2: expected KEY=VALUE"),
            ("UPDRAFT_RELEASE=\"1.0\n", "line 1: unbalanced quotes"),
            ("UPDRAFT_RELEASE=1.0\"\n", "line 1: unbalanced quotes"),
            (
                "UPDRAFT_RELEASE=1.0\nUPDRAFT_RELEASE=2.0\n",
                "line 2: UPDRAFT_RELEASE given twice",
            ),
            ("UPDRAFT_RELEASE=\n", "UPDRAFT_RELEASE must be 1 to 128"),
            ("UPDRAFT_RELEASE=\"\"\n", "UPDRAFT_RELEASE must be 1 to 128"),
            (
                "UPDRAFT_RELEASE=1.0\nUPDRAFT_IMAGE_SHA256=abc\n",
                "UPDRAFT_IMAGE_SHA256: ",
            ),
        ];
        for (text, want) in cases {
            let e = parse_marker(text).unwrap_err();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        let long = format!("UPDRAFT_RELEASE={}\n", "x".repeat(129));
        assert!(parse_marker(&long).is_err());
    }

    #[test]
    fn reading_a_marker_caps_its_size_and_names_the_file() {
        let dir = crate::test_support::scratch_dir("provision", "marker");
        let path = dir.join("release");
        assert_eq!(read_marker(&path).unwrap(), None);
        std::fs::write(&path, "UPDRAFT_RELEASE=3.2\n").unwrap();
        assert_eq!(read_marker(&path).unwrap().unwrap().version, "3.2");
        std::fs::write(
            &path,
            format!(
                "UPDRAFT_RELEASE=3.2\n#{}\n",
                "x".repeat(MARKER_MAX as usize)
            ),
        )
        .unwrap();
        let e = read_marker(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains("longer than 4096 bytes"), "{e}");
        std::fs::write(&path, b"UPDRAFT_RELEASE=\xff\xfe\n").unwrap();
        let e = read_marker(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    /// An image of `n` frames of `size` bytes each, and its signed frame
    /// table (the compressed side is not read here).
    fn framed_image(n: usize, size: usize) -> (Vec<u8>, Vec<Frame>) {
        let image: Vec<u8> = (0..n * size).map(|i| (i * 7 % 251) as u8).collect();
        let frames = image
            .chunks(size)
            .map(|c| Frame {
                offset: 0,
                size: 1,
                out_size: c.len() as u64,
                out_sha256: Sha256::of(c),
            })
            .collect();
        (image, frames)
    }

    #[test]
    fn the_booted_slot_holds_the_image_when_every_frame_matches() {
        let dir = crate::test_support::scratch_dir("provision", "frames");
        let path = dir.join("slot");
        let (image, frames) = framed_image(5, 40_000);
        let mut t = crate::progress::NoTick;
        let with = |bytes: &[u8], t: &mut dyn Ticker| {
            std::fs::write(&path, bytes).unwrap();
            booted_slot_holds(&path, &frames, t).unwrap()
        };
        // The image, followed by the rest of a larger slot.
        let mut slot = image.clone();
        slot.extend_from_slice(&[0xaa; 30_000]);
        assert!(with(&slot, &mut t));
        assert!(with(&image, &mut t));
        // Another release: its first frame differs, or only its last.
        let mut first = image.clone();
        first[17] ^= 1;
        assert!(!with(&first, &mut t));
        let mut last = image.clone();
        last[5 * 40_000 - 1] ^= 1;
        assert!(!with(&last, &mut t));
        // A slot one byte too small to hold it.
        assert!(!with(&image[..image.len() - 1], &mut t));
    }
}
