//! Application inhibitors: who holds off the switch and reboot right now.
//!
//! Three sources are asked, all configured in `[policy]`:
//!
//! * the inhibit directory (`policy.inhibit_dir`): every regular file in it
//!   is an inhibitor named after the file, its first line the reason, its
//!   modification time the moment it began. Only root, this process's user
//!   and members of `policy.inhibit_group` may inhibit: the directory must
//!   be owned by root (or this user) and not writable by others, and each
//!   file must be owned by root, this user or that group. Anything else is
//!   ignored with one warning per file and modification time. Symbolic
//!   links are never followed and names starting with `.` (editors'
//!   temporary files) are skipped.
//! * systemd-logind's inhibitor locks (`policy.logind`): a `block` lock on
//!   `shutdown` whose holder is still alive. logind's files are read
//!   directly (they say "Do not parse", so the reader is defensive and
//!   tolerates anything); there is no D-Bus client here.
//! * the inhibit command (`policy.inhibit_command`): exit status 0 lets the
//!   update go ahead, anything else, a command that cannot be started and
//!   one that runs past its limit hold it (fail closed).
//!
//! This module only answers the question. It never decides what an
//! inhibitor means for an update (whether to wait, for how long, when to
//! override it with `policy.max_deferral`): that belongs to the state
//! machine, which [`deferral_over`] helps. It never writes or removes an
//! inhibitor, never follows a symbolic link out of the inhibit directory,
//! and never reads more than 4 KiB of any file or of the command's output.

use std::collections::HashSet;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::child::{Failure, Watched};
use crate::config::Policy;
use crate::err;
use crate::error::Result;
use crate::fsutil::ensure_dir;
use crate::timestamp::{Timestamp, format_duration};

/// How long the inhibit command may run before it is killed (and counted
/// as inhibiting).
pub const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// The most read from one inhibitor file or from the command's output.
const READ_MAX: usize = 4096;

/// The longest reason or name kept, in characters.
const TEXT_MAX: usize = 200;

/// Mode of the inhibit directory when `policy.inhibit_group` is set:
/// group-writable, sticky (members cannot remove each other's entries) and
/// set-group-ID (what members create belongs to the group, whatever their
/// primary group).
const GROUP_DIR_MODE: u32 = 0o3775;

/// Where an inhibitor comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// A file in `policy.inhibit_dir`.
    File,
    /// A systemd-logind inhibitor lock.
    Logind,
    /// `policy.inhibit_command` said no.
    Command,
}

impl Origin {
    /// The lower-case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::File => "file",
            Origin::Logind => "logind",
            Origin::Command => "command",
        }
    }
}

/// Someone holding off the switch and reboot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Inhibitor {
    /// `<file name>`, `logind:<WHO>` or `command:<program name>`.
    pub who: String,
    pub origin: Origin,
    /// Why, in the holder's words: one line, control characters replaced,
    /// at most 200 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when it has been inhibiting: the file's modification time, or
    /// the first scan of this process that saw the command refuse.
    pub since: Timestamp,
}

impl Inhibitor {
    /// One line for logs and errors:
    /// `backup (file, since 2026-12-02T07:00:00Z): Copying the database`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} ({}, since {})",
            self.who,
            self.origin.as_str(),
            self.since
        );
        if let Some(r) = &self.reason {
            s.push_str(": ");
            s.push_str(r);
        }
        s
    }
}

/// True when inhibitors that began at `since` have held an update for
/// `max` or longer by `now`. `None` is no limit. An inhibitor that began
/// after `now` (the clock was set back) has not held anything yet.
pub fn deferral_over(since: Timestamp, now: Timestamp, max: Option<Duration>) -> bool {
    let Some(max) = max else {
        return false;
    };
    let max = i64::try_from(max.as_secs()).unwrap_or(i64::MAX);
    now.0.saturating_sub(since.0) >= max
}

