//! Following a job the daemon took over: a client's side of `install`
//! and `check --wait`.
//!
//! The daemon runs the job; this module only polls its status over the
//! control socket, prints the progress on stderr, and asks
//! [`exit::settled`] whether the job has an outcome. It must never act
//! on the device: a client that goes away (Ctrl-C, a lost terminal)
//! leaves the job running in the daemon.

use std::time::Duration;

use super::exit::{self, Outcome};
use crate::bail;
use crate::control;
use crate::error::Result;
use crate::progress::progress_line;

/// What the daemon's answer to a check or an install says, before any job
/// is followed: whether one started (or was running already), or how the
/// check ended.
pub(super) fn answered(reply: &control::Reply) -> Option<Outcome> {
    match reply.outcome.as_deref() {
        Some("started" | "busy") => None,
        Some("held") => Some(Outcome::Held),
        // Components installed and committed within the check.
        Some("applied") => Some(Outcome::Done),
        Some(_) => Some(Outcome::NothingToDo),
        // A daemon that names no outcome: `started` alone.
        None if reply.started == Some(true) => None,
        None => Some(Outcome::NothingToDo),
    }
}

/// The daemon's status, for a client following a job.
fn daemon_status(path: &std::path::Path) -> Result<crate::status::Status> {
    let Some(r) = control::try_request(path, &control::Request::Status)? else {
        bail!(Io, "the daemon went away during the install");
    };
    match r.status {
        Some(st) => Ok(st),
        None => bail!(Io, "the daemon sent no status"),
    }
}

/// Print a job's progress line when it changed.
fn show_progress(st: &crate::status::Status, last: &mut String) {
    if let Some(p) = &st.progress {
        let line = progress_line(p);
        if line != *last {
            eprintln!("{line}");
            *last = line;
        }
    }
}

/// `--wait`: follow the daemon's job until [`exit::settled`] finds its
/// outcome.
pub(super) fn follow_to_outcome(path: &std::path::Path) -> Result<Outcome> {
    follow(path, exit::settled)
}

/// Follow the daemon's job, showing its progress, until `until` (given
/// the job's release once seen, and the status) says it has ended.
fn follow(
    path: &std::path::Path,
    until: fn(Option<&str>, &crate::status::Status) -> exit::Progress,
) -> Result<Outcome> {
    let mut release: Option<String> = None;
    let mut last = String::new();
    loop {
        let st = daemon_status(path)?;
        if let Some(j) = &st.job {
            release.get_or_insert_with(|| j.version.clone());
        }
        show_progress(&st, &mut last);
        match until(release.as_deref(), &st) {
            exit::Progress::Running => {}
            exit::Progress::Ended(outcome, text) => {
                println!("{text}");
                return Ok(outcome);
            }
            exit::Progress::Failed(why) => bail!(Io, "{why}"),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// After the daemon accepted an install, show its progress until the job
/// leaves the download and install states (with `wait`, until its
/// outcome).
pub(super) fn follow_install(
    path: &std::path::Path,
    reply: control::Reply,
    wait: bool,
) -> Result<Outcome> {
    if let Some(outcome) = answered(&reply) {
        let message = reply.message.unwrap_or_default();
        match outcome {
            Outcome::Done => println!("{message}"),
            _ => println!("no change: {message}"),
        }
        return Ok(outcome);
    }
    eprintln!("{}", reply.message.unwrap_or_default());
    if wait {
        follow_to_outcome(path)
    } else {
        follow(path, exit::written)
    }
}
