//! The `rpi-tryboot` backend: the Raspberry Pi firmware's own A/B boot,
//! without U-Boot (Pi 4, Pi 5, CM4, CM5).
//!
//! The firmware reads `autoboot.txt` from the first FAT partition. Its
//! `[all]` section names the boot partition of every ordinary boot; its
//! `[tryboot]` section is also read when the previous reboot asked for a
//! trial (`reboot "0 tryboot"`: the reboot syscall's argument sets the
//! firmware's one-shot tryboot flag), and names the partition of that one
//! boot. `tryboot_a_b=1` makes the trial load the partition's ordinary
//! `config.txt` rather than `tryboot.txt`, so a slot's boot partition is
//! the same whether it is tried or committed. The booted kernel learns
//! what happened from the device tree: `chosen/bootloader/partition` (the
//! partition booted) and `chosen/bootloader/tryboot` (1 on a trial boot),
//! each a 32-bit big-endian cell.
//!
//! A slot is a pair (boot partition, root partition): the boot partition
//! number is configured per slot (`boot_partition_a`, `boot_partition_b`),
//! the root partition is the slot's device (`slots.a`, `slots.b`), named
//! in that boot partition's `cmdline.txt`. The model maps as:
//!
//! | model                  | `autoboot.txt`                                   |
//! |------------------------|--------------------------------------------------|
//! | the slot booted next   | `[all] boot_partition` (the default)             |
//! | trial of slot X        | `[tryboot] boot_partition` = X's, then `reboot "0 tryboot"` |
//! | slot X committed       | both sections name X's partition                 |
//! | slot X out of the boot | neither section names X's partition              |
//!
//! A trial gets exactly one attempt: the tryboot flag is cleared by the
//! boot that uses it, so whatever stops that boot (a hang the watchdog
//! resets, a power cut, a reboot before the commit) lands in the default
//! slot, and the booted slot, read from the device tree, shows the
//! fallback. The flag lives in the firmware, not on disk: a reboot this
//! daemon did not ask for while a trial is armed boots the default slot
//! too, and counts as a trial that did not come up.
//!
//! Every change writes the whole file anew through
//! [`crate::fsutil::atomic_write`] (a new file, fsync, rename over the old
//! one, fsync of the directory): after a power cut at any instant the
//! firmware finds either the old or the new file. updraft owns the file:
//! it understands only what the firmware documents for it (`[all]`,
//! `[tryboot]`, `[none]`, `boot_partition`, `tryboot_a_b`), refuses
//! anything else rather than drop it, and does not keep comments.
//!
//! This module never reboots (the daemon does, with
//! [`Bootloader::trial_reboot_argument`]) and never writes a slot's boot
//! partition (the `boot` component does).

use std::path::{Path, PathBuf};

use super::{BootState, Bootloader, Change, SlotBoot};
use crate::config::Bootloader as Settings;
use crate::error::{Context, Kind, Result};
use crate::progress::Ticker;
use crate::slot::SlotName;
use crate::{bail, err};

/// The most the firmware reads of `autoboot.txt`.
pub const MAX_AUTOBOOT: usize = 512;

/// The argument of the reboot that arms a trial.
pub const TRYBOOT_ARGUMENT: &str = "0 tryboot";

/// The boot partition of each slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partitions {
    pub a: u32,
    pub b: u32,
}

impl Partitions {
    pub fn of(self, slot: SlotName) -> u32 {
        match slot {
            SlotName::A => self.a,
            SlotName::B => self.b,
        }
    }

    /// The slot whose boot partition is `p`.
    pub fn slot(self, p: u32) -> Option<SlotName> {
        if p == self.a {
            Some(SlotName::A)
        } else if p == self.b {
            Some(SlotName::B)
        } else {
            None
        }
    }
}

/// What `autoboot.txt` selects, as the firmware reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Autoboot {
    /// The boot partition of an ordinary boot.
    pub default: u32,
    /// The boot partition of a trial boot.
    pub tryboot: u32,
    /// `tryboot_a_b=1` in effect on a trial boot.
    pub tryboot_a_b: bool,
}

/// Which lines apply: the firmware's conditional filters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Filter {
    All,
    Tryboot,
    None,
}

