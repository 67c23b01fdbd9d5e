//! The release manifest: schema, structural validation and the policy checks
//! a verified manifest must pass before anything is written.
//!
//! A manifest is a DSSE envelope (see [`crate::envelope`]) whose payload is
//! the JSON [`Manifest`]. This module owns what the payload means: the
//! release, the image the slot must end up containing, the full artifact and
//! its signed frame table, and the optional deltas. Everything here is pure:
//! it takes bytes, keys, the clock reading and stored values as arguments
//! and never touches the network, the store or a slot.
//!
//! Validation happens in two layers. [`Manifest::parse`] refuses payloads
//! that are internally inconsistent (frames that do not tile the artifact,
//! sizes that do not add up, frames too big for the device's decoder), so
//! the install pipeline can trust every number it reads.
//! [`Manifest::check_policy`] then applies the device's rules: expiry,
//! serial, hardware compatibility.

use serde::{Deserialize, Serialize};

pub mod component;
pub mod encryption;
pub mod provenance;

use crate::envelope::{Envelope, Verified};
use crate::error::{Error, Kind, Result};
use crate::hash::{Sha256, truncate};
use crate::timestamp::Timestamp;
use crate::trust::Trust;

/// `payloadType` of manifests.
pub const PAYLOAD_TYPE: &str = "application/vnd.updraft.manifest+json";

/// The payload format this build understands.
pub const SPEC_VERSION: u32 = 1;

/// A manifest download larger than this is abandoned (endless data).
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;

/// Largest decoded size of one artifact frame. The device decodes a frame
/// into one buffer, so this bounds its memory.
pub const MAX_FRAME_OUTPUT: u64 = 8 * 1024 * 1024;

/// Largest zstd window the device accepts, as a power of two (8 MiB).
pub const MAX_WINDOW_LOG: u32 = 23;

/// At most this many frames and deltas.
pub const MAX_FRAMES: usize = 1 << 16;
pub const MAX_DELTAS: usize = 64;

/// The signed payload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Manifest {
    pub spec_version: u32,
    /// Monotonic: lower than stored is a rollback attack, equal is no change.
    pub serial: u64,
    /// When the publisher signed it; also a floor for the device clock.
    pub issued: Timestamp,
    /// After this, the manifest is refused (freeze attack).
    pub expires: Timestamp,
    /// The key document version the signing release keys belong to.
    /// Required in root mode: it must be the version the device trusts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_version: Option<u64>,
    /// The release channel this manifest belongs to (`stable`, `beta`, …).
    /// Required: a device follows one channel and refuses every other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The device-global security version (0 when absent): a device with
    /// a hardware rollback floor refuses a release below its counter, and
    /// moves the counter up to this once the release is committed
    /// ([`crate::rollback_counter`]). Unlike the serial it is not per
    /// channel and does not restart with a key document.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub security_version: u64,
    pub release: Release,
    pub image: Image,
    pub artifact: Artifact,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<Delta>,
    /// The release's build provenance attestation, when it has one
    /// ([`provenance`]). An updraft that predates it ignores the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<provenance::AttestationRef>,
    /// Version 3 only: the artifact is encrypted ([`encryption`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<encryption::Encryption>,
    /// Version 2: the `slot` component's name and version; `image`,
    /// `artifact` and `deltas` above are its own. Written and read by
    /// [`crate::manifest::component`], never by the derived serde of version 1.
    #[serde(skip)]
    pub slot: Option<component::Named>,
    /// Version 2: the components besides the slot, in manifest order.
    #[serde(skip)]
    pub components: Vec<component::Component>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Release {
    pub version: String,
    /// Hardware ids this image runs on; the device's must be listed.
    pub compatible: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Rollout {
    /// Share of the fleet eligible, 0 to 100.
    pub percent: f64,
}

/// What the slot must contain after the install.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Image {
    pub size: u64,
    pub sha256: Sha256,
}

/// The full image as a zstd stream of independent frames.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Artifact {
    pub url: String,
    pub size: u64,
    pub sha256: Sha256,
    pub frames: Vec<Frame>,
}

/// One zstd frame: where it sits in the artifact and what it decodes to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Frame {
    pub offset: u64,
    pub size: u64,
    pub out_size: u64,
    pub out_sha256: Sha256,
}

