//! `fw_env.config`: where the copies of the U-Boot environment live.
//!
//! This module owns libubootenv's line format: `DEVICE OFFSET ENVSIZE
//! [SECTORSIZE [SECTORS]]`, one line for a single copy, two for a redundant
//! pair. Numbers are read as libubootenv reads them (the offset as C's
//! `strtoll`, sizes as hexadecimal even without `0x`), so a file that works
//! for `fw_printenv` names the very same bytes for updraft.
//!
//! It only describes locations and must never open the devices it names:
//! they are opened, measured and checked when the environment is accessed,
//! under the lock, because that is the only moment the answer holds.
//!
//! It is stricter than libubootenv and must stay so: lines libubootenv
//! skips silently (short, garbled, a third copy) are errors here, because a
//! skipped line can quietly turn a redundant pair into a single copy that
//! is then overwritten in place. MTD and UBI devices are refused, because
//! writing raw flash needs erase handling that updraft does not have.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Context, Kind, Result};
use crate::{bail, err};

/// Largest environment copy accepted. Real environments are 8 KiB to
/// 1 MiB; the bound keeps a typo in `fw_env.config` from allocating
/// without limit.
const MAX_ENV_SIZE: usize = 16 * 1024 * 1024;

/// Smallest environment copy accepted (header plus a few bytes of data).
const MIN_ENV_SIZE: usize = 16;

/// Largest `fw_env.config` read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// Where one copy of the environment lives (one `fw_env.config` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvLocation {
    pub device: PathBuf,
    /// Byte offset; negative counts back from the end of a block device.
    pub offset: i64,
    /// Size of the copy, header included.
    pub env_size: usize,
    /// Erase-block size and count: MTD only, kept for completeness.
    pub sector_size: Option<u64>,
    pub sectors: Option<u64>,
}

/// The parsed `fw_env.config`: one copy, or two for a redundant pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FwEnvConfig {
    pub copies: Vec<EnvLocation>,
}

impl FwEnvConfig {
    pub(super) fn redundant(&self) -> bool {
        self.copies.len() == 2
    }

    pub(super) fn env_size(&self) -> usize {
        self.copies.first().map(|c| c.env_size).unwrap_or(0)
    }
}

/// An integer as C's `strtoll(s, NULL, 0)` reads a whole field: optional
/// sign, `0x` hex, leading-zero octal, or decimal.
fn parse_c_integer(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) =
        if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
            (16, h)
        } else if body.len() > 1 && body.starts_with('0') {
            (8, &body[1..])
        } else {
            (10, body)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from(u64::from_str_radix(digits, radix).ok()?);
    i64::try_from(if neg { -magnitude } else { magnitude }).ok()
}

