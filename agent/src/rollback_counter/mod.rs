//! The hardware rollback floor: a counter kept outside the data partition
//! (a TPM 2.0 NV counter, or one a command keeps, e.g. in eMMC RPMB or a
//! secure element) whose value is the lowest `security_version` this
//! device installs.
//!
//! Why: the serial floors live in SQLite on the data partition; whoever
//! rewrites that partition resets them and can feed the device an old,
//! validly signed, vulnerable release. A counter that only ever moves up,
//! in storage the data partition does not hold, survives that.
//!
//! This module owns the [`Counter`] interface and its implementations
//! ([`tpm2`] through tpm2-tools, [`tpm_direct`] speaking [`tpm_wire`]'s
//! bytes to the TPM itself, [`command`]), and the pure rules the state machine applies:
//! whether a release may be installed against a reading ([`admit`]), how
//! many increments an advance may take ([`increments_needed`]) and what a
//! start must advance the counter to ([`catch_up`]). It never decides
//! when to advance (the state machine does so only once a commit is
//! durable, and at start), never gates booting (a counter above the
//! running release is fine) and never treats a counter it cannot read as
//! a floor of 0.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::child::{Failure, Watched};
use crate::config::{CounterKind, OnUnreadable, Rollback, TpmAccess};
use crate::error::{Error, Kind, Result};

pub mod command;
pub mod tpm2;
pub mod tpm_direct;
pub mod tpm_wire;

/// The most increments one advance may take. A TPM NV counter can never
/// be decreased or reset, so a security version far above the floor
/// (a typo in `--security-version`) would spend the counter's range for
/// good; such a release is refused before it is installed.
pub const MAX_STEP: u64 = 256;

/// The longest a counter's program may run (a TPM or RPMB operation takes
/// milliseconds).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Output kept from a counter's program, per stream.
const MAX_OUTPUT: usize = 64 * 1024;

/// A monotonic counter whose value is the device's rollback floor.
pub trait Counter {
    /// The counter as operators read it in messages and the status
    /// (`tpm2 NV index 0x1500016`).
    fn describe(&self) -> String;
    /// The counter's value.
    fn read(&mut self) -> Result<u64>;
    /// Move the counter up until it is at least `target`; its value then.
    /// Never moves it down; refuses more than [`MAX_STEP`] increments.
    fn advance_to(&mut self, target: u64) -> Result<u64>;
}

/// The counter `[rollback]` configures; `None` with `counter = "none"`.
pub fn from_config(cfg: &Rollback) -> Option<Box<dyn Counter>> {
    match cfg.counter {
        CounterKind::None => None,
        CounterKind::Tpm2 => {
            let index = cfg.nv_index.unwrap_or(crate::config::DEFAULT_NV_INDEX);
            Some(match cfg.access {
                TpmAccess::Tools => Box::new(tpm2::Tpm2::new(index, &cfg.tcti)),
                TpmAccess::Direct => Box::new(tpm_direct::Tpm2Direct::new(index, &cfg.tcti)),
            })
        }
        CounterKind::Command => Some(Box::new(command::CommandCounter::new(
            cfg.read_command.clone(),
            cfg.advance_command.clone(),
        ))),
    }
}

/// One reading of the counter, as the install gate sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    Value(u64),
    /// Why it could not be read.
    Unreadable(String),
}

/// Whether release `release`, signed with `security_version`, may be
/// installed against `reading` of the counter `counter`. `Ok(None)`: it
/// may; `Ok(Some(warning))`: it may, unchecked, because the operator
/// allowed installs without a readable counter (`on_unreadable =
/// "allow"`); `Err`: it must not, and why.
pub fn admit(
    release: &str,
    security_version: u64,
    counter: &str,
    reading: &Reading,
    on_unreadable: OnUnreadable,
) -> Result<Option<String>> {
    match reading {
        Reading::Value(floor) if security_version < *floor => Err(Error::new(
            Kind::Policy,
            format!(
                "release {release} security version {security_version} is below the hardware floor {floor} ({counter}): refusing a rollback"
            ),
        )),
        Reading::Value(floor) if security_version - floor > MAX_STEP => Err(Error::new(
            Kind::Policy,
            format!(
                "release {release} security version {security_version} is more than {MAX_STEP} above the hardware floor {floor} ({counter}): the counter could not be advanced to it after the commit"
            ),
        )),
        Reading::Value(_) => Ok(None),
        Reading::Unreadable(why) => match on_unreadable {
            OnUnreadable::Refuse => Err(Error::new(
                Kind::Io,
                format!(
                    "the hardware rollback floor ({counter}) cannot be read: {why}; refusing to install release {release} (rollback.on_unreadable = \"refuse\")"
                ),
            )),
            OnUnreadable::Allow => Ok(Some(format!(
                "the hardware rollback floor ({counter}) cannot be read: {why}; installing release {release} (security version {security_version}) unchecked, as rollback.on_unreadable = \"allow\" says"
            ))),
        },
    }
}

