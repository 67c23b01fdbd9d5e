//! The components of a release: manifest `spec_version` 2
//! ([docs/components.md](../../../docs/components.md)).
//!
//! A release of version 2 names its parts: exactly one `slot` component
//! (the A/B root filesystem; a release describes everything the device
//! runs, so an application-only release names the slot it runs on, and a
//! device already running that slot neither downloads nor reboots for
//! it), at most one `boot` component (the slot's boot files, installed
//! and tried with it), and `app` and `command` components, sixteen in
//! all. This module owns
//! the wire form of version 2 and its structural rules: names that can
//! never be paths, unique names, known kinds, artifacts whose frames tile
//! them. The slot component's image, artifact and deltas land in
//! [`Manifest`]'s fields of version 1, so everything that installs a slot
//! reads one shape whatever the version; the other components land in
//! [`Manifest::components`].
//!
//! Like [`crate::manifest`] it is pure: bytes in, values out. Whether the
//! device's configuration names a component is the machine's question
//! (the manifest never decides where bytes go or which program runs).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Kind as ErrorKind, Result};
use crate::hash::{Sha256, truncate};
use crate::manifest::{self, Artifact, Delta, Image, Manifest, Release};
use crate::timestamp::Timestamp;

/// The payload format of releases of components.
pub const SPEC_VERSION: u32 = 2;

/// At most this many components in one release, the slot included.
pub const MAX_COMPONENTS: usize = 16;

/// An app's index decodes to at most this many bytes.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// An app's tree holds at most this many entries.
pub const MAX_TREE_ENTRIES: u64 = 1 << 20;

/// Longest component name.
pub const MAX_NAME_LEN: usize = 32;

/// A component's name and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub version: String,
}

/// What a component is; how it is installed, activated and rolled back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Slot,
    App,
    Boot,
    Command,
}

impl Kind {
    pub const NAMES: [&'static str; 4] = ["slot", "app", "boot", "command"];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Slot => "slot",
            Kind::App => "app",
            Kind::Boot => "boot",
            Kind::Command => "command",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "slot" => Some(Kind::Slot),
            "app" => Some(Kind::App),
            "boot" => Some(Kind::Boot),
            "command" => Some(Kind::Command),
            _ => None,
        }
    }
}

/// A component other than the slot.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    pub name: String,
    pub version: String,
    pub part: Part,
}

/// What a component of each kind carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    App(TreePart),
    /// The slot's boot files: a tree like an app's, written into the
    /// directory the device configures for the slot being installed.
    Boot(TreePart),
    Command(CommandPart),
}

/// How much an app's tree may hold, as signed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeSize {
    pub entries: u64,
    pub bytes: u64,
}

/// A tree (an app, or a slot's boot files): its signed index and where
/// its files' contents are.
#[derive(Clone, Debug, PartialEq)]
pub struct TreePart {
    pub tree: TreeSize,
    /// The index (JSON lines, [`crate::app::index`]) as a framed artifact.
    pub index: Artifact,
    /// The blobs' directory, relative to the manifest (ends with `/`):
    /// a file's content is `<blobs><sha256>.zst`.
    pub blobs: String,
}

/// A payload for a handler the device configuration names.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandPart {
    pub artifact: Artifact,
}

impl Component {
    pub fn kind(&self) -> Kind {
        match self.part {
            Part::App(_) => Kind::App,
            Part::Boot(_) => Kind::Boot,
            Part::Command(_) => Kind::Command,
        }
    }

    /// The tree an `app` or `boot` component carries.
    pub fn tree(&self) -> Option<&TreePart> {
        match &self.part {
            Part::App(t) | Part::Boot(t) => Some(t),
            Part::Command(_) => None,
        }
    }

    /// The framed artifact the component is fetched by: a tree's index, a
    /// command's payload.
    pub fn artifact(&self) -> &Artifact {
        match &self.part {
            Part::App(t) | Part::Boot(t) => &t.index,
            Part::Command(c) => &c.artifact,
        }
    }

