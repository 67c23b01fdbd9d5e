//! What RAUC knows about a device, read from its own files: `system.conf`
//! (the compatible, the bootloader, the slots and their bootnames, where
//! its status lives) and its central status file (which bundle version each
//! slot holds).
//!
//! Both are GLib key files, which RAUC reads with `g_key_file`: `[group]`
//! headers, `key=value` lines (spaces around `=` ignored), `#` comments.
//! This module parses them strictly into values and never touches the
//! device: a line it cannot read is an error naming the file and line,
//! never skipped, because a misread slot is a bricked device. It decides
//! which slots form updraft's pair; everything else is the caller's.
//!
//! RAUC's documented facts relied on (rauc.readthedocs.io, "Reference"):
//! slots are groups `[slot.CLASS.INDEX]` with `device=`, `type=`,
//! `bootname=` and `parent=` (a child slot switched with its parent); the
//! `[system]` group has `compatible=`, `bootloader=` (`uboot`, `grub`,
//! `barebox`, `efi`, `custom`, `noop`), `grubenv=` (default
//! `/boot/grub/grubenv`), `data-directory=` and the older `statusfile=`; with
//! a data directory, the status of all slots is `central.raucs` in it.

use std::path::PathBuf;

/// The largest `system.conf` or status file read.
pub const MAX_FILE: usize = 64 * 1024;

/// The bootloaders updraft can take over from RAUC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Boot {
    Uboot,
    /// With the grubenv path RAUC writes.
    Grub(PathBuf),
}

/// One slot of updraft's pair, as RAUC names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// RAUC's slot name, e.g. `rootfs.0`.
    pub name: String,
    pub device: PathBuf,
    pub bootname: String,
}

/// What `system.conf` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct System {
    pub compatible: String,
    pub boot: Boot,
    /// Slot A and slot B: the two bootable slots, in index order.
    pub pair: [Slot; 2],
    /// Where RAUC keeps the status of all slots, when it keeps one.
    pub status_file: Option<PathBuf>,
    /// Slots besides the pair (children, other classes): named, not adopted.
    pub others: Vec<String>,
}

/// A parsed key file: groups in order, each with its keys in order.
type Groups = Vec<(String, Vec<(String, String)>)>;

/// Parse a GLib key file. Errors name the line.
pub fn parse_keyfile(text: &str) -> Result<Groups, String> {
    let mut groups: Groups = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let n = n + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                return Err(format!("line {n}: a group header must end with ']'"));
            };
            if name.is_empty() || name.chars().any(|c| c.is_control() || c == '[' || c == ']') {
                return Err(format!("line {n}: group name {name:?} is not valid"));
            }
            if groups.iter().any(|(g, _)| g == name) {
                return Err(format!("line {n}: group [{name}] appears twice"));
            }
            groups.push((name.to_string(), Vec::new()));
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {n}: expected key=value or [group]"));
        };
        let key = key.trim();
        if key.is_empty() || key.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!("line {n}: key {key:?} is not valid"));
        }
        let Some((_, keys)) = groups.last_mut() else {
            return Err(format!("line {n}: key {key:?} before any [group]"));
        };
        if keys.iter().any(|(k, _)| k == key) {
            return Err(format!("line {n}: key {key:?} appears twice in its group"));
        }
        let value = value.trim();
        if value.chars().any(char::is_control) {
            return Err(format!(
                "line {n}: the value of {key:?} holds a control character"
            ));
        }
        keys.push((key.to_string(), value.to_string()));
    }
    Ok(groups)
}

fn get<'a>(keys: &'a [(String, String)], key: &str) -> Option<&'a str> {
    keys.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Interpret `system.conf` (already read; `file` names it in errors).
