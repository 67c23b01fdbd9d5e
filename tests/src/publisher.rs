//! Keys, images and published releases for tests.
//!
//! Releases are made by the real `updraft-publish` binary. Hostile
//! variants are made by editing a real release's signed payload and signing
//! it again with the publisher library, so each test changes exactly one
//! thing and everything else stays valid.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use updraft_publish::keys::Key;
use updraft_publish::sign::sign_envelope;

use crate::bin;

/// Frame size used by test releases: small, so small images have several
/// frames.
pub const TEST_FRAME: usize = 1024 * 1024;

/// A key pair made by `updraft-publish keygen`.
#[derive(Clone, Debug)]
pub struct KeyPair {
    pub key: PathBuf,
    pub public: PathBuf,
}

impl KeyPair {
    pub fn load(&self) -> Key {
        Key::load(&self.key).expect("loading a test key")
    }
}

/// Run `updraft-publish` and return its output.
pub fn publish(args: &[&str]) -> Output {
    bin::command("updraft-publish")
        .args(args)
        .output()
        .expect("running updraft-publish")
}

/// Run `updraft-publish` and insist that it succeeds.
pub fn publish_ok(args: &[&str]) -> String {
    let out = publish(args);
    assert!(
        out.status.success(),
        "updraft-publish {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `updraft-publish keygen --out DIR/NAME`.
pub fn keygen(dir: &Path, name: &str) -> KeyPair {
    let prefix = dir.join(name);
    publish_ok(&["keygen", "--out", prefix.to_str().expect("utf-8 path")]);
    KeyPair {
        key: prefix.with_extension("key"),
        public: prefix.with_extension("pub"),
    }
}

/// `updraft-publish keygen-recipient --out DIR/NAME`: the X25519 key
/// pair of a recipient of encrypted releases.
pub fn keygen_recipient(dir: &Path, name: &str) -> KeyPair {
    let prefix = dir.join(name);
    publish_ok(&[
        "keygen-recipient",
        "--out",
        prefix.to_str().expect("utf-8 path"),
    ]);
    KeyPair {
        key: prefix.with_extension("key"),
        public: prefix.with_extension("pub"),
    }
}

/// Write `lines` as a recipient list file `path` for `--encrypt-to`.
pub fn recipient_list(path: &Path, lines: &[&str]) -> PathBuf {
    let mut text = String::from("# recipients of the test release\n");
    for l in lines {
        text.push_str(l.trim());
        text.push('\n');
    }
    std::fs::write(path, text).expect("writing a recipient list");
    path.to_path_buf()
}

/// Deterministic test image content: pseudo-random blocks mixed with
/// repeated and zero blocks, so it compresses partly, like a filesystem.
pub fn image_bytes(size: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut block = 0u64;
    while out.len() < size {
        let n = (size - out.len()).min(4096);
        match block % 4 {
            0 | 1 => {
                for _ in 0..n {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    out.push((x >> 24) as u8);
                }
            }
            2 => out.extend(
                std::iter::repeat_n(b"updraft test image ".iter().copied(), n / 19 + 1)
                    .flatten()
                    .take(n),
            ),
            _ => out.extend(std::iter::repeat_n(0u8, n)),
        }
        block += 1;
    }
    out
}

/// Write a test image file.
pub fn image(path: &Path, size: usize, seed: u64) -> Vec<u8> {
    let bytes = image_bytes(size, seed);
    std::fs::write(path, &bytes).expect("writing a test image");
    bytes
}

/// A publisher output directory.
pub struct Repo {
    pub dir: PathBuf,
}

impl Repo {
    pub fn new(dir: PathBuf) -> Repo {
        std::fs::create_dir_all(&dir).expect("creating a release directory");
        Repo { dir }
    }

    pub fn manifest(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }

    pub fn manifest_str(&self) -> String {
        self.manifest().to_str().expect("utf-8 path").to_string()
    }

    /// `updraft-publish release` into this directory with test defaults
    /// (1 MiB frames, fast compression); `extra` adds flags.
    pub fn release(
        &self,
        keys: &[&KeyPair],
        version: &str,
        image: &Path,
        extra: &[&str],
    ) -> String {
        let frame = TEST_FRAME.to_string();
        let mut args: Vec<&str> = vec!["release"];
        for k in keys {
            args.push("--key");
            args.push(k.key.to_str().expect("utf-8 path"));
        }
        args.extend([
            "--version",
            version,
            "--image",
            image.to_str().expect("utf-8 path"),
            "--out",
            self.dir.to_str().expect("utf-8 path"),
        ]);
        if !extra.contains(&"--frame-size") {
            args.extend(["--frame-size", &frame]);
        }
        if !extra.contains(&"--level") {
            args.extend(["--level", "3"]);
        }
        if !extra.contains(&"--compatible") {
            args.extend(["--compatible", "testboard"]);
        }
        args.extend_from_slice(extra);
        publish_ok(&args)
    }

    /// `updraft-publish bundle` of this directory into `out`; `extra` adds
    /// flags (`--part-size`). Returns the publisher's output.
    pub fn bundle(&self, out: &Path, extra: &[&str]) -> String {
        let mut args = vec![
            "bundle",
            "--dir",
            self.dir.to_str().expect("utf-8 path"),
            "--out",
            out.to_str().expect("utf-8 path"),
        ];
        args.extend_from_slice(extra);
        publish_ok(&args)
    }

    /// `updraft-publish keys` into this directory.
    pub fn key_document(
        &self,
        root_signers: &[&KeyPair],
        release: &[&KeyPair],
        version: u64,
        extra: &[&str],
    ) -> PathBuf {
        let v = version.to_string();
        let mut args: Vec<String> = vec!["keys".into()];
        for k in root_signers {
            args.push("--root-key".into());
            args.push(k.key.display().to_string());
        }
        for k in release {
            args.push("--release-pub".into());
            args.push(k.public.display().to_string());
        }
        args.extend([
            "--version".into(),
            v,
            "--out".into(),
            self.dir.display().to_string(),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        publish_ok(&refs);
        self.dir.join("keys").join(format!("{version}.json"))
    }

    /// The envelope of the current manifest as JSON.
    pub fn envelope(&self) -> Value {
        let bytes = std::fs::read(self.manifest()).expect("reading manifest.json");
        serde_json::from_slice(&bytes).expect("manifest.json is JSON")
    }

    /// The signed payload of the current manifest.
    pub fn payload(&self) -> Value {
        let env = self.envelope();
        let b64 = env["payload"].as_str().expect("payload string");
        let bytes = updraft::envelope::decode_base64(b64, "payload").expect("payload base64");
        serde_json::from_slice(&bytes).expect("payload JSON")
    }

    /// Edit the payload and sign it again (validly) with `keys`.
    pub fn resign(&self, keys: &[&KeyPair], edit: impl FnOnce(&mut Value)) {
        let mut p = self.payload();
        edit(&mut p);
        let bytes = serde_json::to_vec(&p).expect("encoding payload");
        self.write_signed(updraft::manifest::PAYLOAD_TYPE, &bytes, keys);
    }

    /// Sign arbitrary payload bytes under any payload type.
    pub fn write_signed(&self, payload_type: &str, payload: &[u8], keys: &[&KeyPair]) {
        let loaded: Vec<Key> = keys.iter().map(|k| k.load()).collect();
        let env = sign_envelope(payload_type, payload, &loaded).expect("signing");
        std::fs::write(self.manifest(), env).expect("writing manifest.json");
    }

    /// Append a signature entry (`keyid`, `sig` as given, valid or not) to
    /// the current manifest's envelope, leaving the rest as signed.
    pub fn push_signature(&self, keyid: &str, sig: &str) {
        let mut env = self.envelope();
        let sigs = env["signatures"]
            .as_array_mut()
            .expect("manifest.json has a signatures list");
        sigs.push(serde_json::json!({"keyid": keyid, "sig": sig}));
        self.write_raw(env.to_string().as_bytes());
    }

    /// Replace manifest.json with raw bytes.
    pub fn write_raw(&self, bytes: &[u8]) {
        std::fs::write(self.manifest(), bytes).expect("writing manifest.json");
    }

    /// Path of the full artifact named by the current manifest.
    pub fn artifact(&self) -> PathBuf {
        let p = self.payload();
        self.dir
            .join(p["artifact"]["url"].as_str().expect("artifact url"))
    }
}
