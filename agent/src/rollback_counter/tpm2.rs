//! The rollback floor in a TPM 2.0 NV index of type counter, through the
//! tpm2-tools programs (`tpm2_getcap`, `tpm2_nvreadpublic`, `tpm2_nvread`,
//! `tpm2_nvincrement`), each given the configured TCTI with `-T`.
//!
//! Why a counter index: the TPM only ever increments it, by one, and
//! nothing (not the owner, not a cleared data partition) sets it back; an
//! index undefined and defined again starts above the highest value any
//! counter on that TPM has had. The index is defined at provisioning
//! (docs/security.md), never here: updraft needs no owner authorization,
//! and an index that disappeared is reported, not silently recreated.
//!
//! This module reads and increments the one index configured; it never
//! defines, undefines or writes any other.

use super::{Counter, MAX_STEP, failed, increments_needed, run};
use crate::error::{Error, Kind, Result};

pub struct Tpm2 {
    index: u32,
    tcti: String,
    /// The index was found defined, of type counter, since the last
    /// failure: looked at again after any failure.
    checked: bool,
}

impl Tpm2 {
    pub fn new(index: u32, tcti: &str) -> Tpm2 {
        Tpm2 {
            index,
            tcti: tcti.to_string(),
            checked: false,
        }
    }

    fn handle(&self) -> String {
        format!("{:#x}", self.index)
    }

    fn tool(&self, name: &str, args: &[&str]) -> Vec<String> {
        let mut argv = vec![name.to_string(), "-T".into(), self.tcti.clone()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }

    /// The index exists and is a counter.
    fn check_index(&mut self) -> Result<()> {
        let what = format!("{} (tcti {})", self.describe(), self.tcti);
        let listed = run(&self.tool("tpm2_getcap", &["handles-nv-index"]), &what)?;
        if !listed.success {
            return Err(failed(
                &format!("tpm2_getcap handles-nv-index for {what}"),
                &listed,
            ));
        }
        if !nv_listed(&String::from_utf8_lossy(&listed.stdout), self.index) {
            return Err(Error::new(
                Kind::Io,
                format!(
                    "{what} is not defined on the TPM: define it at provisioning \
                     (tpm2_nvdefine {} -C o -s 8 -a \"nt=counter|ownerread|ownerwrite|authread|authwrite|no_da\")",
                    self.handle()
                ),
            ));
        }
        let public = run(&self.tool("tpm2_nvreadpublic", &[&self.handle()]), &what)?;
        if !public.success {
            return Err(failed(&format!("tpm2_nvreadpublic for {what}"), &public));
        }
        if !is_counter(&String::from_utf8_lossy(&public.stdout)) {
            return Err(Error::new(
                Kind::Io,
                format!(
                    "{what} is not an NV counter (nt=counter): an ordinary index can be written back, so it is no rollback floor"
                ),
            ));
        }
        self.checked = true;
        Ok(())
    }

    fn increment(&mut self) -> Result<()> {
        let ran = run(
            &self.tool("tpm2_nvincrement", &[&self.handle()]),
            &self.describe(),
        )?;
        if !ran.success {
            self.checked = false;
            return Err(failed(
                &format!(
                    "tpm2_nvincrement of {} (tcti {})",
                    self.describe(),
                    self.tcti
                ),
                &ran,
            ));
        }
        Ok(())
    }
}

impl Counter for Tpm2 {
    fn describe(&self) -> String {
        format!("tpm2 NV index {}", self.handle())
    }

    fn read(&mut self) -> Result<u64> {
        if !self.checked {
            self.check_index()?;
        }
        let ran = run(
            &self.tool("tpm2_nvread", &["-s", "8", &self.handle()]),
            &self.describe(),
        )?;
        if !ran.success {
            // Defined but never incremented: nothing was ever advanced.
            if never_written(&ran.stderr) {
                return Ok(0);
            }
            self.checked = false;
            return Err(failed(
                &format!("tpm2_nvread of {} (tcti {})", self.describe(), self.tcti),
                &ran,
            ));
        }
        parse_counter(&ran.stdout).map_err(|why| {
            Error::new(
                Kind::Io,
                format!("tpm2_nvread of {}: {why}", self.describe()),
            )
        })
    }