/// How many increments take the counter from `current` to `target`, at
/// least (a TPM counter's first increment may jump higher): 0 when it is
/// there already; refused beyond [`MAX_STEP`].
pub fn increments_needed(current: u64, target: u64, counter: &str) -> Result<u64> {
    let steps = target.saturating_sub(current);
    if steps > MAX_STEP {
        return Err(Error::new(
            Kind::Policy,
            format!(
                "advancing {counter} from {current} to {target} would take {steps} increments, more than {MAX_STEP}: not advanced"
            ),
        ));
    }
    Ok(steps)
}

/// What a start must advance the counter to: the committed release's
/// security version when the counter is below it (a power cut between the
/// commit and the advance). A counter above it stays as it is: only
/// installs are gated.
pub fn catch_up(committed: Option<u64>, counter: u64) -> Option<u64> {
    committed.filter(|&c| c > counter)
}

/// The `meta` key holding the security version of the release last
/// committed (written at its commit, before the counter is advanced).
pub const COMMITTED_SECURITY_VERSION: &str = "security_version";

/// The security version recorded for the release last committed; `None`
/// before the first commit that recorded one (or when unreadable).
pub(crate) fn committed_security_version(store: &crate::store::Store) -> Option<u64> {
    store
        .get(COMMITTED_SECURITY_VERSION)
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok())
}

/// `counter`'s value as a [`Reading`].
pub fn read_reading(counter: &mut dyn Counter) -> Reading {
    match counter.read() {
        Ok(v) => Reading::Value(v),
        Err(e) => Reading::Unreadable(e.to_string()),
    }
}

/// What a counter's program left.
pub(crate) struct Ran {
    pub(crate) success: bool,
    pub(crate) stdout: Vec<u8>,
    /// Its error output (the first 64 KiB).
    pub(crate) stderr: String,
    /// How it ended, for messages (`exit status 1`).
    pub(crate) status: String,
}

/// Run `argv` (its program looked up on `PATH`) with no input, its output
/// captured, for at most [`COMMAND_TIMEOUT`], sleeping in `poll(2)` until
/// it exits. `what` names it in errors.
pub(crate) fn run(argv: &[String], what: &str) -> Result<Ran> {
    let Some((prog, args)) = argv.split_first() else {
        return Err(Error::new(Kind::Config, format!("{what}: no program")));
    };
    let mut cmd = Command::new(prog);
    crate::notify::scrub(&mut cmd);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .current_dir("/");
    let mut child = Watched::spawn_group(&mut cmd)
        .map_err(|e| Error::new(Kind::Io, format!("{what}: starting `{prog}`: {e}")))?;
    let finished = child
        .collect(COMMAND_TIMEOUT, MAX_OUTPUT, &mut |fds, left| {
            crate::progress::wait_readable(fds, left);
            Ok(())
        })
        .map_err(|f| {
            let how = match f {
                Failure::TimedOut(_) => format!(
                    "`{prog}` still running after {} s: killed it",
                    COMMAND_TIMEOUT.as_secs()
                ),
                Failure::Read(e) => format!("reading the output of `{prog}`: {e}"),
                Failure::Wait(e) => format!("waiting for `{prog}`: {e}"),
                Failure::Interrupted(e) => format!("waiting for `{prog}`: {e}"),
            };
            Error::new(Kind::Io, format!("{what}: {how}"))
        })?;
    Ok(Ran {
        success: finished.status.success(),
        stdout: finished.stdout.bytes,
        stderr: String::from_utf8_lossy(&finished.stderr.bytes).into_owned(),
        status: finished.status.to_string(),
    })
}

/// The line of a program's error output that says what went wrong,
/// bounded for a log line: the first `ERROR` line (tpm2-tools print the
/// TPM's answer first and a generic "Unable to run" last), or else the
/// last non-empty line.
fn telling_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let line = lines
        .clone()
        .find(|l| l.contains("ERROR"))
        .or_else(|| lines.next_back())
        .unwrap_or("");
    crate::hash::truncate(line, 300).to_string()
}