/// Create `policy.inhibit_dir` (and its parents, mode 0755) if missing.
/// With `policy.inhibit_group` set and running as root, give it to
/// root:group with mode 3775 (group-writable, sticky, set-group-ID), also
/// when it exists already, so a changed configuration takes effect. An
/// unknown group is a configuration error.
pub fn prepare_dir(policy: &Policy) -> Result<()> {
    let dir = &policy.inhibit_dir;
    let group = match policy.inhibit_group.as_deref() {
        Some(name) => Some((name, resolve_group(name)?)),
        None => None,
    };
    ensure_dir(dir, 0o755)?;
    let Some((name, gid)) = group else {
        return Ok(());
    };
    if !nix::unistd::geteuid().is_root() {
        log::warn!(
            "inhibit: not running as root, so {} keeps its owner and mode; \
             members of policy.inhibit_group {name} need it group-writable",
            dir.display()
        );
        return Ok(());
    }
    nix::unistd::chown(
        dir,
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .map_err(|e| err!(Io, "giving {} to root:{name}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(GROUP_DIR_MODE)).map_err(
        |e| {
            err!(
                Io,
                "setting mode {GROUP_DIR_MODE:o} on {}: {e}",
                dir.display()
            )
        },
    )?;
    Ok(())
}

/// The gid of `name`, or a configuration error naming the key.
fn resolve_group(name: &str) -> Result<u32> {
    let group = nix::unistd::Group::from_name(name)
        .map_err(|e| err!(Config, "looking up policy.inhibit_group {name:?}: {e}"))?
        .ok_or_else(|| err!(Config, "policy.inhibit_group {name:?} does not exist"))?;
    Ok(group.gid.as_raw())
}

/// The inhibitor sources of one configuration, and what is remembered
/// between scans.
pub struct Inhibitors {
    dir: PathBuf,
    /// `policy.inhibit_group` and its gid.
    group: Option<(String, u32)>,
    euid: u32,
    /// `None` when `policy.logind` is off.
    logind_dir: Option<PathBuf>,
    command: Option<Vec<String>>,
    pub(crate) command_limit: Duration,
    /// When the command began refusing, for as long as it keeps refusing.
    command_since: Option<Timestamp>,
    /// (path, modification time) of the entries warned about, as of the
    /// last scan: each bad entry is logged once, not on every scan.
    warned: HashSet<(PathBuf, i64)>,
}

impl Inhibitors {
    /// Take the sources from `policy`. Fails when `policy.inhibit_group`
    /// names no group.
    pub fn new(policy: &Policy) -> Result<Inhibitors> {
        let group = match &policy.inhibit_group {
            Some(name) => Some((name.clone(), resolve_group(name)?)),
            None => None,
        };
        Ok(Inhibitors {
            dir: policy.inhibit_dir.clone(),
            group,
            euid: nix::unistd::geteuid().as_raw(),
            logind_dir: policy.logind.then(|| policy.logind_dir.clone()),
            command: policy.inhibit_command.clone(),
            command_limit: COMMAND_LIMIT,
            command_since: None,
            warned: HashSet::new(),
        })
    }

    /// Everyone inhibiting now: the inhibit directory's entries in name
    /// order, then logind's locks, then the command. The command runs only
    /// when nothing else inhibits: its answer could not change the outcome,
    /// and it may be costly. While it is not asked, the time it began
    /// refusing is kept.
    ///
    /// This blocks for as long as the command runs, at most
    /// [`COMMAND_LIMIT`]. Nothing here fails: an unreadable source is
    /// logged and counts as no inhibitor, except the command, which fails
    /// closed.
    pub fn scan(&mut self) -> Vec<Inhibitor> {
        let mut out = Vec::new();
        let mut warned = HashSet::new();
        self.scan_dir(&mut warned, &mut out);
        self.warned = warned;
        if let Some(dir) = &self.logind_dir {
            scan_logind(dir, self.euid, &mut out);
        }
        if !out.is_empty() {
            return out;
        }
        if let Some(argv) = &self.command {
            match run_command(argv, self.command_limit) {
                Ok(()) => self.command_since = None,
                Err(reason) => {
                    let since = *self.command_since.get_or_insert_with(Timestamp::now);
                    out.push(Inhibitor {
                        who: format!("command:{}", program_name(argv)),
                        origin: Origin::Command,
                        reason: Some(reason),
                        since,
                    });
                }
            }
        }
        out
    }

    /// Log `message` unless it was logged for `path` at `mtime` by the
    /// previous scan; remember it for the next one in `now`.
    fn warn_once(
        &self,
        now: &mut HashSet<(PathBuf, i64)>,
        path: &Path,
        mtime: i64,
        message: impl FnOnce() -> String,
    ) {
        let key = (path.to_path_buf(), mtime);
        if !self.warned.contains(&key) {
            log::warn!("{}", message());
        }
        now.insert(key);
    }

    /// Who may own an entry, for the warning about one that is ignored.
    fn allowed_owners(&self) -> String {
        let mut s = String::from("root");
        if self.euid != 0 {
            s.push_str(&format!(" or uid {}", self.euid));
        }
        if let Some((name, _)) = &self.group {
            s.push_str(&format!(" or group {name}"));
        }
        s
    }

    fn scan_dir(&self, warned: &mut HashSet<(PathBuf, i64)>, out: &mut Vec<Inhibitor>) {
        let dir = &self.dir;
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => {
                self.warn_once(warned, dir, 0, || {
                    format!("inhibit: ignoring {}: {e}", dir.display())
                });
                return;
            }
        };
        let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
        if !meta.is_dir() || (uid != 0 && uid != self.euid) || mode & 0o002 != 0 {
            self.warn_once(warned, dir, meta.mtime(), || {
                format!(
                    "inhibit: ignoring every entry of {}: owned by uid {uid} with mode {mode:04o}; \
                     it must be a directory owned by root that others cannot write",
                    dir.display()
                )
            });
            return;
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(r) => r,
            Err(e) => {
                self.warn_once(warned, dir, meta.mtime(), || {
                    format!("inhibit: ignoring {}: {e}", dir.display())
                });
                return;
            }
        };
        let mut names: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .filter(|n| !n.as_encoded_bytes().starts_with(b"."))
            .collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
            if let Some(i) = self.read_entry(&path, warned) {
                out.push(i);
            }
        }
    }

    /// One entry of the inhibit directory, if it is honoured.
    fn read_entry(&self, path: &Path, warned: &mut HashSet<(PathBuf, i64)>) -> Option<Inhibitor> {
        // Gone since the listing: nothing to say.
        let lmeta = std::fs::symlink_metadata(path).ok()?;
        let kind = lmeta.file_type();
        if kind.is_symlink() {
            self.warn_once(warned, path, lmeta.mtime(), || {
                format!(
                    "inhibit: ignoring {}: a symbolic link (not followed)",
                    path.display()
                )
            });
            return None;
        }
        if !kind.is_file() {
            self.warn_once(warned, path, lmeta.mtime(), || {
                format!("inhibit: ignoring {}: not a regular file", path.display())
            });
            return None;
        }
        // The decision is made on what was opened, not on the name: the
        // entry may have been replaced since it was looked at.
        let (mut file, meta) = match open_regular(path) {
            Ok(Some(f)) => f,
            Ok(None) => return None,
            Err(e) => {
                self.warn_once(warned, path, lmeta.mtime(), || {
                    format!("inhibit: ignoring {}: {e}", path.display())
                });
                return None;
            }
        };
        // A hard link to a file of root's would pass the owner check
        // (possible where `fs.protected_hardlinks` is off).
        if meta.nlink() > 1 {
            self.warn_once(warned, path, meta.mtime(), || {
                format!(
                    "inhibit: ignoring {}: it has {} hard links (another file's name too)",
                    path.display(),
                    meta.nlink()
                )
            });
            return None;
        }
        let (uid, gid) = (meta.uid(), meta.gid());
        let by_group = self.group.as_ref().is_some_and(|(_, g)| *g == gid);
        if uid != 0 && uid != self.euid && !by_group {
            self.warn_once(warned, path, meta.mtime(), || {
                format!(
                    "inhibit: ignoring {}: owned by uid {uid} gid {gid}, not {}",
                    path.display(),
                    self.allowed_owners()
                )
            });
            return None;
        }
        let reason = match read_head(&mut file) {
            Ok(head) => first_line(&head),
            Err(e) => {
                log::debug!("inhibit: reading {}: {e}", path.display());
                None
            }
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Some(Inhibitor {
            who: clean(&name).unwrap_or_else(|| format!("{name:?}")),
            origin: Origin::File,
            reason,
            since: Timestamp(meta.mtime()),
        })
    }
}

/// Open `path` for reading without following a symbolic link or blocking
/// on a FIFO, and return it with its metadata if it is a regular file.
/// `Ok(None)`: vanished, or no longer a regular file.
fn open_regular(path: &Path) -> io::Result<Option<(File, Metadata)>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: a symbolic link was put in its place.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    Ok(meta.is_file().then_some((file, meta)))
}

