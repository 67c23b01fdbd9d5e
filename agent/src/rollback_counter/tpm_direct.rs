//! The rollback floor in a TPM 2.0 NV counter spoken to directly
//! (`rollback.access = "direct"`): the commands of [`super::tpm_wire`]
//! written to the kernel's TPM character device (`device:/dev/tpmrm0`:
//! one command written, one response read) or to a software TPM's data
//! channel (`swtpm:host=…,port=…` over TCP, `swtpm:path=…` over a unix
//! socket: the same bytes as a stream, the response's size from its
//! header).
//!
//! Why: a device image without tpm2-tools and their TPM software stack
//! still has the floor; the index, its type and the empty password it is
//! read and incremented with are the same as through the tools
//! ([`super::tpm2`]), so a device may switch between the two.
//!
//! This module reads and increments the one index configured; it never
//! defines, undefines or writes any other, never sends a command other
//! than the three of [`super::tpm_wire`], and never trusts a response
//! before that module has parsed it.

use std::io::{Read, Write};
use std::time::Duration;

use super::tpm_wire::{self as wire, WireError};
use super::{COMMAND_TIMEOUT, Counter, tpm2};
use crate::config::{TpmTransport as Transport, tpm_transport as parse_tcti};
use crate::error::{Error, Kind, Result};

impl Transport {
    /// Send `command`, return the response's bytes (not yet parsed).
    fn exchange(&self, command: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Transport::Device(path) => {
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)?;
                f.write_all(command)?;
                // The device hands the whole response to one read.
                let mut buf = vec![0u8; wire::MAX_RESPONSE];
                let n = f.read(&mut buf)?;
                buf.truncate(n);
                Ok(buf)
            }
            Transport::Tcp(host, port) => {
                use std::net::ToSocketAddrs;
                let addr = (host.as_str(), *port)
                    .to_socket_addrs()?
                    .next()
                    .ok_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                    })?;
                let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                s.set_read_timeout(Some(COMMAND_TIMEOUT))?;
                s.set_write_timeout(Some(COMMAND_TIMEOUT))?;
                stream_exchange(s, command)
            }
            Transport::Unix(path) => {
                let s = std::os::unix::net::UnixStream::connect(path)?;
                s.set_read_timeout(Some(COMMAND_TIMEOUT))?;
                s.set_write_timeout(Some(COMMAND_TIMEOUT))?;
                stream_exchange(s, command)
            }
        }
    }
}

/// A command and its response over a byte stream: the header, then as
/// many bytes as it announces.
fn stream_exchange(mut s: impl Read + Write, command: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(command)?;
    let mut resp = vec![0u8; wire::HEADER];
    s.read_exact(&mut resp)?;
    let size = wire::announced_size(&resp)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    resp.resize(size, 0);
    s.read_exact(&mut resp[wire::HEADER..])?;
    Ok(resp)
}

/// A command that failed: the TPM's response code, if it sent one, and
/// the error naming the command, the index and the code.
struct Failed(Option<u32>, Error);

pub struct Tpm2Direct {
    index: u32,
    tcti: String,
    transport: std::result::Result<Transport, String>,
    /// The index was found defined, of type counter, 8 bytes, since the
    /// last failure: looked at again after any failure.
    checked: bool,
}

impl Tpm2Direct {
    pub fn new(index: u32, tcti: &str) -> Tpm2Direct {
        Tpm2Direct {
            index,
            tcti: tcti.to_string(),
            transport: parse_tcti(tcti),
            checked: false,
        }
    }

    /// Run one command and parse its response with `parse`; a response
    /// code asking for it again is retried a few times.
    fn call<T>(
        &mut self,
        command: &[u8],
        parse: fn(&[u8]) -> std::result::Result<T, WireError>,
    ) -> std::result::Result<T, Failed> {
        let cc = u32::from_be_bytes([command[6], command[7], command[8], command[9]]);
        let what = format!(
            "{} on {:#x} (tcti {})",
            wire::command_name(cc),
            self.index,
            self.tcti
        );
        let transport = self
            .transport
            .as_ref()
            .map_err(|e| Failed(None, Error::new(Kind::Config, e.clone())))?;
        for attempt in 0.. {
            let resp = transport
                .exchange(command)
                .map_err(|e| Failed(None, Error::new(Kind::Io, format!("{what}: {e}"))))?;
            match parse(&resp) {
                Err(WireError::Code(rc)) if wire::retry(rc) && attempt < 5 => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(v) => return Ok(v),
                Err(e) => {
                    let rc = match e {
                        WireError::Code(rc) => Some(rc),
                        WireError::Malformed(_) => None,
                    };
                    return Err(Failed(rc, Error::new(Kind::Io, format!("{what}: {e}"))));
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// The index exists, is a counter of 8 bytes.
    fn check_index(&mut self) -> Result<()> {
        let public = match self.call(&wire::nv_read_public(self.index), wire::parse_read_public) {
            Err(Failed(Some(rc), _)) if wire::no_such_handle(rc) => {
                return Err(Error::new(
                    Kind::Io,
                    format!(
                        "{} (tcti {}) is not defined on the TPM: define it at provisioning \
                         (tpm2_nvdefine {:#x} -C o -s 8 -a \"nt=counter|ownerread|ownerwrite|authread|authwrite|no_da\")",
                        self.describe(),
                        self.tcti,
                        self.index
                    ),
                ));
            }
            r => r.map_err(|f| f.1)?,
        };
        let why = if public.index != self.index {
            Some(format!("the TPM answered for index {:#x}", public.index))
        } else if !public.is_counter() {
            Some(format!(
                "is not an NV counter (nt=counter; attributes {:#010x}): an ordinary index can be written back, so it is no rollback floor",
                public.attributes
            ))
        } else if public.data_size != 8 {
            Some(format!(
                "has {} bytes where a counter has 8",
                public.data_size
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::new(
                Kind::Io,
                format!("{} (tcti {}) {why}", self.describe(), self.tcti),
            ));
        }
        self.checked = true;
        Ok(())
    }

    fn increment(&mut self) -> Result<()> {
        let r = self.call(&wire::nv_increment(self.index), wire::parse_increment);
        if r.is_err() {
            self.checked = false;
        }
        r.map_err(|f| f.1)
    }
}

impl Counter for Tpm2Direct {
    fn describe(&self) -> String {
        format!("tpm2 NV index {:#x}", self.index)
    }

    fn read(&mut self) -> Result<u64> {
        if !self.checked {
            self.check_index()?;
        }
        match self.call(&wire::nv_read_counter(self.index), wire::parse_read_counter) {
            Ok(v) => Ok(v),
            // Defined but never incremented: nothing was ever advanced.
            Err(Failed(Some(wire::RC_NV_UNINITIALIZED), _)) => Ok(0),
            Err(Failed(_, e)) => {
                self.checked = false;
                Err(e)
            }
        }
    }

    fn advance_to(&mut self, target: u64) -> Result<u64> {
        tpm2::advance_by_increments(self, target, Tpm2Direct::increment)
    }
}
