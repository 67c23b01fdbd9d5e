//! The `updraft` command line: argument parsing and the commands that run
//! in the calling process.
//!
//! One binary is both the daemon and its client. Read-only commands
//! (`status`, `history`) ask the running daemon over the control socket and
//! fall back to reading the database directly when no daemon runs; changing
//! commands (`check`, `install`, `mark-good`, `mark-bad`) are handed to the
//! daemon when it runs, and otherwise take the state lock and act directly.
//! Exit statuses are [`exit`]'s: 0 success, 1 failure (stderr says why),
//! 2 usage, 3 degraded, and with `--wait` 4 nothing to do, 5 a reboot
//! finishes it, 6 held by the policy.
//!
//! Every command's usage, options and examples are in one table,
//! [`PROGRAM`]: the parser accepts exactly the options listed there, and
//! `--help`, `help COMMAND` and `completions bash` print from it (the
//! formatting is [`crate::help`]'s).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::config::{self, Config};
use crate::control;
use crate::error::Result;
use crate::help::{self, Opt, Program};
use crate::lock::StateLock;
use crate::machine::{CheckOutcome, Machine, Mode, Next};
use crate::progress::{NoTick, Progress, Ticker, progress_line};
use crate::source::Origin;
use crate::state::State;
use crate::store::Store;
use crate::{bail, err};

mod exit;
mod follow;
mod view;
use exit::Outcome;
use follow::{answered, follow_install, follow_to_outcome};
use view::{history, status};

/// `--config FILE`, accepted anywhere on the line.
const CONFIG: Opt = Opt {
    name: "--config",
    short: "-c",
    value: "FILE",
    help: "configuration file (default /etc/updraft/updraft.toml)",
};

const DEFAULT: Opt = Opt {
    name: "--default",
    short: "",
    value: "",
    help: "follow the channel of the configuration again",
};

const FROM: Opt = Opt {
    name: "--from",
    short: "",
    value: "UPDATER",
    help: "the updater the device runs now: rauc or mender",
};

const ROOT: Opt = Opt {
    name: "--root",
    short: "",
    value: "DIR",
    help: "look for the other updater's files under DIR (default /)",
};

const RELEASE: Opt = Opt {
    name: "--release",
    short: "",
    value: "VERSION",
    help: "the running release, when the other updater does not name it",
};

const STATE_DIR: Opt = Opt {
    name: "--state-dir",
    short: "",
    value: "DIR",
    help: "updraft's state directory, on a partition both slots share",
};

const DRY_RUN: Opt = Opt {
    name: "--dry-run",
    short: "",
    value: "",
    help: "print what would be written; write nothing",
};

const WAIT: Opt = Opt {
    name: "--wait",
    short: "",
    value: "",
    help: "wait for the outcome and tell it by the exit status (docs/cli.md)",
};

const JSON: Opt = Opt {
    name: "--json",
    short: "",
    value: "",
    help: "print JSON instead of text (fields: docs/cli.md)",
};

