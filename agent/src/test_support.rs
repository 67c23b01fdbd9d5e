//! Helpers shared by the unit tests: a small deterministic pseudo-random
//! generator (xorshift64*), so a failing randomized case replays exactly,
//! a race-free way to write executable scripts, and a plain install job.
//! Compiled for tests only.

use crate::hash::Sha256;
use crate::manifest::Image;
use crate::slot::SlotName;
use crate::state::{Job, Method};
use crate::timestamp::Timestamp;

/// A full-image job of release 2.0 (serial 2) into `target`, nothing
/// written yet, no reboot requested.
pub(crate) fn job_into(target: SlotName) -> Job {
    Job {
        id: "j1".into(),
        version: "2.0".into(),
        serial: 2,
        image: Image {
            size: 1,
            sha256: Sha256::of(b"i"),
        },
        source: "m.json".into(),
        target,
        method: Method::Full,
        started: Timestamp(1),
        frames_durable: 0,
        writing: false,
        bytes_downloaded: 0,
        boot_id: None,
        purpose: None,
        reason: None,
        installed: None,
        stream_verified: false,
    }
}

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`; 0 when `n` is 0.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Write an executable file without this process ever holding it open for
/// writing. Tests run in parallel threads that fork; a child forked while
/// the file is open for writing keeps it open until it execs, and running
/// the file in that window fails with ETXTBSY ("Text file busy"). So the
/// bytes go to a sibling file that is never executed, and `install(1)`
/// copies them into place in its own process.
pub(crate) fn write_executable(path: &std::path::Path, content: &str) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, content).expect("writing a staged script");
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&staged)
        .arg(path)
        .status()
        .expect("running install(1)");
    assert!(
        status.success(),
        "install -m 0755 {}: {status}",
        path.display()
    );
    let _ = std::fs::remove_file(&staged);
}
