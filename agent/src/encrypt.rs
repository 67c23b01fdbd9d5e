//! Encrypted releases: the content key wrapped per recipient, frames sealed
//! and opened, the device's X25519 key, and the publisher's recipient list.
//!
//! Scheme ([`crate::manifest::encryption::SCHEME`]): a release has a random
//! 32-byte content key. For each recipient (an X25519 public key, RFC 7748)
//! the publisher makes an ephemeral key pair; HKDF-SHA256 (RFC 5869) over
//! the shared secret, salted with `ephemeral pub || recipient pub`, info
//! `"updraft wrap v1"`, gives a wrapping key under which ChaCha20-Poly1305
//! (RFC 8439) seals the content key. Each artifact gets its own frame key,
//! HKDF of the content key with the artifact's label, so a frame moved
//! between artifacts fails. Each zstd frame is sealed with the frame key,
//! nonce = the frame index (96-bit big-endian), AAD = index and decoded
//! size, so a frame moved within the artifact fails too.
//!
//! A delta is one stream, not a table of frames: it is sealed in chunks
//! under its own key ([`chunks`]).
//!
//! X25519 is computed with `curve25519-dalek`, which the device already
//! carries for ed25519; HKDF and the AEAD are ring's. This module owns the
//! device's `device-enc.key` (base64 secret, mode 0600) and
//! `device-enc.pub` (base64 public key, the line a recipient list takes).
//! It must never write a content or frame key anywhere, nor hand out a
//! byte of a frame whose tag did not verify.

pub mod chunks;

use std::path::Path;
use std::sync::OnceLock;

use curve25519_dalek::montgomery::MontgomeryPoint;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};

use crate::error::{Error, Kind, Result};
use crate::hash::Sha256;
use crate::keys::{decode_base64, encode_base64};
use crate::manifest::encryption::{Encryption, Recipient, SCHEME, TAG_LEN, WrappedKey};

/// The private key's file name in `system.state_dir`.
pub const KEY_FILE: &str = "device-enc.key";
/// The public key's file name in `system.state_dir`.
pub const PUB_FILE: &str = "device-enc.pub";

/// The label of the slot artifact's frame key.
pub const SLOT_ARTIFACT: &str = "slot";

const WRAP_INFO: &[u8] = b"updraft wrap v1";
const FRAME_INFO: &[u8] = b"updraft frame v1";

/// SubjectPublicKeyInfo prefix of an X25519 public key (RFC 8410).
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00,
];

/// A release's content key: in memory only.
pub struct ContentKey([u8; 32]);

impl ContentKey {
    /// A fresh random key (publisher).
    pub fn random() -> Result<ContentKey> {
        crate::random::bytes::<32>().map(ContentKey)
    }
}

impl std::fmt::Debug for ContentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ContentKey(..)")
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.id())
    }
}

impl Drop for ContentKey {
    fn drop(&mut self) {
        self.0 = [0; 32];
    }
}

/// An X25519 key pair.
pub struct SecretKey {
    secret: [u8; 32],
    public: [u8; 32],
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        self.secret = [0; 32];
    }
}

impl SecretKey {
    pub fn from_bytes(secret: [u8; 32]) -> SecretKey {
        let public = MontgomeryPoint::mul_base_clamped(secret).to_bytes();
        SecretKey { secret, public }
    }

    pub fn generate() -> Result<SecretKey> {
        crate::random::bytes::<32>().map(SecretKey::from_bytes)
    }

    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// The id recipients are listed under: sha256 of the public key.
    pub fn id(&self) -> Sha256 {
        Sha256::of(&self.public)
    }

    /// The secret as the key file holds it.
    pub fn to_base64(&self) -> String {
        encode_base64(&self.secret)
    }

    /// Parse a key file's text: one base64 line of 32 bytes.
    pub fn from_base64(text: &str) -> Result<SecretKey> {
        let raw = decode_base64(text.trim(), "the X25519 secret key")?;
        let secret: [u8; 32] = raw.as_slice().try_into().map_err(|_| {
            Error::new(
                Kind::Malformed,
                format!("the X25519 secret key is {} bytes, not 32", raw.len()),
            )
        })?;
        Ok(SecretKey::from_bytes(secret))
    }

