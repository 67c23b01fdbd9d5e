//! Who may sign what: root and release keys, thresholds, key rotation.
//!
//! Two roles, as in TUF. **Root** keys are kept offline; a threshold of them
//! signs a versioned *key document* (`keys/N.json`) that lists the root keys
//! and the **release** keys with their thresholds. Release keys sign
//! manifests. A device is provisioned with root public keys and a threshold
//! (or, in the simple mode, directly with release keys). Key document N+1 is
//! accepted only when a threshold of the root keys of N *and* a threshold of
//! its own root keys signed it, so a stolen release key can sign releases
//! until root revokes it but can never change who is trusted, and a single
//! stolen root key below threshold changes nothing.
//!
//! This module decides trust from bytes and keys it is handed. It never
//! fetches, never persists and never reads the clock: the caller stores an
//! accepted document before relying on it.

use serde::{Deserialize, Serialize};

use crate::envelope::Envelope;
use crate::error::{Error, Kind, Result};
use crate::hash::{hex, truncate, unhex};
pub use crate::keys::{KeySet, MAX_KEYS, PublicKey, pem_body};

/// `payloadType` of key documents.
pub const KEYS_PAYLOAD_TYPE: &str = "application/vnd.updraft.keys+json";

/// Key documents larger than this are refused before parsing.
pub const MAX_KEY_DOCUMENT_BYTES: usize = 64 * 1024;

/// Serialised form of a key in a key document.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    #[serde(rename = "type")]
    pub kind: String,
    pub public: String,
}

/// Serialised form of one role.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RoleEntry {
    pub keys: Vec<KeyEntry>,
    pub threshold: usize,
}

/// The payload of a key document, as signed.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct KeyDocumentBody {
    pub version: u64,
    pub root: RoleEntry,
    pub release: RoleEntry,
}

impl RoleEntry {
    pub fn from_keyset(set: &KeySet) -> RoleEntry {
        RoleEntry {
            keys: set
                .keys()
                .iter()
                .map(|k| KeyEntry {
                    kind: "ed25519".into(),
                    public: hex(k.as_bytes()),
                })
                .collect(),
            threshold: set.threshold(),
        }
    }

    pub fn to_keyset(&self, role: &str) -> Result<KeySet> {
        let mut keys = Vec::with_capacity(self.keys.len().min(MAX_KEYS));
        for (i, k) in self.keys.iter().enumerate() {
            if k.kind != "ed25519" {
                return Err(Error::new(
                    Kind::Malformed,
                    format!(
                        "{role} key {}: unsupported type {:?}",
                        i + 1,
                        truncate(&k.kind, 32)
                    ),
                ));
            }
            let raw = unhex(&k.public)
                .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
                .ok_or_else(|| {
                    Error::new(
                        Kind::Malformed,
                        format!("{role} key {}: public key is not 64 hex digits", i + 1),
                    )
                })?;
            keys.push(
                PublicKey::from_bytes(&raw).map_err(|e| e.wrap(format!("{role} key {}", i + 1)))?,
            );
        }
        KeySet::new(keys, self.threshold).map_err(|e| e.wrap(format!("{role} keys")))
    }
}

/// A verified key document.
#[derive(Clone, Debug)]
pub struct KeyDocument {
    pub version: u64,
    pub root: KeySet,
    pub release: KeySet,
    /// The envelope exactly as received, for persistence.
    pub raw: Vec<u8>,
}

/// What the device was provisioned with.
#[derive(Clone, Debug)]
pub enum Anchor {
    /// Root keys: release keys come from key documents. `version` is the key
    /// document version these roots belong to (0 when they precede
    /// `keys/1.json`).
    Root { keys: KeySet, version: u64 },
    /// Simple mode: release keys straight from the configuration.
    Release(KeySet),
}

/// The current trust state: the anchor plus the newest accepted document.
#[derive(Clone, Debug)]
pub struct Trust {
    anchor: Anchor,
    current: Option<KeyDocument>,
}