/// Parse `autoboot.txt` as the firmware documents it: at most 512 bytes;
/// `[all]` lines apply to every boot, `[tryboot]` lines only to a trial,
/// `[none]` lines to no boot; lines before any filter are `[all]`'s; a
/// later value overrides an earlier one that applies; names are case
/// sensitive and `key=value` has no spaces around `=` (the firmware would
/// not see the setting, so updraft refuses the line rather than read
/// what the firmware does not). `what` names the file in errors.
pub fn parse_autoboot(bytes: &[u8], what: &str) -> Result<Autoboot> {
    if bytes.len() > MAX_AUTOBOOT {
        bail!(
            Bootloader,
            "{what} is {} bytes; the firmware reads only its first {MAX_AUTOBOOT}",
            bytes.len()
        );
    }
    let text =
        std::str::from_utf8(bytes).map_err(|e| err!(Bootloader, "{what} is not text: {e}"))?;
    let mut filter = Filter::All;
    // (ordinary boot, trial boot)
    let mut partition: (Option<u32>, Option<u32>) = (None, None);
    let mut a_b: (Option<bool>, Option<bool>) = (None, None);
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let at = || format!("{what} line {}", n + 1);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            filter = match name.trim() {
                "all" => Filter::All,
                "tryboot" => Filter::Tryboot,
                "none" => Filter::None,
                other => bail!(
                    Bootloader,
                    "{}: filter [{other}] is not one updraft writes back (it knows [all], [tryboot] and [none])",
                    at()
                ),
            };
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!(Bootloader, "{}: expected key=value, found {line:?}", at());
        };
        if key != key.trim_end() || value != value.trim_start() {
            bail!(
                Bootloader,
                "{}: {line:?} has spaces around '=', which the firmware does not read as a setting",
                at()
            );
        }
        let number = || {
            value.parse::<u32>().map_err(|_| {
                err!(
                    Bootloader,
                    "{}: {key}={value:?} is not a partition number",
                    at()
                )
            })
        };
        match key {
            "boot_partition" => {
                let p = number()?;
                if filter != Filter::None && p == 0 {
                    bail!(
                        Bootloader,
                        "{}: boot_partition=0 (the first bootable FAT partition) names no slot",
                        at()
                    );
                }
                set(filter, &mut partition, p);
            }
            "tryboot_a_b" => {
                let on = match value {
                    "0" => false,
                    "1" => true,
                    _ => bail!(Bootloader, "{}: tryboot_a_b={value:?} is not 0 or 1", at()),
                };
                set(filter, &mut a_b, on);
            }
            other => bail!(
                Bootloader,
                "{}: {other} is not a setting updraft writes back (it knows boot_partition and tryboot_a_b)",
                at()
            ),
        }
    }
    let Some(default) = partition.0 else {
        bail!(
            Bootloader,
            "{what} names no boot_partition for an ordinary boot: refusing to guess"
        );
    };
    Ok(Autoboot {
        default,
        tryboot: partition.1.unwrap_or(default),
        tryboot_a_b: a_b.1.unwrap_or(false),
    })
}

/// A value set under `filter`: `[all]` sets both boots, `[tryboot]` the
/// trial's only, `[none]` neither.
fn set<T: Copy>(filter: Filter, into: &mut (Option<T>, Option<T>), v: T) {
    match filter {
        Filter::All => *into = (Some(v), Some(v)),
        Filter::Tryboot => into.1 = Some(v),
        Filter::None => {}
    }
}

/// The file updraft writes for `sel`: `tryboot_a_b=1` under `[all]`, the
/// default partition under `[all]`, the trial's under `[tryboot]`.
pub fn format_autoboot(sel: Autoboot) -> String {
    format!(
        "# Written by updraft (bootloader kind = \"rpi-tryboot\").\n[all]\ntryboot_a_b=1\nboot_partition={}\n[tryboot]\nboot_partition={}\n",
        sel.default, sel.tryboot
    )
}

/// The slots `autoboot.txt` selects: the default's and the trial's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selection {
    pub default: SlotName,
    pub trial: SlotName,
}

/// The selection after `change`. A slot taken out, or marked bad, is
/// named by neither section; a trial names the slot under `[tryboot]` and
/// keeps (or makes) the other the default; a committed slot is named by
/// both.
pub fn apply(sel: Selection, change: Change) -> Selection {
    match change {
        Change::Disable(x) => {
            let default = if sel.default == x {
                x.other()
            } else {
                sel.default
            };
            let trial = if sel.trial == x { default } else { sel.trial };
            Selection { default, trial }
        }
        Change::Trial(x) => Selection {
            default: if sel.default == x {
                x.other()
            } else {
                sel.default
            },
            trial: x,
        },
        Change::MarkGood(x) => Selection {
            default: x,
            trial: x,
        },
        Change::MarkBad(x) => Selection {
            default: x.other(),
            trial: x.other(),
        },
    }
}

