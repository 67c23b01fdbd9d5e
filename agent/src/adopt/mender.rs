//! What Mender knows about a device, read from its own files: the root
//! file system partitions of its configuration (`RootfsPartA`,
//! `RootfsPartB`), the device type and the running artifact's name.
//!
//! Mender's client reads `/etc/mender/mender.conf` and, for the keys that
//! file leaves out, the fallback `/var/lib/mender/mender.conf` on the data
//! partition; both are JSON objects whose keys Go's decoder matches without
//! regard to case. `/var/lib/mender/device_type` holds `device_type=NAME`,
//! the root file system's `/etc/mender/artifact_info` holds
//! `artifact_name=NAME` (Mender's documentation, "Client configuration" and
//! "Artifact"). Its boot scripts know a root partition by its number
//! (`mender_boot_part`), the trailing digits of the device's name.
//!
//! This module parses those values strictly and never touches the device.

use std::path::{Path, PathBuf};

/// The largest file read.
pub const MAX_FILE: usize = 64 * 1024;

/// The root file systems Mender's configuration names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rootfs {
    pub a: PathBuf,
    pub b: PathBuf,
}

/// `RootfsPartA`/`RootfsPartB` from the main configuration, each falling
/// back to the fallback file's. `files` are (name, text) in that order;
/// a missing file is left out by the caller.
pub fn parse_conf(files: &[(&str, &str)]) -> Result<Rootfs, String> {
    let mut objects = Vec::new();
    for (name, text) in files {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("{name}: not JSON: {e}"))?;
        let serde_json::Value::Object(map) = v else {
            return Err(format!("{name}: not a JSON object"));
        };
        objects.push((*name, map));
    }
    let lookup = |key: &str| -> Result<Option<(&str, String)>, String> {
        for (name, map) in &objects {
            for (k, v) in map {
                if k.eq_ignore_ascii_case(key) {
                    return match v {
                        serde_json::Value::String(s) if !s.is_empty() => {
                            Ok(Some((*name, s.clone())))
                        }
                        _ => Err(format!("{name}: {key} must be a non-empty string")),
                    };
                }
            }
        }
        Ok(None)
    };
    let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    let part = |key: &str| -> Result<PathBuf, String> {
        let (name, value) =
            lookup(key)?.ok_or_else(|| format!("{}: no {key}", names.join(" or ")))?;
        let p = PathBuf::from(&value);
        if !p.is_absolute() || value.chars().any(char::is_control) {
            return Err(format!(
                "{name}: {key} {value:?} is not an absolute device path"
            ));
        }
        Ok(p)
    };
    let (a, b) = (part("RootfsPartA")?, part("RootfsPartB")?);
    if a == b {
        return Err(format!(
            "{}: RootfsPartA and RootfsPartB are the same device {}",
            names.join(" and "),
            a.display()
        ));
    }
    Ok(Rootfs { a, b })
}

/// The value of `key=` in a one-line-per-key file (`device_type`,
/// `artifact_info`). Errors name `file`.
pub fn parse_assignment(text: &str, file: &str, key: &str) -> Result<String, String> {
    let mut found = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("{file}: line {}: expected {key}=VALUE", n + 1));
        };
        if k.trim() != key {
            continue;
        }
        if found.is_some() {
            return Err(format!("{file}: {key} given twice"));
        }
        let v = v.trim();
        if v.is_empty() || v.len() > 128 || v.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!(
                "{file}: {key} must be 1 to 128 characters without spaces"
            ));
        }
        found = Some(v.to_string());
    }
    found.ok_or_else(|| format!("{file}: no {key}= line"))
}

/// The partition number Mender's boot scripts use for `device`: the
/// trailing digits of its name (`/dev/mmcblk0p2` → 2), after following a
/// symbolic link such as `/dev/disk/by-partlabel/rootfs-a` (`resolved`).
pub fn partition_number(device: &Path, resolved: Option<&Path>) -> Result<u32, String> {
    let digits = |p: &Path| -> Option<u32> {
        let name = p.file_name()?.to_str()?;
        let start = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        name[start..].parse().ok().filter(|n| *n > 0)
    };
    digits(device)
        .or_else(|| resolved.and_then(digits))
        .ok_or_else(|| {
            format!(
                "{} has no partition number in its name, which Mender's boot scripts use",
                device.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_configuration_wins_and_the_fallback_fills_in() {
        let main = r#"{"rootfspartA": "/dev/mmcblk0p2", "ServerURL": "https://x"}"#;
        let fallback = r#"{"RootfsPartA": "/dev/sda9", "RootfsPartB": "/dev/mmcblk0p3"}"#;
        let r = parse_conf(&[("main", main), ("fallback", fallback)]).unwrap();
        assert_eq!(r.a, PathBuf::from("/dev/mmcblk0p2"));
        assert_eq!(r.b, PathBuf::from("/dev/mmcblk0p3"));
    }

    #[test]
    fn hostile_configurations_are_named() {
        let rows: &[(&str, &str)] = &[
            ("", "main: not JSON"),
            ("[1]", "not a JSON object"),
            (
                "{\"RootfsPartA\": 2, \"RootfsPartB\": \"/dev/b\"}",
                "RootfsPartA must be a non-empty string",
            ),
            ("{\"RootfsPartA\": \"/dev/a\"}", "no RootfsPartB"),
            (
                "{\"RootfsPartA\": \"dev/a\", \"RootfsPartB\": \"/dev/b\"}",
                "not an absolute device path",
            ),
            (
                "{\"RootfsPartA\": \"/dev/a\", \"RootfsPartB\": \"/dev/a\"}",
                "the same device",
            ),
        ];
        for (text, want) in rows {
            let e = parse_conf(&[("main", text)]).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn assignments_are_read_strictly() {
        assert_eq!(
            parse_assignment("device_type=raspberrypi4\n", "device_type", "device_type").unwrap(),
            "raspberrypi4"
        );
        assert_eq!(
            parse_assignment("# c\nartifact_name = release-7\n", "a", "artifact_name").unwrap(),
            "release-7"
        );
        for (text, want) in [
            ("", "no artifact_name= line"),
            ("garbage", "line 1: expected artifact_name=VALUE"),
            ("artifact_name=a b", "without spaces"),
            ("artifact_name=a\nartifact_name=b", "given twice"),
        ] {
            let e = parse_assignment(text, "artifact_info", "artifact_name").unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.starts_with("artifact_info"), "{e}");
        }
    }

    #[test]
    fn a_partition_number_is_the_device_name_s_trailing_digits() {
        let n = |p: &str, r: Option<&str>| partition_number(Path::new(p), r.map(Path::new));
        assert_eq!(n("/dev/mmcblk0p2", None), Ok(2));
        assert_eq!(n("/dev/sda13", None), Ok(13));
        assert_eq!(
            n("/dev/disk/by-partlabel/root-a", Some("/dev/nvme0n1p5")),
            Ok(5)
        );
        assert!(
            n("/dev/disk/by-partlabel/root", None)
                .unwrap_err()
                .contains("no partition number")
        );
        assert!(n("/dev/sda0", None).is_err());
    }
}