    /// What identifies the component's content: its index's hash (app,
    /// boot) or its artifact's (command). A device that runs this hash
    /// under this name has the component unchanged.
    pub fn content(&self) -> Sha256 {
        self.artifact().sha256
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The payload of version 2 as written.
#[derive(Serialize, Deserialize)]
struct Wire {
    spec_version: u32,
    serial: u64,
    issued: Timestamp,
    expires: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keys_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    channel: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    security_version: u64,
    release: Release,
    components: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attestation: Option<super::provenance::AttestationRef>,
}

/// One component as written; `kind` is the tag.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum WireComponent {
    Slot {
        name: String,
        version: String,
        image: Image,
        artifact: Artifact,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        deltas: Vec<Delta>,
    },
    App {
        name: String,
        version: String,
        tree: TreeSize,
        index: Artifact,
        blobs: String,
    },
    Boot {
        name: String,
        version: String,
        tree: TreeSize,
        index: Artifact,
        blobs: String,
    },
    Command {
        name: String,
        version: String,
        artifact: Artifact,
    },
}

fn malformed(msg: String) -> Error {
    Error::new(ErrorKind::Malformed, format!("manifest: {msg}"))
}

/// A component name: 1 to 32 of `a-z`, `0-9`, `-`, `_`, starting with a
/// letter. Never a path: it becomes a directory name only after this.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "component name {:?} must be 1 to {MAX_NAME_LEN} of a-z, 0-9, '-' and '_', starting with a letter",
            truncate(name, 80)
        ))
    }
}

/// Parse a payload of version 2 into a [`Manifest`]; its structure is
/// checked by [`Manifest::validate`], which calls [`check`].
pub(crate) fn parse(payload: &[u8]) -> Result<Manifest> {
    let w: Wire = serde_json::from_slice(payload).map_err(|e| malformed(format!("{e}")))?;
    if w.components.is_empty() || w.components.len() > MAX_COMPONENTS {
        return Err(malformed(format!(
            "{} components listed; a release has 1 to {MAX_COMPONENTS}",
            w.components.len()
        )));
    }
    let mut slot: Option<(Named, Image, Artifact, Vec<Delta>)> = None;
    let mut components = Vec::with_capacity(w.components.len());
    for (i, value) in w.components.into_iter().enumerate() {
        let name = match value.get("name").and_then(|n| n.as_str()) {
            Some(n) => n.to_string(),
            None => return Err(malformed(format!("component {i} has no name"))),
        };
        check_name(&name).map_err(malformed)?;
        match value.get("kind").and_then(|k| k.as_str()) {
            Some(k) if Kind::parse(k).is_some() => {}
            Some(k) => {
                return Err(malformed(format!(
                    "component {name}: kind {:?} is not one this updraft installs ({})",
                    truncate(k, 40),
                    Kind::NAMES.join(", ")
                )));
            }
            None => return Err(malformed(format!("component {name} has no kind"))),
        }
        let wire: WireComponent = serde_json::from_value(value)
            .map_err(|e| malformed(format!("component {name}: {e}")))?;
        match wire {
            WireComponent::Slot {
                name,
                version,
                image,
                artifact,
                deltas,
            } => {
                if let Some((first, ..)) = &slot {
                    return Err(malformed(format!(
                        "components {} and {name} are both of kind slot; a release has one",
                        first.name
                    )));
                }
                slot = Some((Named { name, version }, image, artifact, deltas));
            }
            WireComponent::App {
                name,
                version,
                tree,
                index,
                blobs,
            } => components.push(Component {
                name,
                version,
                part: Part::App(TreePart { tree, index, blobs }),
            }),
            WireComponent::Boot {
                name,
                version,
                tree,
                index,
                blobs,
            } => {
                if let Some(first) = components
                    .iter()
                    .find(|c: &&Component| c.kind() == Kind::Boot)
                {
                    return Err(malformed(format!(
                        "components {} and {name} are both of kind boot; a release has at most one (the slot's boot files)",
                        first.name
                    )));
                }
                components.push(Component {
                    name,
                    version,
                    part: Part::Boot(TreePart { tree, index, blobs }),
                })
            }
            WireComponent::Command {
                name,
                version,
                artifact,
            } => components.push(Component {
                name,
                version,
                part: Part::Command(CommandPart { artifact }),
            }),
        }
    }
    let Some((named, image, artifact, deltas)) = slot else {
        return Err(malformed(
            "no component of kind slot: a release names the root filesystem it runs on \
             (an application-only release names the one already running)"
                .into(),
        ));
    };
    Ok(Manifest {
        spec_version: w.spec_version,
        serial: w.serial,
        issued: w.issued,
        expires: w.expires,
        keys_version: w.keys_version,
        channel: w.channel,
        security_version: w.security_version,
        release: w.release,
        image,
        artifact,
        deltas,
        attestation: w.attestation,
        slot: Some(named),
        components,
    })
}