/// Every command: usage, options, examples. The parser accepts exactly the
/// options listed here.
pub const PROGRAM: Program = Program {
    name: "updraft",
    version: env!("CARGO_PKG_VERSION"),
    summary: "over-the-air A/B updates for this device",
    usage: "updraft [--config FILE] COMMAND [OPTIONS]",
    common: &[CONFIG],
    commands: &[
        help::Command {
            name: "daemon",
            summary: "run the update agent (normally started by systemd)",
            usage: "updraft [--config FILE] daemon",
            about: "Polls the update server, installs, reboots, runs the health checks and\n\
                    commits or rolls back, until SIGTERM. Log level: UPDRAFT_LOG=debug.",
            options: &[],
            words: &[],
            examples: &["UPDRAFT_LOG=debug updraft --config /etc/updraft/updraft.toml daemon"],
        },
        help::Command {
            name: "status",
            summary: "the state, the slots, the last install and a job's progress",
            usage: "updraft [--config FILE] status [--json]",
            about: "Asks the daemon; without one, reads the database and the bootloader.",
            options: &[JSON],
            words: &[],
            examples: &["updraft status", "updraft status --json | jq .last_install"],
        },
        help::Command {
            name: "check",
            summary: "ask the daemon to poll the update server now",
            usage: "updraft [--config FILE] check [--wait]",
            about: "Prints what the check found; fails when no daemon runs (use install).\n\
                    --wait: follow an update the check starts (or finds running) to its\n\
                    outcome; exit status 0 done, 4 nothing to do, 5 a reboot finishes it,\n\
                    6 held by the policy, 1 failed or rolled back.",
            options: &[WAIT],
            words: &[],
            examples: &["updraft check", "updraft check --wait; echo $?"],
        },
        help::Command {
            name: "install",
            summary: "install from a manifest or a release bundle, local or over HTTPS",
            usage: "updraft [--config FILE] install [--wait] MANIFEST_URL_OR_PATH",
            about: "MANIFEST_URL_OR_PATH: a manifest URL or manifest.json; a bundle (a path or\n\
                    an https URL ending in .updraft, or bundle+URL for any bundle URL).\n\
                    Hands the job to the daemon and follows it; without a daemon, installs\n\
                    in this process and stops before the reboot. Ignores the staged\n\
                    rollout and installs a release that was rolled back before.\n\
                    --wait: follow the job to its outcome and tell it by the exit status,\n\
                    as check --wait does.",
            options: &[WAIT],
            words: &[],
            examples: &[
                "updraft install /media/usb/site/manifest.json",
                "updraft install https://updates.example.com/stable/manifest.json",
                "updraft install /media/usb/release-1.1.updraft",
                "updraft install https://updates.example.com/releases/release-1.1.updraft",
                "updraft install --wait /media/usb/release-1.1.updraft || echo \"status $?\"",
            ],
        },
        help::Command {
            name: "mark-good",
            summary: "commit the release under test, or mark the booted slot good again",
            usage: "updraft [--config FILE] mark-good",
            about: "",
            options: &[],
            words: &[],
            examples: &["updraft mark-good"],
        },
        help::Command {
            name: "mark-bad",
            summary: "reject the release under test and roll back, or cancel its trial boot",
            usage: "updraft [--config FILE] mark-bad",
            about: "",
            options: &[],
            words: &[],
            examples: &["updraft mark-bad"],
        },
        help::Command {
            name: "apply",
            summary: "switch in and reboot into a release the policy holds",
            usage: "updraft [--config FILE] apply",
            about: "A release written and verified waits for its maintenance window, or\n\
                    for this command with policy.switch or policy.reboot = \"manual\".\n\
                    apply lets it through now, window or not: the slot is hashed again,\n\
                    switched in for a trial boot, and the daemon reboots into it. Without\n\
                    a daemon it switches the slot in and stops before the reboot.",
            options: &[],
            words: &[],
            examples: &["updraft apply"],
        },
        help::Command {
            name: "cancel",
            summary: "stop the update in progress before its reboot",
            usage: "updraft [--config FILE] cancel",
            about: "A download or install stops at its next frame (a delta at its next\n\
                    output block); the slot it was writing stays out of the boot order and\n\
                    the running slot is untouched. A written slot waiting for its window or\n\
                    for `updraft apply` is dropped. A slot switched in but not yet booted\n\
                    is switched back, without a reboot. The job ends as cancelled, and the\n\
                    release is installed again only when a manifest names another image or\n\
                    by `updraft install`. After the trial boot, cancel is mark-bad.",
            options: &[],
            words: &[],
            examples: &["updraft cancel"],
        },
        help::Command {
            name: "channel",
            summary: "show or change the release channel this device follows",
            usage: "updraft [--config FILE] channel [NAME | --default]",
            about: "Without NAME, prints the channel followed and who chose it. With NAME\n\
                    (root), follows that channel from now on; the choice is kept in\n\
                    state_dir, so a new image does not undo it. server.manifest_url must\n\
                    contain {channel} for a channel other than the configured one.\n\
                    --default follows the configuration's channel again.",
            options: &[DEFAULT],
            words: &[],
            examples: &[
                "updraft channel",
                "updraft channel beta",
                "updraft channel --default",
            ],
        },
        help::Command {
            name: "adopt",
            summary: "take over a device RAUC or Mender has been updating",
            usage: "updraft [--config FILE] adopt --from rauc|mender [--root DIR] [--release VERSION] [--state-dir DIR] [--dry-run]",
            about: "Reads what the other updater knows (RAUC: system.conf and its status\n\
                    file; Mender: mender.conf, device_type, artifact_info) and merges the\n\
                    slots, the bootloader with that updater's boot flow, the compatible and\n\
                    the state directory into the configuration (its [server] and [trust]\n\
                    kept: put the fleet's there first). The running release becomes the\n\
                    release marker. Checks that the booted slot boots next; downloads,\n\
                    reboots and writes no slot or bootloader variable. Prints what it found\n\
                    and wrote. Stop the other updater's service first (docs/integration.md).",
            options: &[FROM, ROOT, RELEASE, STATE_DIR, DRY_RUN],
            words: &[],
            examples: &[
                "updraft adopt --from rauc --dry-run",
                "updraft adopt --from mender --release release-42",
            ],
        },
        help::Command {
            name: "history",
            summary: "past installs and state changes, oldest first",
            usage: "updraft [--config FILE] history [--json]",
            about: "The newest 200 entries: time, event, release, slot, detail.",
            options: &[JSON],
            words: &[],
            examples: &["updraft history", "updraft history --json | jq '.[-1]'"],
        },
        help::Command {
            name: "help",
            summary: "describe a command",
            usage: "updraft help [COMMAND]",
            about: "",
            options: &[],
            words: &[],
            examples: &["updraft help install"],
        },
        help::Command {
            name: "completions",
            summary: "print the bash completion script",
            usage: "updraft completions bash",
            about: "",
            options: &[],
            words: &["bash"],
            examples: &[
                "updraft completions bash > /usr/share/bash-completion/completions/updraft",
            ],
        },
    ],
    examples: &[
        "updraft status",
        "updraft install /media/usb/site/manifest.json",
    ],
};

