//! The release description file: a release of several components in one
//! TOML file (`updraft-publish release --description FILE`), for builds
//! that would otherwise assemble a long command line (an image class in a
//! Yocto layer, a CI job). It says what the flags say, no more: the
//! release's version, compatible boards and channel, the slot image and
//! the images its deltas start from, and the `app`, `boot` and `command`
//! components with their paths.
//!
//! ```toml
//! version = "2026.12.1"
//! compatible = ["gw-2000"]
//! channel = "stable"
//! security_version = 2         # as --security-version
//!
//! [slot]                       # omitted: the slot of the release in --out is kept
//! name = "rootfs"
//! image = "deploy/rootfs.ext4"
//! deltas_from = ["previous/rootfs.ext4"]
//!
//! [components.web]
//! kind = "app"
//! version = "1.4"              # the release's version when omitted
//! path = "build/web"
//!
//! [components.firmware]       # the slot's boot files, at most one
//! kind = "boot"
//! path = "deploy/boot"
//!
//! [components.mcu]
//! kind = "command"
//! path = "firmware/mcu.bin"
//! ```
//!
//! Relative paths are relative to the file's directory. Every table and
//! key is checked: an unknown key, a component name that is not one
//! (`check_name`), a kind other than `app`, `boot` or `command`, a second
//! `boot`, an empty path or
//! a value of the wrong type is refused with the file and what is wrong,
//! before anything is read or written. Flags given beside the file add
//! components and override its scalar values.
//!
//! This module parses and checks; it must never read the paths it names
//! nor write anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::release::ComponentSpec;

/// A parsed description.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Description {
    pub version: Option<String>,
    pub compatible: Vec<String>,
    pub channel: Option<String>,
    /// As `--security-version`.
    pub security_version: Option<u64>,
    /// The slot image; `None` keeps the slot already published.
    pub image: Option<PathBuf>,
    pub slot_name: Option<String>,
    pub deltas_from: Vec<PathBuf>,
    pub apps: Vec<ComponentSpec>,
    /// The slot's boot files (at most one `boot` component).
    pub boot: Option<ComponentSpec>,
    pub commands: Vec<ComponentSpec>,
}

