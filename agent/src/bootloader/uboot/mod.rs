//! The `uboot` backend: the boot selection kept in the U-Boot environment,
//! read and written natively, without `fw_setenv`.
//!
//! The environment is the one U-Boot's `saveenv` and libubootenv's
//! `fw_printenv`/`fw_setenv` (0.3.x, Debian's `libubootenv-tool`) read and
//! write, in a single copy or a redundant pair, where `fw_env.config` says.
//! The work is split by concern:
//!
//! * `env.rs`, the codec: the bytes of a copy (CRC, flags byte, the
//!   `name=value` list) and which copy of a pair is current. Pure.
//! * `config.rs`, the `fw_env.config` parser: where the copies live.
//! * `device.rs`, device I/O: libubootenv's lock, offsets on files and
//!   block devices, eMMC `force_ro`.
//! * This module, the boot model and the [`Bootloader`] implementation.
//!
//! * `../flow.rs`, whose variables hold the selection: by default
//!   `BOOT_ORDER` ("A B"), `BOOT_A_LEFT` and `BOOT_B_LEFT`, the variables
//!   of the RAUC-style boot script shown in `docs/bootloaders.md` (a
//!   variable that is missing or empty reads as the shipped `boot.cmd.in`
//!   initialises it: `A`, 3, 0, slot B of a new device being empty);
//!   RAUC's with its bootnames, or Mender's (`bootloader.flow`). Pure.
//!
//! Every change is one cycle under libubootenv's lock ([`DEFAULT_LOCK_FILE`]):
//! read the copies, take the current one ([`select_copy`]), change its
//! variables, and write the result as one write. Of a redundant pair it
//! goes to the other copy, with the flags of the current one plus one
//! (wrapping), so a power cut during the write leaves the current copy
//! valid and selected; a single copy is rewritten in place. Nothing is
//! written when the change leaves the variables as they were.
//!
//! It must never write an environment it could not read: when no copy has a
//! valid CRC it refuses and reports, and it never writes a fresh or default
//! environment, since that would replace the board's own variables
//! (`bootcmd` among them) and leave it unbootable. It never reorders,
//! rewrites or drops variables it does not own, never writes the copy of a
//! pair it read the current state from, never writes an empty `BOOT_ORDER`
//! (boot scripts read that as "A B" and would boot both slots), and never
//! stores more attempts than the boot script can count.

mod config;
mod device;
mod env;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use super::flow::Flow;
pub use config::{EnvLocation, FwEnvConfig, parse_fw_env_config};
pub use device::DEFAULT_LOCK_FILE;
pub use env::{
    DecodedCopy, Environment, decode_copy, encode_copy, parse_env_data, parse_image, select_copy,
    serialize_env_data,
};

use super::{BootState, Bootloader, Change};
use crate::bail;
use crate::error::{Context, Kind, Result};
use crate::progress::{NoTick, Ticker};
use crate::slot::SlotName;
use config::read_fw_env_config;
use device::{DEFAULT_LOCK_TIMEOUT, EnvLock, read_copy, take_lock, write_copy};

/// The boot script decrements `BOOT_x_LEFT` with `setexpr`, which reads and
/// writes hexadecimal, and compares it with `test -gt`, which reads decimal;
/// the two agree only on single digits.
const MAX_TRIES: u32 = 9;

/// The environment as read: the variables and where they came from.
#[derive(Clone, Debug)]
pub struct LoadedEnv {
    pub env: Environment,
    /// Index of the copy read (0 or 1).
    pub current: usize,
    /// Its flags byte (redundant only).
    pub flags: Option<u8>,
}

pub struct UbootBootloader {
    /// Where the description came from, for messages.
    source: String,
    config: FwEnvConfig,
    /// Whose boot script reads the variables.
    flow: Flow,
    lock_file: PathBuf,
    lock_timeout: Duration,
}

impl UbootBootloader {
    /// Read and parse an `fw_env.config`. Devices are opened only when the
    /// environment is accessed.
    pub fn from_config_file(path: &Path) -> Result<UbootBootloader> {
        let config = read_fw_env_config(path)?;
        Ok(UbootBootloader::new(config, path.display().to_string()))
    }

