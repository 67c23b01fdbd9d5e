//! Boot selection: which slot the bootloader tries next, and how often.
//!
//! One trait, several backends. Every backend expresses the same model: an
//! ordered list of slots to try, and per slot whether it may be booted and
//! how many attempts it has left. The backends map that model onto their
//! bootloader's variables so that existing boot scripts work unchanged:
//!
//! | model                 | U-Boot (`uboot`)         | GRUB (`grub`)              | `file`           |
//! |-----------------------|--------------------------|----------------------------|------------------|
//! | order                 | `BOOT_ORDER="A B"`       | `ORDER="A B"`              | `BOOT_ORDER`     |
//! | attempts left         | `BOOT_A_LEFT=3`          | `A_TRY=0` (one try)        | `BOOT_A_LEFT`    |
//! | may be booted         | in `BOOT_ORDER`, LEFT>0  | `A_OK=1`, in `ORDER`       | as U-Boot        |
//!
//! The Raspberry Pi firmware (`rpi-tryboot`) has no order or counter of
//! its own: `autoboot.txt` names a default partition and a trial's, and a
//! trial is one boot armed by the reboot ([`tryboot`] maps the model).
//!
//! Every change is one write of the whole environment, so a power cut leaves
//! either the old or the new selection, never a mix, as far as the medium
//! allows (see `docs/bootloaders.md`). A backend must refuse to write when it
//! cannot read a valid current state: guessing a fresh environment is how
//! devices get bricked.

pub mod file;
pub mod flow;
pub mod grub;
pub mod mender_grubenv;
pub mod script;
pub mod tryboot;
pub mod uboot;

use std::fmt;

use crate::config::{BootFlow, BootloaderKind, Config};
use crate::err;
use crate::error::Result;
use crate::progress::{NoTick, Ticker};
use crate::slot::SlotName;

/// Per-slot boot status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotBoot {
    /// The bootloader may pick this slot (in the order, marked OK).
    pub bootable: bool,
    /// Attempts left before the bootloader falls back (GRUB: 1 or 0).
    pub tries_left: u32,
}

/// The boot selection as read from the bootloader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootState {
    /// Slots in the order the bootloader tries them.
    pub order: Vec<SlotName>,
    pub a: SlotBoot,
    pub b: SlotBoot,
}

impl BootState {
    pub fn slot(&self, s: SlotName) -> SlotBoot {
        match s {
            SlotName::A => self.a,
            SlotName::B => self.b,
        }
    }

    /// The slot the bootloader will boot next: the first in the order that
    /// is bootable and has attempts left.
    pub fn next_boot(&self) -> Option<SlotName> {
        self.order
            .iter()
            .copied()
            .find(|s| self.slot(*s).bootable && self.slot(*s).tries_left > 0)
    }
}

impl fmt::Display for BootState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let order: Vec<&str> = self.order.iter().map(|s| s.as_str()).collect();
        write!(
            f,
            "order [{}], A {}({} left), B {}({} left)",
            order.join(" "),
            if self.a.bootable { "ok" } else { "off" },
            self.a.tries_left,
            if self.b.bootable { "ok" } else { "off" },
            self.b.tries_left
        )
    }
}

/// What updraft asks of a bootloader.
///
/// Each operation takes the driver's [`Ticker`]: a backend that has to wait
/// (for the environment's lock, for an operator's script) waits through it
/// with [`Uninterrupted`](crate::progress::Uninterrupted), so the daemon
/// keeps answering its socket and pinging the watchdog meanwhile, and the
/// operation is never abandoned halfway. Every such wait is bounded by the
/// backend's own timeout. The methods without `_with` are the same
/// operations for callers with nothing to serve (one-shot commands, tools,
/// tests).
pub trait Bootloader {
    /// A short name for logs ("uboot /etc/fw_env.config").
    fn describe(&self) -> String;

    /// Read the current selection. Fails when the environment is corrupt.
    fn read_with(&mut self, t: &mut dyn Ticker) -> Result<BootState>;

