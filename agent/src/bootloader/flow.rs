//! Whose variables the U-Boot environment keeps the boot selection in:
//! updraft's own, RAUC's, or Mender's. A device taken over from another
//! updater keeps booting with the boot script it has; updraft reads and
//! writes that script's variables with their owner's meaning.
//!
//! | model | `updraft`, `rauc` | `mender` |
//! |---|---|---|
//! | order | `BOOT_ORDER="A B"` (`rauc`: RAUC's bootnames) | `mender_boot_part` first; during a trial (`upgrade_available=1`) the other partition after it |
//! | attempts left | `BOOT_<name>_LEFT` | the trial's: `bootlimit` (1 when unset) minus `bootcount` |
//! | trial of X | X first, `BOOT_X_LEFT=tries` | `mender_boot_part`/`_hex` = X's partition, `upgrade_available=1`, `bootcount=0` |
//! | X committed | X first, `BOOT_X_LEFT=tries` | `mender_boot_part` = X's, `upgrade_available=0`, `bootcount=0` |
//! | X bad | X out of `BOOT_ORDER`, `BOOT_X_LEFT=0` | `mender_boot_part` = the other's, `upgrade_available=0`, `bootcount=0` |
//!
//! RAUC's U-Boot script is the one updraft's own follows (RAUC's
//! documentation: `BOOT_ORDER` lists bootnames, the first with attempts
//! left in `BOOT_<bootname>_LEFT` boots and loses one); only the names
//! differ, taken from RAUC's `system.conf` (`bootname=`). Mender's
//! (its U-Boot integration): the boot script boots partition
//! `mender_boot_part`; U-Boot's boot count limit counts `bootcount` up on
//! every boot while `upgrade_available=1`, and past `bootlimit` runs
//! `altbootcmd`, which switches `mender_boot_part` to the other partition
//! and clears `upgrade_available`. Mender's client writes the same
//! variables in the same way when it installs, commits and rolls back.
//!
//! Mender's GRUB integration keeps the same variables in GRUB environment
//! blocks of its own (`mender_grubenv.rs`); RAUC's GRUB script reads
//! updraft's GRUB variables with its bootnames (`grub.rs`).
//!
//! Pure: the mapping over a set of variables ([`Vars`]: a U-Boot
//! environment, a GRUB environment block). Reading and writing them, and
//! their locks, are the backends'.

use crate::bootloader::{BootState, Change, SlotBoot, model};
use crate::error::Result;
use crate::slot::SlotName;
use crate::{bail, err};

/// Attempts a missing or empty `BOOT_x_LEFT` stands for: the default of the
/// RAUC-style boot script.
pub const DEFAULT_LEFT: u32 = 3;

/// Whose boot script reads the environment.
/// Variables a boot script reads: a U-Boot environment, a GRUB block.
pub trait Vars {
    /// The value of `name` as text, `None` when missing or empty (a boot
    /// script's `test -n` treats both alike); not text is an error.
    fn text(&self, name: &str) -> Result<Option<String>>;

    /// Set `name` to `value`, in place where it exists.
    fn set_text(&mut self, name: &str, value: &str) -> Result<()>;
}

impl Vars for crate::bootloader::uboot::Environment {
    fn text(&self, name: &str) -> Result<Option<String>> {
        text_of(name, self.get(name).map(<[u8]>::to_vec))
    }

    fn set_text(&mut self, name: &str, value: &str) -> Result<()> {
        self.set(name, value)
    }
}

impl Vars for crate::bootloader::grub::GrubEnv {
    fn text(&self, name: &str) -> Result<Option<String>> {
        text_of(name, self.get(name))
    }

    fn set_text(&mut self, name: &str, value: &str) -> Result<()> {
        self.set(name, value)
    }
}

fn text_of(name: &str, value: Option<Vec<u8>>) -> Result<Option<String>> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => String::from_utf8(v).map(Some).map_err(|e| {
            err!(
                Bootloader,
                "{name} is not text: {:?}",
                String::from_utf8_lossy(e.as_bytes())
            )
        }),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Flow {
    /// `BOOT_ORDER` and `BOOT_<name>_LEFT` with these names for slots A
    /// and B: `A` and `B` for updraft's own script, RAUC's bootnames for
    /// RAUC's.
    Order { names: [String; 2] },
    /// Mender's variables, slot A and B being these partition numbers in
    /// `mender_boot_part`.
    Mender { partitions: [u32; 2] },
}

impl Flow {
    /// updraft's own script's variables.
    pub fn updraft() -> Flow {
        Flow::Order {
            names: model::plain_names(),
        }
    }