    /// A backend for an already parsed description; `source` names it in
    /// messages.
    fn new(config: FwEnvConfig, source: String) -> UbootBootloader {
        UbootBootloader {
            source,
            config,
            flow: Flow::updraft(),
            lock_file: PathBuf::from(DEFAULT_LOCK_FILE),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }

    /// Keep the selection in another boot script's variables (RAUC's
    /// bootnames, Mender's partitions).
    pub fn set_flow(&mut self, flow: Flow) {
        self.flow = flow;
    }

    /// Use another lock file (libubootenv's YAML configuration can name one).
    pub fn set_lock_file(&mut self, path: PathBuf) {
        self.lock_file = path;
    }

    /// Wait at most this long for the lock.
    pub fn set_lock_timeout(&mut self, timeout: Duration) {
        self.lock_timeout = timeout;
    }

    pub fn config(&self) -> &FwEnvConfig {
        &self.config
    }

    fn copy_name(&self, index: usize, offset: u64) -> String {
        let loc = &self.config.copies[index];
        if self.config.redundant() {
            format!(
                "uboot env copy {} at {} offset {offset:#x}",
                index + 1,
                loc.device.display()
            )
        } else {
            format!("uboot env at {} offset {offset:#x}", loc.device.display())
        }
    }

    fn lock(&self, t: &mut dyn Ticker) -> Result<EnvLock> {
        take_lock(&self.lock_file, self.lock_timeout, t)
    }

    /// Read the current environment (the caller holds the lock).
    fn load_locked(&self) -> Result<LoadedEnv> {
        let redundant = self.config.redundant();
        let mut reads = Vec::with_capacity(2);
        for loc in &self.config.copies {
            reads.push(read_copy(loc)?);
        }
        let mut problems = Vec::new();
        let mut valid = [false; 2];
        let mut flags = [0u8; 2];
        for (i, r) in reads.iter().enumerate() {
            let c = decode_copy(&r.bytes, redundant)
                .kind_context(Kind::Bootloader, self.copy_name(i, r.offset))?;
            valid[i] = c.crc_ok();
            flags[i] = c.flags.unwrap_or(0);
            if !c.crc_ok() {
                problems.push(format!(
                    "{}: CRC mismatch (stored {:#010x}, computed {:#010x})",
                    self.copy_name(i, r.offset),
                    c.stored_crc,
                    c.computed_crc
                ));
            }
        }
        let current = if redundant {
            select_copy(valid, flags)
        } else {
            valid[0].then_some(0)
        };
        let Some(current) = current else {
            bail!(
                Bootloader,
                "{}: no valid environment copy; refusing to read or write it (U-Boot's `saveenv` rewrites it from the running environment)",
                problems.join("; ")
            );
        };
        for p in &problems {
            log::warn!("{p}; using the other copy");
        }
        let r = &reads[current];
        let c = decode_copy(&r.bytes, redundant)
            .kind_context(Kind::Bootloader, self.copy_name(current, r.offset))?;
        let env = parse_env_data(c.data)
            .kind_context(Kind::Bootloader, self.copy_name(current, r.offset))?;
        Ok(LoadedEnv {
            env,
            current,
            flags: c.flags,
        })
    }

    /// Read the environment under libubootenv's lock.
    pub fn load(&self) -> Result<LoadedEnv> {
        self.load_with(&mut NoTick)
    }

    /// [`UbootBootloader::load`], waiting for the lock through `t`.
    fn load_with(&self, t: &mut dyn Ticker) -> Result<LoadedEnv> {
        let _lock = self.lock(t)?;
        self.load_locked()
    }

    /// Change the environment with `f` and write it as one write to the
    /// inactive copy (or the only one). Nothing is written when `f` leaves
    /// the variables as they were. The lock is held from read to write.
    fn update(
        &mut self,
        t: &mut dyn Ticker,
        f: impl FnOnce(&mut Environment) -> Result<()>,
    ) -> Result<()> {
        let _lock = self.lock(t)?;
        let loaded = self.load_locked()?;
        let mut env = loaded.env.clone();
        f(&mut env)?;
        if env == loaded.env {
            return Ok(());
        }
        let (target, flags) = if self.config.redundant() {
            (1 - loaded.current, loaded.flags.map(|f| f.wrapping_add(1)))
        } else {
            (0, None)
        };
        let image = encode_copy(&env, self.config.env_size(), flags).kind_context(
            Kind::Bootloader,
            format!(
                "writing the U-Boot environment described by {}",
                self.source
            ),
        )?;
        let loc = &self.config.copies[target];
        let offset = write_copy(loc, &image)?;
        log::debug!(
            "wrote {}{}",
            self.copy_name(target, offset),
            flags
                .map(|f| format!(" with flags {f}"))
                .unwrap_or_default()
        );
        Ok(())
    }

    /// Make `change` in the flow's variables, as one write.
    fn change(&mut self, t: &mut dyn Ticker, change: Change, tries: u32) -> Result<()> {
        let source = self.source.clone();
        let flow = self.flow.clone();
        self.update(t, |env| {
            flow.apply(env, change, tries)
                .kind_context(Kind::Bootloader, &source)
        })
    }
}

fn check_tries(tries: u32) -> Result<()> {
    if tries == 0 || tries > MAX_TRIES {
        bail!(
            Bootloader,
            "{tries} tries cannot be stored in BOOT_x_LEFT: U-Boot boot scripts count with setexpr (hexadecimal) and test -gt (decimal), which agree only on 1 to {MAX_TRIES}"
        );
    }
    Ok(())
}

impl Bootloader for UbootBootloader {
    fn describe(&self) -> String {
        format!("uboot {}", self.source)
    }