    /// Take `slot` out of the boot order entirely (not bootable, no attempts)
    /// so a half-written slot can never be booted, not even by a boot script
    /// that resets counters when nothing is bootable.
    fn disable_with(&mut self, slot: SlotName, t: &mut dyn Ticker) -> Result<()>;

    /// Put `slot` first for a counted trial boot with `tries` attempts. The
    /// other slot stays in the order as the fallback.
    fn trial_with(&mut self, slot: SlotName, tries: u32, t: &mut dyn Ticker) -> Result<()>;

    /// The attempts a trial boot gets when `tries` are asked for: `tries`,
    /// unless the bootloader counts its own way (GRUB gives one).
    fn trial_tries(&self, tries: u32) -> u32 {
        tries
    }

    /// What the reboot into a trial passes to the reboot command, when the
    /// trial is armed by the reboot itself (the Raspberry Pi firmware's
    /// one-shot tryboot flag: `reboot "0 tryboot"`). `None`: the selection
    /// written is the trial.
    fn trial_reboot_argument(&self) -> Option<&'static str> {
        None
    }

    /// Mark `slot` good: first in the order, bootable, attempts reset to
    /// `tries`. Writes nothing when that is already the state.
    fn mark_good_with(&mut self, slot: SlotName, tries: u32, t: &mut dyn Ticker) -> Result<()>;

    /// Mark `slot` bad: out of the order, the other slot first.
    fn mark_bad_with(&mut self, slot: SlotName, t: &mut dyn Ticker) -> Result<()>;

    /// [`Bootloader::read_with`], serving nothing while it waits.
    fn read(&mut self) -> Result<BootState> {
        self.read_with(&mut NoTick)
    }

    /// [`Bootloader::disable_with`], serving nothing while it waits.
    fn disable(&mut self, slot: SlotName) -> Result<()> {
        self.disable_with(slot, &mut NoTick)
    }

    /// [`Bootloader::trial_with`], serving nothing while it waits.
    fn trial(&mut self, slot: SlotName, tries: u32) -> Result<()> {
        self.trial_with(slot, tries, &mut NoTick)
    }

    /// [`Bootloader::mark_good_with`], serving nothing while it waits.
    fn mark_good(&mut self, slot: SlotName, tries: u32) -> Result<()> {
        self.mark_good_with(slot, tries, &mut NoTick)
    }

    /// [`Bootloader::mark_bad_with`], serving nothing while it waits.
    fn mark_bad(&mut self, slot: SlotName) -> Result<()> {
        self.mark_bad_with(slot, &mut NoTick)
    }
}

/// A change the daemon asks of the boot selection: the model's write
/// operations as a value, so a backend maps them with a pure function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Disable(SlotName),
    Trial(SlotName),
    MarkGood(SlotName),
    MarkBad(SlotName),
}

/// Build the backend the configuration names.
pub fn from_config(cfg: &Config) -> Result<Box<dyn Bootloader>> {
    let b = &cfg.bootloader;
    Ok(match b.kind {
        BootloaderKind::File => Box::new(file::FileBootloader::new(b.path.clone())),
        BootloaderKind::Uboot => {
            let mut u = uboot::UbootBootloader::from_config_file(&b.fw_env_config)?;
            u.set_lock_file(b.lock_file.clone());
            u.set_flow(match b.flow {
                BootFlow::Updraft => uboot::Flow::updraft(),
                BootFlow::Rauc => uboot::Flow::Order {
                    names: [b.bootname_a.clone(), b.bootname_b.clone()],
                },
                BootFlow::Mender => uboot::Flow::Mender {
                    partitions: [b.boot_partition_a, b.boot_partition_b],
                },
            });
            Box::new(u)
        }
        BootloaderKind::Grub if b.flow == BootFlow::Mender => {
            Box::new(mender_grubenv::MenderGrubBootloader::new(
                b.mender_grubenv.clone(),
                [b.boot_partition_a, b.boot_partition_b],
            )?)
        }
        BootloaderKind::Grub => {
            let mut g = grub::GrubBootloader::new(b.grubenv.clone())?;
            if b.flow == BootFlow::Rauc {
                g.set_names([b.bootname_a.clone(), b.bootname_b.clone()]);
            }
            Box::new(g)
        }
        BootloaderKind::Script => {
            let Some(script) = &b.script else {
                return Err(err!(
                    Config,
                    "bootloader.script is required when kind = \"script\""
                ));
            };
            Box::new(script::ScriptBootloader::new(script.clone())?)
        }
        BootloaderKind::RpiTryboot => Box::new(tryboot::TrybootBootloader::new(b)?),
    })
}

