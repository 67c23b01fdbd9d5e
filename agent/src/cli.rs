//! The `updraft` command line: argument parsing and the commands that run
//! in the calling process.
//!
//! One binary is both the daemon and its client. Read-only commands
//! (`status`, `history`) ask the running daemon over the control socket and
//! fall back to reading the database directly when no daemon runs; changing
//! commands (`check`, `install`, `mark-good`, `mark-bad`) are handed to the
//! daemon when it runs, and otherwise take the state lock and act directly.
//! Exit status: 0 success, 1 failure (stderr says why), 2 usage.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::config::{self, Config};
use crate::control;
use crate::error::{Kind, Result};
use crate::lock::StateLock;
use crate::machine::{CheckOutcome, Machine, Mode, Next};
use crate::progress::{NoTick, Progress, Ticker, mib, progress_line};
use crate::slot::{self, SlotName};
use crate::source::Origin;
use crate::state::{Method, State};
use crate::status::{SlotStatus, Status};
use crate::store::Store;
use crate::{bail, err};

pub const USAGE: &str = "usage: updraft [--config FILE] <command>

commands:
  daemon                    run the update agent (normally started by systemd)
  status [--json]           state, slots, progress and last error
  check                     poll the update server now
  install MANIFEST          install from a manifest URL or a local manifest.json
  mark-good                 commit the release under test (or re-mark the booted slot good)
  mark-bad                  reject the release under test and roll back
  history [--json]          past installs and state changes

options:
  --config FILE             configuration (default /etc/updraft/updraft.toml)
  --version                 print the version";

/// A parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    pub config: PathBuf,
    pub command: Command,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Daemon,
    Status { json: bool },
    Check,
    Install { manifest: String },
    MarkGood,
    MarkBad,
    History { json: bool },
    Version,
    Help,
}

/// Parse arguments (without the program name). `Err` is a usage error.
pub fn parse(args: &[String]) -> std::result::Result<Args, String> {
    let mut config = PathBuf::from(config::DEFAULT_PATH);
    let mut rest: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" | "-c" => {
                config = PathBuf::from(it.next().ok_or("--config needs a file")?);
            }
            s if s.starts_with("--config=") => config = PathBuf::from(&s["--config=".len()..]),
            "--version" | "-V" => {
                return Ok(Args {
                    config,
                    command: Command::Version,
                });
            }
            "--help" | "-h" | "help" => {
                return Ok(Args {
                    config,
                    command: Command::Help,
                });
            }
            s => rest.push(s),
        }
    }
    let (cmd, opts) = rest.split_first().ok_or("no command given")?;
    let json = |opts: &[&str]| -> std::result::Result<bool, String> {
        match opts {
            [] => Ok(false),
            ["--json"] => Ok(true),
            other => Err(format!("unexpected arguments {other:?}")),
        }
    };
    let none = |opts: &[&str]| -> std::result::Result<(), String> {
        if opts.is_empty() {
            Ok(())
        } else {
            Err(format!("unexpected arguments {opts:?}"))
        }
    };
    let command = match *cmd {
        "daemon" => none(opts).map(|_| Command::Daemon)?,
        "status" => Command::Status { json: json(opts)? },
        "history" => Command::History { json: json(opts)? },
        "check" => none(opts).map(|_| Command::Check)?,
        "mark-good" => none(opts).map(|_| Command::MarkGood)?,
        "mark-bad" => none(opts).map(|_| Command::MarkBad)?,
        "install" => match opts {
            [m] => Command::Install {
                manifest: (*m).to_string(),
            },
            _ => return Err("install takes one manifest URL or path".into()),
        },
        other => return Err(format!("unknown command {other:?}")),
    };
    Ok(Args { config, command })
}

/// Run a parsed command; returns the exit status.
pub fn run(args: Args) -> i32 {
    let result = match args.command {
        Command::Version => {
            println!("updraft {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Command::Help => {
            println!("{USAGE}");
            return 0;
        }
        Command::Daemon => Config::load(&args.config).and_then(crate::daemon::run),
        Command::Status { json } => Config::load(&args.config).and_then(|c| status(&c, json)),
        Command::History { json } => Config::load(&args.config).and_then(|c| history(&c, json)),
        Command::Check => Config::load(&args.config).and_then(|c| check(&c)),
        Command::Install { manifest } => {
            Config::load(&args.config).and_then(|c| install(c, &manifest))
        }
        Command::MarkGood => Config::load(&args.config).and_then(|c| mark(c, true)),
        Command::MarkBad => Config::load(&args.config).and_then(|c| mark(c, false)),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("updraft: {e}");
            if e.kind() == Kind::Usage { 2 } else { 1 }
        }
    }
}