pub fn parse_system(text: &str, file: &str) -> Result<System, String> {
    let groups = parse_keyfile(text).map_err(|e| format!("{file}: {e}"))?;
    let system = groups
        .iter()
        .find(|(g, _)| g == "system")
        .map(|(_, k)| k.as_slice())
        .ok_or_else(|| format!("{file}: no [system] group"))?;
    let compatible = get(system, "compatible")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("{file}: [system] has no compatible="))?
        .to_string();
    let boot = match get(system, "bootloader") {
        Some("uboot") => Boot::Uboot,
        Some("grub") => Boot::Grub(PathBuf::from(
            get(system, "grubenv").unwrap_or("/boot/grub/grubenv"),
        )),
        Some(other) => {
            return Err(format!(
                "{file}: [system] bootloader={other}: updraft takes over RAUC's uboot and grub integrations only"
            ));
        }
        None => return Err(format!("{file}: [system] has no bootloader=")),
    };
    let status_file = match (get(system, "data-directory"), get(system, "statusfile")) {
        (_, Some(s)) if s != "per-slot" => Some(PathBuf::from(s)),
        (Some(d), _) => Some(PathBuf::from(d).join("central.raucs")),
        _ => None,
    };
    if let Some(p) = &status_file {
        if !p.is_absolute() {
            return Err(format!(
                "{file}: RAUC's status file {} is not an absolute path",
                p.display()
            ));
        }
    }

    let mut bootable: Vec<Slot> = Vec::new();
    let mut others = Vec::new();
    for (group, keys) in &groups {
        let Some(name) = group.strip_prefix("slot.") else {
            continue;
        };
        let Some((class, index)) = name.rsplit_once('.') else {
            return Err(format!("{file}: [{group}] is not [slot.CLASS.INDEX]"));
        };
        if class.is_empty() || index.parse::<u32>().is_err() {
            return Err(format!("{file}: [{group}] is not [slot.CLASS.INDEX]"));
        }
        let device = get(keys, "device")
            .filter(|d| !d.is_empty())
            .ok_or_else(|| format!("{file}: [{group}] has no device="))?;
        match (get(keys, "bootname"), get(keys, "parent")) {
            (Some(bootname), None) => {
                let device = PathBuf::from(device);
                if !device.is_absolute() {
                    return Err(format!(
                        "{file}: [{group}] device={} is not an absolute path",
                        device.display()
                    ));
                }
                if bootname.is_empty() {
                    return Err(format!("{file}: [{group}] has an empty bootname="));
                }
                bootable.push(Slot {
                    name: name.to_string(),
                    device,
                    bootname: bootname.to_string(),
                });
            }
            (Some(_), Some(parent)) => {
                return Err(format!(
                    "{file}: [{group}] has both bootname= and parent={parent}"
                ));
            }
            (None, _) => others.push(name.to_string()),
        }
    }
    let pair: [Slot; 2] = match <[Slot; 2]>::try_from(bootable) {
        Ok(p) => p,
        Err(v) => {
            let names: Vec<&str> = v.iter().map(|s| s.name.as_str()).collect();
            return Err(format!(
                "{file}: updraft manages one A/B pair of bootable slots; RAUC's configuration has {} ({})",
                names.len(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ));
        }
    };
    if pair[0].bootname == pair[1].bootname {
        return Err(format!(
            "{file}: slots {} and {} have the same bootname {}",
            pair[0].name, pair[1].name, pair[0].bootname
        ));
    }
    if pair[0].device == pair[1].device {
        return Err(format!(
            "{file}: slots {} and {} name the same device {}",
            pair[0].name,
            pair[1].name,
            pair[0].device.display()
        ));
    }
    Ok(System {
        compatible,
        boot,
        pair,
        status_file,
        others,
    })
}