/// The model's view of a selection. A trial's slot, when another than
/// the default, comes first, with one attempt: the daemon's next reboot
/// asks for the trial. The default follows: every ordinary boot takes it.
/// A slot neither names is not bootable.
pub fn boot_state(sel: Selection) -> BootState {
    let mut order = vec![sel.trial];
    if sel.trial != sel.default {
        order.push(sel.default);
    }
    let boot = |s: SlotName| {
        let named = order.contains(&s);
        SlotBoot {
            bootable: named,
            tries_left: u32::from(named),
        }
    };
    BootState {
        a: boot(SlotName::A),
        b: boot(SlotName::B),
        order,
    }
}

/// What the firmware tells the booted kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Booted {
    /// The partition it booted.
    pub partition: u32,
    /// The boot was a trial (the tryboot flag was set).
    pub tryboot: bool,
}

/// A device-tree cell: exactly four bytes, big-endian.
pub fn parse_cell(bytes: &[u8], what: &str) -> Result<u32> {
    let cell: [u8; 4] = bytes.try_into().map_err(|_| {
        err!(
            Bootloader,
            "{what} holds {} bytes where the firmware writes one 4-byte cell",
            bytes.len()
        )
    })?;
    Ok(u32::from_be_bytes(cell))
}

/// Read `partition` and `tryboot` under `dir` (`chosen/bootloader`).
pub fn read_booted(dir: &Path) -> Result<Booted> {
    let cell = |name: &str| -> Result<u32> {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).map_err(|e| {
            err!(
                Bootloader,
                "reading {}: {e} (is this a Raspberry Pi started by its own firmware, without U-Boot?)",
                path.display()
            )
        })?;
        parse_cell(&bytes, &path.display().to_string())
    };
    let partition = cell("partition")?;
    let tryboot = match cell("tryboot")? {
        0 => false,
        1 => true,
        v => bail!(
            Bootloader,
            "{} is {v}, neither 0 nor 1",
            dir.join("tryboot").display()
        ),
    };
    Ok(Booted { partition, tryboot })
}

/// The booted slot: the one whose boot partition the firmware booted. A
/// command line that names another slot (`updraft.slot=`) is an error: the
/// two must agree.
pub fn booted_slot(settings: &Settings, cmdline: &Path) -> Result<SlotName> {
    let parts = partitions(settings);
    let dir = &settings.device_tree;
    let booted = read_booted(dir)?;
    let slot = parts.slot(booted.partition).ok_or_else(|| {
        err!(
            Bootloader,
            "the firmware booted partition {} ({}), which is neither slot A's boot partition ({}) nor slot B's ({})",
            booted.partition,
            dir.join("partition").display(),
            parts.a,
            parts.b
        )
    })?;
    let named = std::fs::read_to_string(cmdline)
        .ok()
        .and_then(|c| crate::slot::parse_cmdline(&c));
    if let Some(named) = named {
        if named != slot {
            bail!(
                Bootloader,
                "{} names slot {named} but the firmware booted partition {}, slot {slot}'s: fix cmdline.txt of partition {}",
                cmdline.display(),
                booted.partition,
                booted.partition
            );
        }
    }
    Ok(slot)
}

fn partitions(s: &Settings) -> Partitions {
    Partitions {
        a: s.boot_partition_a,
        b: s.boot_partition_b,
    }
}

pub struct TrybootBootloader {
    autoboot: PathBuf,
    partitions: Partitions,
}

impl TrybootBootloader {
    pub fn new(settings: &Settings) -> Result<TrybootBootloader> {
        let Some(autoboot) = settings.autoboot.clone() else {
            bail!(
                Config,
                "bootloader.autoboot is required when kind = \"rpi-tryboot\" (the path of autoboot.txt on the mounted first FAT partition)"
            );
        };
        Ok(TrybootBootloader {
            autoboot,
            partitions: partitions(settings),
        })
    }

    fn what(&self) -> String {
        self.autoboot.display().to_string()
    }

