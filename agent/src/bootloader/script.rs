//! The `script` backend: an operator-supplied executable drives any other
//! bootloader.
//!
//! This module owns the protocol between updraft and that executable. It is
//! run directly (no shell, so no argument is ever interpreted) as
//!
//! ```text
//! SCRIPT read
//! SCRIPT disable SLOT
//! SCRIPT trial SLOT TRIES
//! SCRIPT good SLOT TRIES
//! SCRIPT bad SLOT
//! ```
//!
//! with SLOT `A` or `B` and TRIES a decimal count, standard input from
//! `/dev/null`, working directory `/`. `read` prints the selection in the
//! lines of the `file` backend (`BOOT_ORDER=A B`, `BOOT_A_LEFT=3`,
//! `BOOT_B_LEFT=3`; blank lines, `#` comments and other names are
//! ignored). Exit status 0 means done; anything else is an error that quotes
//! the end of the script's standard error.
//!
//! Every run is bounded: the script is killed (with its process group)
//! after [`DEFAULT_TIMEOUT`], and at most [`MAX_OUTPUT`] bytes of each
//! output stream are kept. The wait sleeps in `poll(2)` on the script's
//! pipes and pidfd through the driver's ticker, so the daemon answers its
//! socket while a script runs (and a stop request waits for the script to
//! end rather than cutting a bootloader write short). This module must
//! never block on the script
//! without a deadline, never pass anything through a shell, and never take
//! output it could not parse as a state.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{BootState, Bootloader, SlotBoot, model};
use crate::child::{Failure, Finished, Watched};
use crate::error::{Context, Error, Kind, Result};
use crate::progress::{Ticker, Uninterrupted};
use crate::slot::SlotName;
use crate::{bail, err};

/// A script still running after this is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes kept of each of the script's output streams.
pub const MAX_OUTPUT: usize = 64 * 1024;

/// Bytes of standard error quoted in an error message.
const STDERR_QUOTE: usize = 1000;

pub struct ScriptBootloader {
    script: PathBuf,
    timeout: Duration,
}

/// The end of standard error, for an error message.
fn quote_stderr(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.is_empty() {
        return "(no output on stderr)".into();
    }
    if text.len() <= STDERR_QUOTE {
        return format!("stderr: {text}");
    }
    let mut cut = text.len() - STDERR_QUOTE;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    format!("stderr (last {STDERR_QUOTE} bytes): …{}", &text[cut..])
}

/// Parse the output of `SCRIPT read`.
pub fn parse_state(output: &[u8]) -> Result<BootState> {
    let text =
        std::str::from_utf8(output).map_err(|e| err!(Malformed, "output is not UTF-8 ({e})"))?;
    let mut order = None;
    let mut left: [Option<u32>; 2] = [None, None];
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            bail!(Malformed, "line {n}: expected NAME=value, got {line:?}");
        };
        let (k, v) = (k.trim(), v.trim());
        let count = |v: &str| {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err!(Malformed, "line {n}: {k}={v:?} is not a count"));
            }
            v.parse::<u32>()
                .map_err(|_| err!(Malformed, "line {n}: {k}={v:?} is not a count"))
        };
        let slot = match k {
            "BOOT_ORDER" => {
                if order.is_some() {
                    bail!(Malformed, "line {n}: BOOT_ORDER given twice");
                }
                order = Some(
                    model::parse_order(v)
                        .map_err(|e| e.wrap(format!("line {n}")).with_kind(Kind::Malformed))?,
                );
                continue;
            }
            "BOOT_A_LEFT" => 0,
            "BOOT_B_LEFT" => 1,
            _ => continue,
        };
        if left[slot].is_some() {
            bail!(Malformed, "line {n}: {k} given twice");
        }
        left[slot] = Some(count(v)?);
    }
    let (Some(order), [Some(a), Some(b)]) = (order, left) else {
        bail!(Malformed, "lacks BOOT_ORDER, BOOT_A_LEFT or BOOT_B_LEFT");
    };
    let boot = |s: SlotName, l: u32| SlotBoot {
        bootable: order.contains(&s) && l > 0,
        tries_left: l,
    };
    Ok(BootState {
        a: boot(SlotName::A, a),
        b: boot(SlotName::B, b),
        order,
    })
}

