//! Build provenance: an in-toto Statement (v1) with a SLSA provenance
//! predicate, in a DSSE envelope signed by a builder key, that a release
//! may carry beside its manifest ([docs/manifest.md](../../../docs/manifest.md#provenance-attestations)).
//!
//! The signed manifest names the attestation file (`attestation`: url,
//! size, sha256) so it travels the ways artifacts do (directory, server
//! and mirrors, bundle, links). A device configured with builder keys
//! (`[provenance]`) requires one: signed by its builders, naming every
//! artifact it may download from the release and the image the slot ends
//! up holding ([`attested`]). This module owns the statement's wire form,
//! its bounds and that rule. It reads only the subjects and the builder
//! id; the rest of the predicate is opaque and bounded by the file's size.
//!
//! Like [`crate::manifest`] it is pure: bytes and keys in, values out. It
//! never fetches the file, never decides what a refusal leads to, and
//! never trusts an attestation that has not verified under the builder
//! keys: [`verify`] is the only way to a [`Statement`] from bytes outside
//! a test.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Manifest;
use crate::envelope::Envelope;
use crate::error::{Error, Kind, Result};
use crate::hash::{Sha256, truncate};
use crate::keys::KeySet;

/// `payloadType` of an in-toto attestation in DSSE.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The statement's `_type`.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The only `predicateType` read.
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
/// The largest attestation file accepted, envelope and all.
pub const MAX_ATTESTATION_BYTES: u64 = 256 * 1024;
/// At most this many subjects.
pub const MAX_SUBJECTS: usize = 1024;
/// Longest subject name and builder id.
pub const MAX_NAME_LEN: usize = 1024;

/// Where the attestation is, as the signed manifest names it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AttestationRef {
    pub url: String,
    pub size: u64,
    pub sha256: Sha256,
}

impl AttestationRef {
    /// The structural rules: a url below the manifest, 1 to
    /// [`MAX_ATTESTATION_BYTES`] bytes.
    pub fn check(&self) -> Result<()> {
        super::check_url(&self.url, "attestation url")?;
        if self.size == 0 || self.size > MAX_ATTESTATION_BYTES {
            return Err(Error::new(
                Kind::Malformed,
                format!(
                    "manifest: attestation is {} bytes; an attestation is 1 to {MAX_ATTESTATION_BYTES} bytes",
                    self.size
                ),
            ));
        }
        Ok(())
    }
}

/// One artifact the statement is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub name: String,
    pub sha256: Sha256,
}

/// What the device reads of a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub subjects: Vec<Subject>,
    /// `predicate.runDetails.builder.id`, when given.
    pub builder_id: Option<String>,
}

#[derive(Deserialize)]
struct WireStatement {
    #[serde(rename = "_type")]
    kind: String,
    subject: Vec<WireSubject>,
    #[serde(rename = "predicateType")]
    predicate_type: String,
    #[serde(default)]
    predicate: Value,
}

#[derive(Deserialize)]
struct WireSubject {
    #[serde(default)]
    name: String,
    #[serde(default)]
    digest: serde_json::Map<String, Value>,
}

fn malformed(msg: String) -> Error {
    Error::new(Kind::Malformed, format!("attestation: {msg}"))
}

