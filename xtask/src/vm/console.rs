//! One QEMU machine and its serial console: the [`Machine`]'s QEMU under
//! TCG with the disk on virtio, user networking and the console on its
//! stdin and stdout. QEMU's own events (its QMP socket: `RESET`,
//! `WATCHDOG`, `SHUTDOWN`) join the console as lines starting with
//! [`QEMU_EVENT`], and what QEMU prints on stderr as `qemu: …`. Every line
//! goes to a log file as it arrives and is split into boots by the guest's
//! marker lines, with the time each boot took from the reset (QEMU's
//! `RESET` event, or the start of QEMU) to its userspace.
//!
//! A guest reboot (`reboot -f`, a kernel panic) or the emulated hardware
//! watchdog resets the machine inside the same QEMU process; the machine
//! ends when the guest powers off or the harness ends it.
//!
//! This module owns the QEMU process it starts and nothing else: it ends
//! that process by its PID (never by name), and it must never decide what
//! a scenario asserts.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::guest::{BOOTLOADER_MARK, USERSPACE_MARK};
use super::machine::Machine;
use crate::util::Result;

/// How many console lines an error shows.
const TAIL: usize = 40;

/// Whether console lines are also printed as they arrive (`demo --vm`).
static ECHO: AtomicBool = AtomicBool::new(false);

/// A line for one of QEMU's QMP events: followed by the event's name and
/// its data as JSON (`qemu: event WATCHDOG {"action":"reset"}`).
pub const QEMU_EVENT: &str = "qemu: event ";

/// Numbers this process's QMP sockets.
static QMP_SOCKETS: AtomicU32 = AtomicU32::new(0);

/// Print every console line of the machines started from now on, as it
/// arrives, for people who want to watch a real boot.
pub fn show_console() {
    ECHO.store(true, Ordering::Relaxed);
}

/// One boot of the machine, as the console showed it.
#[derive(Clone, Debug)]
pub struct Boot {
    /// When the machine started or was reset into this boot.
    pub reset: Instant,
    /// When the bootloader started the shipped script (GRUB's fragment,
    /// U-Boot's `boot.scr`).
    pub grub: Instant,
    /// When the slot's init printed its first line.
    pub userspace: Option<Instant>,
    /// The slot and release the init reported.
    pub slot: Option<String>,
    pub version: Option<String>,
}

impl Boot {
    /// From the reset to the bootloader's first line.
    pub fn to_grub(&self) -> Duration {
        self.grub.duration_since(self.reset)
    }

    /// From the reset to userspace.
    pub fn to_userspace(&self) -> Option<Duration> {
        self.userspace.map(|u| u.duration_since(self.reset))
    }
}

/// A running VM.
pub struct Vm {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<(Instant, String)>,
    log_path: PathBuf,
    /// QEMU's QMP socket, removed when the VM is dropped.
    qmp: PathBuf,
    started: Instant,
    /// Every line so far.
    seen: Vec<String>,
    boots: Boots,
    exited: bool,
}

/// The console's lines split into boots.
struct Boots {
    /// When the machine was (or will be) reset into the next boot.
    pending_reset: Option<Instant>,
    /// QEMU reported a reset since the last boot began (it reports one
    /// reset as several `RESET` events; the first is when it happened).
    reset_reported: bool,
    boots: Vec<Boot>,
}

impl Boots {
    fn new(started: Instant) -> Boots {
        Boots {
            pending_reset: Some(started),
            reset_reported: false,
            boots: Vec::new(),
        }
    }

    fn see(&mut self, t: Instant, line: &str) {
        if line
            .strip_prefix(QEMU_EVENT)
            .is_some_and(|e| e.starts_with("RESET"))
        {
            // QEMU's own word: whatever reset the machine (the kernel, a
            // panic, the hardware watchdog), it happened now.
            if !self.reset_reported {
                self.pending_reset = Some(t);
                self.reset_reported = true;
            }
        } else if !self.reset_reported {
            // The kernel's announcement, for a QEMU whose events were not
            // read.
            if line.contains("reboot: Restarting system") || line.contains("reboot: Power down") {
                self.pending_reset = Some(t);
            }
            if let Some(rest) = line.split("Rebooting in ").nth(1) {
                // A kernel panic: the reset comes after the announced delay.
                let secs: u64 = rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                self.pending_reset = Some(t + Duration::from_secs(secs));
            }
        }
        if line.contains(BOOTLOADER_MARK) {
            self.reset_reported = false;
            let reset = self
                .pending_reset
                .take()
                .or_else(|| self.boots.last().and_then(|b| b.userspace))
                .unwrap_or(t);
            self.boots.push(Boot {
                reset: reset.min(t),
                grub: t,
                userspace: None,
                slot: None,
                version: None,
            });
        }
        if let Some(rest) = line.split(USERSPACE_MARK).nth(1) {
            if let Some(b) = self.boots.last_mut() {
                b.userspace = Some(t);
                b.slot = field(rest, "slot");
                b.version = field(rest, "version");
            }
        }
    }
}

