//! A software TPM 2.0 (swtpm) on loopback, for the hardware rollback
//! floor's tests: one per test, its state in the test's directory, ended by
//! its PID when dropped. Beside it the tpm2-tools calls a test makes itself:
//! defining the NV counter as provisioning does, reading its value.
//!
//! `swtpm socket --tpm2 --flags not-need-init,startup-clear` answers TPM
//! commands on a TCP port at once, with no power-on or startup from the
//! client; the control channel listens on the port above it.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::tmp::TempDir;

/// What the swtpm tests run: the software TPM and the tpm2-tools calls the
/// tests and the `tools` access make.
pub const TOOLS: &[&str] = &[
    "swtpm",
    "tpm2_nvdefine",
    "tpm2_nvread",
    "tpm2_nvincrement",
    "tpm2_getcap",
    "tpm2_nvreadpublic",
];

/// Skip (or, with `CI=true`, fail) a test when a program of [`TOOLS`] is
/// missing.
#[macro_export]
macro_rules! require_swtpm {
    () => {{
        if let Some(why) = $crate::prereq::unavailable($crate::swtpm::TOOLS) {
            $crate::skip!("{why}");
        }
    }};
}

/// A running swtpm.
pub struct Swtpm {
    child: Option<Child>,
    port: u16,
    state: PathBuf,
    log: PathBuf,
    _dir: TempDir,
}

/// Two free consecutive loopback ports (server, control), as far as
/// binding them now tells.
fn free_port_pair() -> u16 {
    for _ in 0..50 {
        let Ok(a) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(port) = a.local_addr().map(|a| a.port()) else {
            continue;
        };
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two free consecutive loopback ports for swtpm");
}

impl Swtpm {
    /// Start a fresh TPM (empty state) named after the test.
    pub fn start(name: &str) -> Swtpm {
        let dir = TempDir::new(&format!("{name}-swtpm"));
        let state = dir.join("state");
        std::fs::create_dir_all(&state).expect("swtpm state directory");
        Swtpm::start_with(dir, state)
    }

    /// Start a TPM on the state in `state` (created if missing), e.g. one
    /// a virtual machine's TPM keeps between its runs.
    pub fn start_on(name: &str, state: &std::path::Path) -> Swtpm {
        let dir = TempDir::new(&format!("{name}-swtpm"));
        std::fs::create_dir_all(state).expect("swtpm state directory");
        Swtpm::start_with(dir, state.to_path_buf())
    }

    fn start_with(dir: TempDir, state: PathBuf) -> Swtpm {
        let mut t = Swtpm {
            child: None,
            port: 0,
            log: dir.join("swtpm.log"),
            state,
            _dir: dir,
        };
        t.power_on();
        t
    }

    /// Start swtpm again on the same state (after [`Swtpm::stop`]).
    pub fn power_on(&mut self) {
        assert!(self.child.is_none(), "swtpm already running");
        for _ in 0..5 {
            let port = if self.port == 0 {
                free_port_pair()
            } else {
                self.port
            };
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .expect("swtpm log");
            let mut child = Command::new("swtpm")
                .arg("socket")
                .arg("--tpm2")
                .arg("--server")
                .arg(format!("type=tcp,port={port},bindaddr=127.0.0.1"))
                .arg("--ctrl")
                .arg(format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1))
                .arg("--tpmstate")
                .arg(format!("dir={}", self.state.display()))
                .arg("--flags")
                .arg("not-need-init,startup-clear")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("swtpm log"))
                .stderr(log)
                .spawn()
                .expect("starting swtpm");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    self.port = port;
                    self.child = Some(child);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "swtpm did not start:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// End swtpm (by its PID): the TPM is gone until [`Swtpm::power_on`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The TCTI tpm2-tools (and updraft's `rollback.tcti`) reach it by.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    fn tool(&self, name: &str, args: &[&str]) -> Output {
        Command::new(name)
            .arg("-T")
            .arg(self.tcti())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {name}: {e}"))
    }

    /// Define `index` as an 8-byte NV counter readable and incrementable
    /// with its own (empty) authorization, as provisioning does
    /// (docs/security.md).
    pub fn define_counter(&self, index: u32) {
        self.define(
            index,
            "nt=counter|ownerread|ownerwrite|authread|authwrite|no_da",
        );
    }

    /// Define `index` with 8 bytes and `attributes` (tpm2_nvdefine's `-a`),
    /// for indexes provisioning gets wrong.
    pub fn define(&self, index: u32, attributes: &str) {
        let out = self.tool(
            "tpm2_nvdefine",
            &[
                &format!("{index:#x}"),
                "-C",
                "o",
                "-s",
                "8",
                "-a",
                attributes,
            ],
        );
        assert!(
            out.status.success(),
            "tpm2_nvdefine {index:#x}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Increment the counter at `index` once.
    pub fn increment(&self, index: u32) {
        let out = self.tool("tpm2_nvincrement", &[&format!("{index:#x}")]);
        assert!(
            out.status.success(),
            "tpm2_nvincrement {index:#x}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The counter's value; `None` while it was never incremented.
    pub fn value(&self, index: u32) -> Option<u64> {
        let out = self.tool("tpm2_nvread", &["-s", "8", &format!("{index:#x}")]);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("0x14A"), "tpm2_nvread {index:#x}: {err}");
            return None;
        }
        let b: [u8; 8] = out
            .stdout
            .as_slice()
            .try_into()
            .unwrap_or_else(|_| panic!("tpm2_nvread {index:#x}: {:?}", out.stdout));
        Some(u64::from_be_bytes(b))
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        self.stop();
    }
}