impl Statement {
    /// Parse a statement from the (verified) payload. Refused: another
    /// `_type` or `predicateType`, no subjects or more than
    /// [`MAX_SUBJECTS`], a subject without a sha256 digest of 64 hex
    /// digits, one name listed twice, an overlong name or builder id.
    pub fn parse(payload: &[u8]) -> Result<Statement> {
        if payload.len() as u64 > MAX_ATTESTATION_BYTES {
            return Err(malformed(format!(
                "statement is {} bytes, larger than the {MAX_ATTESTATION_BYTES}-byte limit",
                payload.len()
            )));
        }
        let w: WireStatement = serde_json::from_slice(payload)
            .map_err(|e| malformed(format!("statement is not valid: {e}")))?;
        if w.kind != STATEMENT_TYPE {
            return Err(malformed(format!(
                "_type is {:?}, expected {STATEMENT_TYPE:?}",
                truncate(&w.kind, 80)
            )));
        }
        if w.predicate_type != PREDICATE_TYPE {
            return Err(malformed(format!(
                "predicateType is {:?}, expected {PREDICATE_TYPE:?}",
                truncate(&w.predicate_type, 80)
            )));
        }
        if w.subject.is_empty() || w.subject.len() > MAX_SUBJECTS {
            return Err(malformed(format!(
                "{} subjects listed; a statement names 1 to {MAX_SUBJECTS}",
                w.subject.len()
            )));
        }
        let mut names = BTreeSet::new();
        let mut subjects = Vec::with_capacity(w.subject.len());
        for (i, s) in w.subject.into_iter().enumerate() {
            if s.name.len() > MAX_NAME_LEN || s.name.chars().any(char::is_control) {
                return Err(malformed(format!(
                    "subject {i} name is longer than {MAX_NAME_LEN} bytes or has control characters"
                )));
            }
            let sha256 = match s.digest.get("sha256") {
                Some(Value::String(hex)) => Sha256::from_hex(hex)
                    .map_err(|e| malformed(format!("subject {i} digest sha256: {e}")))?,
                Some(_) => {
                    return Err(malformed(format!(
                        "subject {i} digest sha256 is not a string"
                    )));
                }
                None => return Err(malformed(format!("subject {i} has no sha256 digest"))),
            };
            if !names.insert(s.name.clone()) {
                return Err(malformed(format!(
                    "subject {:?} is listed twice",
                    truncate(&s.name, 80)
                )));
            }
            subjects.push(Subject {
                name: s.name,
                sha256,
            });
        }
        let builder_id = match w.predicate.pointer("/runDetails/builder/id") {
            None => None,
            Some(Value::String(id))
                if id.len() <= MAX_NAME_LEN && !id.chars().any(char::is_control) =>
            {
                Some(id.clone())
            }
            Some(_) => {
                return Err(malformed(format!(
                    "predicate.runDetails.builder.id is not a string of at most {MAX_NAME_LEN} bytes"
                )));
            }
        };
        Ok(Statement {
            subjects,
            builder_id,
        })
    }
}

/// Check the envelope's size and signatures against the builder keys and
/// parse its statement.
pub fn verify(raw: &[u8], builders: &KeySet) -> Result<Statement> {
    if raw.len() as u64 > MAX_ATTESTATION_BYTES {
        return Err(malformed(format!(
            "{} bytes, larger than the {MAX_ATTESTATION_BYTES}-byte limit",
            raw.len()
        )));
    }
    let env = Envelope::parse(raw, "attestation")?;
    let v = env.verify(
        "attestation",
        PAYLOAD_TYPE,
        builders,
        "configured builder keys",
    )?;
    Statement::parse(&v.payload)
}

/// The hashes a statement must name for `m`: the image the slot ends up
/// holding, the full artifact, each delta and each component's artifact
/// (an app's or boot tree's index names its files by hash), each with
/// what it is.
pub fn required(m: &Manifest) -> Vec<(String, Sha256)> {
    let mut out = vec![
        ("image".to_string(), m.image.sha256),
        ("artifact".to_string(), m.artifact.sha256),
    ];
    for (i, d) in m.deltas.iter().enumerate() {
        out.push((format!("delta {i}"), d.sha256));
    }
    for c in &m.components {
        out.push((
            format!("component {} {}", c.name, c.kind().as_str()),
            c.artifact().sha256,
        ));
    }
    out
}

/// What a statement fails to name, in manifest order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing(pub Vec<(String, Sha256)>);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("attestation does not name ")?;
        for (i, (what, sha)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{what} sha256 {}", sha.short())?;
        }
        Ok(())
    }
}