    pub fn read(&self, env: &dyn Vars) -> Result<BootState> {
        match self {
            Flow::Order { names } => Ok(Order::from_env(env, names)?.state()),
            Flow::Mender { partitions } => Ok(Mender::from_env(env, *partitions)?.state()),
        }
    }

    /// Make `change` in `env`; `tries` for a trial and a commit.
    pub fn apply(&self, env: &mut dyn Vars, change: Change, tries: u32) -> Result<()> {
        match self {
            Flow::Order { names } => {
                let mut o = Order::from_env(env, names)?;
                o.apply(change, tries);
                if o.order.is_empty() {
                    bail!(
                        Bootloader,
                        "refusing to write an empty BOOT_ORDER: boot scripts read it as every slot and would boot both"
                    );
                }
                o.store(env, names)
            }
            Flow::Mender { partitions } => {
                let mut m = Mender::from_env(env, *partitions)?;
                m.apply(change);
                m.store(env)
            }
        }
    }
}

fn index(slot: SlotName) -> usize {
    match slot {
        SlotName::A => 0,
        SlotName::B => 1,
    }
}

/// A decimal count as boot scripts write it.
fn count(name: &str, t: &str) -> Result<u32> {
    if !t.bytes().all(|b| b.is_ascii_digit()) {
        bail!(Bootloader, "{name}={t:?} is not a count");
    }
    t.parse::<u32>()
        .map_err(|_| err!(Bootloader, "{name}={t:?} is not a count"))
}

/// `BOOT_ORDER` and the attempts left.
struct Order {
    order: Vec<SlotName>,
    left: [u32; 2],
}

fn left_var(names: &[String; 2], slot: SlotName) -> String {
    format!("BOOT_{}_LEFT", names[index(slot)])
}

impl Order {
    fn from_env(env: &dyn Vars, names: &[String; 2]) -> Result<Order> {
        // Missing variables read as the boot script initialises them: only
        // slot A, with full attempts; B is not bootable until an image was
        // written and verified into it.
        let order = match env.text("BOOT_ORDER")? {
            Some(t) => model::parse_named("BOOT_ORDER", &t, names)?,
            None => vec![SlotName::A],
        };
        let mut left = [DEFAULT_LEFT, 0];
        for slot in [SlotName::A, SlotName::B] {
            let name = left_var(names, slot);
            if let Some(t) = env.text(&name)? {
                left[index(slot)] = count(&name, &t)?;
            }
        }
        Ok(Order { order, left })
    }

    fn state(&self) -> BootState {
        let slot = |s: SlotName| SlotBoot {
            bootable: self.order.contains(&s) && self.left[index(s)] > 0,
            tries_left: self.left[index(s)],
        };
        BootState {
            a: slot(SlotName::A),
            b: slot(SlotName::B),
            order: self.order.clone(),
        }
    }

    fn apply(&mut self, change: Change, tries: u32) {
        match change {
            Change::Disable(x) => {
                self.order = model::without(&self.order, x);
                self.left[index(x)] = 0;
            }
            Change::Trial(x) | Change::MarkGood(x) => {
                self.order = model::first(&self.order, x);
                self.left[index(x)] = tries;
            }
            Change::MarkBad(x) => {
                self.order = model::first(&model::without(&self.order, x), x.other());
                self.left[index(x)] = 0;
            }
        }
    }

    fn store(&self, env: &mut dyn Vars, names: &[String; 2]) -> Result<()> {
        env.set_text("BOOT_ORDER", &model::format_named(&self.order, names))?;
        for slot in [SlotName::A, SlotName::B] {
            env.set_text(&left_var(names, slot), &self.left[index(slot)].to_string())?;
        }
        Ok(())
    }
}

/// Mender's variables.
struct Mender {
    partitions: [u32; 2],
    /// The slot `mender_boot_part` names.
    part: SlotName,
    upgrade_available: bool,
    bootcount: u32,
    bootlimit: u32,
}

impl Mender {
    fn from_env(env: &dyn Vars, partitions: [u32; 2]) -> Result<Mender> {
        let Some(p) = env.text("mender_boot_part")? else {
            bail!(
                Bootloader,
                "mender_boot_part is not set: the boot script would not know what to boot; refusing to guess"
            );
        };
        let n = count("mender_boot_part", &p)?;
        let part = if n == partitions[0] {
            SlotName::A
        } else if n == partitions[1] {
            SlotName::B
        } else {
            bail!(
                Bootloader,
                "mender_boot_part={n} is neither slot A's partition ({}) nor slot B's ({})",
                partitions[0],
                partitions[1]
            );
        };
        let upgrade_available = match env.text("upgrade_available")?.as_deref() {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => bail!(Bootloader, "upgrade_available={v:?} is neither 0 nor 1"),
        };
        let number = |name: &str, default: u32| -> Result<u32> {
            env.text(name)?.map_or(Ok(default), |t| count(name, &t))
        };
        Ok(Mender {
            partitions,
            part,
            upgrade_available,
            bootcount: number("bootcount", 0)?,
            bootlimit: number("bootlimit", 1)?,
        })
    }

