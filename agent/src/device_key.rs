//! The device's own identity key: an ed25519 key pair made on first start
//! in the state directory, with which the device signs its reports, so a
//! fleet server can tell the device's words from anyone else's.
//!
//! Why: the report server is reached over TLS, but what it stores is only
//! as trustworthy as every hop and proxy on the way; a signature made on
//! the device keeps its meaning wherever a report is copied.
//!
//! This module owns the key files — `device-key.pem` (PKCS#8 PEM, the form
//! `openssl genpkey -algorithm ed25519` writes, mode 0600) and
//! `device-key.pub` (SubjectPublicKeyInfo PEM, mode 0644, for readers
//! without access to the private key) — and signing with the key. A key
//! that cannot be read or parsed leaves the device running without one
//! ([`Identity::Unusable`]: reports go out unsigned and the status says
//! why); it must never overwrite or remove an existing key file, since a
//! fleet server may know that key. The key is a plain file: sealing it to
//! a TPM is not done.

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey};

use crate::fsutil::{KeyFileError, load_or_make_key};
use crate::keys::{PublicKey, encode_base64, pem_body};

/// The private key's file name in `system.state_dir`.
pub const KEY_FILE: &str = "device-key.pem";
/// The public key's file name in `system.state_dir`.
pub const PUB_FILE: &str = "device-key.pub";

// PKCS#8 v1 prefix of an ed25519 private key (RFC 8410), then the 32-byte
// seed.
const PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A usable device key.
pub struct DeviceKey {
    signing: SigningKey,
    public: PublicKey,
}

impl std::fmt::Debug for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceKey({})", self.public.keyid())
    }
}

impl DeviceKey {
    /// The key of a 32-byte seed.
    pub fn from_seed(seed: &[u8; 32]) -> std::result::Result<DeviceKey, String> {
        let signing = SigningKey::from_bytes(seed);
        let public =
            PublicKey::from_bytes(signing.verifying_key().as_bytes()).map_err(|e| e.to_string())?;
        Ok(DeviceKey { signing, public })
    }

    /// Parse the private key file's text.
    pub fn from_pem(text: &str) -> std::result::Result<DeviceKey, String> {
        let der = pem_body(text, "PRIVATE KEY").map_err(|e| e.to_string())?;
        if der.len() != 48 || der[..16] != PKCS8_PREFIX {
            return Err("not an ed25519 PKCS#8 private key".into());
        }
        let mut seed = [0u8; 32];
        seed.copy_from_slice(&der[16..]);
        DeviceKey::from_seed(&seed)
    }

    fn to_pem(&self) -> String {
        let mut der = PKCS8_PREFIX.to_vec();
        der.extend_from_slice(self.signing.as_bytes());
        format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            encode_base64(&der)
        )
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// An ed25519 signature over `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }
}

/// The device's identity as found at start.
#[derive(Debug)]
pub enum Identity {
    Usable(Box<DeviceKey>),
    /// Why there is no usable key, naming the file.
    Unusable(String),
}

impl Identity {
    pub fn key(&self) -> Option<&DeviceKey> {
        match self {
            Identity::Usable(k) => Some(k),
            Identity::Unusable(_) => None,
        }
    }

    /// What `updraft status` shows.
    pub fn view(&self) -> IdentityView {
        match self {
            Identity::Usable(k) => IdentityView::of(k.public()),
            Identity::Unusable(why) => IdentityView {
                unusable: Some(why.clone()),
                ..IdentityView::default()
            },
        }
    }
}

/// The identity as `updraft status` shows it: the public key (raw, in
/// base64) and its key id, or why there is none.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq)]
pub struct IdentityView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
}

impl IdentityView {
    fn of(public: &PublicKey) -> IdentityView {
        IdentityView {
            public_key: Some(encode_base64(public.as_bytes())),
            keyid: Some(public.keyid()),
            unusable: None,
        }
    }

    /// The status line: the key, or `unusable: <reason>`.
    pub fn line(&self) -> String {
        match (&self.public_key, &self.unusable) {
            (Some(k), _) => format!("ed25519 {k}"),
            (None, Some(why)) => format!("unusable: {why}"),
            (None, None) => "none yet (made when the daemon starts)".into(),
        }
    }
}

fn paths(state_dir: &Path) -> (PathBuf, PathBuf) {
    (state_dir.join(KEY_FILE), state_dir.join(PUB_FILE))
}