impl Vm {
    /// Start `machine`'s QEMU on `disk` (and `flash`, the U-Boot
    /// environment's flash image), its console logged to `log`.
    pub fn start(
        machine: &Machine,
        name: &str,
        disk: &Path,
        flash: &Path,
        log: &Path,
    ) -> Result<Vm> {
        Vm::start_with(machine, name, disk, flash, log, &[])
    }

    /// [`Vm::start`] with `extra` arguments for QEMU (a TPM's devices).
    pub fn start_with(
        machine: &Machine,
        name: &str,
        disk: &Path,
        flash: &Path,
        log: &Path,
        extra: &[OsString],
    ) -> Result<Vm> {
        // In the temporary directory: a socket's path must stay short.
        let qmp = std::env::temp_dir().join(format!(
            "updraft-vm-{}-{}.qmp",
            std::process::id(),
            QMP_SOCKETS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&qmp);
        let mut cmd = Command::new(machine.qemu);
        cmd.args(machine.qemu_args(disk, flash))
            .args(extra)
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let qemu = machine.qemu;
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "starting {qemu}: {e} (Debian package {})",
                machine.qemu_package
            )
        })?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| format!("{qemu} has no stdout pipe"))?;
        let stderr = child.stderr.take();
        let stdin = child.stdin.take();
        let file =
            std::fs::File::create(log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let log_file = Log {
            file: Arc::new(Mutex::new(file)),
            started,
        };
        let (tx, rx) = channel();
        let err_tx = tx.clone();
        let qmp_tx = tx.clone();
        let (out_log, err_log, qmp_log) = (log_file.clone(), log_file.clone(), log_file);
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let now = Instant::now();
                        let line = clean(&buf);
                        if ECHO.load(Ordering::Relaxed) {
                            println!("   | {}", shown(&line));
                        }
                        out_log.write(now, &line);
                        if tx.send((now, line)).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        if let Some(e) = stderr {
            std::thread::spawn(move || {
                for line in BufReader::new(e).lines().map_while(|l| l.ok()) {
                    let now = Instant::now();
                    let line = format!("qemu: {line}");
                    err_log.write(now, &line);
                    if err_tx.send((now, line)).is_err() {
                        break;
                    }
                }
            });
        }
        let socket = qmp.clone();
        std::thread::spawn(move || qmp_events(&socket, &qmp_tx, &qmp_log));
        Ok(Vm {
            name: name.to_string(),
            child,
            stdin,
            lines: rx,
            log_path: log.to_path_buf(),
            qmp,
            started,
            seen: Vec::new(),
            boots: Boots::new(started),
            exited: false,
        })
    }

    pub fn boots(&self) -> &[Boot] {
        &self.boots.boots
    }

    /// When QEMU started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Every console line so far.
    pub fn lines(&self) -> &[String] {
        &self.seen
    }

    /// The line index the next line will have; with [`Vm::lines`], what
    /// came after a point.
    pub fn mark(&self) -> usize {
        self.seen.len()
    }

    fn take(&mut self, t: Instant, line: String) {
        self.boots.see(t, &line);
        self.seen.push(line);
    }

    /// Wait until a console line (from index `from` on) satisfies `pred`;
    /// its text. Fails after `timeout`, or when QEMU exits first, with the
    /// console's tail.
    pub fn wait_line(
        &mut self,
        what: &str,
        from: usize,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> Result<String> {
        if let Some(l) = self.seen.iter().skip(from).find(|l| pred(l)) {
            return Ok(l.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((t, line)) => {
                    let hit = pred(&line);
                    self.take(t, line.clone());
                    if hit {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failure(&format!(
                        "timed out after {:.0} s waiting for {what}",
                        timeout.as_secs_f64()
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.exited = true;
                    let status = self.child.wait().ok();
                    return Err(self.failure(&format!(
                        "qemu exited ({}) while waiting for {what}",
                        status.map(|s| s.to_string()).unwrap_or_default()
                    )));
                }
            }
        }
    }

    /// Take in the lines that arrived so far without waiting.
    pub fn drain(&mut self) {
        while let Ok((t, line)) = self.lines.try_recv() {
            self.take(t, line);
        }
    }

    /// Type a line into the console.
    pub fn send(&mut self, line: &str) -> Result {
        let stdin = self.stdin.as_mut().ok_or("the console's input is closed")?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("typing {line:?} into the console of {}: {e}", self.name))
    }

    /// Wait for QEMU to exit on its own (the guest powered off), reading
    /// the console to its end.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((t, line)) => self.take(t, line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failure("timed out waiting for qemu to exit"));
                }
            }
        }
        self.exited = true;
        let status = self
            .child
            .wait()
            .map_err(|e| format!("waiting for qemu: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(self.failure(&format!("qemu exited with {status}")))
        }
    }

    /// Cut the power: SIGKILL the QEMU process this VM started (by its
    /// PID). What the guest had only in its page cache is lost, as on a
    /// real power failure; what it had handed to the host's disk image
    /// stays. The console lines that arrived before are kept.
    pub fn power_cut(&mut self) -> Result {
        self.drain();
        if self.exited {
            return Ok(());
        }
        self.child
            .kill()
            .map_err(|e| format!("killing qemu ({}): {e}", self.name))?;
        let _ = self.child.wait();
        self.exited = true;
        self.drain();
        Ok(())
    }

    /// The error for `what`, with the console's last lines.
    pub fn failure(&self, what: &str) -> String {
        let tail: Vec<&str> = self
            .seen
            .iter()
            .rev()
            .take(TAIL)
            .rev()
            .map(String::as_str)
            .collect();
        format!(
            "{}: {what}\n--- the console's last {} lines (all of it in {}) ---\n{}\n---",
            self.name,
            tail.len(),
            self.log_path.display(),
            tail.join("\n")
        )
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if !self.exited {
            // The QEMU process this VM started, by its PID.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.qmp);
    }
}