/// The rules of version 2 beyond the slot's: unique names, versions as
/// the release's, and every app's and command's artifact well formed.
/// A manifest of version 1 carries no components and passes.
pub(crate) fn check(m: &Manifest) -> Result<()> {
    if m.spec_version == manifest::SPEC_VERSION {
        if m.slot.is_some() || !m.components.is_empty() {
            return Err(malformed(
                "spec_version 1 carries no components (they need spec_version 2)".into(),
            ));
        }
        return Ok(());
    }
    let Some(slot) = &m.slot else {
        return Err(malformed("no component of kind slot".into()));
    };
    let mut names: Vec<&str> = vec![slot.name.as_str()];
    let every = std::iter::once((slot.name.as_str(), slot.version.as_str())).chain(
        m.components
            .iter()
            .map(|c| (c.name.as_str(), c.version.as_str())),
    );
    for (name, version) in every {
        check_name(name).map_err(malformed)?;
        if !manifest::version_ok(version) {
            return Err(malformed(format!(
                "component {name}: version {:?} is empty, too long or has spaces or control characters",
                truncate(version, 140)
            )));
        }
    }
    for c in &m.components {
        if names.contains(&c.name.as_str()) {
            return Err(malformed(format!("component {} is listed twice", c.name)));
        }
        names.push(&c.name);
        match &c.part {
            Part::App(a) | Part::Boot(a) => {
                let decoded = manifest::check_artifact(
                    &a.index,
                    None,
                    &format!("component {} index", c.name),
                )?;
                if decoded > MAX_INDEX_BYTES {
                    return Err(malformed(format!(
                        "component {}: the index decodes to {decoded} bytes, more than the {MAX_INDEX_BYTES}-byte limit",
                        c.name
                    )));
                }
                if a.tree.entries == 0 || a.tree.entries > MAX_TREE_ENTRIES {
                    return Err(malformed(format!(
                        "component {}: tree.entries {} is not between 1 and {MAX_TREE_ENTRIES}",
                        c.name, a.tree.entries
                    )));
                }
                manifest::check_url(&a.blobs, &format!("component {} blobs", c.name))?;
                if !a.blobs.ends_with('/') {
                    return Err(malformed(format!(
                        "component {}: blobs {:?} must name a directory (end with '/')",
                        c.name,
                        truncate(&a.blobs, 120)
                    )));
                }
            }
            Part::Command(p) => {
                manifest::check_artifact(
                    &p.artifact,
                    None,
                    &format!("component {} artifact", c.name),
                )?;
            }
        }
    }
    Ok(())
}