    fn state(&self) -> BootState {
        let mut order = vec![self.part];
        if self.upgrade_available {
            order.push(self.part.other());
        }
        let tries = |s: SlotName| {
            if s == self.part {
                if self.upgrade_available {
                    self.bootlimit.saturating_sub(self.bootcount)
                } else {
                    1
                }
            } else {
                u32::from(order.contains(&s))
            }
        };
        let slot = |s: SlotName| SlotBoot {
            bootable: order.contains(&s) && tries(s) > 0,
            tries_left: tries(s),
        };
        BootState {
            a: slot(SlotName::A),
            b: slot(SlotName::B),
            order: order.clone(),
        }
    }

    fn apply(&mut self, change: Change) {
        let (part, trial) = match change {
            // Mender's script boots only `mender_boot_part`: a slot out of
            // the boot is one it does not name. A slot that is only the
            // fallback of a trial stays so (the script's `altbootcmd`
            // switches to the other partition, whatever it holds).
            Change::Disable(x) if self.part != x => return,
            Change::Disable(x) | Change::MarkBad(x) => (x.other(), false),
            Change::Trial(x) => (x, true),
            Change::MarkGood(x) => (x, false),
        };
        self.part = part;
        self.upgrade_available = trial;
        self.bootcount = 0;
    }

    fn store(&self, env: &mut dyn Vars) -> Result<()> {
        let n = self.partitions[index(self.part)];
        env.set_text("mender_boot_part", &n.to_string())?;
        env.set_text("mender_boot_part_hex", &format!("{n:X}"))?;
        env.set_text(
            "upgrade_available",
            if self.upgrade_available { "1" } else { "0" },
        )?;
        env.set_text("bootcount", &self.bootcount.to_string())
    }
}