    fn agree(&self, public: &[u8; 32]) -> Result<[u8; 32]> {
        let shared = MontgomeryPoint(*public).mul_clamped(self.secret).to_bytes();
        // A low-order point gives the all-zero secret (RFC 7748 section 6.1).
        if shared == [0; 32] {
            return Err(Error::new(
                Kind::Integrity,
                "X25519 key agreement with a low-order public key",
            ));
        }
        Ok(shared)
    }
}

fn aead_key(salt: &[u8], ikm: &[u8], info: &[&[u8]]) -> Result<LessSafeKey> {
    let prk = Salt::new(HKDF_SHA256, salt).extract(ikm);
    let okm = prk
        .expand(info, &CHACHA20_POLY1305)
        .map_err(|_| Error::new(Kind::Io, "HKDF expansion failed"))?;
    Ok(LessSafeKey::new(UnboundKey::from(okm)))
}

fn wrapping_key(
    shared: &[u8; 32],
    ephemeral: &[u8; 32],
    recipient: &[u8; 32],
) -> Result<LessSafeKey> {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(ephemeral);
    salt[32..].copy_from_slice(recipient);
    aead_key(&salt, shared, &[WRAP_INFO])
}

/// Wrap `key` for `recipient` (publisher), with the ephemeral key `eph`.
pub fn wrap(key: &ContentKey, recipient: &[u8; 32], eph: &SecretKey) -> Result<Recipient> {
    let shared = eph.agree(recipient)?;
    let wk = wrapping_key(&shared, &eph.public, recipient)?;
    let mut sealed = key.0.to_vec();
    wk.seal_in_place_append_tag(
        Nonce::assume_unique_for_key([0; 12]),
        Aad::from(WRAP_INFO),
        &mut sealed,
    )
    .map_err(|_| Error::new(Kind::Io, "sealing the content key failed"))?;
    Ok(Recipient {
        id: Sha256::of(recipient),
        ephemeral: encode_base64(&eph.public),
        wrapped: encode_base64(&sealed),
    })
}

/// Unwrap the content key of `entry` with the device's key.
pub fn unwrap(entry: &WrappedKey, device: &SecretKey) -> Result<ContentKey> {
    let shared = device.agree(&entry.ephemeral)?;
    let wk = wrapping_key(&shared, &entry.ephemeral, &device.public)?;
    let mut buf = entry.wrapped;
    let key = wk
        .open_in_place(
            Nonce::assume_unique_for_key([0; 12]),
            Aad::from(WRAP_INFO),
            &mut buf,
        )
        .map_err(|_| {
            Error::new(
                Kind::Integrity,
                format!(
                    "the content key wrapped for recipient {} does not open with this device's key",
                    device.id()
                ),
            )
        })?;
    let mut out = [0u8; 32];
    out.copy_from_slice(key);
    Ok(ContentKey(out))
}

/// Find this device's entry in `enc` and unwrap the content key; a refusal
/// names the device's recipient id.
pub fn unwrap_for(enc: &Encryption, device: &SecretKey) -> Result<ContentKey> {
    let id = device.id();
    match enc.entry_for(&id)? {
        Some(entry) => unwrap(&entry, device),
        None => Err(Error::new(
            Kind::Policy,
            format!(
                "the release is encrypted for {} recipients and none is this device (recipient id {id}, public key {} in {PUB_FILE})",
                enc.recipients.len(),
                encode_base64(&device.public)
            ),
        )),
    }
}

/// Seals and opens the frames of one artifact.
pub struct FrameKey {
    key: LessSafeKey,
    /// The signed sha256 of each ciphertext frame, when opening.
    frame_sha256: Vec<Sha256>,
}

fn nonce(index: usize) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&(index as u64).to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn aad(index: usize, out_size: u64) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&(index as u64).to_be_bytes());
    a[8..].copy_from_slice(&out_size.to_be_bytes());
    a
}

impl FrameKey {
    /// The frame key of the artifact `label`; `frame_sha256` the signed
    /// ciphertext hashes (empty when sealing).
    pub fn derive(
        content: &ContentKey,
        label: &str,
        frame_sha256: Vec<Sha256>,
    ) -> Result<FrameKey> {
        Ok(FrameKey {
            key: aead_key(
                SCHEME.as_bytes(),
                &content.0,
                &[FRAME_INFO, label.as_bytes()],
            )?,
            frame_sha256,
        })
    }

