//! Command handlers: the executable a device configuration names for a
//! `command` component, run one phase at a time
//! ([docs/components.md](../../docs/components.md), "The `command` handler
//! protocol").
//!
//! A handler is the integrator's code (a vendor's flasher, a container
//! loader), so it is treated as something that may crash, hang, print
//! garbage or lie, and none of that may stop the daemon: each phase runs
//! in a process group of its own with a deadline, after which the whole
//! group is killed; standard output and error are read on helper threads
//! a line at a time (at most [`MAX_LINE`] bytes a line, invalid UTF-8
//! replaced), so a handler that floods them or never ends a line cannot
//! grow the daemon's memory; the payload is written to its standard input
//! from another thread, so a handler that stops reading blocks nobody but
//! that thread, and a handler that exits early ends the copy. The daemon's
//! thread meanwhile sleeps on the child's pidfd through the driver's
//! [`Ticker`], so it keeps answering clients and the watchdog.
//!
//! Lines `progress DONE TOTAL` on standard output are progress; every
//! other line goes to the log with the component's name, and the last one
//! is kept to say why a phase failed. Exit status 0 is success, anything
//! else (a signal included) failure.
//!
//! This module runs a phase and reports what happened; it never decides
//! what a failure means for the release.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::child::Watched;
use crate::error::{Error, Kind, Result};
use crate::progress::{Progress, Ticker};
use crate::{bail, err};

/// The longest line read from a handler; longer ones are cut there.
pub const MAX_LINE: usize = 4096;

/// The longest one wait for the child sleeps before the status line and
/// the stop flag are looked at again.
const WAIT_SLICE: Duration = Duration::from_secs(1);

/// A phase of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Install,
    Activate,
    Commit,
    Rollback,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Install => "install",
            Phase::Activate => "activate",
            Phase::Commit => "commit",
            Phase::Rollback => "rollback",
        }
    }
}

/// A configured handler for one component.
#[derive(Debug, Clone)]
pub struct Handler {
    /// The component's name, for the log and the environment.
    pub component: String,
    /// The program and its arguments; the phase is appended.
    pub argv: Vec<String>,
    /// The longest a phase may run.
    pub timeout: Duration,
    /// A directory kept for the component between phases.
    pub work_dir: PathBuf,
}

/// What a phase is run for.
#[derive(Debug, Clone)]
pub struct Run<'a> {
    pub phase: Phase,
    pub version: &'a str,
    pub previous_version: Option<&'a str>,
}

/// A phase that succeeded: the last progress it reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Done {
    pub progress: Option<(u64, u64)>,
}

/// A line a handler wrote, and on which stream.
enum Line {
    Out(String),
    Err(String),
}

/// Read `r` a line at a time, at most [`MAX_LINE`] bytes a line, until it
/// ends; each line goes to `tx`.
fn read_lines(r: impl Read, tx: mpsc::Sender<Line>, out: bool) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        let mut limited = (&mut r).take(MAX_LINE as u64);
        match limited.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if buf.len() == MAX_LINE && buf.last() != Some(&b'\n') {
            // Drop the rest of an overlong line.
            let mut rest = Vec::new();
            let _ = (&mut r).take(u64::MAX).read_until(b'\n', &mut rest);
        }
        let text = String::from_utf8_lossy(&buf)
            .trim_end_matches(['\n', '\r'])
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect::<String>();
        let line = if out {
            Line::Out(text)
        } else {
            Line::Err(text)
        };
        if tx.send(line).is_err() {
            return;
        }
    }
}

/// Copy the payload into the handler's standard input. A handler that
/// exits early closes the pipe: the write fails, which its exit status
/// explains, so that is no error here; a payload that cannot be read is.
fn feed(
    mut payload: Box<dyn Read + Send>,
    mut stdin: std::process::ChildStdin,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match payload.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if stdin.write_all(&buf[..n]).is_err() {
            return Ok(());
        }
    }
    let _ = stdin.flush();
    Ok(())
}

/// `progress DONE TOTAL`, DONE at most TOTAL.
fn parse_progress(line: &str) -> Option<(u64, u64)> {
    let mut w = line.split_ascii_whitespace();
    if w.next()? != "progress" {
        return None;
    }
    let done = w.next()?.parse().ok()?;
    let total = w.next()?.parse().ok()?;
    (w.next().is_none() && done <= total).then_some((done, total))
}