/// The console log, written by the threads reading QEMU's output and
/// events, each line with its time since QEMU started.
#[derive(Clone)]
struct Log {
    file: Arc<Mutex<std::fs::File>>,
    started: Instant,
}

impl Log {
    fn write(&self, t: Instant, line: &str) {
        if let Ok(mut f) = self.file.lock() {
            let _ = writeln!(
                f,
                "[{:8.3}] {line}",
                t.duration_since(self.started).as_secs_f64()
            );
        }
    }
}

/// Read QEMU's QMP events from `socket` until QEMU ends, each sent (and
/// logged) as a [`QEMU_EVENT`] line. A socket that never answers is
/// reported as a line too: then no event line comes.
fn qmp_events(socket: &Path, tx: &Sender<(Instant, String)>, log: &Log) {
    let send = |line: String| {
        let now = Instant::now();
        log.write(now, &line);
        tx.send((now, line)).is_ok()
    };
    // QEMU makes the socket before it runs the machine; allow it a while
    // on a loaded host.
    let deadline = Instant::now() + Duration::from_secs(30);
    let stream = loop {
        match UnixStream::connect(socket) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                send(format!(
                    "qemu: qmp: cannot connect to {}: {e}",
                    socket.display()
                ));
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let Ok(mut writer) = stream.try_clone() else {
        send("qemu: qmp: cannot use the socket".into());
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut greeting = String::new();
    // The greeting, then the capabilities negotiation that starts events.
    if reader.read_line(&mut greeting).is_err()
        || writer
            .write_all(b"{\"execute\": \"qmp_capabilities\"}\n")
            .is_err()
    {
        send("qemu: qmp: no greeting".into());
        return;
    }
    for line in reader.lines().map_while(|l| l.ok()) {
        if let Some(event) = qmp_event_line(&line) {
            if !send(event) {
                break;
            }
        }
    }
}

/// The [`QEMU_EVENT`] line of one QMP message; `None` for a reply.
fn qmp_event_line(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let name = v["event"].as_str()?;
    let data = match &v["data"] {
        serde_json::Value::Null => String::new(),
        d => format!(" {d}"),
    };
    Some(format!("{QEMU_EVENT}{name}{data}"))
}

/// `key=value` out of a marker line.
/// A console line as `demo --vm` prints it: the whole status the guest
/// prints for the harness is shortened to its state.
fn shown(line: &str) -> String {
    match line.split_once("status {") {
        Some((head, rest)) => {
            let state = rest
                .split_once("\"state\": \"")
                .and_then(|(_, s)| s.split_once('"'))
                .map_or("?", |(s, _)| s);
            format!("{head}status (state {state}; the whole JSON is in the console log)")
        }
        None => line.to_string(),
    }
}

fn field(text: &str, key: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
}

/// A console line without its carriage returns and terminal escape
/// sequences (GRUB draws its menu with them).
fn clean(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                // ESC [ params final, or ESC and one more character.
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\r' | '\n' => {}
            c if c.is_control() && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_carriage_returns_are_dropped() {
        assert_eq!(
            clean(b"\x1b[2J\x1b[0;0H  Booting `updraft slot A'\r\n"),
            "  Booting `updraft slot A'"
        );
        assert_eq!(clean(b"plain\n"), "plain");
    }

    #[test]
    fn boots_are_timed_from_the_reset_that_started_them() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut b = Boots::new(t0);
        b.see(at(1), BOOTLOADER_MARK);
        b.see(
            at(6),
            &format!("{USERSPACE_MARK} slot=A version=1.0 uptime=3.1"),
        );
        b.see(at(20), "[   14.9] reboot: Restarting system");
        b.see(at(21), BOOTLOADER_MARK);
        b.see(
            at(29),
            &format!("{USERSPACE_MARK} slot=B version=2.0 uptime=2.8"),
        );
        b.see(at(40), "[    2.8] Rebooting in 5 seconds..");
        b.see(at(46), BOOTLOADER_MARK);
        let got: Vec<_> = b
            .boots
            .iter()
            .map(|b| {
                (
                    b.slot.clone(),
                    b.version.clone(),
                    b.to_userspace(),
                    b.to_grub(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Some("A".into()),
                    Some("1.0".into()),
                    Some(Duration::from_secs(6)),
                    Duration::from_secs(1)
                ),
                (
                    Some("B".into()),
                    Some("2.0".into()),
                    Some(Duration::from_secs(9)),
                    Duration::from_secs(1)
                ),
                (None, None, None, Duration::from_secs(1)),
            ]
        );
    }

    #[test]
    fn a_reset_is_timed_from_qemus_first_reset_event() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = Boots::new(t0);
        b.see(at(1000), BOOTLOADER_MARK);
        b.see(
            at(6000),
            &format!("{USERSPACE_MARK} slot=A version=4.1 uptime=3.1"),
        );
        // A hang: the kernel says nothing; the watchdog resets the machine.
        b.see(
            at(27000),
            &format!("{QEMU_EVENT}WATCHDOG {{\"action\":\"reset\"}}"),
        );
        b.see(at(27002), &format!("{QEMU_EVENT}RESET {{\"guest\":true}}"));
        b.see(at(27050), &format!("{QEMU_EVENT}RESET {{\"guest\":true}}"));
        b.see(at(28000), BOOTLOADER_MARK);
        b.see(
            at(33002),
            &format!("{USERSPACE_MARK} slot=B version=2.0 uptime=2.8"),
        );
        // A panic announced with its delay, then QEMU's event: the event
        // is when it happened.
        b.see(at(40000), "[    2.8] Rebooting in 5 seconds..");
        b.see(at(46000), &format!("{QEMU_EVENT}RESET {{\"guest\":true}}"));
        b.see(at(47000), BOOTLOADER_MARK);
        let got: Vec<_> = b.boots.iter().map(|b| b.reset.duration_since(t0)).collect();
        assert_eq!(
            got,
            [at(0), at(27002), at(46000)].map(|t| t.duration_since(t0))
        );
        assert_eq!(b.boots[1].to_userspace(), Some(Duration::from_secs(6)));
    }

    #[test]
    fn qmp_events_become_lines_and_replies_do_not() {
        assert_eq!(
            qmp_event_line(
                r#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "WATCHDOG", "data": {"action": "reset"}}"#
            )
            .as_deref(),
            Some(r#"qemu: event WATCHDOG {"action":"reset"}"#)
        );
        assert_eq!(
            qmp_event_line(r#"{"event": "STOP", "timestamp": {}}"#).as_deref(),
            Some("qemu: event STOP")
        );
        assert_eq!(qmp_event_line(r#"{"return": {}}"#), None);
        assert_eq!(qmp_event_line("not json"), None);
    }

    #[test]
    fn a_shown_status_line_keeps_only_its_state() {
        let line = r#"updraft-vm: status {  "state": "downloading",  "since": "x"}"#;
        assert_eq!(
            shown(line),
            "updraft-vm: status (state downloading; the whole JSON is in the console log)"
        );
        assert_eq!(
            shown("[    0.5] Linux version 6.1"),
            "[    0.5] Linux version 6.1"
        );
    }

    #[test]
    fn fields_come_out_of_marker_lines() {
        assert_eq!(
            field(" slot=B version=2.0 uptime=1", "version").as_deref(),
            Some("2.0")
        );
        assert_eq!(field(" slot=B", "version"), None);
    }
}