/// The payload of `m` as the publisher signs it: version 1 as derived,
/// version 2 with its components (the slot first, then the others in
/// order).
pub fn to_payload(m: &Manifest) -> serde_json::Result<Vec<u8>> {
    let Some(slot) = &m.slot else {
        return serde_json::to_vec_pretty(m);
    };
    let mut components = vec![serde_json::to_value(WireComponent::Slot {
        name: slot.name.clone(),
        version: slot.version.clone(),
        image: m.image,
        artifact: m.artifact.clone(),
        deltas: m.deltas.clone(),
    })?];
    for c in &m.components {
        let (name, version) = (c.name.clone(), c.version.clone());
        components.push(serde_json::to_value(match &c.part {
            Part::App(a) => WireComponent::App {
                name,
                version,
                tree: a.tree,
                index: a.index.clone(),
                blobs: a.blobs.clone(),
            },
            Part::Boot(a) => WireComponent::Boot {
                name,
                version,
                tree: a.tree,
                index: a.index.clone(),
                blobs: a.blobs.clone(),
            },
            Part::Command(p) => WireComponent::Command {
                name,
                version,
                artifact: p.artifact.clone(),
            },
        })?);
    }
    serde_json::to_vec_pretty(&Wire {
        spec_version: m.spec_version,
        serial: m.serial,
        issued: m.issued,
        expires: m.expires,
        keys_version: m.keys_version,
        channel: m.channel.clone(),
        security_version: m.security_version,
        release: m.release.clone(),
        components,
        attestation: m.attestation.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn artifact(url: &str) -> Value {
        let h = Sha256::of(b"x").to_hex();
        json!({"url": url, "size": 10, "sha256": h,
               "frames": [{"offset": 0, "size": 10, "out_size": 4, "out_sha256": h}]})
    }

    fn release(components: Vec<Value>) -> Value {
        json!({
            "spec_version": 2, "serial": 7,
            "issued": "2027-01-15T08:00:00Z", "expires": "2030-03-17T17:46:40Z",
            "channel": "stable",
            "release": {"version": "2026.12.1", "compatible": ["rpi4"]},
            "components": components,
        })
    }

    fn slot() -> Value {
        json!({"name": "rootfs", "kind": "slot", "version": "2.0",
               "image": {"size": 4, "sha256": Sha256::of(b"x").to_hex()},
               "artifact": artifact("artifacts/a.zst")})
    }

    fn web() -> Value {
        json!({"name": "web", "kind": "app", "version": "1.3",
               "tree": {"entries": 3, "bytes": 100},
               "index": artifact("artifacts/i.zst"), "blobs": "artifacts/blobs/"})
    }

    fn parse_value(v: &Value) -> Result<Manifest> {
        Manifest::parse(&serde_json::to_vec(v).unwrap())
    }

    fn refused(v: Value, needle: &str) {
        match parse_value(&v) {
            Ok(_) => panic!("accepted: {v}"),
            Err(e) => assert!(e.to_string().contains(needle), "{e} lacks {needle:?}"),
        }
    }

    #[test]
    fn a_release_of_a_slot_and_an_app_round_trips() {
        let m = parse_value(&release(vec![slot(), web()])).unwrap();
        assert_eq!(m.slot.as_ref().unwrap().name, "rootfs");
        assert_eq!(m.image.size, 4);
        assert_eq!(m.components.len(), 1);
        assert_eq!(m.components[0].kind(), Kind::App);
        let again = Manifest::parse(&to_payload(&m).unwrap()).unwrap();
        assert_eq!(again, m);
    }

    #[test]
    fn a_release_of_components_carries_its_security_version() {
        let mut v = release(vec![slot(), web()]);
        assert_eq!(parse_value(&v).unwrap().security_version, 0);
        v["security_version"] = json!(9);
        let m = parse_value(&v).unwrap();
        assert_eq!(m.security_version, 9);
        let written: Value = serde_json::from_slice(&to_payload(&m).unwrap()).unwrap();
        assert_eq!(written["security_version"], 9);
        v["security_version"] = json!("nine");
        refused(v, "expected u64");
    }

    #[test]
    fn a_release_of_version_1_is_written_as_version_1() {
        let mut m = parse_value(&release(vec![slot()])).unwrap();
        m.spec_version = 1;
        m.slot = None;
        let v: Value = serde_json::from_slice(&to_payload(&m).unwrap()).unwrap();
        assert!(v.get("components").is_none());
        assert_eq!(v["image"]["size"], 4);
    }

    #[test]
    fn component_names_are_never_paths() {
        for bad in [
            "../etc",
            "a/b",
            "",
            "Web",
            "1web",
            ".web",
            "web.d",
            &"a".repeat(33),
        ] {
            let mut w = web();
            w["name"] = bad.into();
            refused(release(vec![slot(), w]), "component name");
        }
    }

    #[test]
    fn a_component_is_listed_once() {
        refused(release(vec![slot(), web(), web()]), "listed twice");
        let mut w = web();
        w["name"] = "rootfs".into();
        refused(release(vec![slot(), w]), "listed twice");
    }

    #[test]
    fn an_unknown_kind_is_refused_not_skipped() {
        let mut w = web();
        w["kind"] = "firmware".into();
        refused(release(vec![slot(), w]), "kind \"firmware\" is not one");
        let mut w = web();
        w.as_object_mut().unwrap().remove("kind");
        refused(release(vec![slot(), w]), "has no kind");
    }

    fn boot(name: &str) -> Value {
        json!({"name": name, "kind": "boot", "version": "2.0",
               "tree": {"entries": 4, "bytes": 1000},
               "index": artifact("artifacts/b.zst"), "blobs": "artifacts/blobs/"})
    }

    #[test]
    fn a_release_of_a_slot_with_its_boot_files_round_trips() {
        let m = parse_value(&release(vec![slot(), boot("firmware"), web()])).unwrap();
        assert_eq!(m.components[0].kind(), Kind::Boot);
        assert_eq!(m.components[0].tree().unwrap().tree.entries, 4);
        let again = Manifest::parse(&to_payload(&m).unwrap()).unwrap();
        assert_eq!(again, m);
    }

    #[test]
    fn a_release_carries_at_most_one_set_of_boot_files() {
        refused(
            release(vec![slot(), boot("firmware"), boot("kernel")]),
            "components firmware and kernel are both of kind boot",
        );
        let mut b = boot("firmware");
        b["blobs"] = "blobs".into();
        refused(release(vec![slot(), b]), "must name a directory");
    }

    #[test]
    fn a_release_names_exactly_one_slot() {
        refused(release(vec![web()]), "no component of kind slot");
        let mut other = slot();
        other["name"] = "rootfs2".into();
        refused(release(vec![slot(), other]), "both of kind slot");
        refused(release(vec![]), "0 components");
        let many: Vec<Value> = std::iter::once(slot())
            .chain((0..16).map(|i| {
                let mut w = web();
                w["name"] = format!("app{i}").into();
                w
            }))
            .collect();
        refused(release(many), "17 components");
    }

    #[test]
    fn an_apps_index_and_blobs_are_checked_like_any_artifact() {
        let mut w = web();
        w["index"]["frames"][0]["offset"] = 3.into();
        refused(
            release(vec![slot(), w]),
            "frame 0 of component web index starts at 3",
        );
        let mut w = web();
        w["index"]["url"] = "../../etc/passwd".into();
        refused(release(vec![slot(), w]), "component web index url");
        let mut w = web();
        w["blobs"] = "artifacts/blobs".into();
        refused(release(vec![slot(), w]), "must name a directory");
        let mut w = web();
        w["blobs"] = "/blobs/".into();
        refused(release(vec![slot(), w]), "component web blobs");
        let mut w = web();
        w["tree"]["entries"] = 0.into();
        refused(release(vec![slot(), w]), "tree.entries 0");
        let mut w = web();
        w["version"] = "1 3".into();
        refused(release(vec![slot(), w]), "component web: version");
    }

    #[test]
    fn a_command_carries_a_framed_artifact() {
        let cmd = json!({"name": "mcu", "kind": "command", "version": "4.1",
                         "artifact": artifact("artifacts/m.zst")});
        let m = parse_value(&release(vec![slot(), cmd])).unwrap();
        assert_eq!(m.components[0].kind(), Kind::Command);
        let mut cmd = json!({"name": "mcu", "kind": "command", "version": "4.1",
                             "artifact": artifact("artifacts/m.zst")});
        cmd["artifact"]["frames"] = json!([]);
        refused(
            release(vec![slot(), cmd]),
            "component mcu artifact has no frames",
        );
    }
}