    fn read_with(&mut self, t: &mut dyn Ticker) -> Result<BootState> {
        let loaded = self.load_with(t)?;
        self.flow
            .read(&loaded.env)
            .kind_context(Kind::Bootloader, &self.source)
    }

    fn disable_with(&mut self, slot: SlotName, t: &mut dyn Ticker) -> Result<()> {
        self.change(t, Change::Disable(slot), 0)
    }

    fn trial_with(&mut self, slot: SlotName, tries: u32, t: &mut dyn Ticker) -> Result<()> {
        check_tries(tries)?;
        self.change(t, Change::Trial(slot), tries)
    }

    fn trial_tries(&self, tries: u32) -> u32 {
        match self.flow {
            // Mender's script gives a trial `bootlimit` boots (1 as its
            // integration sets it).
            Flow::Mender { .. } => 1,
            Flow::Order { .. } => tries,
        }
    }

    fn mark_good_with(&mut self, slot: SlotName, tries: u32, t: &mut dyn Ticker) -> Result<()> {
        check_tries(tries)?;
        self.change(t, Change::MarkGood(slot), tries)
    }

    fn mark_bad_with(&mut self, slot: SlotName, t: &mut dyn Ticker) -> Result<()> {
        self.change(t, Change::MarkBad(slot), 0)
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::AsRawFd;

    use super::env::crc32;
    use super::*;
    use crate::test_support::{Rng, mutate, scratch_dir, uboot_env as env_of};

    /// A backend over `copies` copies of `size` bytes in one file, with a
    /// private lock file.
    fn backend(
        dir: &Path,
        size: usize,
        copies: usize,
        env: &Environment,
    ) -> (UbootBootloader, PathBuf) {
        let dev = dir.join("env.img");
        let mut bytes = Vec::new();
        for _ in 0..copies {
            bytes.extend(encode_copy(env, size, (copies == 2).then_some(1)).unwrap());
        }
        std::fs::write(&dev, &bytes).unwrap();
        let config = FwEnvConfig {
            copies: (0..copies)
                .map(|i| EnvLocation {
                    device: dev.clone(),
                    offset: (i * size) as i64,
                    env_size: size,
                    sector_size: None,
                    sectors: None,
                })
                .collect(),
        };
        let mut bl = UbootBootloader::new(config, "test".into());
        bl.set_lock_file(dir.join("lock"));
        (bl, dev)
    }

    #[test]
    fn redundant_writes_alternate_and_wrap() {
        let d = scratch_dir("uboot", "alternate");
        let (mut bl, dev) = backend(&d, 256, 2, &env_of(&[("keep", "me")]));
        let mut seen_wrap = false;
        let mut last_flags = 1u8;
        for i in 0..300u32 {
            let slot = if i % 2 == 0 { SlotName::B } else { SlotName::A };
            bl.trial(slot, 1 + i % 9).unwrap();
            let loaded = bl.load().unwrap();
            let flags = loaded.flags.unwrap();
            assert_eq!(flags, last_flags.wrapping_add(1));
            seen_wrap |= flags == 0;
            last_flags = flags;
            assert_eq!(
                loaded.current,
                (i as usize + 1) % 2,
                "writes alternate copies"
            );
            let s = bl.read().unwrap();
            assert_eq!(s.order[0], slot);
            assert_eq!(s.slot(slot).tries_left, 1 + i % 9);
            assert_eq!(loaded.env.get("keep"), Some(&b"me"[..]));
        }
        assert!(seen_wrap);
        assert_eq!(std::fs::metadata(&dev).unwrap().len(), 512);
    }

    #[test]
    fn corrupt_copy_falls_back_and_is_the_one_overwritten() {
        let d = scratch_dir("uboot", "fallback");
        let (mut bl, dev) = backend(&d, 256, 2, &env_of(&[("BOOT_ORDER", "A B")]));
        bl.trial(SlotName::B, 3).unwrap(); // copy 2 now current, flags 2
        let mut bytes = std::fs::read(&dev).unwrap();
        bytes[256 + 40] ^= 0x55; // corrupt copy 2
        std::fs::write(&dev, &bytes).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A, SlotName::B], "copy 1 is used");
        bl.trial(SlotName::B, 2).unwrap();
        let after = std::fs::read(&dev).unwrap();
        assert_eq!(&after[..256], &bytes[..256], "the good copy is not touched");
        assert_eq!(bl.read().unwrap().b.tries_left, 2);
    }

