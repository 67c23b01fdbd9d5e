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
//! The server never blocks the daemon: connections are non-blocking, each
//! with its own buffer, read and written a piece at a time whenever the
//! daemon's `poll(2)` says so. A request must be complete within 2 s and
//! fit in 64 KiB, a reply must be taken within 2 s, or the connection is
//! dropped; at most 8 connections are held at once and the last slot is
//! only for root, so local users holding connections open can neither
//! stall the daemon nor keep root out. A complete request is either
//! answered at once (status) or handed to the daemon's queue, which
//! answers when the work is done. This module owns the wire format, the
//! connection limits and the permission check; what a request *does* is
//! the daemon's business, and it must never wait for a client.

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::poll::PollFlags;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Kind, Result};
use crate::fsutil::ensure_dir;
use crate::status::Status;
use crate::store::HistoryEntry;
use crate::{bail, err};

/// Largest request line accepted.
const MAX_REQUEST: usize = 64 * 1024;

/// How long a client may take to send its whole request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// How long a client may take to read its reply.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(2);

/// Connections held at once; the last one is kept for root.
pub const MAX_CONNECTIONS: usize = 8;

/// Refused connections are logged at most this often.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// A request from a client.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Status,
    History,
    Check,
    Install {
        manifest: String,
    },
    MarkGood,
    MarkBad,
    /// Switch in and reboot into a slot the policy holds.
    Apply,
    /// Stop the update in progress (before its reboot), or reject the
    /// release under test.
    Cancel,
    /// Follow another channel (`None`: the configuration's again).
    Channel {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
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
            Request::Apply => "apply",
            Request::Cancel => "cancel",
            Request::Channel { .. } => "channel",
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
    /// For check and install: what the check led to (`started`,
    /// `no-change`, `running`, `declined`, `held`, `applied`; `busy` when
    /// an update was in progress already). Absent from daemons before 0.1's exit
    /// statuses: the client then takes `started` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
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
    let reply: Reply = serde_json::from_slice(text.as_bytes())
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
        Store, Busy, Io, Health, Stopped, Denied, Degraded,
    ]
    .into_iter()
    .find(|k| k.as_str() == s)
    .unwrap_or(Io)
}

// ---- server -------------------------------------------------------------------

/// Replies waiting for their client to read them, shared by the server
/// and the [`Client`]s it handed out (the daemon answers some requests
/// long after they were read).
type Outbox = Rc<RefCell<Vec<Outgoing>>>;

/// A reply partly written.
struct Outgoing {
    stream: UnixStream,
    uid: Option<u32>,
    data: Vec<u8>,
    sent: usize,
    deadline: Instant,
}

/// A connection whose request is still arriving.
struct Incoming {
    stream: UnixStream,
    uid: Option<u32>,
    buf: Vec<u8>,
    deadline: Instant,
}

/// A connected client whose request was read.
pub struct Client {
    stream: UnixStream,
    pub uid: u32,
    pub request: Request,
    outbox: Outbox,
}

impl Client {
    /// Answer and close. Never blocks: what the socket does not take at
    /// once is written later by the server, until [`REPLY_DEADLINE`].
    pub fn reply(self, reply: &Reply) {
        send(self.stream, Some(self.uid), encode(reply), &self.outbox);
    }
}

fn encode(reply: &Reply) -> Vec<u8> {
    let mut line = match serde_json::to_vec(reply) {
        Ok(l) => l,
        Err(e) => format!("{{\"ok\":false,\"error\":\"encoding reply: {e}\"}}").into_bytes(),
    };
    line.push(b'\n');
    line
}

/// Write what the socket takes now; keep the rest in `outbox`.
fn send(stream: UnixStream, uid: Option<u32>, data: Vec<u8>, outbox: &Outbox) {
    let mut out = Outgoing {
        stream,
        uid,
        data,
        sent: 0,
        deadline: Instant::now() + REPLY_DEADLINE,
    };
    if !out.flush() {
        outbox.borrow_mut().push(out);
    }
}

impl Outgoing {
    /// Write without blocking; true when done (written, or the peer is
    /// gone).
    fn flush(&mut self) -> bool {
        while self.sent < self.data.len() {
            match (&self.stream).write(&self.data[self.sent..]) {
                Ok(0) => return true,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The client went away: nothing left to tell it.
                Err(_) => return true,
            }
        }
        true
    }
}

/// What reading a connection came to.
enum Arrived {
    Pending,
    Done(Request),
    /// The peer closed without sending anything (a probe).
    Gone,
    Bad(String),
}