impl Handler {
    /// [`Handler::run`] with nothing to serve while it waits (one-shot
    /// commands, tools, tests).
    pub fn run_unattended(
        &self,
        run: &Run<'_>,
        payload: Option<Box<dyn Read + Send>>,
    ) -> Result<Done> {
        self.run(run, payload, &mut crate::progress::NoTick)
    }

    /// Run one phase; `payload` is written to its standard input (the
    /// install phase), else standard input is empty.
    pub fn run(
        &self,
        run: &Run<'_>,
        payload: Option<Box<dyn Read + Send>>,
        t: &mut dyn Ticker,
    ) -> Result<Done> {
        let phase = run.phase.as_str();
        let what = format!("component {} handler, phase {phase}", self.component);
        let Some((prog, args)) = self.argv.split_first() else {
            bail!(Config, "component {}: the handler is empty", self.component);
        };
        std::fs::create_dir_all(&self.work_dir)
            .map_err(|e| err!(Io, "{what}: creating {}: {e}", self.work_dir.display()))?;
        let mut cmd = Command::new(prog);
        crate::notify::scrub(&mut cmd);
        cmd.args(args)
            .arg(phase)
            .env("UPDRAFT_COMPONENT", &self.component)
            .env("UPDRAFT_VERSION", run.version)
            .env(
                "UPDRAFT_PREVIOUS_VERSION",
                run.previous_version.unwrap_or(""),
            )
            .env("UPDRAFT_WORK_DIR", &self.work_dir)
            .current_dir(&self.work_dir)
            .stdin(if payload.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A group of its own: a timeout ends whatever the handler started.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child =
            Watched::spawn(&mut cmd).map_err(|e| err!(Io, "{what}: starting {prog}: {e}"))?;
        let pgid = nix::unistd::Pid::from_raw(child.child().id() as i32);
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        if let Some(out) = child.child().stdout.take() {
            let tx = tx.clone();
            threads.push(std::thread::spawn(move || read_lines(out, tx, true)));
        }
        if let Some(err) = child.child().stderr.take() {
            let tx = tx.clone();
            threads.push(std::thread::spawn(move || read_lines(err, tx, false)));
        }
        drop(tx);
        let feeder = match (payload, child.child().stdin.take()) {
            (Some(p), Some(stdin)) => Some(std::thread::spawn(move || feed(p, stdin))),
            _ => None,
        };
        let deadline = Instant::now() + self.timeout;
        let mut said = Said {
            progress: Progress {
                phase: format!("{} {phase}", self.component),
                ..Progress::default()
            },
            reported: false,
            last: None,
        };
        let kill_group = |child: &mut Watched| {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            child.kill();
        };
        let status = loop {
            for line in rx.try_iter() {
                said.take(&self.component, phase, line);
            }
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) => {}
                Err(e) => {
                    kill_group(&mut child);
                    bail!(Io, "{what}: waiting for {prog}: {e}");
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                kill_group(&mut child);
                bail!(
                    Io,
                    "{what}: did not finish within {}; killed{}",
                    crate::timestamp::format_duration(self.timeout),
                    said.quote()
                );
            }
            if let Err(e) = t
                .tick(&said.progress)
                .and_then(|()| t.wait(child.fd().as_slice(), left.min(WAIT_SLICE)))
            {
                kill_group(&mut child);
                return Err(e);
            }
        };
        // The group may have left children holding the pipes open.
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        for th in threads {
            let _ = th.join();
        }
        // A payload that could not be read whole (a frame that failed
        // verification, a download cut) fails the phase whatever the
        // handler made of the short input.
        if let Some(f) = feeder {
            match f.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => bail!(Integrity, "{what}: its payload: {e}"),
                Err(_) => bail!(Io, "{what}: the payload thread panicked"),
            }
        }
        for line in rx.try_iter() {
            said.take(&self.component, phase, line);
        }
        if status.success() {
            return Ok(Done {
                progress: said
                    .reported
                    .then_some((said.progress.done, said.progress.total)),
            });
        }
        Err(Error::new(
            Kind::Io,
            format!("{what}: {prog} failed ({status}){}", said.quote()),
        ))
    }
}

/// What a handler said during a phase: its progress, and the last line
/// for the log, kept to say why the phase failed.
struct Said {
    progress: Progress,
    /// A progress line came.
    reported: bool,
    last: Option<String>,
}