    #[test]
    fn no_valid_copy_is_refused_and_left_alone() {
        let d = scratch_dir("uboot", "invalid");
        let (mut bl, dev) = backend(&d, 256, 2, &env_of(&[("BOOT_ORDER", "A B")]));
        let mut bytes = std::fs::read(&dev).unwrap();
        bytes[10] ^= 1;
        bytes[256 + 10] ^= 1;
        std::fs::write(&dev, &bytes).unwrap();
        let e = bl.trial(SlotName::B, 3).unwrap_err();
        assert_eq!(e.kind(), Kind::Bootloader);
        let msg = e.to_string();
        assert!(
            msg.contains("copy 1 at") && msg.contains("copy 2 at") && msg.contains("offset 0x100"),
            "{msg}"
        );
        assert!(msg.contains("CRC mismatch (stored 0x"), "{msg}");
        assert!(bl.read().is_err());
        assert_eq!(std::fs::read(&dev).unwrap(), bytes);
    }

    #[test]
    fn missing_variables_read_as_script_defaults_and_get_written() {
        let d = scratch_dir("uboot", "defaults");
        let (mut bl, _) = backend(&d, 256, 1, &env_of(&[("bootcmd", "run x")]));
        let s = bl.read().unwrap();
        // As the shipped boot script initialises them: A only, B empty.
        assert_eq!(s.order, vec![SlotName::A]);
        assert_eq!((s.a.tries_left, s.b.tries_left), (3, 0));
        assert!(s.a.bootable && !s.b.bootable);
        bl.disable(SlotName::B).unwrap();
        let env = bl.load().unwrap().env;
        let entries: Vec<&[u8]> = env.entries().collect();
        assert_eq!(
            entries,
            vec![
                &b"bootcmd=run x"[..],
                b"BOOT_ORDER=A",
                b"BOOT_A_LEFT=3",
                b"BOOT_B_LEFT=0"
            ]
        );
    }