/// The bundle version RAUC's status file records for `slot` (its name,
/// `rootfs.0`), when it records one.
pub fn slot_version(text: &str, file: &str, slot: &str) -> Result<Option<String>, String> {
    let groups = parse_keyfile(text).map_err(|e| format!("{file}: {e}"))?;
    let group = format!("slot.{slot}");
    Ok(groups
        .iter()
        .find(|(g, _)| *g == group)
        .and_then(|(_, keys)| get(keys, "bundle.version"))
        .filter(|v| !v.is_empty())
        .map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "\
# a comment
[system]
compatible = acme-gw
bootloader=uboot
data-directory=/data/rauc

[keyring]
path=/etc/rauc/keyring.pem

[slot.rootfs.0]
device=/dev/mmcblk0p2
type=ext4
bootname=A

[slot.rootfs.1]
device=/dev/mmcblk0p3
type=ext4
bootname=B

[slot.appfs.0]
device=/dev/mmcblk0p5
parent=rootfs.0
";

    #[test]
    fn a_two_slot_uboot_system_is_read_with_its_bootnames_and_status_file() {
        let s = parse_system(CONF, "system.conf").unwrap();
        assert_eq!(s.compatible, "acme-gw");
        assert_eq!(s.boot, Boot::Uboot);
        assert_eq!(s.pair[0].name, "rootfs.0");
        assert_eq!(s.pair[0].device, PathBuf::from("/dev/mmcblk0p2"));
        assert_eq!(s.pair[1].bootname, "B");
        assert_eq!(
            s.status_file,
            Some(PathBuf::from("/data/rauc/central.raucs"))
        );
        assert_eq!(s.others, vec!["appfs.0".to_string()]);
    }

    #[test]
    fn grub_takes_its_grubenv_or_rauc_s_default() {
        let with = CONF.replace(
            "bootloader=uboot",
            "bootloader=grub\ngrubenv=/boot/efi/grubenv",
        );
        assert_eq!(
            parse_system(&with, "f").unwrap().boot,
            Boot::Grub(PathBuf::from("/boot/efi/grubenv"))
        );
        let without = CONF.replace("bootloader=uboot", "bootloader=grub");
        assert_eq!(
            parse_system(&without, "f").unwrap().boot,
            Boot::Grub(PathBuf::from("/boot/grub/grubenv"))
        );
    }

    #[test]
    fn a_statusfile_key_wins_over_the_data_directory_and_per_slot_means_none() {
        let s = CONF.replace("data-directory=/data/rauc", "statusfile=/data/rauc.status");
        assert_eq!(
            parse_system(&s, "f").unwrap().status_file,
            Some(PathBuf::from("/data/rauc.status"))
        );
        let s = CONF.replace("data-directory=/data/rauc", "statusfile=per-slot");
        assert_eq!(parse_system(&s, "f").unwrap().status_file, None);
    }

    /// Each hostile or unsupported configuration, and the words its error
    /// must contain.
    #[test]
    fn configurations_updraft_cannot_take_over_are_named() {
        let third = format!("{CONF}\n[slot.rootfs.2]\ndevice=/dev/mmcblk0p4\nbootname=C\n");
        let rows: Vec<(String, &str)> = vec![
            ("garbage\n".into(), "line 1: expected key=value"),
            ("\u{0}\u{1}".into(), "line 1"),
            ("[system\n".into(), "must end with ']'"),
            ("key=1\n".into(), "before any [group]"),
            (CONF.replace("[keyring]", "[system]"), "appears twice"),
            (CONF.replace("compatible = acme-gw\n", ""), "no compatible="),
            (
                CONF.replace("bootloader=uboot", "bootloader=efi"),
                "bootloader=efi",
            ),
            (CONF.replace("bootloader=uboot\n", ""), "no bootloader="),
            (CONF.replace("bootname=B", "bootname=A"), "same bootname"),
            (
                CONF.replace("/dev/mmcblk0p3", "/dev/mmcblk0p2"),
                "same device",
            ),
            (CONF.replace("device=/dev/mmcblk0p3\n", ""), "no device="),
            (
                CONF.replace("device=/dev/mmcblk0p3", "device=mmcblk0p3"),
                "not an absolute path",
            ),
            (CONF.replace("bootname=B\n", ""), "has 1 (rootfs.0)"),
            (third, "has 3 (rootfs.0, rootfs.1, rootfs.2)"),
            (
                CONF.replace("[slot.rootfs.1]", "[slot.rootfs]"),
                "not [slot.CLASS.INDEX]",
            ),
            ("[slot.rootfs.0]\n".into(), "no [system]"),
        ];
        for (text, want) in rows {
            let e = parse_system(&text, "system.conf").unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.starts_with("system.conf"), "{e}");
        }
    }

    #[test]
    fn the_status_file_names_each_slot_s_bundle_version() {
        let status = "[slot.rootfs.0]\nbundle.compatible=acme-gw\nbundle.version=2024.1\n\
                      sha256=00\nsize=10\nstatus=ok\n\n[slot.rootfs.1]\nstatus=ok\n";
        assert_eq!(
            slot_version(status, "central.raucs", "rootfs.0").unwrap(),
            Some("2024.1".into())
        );
        assert_eq!(
            slot_version(status, "central.raucs", "rootfs.1").unwrap(),
            None
        );
        assert_eq!(
            slot_version(status, "central.raucs", "rootfs.7").unwrap(),
            None
        );
        assert!(
            slot_version("x", "central.raucs", "rootfs.0")
                .unwrap_err()
                .contains("central.raucs: line 1")
        );
    }

    /// Every truncation of a valid configuration, and every single byte
    /// of it replaced by each of a few hostile ones: an error naming the
    /// file, or a pair that keeps every rule.
    #[test]
    fn hostile_bytes_are_errors_or_pairs_that_keep_every_rule() {
        let check = |text: &str| match parse_system(text, "system.conf") {
            Ok(s) => {
                assert!(s.pair[0].device.is_absolute() && s.pair[1].device.is_absolute());
                assert_ne!(s.pair[0].device, s.pair[1].device);
                assert_ne!(s.pair[0].bootname, s.pair[1].bootname);
            }
            Err(e) => assert!(e.starts_with("system.conf: "), "{e}"),
        };
        for cut in 0..=CONF.len() {
            if CONF.is_char_boundary(cut) {
                check(&CONF[..cut]);
            }
        }
        for at in 0..CONF.len() {
            for b in [b'[', b']', b'=', b'\n', b'#', b' ', 0u8] {
                let mut bytes = CONF.as_bytes().to_vec();
                bytes[at] = b;
                if let Ok(text) = std::str::from_utf8(&bytes) {
                    check(text);
                }
            }
        }
    }
}