/// The first [`READ_MAX`] bytes of `file`.
fn read_head(file: &mut File) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    file.take(READ_MAX as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// What the two readers of untrusted bytes make of `bytes`: the reason an
/// inhibitor file with this content gives, and whether a logind file with
/// it is a lock that blocks a reboot. Both take any bytes without
/// panicking; the fuzz target `inhibitor` holds them to it.
pub fn read_untrusted(bytes: &[u8]) -> (Option<String>, bool) {
    let reason = first_line(bytes);
    let text = String::from_utf8_lossy(bytes);
    let blocks = parse_logind(&text).is_some_and(|l| l.blocks_shutdown());
    (reason, blocks)
}

/// The longest reason an inhibitor gives, in characters.
pub const REASON_MAX: usize = TEXT_MAX;

/// The first line of `bytes`, cleaned by [`clean`].
fn first_line(bytes: &[u8]) -> Option<String> {
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    clean(&String::from_utf8_lossy(line))
}

/// `text` on one line fit for a log: control characters replaced by
/// spaces, trimmed, at most [`TEXT_MAX`] characters. `None` when nothing
/// is left.
fn clean(text: &str) -> Option<String> {
    let spaced: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let kept: String = spaced.trim().chars().take(TEXT_MAX).collect();
    let kept = kept.trim_end();
    (!kept.is_empty()).then(|| kept.to_string())
}

/// What one logind inhibitor file says, as far as it matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LogindLock {
    /// `WHAT`: the operations held (`shutdown`, `sleep`, `idle`, ...).
    what: Vec<String>,
    /// `MODE`: `block`, `delay`, ...
    mode: String,
    /// `WHO`, unescaped and cleaned.
    who: Option<String>,
    /// `WHY`, unescaped and cleaned.
    why: Option<String>,
    /// `PID` of the holder, when present and a number.
    pid: Option<u32>,
}

impl LogindLock {
    /// A lock that keeps a reboot from happening: `block` mode on
    /// `shutdown`. A `delay` lock only postpones it a few seconds, and
    /// `block-weak` is ignored by a privileged caller such as this daemon.
    fn blocks_shutdown(&self) -> bool {
        self.mode == "block" && self.what.iter().any(|w| w == "shutdown")
    }
}

/// Parse a logind inhibitor file (`KEY=VALUE` lines, `WHO` and `WHY`
/// C-escaped). Lines that are not assignments and unknown keys are
/// skipped; `None` without `WHAT` or `MODE`. Never panics, whatever the
/// text.
fn parse_logind(text: &str) -> Option<LogindLock> {
    let (mut what, mut mode, mut who, mut why, mut pid) = (None, None, None, None, None);
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "WHAT" => {
                what = Some(
                    value
                        .split(':')
                        .map(str::trim)
                        .filter(|w| !w.is_empty())
                        .map(String::from)
                        .collect::<Vec<_>>(),
                )
            }
            "MODE" => mode = Some(value.trim().to_string()),
            "WHO" => who = clean(&unescape(value)),
            "WHY" => why = clean(&unescape(value)),
            "PID" => pid = value.trim().parse::<u32>().ok(),
            _ => {}
        }
    }
    Some(LogindLock {
        what: what?,
        mode: mode?,
        who,
        why,
        pid,
    })
}