    /// Seal the zstd frame `index` in place (appends the tag).
    pub fn seal(&self, index: usize, out_size: u64, frame: &mut Vec<u8>) -> Result<()> {
        self.key
            .seal_in_place_append_tag(nonce(index), Aad::from(aad(index, out_size)), frame)
            .map_err(|_| Error::new(Kind::Io, format!("sealing frame {index} failed")))
    }

    /// Check the ciphertext of frame `index` against its signed hash, then
    /// open it in place: the zstd frame's length. Nothing of `buf` may be
    /// used on error.
    pub fn open(&self, index: usize, out_size: u64, buf: &mut [u8]) -> Result<usize> {
        let ctx =
            |msg: String| Error::new(Kind::Integrity, msg).wrap(format!("artifact frame {index}"));
        let Some(want) = self.frame_sha256.get(index) else {
            return Err(ctx("has no signed ciphertext hash".into()));
        };
        let got = Sha256::of(buf);
        if got != *want {
            return Err(ctx(format!(
                "ciphertext hashes to sha256 {got}, signed {want}; not decrypted"
            )));
        }
        if (buf.len() as u64) < TAG_LEN {
            return Err(ctx(format!("is {} bytes, shorter than its tag", buf.len())));
        }
        let n = self
            .key
            .open_in_place(nonce(index), Aad::from(aad(index, out_size)), buf)
            .map_err(|_| {
                ctx("does not decrypt under the release's key (wrong key, or a frame moved)".into())
            })?
            .len();
        Ok(n)
    }
}

/// The content key of an encrypted release, unwrapped with the device's
/// key (in memory only); `None` for a plain release.
fn content_key(m: &crate::manifest::Manifest) -> Result<Option<ContentKey>> {
    let Some(enc) = &m.encryption else {
        return Ok(None);
    };
    let Some(device) = device_key() else {
        return Err(Error::new(
            Kind::Policy,
            format!(
                "release {} is encrypted and this device has no usable encryption key ({KEY_FILE} in the state directory)",
                m.release.version
            ),
        ));
    };
    unwrap_for(enc, device).map(Some)
}

/// The slot artifact's frame key of an encrypted release; `None` for a
/// plain release.
pub fn frame_key(m: &crate::manifest::Manifest) -> Result<Option<std::sync::Arc<FrameKey>>> {
    let (Some(content), Some(enc)) = (content_key(m)?, &m.encryption) else {
        return Ok(None);
    };
    let key = FrameKey::derive(&content, SLOT_ARTIFACT, enc.frame_sha256.clone())?;
    Ok(Some(std::sync::Arc::new(key)))
}

/// The chunk key of delta `d` of an encrypted release; `None` for a plain
/// release.
pub fn delta_key(
    m: &crate::manifest::Manifest,
    d: &crate::manifest::Delta,
) -> Result<Option<chunks::ChunkKey>> {
    match content_key(m)? {
        Some(content) => chunks::ChunkKey::for_delta(&content, &d.from_sha256).map(Some),
        None => Ok(None),
    }
}

static DEVICE: OnceLock<Option<SecretKey>> = OnceLock::new();

/// The device's key, once [`load_or_create`] ran.
pub fn device_key() -> Option<&'static SecretKey> {
    DEVICE.get().and_then(Option::as_ref)
}

/// Load `device-enc.key` from `state_dir`, making it (and the public key
/// file) on first start. A file that cannot be read or parsed is never
/// replaced: the device then has no key and says so when a release is
/// encrypted. Logs the key when it is made, and a key that cannot be
/// used.
pub fn load_or_create(state_dir: &Path) {
    let (line, key, made) = load(state_dir);
    match &key {
        None => log::warn!("{line}"),
        Some(_) if made => log::info!("made {line}"),
        Some(_) => log::debug!("{line}"),
    }
    let _ = DEVICE.set(key);
}

