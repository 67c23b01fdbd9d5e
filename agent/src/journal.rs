//! journald's native protocol: an entry as fields in one datagram to
//! `/run/systemd/journal/socket`, as systemd's "Native Journal Protocol"
//! document specifies it.
//!
//! Why not stderr alone: a line on the stream journald gives a service
//! carries a priority and a message, nothing more; the fields operators and
//! log shippers filter on (`MESSAGE_ID`, the release, the slot) travel only
//! through this socket. [`crate::logging`] uses it under systemd and falls
//! back to its stderr line when a datagram cannot be sent.
//!
//! Encoding: each field is `NAME=value\n`; a value holding a newline is
//! sent as `NAME\n`, its length as 64-bit little-endian, the bytes and
//! `\n`. Names are uppercase letters, digits and underscores, not starting
//! with an underscore (those are journald's own trusted fields).
//!
//! This module owns the encoding and the socket. It never decides what is
//! logged, and never blocks: the socket is non-blocking and a full journal
//! loses the entry to the caller's fallback, never stalls the daemon.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// Where journald listens for native entries.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// A connected, non-blocking journal socket.
pub struct Journal {
    socket: UnixDatagram,
}

impl Journal {
    /// Connect to the journal socket at `path`.
    pub fn connect(path: &Path) -> io::Result<Journal> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(path)?;
        socket.set_nonblocking(true)?;
        Ok(Journal { socket })
    }

    /// A journal over an already connected datagram socket.
    pub fn from_socket(socket: UnixDatagram) -> io::Result<Journal> {
        socket.set_nonblocking(true)?;
        Ok(Journal { socket })
    }

    /// Send one entry. An error (a full journal, an entry larger than a
    /// datagram) means it was not logged.
    pub fn send(&self, fields: &[(&str, &str)]) -> io::Result<()> {
        let datagram = encode(fields)?;
        let sent = self.socket.send(&datagram)?;
        if sent != datagram.len() {
            return Err(io::Error::other(format!(
                "journal took {sent} of {} bytes",
                datagram.len()
            )));
        }
        Ok(())
    }
}

/// A field name journald accepts from a client: 1-64 of `A-Z`, `0-9`,
/// `_`, not starting with `_` or a digit.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && !b[0].is_ascii_digit()
        && b[0] != b'_'
        && b.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
}

/// One entry's datagram. Refuses a field name journald would drop.
pub fn encode(fields: &[(&str, &str)]) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    for (name, value) in fields {
        if !valid_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} is not a journal field name"),
            ));
        }
        out.extend_from_slice(name.as_bytes());
        if value.contains('\n') {
            out.push(b'\n');
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
            out.extend_from_slice(value.as_bytes());
        } else {
            out.push(b'=');
            out.extend_from_slice(value.as_bytes());
        }
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_lines_and_a_value_with_a_newline_carries_its_length() {
        type Fields<'a> = &'a [(&'a str, &'a str)];
        let rows: [(Fields, &[u8]); 4] = [
            (&[], b""),
            (&[("MESSAGE", "hello")], b"MESSAGE=hello\n"),
            (
                &[("PRIORITY", "6"), ("MESSAGE", "a=b")],
                b"PRIORITY=6\nMESSAGE=a=b\n",
            ),
            (
                &[("UPDRAFT_REASON", "x\ny")],
                b"UPDRAFT_REASON\n\x03\0\0\0\0\0\0\0x\ny\n",
            ),
        ];
        for (fields, want) in rows {
            assert_eq!(encode(fields).expect("encodes"), want, "{fields:?}");
        }
    }

    #[test]
    fn names_journald_would_drop_are_refused() {
        for (name, ok) in [
            ("MESSAGE", true),
            ("UPDRAFT_SLOT", true),
            ("CODE_LINE", true),
            ("A1", true),
            ("", false),
            ("_PID", false),
            ("1ABC", false),
            ("message", false),
            ("MESS AGE", false),
            ("MESSAGE=", false),
            (&"A".repeat(65), false),
        ] {
            assert_eq!(valid_name(name), ok, "{name:?}");
            assert_eq!(encode(&[(name, "v")]).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn an_entry_arrives_as_one_datagram() {
        let (a, b) = UnixDatagram::pair().expect("socketpair");
        let j = Journal::from_socket(a).expect("journal");
        j.send(&[("MESSAGE", "committed"), ("UPDRAFT_SLOT", "B")])
            .expect("sent");
        let mut buf = [0u8; 256];
        let n = b.recv(&mut buf).expect("received");
        assert_eq!(&buf[..n], b"MESSAGE=committed\nUPDRAFT_SLOT=B\n");
    }

    #[test]
    fn a_full_journal_is_an_error_not_a_wait() {
        let (a, _b) = UnixDatagram::pair().expect("socketpair");
        let j = Journal::from_socket(a).expect("journal");
        let big = "x".repeat(4096);
        let mut refused = false;
        // The peer never reads: its queue fills and the send fails at once.
        for _ in 0..100_000 {
            if j.send(&[("MESSAGE", &big)]).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused, "a send into a full queue must fail, not block");
    }
}