    #[test]
    fn model_operations() {
        let d = scratch_dir("uboot", "model");
        let (mut bl, dev) = backend(&d, 512, 1, &Environment::new());
        crate::test_support::disable_then_trial_b(&mut bl);
        bl.mark_good(SlotName::B, 3).unwrap();
        // Mark the padding (updraft writes zeros there) to see whether the
        // copy is rewritten.
        let env = bl.load().unwrap().env;
        let mut marked = encode_copy(&env, 512, None).unwrap();
        marked[4 + env.encoded_len()..].fill(0xaa);
        let crc = crc32(&marked[4..]).to_le_bytes();
        marked[..4].copy_from_slice(&crc);
        std::fs::write(&dev, &marked).unwrap();
        bl.mark_good(SlotName::B, 3).unwrap();
        assert_eq!(
            std::fs::read(&dev).unwrap(),
            marked,
            "no write when already good"
        );
        bl.mark_bad(SlotName::B).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A]);
        assert_eq!(s.b.tries_left, 0);
        assert_eq!(s.next_boot(), Some(SlotName::A));
        let e = bl.disable(SlotName::A).unwrap_err().to_string();
        assert!(e.contains("empty BOOT_ORDER"), "{e}");
        assert!(
            bl.trial(SlotName::B, 10)
                .unwrap_err()
                .to_string()
                .contains("1 to 9")
        );
        assert!(bl.mark_good(SlotName::B, 0).is_err());
    }

    #[test]
    fn malformed_model_variables_are_refused() {
        for (name, value, want) in [
            (
                "BOOT_ORDER",
                "A C",
                "\"C\", which is neither slot A's bootname",
            ),
            ("BOOT_A_LEFT", "x", "not a count"),
            ("BOOT_B_LEFT", "-1", "not a count"),
            ("BOOT_B_LEFT", "99999999999", "not a count"),
        ] {
            let d = scratch_dir("uboot", "malformed");
            let (mut bl, dev) = backend(&d, 256, 1, &env_of(&[(name, value)]));
            let before = std::fs::read(&dev).unwrap();
            let e = bl.read().unwrap_err().to_string();
            assert!(e.contains(want), "{name}={value}: {e}");
            assert!(bl.trial(SlotName::B, 3).is_err());
            assert_eq!(std::fs::read(&dev).unwrap(), before);
        }
    }

    #[test]
    fn devices_that_are_too_small_or_missing_are_reported() {
        let d = scratch_dir("uboot", "small");
        let dev = d.join("short.env");
        std::fs::write(&dev, [0u8; 100]).unwrap();
        let mut bl = UbootBootloader::new(
            parse_fw_env_config(&format!("{} 0x40 0x100\n", dev.display())).unwrap(),
            "t".into(),
        );
        bl.set_lock_file(d.join("lock"));
        let e = bl.read().unwrap_err().to_string();
        assert!(
            e.contains("holds 100 bytes") && e.contains("offset 0x40"),
            "{e}"
        );
        let mut bl = UbootBootloader::new(
            parse_fw_env_config(&format!("{} -0x100 0x100\n", dev.display())).unwrap(),
            "t".into(),
        );
        bl.set_lock_file(d.join("lock"));
        assert!(bl.read().unwrap_err().to_string().contains("not one"));
        let mut bl = UbootBootloader::new(
            parse_fw_env_config(&format!("{} 0 0x100\n", d.join("nope").display())).unwrap(),
            "t".into(),
        );
        bl.set_lock_file(d.join("lock"));
        assert!(bl.read().unwrap_err().to_string().contains("nope"));
    }

    #[test]
    fn a_held_lock_makes_the_backend_wait_then_fail_as_busy() {
        let d = scratch_dir("uboot", "lock");
        let (mut bl, dev) = backend(&d, 256, 1, &Environment::new());
        let holder = File::create(d.join("lock")).unwrap();
        // SAFETY: flock on our own descriptor.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
        bl.set_lock_timeout(Duration::from_millis(100));
        let before = std::fs::read(&dev).unwrap();
        let e = bl.trial(SlotName::B, 3).unwrap_err();
        assert_eq!(e.kind(), Kind::Busy);
        assert!(e.to_string().contains("lock"), "{e}");
        assert_eq!(std::fs::read(&dev).unwrap(), before);
        drop(holder);
        bl.trial(SlotName::B, 3).unwrap();
    }

    #[test]
    fn config_file_is_read_with_context() {
        let d = scratch_dir("uboot", "cfgfile");
        let p = d.join("fw_env.config");
        std::fs::write(&p, "/x 0 zz\n").unwrap();
        let e = UbootBootloader::from_config_file(&p)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with(&p.display().to_string()) && e.contains("line 1"),
            "{e}"
        );
        assert!(UbootBootloader::from_config_file(&d.join("missing")).is_err());
        std::fs::write(&p, "/boot/uboot.env 0 0x4000\n").unwrap();
        let bl = UbootBootloader::from_config_file(&p).unwrap();
        assert_eq!(bl.describe(), format!("uboot {}", p.display()));
    }

    #[test]
    fn mutated_copies_never_panic_and_what_parses_round_trips() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let env = env_of(&[
            ("bootcmd", "run x"),
            ("BOOT_ORDER", "A B"),
            ("BOOT_A_LEFT", "3"),
            ("BOOT_B_LEFT", "2"),
        ]);
        let seeds = [
            encode_copy(&env, 96, None).unwrap(),
            encode_copy(&env, 96, Some(1)).unwrap(),
        ];
        let mut parsed = 0;
        for round in 0..20_000 {
            let img = mutate(&mut rng, &seeds[round % 2]);
            for redundant in [false, true] {
                let _ = parse_image(&img, redundant);
                let Ok(c) = decode_copy(&img, redundant) else {
                    continue;
                };
                let _ = select_copy([c.crc_ok(), round % 3 == 0], [c.flags.unwrap_or(0), img[0]]);
                let Ok(e) = parse_env_data(c.data) else {
                    continue;
                };
                parsed += 1;
                let _ = Flow::updraft().read(&e);
                if let Ok(area) = serialize_env_data(&e, c.data.len()) {
                    assert_eq!(parse_env_data(&area).unwrap(), e);
                }
            }
        }
        assert!(
            parsed > 1000,
            "the mutations reach the entry parser ({parsed})"
        );
    }
}