/// The key, the line that describes it (or why there is none), and whether
/// it was made now.
fn load(state_dir: &Path) -> (String, Option<SecretKey>, bool) {
    let path = state_dir.join(KEY_FILE);
    let loaded = crate::fsutil::load_or_make_key(
        &path,
        &state_dir.join(PUB_FILE),
        |text| SecretKey::from_base64(text).map_err(|e| e.to_string()),
        || {
            let k = SecretKey::generate().map_err(|e| e.to_string())?;
            let text = format!("{}\n", k.to_base64());
            Ok((k, text))
        },
        |k| format!("{}\n", encode_base64(&k.public)),
    );
    use crate::fsutil::KeyFileError;
    match loaded {
        Ok((k, made)) => (
            format!(
                "device encryption key {} (recipient id {})",
                encode_base64(&k.public),
                k.id()
            ),
            Some(k),
            made,
        ),
        Err(e) => {
            let why = match e {
                KeyFileError::Parse(e) => format!("{}: {e}", path.display()),
                KeyFileError::Make(e) => format!("creating {}: {e}", path.display()),
                KeyFileError::Read(e) => format!("reading {}: {e}", path.display()),
            };
            (format!("no device encryption key: {why}"), None, false)
        }
    }
}

/// The public key in `state_dir`'s `device-enc.pub`, for `status`; never
/// makes one.
pub fn inspect(state_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(state_dir.join(PUB_FILE)).ok()?;
    let line = text.trim();
    let raw = decode_base64(line, "device-enc.pub").ok()?;
    (raw.len() == 32).then(|| line.to_string())
}

/// At most this many recipients in a list file.
pub const MAX_LIST: usize = crate::manifest::encryption::MAX_RECIPIENTS;