    fn load(&self) -> Result<Selection> {
        let bytes = std::fs::read(&self.autoboot).kind_context(
            Kind::Bootloader,
            format!(
                "reading {} (refusing to guess a boot selection)",
                self.what()
            ),
        )?;
        let sel = parse_autoboot(&bytes, &self.what())?;
        let slot = |p: u32, section: &str| {
            self.partitions.slot(p).ok_or_else(|| {
                err!(
                    Bootloader,
                    "{}: {section} boot_partition={p} is neither slot A's boot partition ({}) nor slot B's ({})",
                    self.what(),
                    self.partitions.a,
                    self.partitions.b
                )
            })
        };
        Ok(Selection {
            default: slot(sel.default, "[all]")?,
            trial: slot(sel.tryboot, "[tryboot]")?,
        })
    }

    fn change(&mut self, change: Change) -> Result<()> {
        let before = self.load()?;
        let after = apply(before, change);
        if after == before {
            return Ok(());
        }
        self.remove_stale_temporaries();
        let text = format_autoboot(Autoboot {
            default: self.partitions.of(after.default),
            tryboot: self.partitions.of(after.trial),
            tryboot_a_b: true,
        });
        crate::fsutil::atomic_write(&self.autoboot, text.as_bytes(), 0o644)
            .kind_context(Kind::Bootloader, format!("writing {}", self.what()))
    }

    /// Temporary files a power cut left beside `autoboot.txt` (the first
    /// FAT partition is small): removed, best effort.
    fn remove_stale_temporaries(&self) {
        let (Some(dir), Some(name)) = (self.autoboot.parent(), self.autoboot.file_name()) else {
            return;
        };
        let prefix = format!(".{}.tmp.", name.to_string_lossy());
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

impl Bootloader for TrybootBootloader {
    fn describe(&self) -> String {
        format!("rpi-tryboot {}", self.what())
    }

    fn read_with(&mut self, _: &mut dyn Ticker) -> Result<BootState> {
        Ok(boot_state(self.load()?))
    }

    fn disable_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::Disable(slot))
    }