/// A parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    pub config: PathBuf,
    pub command: Command,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Daemon,
    Status {
        json: bool,
    },
    Check {
        wait: bool,
    },
    Install {
        manifest: String,
        wait: bool,
    },
    MarkGood,
    MarkBad,
    Apply,
    Cancel,
    /// Show the channel (`None`), or follow another: `Some(None)` is the
    /// configuration's.
    Channel(Option<Option<String>>),
    History {
        json: bool,
    },
    Adopt(crate::adopt::Options),
    Version,
    /// The overview, or one command's help.
    Help(Option<&'static str>),
    /// The bash completion script.
    Completions,
}

/// A usage error (exit status 2), with the command it concerns.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError {
    pub message: String,
    pub command: Option<&'static str>,
}

impl UsageError {
    fn new(command: Option<&'static str>, message: impl Into<String>) -> UsageError {
        UsageError {
            message: message.into(),
            command,
        }
    }

    /// What goes to stderr: the message, the synopsis, where to read more.
    pub fn text(&self) -> String {
        let c = self.command.and_then(|c| PROGRAM.command(c));
        format!("updraft: {}\n{}", self.message, PROGRAM.usage_hint(c))
    }
}

/// Parse arguments (without the program name).
pub fn parse(args: &[String]) -> std::result::Result<Args, UsageError> {
    let mut config = PathBuf::from(config::DEFAULT_PATH);
    let mut rest: Vec<&str> = Vec::new();
    let (mut help, mut version) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            s if CONFIG.is(s) => {
                let file = it
                    .next()
                    .ok_or_else(|| UsageError::new(None, "--config needs a file"))?;
                config = PathBuf::from(file);
            }
            s if s.starts_with("--config=") => config = PathBuf::from(&s["--config=".len()..]),
            s if help::VERSION.is(s) => version = true,
            s if help::is_help(s) => help = true,
            s => rest.push(s),
        }
    }
    let find = |name: &str| {
        PROGRAM
            .command(name)
            .ok_or_else(|| UsageError::new(None, format!("unknown command {name:?}")))
    };
    let args = |command| {
        Ok(Args {
            config: config.clone(),
            command,
        })
    };
    if help {
        return match rest.first() {
            None => args(Command::Help(None)),
            Some(name) => args(Command::Help(Some(find(name)?.name))),
        };
    }
    if version {
        return args(Command::Version);
    }
    let (name, opts) = rest
        .split_first()
        .ok_or_else(|| UsageError::new(None, "no command given"))?;
    let c = find(name)?;
    let usage = |m: String| UsageError::new(Some(c.name), m);
    // An option is a switch, or takes the next word (or `--name=VALUE`)
    // when it has a value; anything else is an argument.
    let mut switches = Vec::new();
    let mut values: Vec<(&str, String)> = Vec::new();
    let mut words = Vec::new();
    let mut it = opts.iter();
    while let Some(o) = it.next() {
        if o.starts_with('-') && *o != "-" {
            let (flag, inline) = match o.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (*o, None),
            };
            let opt = c
                .options
                .iter()
                .find(|x| x.is(flag))
                .ok_or_else(|| usage(format!("unknown option {flag} for {}", c.name)))?;
            match (opt.value.is_empty(), inline) {
                (true, None) => switches.push(opt.name),
                (true, Some(_)) => return Err(usage(format!("{} takes no value", opt.name))),
                (false, Some(v)) => values.push((opt.name, v.to_string())),
                (false, None) => {
                    let v = it
                        .next()
                        .ok_or_else(|| usage(format!("{} needs {}", opt.name, opt.value)))?;
                    values.push((opt.name, (*v).to_string()));
                }
            }
        } else {
            words.push(*o);
        }
    }
    let value = |opt: &Opt| -> std::result::Result<Option<String>, UsageError> {
        let mut given = values.iter().filter(|(n, _)| *n == opt.name);
        let first = given.next().map(|(_, v)| v.clone());
        if given.next().is_some() {
            return Err(usage(format!("{} given twice", opt.name)));
        }
        Ok(first)
    };
    let json = switches.contains(&JSON.name);
    let wait = switches.contains(&WAIT.name);
    let none = |cmd: Command| match words.first() {
        None => Ok(cmd),
        Some(w) => Err(usage(format!("{} takes no argument {w:?}", c.name))),
    };
    let command = match c.name {
        "daemon" => none(Command::Daemon)?,
        "status" => none(Command::Status { json })?,
        "history" => none(Command::History { json })?,
        "check" => none(Command::Check { wait })?,
        "mark-good" => none(Command::MarkGood)?,
        "mark-bad" => none(Command::MarkBad)?,
        "apply" => none(Command::Apply)?,
        "cancel" => none(Command::Cancel)?,
        "channel" => match (words.as_slice(), switches.contains(&DEFAULT.name)) {
            ([], false) => Command::Channel(None),
            ([], true) => Command::Channel(Some(None)),
            ([name], false) => {
                crate::manifest::check_channel_name(name).map_err(usage)?;
                Command::Channel(Some(Some((*name).to_string())))
            }
            _ => return Err(usage("channel takes one channel name, or --default".into())),
        },
        "adopt" => {
            if let Some(w) = words.first() {
                return Err(usage(format!("adopt takes no argument {w:?}")));
            }
            let from = value(&FROM)?
                .ok_or_else(|| usage("adopt needs --from rauc or --from mender".into()))?;
            let from = crate::adopt::Updater::parse(&from).ok_or_else(|| {
                usage(format!(
                    "--from {from:?}: updraft adopts from rauc or mender"
                ))
            })?;
            Command::Adopt(crate::adopt::Options {
                from,
                root: PathBuf::from(value(&ROOT)?.unwrap_or_else(|| "/".into())),
                config: config.clone(),
                release: value(&RELEASE)?,
                state_dir: value(&STATE_DIR)?.map(PathBuf::from),
                dry_run: switches.contains(&DRY_RUN.name),
            })
        }
        "install" => match words.as_slice() {
            [m] => Command::Install {
                manifest: (*m).to_string(),
                wait,
            },
            _ => return Err(usage("install takes one manifest URL or path".into())),
        },
        "help" => match words.as_slice() {
            [] => Command::Help(None),
            [name] => Command::Help(Some(find(name).map_err(|e| usage(e.message))?.name)),
            _ => return Err(usage("help takes one command name".into())),
        },
        "completions" => match words.as_slice() {
            ["bash"] => Command::Completions,
            _ => return Err(usage("completions takes one shell name: bash".into())),
        },
        other => return Err(usage(format!("unknown command {other:?}"))),
    };
    args(command)
}