/// The booted slot. The Raspberry Pi firmware says which partition it
/// booted in the device tree; every other bootloader passes
/// `updraft.slot=` on the kernel command line, or another updater's boot
/// script a `root=` naming a slot; RAUC's scripts pass `rauc.slot=` with
/// the slot's bootname, which the RAUC flow reads first.
pub fn booted_slot(cfg: &Config) -> Result<SlotName> {
    let b = &cfg.bootloader;
    match b.kind {
        BootloaderKind::RpiTryboot => tryboot::booted_slot(b, &cfg.slots.cmdline),
        _ if b.flow == BootFlow::Rauc => {
            let text = std::fs::read_to_string(&cfg.slots.cmdline)
                .map_err(|e| err!(Slot, "reading {}: {e}", cfg.slots.cmdline.display()))?;
            match flow::rauc_slot(&text, [&b.bootname_a, &b.bootname_b]) {
                Some(found) => {
                    found.map_err(|e| err!(Slot, "{}: {e}", cfg.slots.cmdline.display()))
                }
                None => crate::slot::booted_slot(&cfg.slots.cmdline, &cfg.slots.a, &cfg.slots.b),
            }
        }
        _ => crate::slot::booted_slot(&cfg.slots.cmdline, &cfg.slots.a, &cfg.slots.b),
    }
}

/// The model operations on a generic (order, left) pair, shared by the
/// backends that store U-Boot style variables.
pub mod model {
    use super::*;

    /// Order without `slot`.
    pub fn without(order: &[SlotName], slot: SlotName) -> Vec<SlotName> {
        order.iter().copied().filter(|s| *s != slot).collect()
    }

    /// Order with `slot` first, followed by the rest in their order.
    pub fn first(order: &[SlotName], slot: SlotName) -> Vec<SlotName> {
        let mut v = vec![slot];
        v.extend(without(order, slot));
        v
    }

    /// Parse a space-separated order ("A B"); unknown names are an error,
    /// duplicates are dropped.
    pub fn parse_order(text: &str) -> Result<Vec<SlotName>> {
        let mut out = Vec::new();
        for word in text.split_whitespace() {
            let s = SlotName::parse(word).ok_or_else(|| {
                err!(
                    Bootloader,
                    "boot order {text:?} names unknown slot {word:?}"
                )
            })?;
            if !out.contains(&s) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Parse `var`'s space-separated order of `names` (slot A's, slot
    /// B's: RAUC's bootnames, or `A` and `B`); a name that is neither is an
    /// error (updraft cannot keep a slot it does not drive), duplicates are
    /// dropped.
    pub fn parse_named(var: &str, text: &str, names: &[String; 2]) -> Result<Vec<SlotName>> {
        let mut out = Vec::new();
        for word in text.split_whitespace() {
            let s = if word == names[0] {
                SlotName::A
            } else if word == names[1] {
                SlotName::B
            } else {
                return Err(err!(
                    Bootloader,
                    "{var} {text:?} names {word:?}, which is neither slot A's bootname ({}) nor slot B's ({})",
                    names[0],
                    names[1]
                ));
            };
            if !out.contains(&s) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// `order` as `names`, space-separated.
    pub fn format_named(order: &[SlotName], names: &[String; 2]) -> String {
        order
            .iter()
            .map(|s| match s {
                SlotName::A => names[0].as_str(),
                SlotName::B => names[1].as_str(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Slot A's and slot B's names in updraft's own scripts.
    pub fn plain_names() -> [String; 2] {
        ["A".into(), "B".into()]
    }

    pub fn format_order(order: &[SlotName]) -> String {
        order
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}
