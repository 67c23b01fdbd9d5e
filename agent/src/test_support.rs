//! Helpers shared by the unit tests: a small deterministic pseudo-random
//! generator (xorshift64*), so a failing randomized case replays exactly,
//! inputs mutated from it for the parsers' never-panic tests, scratch
//! directories, a race-free way to write executable scripts, U-Boot
//! environments built from variables, a plain install job, and the first
//! moves of the boot model every backend must make alike, and file
//! contents served from memory to the tree writer, and ed25519 signers
//! with the DSSE envelopes they sign. Compiled for tests only.

use std::path::PathBuf;

use crate::bootloader::Bootloader;
use crate::bootloader::uboot::Environment;
use crate::hash::Sha256;
use crate::manifest::Image;
use crate::slot::SlotName;
use crate::state::{Job, Method};
use crate::timestamp::Timestamp;

/// Take slot B out of the order, check that only A boots, then put B up
/// for a trial boot with 3 tries and check that B boots next: what every
/// backend must do the same way before it writes an image into B.
pub(crate) fn disable_then_trial_b(bl: &mut dyn Bootloader) {
    bl.disable(SlotName::B).unwrap();
    let s = bl.read().unwrap();
    assert_eq!(s.order, vec![SlotName::A]);
    assert!(!s.b.bootable);
    assert_eq!(s.next_boot(), Some(SlotName::A));
    bl.trial(SlotName::B, 3).unwrap();
    let s = bl.read().unwrap();
    assert_eq!(s.order, vec![SlotName::B, SlotName::A]);
    assert_eq!(s.next_boot(), Some(SlotName::B));
    assert_eq!(s.b.tries_left, 3);
}

/// A full-image job of release 2.0 (serial 2) into `target`, nothing
/// written yet, no reboot requested.
pub(crate) fn job_into(target: SlotName) -> Job {
    let image = Image {
        size: 1,
        sha256: Sha256::of(b"i"),
    };
    Job {
        started: Timestamp(1),
        ..Job::new(
            "j1".into(),
            "2.0".into(),
            2,
            image,
            "m.json".into(),
            target,
            Method::Full,
        )
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

/// `seed` with a few bytes replaced by interesting ones, maybe cut.
pub(crate) fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(6) {
        let i = rng.below(v.len());
        v[i] = match rng.below(6) {
            0 => 0,
            1 => b'=',
            2 => 0xff,
            3 => b' ',
            4 => b'\n',
            _ => rng.next() as u8,
        };
    }
    if rng.below(4) == 0 {
        v.truncate(rng.below(v.len() + 1));
    }
    v
}

/// An empty directory `updraft-<module>-<pid>-<name>` under the temporary
/// directory, emptied first should an earlier run have left it behind.
pub(crate) fn scratch_dir(module: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("updraft-{module}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
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

/// A U-Boot environment holding `vars`, in order.
pub(crate) fn uboot_env(vars: &[(&str, &str)]) -> Environment {
    let mut e = Environment::new();
    for (k, v) in vars {
        e.set(k, v).unwrap();
    }
    e
}

/// Blobs from memory for the tree writer; counts what was asked for.
/// `lie`: serve these bytes for a hash instead of the real ones.
#[derive(Default)]
pub(crate) struct Memory {
    pub blobs: std::collections::HashMap<Sha256, Vec<u8>>,
    pub lie: std::collections::HashMap<Sha256, Vec<u8>>,
    pub opened: Vec<Sha256>,
}

impl crate::app::tree::Blobs for Memory {
    fn open(
        &mut self,
        sha256: &Sha256,
        _size: u64,
    ) -> crate::error::Result<Box<dyn std::io::Read + '_>> {
        self.opened.push(*sha256);
        let bytes = self
            .lie
            .get(sha256)
            .or_else(|| self.blobs.get(sha256))
            .ok_or_else(|| crate::err!(Network, "no blob {}", sha256.short()))?;
        Ok(Box::new(&bytes[..]))
    }
}

/// An ed25519 signer made from a fixed seed, so each test key is the same
/// in every run.
pub(crate) struct Signer(ed25519_dalek::SigningKey);

impl Signer {
    pub(crate) fn new(seed: u8) -> Signer {
        Signer(ed25519_dalek::SigningKey::from_bytes(&[seed; 32]))
    }

    pub(crate) fn public(&self) -> crate::keys::PublicKey {
        crate::keys::PublicKey::from_bytes(self.0.verifying_key().as_bytes())
            .expect("an ed25519 test key")
    }

    /// The `sig` text of this key's signature over `payload` as `payload_type`.
    pub(crate) fn sign(&self, payload_type: &str, payload: &[u8]) -> String {
        use ed25519_dalek::Signer as _;
        let sig = self.0.sign(&crate::envelope::pae(payload_type, payload));
        crate::keys::encode_base64(&sig.to_bytes())
    }
}

/// A DSSE envelope of `payload` signed by each of `signers`, in order.
pub(crate) fn envelope(
    payload_type: &str,
    payload: &[u8],
    signers: &[&Signer],
) -> crate::envelope::Envelope {
    crate::envelope::Envelope {
        payload_type: payload_type.into(),
        payload: crate::keys::encode_base64(payload),
        signatures: signers
            .iter()
            .map(|s| crate::envelope::Signature {
                keyid: s.public().keyid(),
                sig: s.sign(payload_type, payload),
            })
            .collect(),
    }
}