impl ScriptBootloader {
    /// `script` must be an executable file.
    pub fn new(script: PathBuf) -> Result<ScriptBootloader> {
        let md = std::fs::metadata(&script).kind_context(
            Kind::Config,
            format!("bootloader script {}", script.display()),
        )?;
        if !md.is_file() || md.permissions().mode() & 0o111 == 0 {
            bail!(
                Config,
                "bootloader script {} is not an executable file",
                script.display()
            );
        }
        Ok(ScriptBootloader {
            script,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Kill the script after `timeout` instead of [`DEFAULT_TIMEOUT`].
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn command_line(&self, args: &[&str]) -> String {
        let mut s = self.script.display().to_string();
        for a in args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }

    /// Run the script with `args`; its standard output on success. The
    /// wait for it goes through `t` (see [`Uninterrupted`]).
    fn run(&self, args: &[&str], t: &mut dyn Ticker) -> Result<Vec<u8>> {
        let cmd = self.command_line(args);
        let f = self
            .spawn_and_wait(args, t)
            .map_err(|e| e.wrap(format!("bootloader script `{cmd}`")))?;
        if !f.status.success() {
            let how = match (f.status.code(), f.status.signal()) {
                (Some(c), _) => format!("exited with status {c}"),
                (None, Some(s)) => format!("was killed by signal {s}"),
                _ => "failed".into(),
            };
            bail!(
                Bootloader,
                "bootloader script `{cmd}` {how}; {}",
                quote_stderr(&f.stderr.bytes)
            );
        }
        if f.stdout.truncated {
            bail!(
                Bootloader,
                "bootloader script `{cmd}` printed more than {MAX_OUTPUT} bytes on stdout"
            );
        }
        Ok(f.stdout.bytes)
    }

    /// Run the script until it exits or its timeout passes, its output
    /// captured; the wait sleeps in `poll(2)` on its pipes and its pidfd
    /// through `t` (see [`Uninterrupted`]), and a script still running at
    /// the timeout has its process group killed.
    fn spawn_and_wait(&self, args: &[&str], t: &mut dyn Ticker) -> Result<Finished> {
        let mut cmd = Command::new(&self.script);
        // The script must not talk to systemd as if it were the daemon.
        crate::notify::scrub(&mut cmd);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .current_dir("/");
        let mut child =
            Watched::spawn_group(&mut cmd).kind_context(Kind::Bootloader, "starting it")?;
        let mut wait = Uninterrupted::new(t);
        child
            .collect(self.timeout, MAX_OUTPUT, &mut |fds, left| {
                wait.wait(fds, left);
                Ok(())
            })
            .map_err(|f| match f {
                Failure::Read(e) => Error::from(e)
                    .wrap("reading its output")
                    .with_kind(Kind::Bootloader),
                Failure::Wait(e) => Error::from(e)
                    .wrap("waiting for it")
                    .with_kind(Kind::Bootloader),
                Failure::TimedOut(stderr) => err!(
                    Bootloader,
                    "still running after {} ms: killed it; {}",
                    self.timeout.as_millis(),
                    quote_stderr(&stderr.bytes)
                ),
                Failure::Interrupted(e) => e.with_kind(Kind::Bootloader),
            })
    }

    fn read_state(&self, t: &mut dyn Ticker) -> Result<BootState> {
        let out = self.run(&["read"], t)?;
        parse_state(&out).kind_context(
            Kind::Bootloader,
            format!(
                "output of bootloader script `{}`",
                self.command_line(&["read"])
            ),
        )
    }
}

impl Bootloader for ScriptBootloader {
    fn describe(&self) -> String {
        format!("script {}", self.script.display())
    }

    fn read_with(&mut self, t: &mut dyn Ticker) -> Result<BootState> {
        self.read_state(t)
    }

    fn disable_with(&mut self, slot: SlotName, t: &mut dyn Ticker) -> Result<()> {
        self.run(&["disable", slot.as_str()], t).map(|_| ())
    }

    fn trial_with(&mut self, slot: SlotName, tries: u32, t: &mut dyn Ticker) -> Result<()> {
        self.run(&["trial", slot.as_str(), &tries.to_string()], t)
            .map(|_| ())
    }

    fn mark_good_with(&mut self, slot: SlotName, tries: u32, t: &mut dyn Ticker) -> Result<()> {
        let s = self.read_state(t)?;
        if s.order.first() == Some(&slot)
            && s.slot(slot).bootable
            && s.slot(slot).tries_left == tries
        {
            return Ok(());
        }
        self.run(&["good", slot.as_str(), &tries.to_string()], t)
            .map(|_| ())
    }

    fn mark_bad_with(&mut self, slot: SlotName, t: &mut dyn Ticker) -> Result<()> {
        self.run(&["bad", slot.as_str()], t).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn script(name: &str, body: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("updraft-script-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("boot-select");
        crate::test_support::write_executable(&p, &format!("#!/bin/sh\n{body}"));
        p
    }

    /// A script keeping the state in a file next to it and logging calls.
    fn stateful(name: &str) -> PathBuf {
        script(
            name,
            r#"dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
[ -f "$dir/state" ] || printf 'BOOT_ORDER=A B\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n' > "$dir/state"
. "$dir/state"
case "$1" in
  read) cat "$dir/state"; exit 0 ;;
  disable) [ "$2" = A ] && BOOT_A_LEFT=0 || BOOT_B_LEFT=0; BOOT_ORDER=$( [ "$2" = A ] && echo B || echo A ) ;;
  trial|good) if [ "$2" = A ]; then BOOT_A_LEFT=$3; BOOT_ORDER="A B"; else BOOT_B_LEFT=$3; BOOT_ORDER="B A"; fi ;;
  bad) if [ "$2" = A ]; then BOOT_A_LEFT=0; BOOT_ORDER=B; else BOOT_B_LEFT=0; BOOT_ORDER=A; fi ;;
  *) echo "unknown verb $1" >&2; exit 2 ;;
esac
printf 'BOOT_ORDER=%s\nBOOT_A_LEFT=%s\nBOOT_B_LEFT=%s\n' "$BOOT_ORDER" "$BOOT_A_LEFT" "$BOOT_B_LEFT" > "$dir/state"
"#,
        )
    }

