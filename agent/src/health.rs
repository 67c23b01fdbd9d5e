//! Health checks after booting a new slot.
//!
//! The new release must prove itself before it is committed: every
//! executable in `health.checks_dir` runs (in name order, each with
//! `health.check_timeout`), every unit in `health.required_units` must be
//! active (`systemctl is-active`), and optionally the update server must be
//! reachable; all within `health.timeout`. Checks are child processes
//! watched through their pidfd ([`crate::child`]): the daemon sleeps in
//! `poll(2)` until a check exits or its time is up
//! ([`HealthRun::wait_fd`], [`HealthRun::until_limit`]), serving its socket
//! and pinging the watchdog meanwhile, and [`HealthRun::poll`] never
//! blocks. A check's stdout and stderr go to
//! `state_dir/health/NAME.log`; the reason reported for a failure quotes the
//! end of it.
//!
//! A run whose checks have all exited with success is a pass, even when
//! it is polled only after `health.timeout` (the deadline stops checks
//! that hang; it never turns a finished pass into a failure).
//!
//! This module runs checks and reports pass or fail with a reason. It never
//! touches the bootloader: committing or rolling back is the state
//! machine's decision.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::Watched;
use crate::config::Health;
use crate::error::{Context, Result};
use crate::fsutil::ensure_dir;

/// One thing to check.
#[derive(Clone, Debug)]
enum Check {
    Exec(PathBuf),
    Unit(String),
}

impl Check {
    fn name(&self) -> String {
        match self {
            Check::Exec(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            Check::Unit(u) => format!("unit {u}"),
        }
    }
}

/// Result of a finished run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail(String),
}

/// A health-check run in progress.
pub struct HealthRun {
    pending: Vec<Check>,
    current: Option<(Check, Watched, Instant, PathBuf)>,
    deadline: Instant,
    check_timeout: Duration,
    log_dir: PathBuf,
    env: Vec<(String, String)>,
    passed: Vec<String>,
}

impl HealthRun {
    /// Collect the checks and start the clock. `env` is passed to every
    /// check (slot, versions).
    pub fn start(cfg: &Health, state_dir: &Path, env: Vec<(String, String)>) -> Result<HealthRun> {
        let mut pending = Vec::new();
        match std::fs::read_dir(&cfg.checks_dir) {
            Ok(entries) => {
                let mut execs: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| {
                        let hidden = p
                            .file_name()
                            .map(|n| n.to_string_lossy().starts_with('.'))
                            .unwrap_or(true);
                        let exec = std::fs::metadata(p)
                            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                            .unwrap_or(false);
                        !hidden && exec
                    })
                    .collect();
                execs.sort();
                pending.extend(execs.into_iter().map(Check::Exec));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(crate::error::Error::from(e).wrap(format!(
                    "reading health.checks_dir {}",
                    cfg.checks_dir.display()
                )));
            }
        }
        pending.extend(cfg.required_units.iter().cloned().map(Check::Unit));
        pending.reverse();
        let log_dir = state_dir.join("health");
        ensure_dir(&log_dir, 0o755)?;
        Ok(HealthRun {
            pending,
            current: None,
            deadline: Instant::now() + cfg.timeout.0,
            check_timeout: cfg.check_timeout.0,
            log_dir,
            env,
            passed: Vec::new(),
        })
    }

    /// Readable when the running check exits (`None` between checks or
    /// without pidfd support).
    pub(crate) fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.current
            .as_ref()
            .and_then(|(_, child, _, _)| child.fd())
    }

    /// When a check started at `started` is out of time.
    fn limit(&self, started: Instant) -> Instant {
        (started + self.check_timeout).min(self.deadline)
    }

    /// Time until the running check, or the whole run, is out of time.
    pub(crate) fn until_limit(&self) -> Duration {
        let limit = match &self.current {
            Some((_, _, started, _)) => self.limit(*started),
            None => self.deadline,
        };
        limit.saturating_duration_since(Instant::now())
    }

    /// Advance without blocking; `Some` when the run is decided.
    pub fn poll(&mut self) -> Option<Verdict> {
        let now = Instant::now();
        let limit = self
            .current
            .as_ref()
            .map(|(_, _, started, _)| self.limit(*started));
        if let Some((check, child, _, log)) = self.current.as_mut() {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let name = check.name();
                    let log = log.clone();
                    self.current = None;
                    if status.success() {
                        log::info!("health check {name} passed");
                        self.passed.push(name);
                    } else {
                        let tail = tail(&log, 400);
                        let mut why = format!("health check {name} failed ({status})");
                        if !tail.is_empty() {
                            why.push_str(&format!(": {tail}"));
                        }
                        return Some(Verdict::Fail(why));
                    }
                }
                Ok(None) => {
                    if limit.is_some_and(|l| now >= l) {
                        let name = check.name();
                        child.kill();
                        self.current = None;
                        let which = if now >= self.deadline {
                            "the overall health.timeout"
                        } else {
                            "health.check_timeout"
                        };
                        return Some(Verdict::Fail(format!(
                            "health check {name} did not finish within {which}"
                        )));
                    }
                    return None;
                }
                Err(e) => {
                    let name = check.name();
                    self.current = None;
                    return Some(Verdict::Fail(format!(
                        "health check {name}: waiting failed: {e}"
                    )));
                }
            }
        }
        // Every check passed: that is a pass, however late this poll
        // comes (the daemon may have been busy past the deadline).
        let Some(next) = self.pending.pop() else {
            return Some(Verdict::Pass);
        };
        if now >= self.deadline {
            return Some(Verdict::Fail(format!(
                "health checks did not finish within health.timeout: {} not started",
                next.name()
            )));
        }
        match self.spawn(&next) {
            Ok((child, log)) => {
                self.current = Some((next, child, Instant::now(), log));
                None
            }
            Err(e) => Some(Verdict::Fail(format!("health check {}: {e}", next.name()))),
        }
    }

    fn spawn(&self, check: &Check) -> Result<(Watched, PathBuf)> {
        let name = check.name().replace(['/', ' '], "_");
        let log = self.log_dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = match check {
            Check::Exec(p) => Command::new(p),
            Check::Unit(u) => {
                let mut c = Command::new("systemctl");
                c.args(["is-active", "--", u]);
                c
            }
        };
        crate::notify::scrub(&mut cmd);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let child =
            Watched::spawn(&mut cmd).with_context(|| format!("starting {}", check.name()))?;
        Ok((child, log))
    }
}