    fn trial_with(&mut self, slot: SlotName, _tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::Trial(slot))
    }

    fn trial_tries(&self, _tries: u32) -> u32 {
        1
    }

    fn trial_reboot_argument(&self) -> Option<&'static str> {
        Some(TRYBOOT_ARGUMENT)
    }

    fn mark_good_with(&mut self, slot: SlotName, _tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::MarkGood(slot))
    }

    fn mark_bad_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.change(Change::MarkBad(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SlotName::{A, B};

    fn parse(text: &str) -> Result<Autoboot> {
        parse_autoboot(text.as_bytes(), "autoboot.txt")
    }

    fn sel(default: SlotName, trial: SlotName) -> Selection {
        Selection { default, trial }
    }

    #[test]
    fn the_documented_file_boots_2_and_tries_3() {
        let a =
            parse("[all]\ntryboot_a_b=1\nboot_partition=2\n[tryboot]\nboot_partition=3\n").unwrap();
        assert_eq!(
            a,
            Autoboot {
                default: 2,
                tryboot: 3,
                tryboot_a_b: true
            }
        );
    }

    #[test]
    fn filters_apply_as_the_firmware_reads_them() {
        // (file, default, trial)
        let rows = [
            // Lines before any filter are [all]'s.
            ("boot_partition=2\n", 2, 2),
            // A later [all] line overrides the trial's too.
            (
                "[tryboot]\nboot_partition=3\n[all]\nboot_partition=2\n",
                2,
                2,
            ),
            (
                "[all]\nboot_partition=2\n[tryboot]\nboot_partition=3\n",
                2,
                3,
            ),
            // [none] lines apply to no boot.
            ("boot_partition=2\n[none]\nboot_partition=9\n", 2, 2),
            ("# comment\n\n  [all]  \n boot_partition=5 \n", 5, 5),
            ("[all]\nboot_partition=2\nboot_partition=3\n", 3, 3),
        ];
        for (text, default, tryboot) in rows {
            let a = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!((a.default, a.tryboot), (default, tryboot), "{text:?}");
        }
    }

    #[test]
    fn hostile_bytes_are_errors_or_selections_that_write_back_to_themselves() {
        let seed = b"[all]\ntryboot_a_b=1\nboot_partition=2\n[tryboot]\nboot_partition=3\n[none]\nboot_partition=0\n";
        let mut rng = crate::test_support::Rng(0x7279_626f_6f74);
        for _ in 0..3000 {
            let bytes = crate::test_support::mutate(&mut rng, seed);
            let Ok(a) = parse_autoboot(&bytes, "autoboot.txt") else {
                continue;
            };
            assert!(a.default != 0 && a.tryboot != 0, "{bytes:?}");
            let written = Autoboot {
                tryboot_a_b: true,
                ..a
            };
            let text = format_autoboot(written);
            assert_eq!(parse(&text).unwrap(), written, "{bytes:?}");
        }
    }

    #[test]
    fn written_files_read_back_and_fit_the_firmware() {
        for (d, t) in [(2, 3), (3, 3), (4_000_000_000, 1)] {
            let sel = Autoboot {
                default: d,
                tryboot: t,
                tryboot_a_b: true,
            };
            let text = format_autoboot(sel);
            assert!(text.len() <= MAX_AUTOBOOT);
            assert_eq!(parse(&text).unwrap(), sel);
        }
    }

    #[test]
    fn hostile_files_are_refused_naming_the_line() {
        let rows = [
            ("", "names no boot_partition"),
            ("[tryboot]\nboot_partition=3\n", "names no boot_partition"),
            (
                "boot_partition=two\n",
                "line 1: boot_partition=\"two\" is not a partition number",
            ),
            ("boot_partition=-1\n", "is not a partition number"),
            ("boot_partition=99999999999\n", "is not a partition number"),
            ("boot_partition=0\n", "boot_partition=0"),
            ("boot_partition=2\n[pi5]\n", "line 2: filter [pi5]"),
            (
                "boot_partition=2\nkernel=x\n",
                "line 2: kernel is not a setting",
            ),
            ("boot_partition=2\ngarbage\n", "line 2: expected key=value"),
            ("tryboot_a_b=yes\nboot_partition=2\n", "tryboot_a_b=\"yes\""),
            (
                "boot_partition = 2\n",
                "line 1: \"boot_partition = 2\" has spaces around '='",
            ),
        ];
        for (text, want) in rows {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains("autoboot.txt"), "{e}");
        }
        let long = format!("boot_partition=2\n{}", "#".repeat(600));
        assert!(parse(&long).unwrap_err().to_string().contains("first 512"));
        let e = parse_autoboot(b"boot_partition=2\n\xff\n", "autoboot.txt").unwrap_err();
        assert!(e.to_string().contains("not text"), "{e}");
    }

    #[test]
    fn changes_row_by_row() {
        // (before, change, after)
        let rows = [
            // Committed on A: a trial of B arms [tryboot] only.
            (sel(A, A), Change::Trial(B), sel(A, B)),
            // The trial's commit names B in both.
            (sel(A, B), Change::MarkGood(B), sel(B, B)),
            // A failed trial: B named by neither.
            (sel(A, B), Change::MarkBad(B), sel(A, A)),
            // The slot being written is named by neither.
            (sel(A, B), Change::Disable(B), sel(A, A)),
            (sel(A, A), Change::Disable(B), sel(A, A)),
            (sel(B, A), Change::Disable(B), sel(A, A)),
            // A trial of the default slot keeps the other as the default.
            (sel(B, B), Change::Trial(B), sel(A, B)),
            (sel(B, B), Change::MarkGood(A), sel(A, A)),
            (sel(B, B), Change::MarkBad(A), sel(B, B)),
        ];
        for (before, change, after) in rows {
            assert_eq!(apply(before, change), after, "{before:?} {change:?}");
        }
    }

    #[test]
    fn the_model_tries_the_trial_once_then_boots_the_default() {
        let s = boot_state(sel(A, B));
        assert_eq!(s.order, vec![B, A]);
        assert_eq!(s.next_boot(), Some(B));
        assert!(s.b.bootable && s.b.tries_left == 1);
        assert!(s.a.bootable && s.a.tries_left == 1);
        let s = boot_state(sel(B, B));
        assert_eq!(s.order, vec![B]);
        assert!(!s.a.bootable);
    }

    fn backend(dir: &Path, text: &[u8]) -> (TrybootBootloader, PathBuf) {
        let path = dir.join("autoboot.txt");
        std::fs::write(&path, text).unwrap();
        let s = Settings {
            autoboot: Some(path.clone()),
            ..Settings::default()
        };
        (TrybootBootloader::new(&s).unwrap(), path)
    }

    #[test]
    fn an_update_cycle_rewrites_the_file_whole() {
        let dir = crate::test_support::scratch_dir("tryboot", "cycle");
        let (mut bl, path) = backend(&dir, b"[all]\nboot_partition=2\n");
        let stale = dir.join(".autoboot.txt.tmp.00000000deadbeef");
        std::fs::write(&stale, "[all]\nboot_partition=").unwrap();
        bl.disable(B).unwrap();
        // Already so: nothing written, the stale file not touched either.
        assert_eq!(std::fs::read(&path).unwrap(), b"[all]\nboot_partition=2\n");
        bl.trial(B, 3).unwrap();
        assert_eq!(bl.trial_tries(3), 1);
        assert_eq!(bl.trial_reboot_argument(), Some("0 tryboot"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            parse(&text).unwrap(),
            Autoboot {
                default: 2,
                tryboot: 3,
                tryboot_a_b: true
            }
        );
        assert!(
            !stale.exists(),
            "a temporary file a power cut left is removed"
        );
        assert_eq!(bl.read().unwrap().next_boot(), Some(B));
        bl.mark_good(B, 3).unwrap();
        let a = parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!((a.default, a.tryboot), (3, 3));
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file left"
        );
    }

    #[test]
    fn a_file_that_does_not_parse_or_names_no_slot_is_never_rewritten() {
        let dir = crate::test_support::scratch_dir("tryboot", "hostile");
        for (text, want) in [
            (
                &b"[all]\nboot_partition=7\n"[..],
                "[all] boot_partition=7 is neither",
            ),
            (
                b"[all]\nboot_partition=2\n[tryboot]\nboot_partition=1\n",
                "[tryboot] boot_partition=1",
            ),
            (b"\x00\x01garbage", "expected key=value"),
        ] {
            let (mut bl, path) = backend(&dir, text);
            for op in [
                bl.trial(B, 1).unwrap_err(),
                bl.mark_good(A, 1).unwrap_err(),
                bl.read().unwrap_err(),
            ] {
                assert!(op.to_string().contains(want), "{op}");
            }
            assert_eq!(std::fs::read(&path).unwrap(), text);
        }
        let s = Settings {
            autoboot: Some(dir.join("missing.txt")),
            ..Settings::default()
        };
        let e = TrybootBootloader::new(&s).unwrap().disable(B).unwrap_err();
        assert!(e.to_string().contains("missing.txt"), "{e}");
        assert!(!dir.join("missing.txt").exists());
    }

    #[test]
    fn device_tree_cells_are_four_big_endian_bytes() {
        assert_eq!(parse_cell(&[0, 0, 0, 3], "p").unwrap(), 3);
        for bad in [&[][..], &[3][..], &[0, 0, 0, 0, 3][..]] {
            let e = parse_cell(bad, "chosen/bootloader/partition").unwrap_err();
            assert!(e.to_string().contains("chosen/bootloader/partition"), "{e}");
        }
    }

    #[test]
    fn the_booted_slot_comes_from_the_device_tree_and_must_agree_with_the_command_line() {
        let dir = crate::test_support::scratch_dir("tryboot", "dt");
        let dt = dir.join("bootloader");
        std::fs::create_dir_all(&dt).unwrap();
        let cmdline = dir.join("cmdline");
        let s = Settings {
            device_tree: dt.clone(),
            ..Settings::default()
        };
        let write = |p: u32, t: u32| {
            std::fs::write(dt.join("partition"), p.to_be_bytes()).unwrap();
            std::fs::write(dt.join("tryboot"), t.to_be_bytes()).unwrap();
        };
        write(3, 1);
        std::fs::write(&cmdline, "root=/dev/mmcblk0p6\n").unwrap();
        assert_eq!(booted_slot(&s, &cmdline).unwrap(), B);
        std::fs::write(&cmdline, "root=/dev/mmcblk0p6 updraft.slot=B\n").unwrap();
        assert_eq!(booted_slot(&s, &cmdline).unwrap(), B);
        std::fs::write(&cmdline, "updraft.slot=A\n").unwrap();
        let e = booted_slot(&s, &cmdline).unwrap_err().to_string();
        assert!(e.contains("names slot A") && e.contains("slot B"), "{e}");
        write(7, 0);
        let e = booted_slot(&s, &cmdline).unwrap_err().to_string();
        assert!(e.contains("partition 7"), "{e}");
        write(2, 2);
        let e = booted_slot(&s, &cmdline).unwrap_err().to_string();
        assert!(e.contains("neither 0 nor 1"), "{e}");
        std::fs::remove_file(dt.join("partition")).unwrap();
        let e = booted_slot(&s, &cmdline).unwrap_err().to_string();
        assert!(e.contains("without U-Boot"), "{e}");
    }
}