/// The rule: every hash [`required`] for `m` is the sha256 of some subject
/// of `s` (names are the builder's and are not compared).
pub fn attested(m: &Manifest, s: &Statement) -> std::result::Result<(), Missing> {
    let named: BTreeSet<Sha256> = s.subjects.iter().map(|s| s.sha256).collect();
    let missing: Vec<_> = required(m)
        .into_iter()
        .filter(|(_, sha)| !named.contains(sha))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Missing(missing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::component::{CommandPart, Component, Part};
    use crate::manifest::{Artifact, Delta, Frame, Image, Release};
    use crate::test_support::{Signer, envelope};
    use crate::timestamp::Timestamp;

    fn h(s: &str) -> Sha256 {
        Sha256::of(s.as_bytes())
    }

    fn artifact(url: &str, sha: Sha256) -> Artifact {
        Artifact {
            url: url.into(),
            size: 10,
            sha256: sha,
            frames: vec![Frame {
                offset: 0,
                size: 10,
                out_size: 10,
                out_sha256: sha,
            }],
        }
    }

    fn manifest() -> Manifest {
        Manifest {
            spec_version: 1,
            serial: 1,
            issued: Timestamp(1_800_000_000),
            expires: Timestamp(1_900_000_000),
            keys_version: None,
            channel: Some("stable".into()),
            security_version: 0,
            release: Release {
                version: "1.0".into(),
                compatible: vec!["rpi4".into()],
                rollout: None,
            },
            image: Image {
                size: 10,
                sha256: h("image"),
            },
            artifact: artifact("artifacts/a.zst", h("artifact")),
            deltas: vec![Delta {
                from_size: 10,
                from_sha256: h("old"),
                url: "artifacts/d.bsdiff.zst".into(),
                size: 5,
                sha256: h("delta"),
            }],
            attestation: None,
            encryption: None,
            slot: None,
            components: vec![Component {
                name: "cfg".into(),
                version: "1".into(),
                part: Part::Command(CommandPart {
                    artifact: artifact("artifacts/c.zst", h("command")),
                }),
            }],
        }
    }

    fn statement(names: &[&str]) -> Statement {
        Statement {
            subjects: names
                .iter()
                .map(|n| Subject {
                    name: format!("{n}.bin"),
                    sha256: h(n),
                })
                .collect(),
            builder_id: None,
        }
    }

    /// The rule, row by row: each hash the device may fetch or install
    /// must be a subject's; extra subjects and subject names do not matter.
    #[test]
    fn every_artifact_and_the_image_must_be_named() {
        let m = manifest();
        let all = ["image", "artifact", "delta", "command"];
        assert_eq!(attested(&m, &statement(&all)), Ok(()));
        assert_eq!(
            attested(
                &m,
                &statement(&["image", "artifact", "delta", "command", "other"])
            ),
            Ok(())
        );
        let rows: [(&[&str], &[&str]); 5] = [
            (&["artifact", "delta", "command"], &["image"]),
            (&["image", "delta", "command"], &["artifact"]),
            (&["image", "artifact", "command"], &["delta 0"]),
            (&["image", "artifact", "delta"], &["component cfg command"]),
            (
                &["other"],
                &["image", "artifact", "delta 0", "component cfg command"],
            ),
        ];
        for (named, missing) in rows {
            let e = attested(&m, &statement(named)).unwrap_err();
            let got: Vec<&str> = e.0.iter().map(|(w, _)| w.as_str()).collect();
            assert_eq!(got, missing, "named {named:?}");
        }
        let e = attested(&m, &statement(&["artifact", "delta", "command"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "attestation does not name image sha256 {}",
                h("image").short()
            )
        );
    }

    #[test]
    fn a_release_without_deltas_or_components_needs_image_and_artifact() {
        let mut m = manifest();
        m.deltas.clear();
        m.components.clear();
        assert_eq!(attested(&m, &statement(&["image", "artifact"])), Ok(()));
    }

    fn payload(subjects: Value) -> Value {
        serde_json::json!({
            "_type": STATEMENT_TYPE,
            "subject": subjects,
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "buildDefinition": {"buildType": "https://example.com/b", "externalParameters": {}},
                "runDetails": {"builder": {"id": "https://ci.example.com/builder"}}
            }
        })
    }

    fn good() -> Value {
        payload(serde_json::json!([
            {"name": "a.img", "digest": {"sha256": h("image").to_hex(), "sha512": "ab"}},
            {"name": "a.zst", "digest": {"sha256": h("artifact").to_hex()}}
        ]))
    }

    fn parse(v: &Value) -> Result<Statement> {
        Statement::parse(&serde_json::to_vec(v).unwrap())
    }

    #[test]
    fn a_statement_yields_its_subjects_and_builder() {
        let s = parse(&good()).unwrap();
        assert_eq!(s.subjects.len(), 2);
        assert_eq!(s.subjects[0].sha256, h("image"));
        assert_eq!(
            s.builder_id.as_deref(),
            Some("https://ci.example.com/builder")
        );
    }

    /// Hostile statements are refused with the field named.
    #[test]
    fn hostile_statements_are_refused() {
        let hex = h("x").to_hex();
        let mut rows: Vec<(Value, &str)> = Vec::new();
        let mut v = good();
        v["_type"] = "https://in-toto.io/Statement/v0.1".into();
        rows.push((v, "_type is"));
        let mut v = good();
        v["predicateType"] = "https://slsa.dev/provenance/v0.2".into();
        rows.push((v, "predicateType is"));
        rows.push((payload(serde_json::json!([])), "0 subjects"));
        rows.push((
            payload(serde_json::json!([{"name": "a", "digest": {"sha512": "00"}}])),
            "subject 0 has no sha256 digest",
        ));
        rows.push((
            payload(serde_json::json!([{"name": "a", "digest": {"sha256": "xyz"}}])),
            "subject 0 digest sha256",
        ));
        rows.push((
            payload(serde_json::json!([{"name": "a", "digest": {"sha256": &hex[..62]}}])),
            "subject 0 digest sha256",
        ));
        rows.push((
            payload(serde_json::json!([{"name": "a", "digest": {"sha256": 7}}])),
            "is not a string",
        ));
        rows.push((
            payload(serde_json::json!([
                {"name": "a", "digest": {"sha256": hex}},
                {"name": "a", "digest": {"sha256": h("y").to_hex()}}
            ])),
            "subject \"a\" is listed twice",
        ));
        rows.push((
            payload(serde_json::json!([{"name": "a\u{0}", "digest": {"sha256": hex}}])),
            "control characters",
        ));
        let mut v = good();
        v["predicate"]["runDetails"]["builder"]["id"] = 5.into();
        rows.push((v, "builder.id is not a string"));
        let mut v = good();
        v.as_object_mut().unwrap().remove("subject");
        rows.push((v, "statement is not valid"));
        let many: Vec<Value> = (0..=MAX_SUBJECTS)
            .map(|i| serde_json::json!({"name": i.to_string(), "digest": {"sha256": hex}}))
            .collect();
        rows.push((payload(Value::Array(many)), "1025 subjects"));
        for (v, needle) in rows {
            let e = parse(&v).unwrap_err();
            assert_eq!(e.kind(), Kind::Malformed);
            assert!(e.message().contains(needle), "{needle:?} not in {e}");
        }
        let e = Statement::parse(&vec![b' '; MAX_ATTESTATION_BYTES as usize + 1]).unwrap_err();
        assert!(e.message().contains("larger than"), "{e}");
        assert!(Statement::parse(b"\xff\xfe").is_err());
    }

    /// The envelope: the builder keys and the in-toto payload type.
    #[test]
    fn only_a_configured_builder_and_the_in_toto_type_verify() {
        let (builder, other) = (Signer::new(7), Signer::new(8));
        let keys = KeySet::new(vec![builder.public()], 1).unwrap();
        let body = serde_json::to_vec(&good()).unwrap();
        let raw = |env: crate::envelope::Envelope| serde_json::to_vec(&env).unwrap();
        let s = verify(&raw(envelope(PAYLOAD_TYPE, &body, &[&builder])), &keys).unwrap();
        assert_eq!(s.subjects.len(), 2);
        let e = verify(&raw(envelope(PAYLOAD_TYPE, &body, &[&other])), &keys).unwrap_err();
        assert_eq!(e.kind(), Kind::Signature);
        assert!(
            e.message().starts_with(
                "attestation is signed by 0 of the 1 configured builder keys, threshold is 1"
            ) && e.message().contains(&other.public().keyid()[..16]),
            "{e}"
        );
        let e = verify(
            &raw(envelope(
                "application/vnd.updraft.manifest+json",
                &body,
                &[&builder],
            )),
            &keys,
        )
        .unwrap_err();
        assert!(e.message().contains("payloadType"), "{e}");
        let big = vec![b' '; MAX_ATTESTATION_BYTES as usize + 1];
        assert!(
            verify(&big, &keys)
                .unwrap_err()
                .message()
                .contains("larger than")
        );
    }

    #[test]
    fn the_reference_is_bounded() {
        let ok = AttestationRef {
            url: "artifacts/x.intoto.json".into(),
            size: 100,
            sha256: h("x"),
        };
        assert!(ok.check().is_ok());
        for (url, size) in [
            ("../x", 100),
            ("artifacts/x", 0),
            ("artifacts/x", MAX_ATTESTATION_BYTES + 1),
        ] {
            let r = AttestationRef {
                url: url.into(),
                size,
                ..ok.clone()
            };
            assert!(r.check().is_err(), "{url} {size}");
        }
    }
}
