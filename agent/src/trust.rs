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

/// The key-document cases of the public attack suites (tuf-conformance and
/// the Uptane test vectors), each named after the case it ports; see
/// docs/security.md, "Conformance with the public attack suites".
#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::envelope::Signature;
    use crate::test_support::{Signer, envelope};

    /// Ten keys, numbered 0 to 9 as the suites number theirs.
    fn signers() -> Vec<Signer> {
        (0..10).map(|i| Signer::new(i + 1)).collect()
    }

    /// The release key of every document unless a test says otherwise.
    fn release() -> Signer {
        Signer::new(200)
    }

    fn entry(s: &Signer) -> Value {
        json!({"type": "ed25519", "public": hex(s.public().as_bytes())})
    }

    fn role(all: &[Signer], keys: &[usize], threshold: usize) -> Value {
        json!({"keys": keys.iter().map(|&i| entry(&all[i])).collect::<Vec<_>>(), "threshold": threshold})
    }

    fn body(version: u64, root: Value, release: Value) -> Value {
        json!({"version": version, "root": root, "release": release})
    }

    /// The envelope bytes of `body` signed by `by`, as served.
    fn signed(body: &Value, by: &[&Signer]) -> Vec<u8> {
        let payload = body.to_string();
        serde_json::to_vec(&envelope(KEYS_PAYLOAD_TYPE, payload.as_bytes(), by)).unwrap()
    }

    fn key_set(all: &[Signer], keys: &[usize], threshold: usize) -> KeySet {
        KeySet::new(keys.iter().map(|&i| all[i].public()).collect(), threshold).unwrap()
    }

    /// A device provisioned with roots `keys` (threshold `threshold`) before
    /// key document 1.
    fn provisioned(all: &[Signer], keys: &[usize], threshold: usize) -> Trust {
        Trust::new(Anchor::Root {
            keys: key_set(all, keys, threshold),
            version: 0,
        })
    }

    fn refused(trust: &mut Trust, raw: &[u8], what: &str) -> String {
        let before = trust.version();
        let e = trust
            .accept(raw, what)
            .map(|d| d.version)
            .expect_err("the key document was accepted");
        assert_eq!(trust.version(), before, "trust moved on a refused document");
        e.to_string()
    }

    /// One version of a root-rotation sequence: its root keys and
    /// threshold, the keys that sign it, and, for the last version of a
    /// failing sequence, the part of the refusal that names which
    /// threshold was missed.
    struct Version {
        keys: &'static [usize],
        threshold: usize,
        sigs: &'static [usize],
        refused: Option<&'static str>,
    }

    const fn v(keys: &'static [usize], threshold: usize, sigs: &'static [usize]) -> Version {
        Version {
            keys,
            threshold,
            sigs,
            refused: None,
        }
    }

    const fn fails(
        keys: &'static [usize],
        threshold: usize,
        sigs: &'static [usize],
        why: &'static str,
    ) -> Version {
        Version {
            keys,
            threshold,
            sigs,
            refused: Some(why),
        }
    }

    const OLD: &str = "root keys of v1,";
    const NEW: &str = "its own root keys (v2),";

    /// tuf-conformance `test_root_rotation`, its 15 sequences: key document
    /// N+1 needs a threshold of N's roots and of its own. The device is
    /// provisioned with version 1's roots at `keys_version = 1`, as the
    /// suite's client starts from root v1, and fetches the sequence in
    /// order. Also serves the Uptane vectors
    /// `director_root_rotation_no_new_signature` and
    /// `image_repo_root_rotation_no_new_signature` (the "not signed with
    /// new key" rows).
    #[test]
    fn tuf_test_root_rotation_sequences() {
        let all = signers();
        let rel = release();
        let cases: [(&str, &[Version]); 15] = [
            (
                "1-of-1 key rotation",
                &[v(&[1], 1, &[1]), v(&[2], 1, &[2, 1]), v(&[2], 1, &[2])],
            ),
            (
                "1-of-1 key rotation, unused signatures",
                &[
                    v(&[1], 1, &[3, 1, 4]),
                    v(&[2], 1, &[3, 2, 1, 4]),
                    v(&[2], 1, &[3, 2, 4]),
                ],
            ),
            (
                "3-of-5, different signer combinations",
                &[
                    v(&[0, 1, 2, 3, 4], 3, &[0, 2, 4]),
                    v(&[0, 1, 2, 3, 4], 3, &[0, 4, 1]),
                    v(&[0, 1, 2, 3, 4], 3, &[0, 1, 3]),
                    v(&[0, 1, 2, 3, 4], 3, &[0, 1, 3]),
                ],
            ),
            (
                "3-of-5, one key rotated",
                &[
                    v(&[0, 1, 2, 3, 4], 3, &[0, 2, 4]),
                    v(&[0, 1, 3, 4, 5], 3, &[0, 4, 1]),
                ],
            ),
            (
                "3-of-5, one key rotated with an intermediate step",
                &[
                    v(&[0, 1, 2, 3, 4], 3, &[0, 2, 4]),
                    v(&[0, 1, 3, 4, 5], 3, &[0, 2, 4, 5]),
                    v(&[0, 1, 3, 4, 5], 3, &[0, 4, 5]),
                ],
            ),
            (
                "3-of-5, all keys rotated with an intermediate step",
                &[
                    v(&[0, 1, 2, 3, 4], 3, &[0, 2, 4]),
                    v(&[5, 6, 7, 8, 9], 3, &[0, 2, 4, 5, 6, 7]),
                    v(&[5, 6, 7, 8, 9], 3, &[5, 6, 7]),
                ],
            ),
            (
                "1-of-3 raised to 2-of-3",
                &[v(&[1, 2, 3], 1, &[1]), v(&[1, 2, 3], 2, &[1, 2])],
            ),
            (
                "2-of-3 lowered to 1-of-3",
                &[
                    v(&[1, 2, 3], 2, &[1, 2]),
                    v(&[1, 2, 3], 1, &[1, 2]),
                    v(&[1, 2, 3], 1, &[1]),
                ],
            ),
            (
                "1-of-1 raised to 2-of-2",
                &[v(&[1], 1, &[1]), v(&[1, 2], 2, &[1, 2])],
            ),
            (
                "1-of-1 rotation not signed by the old key",
                &[v(&[1], 1, &[1]), fails(&[2], 1, &[2, 3, 4], OLD)],
            ),
            (
                "1-of-1 rotation not signed by the new key",
                &[v(&[1], 1, &[1]), fails(&[2], 1, &[1, 3, 4], NEW)],
            ),
            (
                "3-of-5, one key rotated, 2 of the new keys signed",
                &[
                    v(&[0, 1, 2, 3, 4], 3, &[0, 2, 4]),
                    fails(&[0, 1, 3, 4, 5], 3, &[0, 2, 4], NEW),
                ],
            ),
            (
                "3-of-5, one key rotated, 2 of the old keys signed",
                &[
                    v(&[0, 1, 2, 3, 4], 3, &[0, 2, 4]),
                    fails(&[0, 1, 3, 4, 5], 3, &[0, 4, 5], OLD),
                ],
            ),
            (
                "1-of-3 raised to 2-of-3, new threshold not met",
                &[v(&[1, 2, 3], 1, &[1]), fails(&[1, 2, 3], 2, &[2], NEW)],
            ),
            (
                "2-of-3 lowered to 1-of-3, old threshold not met",
                &[v(&[1, 2, 3], 2, &[1, 2]), fails(&[1, 2, 3], 1, &[1], OLD)],
            ),
        ];
        for (name, versions) in cases {
            let first = &versions[0];
            let mut trust = Trust::new(Anchor::Root {
                keys: key_set(&all, first.keys, first.threshold),
                version: 1,
            });
            for (i, ver) in versions.iter().enumerate() {
                let n = i as u64 + 1;
                let doc = body(
                    n,
                    role(&all, ver.keys, ver.threshold),
                    json!({"keys": [entry(&rel)], "threshold": 1}),
                );
                let by: Vec<&Signer> = ver.sigs.iter().map(|&s| &all[s]).collect();
                let raw = signed(&doc, &by);
                let what = format!("keys/{n}.json");
                match ver.refused {
                    None => {
                        let accepted = trust.accept(&raw, &what).map(|d| d.version);
                        assert_eq!(accepted.ok(), Some(n), "{name}: version {n} refused");
                    }
                    Some(why) => {
                        let e = refused(&mut trust, &raw, &what);
                        assert!(e.contains(why), "{name}: version {n}: {e}");
                        assert_eq!(trust.version(), n - 1, "{name}");
                    }
                }
            }
        }
    }

    /// tuf-conformance `test_non_root_rotations`, its 10 cases: key
    /// document 2 hands the release role to a new key set, and a manifest
    /// signed by the case's signers is accepted exactly when a threshold of
    /// that set signed it. (The suite rotates timestamp, snapshot and
    /// targets keys; updraft's release keys are all three.)
    #[test]
    fn tuf_test_non_root_rotations_cases() {
        let all = signers();
        let root = Signer::new(100);
        let roots = [root];
        /// Name, release keys, threshold, signers, accepted.
        type Case = (
            &'static str,
            &'static [usize],
            usize,
            &'static [usize],
            bool,
        );
        let cases: [Case; 10] = [
            ("1-of-1 key rotation", &[2], 1, &[2], true),
            (
                "1-of-1 key rotation, unused signatures",
                &[1],
                1,
                &[3, 1, 4],
                true,
            ),
            (
                "1-of-1 rotation not signed by the new key",
                &[2],
                1,
                &[1, 3, 4],
                false,
            ),
            (
                "3-of-5, 2 of the expected keys signed",
                &[0, 1, 3, 4, 5],
                3,
                &[0, 2, 4],
                false,
            ),
            ("3-of-5, 2 signatures", &[0, 1, 3, 4, 5], 3, &[0, 4], false),
            (
                "3-of-5, first combination",
                &[0, 1, 2, 3, 4],
                3,
                &[0, 2, 4],
                true,
            ),
            (
                "3-of-5, second combination",
                &[0, 1, 2, 3, 4],
                3,
                &[0, 4, 1],
                true,
            ),
            (
                "3-of-5, third combination",
                &[0, 1, 2, 3, 4],
                3,
                &[0, 1, 3],
                true,
            ),
            (
                "3-of-5, fourth combination",
                &[0, 1, 2, 3, 4],
                3,
                &[1, 2, 3],
                true,
            ),
            (
                "3-of-5, fifth combination",
                &[0, 1, 2, 3, 4],
                3,
                &[2, 3, 4],
                true,
            ),
        ];
        const MANIFEST: &str = "application/vnd.updraft.manifest+json";
        for (name, keys, threshold, sigs, accepted) in cases {
            let mut trust = Trust::new(Anchor::Root {
                keys: key_set(&roots, &[0], 1),
                version: 0,
            });
            let one = body(1, role(&roots, &[0], 1), role(&all, &[0], 1));
            trust
                .accept(&signed(&one, &[&roots[0]]), "keys/1.json")
                .unwrap();
            let two = body(2, role(&roots, &[0], 1), role(&all, keys, threshold));
            trust
                .accept(&signed(&two, &[&roots[0]]), "keys/2.json")
                .unwrap();
            let by: Vec<&Signer> = sigs.iter().map(|&s| &all[s]).collect();
            let manifest = envelope(MANIFEST, b"{\"serial\": 2}", &by);
            let (release, role_name) = trust.release_keys().unwrap();
            let verified = manifest.verify("manifest", MANIFEST, release, &role_name);
            match (accepted, verified) {
                (true, Ok(_)) => {}
                (false, Err(e)) => {
                    let expected = format!(
                        "of the {} release keys of key document v2, threshold is {threshold}",
                        keys.len()
                    );
                    assert!(e.to_string().contains(&expected), "{name}: {e}");
                }
                (want, got) => panic!(
                    "{name}: expected accepted={want}, got {:?}",
                    got.map(|_| ())
                ),
            }
        }
    }

    /// tuf-conformance `test_duplicate_keys`: a document listing one key
    /// several times cannot fake a threshold with it; it is refused whole,
    /// in the release role and in the root role.
    #[test]
    fn tuf_test_duplicate_keys_a_key_listed_twice_refuses_the_document() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let doc = body(1, role(&all, &[0], 1), role(&all, &[1, 1, 1], 2));
        let e = refused(&mut trust, &signed(&doc, &[&all[0]]), "keys/1.json");
        assert!(e.contains("keys/1.json: release keys: key "), "{e}");
        assert!(e.contains("is listed twice"), "{e}");
        let doc = body(1, role(&all, &[0, 0, 0], 2), role(&all, &[1], 1));
        let e = refused(
            &mut trust,
            &signed(&doc, &[&all[0], &all[0], &all[0]]),
            "keys/1.json",
        );
        assert!(
            e.contains("is listed twice") || e.contains("signed by 1 of"),
            "{e}"
        );
    }

    /// tuf-conformance `test_keytype_and_scheme`: a second root key's
    /// signature replaced by 64 wrong bytes leaves the document below its
    /// threshold of 2; a key of a type other than ed25519 refuses the
    /// document (updraft verifies ed25519 only, so the suite's rsa and
    /// ecdsa acceptance half does not apply).
    #[test]
    fn tuf_test_keytype_and_scheme_a_corrupted_second_signature_or_another_key_type_is_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0, 1], 2);
        let doc = body(1, role(&all, &[0, 1], 2), role(&all, &[2], 1));
        let mut env = envelope(
            KEYS_PAYLOAD_TYPE,
            doc.to_string().as_bytes(),
            &[&all[0], &all[1]],
        );
        env.signatures[1].sig = crate::keys::encode_base64(&[0x42; 64]);
        let e = refused(
            &mut trust,
            &serde_json::to_vec(&env).unwrap(),
            "keys/1.json",
        );
        assert!(
            e.contains("keys/1.json is signed by 1 of the 2 root keys of v0, threshold is 2"),
            "{e}"
        );
        for kind in ["rsa", "ecdsa", "ecdsa-sha2-nistp256"] {
            let mut doc = body(1, role(&all, &[0, 1], 2), role(&all, &[2], 1));
            doc["release"]["keys"][0]["type"] = json!(kind);
            let e = refused(
                &mut trust,
                &signed(&doc, &[&all[0], &all[1]]),
                "keys/1.json",
            );
            assert!(
                e.contains(&format!("release key 1: unsupported type {kind:?}")),
                "{e}"
            );
        }
    }

    /// tuf-conformance `test_custom_fields`, key-document half: an unknown
    /// field at the top, in a role or in a key refuses the document, where
    /// TUF accepts it. A key document decides who is trusted; a field this
    /// release does not understand could be a restriction it would
    /// silently drop, so it is refused rather than ignored. (Manifests
    /// ignore unknown fields: `hostile_install.rs::tuf_test_custom_fields_in_a_manifest_are_ignored`.)
    #[test]
    fn tuf_test_custom_fields_in_a_key_document_are_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let mut top = body(1, role(&all, &[0], 1), role(&all, &[1], 1));
        top["comment"] = json!("hello");
        let mut in_role = body(1, role(&all, &[0], 1), role(&all, &[1], 1));
        in_role["release"]["expires"] = json!("2030-01-01T00:00:00Z");
        let mut in_key = body(1, role(&all, &[0], 1), role(&all, &[1], 1));
        in_key["root"]["keys"][0]["keyid_hash_algorithms"] = json!(["sha256"]);
        for (doc, field) in [
            (top, "comment"),
            (in_role, "expires"),
            (in_key, "keyid_hash_algorithms"),
        ] {
            let e = refused(&mut trust, &signed(&doc, &[&all[0]]), "keys/1.json");
            assert!(
                e.contains(&format!("keys/1.json payload: unknown field `{field}`")),
                "{e}"
            );
        }
    }

    /// Uptane `director_root_zero_threshold` (and
    /// `image_repo_root_zero_threshold`): a root threshold of 0 refuses the
    /// document, however it is signed.
    #[test]
    fn uptane_director_root_zero_threshold_is_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let doc = body(1, role(&all, &[0], 0), role(&all, &[1], 1));
        let e = refused(&mut trust, &signed(&doc, &[&all[0]]), "keys/1.json");
        assert!(
            e.contains("keys/1.json: root keys: threshold 0 is impossible with 1 key(s)"),
            "{e}"
        );
        let unsigned_by_own = body(1, role(&all, &[1], 0), role(&all, &[1], 1));
        let e = refused(
            &mut trust,
            &signed(&unsigned_by_own, &[&all[0]]),
            "keys/1.json",
        );
        assert!(e.contains("threshold 0 is impossible"), "{e}");
    }

    /// Uptane `director_targets_zero_threshold` (and
    /// `image_repo_targets_zero_threshold`,
    /// `image_repo_timestamp_zero_threshold`: the manifest is both): a
    /// release threshold of 0 refuses the document. The simple-mode
    /// `[trust] threshold = 0` is `hostile_install.rs::tuf_test_invalid_initial_root_refuses_to_work`.
    #[test]
    fn uptane_director_targets_zero_threshold_is_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let doc = body(1, role(&all, &[0], 1), role(&all, &[1], 0));
        let e = refused(&mut trust, &signed(&doc, &[&all[0]]), "keys/1.json");
        assert!(
            e.contains("keys/1.json: release keys: threshold 0 is impossible with 1 key(s)"),
            "{e}"
        );
    }

    /// Uptane `director_root_unmet_threshold` (and
    /// `image_repo_root_unmet_threshold`): a document naming roots A and B
    /// with threshold 2, signed by A alone, satisfies the provisioned
    /// roots (A, 1 of 1) but not its own.
    #[test]
    fn uptane_director_root_unmet_threshold_is_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let doc = body(1, role(&all, &[0, 1], 2), role(&all, &[2], 1));
        let e = refused(&mut trust, &signed(&doc, &[&all[0]]), "keys/1.json");
        assert!(
            e.contains(
                "keys/1.json is signed by 1 of the 2 its own root keys (v1), threshold is 2"
            ),
            "{e}"
        );
    }

    /// Uptane `director_root_non_unique_signatures` (and
    /// `image_repo_root_non_unique_signatures`): one root's signature twice,
    /// under different key ids, counts once toward a threshold of 2. At
    /// threshold 1 the duplicate is accepted: the one key that signed meets
    /// it, and refusing would let anyone on the path block a valid document
    /// by copying an entry (the vector expects a refusal there).
    #[test]
    fn uptane_director_root_non_unique_signatures_count_once() {
        let all = signers();
        let mut trust = provisioned(&all, &[0, 1], 2);
        let doc = body(1, role(&all, &[0, 1], 2), role(&all, &[2], 1));
        let mut env = envelope(KEYS_PAYLOAD_TYPE, doc.to_string().as_bytes(), &[&all[0]]);
        let twice = Signature {
            keyid: all[1].public().keyid(),
            sig: env.signatures[0].sig.clone(),
        };
        env.signatures.push(twice);
        let raw = serde_json::to_vec(&env).unwrap();
        let e = refused(&mut trust, &raw, "keys/1.json");
        assert!(
            e.contains("keys/1.json is signed by 1 of the 2 root keys of v0, threshold is 2"),
            "{e}"
        );
        let mut trust = provisioned(&all, &[0], 1);
        let doc = body(1, role(&all, &[0], 1), role(&all, &[2], 1));
        let raw = signed(&doc, &[&all[0], &all[0]]);
        assert_eq!(
            trust.accept(&raw, "keys/1.json").map(|d| d.version).ok(),
            Some(1)
        );
    }

    /// Uptane `director_root_unsigned` (and `image_repo_root_unsigned`): a
    /// key document with no signatures is refused before anything else.
    #[test]
    fn uptane_director_root_unsigned_is_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let doc = body(1, role(&all, &[0], 1), role(&all, &[1], 1));
        let mut env = envelope(KEYS_PAYLOAD_TYPE, doc.to_string().as_bytes(), &[&all[0]]);
        env.signatures.clear();
        let e = refused(
            &mut trust,
            &serde_json::to_vec(&env).unwrap(),
            "keys/1.json",
        );
        assert_eq!(e, "keys/1.json carries no signatures");
    }

    /// Uptane `director_root_rotation_version_unchanged` (and
    /// `image_repo_root_rotation_version_unchanged`): trusting version 1, a
    /// re-signed document that still says version 1, with other release
    /// keys, served as `keys/2.json`, is refused.
    #[test]
    fn uptane_director_root_rotation_version_unchanged_is_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let one = body(1, role(&all, &[0], 1), role(&all, &[1], 1));
        trust
            .accept(&signed(&one, &[&all[0]]), "keys/1.json")
            .unwrap();
        let again = body(1, role(&all, &[0], 1), role(&all, &[2], 1));
        let e = refused(&mut trust, &signed(&again, &[&all[0]]), "keys/2.json");
        assert!(
            e.contains("keys/2.json has version 1, which is not newer than the trusted version 1 (expected 2)"),
            "{e}"
        );
        let (release, _) = trust.release_keys().unwrap();
        assert_eq!(
            release.keys(),
            &[all[1].public()][..],
            "the re-signed release keys were taken"
        );
    }

    /// Uptane `director_root_role_type_mismatch` (and
    /// `image_repo_root_role_type_mismatch`): a valid key-document payload,
    /// signed by the root, but under the manifest's payload type.
    #[test]
    fn uptane_director_root_role_type_mismatch_is_refused() {
        let all = signers();
        let mut trust = provisioned(&all, &[0], 1);
        let doc = body(1, role(&all, &[0], 1), role(&all, &[1], 1));
        let env = envelope(
            "application/vnd.updraft.manifest+json",
            doc.to_string().as_bytes(),
            &[&all[0]],
        );
        let e = refused(
            &mut trust,
            &serde_json::to_vec(&env).unwrap(),
            "keys/1.json",
        );
        assert_eq!(
            e,
            "keys/1.json has payloadType \"application/vnd.updraft.manifest+json\", expected \"application/vnd.updraft.keys+json\""
        );
    }
}