// ---- install ------------------------------------------------------------------

/// Progress on stderr for interactive and scripted use.
struct CliTicker {
    last: Instant,
    tty: bool,
    shown: bool,
}

impl CliTicker {
    fn new() -> CliTicker {
        CliTicker {
            last: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    fn done(&mut self) {
        if self.tty && self.shown {
            eprintln!();
            self.shown = false;
        }
    }
}

impl Ticker for CliTicker {
    fn tick(&mut self, p: &Progress) -> Result<()> {
        let every = if self.tty {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(5)
        };
        if self.last.elapsed() < every || p.total == 0 {
            return Ok(());
        }
        self.last = Instant::now();
        let line = progress_line(p);
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{line}");
            self.shown = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
        Ok(())
    }
}

/// After the daemon accepted an install, show its progress until the job
/// leaves the download and install states.
fn follow_install(path: &std::path::Path, reply: control::Reply) -> Result<()> {
    if reply.started != Some(true) {
        println!("no change: {}", reply.message.unwrap_or_default());
        return Ok(());
    }
    eprintln!("{}", reply.message.unwrap_or_default());
    let mut last = String::new();
    loop {
        let Some(r) = control::try_request(path, &control::Request::Status)? else {
            bail!(Io, "the daemon went away during the install");
        };
        let Some(st) = r.status else {
            bail!(Io, "the daemon sent no status");
        };
        match st.state.as_str() {
            "checking" | "downloading" | "installing" => {
                if let Some(p) = &st.progress {
                    let line = progress_line(p);
                    if line != last {
                        eprintln!("{line}");
                        last = line;
                    }
                }
            }
            "failed" | "idle" => {
                bail!(
                    Io,
                    "install failed: {}",
                    st.last_error
                        .unwrap_or_else(|| "see updraft history".into())
                );
            }
            other => {
                let job = st
                    .job
                    .map(|j| format!("release {} in slot {}", j.version, j.target));
                println!(
                    "installed {} (daemon state: {other})",
                    job.unwrap_or_default()
                );
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn install(cfg: Config, manifest: &str) -> Result<()> {
    // A local manifest is named by its absolute path: the daemon (or a
    // resumed job) does not share this process's working directory.
    let absolute;
    let manifest = if manifest.contains("://") {
        manifest
    } else {
        absolute = std::fs::canonicalize(manifest)
            .map_err(|e| err!(Io, "manifest {manifest}: {e}"))?
            .display()
            .to_string();
        absolute.as_str()
    };
    if let Some(reply) = control::try_request(
        &cfg.system.socket,
        &control::Request::Install {
            manifest: manifest.to_string(),
        },
    )? {
        return follow_install(&cfg.system.socket, reply);
    }
    let _lock = StateLock::acquire(&cfg.lock_path())?;
    let mirrors = if manifest == cfg.server.manifest_url {
        cfg.server.mirrors.clone()
    } else {
        Vec::new()
    };
    let origin = Origin::parse(manifest, &mirrors);
    let mut m = Machine::open(cfg, Mode::Oneshot)?;
    m.on_boot()?;
    let mut t = CliTicker::new();
    let outcome = m.check(Some(origin), true, &mut t);
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            t.done();
            return Err(e);
        }
    };
    match outcome {
        CheckOutcome::NoChange(why) => {
            println!("no change: {why}");
            Ok(())
        }
        CheckOutcome::Started {
            version,
            target,
            delta,
        } => {
            eprintln!(
                "installing release {version} into slot {target} ({})",
                if delta { "delta" } else { "full image" }
            );
            loop {
                match m.step(&mut t) {
                    Ok(Next::Continue) => continue,
                    Ok(Next::Done) | Ok(Next::WaitReboot) | Ok(Next::Idle) => break,
                    Ok(Next::Retry(_)) => continue,
                    Err(e) => {
                        t.done();
                        // Leave the machine idle, with the failure in history.
                        if matches!(m.state(), Ok(State::Failed { .. })) {
                            let _ = m.step(&mut NoTick);
                        }
                        return Err(e);
                    }
                }
            }
            t.done();
            let tries = m.cfg.bootloader.tries;
            println!(
                "installed release {version} into slot {target}; it boots next for a trial ({tries} {}); reboot to try it",
                if tries == 1 { "try" } else { "tries" }
            );
            Ok(())
        }
    }
}

// ---- check, mark-good, mark-bad ----------------------------------------------

fn check(cfg: &Config) -> Result<()> {
    match control::try_request(&cfg.system.socket, &control::Request::Check)? {
        Some(reply) => {
            println!(
                "{}",
                reply.message.unwrap_or_else(|| "check requested".into())
            );
            Ok(())
        }
        None => bail!(
            Busy,
            "the daemon is not running (no socket at {}); use `updraft install {}` for a one-shot install",
            cfg.system.socket.display(),
            if cfg.server.manifest_url.is_empty() {
                "MANIFEST"
            } else {
                &cfg.server.manifest_url
            }
        ),
    }
}

fn mark(cfg: Config, good: bool) -> Result<()> {
    let req = if good {
        control::Request::MarkGood
    } else {
        control::Request::MarkBad
    };
    if let Some(reply) = control::try_request(&cfg.system.socket, &req)? {
        println!("{}", reply.message.unwrap_or_default());
        return Ok(());
    }
    let _lock = StateLock::acquire(&cfg.lock_path())?;
    let mut m = Machine::open(cfg, Mode::Oneshot)?;
    m.on_boot()?;
    let msg = if good {
        m.mark_good(&mut NoTick)?
    } else {
        m.mark_bad(&mut NoTick)?
    };
    // Settle follow-up states (committed → idle; rollback marks the slots).
    while let Next::Continue = m.step(&mut NoTick)? {}
    println!("{msg}");
    Ok(())
}

// ---- status and history ----------------------------------------------------------

fn status(cfg: &Config, json: bool) -> Result<()> {
    let st = match control::try_request(&cfg.system.socket, &control::Request::Status)? {
        Some(reply) => reply
            .status
            .ok_or_else(|| err!(Io, "the daemon sent no status"))?,
        None => offline_status(cfg)?,
    };
    if json {
        let text =
            serde_json::to_string_pretty(&st).map_err(|e| err!(Io, "encoding status: {e}"))?;
        println!("{text}");
    } else {
        print!("{}", render_status(&st));
    }
    Ok(())
}

/// Status from the database and bootloader, without a daemon.
fn offline_status(cfg: &Config) -> Result<Status> {
    let store = Store::open_for_reading(&cfg.db_path())?;
    let (state, since) = store.state()?;
    let booted = slot::booted_slot(&cfg.slots.cmdline)?;
    let (boot, boot_err) = match crate::bootloader::from_config(cfg).and_then(|mut b| b.read()) {
        Ok(b) => (Some(b), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut slots = Vec::new();
    for s in [SlotName::A, SlotName::B] {
        let rec = store.slot_record(s)?;
        let b = boot.as_ref().map(|b| b.slot(s));
        slots.push(SlotStatus {
            slot: s,
            path: match s {
                SlotName::A => cfg.slots.a.display().to_string(),
                SlotName::B => cfg.slots.b.display().to_string(),
            },
            version: rec.as_ref().map(|r| r.version.clone()),
            sha256: rec.as_ref().map(|r| r.sha256),
            booted: s == booted,
            bootable: b.map(|b| b.bootable),
            tries_left: b.map(|b| b.tries_left),
        });
    }
    let device_id = std::fs::read_to_string(&cfg.device.id_file)
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let keys_version = match store.key_document()? {
        Some(raw) => crate::trust::Trust::new(cfg.trust_anchor()?, Some(&raw))
            .map(|t| t.version())
            .unwrap_or(0),
        None => cfg.trust.keys_version,
    };
    let last_error = match &state {
        State::Failed { reason, .. } => Some(reason.clone()),
        _ => store.get("last_check_error")?.filter(|e| !e.is_empty()),
    };
    Ok(Status {
        state: state.name().into(),
        since,
        device_id,
        booted_slot: booted,
        running_version: slots
            .iter()
            .find(|s| s.booted)
            .and_then(|s| s.version.clone()),
        slots,
        next_boot: boot.as_ref().and_then(|b| b.next_boot()),
        bootloader_error: boot_err,
        job: state.job().cloned(),
        progress: None,
        serial: store.serial()?,
        keys_version,
        last_check: None,
        next_check: None,
        last_error,
        outbox: store.outbox_len()?,
    })
}

/// Human-readable status.
pub fn render_status(st: &Status) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<13}{v}\n"));
    line("state:", format!("{} (since {})", st.state, st.since));
    line(
        "booted slot:",
        format!(
            "{} ({})",
            st.booted_slot,
            st.running_version
                .as_deref()
                .map(|v| format!("release {v}"))
                .unwrap_or_else(|| "release unknown".into())
        ),
    );
    for s in &st.slots {
        let mut v = format!(
            "{}  {}",
            s.version.as_deref().unwrap_or("(no verified image)"),
            s.path
        );
        match (s.bootable, s.tries_left) {
            (Some(true), Some(t)) => v.push_str(&format!("  bootable, {t} tries left")),
            (Some(false), _) => v.push_str("  not bootable"),
            _ => {}
        }
        if st.next_boot == Some(s.slot) {
            v.push_str("  <- next boot");
        }
        line(&format!("slot {}:", s.slot), v);
    }
    if let Some(e) = &st.bootloader_error {
        line("bootloader:", format!("ERROR {e}"));
    }
    if let Some(j) = &st.job {
        let how = match &j.method {
            Method::Full => "full image".to_string(),
            Method::Delta { size, .. } => format!("delta {}", mib(*size)),
        };
        line(
            "job:",
            format!("release {} -> slot {} ({how})", j.version, j.target),
        );
        if let Some(r) = &j.reason {
            line("reason:", r.clone());
        }
    }
    if let Some(p) = &st.progress {
        line("progress:", progress_line(p));
    }
    if let Some(t) = st.last_check {
        line("last check:", t.to_string());
    }
    if let Some(t) = st.next_check {
        line("next check:", t.to_string());
    }
    if let Some(e) = &st.last_error {
        line("last error:", e.clone());
    }
    line(
        "trust:",
        format!(
            "manifest serial {}, key document v{}",
            st.serial
                .map(|s| s.to_string())
                .unwrap_or_else(|| "none".into()),
            st.keys_version
        ),
    );
    line("device id:", st.device_id.clone());
    line("outbox:", format!("{} report(s) queued", st.outbox));
    out
}

fn history(cfg: &Config, json: bool) -> Result<()> {
    let store = Store::open_for_reading(&cfg.db_path())?;
    let entries = store.history(200)?;
    if json {
        let text = serde_json::to_string_pretty(&entries)
            .map_err(|e| err!(Io, "encoding history: {e}"))?;
        println!("{text}");
        return Ok(());
    }
    for e in entries {
        println!(
            "{}  {:<18} {:<10} {:<2} {}",
            e.time,
            e.event,
            e.release.as_deref().unwrap_or("-"),
            e.slot.as_deref().unwrap_or("-"),
            e.detail.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> std::result::Result<Args, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn parses_the_contract() {
        assert_eq!(
            p(&["status"]).unwrap().command,
            Command::Status { json: false }
        );
        assert_eq!(
            p(&["--config", "/x.toml", "status", "--json"])
                .unwrap()
                .config,
            PathBuf::from("/x.toml")
        );
        assert_eq!(
            p(&["install", "https://h/m.json"]).unwrap().command,
            Command::Install {
                manifest: "https://h/m.json".into()
            }
        );
        assert_eq!(
            p(&["history", "--json"]).unwrap().command,
            Command::History { json: true }
        );
        assert!(p(&[]).is_err());
        assert!(p(&["install"]).is_err());
        assert!(p(&["status", "--yaml"]).is_err());
        assert!(p(&["frobnicate"]).is_err());
        assert!(p(&["--config"]).is_err());
    }
}