    fn calls(script: &Path) -> Vec<String> {
        std::fs::read_to_string(script.with_file_name("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn protocol_verbs_and_arguments() {
        let p = stateful("verbs");
        let mut bl = ScriptBootloader::new(p.clone()).unwrap();
        bl.disable(SlotName::B).unwrap();
        assert_eq!(bl.read().unwrap().order, vec![SlotName::A]);
        bl.trial(SlotName::B, 3).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.next_boot(), Some(SlotName::B));
        assert_eq!(s.b.tries_left, 3);
        bl.mark_good(SlotName::B, 3).unwrap();
        bl.mark_good(SlotName::B, 2).unwrap();
        bl.mark_bad(SlotName::B).unwrap();
        assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::A));
        assert_eq!(
            calls(&p),
            vec![
                "disable B",
                "read",
                "trial B 3",
                "read",
                "read",
                "read",
                "good B 2",
                "bad B",
                "read"
            ],
            "mark_good reads first and skips the write when B is already first with 3 tries"
        );
    }

    #[test]
    fn arguments_are_not_interpreted_by_a_shell() {
        let p = script(
            "noshell",
            "for a in \"$@\"; do printf '%s|' \"$a\"; done >&2; exit 1\n",
        );
        let bl = ScriptBootloader::new(p).unwrap();
        let e = bl
            .run(
                &["trial", "B; touch /tmp/x", "$(id)"],
                &mut crate::progress::NoTick,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("trial|B; touch /tmp/x|$(id)|"), "{e}");
    }

    #[test]
    fn failures_quote_stderr() {
        let p = script(
            "fail",
            "echo 'fw_setenv: cannot open /dev/mmcblk0' >&2; exit 3\n",
        );
        let mut bl = ScriptBootloader::new(p.clone()).unwrap();
        let e = bl.trial(SlotName::B, 3).unwrap_err();
        assert_eq!(e.kind(), Kind::Bootloader);
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("`{} trial B 3` exited with status 3", p.display())),
            "{msg}"
        );
        assert!(
            msg.contains("stderr: fw_setenv: cannot open /dev/mmcblk0"),
            "{msg}"
        );
    }

    #[test]
    fn long_stderr_is_truncated_to_its_end() {
        let p = script(
            "longerr",
            "i=0; while [ $i -lt 3000 ]; do echo \"line $i\" >&2; i=$((i+1)); done; exit 1\n",
        );
        let e = ScriptBootloader::new(p)
            .unwrap()
            .read()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("last 1000 bytes") && e.ends_with("line 2999"),
            "{}",
            &e[..200]
        );
        assert!(e.len() < 1400, "{}", e.len());
    }

    #[test]
    fn endless_output_is_capped() {
        let p = script("endless", "yes BOOT_ORDER=A | head -c 1000000\n");
        let e = ScriptBootloader::new(p)
            .unwrap()
            .read()
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 65536 bytes"), "{e}");
    }

    #[test]
    fn a_hanging_script_is_killed() {
        let p = script("hang", "echo started >&2; sleep 600 & wait\n");
        let mut bl = ScriptBootloader::new(p).unwrap();
        bl.set_timeout(Duration::from_millis(300));
        let e = bl.read().unwrap_err().to_string();
        assert!(
            e.contains("still running after 300 ms: killed it") && e.contains("started"),
            "{e}"
        );
    }

    #[test]
    fn malformed_read_output_is_refused() {
        for (out, want) in [
            ("BOOT_ORDER=A B\nBOOT_A_LEFT=3\n", "lacks"),
            (
                "BOOT_ORDER=A C\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n",
                "unknown slot",
            ),
            (
                "BOOT_ORDER=A B\nBOOT_A_LEFT=three\nBOOT_B_LEFT=3\n",
                "line 2: BOOT_A_LEFT=\"three\" is not a count",
            ),
            (
                "BOOT_ORDER=A B\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\nBOOT_B_LEFT=1\n",
                "given twice",
            ),
            ("garbage\n", "line 1: expected NAME=value"),
        ] {
            assert!(
                parse_state(out.as_bytes())
                    .unwrap_err()
                    .to_string()
                    .contains(want),
                "{out:?}"
            );
        }
        assert!(parse_state(b"\xff\xfe").is_err());
        let s =
            parse_state(b"# note\nBOOT_ORDER=B\nOTHER=x\nBOOT_A_LEFT=0\nBOOT_B_LEFT=2\n").unwrap();
        assert_eq!(s.order, vec![SlotName::B]);
        assert!(!s.a.bootable && s.b.bootable);
        let p = script("badout", "echo nonsense\n");
        let e = ScriptBootloader::new(p)
            .unwrap()
            .read()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("output of bootloader script") && e.contains("nonsense"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_or_non_executable_script_is_a_config_error() {
        let p = script("noexec", "exit 0\n");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            ScriptBootloader::new(p.clone()).err().unwrap().kind(),
            Kind::Config
        );
        assert_eq!(
            ScriptBootloader::new(p.with_file_name("none"))
                .err()
                .unwrap()
                .kind(),
            Kind::Config
        );
    }
}