impl Drop for HealthRun {
    fn drop(&mut self) {
        if let Some((_, child, _, _)) = self.current.as_mut() {
            child.kill();
        }
    }
}

/// The last `max` bytes of a log file, on one line.
fn tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("updraft-health-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("checks")).unwrap();
        d
    }

    fn script(d: &Path, name: &str, body: &str) {
        let p = d.join("checks").join(name);
        crate::test_support::write_executable(&p, &format!("#!/bin/sh\n{body}\n"));
    }

    fn run(d: &Path, timeout: u64) -> Verdict {
        let cfg = Health {
            checks_dir: d.join("checks"),
            required_units: vec![],
            timeout: Dur(Duration::from_secs(timeout)),
            check_timeout: Dur(Duration::from_secs(timeout)),
            check_server: false,
        };
        let mut r = HealthRun::start(&cfg, d, vec![("UPDRAFT_SLOT".into(), "B".into())]).unwrap();
        loop {
            if let Some(v) = r.poll() {
                return v;
            }
            let max = r.until_limit().min(Duration::from_secs(1));
            crate::progress::wait_readable(r.wait_fd().as_slice(), max);
        }
    }

    #[test]
    fn all_pass() {
        let d = dir("pass");
        script(&d, "10-ok", "test \"$UPDRAFT_SLOT\" = B");
        script(&d, "20-ok", "exit 0");
        std::fs::write(d.join("checks/README"), "not executable").unwrap();
        assert_eq!(run(&d, 30), Verdict::Pass);
    }

    #[test]
    fn failure_quotes_the_output() {
        let d = dir("fail");
        script(&d, "10-ok", "exit 0");
        script(&d, "20-db", "echo database unreachable >&2; exit 3");
        match run(&d, 30) {
            Verdict::Fail(why) => {
                assert!(why.contains("20-db"), "{why}");
                assert!(why.contains("database unreachable"), "{why}");
            }
            v => panic!("{v:?}"),
        }
    }

    /// A run polled only after its deadline, its one check long finished
    /// with success, passes: the clock never overrules a pass.
    #[test]
    fn a_run_whose_checks_passed_passes_whatever_the_clock_says() {
        let d = dir("late");
        script(&d, "10-ok", "exit 0");
        let cfg = Health {
            checks_dir: d.join("checks"),
            required_units: vec![],
            timeout: Dur(Duration::from_millis(300)),
            check_timeout: Dur(Duration::from_millis(300)),
            check_server: false,
        };
        let mut r = HealthRun::start(&cfg, &d, vec![]).unwrap();
        assert_eq!(r.poll(), None, "the check starts");
        // The check exits at once; the next poll comes well after the
        // deadline (a daemon kept busy).
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(r.poll(), Some(Verdict::Pass));
    }

    #[test]
    fn hanging_check_is_killed() {
        let d = dir("hang");
        script(&d, "10-hang", "sleep 600");
        match run(&d, 1) {
            Verdict::Fail(why) => assert!(why.contains("did not finish"), "{why}"),
            v => panic!("{v:?}"),
        }
    }
}
