//! Signing keys and key documents.
//!
//! Private keys are ed25519 seeds stored as PKCS#8 PEM (`PRIVATE KEY`, the
//! format `openssl genpkey -algorithm ed25519` writes), mode 0600; public
//! keys as SubjectPublicKeyInfo PEM (`PUBLIC KEY`). Key documents
//! (`keys/N.json`) list the root and release keys with their thresholds and
//! are signed by root keys. This module never decides what a device
//! accepts; the `updraft` crate's `trust` module does.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use updraft::envelope::{decode_base64, encode_base64};
use updraft::trust::{KEYS_PAYLOAD_TYPE, KeyDocumentBody, KeySet, PublicKey, RoleEntry, pem_body};

use crate::sign::sign_envelope;

pub type Result<T> = std::result::Result<T, String>;

// PKCS#8 v1 prefix for an ed25519 private key (RFC 8410), then the 32-byte seed.
const PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A private signing key with its public half.
pub struct Key {
    pub signing: SigningKey,
    pub public: PublicKey,
    pub path: PathBuf,
}

impl Key {
    /// Read a PKCS#8 PEM private key.
    pub fn load(path: &Path) -> Result<Key> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading key {}: {e}", path.display()))?;
        let der =
            pem_body(&text, "PRIVATE KEY").map_err(|e| format!("key {}: {e}", path.display()))?;
        if der.len() != 48 || der[..16] != PKCS8_PREFIX {
            return Err(format!(
                "key {} is not an ed25519 PKCS#8 private key",
                path.display()
            ));
        }
        let mut seed = [0u8; 32];
        seed.copy_from_slice(&der[16..]);
        let signing = SigningKey::from_bytes(&seed);
        let public = PublicKey::from_bytes(signing.verifying_key().as_bytes())
            .map_err(|e| format!("key {}: {e}", path.display()))?;
        Ok(Key {
            signing,
            public,
            path: path.to_path_buf(),
        })
    }
}

/// Generate a key pair: `PREFIX.key` (0600) and `PREFIX.pub`. Refuses to
/// overwrite an existing key.
pub fn keygen(prefix: &Path) -> Result<(PathBuf, PathBuf)> {
    use ring::rand::SecureRandom;
    let (key_path, pub_path) = new_pair_paths(prefix)?;
    let mut seed = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| "the system random number generator failed".to_string())?;
    let signing = SigningKey::from_bytes(&seed);
    let mut der = PKCS8_PREFIX.to_vec();
    der.extend_from_slice(&seed);
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        encode_base64(&der)
    );
    write_secret(&key_path, pem.as_bytes())?;
    let public =
        PublicKey::from_bytes(signing.verifying_key().as_bytes()).map_err(|e| e.to_string())?;
    std::fs::write(&pub_path, public.to_pem())
        .map_err(|e| format!("writing {}: {e}", pub_path.display()))?;
    Ok((key_path, pub_path))
}

/// Write a new X25519 key pair for encrypted releases: `PREFIX.key` (the
/// base64 secret, mode 0600, as a device's `device-enc.key`) and
/// `PREFIX.pub` (the base64 public key, a line of a recipient list).
/// Never overwrites a file.
pub fn keygen_recipient(prefix: &Path) -> Result<(PathBuf, PathBuf)> {
    let (key_path, pub_path) = new_pair_paths(prefix)?;
    let key = updraft::encrypt::SecretKey::generate().map_err(|e| e.to_string())?;
    write_secret(&key_path, format!("{}\n", key.to_base64()).as_bytes())?;
    std::fs::write(&pub_path, format!("{}\n", encode_base64(&key.public())))
        .map_err(|e| format!("writing {}: {e}", pub_path.display()))?;
    Ok((key_path, pub_path))
}

/// Create the secret key file `path` (its directory too) with mode 0600 and
/// `contents`, durably; never over an existing file.
fn write_secret(path: &Path, contents: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    f.write_all(contents)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// `PREFIX.key` and `PREFIX.pub`, refused when either exists.
fn new_pair_paths(prefix: &Path) -> Result<(PathBuf, PathBuf)> {
    let key_path = with_suffix(prefix, "key");
    let pub_path = with_suffix(prefix, "pub");
    for p in [&key_path, &pub_path] {
        if p.exists() {
            return Err(format!(
                "{} exists: refusing to overwrite a key",
                p.display()
            ));
        }
    }
    Ok((key_path, pub_path))
}

fn with_suffix(prefix: &Path, ext: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Read a public key file.
pub fn load_pub(path: &Path) -> Result<PublicKey> {
    PublicKey::load(path).map_err(|e| e.to_string())
}

/// What goes into a key document.
pub struct KeyDocSpec<'a> {
    pub version: u64,
    /// Signers: the root keys of the previous version, and the new root
    /// keys when they change.
    pub signers: &'a [Key],
    /// Root keys listed in the document (defaults to the signers' keys).
    pub root: Vec<PublicKey>,
    pub root_threshold: usize,
    pub release: Vec<PublicKey>,
    pub release_threshold: usize,
}

/// Build and sign a key document; returns the envelope bytes.
pub fn key_document(spec: &KeyDocSpec<'_>) -> Result<Vec<u8>> {
    if spec.version == 0 {
        return Err("key document versions start at 1".into());
    }
    let root = KeySet::new(spec.root.clone(), spec.root_threshold)
        .map_err(|e| format!("root keys: {e}"))?;
    let release = KeySet::new(spec.release.clone(), spec.release_threshold)
        .map_err(|e| format!("release keys: {e}"))?;
    let body = KeyDocumentBody {
        version: spec.version,
        root: RoleEntry::from_keyset(&root),
        release: RoleEntry::from_keyset(&release),
    };
    let payload = serde_json::to_vec_pretty(&body).map_err(|e| e.to_string())?;
    sign_envelope(KEYS_PAYLOAD_TYPE, &payload, spec.signers)
}

/// Highest `keys/N.json` in a release directory, if any.
pub fn latest_key_document(dir: &Path) -> Result<Option<u64>> {
    let keys = dir.join("keys");
    let entries = match std::fs::read_dir(&keys) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", keys.display())),
    };
    let mut best = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(n) = name
            .strip_suffix(".json")
            .and_then(|n| n.parse::<u64>().ok())
        {
            best = best.max(Some(n));
        }
    }
    Ok(best)
}

/// Decode a key document's payload without verifying (for inspect).
pub fn peek_key_document(bytes: &[u8]) -> Result<KeyDocumentBody> {
    let env =
        updraft::envelope::Envelope::parse(bytes, "key document").map_err(|e| e.to_string())?;
    let payload = decode_base64(&env.payload, "key document payload").map_err(|e| e.to_string())?;
    serde_json::from_slice(&payload).map_err(|e| format!("key document payload: {e}"))
}