/// The device key in `state_dir`, made when there is none. An existing
/// file that cannot be read or parsed is left as it is and reported.
pub fn load_or_create(state_dir: &Path) -> Identity {
    let (key_path, pub_path) = paths(state_dir);
    let loaded = load_or_make_key(
        &key_path,
        &pub_path,
        DeviceKey::from_pem,
        || {
            let seed = crate::random::bytes::<32>().map_err(|e| e.to_string())?;
            let key = DeviceKey::from_seed(&seed)?;
            let pem = key.to_pem();
            Ok((key, pem))
        },
        |k| k.public().to_pem(),
    );
    match loaded {
        Ok((key, made)) => {
            if made {
                log::info!(
                    "made device key {} (key id {}) for signing reports",
                    key_path.display(),
                    key.public().keyid()
                );
            }
            Identity::Usable(Box::new(key))
        }
        Err(KeyFileError::Read(e)) => unusable(&key_path, &e.to_string()),
        Err(KeyFileError::Parse(e) | KeyFileError::Make(e)) => unusable(&key_path, &e),
    }
}

fn unusable(path: &Path, why: &str) -> Identity {
    let why = format!("device key {}: {why}", path.display());
    log::warn!("{why}; reports are sent unsigned (the file is left as it is)");
    Identity::Unusable(why)
}

/// The identity as a reader that must not make a key sees it (the offline
/// `updraft status`): the key file, or when that may not be read, the
/// public file; `None` before the daemon made a key.
pub fn inspect(state_dir: &Path) -> Option<IdentityView> {
    let (key_path, pub_path) = paths(state_dir);
    match std::fs::read_to_string(&key_path) {
        Ok(text) => Some(match DeviceKey::from_pem(&text) {
            Ok(k) => IdentityView::of(k.public()),
            Err(e) => IdentityView {
                unusable: Some(format!("device key {}: {e}", key_path.display())),
                ..IdentityView::default()
            },
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => match std::fs::read_to_string(&pub_path)
            .ok()
            .and_then(|t| PublicKey::from_pem(&t).ok())
        {
            Some(p) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Some(IdentityView::of(&p))
            }
            _ => Some(IdentityView {
                unusable: Some(format!("device key {}: {e}", key_path.display())),
                ..IdentityView::default()
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_first_start_makes_a_private_key_only_its_owner_reads_and_later_starts_keep_it() {
        let dir = crate::test_support::scratch_dir("device_key", "first-start");
        let Identity::Usable(first) = load_or_create(&dir) else {
            panic!("no key made");
        };
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let Identity::Usable(again) = load_or_create(&dir) else {
            panic!("key not read back");
        };
        assert_eq!(first.public(), again.public());
        let public = std::fs::read_to_string(dir.join(PUB_FILE)).unwrap();
        assert_eq!(PublicKey::from_pem(&public).unwrap(), *first.public());
        assert_eq!(inspect(&dir), Some(first_view(&first)));
        let sig = first.sign(b"report");
        assert!(first.public().verify(b"report", &sig));
        assert!(!first.public().verify(b"other", &sig));
    }

    fn first_view(k: &DeviceKey) -> IdentityView {
        IdentityView::of(k.public())
    }

    #[test]
    fn a_damaged_key_is_reported_and_never_replaced() {
        // (file content, words the reason must contain)
        let cases: [(&[u8], &str); 4] = [
            (b"", "PRIVATE KEY"),
            (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "PKCS#8"),
            (b"\xff\xfe not text", "UTF-8"),
            (b"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n", "PRIVATE KEY"),
        ];
        for (i, (content, words)) in cases.into_iter().enumerate() {
            let dir = crate::test_support::scratch_dir("device_key", &format!("damaged-{i}"));
            std::fs::write(dir.join(KEY_FILE), content).unwrap();
            let Identity::Unusable(why) = load_or_create(&dir) else {
                panic!("case {i}: a damaged key was used");
            };
            assert!(
                why.contains(KEY_FILE) && why.contains(words),
                "case {i}: {why}"
            );
            assert_eq!(
                std::fs::read(dir.join(KEY_FILE)).unwrap(),
                content,
                "case {i}"
            );
            let view = inspect(&dir).unwrap();
            assert!(view.line().starts_with("unusable: device key"), "case {i}");
            assert_eq!(view.public_key, None);
        }
    }

    #[test]
    fn no_key_yet_is_shown_as_such_and_not_made_by_a_reader() {
        let dir = crate::test_support::scratch_dir("device_key", "reader");
        assert_eq!(inspect(&dir), None);
        assert!(!dir.join(KEY_FILE).exists());
    }
}