impl Said {
    /// One line a handler wrote: progress, or a line for the log.
    fn take(&mut self, component: &str, phase: &str, line: Line) {
        let text = match line {
            Line::Out(s) => match parse_progress(&s) {
                Some((done, total)) => {
                    self.progress.done = done;
                    self.progress.total = total;
                    self.reported = true;
                    return;
                }
                None => s,
            },
            Line::Err(s) => s,
        };
        log::info!("component {component} {phase}: {text}");
        self.last = Some(text);
    }

    /// `; it said "…"` for an error, when the handler said anything.
    fn quote(&self) -> String {
        match &self.last {
            Some(l) => format!("; it said {l:?}"),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoTick;
    use crate::test_support::{scratch_dir, write_executable};

    fn handler(name: &str, script: &str, timeout: Duration) -> Handler {
        let dir = scratch_dir("handler", name);
        let prog = dir.join("handler");
        write_executable(&prog, &format!("#!/bin/sh\n{script}\n"));
        Handler {
            component: "mcu".into(),
            argv: vec![prog.display().to_string()],
            timeout,
            work_dir: dir.join("work"),
        }
    }

    fn run(h: &Handler, phase: Phase, payload: Option<&'static [u8]>) -> Result<Done> {
        let payload = payload.map(|p| Box::new(p) as Box<dyn Read + Send>);
        h.run(
            &Run {
                phase,
                version: "4.1",
                previous_version: Some("4.0"),
            },
            payload,
            &mut NoTick,
        )
    }

    #[test]
    fn a_phase_gets_its_payload_environment_and_reports_progress() {
        let h = handler(
            "ok",
            r#"[ "$1" = install ] || exit 9
cat > "$UPDRAFT_WORK_DIR/payload"
echo "progress 3 7"
echo "$UPDRAFT_COMPONENT $UPDRAFT_VERSION $UPDRAFT_PREVIOUS_VERSION $(pwd)" > "$UPDRAFT_WORK_DIR/env"
echo "progress 7 7""#,
            Duration::from_secs(20),
        );
        let done = run(&h, Phase::Install, Some(b"firmware bytes")).unwrap();
        assert_eq!(done.progress, Some((7, 7)));
        assert_eq!(
            std::fs::read(h.work_dir.join("payload")).unwrap(),
            b"firmware bytes"
        );
        let env = std::fs::read_to_string(h.work_dir.join("env")).unwrap();
        assert_eq!(env.trim(), format!("mcu 4.1 4.0 {}", h.work_dir.display()));
    }

    #[test]
    fn a_handler_that_fails_in_any_way_fails_its_phase_with_the_reason() {
        // (script, timeout, what the error says)
        let rows: [(&str, u64, &str); 5] = [
            (
                "echo 'flash: no device' >&2; exit 3",
                20,
                "failed (exit status: 3); it said \"flash: no device\"",
            ),
            ("kill -SEGV $$", 20, "signal: 11"),
            (
                "sleep 600 & sleep 600",
                1,
                "did not finish within 1s; killed",
            ),
            (
                "head -c 100000 /dev/urandom; printf 'x%.0s' $(seq 1 9000); echo; exit 1",
                20,
                "failed (exit status: 1); it said",
            ),
            ("exec 0<&-; exit 4", 20, "exit status: 4"),
        ];
        for (i, (script, secs, says)) in rows.into_iter().enumerate() {
            for phase in [
                Phase::Install,
                Phase::Activate,
                Phase::Commit,
                Phase::Rollback,
            ] {
                let h = handler(&format!("bad{i}"), script, Duration::from_secs(secs));
                let payload: Option<&'static [u8]> =
                    (phase == Phase::Install).then_some(&[7u8; 1 << 20][..]);
                let t = Instant::now();
                let e = run(&h, phase, payload).unwrap_err().to_string();
                assert!(
                    e.contains(&format!("component mcu handler, phase {}", phase.as_str()))
                        && e.contains(says),
                    "{script}: {e}"
                );
                // The deadline ends a phase, whatever it started: bounded, not timed.
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "{script}: took {:?}",
                    t.elapsed()
                );
            }
        }
    }

    #[test]
    fn progress_lines_are_read_strictly() {
        let rows = [
            ("progress 1 2", Some((1, 2))),
            ("progress 2 2", Some((2, 2))),
            ("progress 3 2", None),
            ("progress 1", None),
            ("progress 1 2 3", None),
            ("progress -1 2", None),
            ("progres 1 2", None),
            ("  progress   5  9 ", Some((5, 9))),
        ];
        for (line, want) in rows {
            assert_eq!(parse_progress(line), want, "{line:?}");
        }
    }
}