impl Incoming {
    /// Read what has arrived, without blocking.
    fn read(&mut self) -> Arrived {
        let mut chunk = [0u8; 4096];
        loop {
            match (&self.stream).read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Arrived::Gone,
                Ok(0) => return Arrived::Bad("request not terminated by a newline".into()),
                Ok(n) => {
                    let old = self.buf.len();
                    self.buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = self.buf[old..].iter().position(|&b| b == b'\n') {
                        let line = &self.buf[..old + i];
                        return match serde_json::from_slice::<Request>(line.trim_ascii()) {
                            Ok(r) => Arrived::Done(r),
                            Err(e) => Arrived::Bad(format!("bad request: {e}")),
                        };
                    }
                    if self.buf.len() > MAX_REQUEST {
                        return Arrived::Bad(format!("request longer than {MAX_REQUEST} bytes"));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Arrived::Pending,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Arrived::Bad(format!("reading the request: {e}")),
            }
        }
    }
}

/// The group to give the socket, when it does not have `wanted` already.
/// In a set-group-ID directory (`/run/updraft`, made by tmpfiles.d) the
/// socket is born with the directory's group, and no `chown` is made:
/// the unit's system call filter (`~@privileged`) refuses it with EPERM.
fn group_change(current: u32, wanted: u32) -> Option<u32> {
    (current != wanted).then_some(wanted)
}

/// The listening socket and the connections it holds.
///
/// Accepted connections are non-blocking and served a piece at a time
/// from the daemon's loop: a request is read as it arrives into the
/// connection's own buffer and must be complete within
/// [`REQUEST_DEADLINE`]; a reply is written as the client takes it, for
/// at most [`REPLY_DEADLINE`]. At most [`MAX_CONNECTIONS`] are held at
/// once, and the last of them only for root, so clients that never finish
/// cannot keep root out.
pub struct ControlServer {
    listener: UnixListener,
    path: std::path::PathBuf,
    incoming: Vec<Incoming>,
    outbox: Outbox,
    /// Connections refused for want of a slot since the last log line.
    refused: u64,
    refused_logged: Option<Instant>,
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
            let current = std::fs::metadata(path)
                .map_err(|e| err!(Io, "reading the owner of {}: {e}", path.display()))?
                .gid();
            if let Some(gid) = group_change(current, gid.as_raw()) {
                nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(gid))).map_err(
                    |e| {
                        err!(
                            Io,
                            "giving {} to group {g}: {e} (under the systemd unit, chown is \
                             outside its system call filter: the socket's directory must be \
                             set-group-ID with group {g}, as updraft.tmpfiles creates it)",
                            path.display()
                        )
                    },
                )?;
            }
        }
        Ok(ControlServer {
            listener,
            path: path.to_path_buf(),
            incoming: Vec::new(),
            outbox: Rc::new(RefCell::new(Vec::new())),
            refused: 0,
            refused_logged: None,
        })
    }

    /// The descriptors with pending work and the events they wait for:
    /// the listener, connections whose request is still arriving, replies
    /// the client has not taken yet. For `poll(2)`.
    pub fn poll_set(&self) -> Vec<(RawFd, PollFlags)> {
        let mut v = vec![(self.listener.as_raw_fd(), PollFlags::POLLIN)];
        v.extend(
            self.incoming
                .iter()
                .map(|c| (c.stream.as_raw_fd(), PollFlags::POLLIN)),
        );
        v.extend(
            self.outbox
                .borrow()
                .iter()
                .map(|o| (o.stream.as_raw_fd(), PollFlags::POLLOUT)),
        );
        v
    }

    /// The nearest time a held connection runs out of time.
    pub fn next_deadline(&self) -> Option<Instant> {
        let reading = self.incoming.iter().map(|c| c.deadline);
        let outbox = self.outbox.borrow();
        let writing = outbox.iter().map(|o| o.deadline);
        reading.chain(writing).min()
    }

    /// Connections held now (requests arriving, replies being written).
    fn held(&self) -> usize {
        self.incoming.len() + self.outbox.borrow().len()
    }

    /// Accept waiting connections, read what has arrived, write what
    /// clients will take, drop connections out of time. Returns the
    /// clients whose request is complete. Never blocks.
    pub fn accept_all(&mut self) -> Vec<Client> {
        let now = Instant::now();
        for _ in 0..32 {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream, now),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("control socket accept failed: {e}");
                    break;
                }
            }
        }
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.incoming.len() {
            let result = self.incoming[i].read();
            let expired = matches!(result, Arrived::Pending) && now >= self.incoming[i].deadline;
            if matches!(result, Arrived::Pending) && !expired {
                i += 1;
                continue;
            }
            let conn = self.incoming.swap_remove(i);
            match result {
                Arrived::Pending => log::warn!(
                    "control: dropped a client of {}: no complete request within {} ms ({} bytes received)",
                    who(conn.uid),
                    REQUEST_DEADLINE.as_millis(),
                    conn.buf.len()
                ),
                Arrived::Gone => {}
                Arrived::Bad(msg) => {
                    log::warn!("control: a client of {}: {msg}", who(conn.uid));
                    send(
                        conn.stream,
                        conn.uid,
                        encode(&Reply::error(&Error::new(Kind::Usage, msg))),
                        &self.outbox,
                    );
                }
                Arrived::Done(request) => match conn.uid {
                    Some(uid) => out.push(Client {
                        stream: conn.stream,
                        uid,
                        request,
                        outbox: self.outbox.clone(),
                    }),
                    None => send(
                        conn.stream,
                        None,
                        encode(&Reply::error(&Error::new(
                            Kind::Denied,
                            "cannot identify the peer (SO_PEERCRED)",
                        ))),
                        &self.outbox,
                    ),
                },
            }
        }
        self.outbox.borrow_mut().retain_mut(|o| {
            if o.flush() {
                return false;
            }
            if now >= o.deadline {
                log::warn!(
                    "control: dropped a client of {}: it did not read its reply within {} ms",
                    who(o.uid),
                    REPLY_DEADLINE.as_millis()
                );
                return false;
            }
            true
        });
        out
    }

    /// Hold a new connection, or refuse it when every slot it may use is
    /// taken.
    fn admit(&mut self, stream: UnixStream, now: Instant) {
        let uid = peer_uid(&stream);
        if let Err(e) = stream.set_nonblocking(true) {
            log::warn!("control: a client of {}: {e}", who(uid));
            return;
        }
        let limit = if uid == Some(0) {
            MAX_CONNECTIONS
        } else {
            MAX_CONNECTIONS - 1
        };
        if self.held() >= limit {
            self.refused += 1;
            let due = self
                .refused_logged
                .is_none_or(|t| now.duration_since(t) >= REFUSAL_LOG_EVERY);
            if due {
                log::warn!(
                    "control: refused {} connection(s), the last of {}: {} connections held, the last slot is kept for root",
                    self.refused,
                    who(uid),
                    self.held()
                );
                self.refused = 0;
                self.refused_logged = Some(now);
            }
            // Best effort: the refusal fits in the socket buffer.
            let mut out = Outgoing {
                stream,
                uid,
                data: encode(&Reply::error(&Error::new(
                    Kind::Busy,
                    "the daemon is serving too many clients; try again",
                ))),
                sent: 0,
                deadline: now,
            };
            out.flush();
            return;
        }
        self.incoming.push(Incoming {
            stream,
            uid,
            buf: Vec::new(),
            deadline: now + REQUEST_DEADLINE,
        });
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// "uid N" for log lines.
fn who(uid: Option<u32>) -> String {
    match uid {
        Some(u) => format!("uid {u}"),
        None => "an unidentified peer".into(),
    }
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
    fn a_socket_born_with_its_group_is_not_chowned() {
        // The unit's system call filter refuses chown: a socket that has
        // the group from its set-group-ID directory must not need one.
        assert_eq!(group_change(997, 997), None);
        assert_eq!(group_change(0, 997), Some(997));
    }

    #[test]
    fn a_socket_in_a_set_group_id_directory_has_the_directory_group() {
        let dir = std::env::temp_dir().join(format!("updraft-sock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let gid = nix::unistd::getegid();
        let name = nix::unistd::Group::from_gid(gid).unwrap().unwrap().name;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2750)).unwrap();
        let sock = dir.join("updraft.sock");
        let server = ControlServer::bind(&sock, Some(&name)).unwrap();
        assert_eq!(std::fs::metadata(&sock).unwrap().gid(), gid.as_raw());
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

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
            Request::Apply,
            Request::Cancel,
            Request::History,
            Request::Channel { name: None },
            Request::Channel {
                name: Some("beta".into()),
            },
        ] {
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        }
        assert_eq!(
            serde_json::to_string(&Request::MarkGood).unwrap(),
            r#"{"cmd":"mark-good"}"#
        );
        assert!(!Request::Status.changes_state());
        // Changing the channel is root's, like every other change.
        assert!(Request::Channel { name: None }.changes_state());
        assert!(
            Request::Channel {
                name: Some("beta".into())
            }
            .changes_state()
        );
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