/// Run a parsed command; returns the exit status.
pub fn run(args: Args) -> i32 {
    // Before any thread exists (see crate::memory): an install, a check
    // and the daemon all move frames.
    crate::memory::tune_allocator();
    // With `--wait`, a success says which (exit::Outcome); else it is 0.
    let precise = matches!(
        args.command,
        Command::Check { wait: true } | Command::Install { wait: true, .. }
    );
    let done = |r: Result<()>| r.map(|()| Outcome::Done);
    let result = match args.command {
        Command::Version => {
            println!("updraft {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Command::Help(None) => {
            print!("{}", PROGRAM.overview());
            return 0;
        }
        Command::Help(Some(name)) => {
            match PROGRAM.command(name) {
                Some(c) => print!("{}", PROGRAM.help(c)),
                None => print!("{}", PROGRAM.overview()),
            }
            return 0;
        }
        Command::Completions => {
            print!("{}", PROGRAM.bash_completion());
            return 0;
        }
        Command::Daemon => done(crate::daemon::serve(&args.config)),
        Command::Adopt(opts) => done(crate::adopt::run(&opts)),
        Command::Status { json } => done(Config::load(&args.config).and_then(|c| status(&c, json))),
        Command::History { json } => {
            done(Config::load(&args.config).and_then(|c| history(&c, json)))
        }
        Command::Check { wait } => Config::load(&args.config).and_then(|c| check(&c, wait)),
        Command::Install { manifest, wait } => {
            Config::load(&args.config).and_then(|c| install(c, &manifest, wait))
        }
        Command::MarkGood => done(Config::load(&args.config).and_then(|c| mark(c, true))),
        Command::MarkBad => done(Config::load(&args.config).and_then(|c| mark(c, false))),
        Command::Apply => done(Config::load(&args.config).and_then(apply)),
        Command::Cancel => done(Config::load(&args.config).and_then(cancel)),
        Command::Channel(None) => done(Config::load(&args.config).and_then(|c| show_channel(&c))),
        Command::Channel(Some(to)) => {
            done(Config::load(&args.config).and_then(|c| choose_channel(c, to)))
        }
    };
    match result {
        Ok(outcome) => i32::from(outcome.code(precise)),
        Err(e) => {
            eprintln!("updraft: {e}");
            i32::from(exit::failure(e.kind()))
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

fn install(cfg: Config, manifest: &str, wait: bool) -> Result<Outcome> {
    // A local manifest or bundle is named by its absolute path: the daemon
    // (or a resumed job) does not share this process's working directory.
    let absolute;
    let given = Origin::parse(manifest, &[]);
    if let Some(problem) = given.problem() {
        bail!(Usage, "{problem}");
    }
    let manifest = if given.is_remote() {
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
        return follow_install(&cfg.system.socket, reply, wait);
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
    // A verified manifest raised a floor: the protected copy follows.
    m.protect();
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            t.done();
            return Err(e);
        }
    };
    match outcome {
        CheckOutcome::Held(why) => {
            println!("no change: {why}");
            Ok(Outcome::Held)
        }
        CheckOutcome::Applied(what) => {
            println!("{what}");
            Ok(Outcome::Done)
        }
        CheckOutcome::NoChange(why) | CheckOutcome::Running(why) | CheckOutcome::Declined(why) => {
            println!("no change: {why}");
            Ok(Outcome::NothingToDo)
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
                    Ok(Next::Done | Next::WaitReboot | Next::Idle | Next::Hold(_)) => break,
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
            m.protect();
            if let Ok(State::Installed(job)) = m.state() {
                if job.held.is_some() {
                    let (gate, key) = m.cfg.policy.switch_gate();
                    println!(
                        "installed release {version} into slot {target}; held by the policy ({key} = \"{}\"): the daemon switches it in {}",
                        gate.as_str(),
                        match gate {
                            crate::config::Gate::Manual => "at `updraft apply`",
                            _ => "the next maintenance window",
                        }
                    );
                    return Ok(Outcome::Held);
                }
            }
            let tries = m.trial_tries();
            println!(
                "installed release {version} into slot {target}; it boots next for a trial ({tries} {}); reboot to try it",
                if tries == 1 { "try" } else { "tries" }
            );
            Ok(Outcome::RebootNeeded)
        }
    }
}

// ---- channel ----------------------------------------------------------------

fn show_channel(cfg: &Config) -> Result<()> {
    let store = Store::open_for_reading(&cfg.db_path())?;
    let followed = crate::channel::Followed::resolve(&cfg.server, &store)?;
    let mut server = cfg.server.clone();
    server.follow(&followed.name)?;
    if followed.source == "operator" && followed.name != cfg.server.channel {
        println!(
            "channel {} (chosen by an operator; the configuration says {})",
            followed.name, cfg.server.channel
        );
    } else {
        println!("channel {} ({})", followed.name, followed.source);
    }
    if !server.manifest_url.is_empty() {
        println!("manifests from {}", server.manifest_url);
    }
    Ok(())
}

fn choose_channel(cfg: Config, to: Option<String>) -> Result<()> {
    let req = control::Request::Channel { name: to.clone() };
    if let Some(reply) = control::try_request(&cfg.system.socket, &req)? {
        println!("{}", reply.message.unwrap_or_default());
        return Ok(());
    }
    let _lock = StateLock::acquire(&cfg.lock_path())?;
    let mut m = Machine::open(cfg, Mode::Oneshot)?;
    println!("{}", m.choose_channel(to.as_deref())?);
    Ok(())
}

// ---- check, mark-good, mark-bad ----------------------------------------------

fn check(cfg: &Config, wait: bool) -> Result<Outcome> {
    match control::try_request(&cfg.system.socket, &control::Request::Check)? {
        Some(reply) => {
            let answer = answered(&reply);
            println!(
                "{}",
                reply.message.unwrap_or_else(|| "check requested".into())
            );
            match answer {
                Some(outcome) => Ok(outcome),
                None if wait => follow_to_outcome(&cfg.system.socket),
                None => Ok(Outcome::Done),
            }
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
    m.protect();
    println!("{msg}");
    Ok(())
}

/// `updraft apply`: through the daemon, or in this process (switch only).
fn apply(cfg: Config) -> Result<()> {
    if let Some(reply) = control::try_request(&cfg.system.socket, &control::Request::Apply)? {
        println!("{}", reply.message.unwrap_or_default());
        return Ok(());
    }
    let _lock = StateLock::acquire(&cfg.lock_path())?;
    let mut m = Machine::open(cfg, Mode::Oneshot)?;
    m.on_boot()?;
    let msg = m.apply()?;
    while let Next::Continue = m.step(&mut NoTick)? {}
    m.protect();
    match m.state()? {
        State::Installed(job) if job.held.is_none() => println!(
            "{msg}: slot {} boots next for a trial; reboot to try it (no daemon is running)",
            job.target
        ),
        _ => println!("{msg}"),
    }
    Ok(())
}

/// `updraft cancel`: through the daemon, or in this process.
fn cancel(cfg: Config) -> Result<()> {
    if let Some(reply) = control::try_request(&cfg.system.socket, &control::Request::Cancel)? {
        println!("{}", reply.message.unwrap_or_default());
        return Ok(());
    }
    let _lock = StateLock::acquire(&cfg.lock_path())?;
    let mut m = Machine::open(cfg, Mode::Oneshot)?;
    m.on_boot()?;
    let msg = m.cancel(&mut NoTick)?;
    while let Next::Continue = m.step(&mut NoTick)? {}
    m.protect();
    println!("{msg}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> std::result::Result<Args, UsageError> {
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
            p(&["status", "-c", "/y.toml"]).unwrap().config,
            PathBuf::from("/y.toml")
        );
        assert_eq!(
            p(&["install", "https://h/m.json"]).unwrap().command,
            Command::Install {
                manifest: "https://h/m.json".into(),
                wait: false
            }
        );
        assert_eq!(
            p(&["install", "--wait", "/m.json"]).unwrap().command,
            Command::Install {
                manifest: "/m.json".into(),
                wait: true
            }
        );
        assert_eq!(
            p(&["check", "--wait"]).unwrap().command,
            Command::Check { wait: true }
        );
        assert_eq!(
            p(&["check"]).unwrap().command,
            Command::Check { wait: false }
        );
        assert!(p(&["check", "--wait=yes"]).is_err());
        assert!(p(&["status", "--wait"]).is_err());
        assert_eq!(
            p(&["history", "--json"]).unwrap().command,
            Command::History { json: true }
        );
        assert_eq!(p(&["--version"]).unwrap().command, Command::Version);
        assert_eq!(
            p(&["completions", "bash"]).unwrap().command,
            Command::Completions
        );
        assert!(p(&[]).is_err());
        assert!(p(&["install"]).is_err());
        assert!(p(&["install", "a", "b"]).is_err());
        assert!(p(&["check", "now"]).is_err());
        assert!(p(&["frobnicate"]).is_err());
        assert!(p(&["--config"]).is_err());
        assert!(p(&["completions", "zsh"]).is_err());
    }

    #[test]
    fn adopt_takes_its_values_in_either_spelling_and_names_what_is_wrong() {
        assert_eq!(
            p(&[
                "adopt",
                "--from",
                "rauc",
                "--root=/mnt",
                "--dry-run",
                "-c",
                "/u.toml"
            ])
            .unwrap()
            .command,
            Command::Adopt(crate::adopt::Options {
                from: crate::adopt::Updater::Rauc,
                root: PathBuf::from("/mnt"),
                config: PathBuf::from("/u.toml"),
                release: None,
                state_dir: None,
                dry_run: true,
            })
        );
        let Command::Adopt(o) = p(&["adopt", "--from=mender", "--release", "r-7"])
            .unwrap()
            .command
        else {
            panic!("not adopt");
        };
        assert_eq!(
            (o.from, o.root, o.release),
            (
                crate::adopt::Updater::Mender,
                PathBuf::from("/"),
                Some("r-7".into())
            )
        );
        for (args, want) in [
            (&["adopt"][..], "adopt needs --from rauc or --from mender"),
            (
                &["adopt", "--from", "swupdate"],
                "--from \"swupdate\": updraft adopts from rauc or mender",
            ),
            (&["adopt", "--from"], "--from needs UPDATER"),
            (
                &["adopt", "--from", "rauc", "--from", "mender"],
                "--from given twice",
            ),
            (
                &["adopt", "--from", "rauc", "--dry-run=yes"],
                "--dry-run takes no value",
            ),
            (
                &["adopt", "--from", "rauc", "now"],
                "adopt takes no argument \"now\"",
            ),
        ] {
            assert_eq!(p(args).unwrap_err().message, want, "{args:?}");
        }
    }

    #[test]
    fn every_command_answers_help_in_every_spelling() {
        for c in PROGRAM.commands {
            for args in [
                vec![c.name, "--help"],
                vec![c.name, "-h"],
                vec!["--help", c.name],
                vec!["-c", "/x.toml", c.name, "--json", "-h"],
                vec!["help", c.name],
            ] {
                assert_eq!(
                    p(&args).map(|a| a.command),
                    Ok(Command::Help(Some(c.name))),
                    "{args:?}"
                );
            }
            let text = PROGRAM.help(c);
            assert!(
                text.contains("usage: updraft ") && text.contains(c.name),
                "{text}"
            );
            assert!(text.contains("\nexample"), "{} has no example", c.name);
            assert!(
                c.examples
                    .iter()
                    .all(|e| e.contains("updraft ") && e.contains(c.name)),
                "an example of {} does not run it: {:?}",
                c.name,
                c.examples
            );
        }
        assert_eq!(p(&["--help"]).unwrap().command, Command::Help(None));
        assert_eq!(p(&["help"]).unwrap().command, Command::Help(None));
        assert!(p(&["help", "frobnicate"]).is_err());
        assert!(p(&["frobnicate", "--help"]).is_err());
    }

    #[test]
    fn an_unknown_option_is_named_with_the_commands_usage() {
        let e = p(&["status", "--yaml"]).unwrap_err();
        assert_eq!(e.message, "unknown option --yaml for status");
        assert_eq!(e.command, Some("status"));
        let text = e.text();
        assert!(
            text.starts_with("updraft: unknown option --yaml for status\nusage: updraft [--config FILE] status [--json]\n"),
            "{text}"
        );
        assert!(text.contains("updraft status --help"), "{text}");
        let e = p(&["mark-good", "-x"]).unwrap_err();
        assert_eq!(e.message, "unknown option -x for mark-good");
        // An unknown command names itself and points at the overview.
        let e = p(&["frobnicate"]).unwrap_err();
        assert!(e.text().contains("\"frobnicate\""), "{}", e.text());
        assert!(e.text().contains("`updraft --help`"), "{}", e.text());
    }
}