/// The file as TOML gives it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: Option<String>,
    #[serde(default)]
    compatible: Vec<String>,
    channel: Option<String>,
    security_version: Option<u64>,
    slot: Option<Slot>,
    #[serde(default)]
    components: BTreeMap<String, Component>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Slot {
    name: Option<String>,
    image: PathBuf,
    #[serde(default)]
    deltas_from: Vec<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Component {
    kind: String,
    version: Option<String>,
    path: PathBuf,
}

/// The most components a description may name (a release holds at most
/// 16, the slot included).
const MAX_COMPONENTS: usize = 15;

/// Parse `text`, the contents of the description at `path`; relative paths
/// are taken from `path`'s directory.
pub fn parse(text: &str, path: &Path) -> Result<Description, String> {
    let at = |what: String| format!("release description {}: {what}", path.display());
    let file: File = toml::from_str(text).map_err(|e| at(e.to_string().trim().to_string()))?;
    let base = path.parent().unwrap_or(Path::new(""));
    let resolve = |p: &Path| -> Result<PathBuf, String> {
        if p.as_os_str().is_empty() {
            return Err("an empty path".into());
        }
        Ok(if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        })
    };
    if let Some(v) = &file.version {
        if v.trim().is_empty() {
            return Err(at("version is empty".into()));
        }
    }
    if file.compatible.iter().any(|c| c.trim().is_empty()) {
        return Err(at("compatible holds an empty name".into()));
    }
    if file.components.len() > MAX_COMPONENTS {
        return Err(at(format!(
            "{} components; a release holds at most {MAX_COMPONENTS} besides its slot",
            file.components.len()
        )));
    }
    let mut d = Description {
        version: file.version,
        compatible: file.compatible,
        channel: file.channel,
        security_version: file.security_version,
        ..Description::default()
    };
    if let Some(slot) = file.slot {
        if let Some(name) = &slot.name {
            updraft::manifest::component::check_name(name)
                .map_err(|e| at(format!("[slot] name: {e}")))?;
        }
        d.slot_name = slot.name;
        d.image = Some(resolve(&slot.image).map_err(|e| at(format!("[slot] image: {e}")))?);
        d.deltas_from = slot
            .deltas_from
            .iter()
            .map(|p| resolve(p))
            .collect::<Result<_, _>>()
            .map_err(|e| at(format!("[slot] deltas_from: {e}")))?;
    }
    for (name, c) in file.components {
        let table = format!("[components.{name}]");
        updraft::manifest::component::check_name(&name).map_err(|e| at(format!("{table}: {e}")))?;
        if d.slot_name.as_deref() == Some(name.as_str()) {
            return Err(at(format!("{table}: the slot is named {name} already")));
        }
        if c.version.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(at(format!("{table}: version is empty")));
        }
        let spec = ComponentSpec {
            name,
            version: c.version,
            dir: resolve(&c.path).map_err(|e| at(format!("{table} path: {e}")))?,
        };
        match c.kind.as_str() {
            "app" => d.apps.push(spec),
            "command" => d.commands.push(spec),
            "slot" => {
                return Err(at(format!(
                    "{table}: kind \"slot\" is described by the [slot] table"
                )));
            }
            "boot" => {
                if let Some(first) = &d.boot {
                    return Err(at(format!(
                        "{table}: the slot's boot files are [components.{}] already (a release has one boot component)",
                        first.name
                    )));
                }
                d.boot = Some(spec);
            }
            other => {
                return Err(at(format!(
                    "{table}: unknown kind {other:?} (kinds: app, boot, command)"
                )));
            }
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Description, String> {
        parse(text, Path::new("/build/release.toml"))
    }

    #[test]
    fn a_full_description_gives_every_part_with_paths_from_its_directory() {
        let d = parsed(
            r#"
            version = "2026.12.1"
            compatible = ["gw-2000", "gw-2100"]
            channel = "beta"
            security_version = 3
            [slot]
            name = "os"
            image = "deploy/rootfs.ext4"
            deltas_from = ["/srv/old.ext4", "prev.ext4"]
            [components.web]
            kind = "app"
            version = "1.4"
            path = "build/web"
            [components.mcu]
            kind = "command"
            path = "/fw/mcu.bin"
            [components.firmware]
            kind = "boot"
            path = "deploy/boot"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.version.as_deref(), Some("2026.12.1"));
        assert_eq!(d.compatible, ["gw-2000", "gw-2100"]);
        assert_eq!(d.channel.as_deref(), Some("beta"));
        assert_eq!(d.security_version, Some(3));
        assert_eq!(d.slot_name.as_deref(), Some("os"));
        assert_eq!(d.image, Some(PathBuf::from("/build/deploy/rootfs.ext4")));
        assert_eq!(
            d.deltas_from,
            [
                PathBuf::from("/srv/old.ext4"),
                PathBuf::from("/build/prev.ext4")
            ]
        );
        assert_eq!(
            d.apps,
            [ComponentSpec {
                name: "web".into(),
                version: Some("1.4".into()),
                dir: "/build/build/web".into()
            }]
        );
        assert_eq!(
            d.boot,
            Some(ComponentSpec {
                name: "firmware".into(),
                version: None,
                dir: "/build/deploy/boot".into()
            })
        );
        assert_eq!(
            d.commands,
            [ComponentSpec {
                name: "mcu".into(),
                version: None,
                dir: "/fw/mcu.bin".into()
            }]
        );
    }

    #[test]
    fn an_empty_description_says_nothing() {
        assert_eq!(parsed(""), Ok(Description::default()));
    }

    /// Each row: a description, and what its refusal must name.
    #[test]
    fn hostile_descriptions_are_refused_naming_the_problem() {
        let rows: &[(&str, &str)] = &[
            ("versio = \"1\"", "unknown field `versio`"),
            ("version = 3", "invalid type"),
            ("version = \"\"", "version is empty"),
            ("security_version = -1", "security_version"),
            ("security_version = \"3\"", "invalid type"),
            ("compatible = [\"\"]", "compatible holds an empty name"),
            ("[slot]\nname = \"x\"", "missing field `image`"),
            ("[slot]\nimage = \"\"", "[slot] image: an empty path"),
            ("[slot]\nimage = \"a\"\nname = \"../etc\"", "[slot] name"),
            ("[slot]\nimage = \"a\"\nsize = 1", "unknown field `size`"),
            (
                "[components.\"../x\"]\nkind = \"app\"\npath = \"w\"",
                "[components.../x]",
            ),
            (
                "[components.web]\nkind = \"container\"\npath = \"w\"",
                "unknown kind \"container\"",
            ),
            (
                "[components.web]\nkind = \"slot\"\npath = \"w\"",
                "[slot] table",
            ),
            (
                "[components.fw]\nkind = \"boot\"\npath = \"w\"\n[components.kernel]\nkind = \"boot\"\npath = \"v\"",
                "one boot component",
            ),
            ("[components.web]\nkind = \"app\"", "missing field `path`"),
            (
                "[components.web]\nkind = \"app\"\npath = \"\"",
                "an empty path",
            ),
            (
                "[components.web]\nkind = \"app\"\npath = \"w\"\nversion = \" \"",
                "version is empty",
            ),
            (
                "[components.web]\nkind = \"app\"\npath = \"w\"\n[components.web]\nkind = \"app\"\npath = \"v\"",
                "duplicate",
            ),
            (
                "[slot]\nname = \"web\"\nimage = \"i\"\n[components.web]\nkind = \"app\"\npath = \"w\"",
                "the slot is named web already",
            ),
            (
                "version = \"1\"\n[",
                "release description /build/release.toml",
            ),
        ];
        for (text, wanted) in rows {
            let e = parsed(text).expect_err(text);
            assert!(e.contains(wanted), "{text:?}: {e}");
            assert!(
                e.starts_with("release description /build/release.toml: "),
                "{e}"
            );
        }
    }

    #[test]
    fn too_many_components_are_refused() {
        let text: String = (0..16)
            .map(|i| format!("[components.c{i}]\nkind = \"app\"\npath = \"d{i}\"\n"))
            .collect();
        let e = parsed(&text).expect_err("16 components");
        assert!(e.contains("16 components"), "{e}");
    }
}