/// A bsdiff delta from an older image to this one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Delta {
    pub from_size: u64,
    pub from_sha256: Sha256,
    pub url: String,
    pub size: u64,
    pub sha256: Sha256,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Upper bound of a zstd frame's compressed size for `n` input bytes
/// (ZSTD_COMPRESSBOUND plus a frame header's worth).
pub fn compress_bound(n: u64) -> u64 {
    let margin = if n < (128 << 10) {
        ((128 << 10) - n) >> 11
    } else {
        0
    };
    n + (n >> 8) + margin + 64
}

/// A manifest whose signatures verified.
#[derive(Clone, Debug)]
pub struct VerifiedManifest {
    pub manifest: Manifest,
    /// The envelope exactly as received.
    pub raw: Vec<u8>,
}

/// Read the `keys_version` hint from an unverified envelope so the caller can
/// fetch newer key documents before verifying. Never trust anything else
/// read this way.
pub fn keys_version_hint(raw: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct Hint {
        keys_version: Option<u64>,
    }
    let env = Envelope::parse(raw, "manifest").ok()?;
    let payload = env.payload_bytes("manifest").ok()?;
    serde_json::from_slice::<Hint>(&payload).ok()?.keys_version
}

/// Verify the envelope against the release keys in force and parse the
/// payload. Policy (expiry, serial, compatibility) is checked separately.
pub fn verify(raw: &[u8], trust: &Trust) -> Result<VerifiedManifest> {
    if raw.len() > MAX_MANIFEST_BYTES {
        return Err(Error::new(
            Kind::Malformed,
            format!(
                "manifest is {} bytes, larger than the {MAX_MANIFEST_BYTES}-byte limit",
                raw.len()
            ),
        ));
    }
    let env = Envelope::parse(raw, "manifest")?;
    let (keys, role) = trust.release_keys()?;
    let Verified { payload, .. } = env.verify("manifest", PAYLOAD_TYPE, keys, &role)?;
    let manifest = Manifest::parse(&payload)?;
    Ok(VerifiedManifest {
        manifest,
        raw: raw.to_vec(),
    })
}

/// Longest channel name.
pub const MAX_CHANNEL_LEN: usize = 64;

/// A channel name: 1 to 64 of `a-z`, `0-9`, `.`, `_`, `-`, starting with a
/// letter or digit. Used for the signed `channel`, the configuration and
/// the operator's choice alike, so the three compare as plain strings.
pub fn check_channel_name(name: &str) -> std::result::Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
    if name.is_empty() || name.len() > MAX_CHANNEL_LEN {
        return Err(format!(
            "channel name {:?} must be 1 to {MAX_CHANNEL_LEN} characters",
            truncate(name, 80)
        ));
    }
    if !name.chars().all(ok_char) || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "channel name {:?} may hold only a-z, 0-9, '.', '_' and '-', and must start with a letter or digit",
            truncate(name, 80)
        ));
    }
    Ok(())
}

/// Where a verified manifest stands against the key document the device
/// trusts (root mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyEpoch {
    /// Signed under the key document in force.
    Current,
    /// Signed under an older key document than the one the device already
    /// accepted: a server (or a CDN edge) that has not caught up with a key
    /// rotation yet. Not an error: the device polls again later.
    Stale { manifest: u64, trusted: u64 },
}

/// The outcome of comparing a verified manifest with the stored serial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Higher serial: a new manifest.
    New,
    /// Same serial as stored: nothing new was published.
    Unchanged,
}

impl Manifest {
    /// Parse and structurally validate a payload.
    pub fn parse(payload: &[u8]) -> Result<Manifest> {
        // Look at spec_version first so a future format gets a clear error
        // rather than a complaint about a missing field.
        #[derive(Deserialize)]
        struct Version {
            spec_version: Option<serde_json::Value>,
        }
        let v: Version = serde_json::from_slice(payload).map_err(|e| {
            Error::new(
                Kind::Malformed,
                format!("manifest payload is not valid JSON: {e}"),
            )
        })?;
        match v.spec_version.as_ref().and_then(|v| v.as_u64()) {
            Some(n) if n == SPEC_VERSION as u64 || n == encryption::SPEC_VERSION as u64 => {}
            Some(n) if n == component::SPEC_VERSION as u64 => {
                let m = component::parse(payload)?;
                m.validate()?;
                return Ok(m);
            }
            Some(n) => {
                return Err(Error::new(
                    Kind::Policy,
                    format!(
                        "manifest spec_version {n} is not supported (this updraft reads {SPEC_VERSION}, {} and {})",
                        component::SPEC_VERSION,
                        encryption::SPEC_VERSION
                    ),
                ));
            }
            None => {
                return Err(Error::new(
                    Kind::Malformed,
                    "manifest payload has no numeric spec_version",
                ));
            }
        }
        let m: Manifest = serde_json::from_slice(payload)
            .map_err(|e| Error::new(Kind::Malformed, format!("manifest payload: {e}")))?;
        m.validate()?;
        Ok(m)
    }