/// A failed run as an error: what ran, how it ended and what it said.
pub(crate) fn failed(what: &str, ran: &Ran) -> Error {
    let line = telling_line(&ran.stderr);
    let said = if line.is_empty() {
        String::new()
    } else {
        format!(": {line}")
    };
    Error::new(Kind::Io, format!("{what} failed ({}){said}", ran.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TPM: &str = "tpm2 NV index 0x1500016";

    #[test]
    fn a_release_is_admitted_against_the_hardware_floor_row_by_row() {
        use OnUnreadable::{Allow, Refuse};
        let v = Reading::Value;
        let gone = || Reading::Unreadable("no TPM".into());
        // (security version, reading, on_unreadable, Ok(warns?) or Err(message part))
        let rows: Vec<(u64, Reading, OnUnreadable, std::result::Result<bool, &str>)> = vec![
            (0, v(0), Refuse, Ok(false)),
            (5, v(5), Refuse, Ok(false)),
            (6, v(5), Refuse, Ok(false)),
            (
                3,
                v(5),
                Refuse,
                Err(
                    "release 1.0 security version 3 is below the hardware floor 5 (tpm2 NV index 0x1500016)",
                ),
            ),
            (3, v(5), Allow, Err("is below the hardware floor 5")),
            (
                0,
                v(1),
                Refuse,
                Err("security version 0 is below the hardware floor 1"),
            ),
            (5 + MAX_STEP, v(5), Refuse, Ok(false)),
            (
                6 + MAX_STEP,
                v(5),
                Refuse,
                Err("more than 256 above the hardware floor 5"),
            ),
            (u64::MAX, v(0), Refuse, Err("more than 256 above")),
            (
                9,
                gone(),
                Refuse,
                Err(
                    "the hardware rollback floor (tpm2 NV index 0x1500016) cannot be read: no TPM; refusing to install release 1.0",
                ),
            ),
            (9, gone(), Allow, Ok(true)),
        ];
        for (sv, reading, on, want) in rows {
            let got = admit("1.0", sv, TPM, &reading, on);
            match (want, got) {
                (Ok(warns), Ok(w)) => assert_eq!(w.is_some(), warns, "{sv} {reading:?} {on:?}"),
                (Err(part), Err(e)) => {
                    assert!(e.to_string().contains(part), "{sv} {reading:?}: {e}")
                }
                (want, got) => panic!("{sv} {reading:?} {on:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn an_allowed_install_without_a_reading_says_it_is_unchecked() {
        let w = admit(
            "2.0",
            4,
            TPM,
            &Reading::Unreadable("gone".into()),
            OnUnreadable::Allow,
        )
        .unwrap()
        .unwrap();
        assert!(
            w.contains("installing release 2.0 (security version 4) unchecked"),
            "{w}"
        );
    }

    #[test]
    fn an_advance_takes_at_most_max_step_increments() {
        let rows: [(u64, u64, Option<u64>); 6] = [
            (0, 0, Some(0)),
            (5, 3, Some(0)),
            (3, 5, Some(2)),
            (0, MAX_STEP, Some(MAX_STEP)),
            (0, MAX_STEP + 1, None),
            (1, u64::MAX, None),
        ];
        for (current, target, want) in rows {
            let got = increments_needed(current, target, TPM);
            match want {
                Some(n) => assert_eq!(got.unwrap(), n, "{current} → {target}"),
                None => {
                    let e = got.unwrap_err().to_string();
                    assert!(e.contains(&format!("from {current} to {target}")), "{e}");
                    assert!(e.contains("more than 256"), "{e}");
                }
            }
        }
    }

    #[test]
    fn a_start_catches_the_counter_up_only_when_it_is_below_the_committed_release() {
        let rows = [
            (None, 0, None),
            (None, 7, None),
            (Some(0), 0, None),
            (Some(3), 3, None),
            // A power cut between the commit and the advance.
            (Some(4), 3, Some(4)),
            // The counter advanced, the commit record lost: left as it is.
            (Some(2), 5, None),
        ];
        for (committed, counter, want) in rows {
            assert_eq!(
                catch_up(committed, counter),
                want,
                "{committed:?} {counter}"
            );
        }
    }

    #[test]
    fn the_telling_line_of_an_error_output_is_its_first_error_or_its_last_line() {
        let rows = [
            ("", ""),
            ("\n  \n", ""),
            ("one\ntwo\n\n", "two"),
            (
                "WARNING:esys: Received TPM Error\nERROR: Esys_NV_Read(0x14A) - nv uninitialized\nERROR: Unable to run tpm2_nvread\n",
                "ERROR: Esys_NV_Read(0x14A) - nv uninitialized",
            ),
        ];
        for (text, want) in rows {
            assert_eq!(telling_line(text), want, "{text:?}");
        }
        assert_eq!(telling_line(&"x".repeat(1000)).len(), 300);
    }

    #[test]
    fn a_program_that_runs_too_long_or_fails_is_an_error_naming_it() {
        let ok = run(
            &["sh".into(), "-c".into(), "echo 12; echo oops >&2".into()],
            "t",
        )
        .unwrap();
        assert!(ok.success);
        assert_eq!(ok.stdout, b"12\n");
        assert_eq!(ok.stderr, "oops\n");
        let bad = run(
            &[
                "sh".into(),
                "-c".into(),
                "echo one >&2; echo two >&2; exit 3".into(),
            ],
            "reading x",
        )
        .unwrap();
        assert!(!bad.success);
        assert_eq!(
            failed("reading x", &bad).to_string(),
            "reading x failed (exit status: 3): two"
        );
        // Natively the spawn fails and the error names the program; under
        // an emulator (qemu-user starts the program itself) it is the
        // emulator that exits 127, a failed run.
        match run(&["/nonexistent/counter".into()], "reading x") {
            Err(missing) => assert!(
                missing
                    .to_string()
                    .contains("reading x: starting `/nonexistent/counter`"),
                "{missing}"
            ),
            Ok(ran) => {
                assert!(!ran.success);
                assert!(ran.status.contains("127"), "{}", ran.status);
            }
        }
    }
}