/// A stored key document that was not used, and why.
#[derive(Clone, Debug)]
pub struct Discarded {
    pub version: u64,
    pub reason: String,
}

impl Trust {
    /// Trust in the provisioned anchor alone.
    pub fn new(anchor: Anchor) -> Trust {
        Trust {
            anchor,
            current: None,
        }
    }

    /// Trust in the anchor and the key documents stored before (`stored`:
    /// each with the version it was stored under, in any order). The chain is walked again from the provisioned roots
    /// exactly as when each document was first accepted, so a device
    /// re-provisioned with other roots, or a database written by someone
    /// else, cannot make it trust what those roots never signed. Documents
    /// older than the anchor are ignored; the first one that does not
    /// chain, and every one after it, is returned as discarded with the
    /// reason (the caller warns and forgets them).
    pub fn restore(anchor: Anchor, stored: &[(u64, Vec<u8>)]) -> (Trust, Vec<Discarded>) {
        let mut trust = Trust::new(anchor);
        let mut docs: Vec<(u64, &[u8])> = Vec::new();
        let mut discarded = Vec::new();
        for (row, raw) in stored {
            match parse_key_document(raw, "stored key document") {
                Ok(doc) if doc.version == *row => docs.push((doc.version, raw)),
                Ok(doc) => discarded.push(Discarded {
                    version: *row,
                    reason: format!("it was stored as v{row} but says it is v{}", doc.version),
                }),
                Err(e) => discarded.push(Discarded {
                    version: *row,
                    reason: e.to_string(),
                }),
            }
        }
        docs.sort_by_key(|(v, _)| *v);
        let mut broken: Option<String> = None;
        for (version, raw) in docs {
            if let Some(why) = &broken {
                discarded.push(Discarded {
                    version,
                    reason: format!("it comes after a document that does not chain ({why})"),
                });
                continue;
            }
            let first = match (&trust.anchor, &trust.current) {
                (Anchor::Release(_), _) => break,
                (Anchor::Root { version: v, .. }, None) => *v,
                (_, Some(doc)) => doc.version + 1,
            };
            if version < first {
                continue;
            }
            let what = format!("stored key document v{version}");
            if let Err(e) = trust.accept(raw, &what) {
                let why = e.to_string();
                discarded.push(Discarded {
                    version,
                    reason: format!("it does not chain from the provisioned root keys: {why}"),
                });
                broken = Some(format!("v{version}"));
            }
        }
        (trust, discarded)
    }

    pub fn anchor(&self) -> &Anchor {
        &self.anchor
    }

    pub fn is_simple(&self) -> bool {
        matches!(self.anchor, Anchor::Release(_))
    }

    /// Version of the newest key document trusted (the anchor's when none).
    pub fn version(&self) -> u64 {
        match (&self.anchor, &self.current) {
            (_, Some(doc)) => doc.version,
            (Anchor::Root { version, .. }, None) => *version,
            (Anchor::Release(_), None) => 0,
        }
    }

    pub fn current(&self) -> Option<&KeyDocument> {
        self.current.as_ref()
    }

    /// Root keys in force.
    pub fn root_keys(&self) -> Option<&KeySet> {
        match (&self.anchor, &self.current) {
            (Anchor::Release(_), _) => None,
            (_, Some(doc)) => Some(&doc.root),
            (Anchor::Root { keys, .. }, None) => Some(keys),
        }
    }

    /// Release keys in force, and a name for them in messages.
    pub fn release_keys(&self) -> Result<(&KeySet, String)> {
        match (&self.anchor, &self.current) {
            (Anchor::Release(keys), _) => Ok((keys, "release keys of the configuration".into())),
            (_, Some(doc)) => Ok((
                &doc.release,
                format!("release keys of key document v{}", doc.version),
            )),
            (Anchor::Root { version, .. }, None) => Err(Error::new(
                Kind::Signature,
                format!(
                    "no key document is trusted yet (provisioned root keys are version {version}); \
                     keys/{}.json is needed to learn the release keys",
                    version + 1
                ),
            )),
        }
    }