/// Parse a recipient list: one X25519 public key per line, base64 of its
/// 32 bytes or a `PUBLIC KEY` PEM block (RFC 8410); `#` starts a comment,
/// blank lines are skipped. Errors name the line.
pub fn parse_recipients(text: &str) -> std::result::Result<Vec<[u8; 32]>, String> {
    let mut keys: Vec<[u8; 32]> = Vec::new();
    let mut pem: Option<(usize, String)> = None;
    for (n, raw) in text.lines().enumerate() {
        let n = n + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if let Some((start, body)) = pem.as_mut() {
            if line == "-----END PUBLIC KEY-----" {
                let der =
                    decode_base64(body, "PEM body").map_err(|e| format!("line {start}: {e}"))?;
                let key = der
                    .strip_prefix(&SPKI_PREFIX[..])
                    .and_then(|k| <[u8; 32]>::try_from(k).ok())
                    .ok_or_else(|| {
                        format!("line {start}: the PEM block is not an X25519 public key")
                    })?;
                push(&mut keys, key, *start)?;
                pem = None;
            } else if line.starts_with("-----") {
                return Err(format!(
                    "line {n}: {:?} inside a PEM block",
                    crate::hash::truncate(line, 60)
                ));
            } else {
                if body.len() > 1024 {
                    return Err(format!("line {start}: the PEM block is too long"));
                }
                body.push_str(line);
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if line == "-----BEGIN PUBLIC KEY-----" {
            pem = Some((n, String::new()));
            continue;
        }
        let raw = decode_base64(line, "key").map_err(|_| {
            format!(
                "line {n}: {:?} is neither a base64 X25519 public key nor a PEM block",
                crate::hash::truncate(line, 60)
            )
        })?;
        let key = <[u8; 32]>::try_from(raw.as_slice()).map_err(|_| {
            format!(
                "line {n}: the key is {} bytes, an X25519 public key is 32",
                raw.len()
            )
        })?;
        push(&mut keys, key, n)?;
    }
    if let Some((start, _)) = pem {
        return Err(format!("line {start}: the PEM block has no END line"));
    }
    if keys.is_empty() {
        return Err("the recipient list names no key".into());
    }
    Ok(keys)
}

fn push(keys: &mut Vec<[u8; 32]>, key: [u8; 32], line: usize) -> std::result::Result<(), String> {
    if keys.contains(&key) {
        return Err(format!(
            "line {line}: the key {} is listed twice",
            encode_base64(&key)
        ));
    }
    if keys.len() >= MAX_LIST {
        return Err(format!("line {line}: more than {MAX_LIST} recipients"));
    }
    keys.push(key);
    Ok(())
}

/// The `encryption` object for `recipients` and the artifact's ciphertext
/// frame hashes (publisher).
pub fn encryption_for(
    key: &ContentKey,
    recipients: &[[u8; 32]],
    frame_sha256: Vec<Sha256>,
) -> Result<Encryption> {
    let mut list = Vec::with_capacity(recipients.len());
    for r in recipients {
        list.push(wrap(key, r, &SecretKey::generate()?)?);
    }
    Ok(Encryption {
        scheme: SCHEME.into(),
        recipients: list,
        frame_sha256,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(n: u8) -> SecretKey {
        SecretKey::from_bytes([n; 32])
    }

    fn sealed(key: &FrameKey, index: usize, plain: &[u8]) -> Vec<u8> {
        let mut b = plain.to_vec();
        key.seal(index, 100, &mut b).unwrap();
        b
    }

    #[test]
    fn the_content_key_unwraps_only_for_its_recipient() {
        let ck = ContentKey([9; 32]);
        let (a, b) = (device(1), device(2));
        let enc = encryption_for(&ck, &[a.public(), b.public()], vec![]).unwrap();
        assert_eq!(unwrap_for(&enc, &a).unwrap().0, [9; 32]);
        assert_eq!(unwrap_for(&enc, &b).unwrap().0, [9; 32]);
        let c = device(3);
        let e = unwrap_for(&enc, &c).unwrap_err().to_string();
        assert!(e.contains(&c.id().to_hex()), "{e}");
        assert!(e.contains("none is this device"), "{e}");
    }

    #[test]
    fn a_wrapped_key_that_was_altered_or_is_meant_for_another_does_not_open() {
        let ck = ContentKey([9; 32]);
        let a = device(1);
        let r = wrap(&ck, &a.public(), &device(7)).unwrap();
        let mut entry = r.decode(0).unwrap();
        entry.wrapped[5] ^= 1;
        assert!(
            unwrap(&entry, &a)
                .unwrap_err()
                .to_string()
                .contains("does not open")
        );
        let entry = r.decode(0).unwrap();
        assert!(unwrap(&entry, &device(2)).is_err());
        let mut entry = r.decode(0).unwrap();
        entry.ephemeral = [0; 32];
        assert!(
            unwrap(&entry, &a)
                .unwrap_err()
                .to_string()
                .contains("low-order")
        );
    }

    #[test]
    fn frames_open_only_where_they_were_sealed() {
        let ck = ContentKey([4; 32]);
        let seal = FrameKey::derive(&ck, SLOT_ARTIFACT, vec![]).unwrap();
        let f0 = sealed(&seal, 0, b"frame zero");
        let f1 = sealed(&seal, 1, b"frame one!");
        let hashes = vec![Sha256::of(&f0), Sha256::of(&f1)];
        let open = FrameKey::derive(&ck, SLOT_ARTIFACT, hashes.clone()).unwrap();
        let mut b = f1.clone();
        let n = open.open(1, 100, &mut b).unwrap();
        assert_eq!(&b[..n], b"frame one!");
        // Rows: what was done to the ciphertext, which index it is opened
        // as, what the refusal says.
        type Edit = fn(&mut Vec<u8>);
        let rows: &[(Edit, usize, &str)] = &[
            (|b| b[3] ^= 1, 1, "ciphertext hashes to"),
            (|b| b.truncate(b.len() - 1), 1, "ciphertext hashes to"),
            (|b| *b = b[..4].to_vec(), 1, "ciphertext hashes to"),
        ];
        for (edit, index, want) in rows {
            let mut b = f1.clone();
            edit(&mut b);
            let e = open.open(*index, 100, &mut b).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        // A frame swapped into another's place: its hash does not match
        // there, and with the hash check passed (the signer's own mistake)
        // the AEAD still refuses the moved frame.
        let mut b = f0.clone();
        assert!(open.open(1, 100, &mut b).is_err());
        let swapped = FrameKey::derive(&ck, SLOT_ARTIFACT, vec![hashes[0], hashes[0]]).unwrap();
        let mut b = f0.clone();
        let e = swapped.open(1, 100, &mut b).unwrap_err().to_string();
        assert!(e.contains("does not decrypt"), "{e}");
        // Another artifact's key, or the wrong content key, does not open it.
        for other in [
            FrameKey::derive(&ck, "delta", hashes.clone()).unwrap(),
            FrameKey::derive(&ContentKey([5; 32]), SLOT_ARTIFACT, hashes.clone()).unwrap(),
        ] {
            let mut b = f0.clone();
            assert!(
                other
                    .open(0, 100, &mut b)
                    .unwrap_err()
                    .to_string()
                    .contains("does not decrypt")
            );
        }
        // The decoded size is bound too.
        let mut b = f0.clone();
        assert!(open.open(0, 101, &mut b).is_err());
        assert!(open.open(2, 100, &mut f0.clone()).is_err());
    }

    #[test]
    fn the_device_key_is_made_once_private_and_kept() {
        let dir = crate::test_support::scratch_dir("encrypt", "device-key");
        let (line, k, _) = load(&dir);
        let k = k.unwrap();
        assert!(line.contains(&k.id().to_hex()), "{line}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (_, again, _) = load(&dir);
        assert_eq!(again.unwrap().public(), k.public());
        assert_eq!(inspect(&dir).unwrap(), encode_base64(&k.public()));
        std::fs::write(dir.join(KEY_FILE), "garbage\n").unwrap();
        let (line, none, _) = load(&dir);
        assert!(none.is_none() && line.contains(KEY_FILE), "{line}");
        assert_eq!(
            std::fs::read_to_string(dir.join(KEY_FILE)).unwrap(),
            "garbage\n"
        );
    }

    #[test]
    fn mutated_lists_and_encryption_objects_are_refused_or_keep_every_rule() {
        use crate::test_support::{Rng, mutate};
        let a = encode_base64(&device(1).public());
        let b = encode_base64(&device(2).public());
        let list = format!("# east\n{a}  # gw 1\n\n{b}\n");
        let enc = encryption_for(&ContentKey([3; 32]), &[device(1).public()], vec![]).unwrap();
        let json = serde_json::to_vec(&enc).unwrap();
        let mut rng = Rng(0x5eed_e4c7);
        for _ in 0..3000 {
            let m = mutate(&mut rng, list.as_bytes());
            if let Ok(text) = std::str::from_utf8(&m) {
                if let Ok(keys) = parse_recipients(text) {
                    assert!((1..=MAX_LIST).contains(&keys.len()));
                }
            }
            let m = mutate(&mut rng, &json);
            if let Ok(e) = serde_json::from_slice::<Encryption>(&m) {
                if e.check(0).is_ok() {
                    let _ = unwrap_for(&e, &device(1));
                }
            }
        }
    }

    #[test]
    fn recipient_lists_take_base64_pem_and_comments() {
        let a = device(1).public();
        let b = device(2).public();
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&b);
        let text = format!(
            "# fleet east\n\n{}  # gateway 7\n-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            encode_base64(&a),
            encode_base64(&der)
        );
        assert_eq!(parse_recipients(&text).unwrap(), vec![a, b]);
    }

    #[test]
    fn hostile_recipient_lists_are_refused_with_their_line() {
        let a = encode_base64(&device(1).public());
        let rows: Vec<(String, &str)> = vec![
            (String::new(), "names no key"),
            ("# only a comment\n".into(), "names no key"),
            ("not base64!\n".into(), "line 1: \"not base64!\" is neither"),
            (
                format!("{a}\n{}\n", encode_base64(&[1; 31])),
                "line 2: the key is 31 bytes",
            ),
            (format!("{a}\n{a}\n"), "line 2: the key"),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n".into(),
                "line 1: the PEM block has no END",
            ),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n".into(),
                "not an X25519 public key",
            ),
            (
                "-----BEGIN PUBLIC KEY-----\n-----BEGIN PUBLIC KEY-----\n".into(),
                "line 2:",
            ),
            (
                format!("-----BEGIN PUBLIC KEY-----\n{}\n", "A".repeat(2000)),
                "line 1:",
            ),
        ];
        for (text, want) in rows {
            let e = parse_recipients(&text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let many: String = (0..=MAX_LIST as u32)
            .map(|i| {
                let mut k = [0u8; 32];
                k[..4].copy_from_slice(&i.to_be_bytes());
                format!("{}\n", encode_base64(&k))
            })
            .collect();
        assert!(parse_recipients(&many).unwrap_err().contains("more than"));
    }
}