/// A hexadecimal field as C's `%zx` reads it (with or without `0x`).
fn parse_hex(s: &str) -> Option<u64> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Parse the text of an `fw_env.config` in libubootenv's line format:
/// `DEVICE OFFSET ENVSIZE [SECTORSIZE [SECTORS]]`, `#` comments. OFFSET is
/// a C integer (`0x…` hex, `0…` octal, decimal, negative = from the end of
/// a block device); ENVSIZE, SECTORSIZE and SECTORS are hexadecimal with or
/// without `0x`, as libubootenv reads them (so `4000` is 16 KiB). Lines
/// libubootenv would skip silently because they are short or garbled are
/// errors here.
pub fn parse_fw_env_config(text: &str) -> Result<FwEnvConfig> {
    let mut copies: Vec<EnvLocation> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let fields: Vec<&str> = line
            .split_whitespace()
            .take_while(|f| !f.starts_with('#'))
            .collect();
        if fields.is_empty() {
            continue;
        }
        if fields.len() < 3 {
            let hint = if fields[0].ends_with(':') {
                " (this looks like libubootenv's YAML format, which updraft does not read)"
            } else {
                ""
            };
            bail!(
                Malformed,
                "line {n}: expected DEVICE OFFSET ENVSIZE [SECTORSIZE [SECTORS]], found {:?}{hint}",
                line.trim()
            );
        }
        if fields.len() > 5 {
            bail!(
                Malformed,
                "line {n}: {} fields, at most 5 expected (DEVICE OFFSET ENVSIZE SECTORSIZE SECTORS; the MTD lock field is not supported)",
                fields.len()
            );
        }
        if copies.len() == 2 {
            bail!(
                Malformed,
                "line {n}: a third environment copy; U-Boot keeps one or two"
            );
        }
        let device = fields[0];
        if !device.starts_with('/') {
            bail!(
                Malformed,
                "line {n}: device {device:?} is not an absolute path"
            );
        }
        if device.starts_with("/dev/mtd") || device.starts_with("/dev/ubi") {
            bail!(
                Malformed,
                "line {n}: {device} is an MTD/UBI device; updraft writes environments on files and block devices only (use the script backend with fw_setenv for raw flash)"
            );
        }
        let offset = parse_c_integer(fields[1]).ok_or_else(|| {
            err!(
                Malformed,
                "line {n}: offset {:?} is not a number",
                fields[1]
            )
        })?;
        let env_size = parse_hex(fields[2]).ok_or_else(|| {
            err!(
                Malformed,
                "line {n}: size {:?} is not a hexadecimal number",
                fields[2]
            )
        })?;
        if env_size < MIN_ENV_SIZE as u64 || env_size > MAX_ENV_SIZE as u64 {
            bail!(
                Malformed,
                "line {n}: size {:#x} is outside {MIN_ENV_SIZE:#x}..={MAX_ENV_SIZE:#x} (sizes are hexadecimal, as libubootenv reads them)",
                env_size
            );
        }
        let hex_field = |idx: usize, what: &str| -> Result<Option<u64>> {
            fields
                .get(idx)
                .map(|f| {
                    parse_hex(f).ok_or_else(|| {
                        err!(
                            Malformed,
                            "line {n}: {what} {f:?} is not a hexadecimal number"
                        )
                    })
                })
                .transpose()
        };
        let sector_size = hex_field(3, "sector size")?;
        let sectors = hex_field(4, "sector count")?;
        copies.push(EnvLocation {
            device: PathBuf::from(device),
            offset,
            env_size: env_size as usize,
            sector_size,
            sectors,
        });
    }
    match copies.as_slice() {
        [] => bail!(
            Malformed,
            "no environment copy described (expected DEVICE OFFSET ENVSIZE lines)"
        ),
        [a, b] => {
            if a.env_size != b.env_size {
                bail!(
                    Malformed,
                    "the two copies differ in size ({:#x} and {:#x}); a redundant environment needs equal sizes",
                    a.env_size,
                    b.env_size
                );
            }
            if a.device == b.device && a.offset >= 0 && b.offset >= 0 {
                let (lo, hi) = if a.offset <= b.offset { (a, b) } else { (b, a) };
                if (lo.offset as u64).saturating_add(lo.env_size as u64) > hi.offset as u64 {
                    bail!(
                        Malformed,
                        "the two copies overlap on {} (offsets {:#x} and {:#x}, size {:#x})",
                        a.device.display(),
                        lo.offset,
                        hi.offset,
                        a.env_size
                    );
                }
            }
        }
        _ => {}
    }
    Ok(FwEnvConfig { copies })
}