/// The slot RAUC's boot script booted: `rauc.slot=BOOTNAME` on the kernel
/// command line, matched against the bootnames of A and B. `None` when
/// the command line has none; an error when it names neither.
pub fn rauc_slot(cmdline: &str, names: [&str; 2]) -> Option<Result<SlotName, String>> {
    let name = cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("rauc.slot="))
        .next_back()?;
    Some(if name == names[0] {
        Ok(SlotName::A)
    } else if name == names[1] {
        Ok(SlotName::B)
    } else {
        Err(format!(
            "rauc.slot={name} is neither slot A's bootname {} nor slot B's {}",
            names[0], names[1]
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootloader::uboot::Environment;
    use crate::test_support::uboot_env as env_of;
    use SlotName::{A, B};

    fn mender() -> Flow {
        Flow::Mender { partitions: [2, 3] }
    }

    fn rauc() -> Flow {
        Flow::Order {
            names: ["system0".into(), "system1".into()],
        }
    }

    fn vars(env: &Environment, names: &[&str]) -> Vec<String> {
        names
            .iter()
            .map(|n| String::from_utf8_lossy(env.get(n).unwrap_or(b"-")).into_owned())
            .collect()
    }

    #[test]
    fn mender_changes_row_by_row() {
        // (before: part, upgrade_available, bootcount; change; after)
        let rows = [
            (("2", "0", "0"), Change::Disable(B), ("2", "0", "0")),
            (("2", "0", "0"), Change::Trial(B), ("3", "1", "0")),
            (("3", "1", "1"), Change::MarkGood(B), ("3", "0", "0")),
            (("3", "1", "1"), Change::MarkBad(B), ("2", "0", "0")),
            // The script's altbootcmd already switched back: the rollback
            // finds A named and keeps it.
            (("2", "0", "2"), Change::MarkBad(B), ("2", "0", "0")),
            (("3", "0", "0"), Change::Disable(B), ("2", "0", "0")),
            (("2", "0", "0"), Change::MarkGood(A), ("2", "0", "0")),
        ];
        for ((p, u, c), change, after) in rows {
            let mut env = env_of(&[
                ("bootcmd", "run mender_setup"),
                ("mender_boot_part", p),
                ("upgrade_available", u),
                ("bootcount", c),
            ]);
            mender().apply(&mut env, change, 3).unwrap();
            let got = vars(
                &env,
                &["mender_boot_part", "upgrade_available", "bootcount"],
            );
            assert_eq!(
                got,
                vec![after.0, after.1, after.2],
                "{p} {u} {c} {change:?}"
            );
            assert_eq!(env.get("mender_boot_part_hex"), env.get("mender_boot_part"));
            assert_eq!(env.get("bootcmd"), Some(&b"run mender_setup"[..]));
        }
    }

    #[test]
    fn mender_partitions_past_nine_are_hexadecimal_in_the_hex_variable() {
        let flow = Flow::Mender {
            partitions: [9, 10],
        };
        let mut env = env_of(&[("mender_boot_part", "9")]);
        flow.apply(&mut env, Change::Trial(B), 1).unwrap();
        assert_eq!(
            vars(&env, &["mender_boot_part", "mender_boot_part_hex"]),
            ["10", "A"]
        );
    }

    #[test]
    fn mender_trial_state_counts_the_attempt_against_bootlimit() {
        let s = mender()
            .read(&env_of(&[
                ("mender_boot_part", "3"),
                ("upgrade_available", "1"),
                ("bootcount", "0"),
            ]))
            .unwrap();
        assert_eq!(s.order, vec![B, A]);
        assert_eq!(s.next_boot(), Some(B));
        assert_eq!(s.b.tries_left, 1);
        // The attempt was used: the script falls back to A next.
        let s = mender()
            .read(&env_of(&[
                ("mender_boot_part", "3"),
                ("upgrade_available", "1"),
                ("bootcount", "1"),
            ]))
            .unwrap();
        assert_eq!(s.next_boot(), Some(A));
        let s = mender()
            .read(&env_of(&[
                ("mender_boot_part", "2"),
                ("upgrade_available", "0"),
            ]))
            .unwrap();
        assert_eq!(s.order, vec![A]);
        assert!(!s.b.bootable);
    }

    #[test]
    fn mender_variables_that_do_not_parse_are_refused_naming_them() {
        for (vars, want) in [
            (&[][..], "mender_boot_part is not set"),
            (
                &[("mender_boot_part", "5")][..],
                "mender_boot_part=5 is neither",
            ),
            (
                &[("mender_boot_part", "x")][..],
                "mender_boot_part=\"x\" is not a count",
            ),
            (
                &[("mender_boot_part", "2"), ("upgrade_available", "yes")][..],
                "upgrade_available=\"yes\"",
            ),
            (
                &[("mender_boot_part", "2"), ("bootcount", "-1")][..],
                "bootcount=\"-1\" is not a count",
            ),
        ] {
            let mut env = env_of(vars);
            let before = env.clone();
            let e = mender().read(&env).unwrap_err().to_string();
            assert!(e.contains(want), "{vars:?}: {e}");
            assert!(mender().apply(&mut env, Change::Trial(B), 1).is_err());
            assert_eq!(env, before);
        }
    }

    #[test]
    fn rauc_bootnames_name_the_slots() {
        let mut env = env_of(&[
            ("BOOT_ORDER", "system0 system1"),
            ("BOOT_system0_LEFT", "3"),
            ("BOOT_system1_LEFT", "3"),
        ]);
        let s = rauc().read(&env).unwrap();
        assert_eq!(s.order, vec![A, B]);
        rauc().apply(&mut env, Change::Disable(B), 3).unwrap();
        rauc().apply(&mut env, Change::Trial(B), 3).unwrap();
        assert_eq!(
            vars(
                &env,
                &["BOOT_ORDER", "BOOT_system0_LEFT", "BOOT_system1_LEFT"]
            ),
            ["system1 system0", "3", "3"]
        );
        assert_eq!(
            env.get("BOOT_A_LEFT"),
            None,
            "no variable of updraft's own script"
        );
        let e = rauc()
            .read(&env_of(&[("BOOT_ORDER", "system0 recovery")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"recovery\", which is neither"), "{e}");
    }

    #[test]
    fn rauc_slot_maps_a_bootname_to_its_slot() {
        let names = ["system0", "system1"];
        assert_eq!(
            rauc_slot("root=/dev/x rauc.slot=system1 ro", names),
            Some(Ok(SlotName::B))
        );
        assert_eq!(rauc_slot("rauc.slot=system0", names), Some(Ok(SlotName::A)));
        assert_eq!(rauc_slot("root=/dev/x", names), None);
        let e = rauc_slot("rauc.slot=recovery", names).unwrap().unwrap_err();
        assert!(e.contains("rauc.slot=recovery is neither"), "{e}");
    }
}