    fn advance_to(&mut self, target: u64) -> Result<u64> {
        advance_by_increments(self, target, Tpm2::increment)
    }
}

/// Increment the NV counter `c` until it reads at least `target`, reading
/// it back after each increment; its value then. Shared by both ways of
/// reaching the TPM.
pub(super) fn advance_by_increments<C: Counter>(
    c: &mut C,
    target: u64,
    increment: fn(&mut C) -> Result<()>,
) -> Result<u64> {
    let mut value = c.read()?;
    let steps = increments_needed(value, target, &c.describe())?;
    // One increment moves a counter by one, except the first, which
    // starts it above the highest value any counter on this TPM had.
    for _ in 0..steps.min(MAX_STEP) {
        if value >= target {
            break;
        }
        increment(c)?;
        value = c.read()?;
    }
    if value < target {
        return Err(Error::new(
            Kind::Io,
            format!(
                "{} is {value} after {steps} increments, still below {target}",
                c.describe()
            ),
        ));
    }
    Ok(value)
}

/// Whether `tpm2_getcap handles-nv-index`'s list (`- 0x1500016` lines)
/// holds `index`.
fn nv_listed(list: &str, index: u32) -> bool {
    list.lines().any(|l| {
        l.trim()
            .trim_start_matches('-')
            .trim()
            .strip_prefix("0x")
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            == Some(index)
    })
}

/// Whether `tpm2_nvreadpublic`'s attributes name the counter type
/// (`nt=0x1`, or `nt=counter` in other versions of the tools).
fn is_counter(public: &str) -> bool {
    public
        .lines()
        .filter(|l| l.trim_start().starts_with("friendly:"))
        .flat_map(|l| l.split(['|', ' ']))
        .any(|a| a == "nt=0x1" || a == "nt=counter")
}

/// Whether `tpm2_nvread` failed on a counter never incremented
/// (TPM_RC_NV_UNINITIALIZED, 0x14A).
fn never_written(stderr: &str) -> bool {
    stderr.contains("0x14A") || stderr.contains("before being initialized")
}

/// An NV counter's 8 bytes, big-endian, as `tpm2_nvread -s 8` writes them.
fn parse_counter(bytes: &[u8]) -> std::result::Result<u64, String> {
    let b: [u8; 8] = bytes
        .try_into()
        .map_err(|_| format!("read {} bytes where a counter has 8", bytes.len()))?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_list_is_read_line_by_line() {
        let list = "- 0x1500016\n- 0x1500017\n";
        assert!(nv_listed(list, 0x0150_0016));
        assert!(nv_listed(list, 0x0150_0017));
        assert!(!nv_listed(list, 0x0150_0018));
        assert!(!nv_listed("", 0x0150_0016));
        assert!(!nv_listed("- 0xZZ\n-\n0x\n", 0x0150_0016));
    }

    #[test]
    fn only_an_index_of_counter_type_counts() {
        let counter = "0x1500016:\n  name: 000b\n  hash algorithm:\n    friendly: sha256\n    value: 0xB\n  attributes:\n    friendly: ownerwrite|authwrite|nt=0x1|ownerread|authread|no_da|written\n    value: 0x22060016\n  size: 8\n";
        assert!(is_counter(counter));
        assert!(is_counter(
            "  attributes:\n    friendly: nt=counter|authread\n"
        ));
        let ordinary = counter.replace("nt=0x1|", "");
        assert!(!is_counter(&ordinary));
        assert!(!is_counter("nt=0x1 outside an attribute line"));
        assert!(!is_counter("    friendly: nt=0x10|authread"));
    }

    #[test]
    fn a_counter_is_eight_big_endian_bytes() {
        assert_eq!(parse_counter(&[0, 0, 0, 0, 0, 0, 0, 5]), Ok(5));
        assert_eq!(parse_counter(&[0xff; 8]), Ok(u64::MAX));
        for bad in [&b""[..], &[0; 7], &[0; 9], b"5\n"] {
            assert!(
                parse_counter(bad)
                    .unwrap_err()
                    .contains("where a counter has 8")
            );
        }
    }

    #[test]
    fn an_uninitialised_counter_is_recognised_by_its_response_code() {
        assert!(never_written(
            "ERROR: Esys_NV_Read(0x14A) - tpm:error(2.0): an NV Index is used before being initialized or the state saved by TPM2_ShutdownSTATE could not be restored"
        ));
        assert!(!never_written(
            "ERROR: Esys_TR_FromTPMPublic(0x18B) - tpm:handle(1):the handle is not correct for the use"
        ));
    }
}
