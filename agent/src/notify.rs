//! systemd's service notification protocol (sd_notify(3)), spoken directly.
//!
//! Under `Type=notify` systemd passes a datagram socket in `$NOTIFY_SOCKET`
//! (a filesystem path, or `@name` for the abstract namespace) and waits for
//! `READY=1` before it considers the service started. With `WatchdogSec=` it
//! also sets `WATCHDOG_USEC` (and `WATCHDOG_PID`) and kills the service when
//! no `WATCHDOG=1` arrives within that interval. This module sends those
//! messages with one `sendto` each, without libsystemd.
//!
//! It owns only the wire protocol. When the variables are absent (not
//! started by systemd, or run from a shell) every call is a no-op. It must
//! never decide *when* to notify: readiness and the watchdog cadence belong
//! to the daemon loop, which pings at half of [`watchdog_interval`] (see
//! [`ping_interval`]) from the same thread that runs the state machine, so a
//! stuck loop stops the pings and systemd restarts it. A failed send is
//! logged and otherwise ignored: systemd's own timeouts are the backstop.
//!
//! Child processes (health checks, the reboot command) must not inherit
//! these variables; [`scrub`] removes them from a `Command`.

use std::ffi::OsStr;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::process::Command;
use std::time::Duration;

/// The environment variables systemd sets for this protocol.
pub const ENV_VARS: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Tell systemd the daemon is up: configuration read, state recovered,
/// control socket listening.
pub fn ready() {
    send_env("READY=1");
}

/// One line shown by `systemctl status` (e.g. "idle, next check in 28m").
/// Newlines and other control characters are replaced by spaces, so text
/// from outside (a release version) cannot smuggle in another assignment.
pub fn status(text: &str) {
    send_env(&status_message(text));
}

/// Tell systemd a clean shutdown has begun.
pub fn stopping() {
    send_env("STOPPING=1");
}

/// Keep-alive for `WatchdogSec=`.
pub fn watchdog() {
    send_env("WATCHDOG=1");
}

/// The watchdog interval systemd enforces on this process, if any: from
/// `WATCHDOG_USEC`, honoured only when `WATCHDOG_PID` is absent or names
/// this process (a child that inherited the variables must not ping).
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    interval_from(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// How often the daemon pings: half the enforced interval, as sd_watchdog_enabled(3)
/// recommends, so one late ping does not get the service killed.
pub fn ping_interval() -> Option<Duration> {
    watchdog_interval().map(|d| d / 2)
}

/// Remove the notification variables from a child's environment.
pub fn scrub(cmd: &mut Command) -> &mut Command {
    for v in ENV_VARS {
        cmd.env_remove(v);
    }
    cmd
}

fn send_env(message: &str) {
    let socket = std::env::var_os("NOTIFY_SOCKET");
    if let Err(e) = send(socket.as_deref(), message) {
        let socket = socket.as_deref().unwrap_or_default().to_string_lossy();
        log::warn!("sd_notify {message:?} to NOTIFY_SOCKET={socket}: {e}");
    }
}

/// Send `message` to the notification socket named by `socket` (the value
/// of `$NOTIFY_SOCKET`). `Ok(false)`: no socket, nothing sent.
fn send(socket: Option<&OsStr>, message: &str) -> io::Result<bool> {
    let Some(socket) = socket.filter(|s| !s.is_empty()) else {
        return Ok(false);
    };
    let addr = address(socket)?;
    let sock = UnixDatagram::unbound()?;
    let sent = sock.send_to_addr(message.as_bytes(), &addr)?;
    if sent != message.len() {
        return Err(io::Error::other(format!(
            "short send: {sent} of {} bytes",
            message.len()
        )));
    }
    Ok(true)
}

/// `@name` → abstract socket `name`; `/path` → filesystem socket. Anything
/// else is not a value systemd sets.
fn address(socket: &OsStr) -> io::Result<SocketAddr> {
    let bytes = socket.as_bytes();
    match bytes.first() {
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]),
        Some(b'/') => SocketAddr::from_pathname(socket),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an absolute path or @abstract name",
        )),
    }
}

fn status_message(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("STATUS={clean}")
}

fn interval_from(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok()? != own_pid {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;
    use std::path::PathBuf;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let d =
                std::env::temp_dir().join(format!("updraft-notify-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn receive(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn messages_reach_a_filesystem_socket() {
        let dir = TempDir::new("path");
        let path = dir.0.join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let socket = path.into_os_string();
        assert!(send(Some(&socket), "READY=1").unwrap());
        assert_eq!(receive(&listener), "READY=1");
        assert!(send(Some(&socket), &status_message("idle")).unwrap());
        assert_eq!(receive(&listener), "STATUS=idle");
    }

    #[test]
    fn messages_reach_an_abstract_socket() {
        let name = format!("updraft-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let socket = std::ffi::OsString::from_vec(format!("@{name}").into_bytes());
        assert!(send(Some(&socket), "WATCHDOG=1").unwrap());
        assert_eq!(receive(&listener), "WATCHDOG=1");
    }

    #[test]
    fn without_a_socket_nothing_is_sent() {
        assert!(!send(None, "READY=1").unwrap());
        assert!(!send(Some(OsStr::new("")), "READY=1").unwrap());
    }

    #[test]
    fn a_relative_socket_path_is_refused() {
        let e = send(Some(OsStr::new("run/notify")), "READY=1").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_vanished_socket_is_an_error_not_a_panic() {
        let dir = TempDir::new("gone");
        let socket = dir.0.join("nobody-listens").into_os_string();
        assert!(send(Some(&socket), "READY=1").is_err());
    }

    #[test]
    fn status_cannot_inject_other_assignments() {
        assert_eq!(status_message("v1\nREADY=1\r"), "STATUS=v1 READY=1 ");
        assert_eq!(
            status_message("downloading 2.0 (45%)"),
            "STATUS=downloading 2.0 (45%)"
        );
    }

    #[test]
    fn watchdog_interval_follows_systemd_variables() {
        assert_eq!(
            interval_from(Some("30000000"), None, 7),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            interval_from(Some("30000000"), Some("7"), 7),
            Some(Duration::from_secs(30))
        );
        // Inherited from a parent: not ours to ping.
        assert_eq!(interval_from(Some("30000000"), Some("8"), 7), None);
        assert_eq!(interval_from(None, None, 7), None);
        assert_eq!(interval_from(Some("0"), None, 7), None);
        assert_eq!(interval_from(Some("soon"), None, 7), None);
        assert_eq!(interval_from(Some("30000000"), Some("x"), 7), None);
    }

    #[test]
    fn scrub_removes_the_variables_from_children() {
        let mut cmd = Command::new("true");
        scrub(&mut cmd);
        let removed: Vec<_> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_owned())
            .collect();
        for v in ENV_VARS {
            assert!(
                removed.iter().any(|k| k == v),
                "{v} not removed: {removed:?}"
            );
        }
    }
}
