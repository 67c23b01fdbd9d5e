//! The rollback floor kept by two configured programs, for counters
//! updraft has no code for (eMMC RPMB through mmc-utils, a secure
//! element's tool): `read_command` prints the value in decimal on its
//! standard output; `advance_command` gets the target as its last
//! argument and must leave the counter at least there.
//!
//! This module runs the two programs and checks what they say; it never
//! interprets their error output beyond quoting it, and never trusts an
//! advance it has not read back.

use super::{Counter, failed, increments_needed, run};
use crate::error::{Error, Kind, Result};

pub struct CommandCounter {
    read: Vec<String>,
    advance: Vec<String>,
}

impl CommandCounter {
    pub fn new(read: Vec<String>, advance: Vec<String>) -> CommandCounter {
        CommandCounter { read, advance }
    }
}

impl Counter for CommandCounter {
    fn describe(&self) -> String {
        format!(
            "counter command {}",
            self.read.first().map(String::as_str).unwrap_or("")
        )
    }

    fn read(&mut self) -> Result<u64> {
        let what = format!("rollback.read_command ({})", self.describe());
        let ran = run(&self.read, &what)?;
        if !ran.success {
            return Err(failed(&what, &ran));
        }
        parse_decimal(&ran.stdout).map_err(|why| Error::new(Kind::Io, format!("{what}: {why}")))
    }

    fn advance_to(&mut self, target: u64) -> Result<u64> {
        let value = self.read()?;
        if increments_needed(value, target, &self.describe())? == 0 {
            return Ok(value);
        }
        let mut argv = self.advance.clone();
        argv.push(target.to_string());
        let what = format!("rollback.advance_command to {target}");
        let ran = run(&argv, &what)?;
        if !ran.success {
            return Err(failed(&what, &ran));
        }
        let after = self.read()?;
        if after < target {
            return Err(Error::new(
                Kind::Io,
                format!(
                    "{what} succeeded but {} reads {after} after it",
                    self.describe()
                ),
            ));
        }
        Ok(after)
    }
}

/// A decimal counter value, surrounding whitespace allowed, nothing else.
fn parse_decimal(out: &[u8]) -> std::result::Result<u64, String> {
    let text =
        std::str::from_utf8(out).map_err(|_| "printed something other than text".to_string())?;
    let t = text.trim();
    if t.is_empty() || t.len() > 20 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "printed {:?}, not a decimal counter value",
            crate::hash::truncate(t, 40)
        ));
    }
    t.parse()
        .map_err(|_| format!("printed {t}, larger than a 64-bit counter"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_value_is_one_decimal_number() {
        assert_eq!(parse_decimal(b"0\n"), Ok(0));
        assert_eq!(parse_decimal(b"  42  \n"), Ok(42));
        assert_eq!(parse_decimal(b"18446744073709551615"), Ok(u64::MAX));
        for bad in [
            &b""[..],
            b"\n",
            b"-1",
            b"+1",
            b"0x10",
            b"4 2",
            b"1e3",
            b"18446744073709551616",
            b"123456789012345678901",
            b"\xff\xfe",
        ] {
            assert!(parse_decimal(bad).is_err(), "{bad:?}");
        }
    }

    fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
        let p = dir.join(name);
        crate::test_support::write_executable(&p, body);
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn the_commands_keep_a_counter_that_is_read_back_after_an_advance() {
        let dir = crate::test_support::scratch_dir("rollback_counter", "command");
        let file = dir.join("value");
        std::fs::write(&file, "3\n").unwrap();
        let f = file.display();
        let read = script(&dir, "read", &format!("#!/bin/sh\ncat {f}\n"));
        let advance = script(&dir, "advance", &format!("#!/bin/sh\necho \"$1\" > {f}\n"));
        let lazy = script(&dir, "lazy", "#!/bin/sh\nexit 0\n");
        let mut c = CommandCounter::new(vec![read.clone()], vec![advance]);
        assert_eq!(c.read().unwrap(), 3);
        assert_eq!(c.advance_to(2).unwrap(), 3, "never moves down");
        assert_eq!(c.advance_to(7).unwrap(), 7);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "7\n");
        let e = c.advance_to(7 + 257).unwrap_err().to_string();
        assert!(e.contains("more than 256"), "{e}");
        let mut liar = CommandCounter::new(vec![read], vec![lazy]);
        let e = liar.advance_to(9).unwrap_err().to_string();
        assert!(
            e.contains("succeeded but") && e.contains("reads 7 after it"),
            "{e}"
        );
    }
}
