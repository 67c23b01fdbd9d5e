//! The local control socket: protocol, server and client.
//!
//! A Unix stream socket (`system.socket`, default
//! `/run/updraft/updraft.sock`) speaking line-delimited JSON: one request
//! line, one response line. It is the only way in to a running daemon; there
//! is no network listener. The socket file is mode 0660 (group
//! `system.socket_group`), read-only requests (`status`, `history`) are open
//! to anyone who can connect, and requests that change anything (`check`,
//! `install`, `mark-good`, `mark-bad`) are refused unless the peer is root,
//! checked with `SO_PEERCRED` — never with anything the client says.
//!
//! The server never blocks the daemon: it accepts without waiting, reads a
//! request with a short timeout and a size cap, and either answers at once
//! (status) or hands the request to the daemon's queue, which answers when
//! the work is done. This module owns the wire format and the permission
//! check; what a request *does* is the daemon's business.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Kind, Result};
use crate::fsutil::ensure_dir;
use crate::status::Status;
use crate::store::HistoryEntry;
use crate::{bail, err};

/// Largest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;

/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// A request from a client.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Status,
    History,
    Check,
    Install { manifest: String },
    MarkGood,
    MarkBad,
}

impl Request {
    /// The command name, as typed on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::History => "history",
            Request::Check => "check",
            Request::Install { .. } => "install",
            Request::MarkGood => "mark-good",
            Request::MarkBad => "mark-bad",
        }
    }

    /// Requests that change state: root only.
    pub fn changes_state(&self) -> bool {
        !matches!(self, Request::Status | Request::History)
    }
}

/// A response to a client.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<HistoryEntry>>,
    /// For install: whether a job was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<bool>,
}

impl Reply {
    pub fn ok(message: impl Into<String>) -> Reply {
        Reply {
            ok: true,
            message: Some(message.into()),
            ..Reply::default()
        }
    }

    pub fn error(e: &Error) -> Reply {
        Reply {
            ok: false,
            error: Some(e.to_string()),
            kind: Some(e.kind().as_str().into()),
            ..Reply::default()
        }
    }
}

// ---- client -------------------------------------------------------------------

/// Send `req` to the daemon. `Ok(None)` when no daemon listens at `path`;
/// an error reply becomes an `Err` with the daemon's message.
pub fn try_request(path: &Path, req: &Request) -> Result<Option<Reply>> {
    let mut stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => bail!(Io, "connecting to the daemon at {}: {e}", path.display()),
    };
    // Install and check answer after the manifest was fetched and verified.
    let wait = match req {
        Request::Install { .. } | Request::Check => Duration::from_secs(600),
        _ => Duration::from_secs(10),
    };
    stream.set_read_timeout(Some(wait))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut line = serde_json::to_vec(req).map_err(|e| err!(Io, "encoding request: {e}"))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| err!(Io, "sending to the daemon: {e}"))?;
    let mut reader = BufReader::new(stream.take(64 * 1024 * 1024));
    let mut text = String::new();
    reader
        .read_line(&mut text)
        .map_err(|e| err!(Io, "reading the daemon's answer: {e}"))?;
    if text.trim().is_empty() {
        bail!(Io, "the daemon closed the connection without answering");
    }
    let reply: Reply = serde_json::from_str(&text)
        .map_err(|e| err!(Io, "the daemon's answer is not valid: {e}"))?;
    if !reply.ok {
        let kind = reply.kind.as_deref().map(kind_from_str).unwrap_or(Kind::Io);
        return Err(Error::new(
            kind,
            reply
                .error
                .unwrap_or_else(|| "the daemon refused the request".into()),
        ));
    }
    Ok(Some(reply))
}

fn kind_from_str(s: &str) -> Kind {
    use Kind::*;
    [
        Config, Usage, Signature, Policy, Integrity, Malformed, Clock, Network, Slot, Bootloader,
        Store, Busy, Io, Health, Stopped, Denied,
    ]
    .into_iter()
    .find(|k| k.as_str() == s)
    .unwrap_or(Io)
}

// ---- server -------------------------------------------------------------------

/// A connected client whose request was read.
pub struct Client {
    stream: UnixStream,
    pub uid: u32,
    pub request: Request,
}

