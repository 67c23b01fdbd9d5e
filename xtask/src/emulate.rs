//! `xtask emulate --limit SECS [--log FILE] -- EMULATOR... PROGRAM ARGS...`:
//! the runner `cargo xtask cross-test` gives cargo for the target's test
//! binaries.
//!
//! It runs the emulator command in a process group of its own and passes
//! its output through. qemu-user can deadlock in a child it forks from a
//! multithreaded guest (seen with qemu 7.2: the test binary forks to start
//! `fw_printenv`, and the forked qemu waits on a futex forever, using no
//! CPU). That is an emulator fault, not a test result, and it would hang
//! the whole run. So when a test binary outlives `--limit` seconds, its
//! process group (the emulated test binary and everything it started) is
//! killed, the event is printed and appended to `--log`, and the binary
//! runs once more. A second hang, like any failure, is the test binary's
//! result.
//!
//! The limit is far above any test binary's normal time under emulation
//! (the slowest takes about 35 s), so a slow test is never mistaken for a
//! hang.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

pub fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask emulate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let usage = "usage: xtask emulate --limit SECS [--log FILE] -- EMULATOR... PROGRAM ARGS...";
    let mut limit = None;
    let mut log = None;
    let mut it = args.iter();
    let mut cmd: Vec<String> = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--limit" => {
                let v = it.next().ok_or(usage)?;
                limit = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("--limit {v:?}: not a number of seconds"))?,
                );
            }
            "--log" => log = Some(it.next().ok_or(usage)?.clone()),
            "--" => {
                cmd = it.by_ref().cloned().collect();
            }
            other => return Err(format!("unexpected {other:?}\n{usage}")),
        }
    }
    let limit = Duration::from_secs(limit.ok_or(usage)?);
    let (program, rest) = cmd.split_first().ok_or(usage)?;
    // The test binary is the first argument after the emulator's own
    // options: the first one that names an existing file.
    let binary = rest
        .iter()
        .find(|a| !a.starts_with('-') && std::path::Path::new(a).is_file())
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_else(|| program.clone());
    for attempt in 1..=2 {
        let mut child = Command::new(program)
            .args(rest)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {program}: {e}"))?;
        let started = Instant::now();
        let status = loop {
            match child
                .try_wait()
                .map_err(|e| format!("waiting for {program}: {e}"))?
            {
                Some(s) => break Some(s),
                None if started.elapsed() >= limit => break None,
                None => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        if let Some(s) = status {
            return Ok(match s.code() {
                Some(0) => ExitCode::SUCCESS,
                Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
                None => ExitCode::FAILURE,
            });
        }
        // Hung: end the group this runner made (the emulated test binary
        // and what it started), then reap the leader.
        let pgid = child.id() as libc::pid_t;
        // SAFETY: kill(2) with the negated id of the process group created
        // above for this child; it signals only processes of that group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = child.wait();
        let line = format!(
            "cross-test: {binary} was still running after {} s under the emulator (qemu-user can deadlock in a forked child); killed it{}",
            limit.as_secs(),
            if attempt == 1 {
                ", running it again"
            } else {
                " again; giving up"
            }
        );
        println!("{line}");
        eprintln!("{line}");
        if let Some(path) = &log {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(
                    f,
                    "{binary}\tattempt {attempt} killed after {} s",
                    limit.as_secs()
                );
            }
        }
    }
    Ok(ExitCode::FAILURE)
}