/// Read and parse the `fw_env.config` at `path`; errors name the file.
pub(super) fn read_fw_env_config(path: &Path) -> Result<FwEnvConfig> {
    let ctx = || format!("reading {}", path.display());
    let file = File::open(path)
        .with_context(ctx)
        .map_err(|e| e.with_kind(Kind::Bootloader))?;
    let len = file
        .metadata()
        .with_context(ctx)
        .map_err(|e| e.with_kind(Kind::Bootloader))?
        .len();
    if len > MAX_CONFIG_BYTES {
        bail!(
            Bootloader,
            "{} is {len} bytes, larger than any fw_env.config",
            path.display()
        );
    }
    let bytes = std::fs::read(path)
        .with_context(ctx)
        .map_err(|e| e.with_kind(Kind::Bootloader))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| err!(Bootloader, "{} is not UTF-8 text", path.display()))?;
    parse_fw_env_config(&text).kind_context(Kind::Bootloader, path.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{Rng, mutate};

    #[test]
    fn config_lines_in_libubootenv_format() {
        let c = parse_fw_env_config(
            "# comment\n\n/dev/mmcblk0 0x3fe000 0x2000\n  /dev/mmcblk0\t-0x2000 2000 0x200 4 # trailing\n",
        )
        .unwrap();
        assert!(c.redundant());
        assert_eq!(c.copies[0].offset, 0x3fe000);
        assert_eq!(c.copies[0].env_size, 0x2000);
        assert_eq!(c.copies[1].offset, -0x2000);
        assert_eq!(c.copies[1].env_size, 0x2000, "sizes are hex without 0x too");
        assert_eq!(c.copies[1].sector_size, Some(0x200));
        assert_eq!(c.copies[1].sectors, Some(4));
        let single = parse_fw_env_config("/boot/uboot.env 0 0x4000\n").unwrap();
        assert!(!single.redundant());
        assert_eq!(
            parse_fw_env_config("/x 010 0x4000").unwrap().copies[0].offset,
            8,
            "octal"
        );
        assert_eq!(
            parse_fw_env_config("/x 16 0x4000").unwrap().copies[0].offset,
            16
        );
    }

    #[test]
    fn config_errors_name_the_line() {
        let cases = [
            ("", "no environment copy"),
            ("# only comments\n", "no environment copy"),
            (
                "/dev/mmcblk0 0x0\n",
                "line 1: expected DEVICE OFFSET ENVSIZE",
            ),
            ("uboot:\n  size: 0x4000\n", "YAML"),
            ("/x 0 0x4000\n/y zz 0x4000\n", "line 2: offset \"zz\""),
            ("/x 0 0x4000g\n", "size \"0x4000g\""),
            ("/x 0 0\n", "outside"),
            ("/x 0 0x10000000\n", "outside"),
            ("/x 0 0x4000 0x1000 2 1\n", "at most 5"),
            (
                "/x 0 0x4000\n/x 0x4000 0x4000\n/x 0x8000 0x4000\n",
                "line 3: a third",
            ),
            ("/x 0 0x4000\n/y 0 0x2000\n", "differ in size"),
            ("/x 0 0x4000\n/x 0x2000 0x4000\n", "overlap"),
            ("/dev/mtd1 0 0x4000\n", "MTD/UBI"),
            ("relative 0 0x4000\n", "absolute"),
            ("/x 0x 0x4000\n", "offset"),
            ("/x 0x8000000000000000 0x4000\n", "offset"),
            ("/x 0 0x4000 zz\n", "sector size"),
        ];
        for (text, want) in cases {
            let e = parse_fw_env_config(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn numbers_parse_as_c_does() {
        assert_eq!(parse_c_integer("0x10"), Some(16));
        assert_eq!(parse_c_integer("-0X10"), Some(-16));
        assert_eq!(parse_c_integer("0"), Some(0));
        assert_eq!(parse_c_integer("017"), Some(15));
        assert_eq!(parse_c_integer("08"), None);
        assert_eq!(parse_c_integer("+5"), Some(5));
        assert_eq!(parse_c_integer("0x+5"), None);
        assert_eq!(parse_c_integer("-"), None);
        assert_eq!(parse_hex("4000"), Some(0x4000));
        assert_eq!(parse_hex("0x"), None);
        assert_eq!(parse_hex("+1"), None);
    }

    #[test]
    fn mutated_configs_never_panic() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let seed = b"# env\n/dev/mmcblk0 0x3fc000 0x2000 0x200 1\n/dev/mmcblk0 -0x2000 2000\n";
        let mut ok = 0;
        for _ in 0..20_000 {
            let text = mutate(&mut rng, seed);
            if let Ok(c) = parse_fw_env_config(&String::from_utf8_lossy(&text)) {
                ok += 1;
                assert!(matches!(c.copies.len(), 1 | 2));
                assert!(
                    c.copies
                        .iter()
                        .all(|l| (MIN_ENV_SIZE..=MAX_ENV_SIZE).contains(&l.env_size))
                );
            }
        }
        assert!(ok > 100, "some mutations stay valid ({ok})");
    }
}