impl Client {
    /// Answer and close.
    pub fn reply(mut self, reply: &Reply) {
        let mut line = match serde_json::to_vec(reply) {
            Ok(l) => l,
            Err(e) => format!("{{\"ok\":false,\"error\":\"encoding reply: {e}\"}}").into_bytes(),
        };
        line.push(b'\n');
        let _ = self.stream.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = self.stream.write_all(&line);
    }
}

/// The listening socket.
pub struct ControlServer {
    listener: UnixListener,
    path: std::path::PathBuf,
}

impl ControlServer {
    /// Bind the socket, replacing a stale file left by a previous process.
    pub fn bind(path: &Path, group: Option<&str>) -> Result<ControlServer> {
        if let Some(dir) = path.parent() {
            ensure_dir(dir, 0o755)?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                bail!(Busy, "another daemon is answering on {}", path.display());
            }
            std::fs::remove_file(path)
                .map_err(|e| err!(Io, "removing stale socket {}: {e}", path.display()))?;
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| err!(Io, "binding control socket {}: {e}", path.display()))?;
        listener.set_nonblocking(true)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
        if let Some(g) = group {
            let gid = nix::unistd::Group::from_name(g)
                .map_err(|e| err!(Config, "looking up system.socket_group {g:?}: {e}"))?
                .ok_or_else(|| err!(Config, "system.socket_group {g:?} does not exist"))?
                .gid;
            nix::unistd::chown(path, None, Some(gid))
                .map_err(|e| err!(Io, "giving {} to group {g}: {e}", path.display()))?;
        }
        Ok(ControlServer {
            listener,
            path: path.to_path_buf(),
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Accept every waiting connection and read its request. Clients that
    /// send nothing valid in time get an error reply and are dropped.
    pub fn accept_all(&self) -> Vec<Client> {
        let mut out = Vec::new();
        for _ in 0..32 {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Some(c) = read_client(stream) {
                        out.push(c);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("control socket accept failed: {e}");
                    break;
                }
            }
        }
        out
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn read_client(stream: UnixStream) -> Option<Client> {
    let uid = peer_uid(&stream);
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
    let started = Instant::now();
    let mut reader = BufReader::new((&stream).take(MAX_REQUEST));
    let mut line = String::new();
    let read = reader.read_line(&mut line);
    let fail = |stream: UnixStream, msg: String| {
        Client {
            stream,
            uid: u32::MAX,
            request: Request::Status,
        }
        .reply(&Reply::error(&Error::new(Kind::Usage, msg)));
        None
    };
    if let Err(e) = read {
        return fail(stream, format!("reading the request: {e}"));
    }
    if !line.ends_with('\n') && started.elapsed() < REQUEST_TIMEOUT {
        return fail(
            stream,
            format!("request longer than {MAX_REQUEST} bytes or not terminated"),
        );
    }
    let request: Request = match serde_json::from_str(line.trim()) {
        Ok(r) => r,
        Err(e) => return fail(stream, format!("bad request: {e}")),
    };
    let Some(uid) = uid else {
        return fail(stream, "cannot identify the peer (SO_PEERCRED)".into());
    };
    Some(Client {
        stream,
        uid,
        request,
    })
}

/// The peer's uid from `SO_PEERCRED`.
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// Refuse a state-changing request from a non-root peer.
pub fn authorize(client: &Client) -> Result<()> {
    if client.request.changes_state() && client.uid != 0 {
        bail!(
            Denied,
            "permission denied: `updraft {}` changes the device and is for root only (you are uid {})",
            client.request.name(),
            client.uid
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Status,
            Request::Check,
            Request::Install {
                manifest: "https://h/m.json".into(),
            },
            Request::MarkGood,
            Request::MarkBad,
            Request::History,
        ] {
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        }
        assert_eq!(
            serde_json::to_string(&Request::MarkGood).unwrap(),
            r#"{"cmd":"mark-good"}"#
        );
        assert!(!Request::Status.changes_state());
        assert!(
            Request::Install {
                manifest: String::new()
            }
            .changes_state()
        );
    }

    #[test]
    fn no_daemon_is_none() {
        let p = std::env::temp_dir().join(format!("updraft-nosock-{}", std::process::id()));
        assert!(try_request(&p, &Request::Status).unwrap().is_none());
    }
}