/// Undo systemd's `cescape`: `\n`, `\\`, `\"` and the like, `\ooo` octal
/// and `\xhh` hexadecimal bytes. An escape that is none of these is kept
/// as written.
fn unescape(value: &str) -> String {
    let b = value.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let simple = match b.get(i + 1) {
            Some(b'a') => Some(0x07),
            Some(b'b') => Some(0x08),
            Some(b'f') => Some(0x0c),
            Some(b'n') => Some(b'\n'),
            Some(b'r') => Some(b'\r'),
            Some(b't') => Some(b'\t'),
            Some(b'v') => Some(0x0b),
            Some(&c @ (b'\\' | b'"' | b'\'')) => Some(c),
            _ => None,
        };
        if let Some(c) = simple {
            out.push(c);
            i += 2;
            continue;
        }
        let hex = b
            .get(i + 1..i + 4)
            .filter(|t| t[0] == b'x')
            .and_then(|t| std::str::from_utf8(&t[1..]).ok())
            .and_then(|t| u8::from_str_radix(t, 16).ok());
        let octal = b
            .get(i + 1..i + 4)
            .filter(|t| t.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| u8::from_str_radix(t, 8).ok());
        match hex.or(octal) {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b'\\');
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    pid != 0 && Path::new("/proc").join(pid.to_string()).exists()
}

/// Add logind's `block` locks on `shutdown` held by live processes, in
/// file name order. Only files owned by root (logind) or `euid` are read.
fn scan_logind(dir: &Path, euid: u32, out: &mut Vec<Inhibitor>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return,
        Err(e) => {
            log::debug!("inhibit: reading {}: {e}", dir.display());
            return;
        }
    };
    let mut names: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| {
            let b = n.as_encoded_bytes();
            !b.starts_with(b".") && !b.ends_with(b".ref")
        })
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
            continue;
        }
        let (mut file, meta) = match open_regular(&path) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => {
                log::debug!("inhibit: opening {}: {e}", path.display());
                continue;
            }
        };
        if (meta.uid() != 0 && meta.uid() != euid) || meta.nlink() > 1 {
            log::debug!(
                "inhibit: ignoring {}: owned by uid {} with {} hard link(s)",
                path.display(),
                meta.uid(),
                meta.nlink()
            );
            continue;
        }
        let head = match read_head(&mut file) {
            Ok(h) => h,
            Err(e) => {
                log::debug!("inhibit: reading {}: {e}", path.display());
                continue;
            }
        };
        let Some(lock) = parse_logind(&String::from_utf8_lossy(&head)) else {
            continue;
        };
        if !lock.blocks_shutdown() || lock.pid.is_some_and(|p| !alive(p)) {
            continue;
        }
        let who = match (&lock.who, lock.pid) {
            (Some(w), _) => format!("logind:{w}"),
            (None, Some(p)) => format!("logind:pid {p}"),
            (None, None) => "logind:unknown".to_string(),
        };
        out.push(Inhibitor {
            who,
            origin: Origin::Logind,
            reason: lock.why,
            since: Timestamp(meta.mtime()),
        });
    }
}

/// The base name of the command's program, for `command:<name>`.
fn program_name(argv: &[String]) -> String {
    let prog = argv.first().map(String::as_str).unwrap_or_default();
    let base = Path::new(prog)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| prog.to_string());
    clean(&base).unwrap_or_else(|| format!("{base:?}"))
}

/// Run the inhibit command: `Ok` when it exits with status 0, otherwise
/// why it inhibits. It runs in a process group of its own so that, past
/// `limit`, it is killed together with whatever it started.
fn run_command(argv: &[String], limit: Duration) -> std::result::Result<(), String> {
    let Some((prog, args)) = argv.split_first() else {
        return Err("policy.inhibit_command is empty".into());
    };
    let mut cmd = Command::new(prog);
    crate::notify::scrub(&mut cmd);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child =
        Watched::spawn_group(&mut cmd).map_err(|e| format!("cannot be started: {e}"))?;
    let finished = child
        .collect(limit, READ_MAX, &mut |fds, left| {
            crate::progress::wait_readable(fds, left);
            Ok(())
        })
        .map_err(|f| match f {
            Failure::TimedOut(_) => format!("did not finish within {}", seconds(limit)),
            Failure::Read(e) => format!("its output cannot be read: {e}"),
            Failure::Wait(e) => format!("waiting for it failed: {e}"),
            Failure::Interrupted(e) => format!("waiting for it failed: {e}"),
        })?;
    if finished.status.success() {
        return Ok(());
    }
    Err(first_line(&finished.stdout.bytes)
        .unwrap_or_else(|| format!("exited with {}", finished.status)))
}