    /// Structural checks: everything the install pipeline relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::new(Kind::Malformed, format!("manifest: {msg}")));
        let r = &self.release;
        if !version_ok(&r.version) {
            return bad(format!(
                "release version {:?} is empty, too long or has spaces or control characters",
                truncate(&r.version, 140)
            ));
        }
        if r.compatible.is_empty() {
            return bad("release.compatible is empty".into());
        }
        if r.compatible.len() > 256 || r.compatible.iter().any(|c| c.is_empty() || c.len() > 128) {
            return bad("release.compatible has empty, overlong or too many entries".into());
        }
        if let Some(ro) = &r.rollout {
            if !(ro.percent.is_finite() && (0.0..=100.0).contains(&ro.percent)) {
                return bad(format!(
                    "rollout percent {} is not between 0 and 100",
                    ro.percent
                ));
            }
        }
        if let Some(c) = &self.channel {
            check_channel_name(c)
                .map_err(|e| Error::new(Kind::Malformed, format!("manifest: {e}")))?;
        }
        if self.expires <= self.issued {
            return bad(format!(
                "expires {} is not after issued {}",
                self.expires, self.issued
            ));
        }
        if self.image.size == 0 {
            return bad("image size is 0".into());
        }
        let overhead = match (&self.encryption, self.spec_version) {
            (Some(e), encryption::SPEC_VERSION) => {
                e.check(self.artifact.frames.len())?;
                if let Some(i) = self
                    .deltas
                    .iter()
                    .position(|d| d.size <= encryption::TAG_LEN)
                {
                    return bad(format!(
                        "delta {i} is {} bytes, too short to be sealed (an encrypted delta is chunks of ciphertext and {}-byte tags)",
                        self.deltas[i].size,
                        encryption::TAG_LEN
                    ));
                }
                encryption::TAG_LEN
            }
            (None, encryption::SPEC_VERSION) => {
                return bad("spec_version 3 needs an encryption object".into());
            }
            (Some(_), v) => {
                return bad(format!(
                    "spec_version {v} carries no encryption (an encrypted release is spec_version 3)"
                ));
            }
            (None, _) => 0,
        };
        check_artifact_with(&self.artifact, Some(self.image.size), "artifact", overhead)?;
        if self.deltas.len() > MAX_DELTAS {
            return bad(format!(
                "{} deltas listed, at most {MAX_DELTAS} are accepted",
                self.deltas.len()
            ));
        }
        for (i, d) in self.deltas.iter().enumerate() {
            check_url(&d.url, &format!("delta {i} url"))?;
            if d.size == 0 || d.from_size == 0 {
                return bad(format!("delta {i} has a zero size"));
            }
        }
        if let Some(a) = &self.attestation {
            a.check()?;
        }
        component::check(self)
    }

    /// The channel rule: the manifest must name the channel this device
    /// follows. Checked before anything about the manifest is stored, since
    /// serial floors are kept per channel.
    pub fn check_channel(&self, followed: &str) -> Result<()> {
        match &self.channel {
            Some(c) if c == followed => Ok(()),
            Some(c) => Err(Error::new(
                Kind::Policy,
                format!(
                    "manifest serial {} is for channel {c}; this device follows {followed}",
                    self.serial
                ),
            )),
            None => Err(Error::new(
                Kind::Policy,
                format!(
                    "manifest serial {} names no channel; this device follows {followed} \
                     (publish with `updraft-publish release --channel {followed}`)",
                    self.serial
                ),
            )),
        }
    }

    /// The key-epoch rule of root mode: `trusted` is the version of the key
    /// document in force (`None` in simple mode, where the rule does not
    /// apply). A manifest naming no version is refused; one naming an older
    /// version is [`KeyEpoch::Stale`]; one naming a newer version than the
    /// device could verify is refused.
    pub fn check_keys_version(&self, trusted: Option<u64>) -> Result<KeyEpoch> {
        let Some(trusted) = trusted else {
            return Ok(KeyEpoch::Current);
        };
        match self.keys_version {
            None => Err(Error::new(
                Kind::Policy,
                format!(
                    "manifest serial {} names no keys_version; in root mode a manifest must name \
                     the key document it is signed under (this device trusts v{trusted})",
                    self.serial
                ),
            )),
            Some(v) if v == trusted => Ok(KeyEpoch::Current),
            Some(v) if v < trusted => Ok(KeyEpoch::Stale {
                manifest: v,
                trusted,
            }),
            Some(v) => Err(Error::new(
                Kind::Signature,
                format!(
                    "manifest serial {} names key document v{v}, newer than the v{trusted} this device could verify",
                    self.serial
                ),
            )),
        }
    }

    /// Refuse a manifest whose validity ended: a frozen mirror replaying an
    /// old answer. Checked before anything else about the manifest's place
    /// in the sequence (key epoch, serial), so an expired manifest is
    /// refused and reported whatever epoch it was signed under.
    pub fn check_expiry(&self, now: Timestamp) -> Result<()> {
        if now >= self.expires {
            return Err(Error::new(
                Kind::Policy,
                format!(
                    "manifest serial {} expired at {} (now {now}): refusing a possibly frozen update server",
                    self.serial, self.expires
                ),
            ));
        }
        Ok(())
    }

    /// The device's rules for a verified manifest. `stored_serial` is the
    /// floor of the manifest's channel under the key document in force
    /// (None when nothing was accepted there yet).
    pub fn check_policy(
        &self,
        now: Timestamp,
        stored_serial: Option<u64>,
        compatible: &str,
    ) -> Result<Freshness> {
        self.check_expiry(now)?;
        let freshness = match stored_serial {
            Some(s) if self.serial < s => {
                return Err(Error::new(
                    Kind::Policy,
                    format!(
                        "manifest serial {} is older than stored serial {s}: refusing a rollback",
                        self.serial
                    ),
                ));
            }
            Some(s) if self.serial == s => Freshness::Unchanged,
            _ => Freshness::New,
        };
        if !self.release.compatible.iter().any(|c| c == compatible) {
            return Err(Error::new(
                Kind::Policy,
                format!(
                    "release {} is for {:?}, not for this device ({compatible:?})",
                    self.release.version,
                    self.release
                        .compatible
                        .iter()
                        .map(|c| truncate(c, 40))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        Ok(freshness)
    }

    /// What to warn of when a manifest with the serial already accepted
    /// (`Freshness::Unchanged`) names another image than that serial named
    /// then (`accepted`, when it was recorded); `None` when it names the
    /// same one or nothing was recorded. Such a pair means the publisher
    /// reused a serial, and whoever serves both can switch devices between
    /// them: the serial floor cannot tell them apart. It is a warning, not
    /// a refusal: fleets behind a DDI server that publish every release on
    /// its own, each with serial 1, rely on an equal serial being accepted
    /// (docs/security.md, "Findings, decided").
    pub fn serial_reuse(&self, accepted: Option<&Sha256>) -> Option<String> {
        let sha = accepted.filter(|sha| **sha != self.image.sha256)?;
        Some(format!(
            "manifest serial {} (release {}) names image {}, but serial {} was accepted naming \
             image {}: the publisher reused a serial, so the serial floor cannot keep this device \
             from being switched between the two; publish every release with a higher serial",
            self.serial,
            truncate(&self.release.version, 64),
            self.image.sha256.short(),
            self.serial,
            sha.short()
        ))
    }

    /// The delta that applies to an active slot holding `from`, if listed.
    pub fn delta_from(&self, from_size: u64, from_sha256: &Sha256) -> Option<&Delta> {
        self.deltas
            .iter()
            .find(|d| d.from_size == from_size && &d.from_sha256 == from_sha256)
    }
}

/// The structural rules of a framed artifact (the slot's, an app's index,
/// a command's payload): a URL below the manifest, 1 to [`MAX_FRAMES`]
/// frames that tile it exactly, each decoding to at most
/// [`MAX_FRAME_OUTPUT`] bytes and no larger compressed than zstd can make
/// it. `decoded`, when the manifest states it, must be what the frames
/// decode to. `what` names it in every refusal; the decoded size.
pub fn check_artifact(a: &Artifact, decoded: Option<u64>, what: &str) -> Result<u64> {
    check_artifact_with(a, decoded, what, 0)
}

/// [`check_artifact`] for frames that each carry `overhead` bytes beyond
/// their zstd frame (an AEAD tag).
pub fn check_artifact_with(
    a: &Artifact,
    decoded: Option<u64>,
    what: &str,
    overhead: u64,
) -> Result<u64> {
    let bad = |msg: String| Err(Error::new(Kind::Malformed, format!("manifest: {msg}")));
    // The slot's artifact keeps its messages of version 1.
    let of = if what == "artifact" {
        String::new()
    } else {
        format!(" of {what}")
    };
    check_url(&a.url, &format!("{what} url"))?;
    if a.frames.is_empty() {
        return bad(format!("{what} has no frames"));
    }
    if a.frames.len() > MAX_FRAMES {
        return bad(format!(
            "{what} has {} frames, at most {MAX_FRAMES} are accepted",
            a.frames.len()
        ));
    }
    let mut offset: u64 = 0;
    let mut out: u64 = 0;
    for (i, f) in a.frames.iter().enumerate() {
        if f.offset != offset {
            return bad(format!(
                "frame {i}{of} starts at {} but the previous frame ends at {offset}",
                f.offset
            ));
        }
        if f.out_size == 0 || f.out_size > MAX_FRAME_OUTPUT {
            return bad(format!(
                "frame {i}{of} decodes to {} bytes; frames must decode to 1..={MAX_FRAME_OUTPUT} bytes",
                f.out_size
            ));
        }
        if f.size <= overhead || f.size > compress_bound(f.out_size) + overhead {
            return bad(format!(
                "frame {i}{of} is {} bytes compressed, impossible for {} bytes of output",
                f.size, f.out_size
            ));
        }
        offset = offset
            .checked_add(f.size)
            .ok_or_else(|| Error::new(Kind::Malformed, "manifest: frame sizes overflow"))?;
        out = out
            .checked_add(f.out_size)
            .ok_or_else(|| Error::new(Kind::Malformed, "manifest: frame output sizes overflow"))?;
    }
    if offset != a.size {
        return bad(format!(
            "frames{of} cover {offset} bytes but the {what} is {} bytes",
            a.size
        ));
    }
    if let Some(size) = decoded {
        if out != size {
            return bad(format!(
                "frames{of} decode to {out} bytes but the image is {size} bytes"
            ));
        }
    }
    Ok(out)
}

/// A release or component version: 1 to 128 characters, no spaces or
/// control characters.
pub fn version_ok(v: &str) -> bool {
    !v.is_empty() && v.len() <= 128 && !v.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// Artifact and delta URLs are relative paths below the manifest's
/// directory, or absolute https URLs. `..` segments, queries with control
/// characters and other schemes are refused.
pub(crate) fn check_url(url: &str, what: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::new(
            Kind::Malformed,
            format!("manifest: {what} {:?} {why}", truncate(url, 120)),
        ))
    };
    if url.is_empty() || url.len() > 2048 {
        return bad("is empty or too long");
    }
    if url.chars().any(|c| c.is_control() || c == ' ' || c == '\\') {
        return bad("contains spaces, backslashes or control characters");
    }
    if url.contains("://") {
        if !url.starts_with("https://") && !url.starts_with("http://") {
            return bad("uses an unsupported scheme");
        }
        return Ok(());
    }
    if url.starts_with('/') || url.split('/').any(|seg| seg == ".." || seg == ".") {
        return bad("must be a plain relative path below the manifest");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let h = Sha256::of(b"x");
        Manifest {
            spec_version: 1,
            serial: 7,
            issued: Timestamp(1_800_000_000),
            expires: Timestamp(1_900_000_000),
            keys_version: None,
            security_version: 0,
            channel: Some("stable".into()),
            release: Release {
                version: "1.2.3".into(),
                compatible: vec!["rpi4".into()],
                rollout: None,
            },
            image: Image {
                size: 10,
                sha256: h,
            },
            artifact: Artifact {
                url: "artifacts/a.zst".into(),
                size: 30,
                sha256: h,
                frames: vec![
                    Frame {
                        offset: 0,
                        size: 15,
                        out_size: 6,
                        out_sha256: h,
                    },
                    Frame {
                        offset: 15,
                        size: 15,
                        out_size: 4,
                        out_sha256: h,
                    },
                ],
            },
            deltas: vec![],
            attestation: None,
            encryption: None,
            slot: None,
            components: vec![],
        }
    }

    fn reparse(m: &Manifest) -> Result<Manifest> {
        Manifest::parse(&serde_json::to_vec(m).unwrap())
    }

    #[test]
    fn valid_sample_round_trips() {
        let m = sample();
        assert_eq!(reparse(&m).unwrap(), m);
    }

    #[test]
    fn frames_must_tile_the_artifact() {
        let mut m = sample();
        m.artifact.frames[1].offset = 16;
        assert!(
            reparse(&m)
                .unwrap_err()
                .to_string()
                .contains("frame 1 starts at 16")
        );
        let mut m = sample();
        m.artifact.size = 31;
        assert!(
            reparse(&m)
                .unwrap_err()
                .to_string()
                .contains("frames cover 30 bytes")
        );
        let mut m = sample();
        m.image.size = 11;
        assert!(
            reparse(&m)
                .unwrap_err()
                .to_string()
                .contains("decode to 10 bytes")
        );
        let mut m = sample();
        m.artifact.frames[0].out_size = MAX_FRAME_OUTPUT + 1;
        assert!(reparse(&m).is_err());
    }

    #[test]
    fn urls_stay_below_the_manifest() {
        for bad in ["../x", "/etc/passwd", "a/../../b", "ftp://x/y", "a b", ""] {
            let mut m = sample();
            m.artifact.url = bad.into();
            assert!(reparse(&m).is_err(), "{bad:?} accepted");
        }
        let mut m = sample();
        m.artifact.url = "https://cdn.example.com/a.zst".into();
        assert!(reparse(&m).is_ok());
    }

    #[test]
    fn unknown_spec_version_is_named() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["spec_version"] = 4.into();
        let e = Manifest::parse(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(e.kind(), Kind::Policy);
        assert!(e.to_string().contains("spec_version 4"));
    }

    fn encrypted() -> Manifest {
        let mut m = sample();
        m.spec_version = encryption::SPEC_VERSION;
        for f in &mut m.artifact.frames {
            f.size += encryption::TAG_LEN;
        }
        let mut offset = 0;
        for f in &mut m.artifact.frames {
            f.offset = offset;
            offset += f.size;
        }
        m.artifact.size = offset;
        m.encryption = Some(encryption::Encryption {
            scheme: encryption::SCHEME.into(),
            recipients: vec![encryption::Recipient {
                id: Sha256::of(b"device"),
                ephemeral: crate::keys::encode_base64(&[1; 32]),
                wrapped: crate::keys::encode_base64(&[2; 48]),
            }],
            frame_sha256: m.artifact.frames.iter().map(|_| Sha256::of(b"c")).collect(),
        });
        m
    }

    #[test]
    fn an_encrypted_release_is_version_3_and_only_version_3_carries_encryption() {
        reparse(&encrypted()).unwrap();
        // With a sealed delta: one chunk of at least a byte and its tag.
        let mut m = encrypted();
        m.deltas.push(Delta {
            from_size: 1,
            from_sha256: Sha256::of(b"old"),
            url: "d.bsdiff.zst.sealed".into(),
            size: 17,
            sha256: Sha256::of(b"d"),
        });
        reparse(&m).unwrap();
        type Edit = fn(&mut Manifest);
        let rows: &[(Edit, &str)] = &[
            (
                |m| m.encryption = None,
                "spec_version 3 needs an encryption object",
            ),
            (
                |m| m.spec_version = 1,
                "spec_version 1 carries no encryption",
            ),
            (
                |m| {
                    m.deltas.push(Delta {
                        from_size: 1,
                        from_sha256: Sha256::of(b"old"),
                        url: "d.zst".into(),
                        size: 16,
                        sha256: Sha256::of(b"d"),
                    })
                },
                "delta 0 is 16 bytes, too short to be sealed",
            ),
            (
                |m| {
                    if let Some(e) = m.encryption.as_mut() {
                        e.frame_sha256.pop();
                    }
                },
                "hashes for 2 artifact frames",
            ),
        ];
        for (edit, want) in rows {
            let mut m = encrypted();
            edit(&mut m);
            let e = reparse(&m).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should contain {want}");
        }
    }

    #[test]
    fn a_manifest_must_name_the_channel_the_device_follows() {
        let mut m = sample();
        assert!(m.check_channel("stable").is_ok());
        let e = m.check_channel("beta").unwrap_err();
        assert_eq!(e.kind(), Kind::Policy);
        assert_eq!(
            e.message(),
            "manifest serial 7 is for channel stable; this device follows beta"
        );
        m.channel = None;
        let e = m.check_channel("stable").unwrap_err();
        assert!(
            e.message()
                .starts_with("manifest serial 7 names no channel; this device follows stable"),
            "{e}"
        );
    }

    #[test]
    fn channel_names_are_checked_where_they_are_read() {
        for good in ["stable", "beta", "rc-2.1", "0", "lts_2026"] {
            assert!(check_channel_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Stable", "-x", ".x", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(check_channel_name(bad).is_err(), "{bad:?}");
            let mut m = sample();
            m.channel = Some(bad.to_string());
            assert!(
                reparse(&m).unwrap_err().message().contains("channel name"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn root_mode_needs_the_key_document_in_force() {
        let mut m = sample();
        // Simple mode: no rule.
        assert_eq!(m.check_keys_version(None).unwrap(), KeyEpoch::Current);
        let e = m.check_keys_version(Some(2)).unwrap_err();
        assert_eq!(e.kind(), Kind::Policy);
        assert!(e.message().contains("names no keys_version"), "{e}");
        m.keys_version = Some(2);
        assert_eq!(m.check_keys_version(Some(2)).unwrap(), KeyEpoch::Current);
        assert_eq!(
            m.check_keys_version(Some(3)).unwrap(),
            KeyEpoch::Stale {
                manifest: 2,
                trusted: 3
            }
        );
        assert_eq!(
            m.check_keys_version(Some(1)).unwrap_err().kind(),
            Kind::Signature
        );
    }

    /// tuf-conformance `test_timestamp_content_changes`: the stored
    /// serial re-signed for another image is warned of; for the image it
    /// named (a retry, a re-signed expiry), or with nothing recorded,
    /// nothing is said.
    #[test]
    fn a_serial_reused_for_another_image_is_warned_of() {
        let m = sample();
        assert_eq!(m.serial_reuse(None), None);
        assert_eq!(m.serial_reuse(Some(&m.image.sha256)), None);
        let other = Sha256::of(b"another image");
        let warning = m.serial_reuse(Some(&other)).unwrap();
        assert!(
            warning.starts_with(&format!(
                "manifest serial 7 (release {}) names image {}, but serial 7 was accepted naming image {}: the publisher reused a serial",
                m.release.version,
                m.image.sha256.short(),
                other.short()
            )),
            "{warning}"
        );
    }

    #[test]
    fn policy_serial_expiry_compatibility() {
        let m = sample();
        let now = Timestamp(1_850_000_000);
        assert_eq!(m.check_policy(now, None, "rpi4").unwrap(), Freshness::New);
        assert_eq!(
            m.check_policy(now, Some(6), "rpi4").unwrap(),
            Freshness::New
        );
        assert_eq!(
            m.check_policy(now, Some(7), "rpi4").unwrap(),
            Freshness::Unchanged
        );
        let e = m.check_policy(now, Some(8), "rpi4").unwrap_err();
        assert_eq!(
            e.to_string(),
            "manifest serial 7 is older than stored serial 8: refusing a rollback"
        );
        assert!(
            m.check_policy(Timestamp(1_900_000_000), None, "rpi4")
                .is_err()
        );
        assert!(
            m.check_policy(now, None, "rpi3")
                .unwrap_err()
                .to_string()
                .contains("not for this device")
        );
    }

    #[test]
    fn the_security_version_is_optional_signed_and_written_only_when_set() {
        let m = sample();
        let plain = serde_json::to_value(&m).unwrap();
        assert!(plain.get("security_version").is_none(), "{plain}");
        assert_eq!(reparse(&m).unwrap().security_version, 0);
        let mut v = plain.clone();
        v["security_version"] = serde_json::json!(5);
        let with = Manifest::parse(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(with.security_version, 5);
        assert_eq!(reparse(&with).unwrap(), with);
        for bad in [
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!("5"),
            serde_json::json!(null),
            serde_json::json!(18446744073709551616u128 as f64),
        ] {
            let mut v = plain.clone();
            v["security_version"] = bad.clone();
            let e = Manifest::parse(&serde_json::to_vec(&v).unwrap()).unwrap_err();
            assert_eq!(e.kind(), Kind::Malformed, "{bad}: {e}");
        }
    }
}