    /// The next key document version to fetch, or `None` when release keys
    /// of the current version are already known and nothing newer is named.
    pub fn needs(&self, named: Option<u64>) -> Option<u64> {
        if self.is_simple() {
            return None;
        }
        if self.current.is_none() {
            // Provisioned at version V > 0 without document V: fetch V itself.
            if let Anchor::Root { version, .. } = &self.anchor {
                if *version > 0 {
                    return Some(*version);
                }
            }
            return Some(self.version() + 1);
        }
        match named {
            Some(n) if n > self.version() => Some(self.version() + 1),
            _ => None,
        }
    }

    /// Verify a key document fetched as `what` against the current roots and
    /// make it current. The caller must persist `raw` before relying on it.
    pub fn accept(&mut self, raw: &[u8], what: &str) -> Result<&KeyDocument> {
        let Some(old_roots) = self.root_keys().cloned() else {
            return Err(Error::new(
                Kind::Signature,
                format!(
                    "{what}: key documents are not used in simple mode (release keys come from the configuration)"
                ),
            ));
        };
        if raw.len() > MAX_KEY_DOCUMENT_BYTES {
            return Err(Error::new(
                Kind::Malformed,
                format!(
                    "{what} is {} bytes, larger than the {MAX_KEY_DOCUMENT_BYTES}-byte limit",
                    raw.len()
                ),
            ));
        }
        let current = self.version();
        // Provisioned at V>0 with no document yet: document V itself must be
        // signed by a threshold of the provisioned roots (which are its roots).
        let expected = match (&self.anchor, &self.current) {
            (Anchor::Root { version, .. }, None) if *version > 0 => *version,
            _ => current + 1,
        };
        let env = Envelope::parse(raw, what)?;
        let old_role = if expected == current {
            format!("provisioned root keys (v{current})")
        } else {
            format!("root keys of v{current}")
        };
        env.verify(what, KEYS_PAYLOAD_TYPE, &old_roots, &old_role)?;
        let doc = parse_key_document(raw, what)?;
        if doc.version != expected {
            let why = if doc.version <= current {
                "is not newer than"
            } else {
                "skips versions after"
            };
            return Err(Error::new(
                Kind::Signature,
                format!(
                    "{what} has version {}, which {why} the trusted version {current} (expected {expected})",
                    doc.version
                ),
            ));
        }
        env.verify(
            what,
            KEYS_PAYLOAD_TYPE,
            &doc.root,
            &format!("its own root keys (v{})", doc.version),
        )?;
        Ok(self.current.insert(doc))
    }
}

/// Parse a key document envelope without checking signatures.
fn parse_key_document(raw: &[u8], what: &str) -> Result<KeyDocument> {
    let env = Envelope::parse(raw, what)?;
    if env.payload_type != KEYS_PAYLOAD_TYPE {
        return Err(Error::new(
            Kind::Signature,
            format!(
                "{what} has payloadType {:?}, expected {KEYS_PAYLOAD_TYPE:?}",
                truncate(&env.payload_type, 80)
            ),
        ));
    }
    let payload = env.payload_bytes(what)?;
    let body: KeyDocumentBody = serde_json::from_slice(&payload)
        .map_err(|e| Error::new(Kind::Malformed, format!("{what} payload: {e}")))?;
    if body.version == 0 {
        return Err(Error::new(
            Kind::Malformed,
            format!("{what}: version 0 is reserved for provisioned keys"),
        ));
    }
    Ok(KeyDocument {
        version: body.version,
        root: body.root.to_keyset("root").map_err(|e| e.wrap(what))?,
        release: body
            .release
            .to_keyset("release")
            .map_err(|e| e.wrap(what))?,
        raw: raw.to_vec(),
    })
}