/// `30 s` for whole seconds, else as [`format_duration`] writes it.
fn seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format_duration(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{Rng, mutate, scratch_dir};
    use std::os::unix::fs::symlink;
    use std::time::{Instant, UNIX_EPOCH};

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A scratch inhibit directory with mode 0755 and the policy naming
    /// it, with logind off so the host's locks do not count.
    fn setup(name: &str) -> (PathBuf, Policy) {
        let base = scratch_dir("inhibit", name);
        let dir = base.join("inhibit.d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let policy = Policy {
            inhibit_dir: dir,
            logind: false,
            logind_dir: base.join("logind"),
            ..Policy::default()
        };
        (base, policy)
    }

    fn write(path: &Path, text: &[u8], mtime: i64) {
        std::fs::write(path, text).unwrap();
        set_mtime(path, mtime);
    }

    fn set_mtime(path: &Path, mtime: i64) {
        let t = UNIX_EPOCH + Duration::from_secs(mtime as u64);
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    fn chown(path: &Path, uid: u32, gid: u32) {
        nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .unwrap();
    }

    /// The name of the group with gid 65534 (`nogroup`, `nobody`).
    fn nobody_group() -> Option<String> {
        nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(65534))
            .ok()
            .flatten()
            .map(|g| g.name)
    }

    #[test]
    fn an_entry_owned_by_root_or_this_user_inhibits_with_its_reason_and_time() {
        let (base, policy) = setup("own");
        let dir = &policy.inhibit_dir;
        write(
            &dir.join("backup"),
            b"  Copying the database \r\nsecond line\n",
            1_800_000_000,
        );
        write(&dir.join("quiet"), b"", 1_800_000_100);
        let mut inh = Inhibitors::new(&policy).unwrap();
        let found = inh.scan();
        assert_eq!(
            found,
            vec![
                Inhibitor {
                    who: "backup".into(),
                    origin: Origin::File,
                    reason: Some("Copying the database".into()),
                    since: Timestamp(1_800_000_000),
                },
                Inhibitor {
                    who: "quiet".into(),
                    origin: Origin::File,
                    reason: None,
                    since: Timestamp(1_800_000_100),
                },
            ]
        );
        assert_eq!(
            found[0].describe(),
            "backup (file, since 2027-01-15T08:00:00Z): Copying the database"
        );
        assert_eq!(
            found[1].describe(),
            "quiet (file, since 2027-01-15T08:01:40Z)"
        );
        assert!(inh.warned.is_empty());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn an_entry_with_another_name_does_not_inhibit() {
        let (base, policy) = setup("hardlink");
        let dir = &policy.inhibit_dir;
        // A file of root's (or ours) linked into the directory by someone
        // who may not write an entry there: the owner check alone passes it.
        let elsewhere = base.join("root-owned");
        write(&elsewhere, b"not an inhibitor\n", 1_800_000_000);
        std::fs::hard_link(&elsewhere, dir.join("planted")).unwrap();
        let mut inh = Inhibitors::new(&policy).unwrap();
        assert_eq!(inh.scan(), vec![]);
        assert_eq!(inh.warned.len(), 1);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn reasons_are_one_short_clean_line() {
        let (base, policy) = setup("reason");
        let dir = &policy.inhibit_dir;
        let mut long = "x".repeat(300).into_bytes();
        long.extend_from_slice(b"\nnext");
        write(&dir.join("a-long"), &long, 1);
        write(&dir.join("b-control"), b"one\x1b[31m\ttwo\x00three\n", 1);
        write(&dir.join("c-binary"), b"\xff\xfe ok \x80\n", 1);
        // Beyond the 4 KiB read: only a newline never seen.
        let mut big = vec![b'y'; 10 * READ_MAX];
        big.push(b'\n');
        write(&dir.join("d-big"), &big, 1);
        let reasons: Vec<_> = Inhibitors::new(&policy)
            .unwrap()
            .scan()
            .into_iter()
            .map(|i| i.reason.unwrap_or_default())
            .collect();
        assert_eq!(reasons[0], "x".repeat(TEXT_MAX));
        assert_eq!(reasons[1], "one [31m two three");
        assert_eq!(reasons[2], "\u{fffd}\u{fffd} ok \u{fffd}");
        assert_eq!(reasons[3], "y".repeat(TEXT_MAX));
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_foreign_entry_is_ignored_and_warned_about_once() {
        if !is_root() {
            eprintln!("skipped: giving a file to another uid needs root");
            return;
        }
        let (base, policy) = setup("foreign");
        let path = policy.inhibit_dir.join("intruder");
        write(&path, b"mine now\n", 1_000);
        chown(&path, 65534, 65534);
        let mut inh = Inhibitors::new(&policy).unwrap();
        assert_eq!(inh.scan(), vec![]);
        assert_eq!(inh.scan(), vec![]);
        assert_eq!(inh.warned.len(), 1);
        assert!(inh.warned.contains(&(path.clone(), 1_000)));
        // Touched: a new warning, and the old one forgotten.
        set_mtime(&path, 2_000);
        assert_eq!(inh.scan(), vec![]);
        assert_eq!(inh.warned.len(), 1);
        assert!(inh.warned.contains(&(path.clone(), 2_000)));
        // Removed: nothing left to remember.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(inh.scan(), vec![]);
        assert!(inh.warned.is_empty());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn the_inhibit_group_admits_a_foreign_owner_in_it() {
        if !is_root() {
            eprintln!("skipped: giving a file to another uid needs root");
            return;
        }
        let Some(group) = nobody_group() else {
            eprintln!("skipped: no group with gid 65534 here");
            return;
        };
        let (base, mut policy) = setup("group");
        let path = policy.inhibit_dir.join("app");
        write(&path, b"recording\n", 5);
        chown(&path, 65534, 65534);
        assert_eq!(Inhibitors::new(&policy).unwrap().scan(), vec![]);
        policy.inhibit_group = Some(group);
        let found = Inhibitors::new(&policy).unwrap().scan();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].reason.as_deref(), Some("recording"));
        // Another gid is still refused.
        chown(&path, 65534, 65533);
        assert_eq!(Inhibitors::new(&policy).unwrap().scan(), vec![]);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn an_unknown_group_is_a_config_error() {
        let (base, mut policy) = setup("nogroup");
        policy.inhibit_group = Some("updraft-no-such-group".into());
        let Err(e) = Inhibitors::new(&policy) else {
            panic!("an unknown group was accepted");
        };
        assert_eq!(e.kind(), crate::error::Kind::Config);
        assert_eq!(
            e.to_string(),
            "policy.inhibit_group \"updraft-no-such-group\" does not exist"
        );
        let e = prepare_dir(&policy).unwrap_err();
        assert_eq!(e.kind(), crate::error::Kind::Config);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_is_ignored_wholesale() {
        let (base, policy) = setup("open");
        let dir = &policy.inhibit_dir;
        write(&dir.join("backup"), b"busy\n", 1);
        let mut inh = Inhibitors::new(&policy).unwrap();
        assert_eq!(inh.scan().len(), 1);
        for mode in [0o777, 0o1777, 0o757] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(inh.scan(), vec![], "mode {mode:o}");
            assert_eq!(inh.warned.len(), 1, "one warning for the directory");
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert_eq!(inh.scan().len(), 1, "group-writable is allowed");
        if is_root() {
            chown(dir, 65534, 0);
            assert_eq!(inh.scan(), vec![], "a directory owned by another uid");
            assert_eq!(inh.warned.len(), 1);
        }
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_missing_directory_means_no_inhibitors_and_no_warning() {
        let (base, mut policy) = setup("missing");
        policy.inhibit_dir = base.join("absent");
        let mut inh = Inhibitors::new(&policy).unwrap();
        assert_eq!(inh.scan(), vec![]);
        assert!(inh.warned.is_empty());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn dotfiles_symlinks_and_other_kinds_are_skipped() {
        let (base, policy) = setup("kinds");
        let dir = &policy.inhibit_dir;
        write(&dir.join("real"), b"yes\n", 1);
        write(&dir.join(".real.swp"), b"editor\n", 1);
        write(&base.join("outside"), b"followed\n", 1);
        symlink(base.join("outside"), dir.join("link")).unwrap();
        symlink(base.join("nowhere"), dir.join("dangling")).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        let mut inh = Inhibitors::new(&policy).unwrap();
        let found = inh.scan();
        let who: Vec<_> = found.iter().map(|i| i.who.as_str()).collect();
        assert_eq!(who, ["real"]);
        // The links and the directory are warned about, the dotfile is not.
        let mut warned: Vec<_> = inh
            .warned
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        warned.sort();
        assert_eq!(warned, ["dangling", "link", "sub"]);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn the_directory_is_prepared_with_its_parents() {
        let (base, mut policy) = setup("prepare");
        policy.inhibit_dir = base.join("run/updraft/inhibit.d");
        prepare_dir(&policy).unwrap();
        assert!(policy.inhibit_dir.is_dir());
        // Already there: nothing to do.
        prepare_dir(&policy).unwrap();
        if let (true, Some(group)) = (is_root(), nobody_group()) {
            policy.inhibit_group = Some(group);
            prepare_dir(&policy).unwrap();
            let m = std::fs::metadata(&policy.inhibit_dir).unwrap();
            assert_eq!(m.mode() & 0o7777, GROUP_DIR_MODE);
            assert_eq!((m.uid(), m.gid()), (0, 65534));
            // Such a directory is trusted.
            write(&policy.inhibit_dir.join("app"), b"", 1);
            assert_eq!(Inhibitors::new(&policy).unwrap().scan().len(), 1);
        } else {
            eprintln!("skipped the group part: it needs root and a group with gid 65534");
        }
        std::fs::remove_dir_all(base).unwrap();
    }

    const LOGIND: &str = "# This is private data. Do not parse.\n\
                          WHAT=shutdown:sleep\n\
                          MODE=block\n\
                          UID=1000\n\
                          PID=1234\n\
                          WHO=backup-job\n\
                          WHY=Copying the database\n\
                          FIFO=/run/systemd/inhibit/1.ref\n";

    #[test]
    fn a_logind_block_lock_on_shutdown_counts() {
        let lock = parse_logind(LOGIND).unwrap();
        assert_eq!(
            lock,
            LogindLock {
                what: vec!["shutdown".into(), "sleep".into()],
                mode: "block".into(),
                who: Some("backup-job".into()),
                why: Some("Copying the database".into()),
                pid: Some(1234),
            }
        );
        assert!(lock.blocks_shutdown());
        let crlf = LOGIND.replace('\n', "\r\n");
        assert!(parse_logind(&crlf).unwrap().blocks_shutdown());
    }

    #[test]
    fn logind_delay_and_sleep_locks_do_not_count() {
        for (from, to) in [
            ("MODE=block", "MODE=delay"),
            ("MODE=block", "MODE=block-weak"),
            ("MODE=block", "MODE=Block"),
            ("WHAT=shutdown:sleep", "WHAT=sleep"),
            ("WHAT=shutdown:sleep", "WHAT=idle:handle-power-key"),
            ("WHAT=shutdown:sleep", "WHAT=shutdownx"),
        ] {
            let lock = parse_logind(&LOGIND.replace(from, to)).unwrap();
            assert!(!lock.blocks_shutdown(), "{to}");
        }
        for missing in ["WHAT=shutdown:sleep\n", "MODE=block\n"] {
            assert_eq!(parse_logind(&LOGIND.replace(missing, "")), None);
        }
    }

    #[test]
    fn logind_values_are_unescaped_and_cleaned() {
        let text = LOGIND
            .replace("WHO=backup-job", r#"WHO=Caf\303\251 \"db\""#)
            .replace(
                "WHY=Copying the database",
                r"WHY=line one\nline two\tand\x21 \q\\ \777 \",
            );
        let lock = parse_logind(&text).unwrap();
        assert_eq!(lock.who.as_deref(), Some("Café \"db\""));
        assert_eq!(
            lock.why.as_deref(),
            Some(r"line one line two and! \q\ \777 \")
        );
        let no_pid = LOGIND.replace("PID=1234", "PID=12x");
        assert_eq!(parse_logind(&no_pid).unwrap().pid, None);
    }

    #[test]
    fn garbage_is_not_a_logind_lock_and_never_panics() {
        for text in [
            "",
            "\n\n\n",
            "# only a comment",
            "WHAT",
            "=",
            "==\n=WHAT=shutdown",
            "WHAT=shutdown\nMODE",
            "\u{0}\u{1}\u{ffff}",
        ] {
            assert_eq!(parse_logind(text), None, "{text:?}");
        }
        let huge = format!(
            "WHAT=shutdown\nMODE=block\nWHY={}\nWHO={}\n",
            "\\".repeat(1 << 20),
            "\\3".repeat(1 << 19)
        );
        let lock = parse_logind(&huge).unwrap();
        assert_eq!(lock.why.map(|w| w.chars().count()), Some(TEXT_MAX));
        let mut rng = Rng(0x1a2b_3c4d_5e6f_7788);
        for _ in 0..5000 {
            let bytes = mutate(&mut rng, LOGIND.as_bytes());
            let _ = parse_logind(&String::from_utf8_lossy(&bytes));
            let _ = unescape(&String::from_utf8_lossy(&rng.bytes(64)));
        }
    }

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn logind_locks_of_live_holders_count_and_the_rest_do_not() {
        let (base, mut policy) = setup("logind");
        let dir = policy.logind_dir.clone();
        std::fs::create_dir(&dir).unwrap();
        let me = std::process::id();
        let live = LOGIND.replace("PID=1234", &format!("PID={me}"));
        write(&dir.join("1"), live.as_bytes(), 1_700_000_000);
        write(&dir.join("1.ref"), live.as_bytes(), 1);
        write(&dir.join(".#1abc"), live.as_bytes(), 1);
        let dead = LOGIND.replace("PID=1234", &format!("PID={}", dead_pid()));
        write(&dir.join("2"), dead.as_bytes(), 1);
        let delay = live.replace("MODE=block", "MODE=delay");
        write(&dir.join("3"), delay.as_bytes(), 1);
        let anonymous = live.replace("WHO=backup-job\n", "").replace("WHY=", "X=");
        write(&dir.join("4"), anonymous.as_bytes(), 1_700_000_004);
        write(&dir.join("5"), b"\xff\x00WHAT=\n\x80", 1);
        symlink(dir.join("1"), dir.join("6")).unwrap();
        let mut pipeless = live.replace(&format!("PID={me}"), "");
        pipeless.push_str("WHO=no pid\n");
        write(&dir.join("7"), pipeless.as_bytes(), 1_700_000_007);

        assert_eq!(Inhibitors::new(&policy).unwrap().scan(), vec![]);
        policy.logind = true;
        let found = Inhibitors::new(&policy).unwrap().scan();
        assert_eq!(
            found,
            vec![
                Inhibitor {
                    who: "logind:backup-job".into(),
                    origin: Origin::Logind,
                    reason: Some("Copying the database".into()),
                    since: Timestamp(1_700_000_000),
                },
                Inhibitor {
                    who: format!("logind:pid {me}"),
                    origin: Origin::Logind,
                    reason: None,
                    since: Timestamp(1_700_000_004),
                },
                Inhibitor {
                    who: "logind:no pid".into(),
                    origin: Origin::Logind,
                    reason: Some("Copying the database".into()),
                    since: Timestamp(1_700_000_007),
                },
            ]
        );
        std::fs::remove_dir_all(base).unwrap();
    }

    fn with_command(policy: &Policy, argv: &[&str]) -> Inhibitors {
        let mut inh = Inhibitors::new(&Policy {
            inhibit_command: Some(argv.iter().map(|s| s.to_string()).collect()),
            ..policy.clone()
        })
        .unwrap();
        inh.command_limit = Duration::from_millis(400);
        inh
    }

    #[test]
    fn a_refusing_command_inhibits_with_the_first_line_of_its_output() {
        let (base, policy) = setup("refuse");
        let mut inh = with_command(
            &policy,
            &["sh", "-c", "echo busy writing; echo more; exit 1"],
        );
        let first = inh.scan();
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].who, "command:sh");
        assert_eq!(first[0].origin, Origin::Command);
        assert_eq!(first[0].reason.as_deref(), Some("busy writing"));
        let since = first[0].since;
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(inh.scan()[0].since, since, "refusing since the first scan");
        // A success ends it; the next refusal starts anew.
        inh.command = Some(vec!["true".into()]);
        assert_eq!(inh.scan(), vec![]);
        assert_eq!(inh.command_since, None);
        inh.command = Some(vec!["/bin/sh".into(), "-c".into(), "exit 3".into()]);
        let again = inh.scan();
        assert!(again[0].since > since, "{again:?}");
        assert_eq!(again[0].who, "command:sh");
        assert_eq!(
            again[0].reason.as_deref(),
            Some("exited with exit status: 3")
        );
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_succeeding_command_does_not_inhibit() {
        let (base, policy) = setup("succeed");
        let mut inh = with_command(&policy, &["sh", "-c", "echo all clear"]);
        assert_eq!(inh.scan(), vec![]);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_command_that_cannot_start_inhibits() {
        let (base, policy) = setup("nostart");
        let mut inh = with_command(&policy, &["/nonexistent/updraft-check"]);
        let found = inh.scan();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].who, "command:updraft-check");
        let reason = found[0].reason.as_deref().unwrap_or_default();
        // Natively the spawn fails; under an emulator (qemu-user runs the
        // program) it is the emulator that exits 127. Either way it holds.
        assert!(
            reason.starts_with("cannot be started: ") || reason == "exited with exit status: 127",
            "{reason}"
        );
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_command_past_its_limit_is_killed_and_inhibits() {
        let (base, policy) = setup("slow");
        let marker = base.join("survived");
        let script = format!("sleep 30 & sleep 30; touch {}", marker.display());
        let mut inh = with_command(&policy, &["sh", "-c", &script]);
        let started = Instant::now();
        let found = inh.scan();
        // Not waited for: the scan ends at the limit, long before the
        // command would have.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].reason.as_deref(),
            Some("did not finish within 400ms")
        );
        assert!(!marker.exists());
        assert_eq!(seconds(COMMAND_LIMIT), "30 s");
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_background_child_holding_the_output_does_not_hold_the_scan() {
        let (base, policy) = setup("background");
        let mut inh = with_command(&policy, &["sh", "-c", "sleep 60 & echo held; exit 1"]);
        inh.command_limit = Duration::from_secs(30);
        let found = inh.scan();
        // Its exit status, not the limit: the scan did not wait for the
        // child that keeps the pipe open.
        assert_eq!(found[0].reason.as_deref(), Some("held"));
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_chatty_command_does_not_block_on_its_output() {
        let (base, policy) = setup("chatty");
        let mut inh = with_command(
            &policy,
            &["sh", "-c", "echo first; head -c 1000000 /dev/zero; exit 1"],
        );
        inh.command_limit = Duration::from_secs(10);
        let found = inh.scan();
        assert_eq!(found[0].reason.as_deref(), Some("first"));
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn the_command_is_asked_only_when_nothing_else_inhibits() {
        let (base, policy) = setup("order");
        let marker = base.join("asked");
        let script = format!("touch {}; exit 1", marker.display());
        let mut inh = with_command(&policy, &["sh", "-c", &script]);
        write(&policy.inhibit_dir.join("backup"), b"", 1);
        let found = inh.scan();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].origin, Origin::File);
        assert!(!marker.exists(), "the command ran needlessly");
        std::fs::remove_file(policy.inhibit_dir.join("backup")).unwrap();
        assert_eq!(inh.scan()[0].origin, Origin::Command);
        assert!(marker.exists());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn the_deferral_is_over_after_the_maximum() {
        let h = Duration::from_secs(3600);
        let since = Timestamp(1_000_000);
        assert!(!deferral_over(since, since.plus(h), Some(2 * h)));
        assert!(deferral_over(since, since.plus(2 * h), Some(2 * h)));
        assert!(deferral_over(since, since.plus(3 * h), Some(2 * h)));
        assert!(!deferral_over(since, Timestamp(since.0 - 10), Some(h)));
        assert!(!deferral_over(since, Timestamp(i64::MAX), None));
        assert!(!deferral_over(since, since.plus(h), Some(Duration::MAX)));
        assert!(deferral_over(
            Timestamp(i64::MIN),
            Timestamp(i64::MAX),
            Some(h)
        ));
    }

    #[test]
    fn inhibitors_serialize_for_the_status() {
        let mut i = Inhibitor {
            who: "logind:backup-job".into(),
            origin: Origin::Logind,
            reason: Some("Copying the database".into()),
            since: Timestamp(1_800_000_000),
        };
        let json = serde_json::to_string(&i).unwrap();
        assert_eq!(
            json,
            r#"{"who":"logind:backup-job","origin":"logind","reason":"Copying the database","since":"2027-01-15T08:00:00Z"}"#
        );
        assert_eq!(serde_json::from_str::<Inhibitor>(&json).unwrap(), i);
        i.reason = None;
        i.origin = Origin::Command;
        let json = serde_json::to_string(&i).unwrap();
        assert_eq!(
            json,
            r#"{"who":"logind:backup-job","origin":"command","since":"2027-01-15T08:00:00Z"}"#
        );
        assert_eq!(serde_json::from_str::<Inhibitor>(&json).unwrap(), i);
    }
}
