//! A device in DDI mode (`server.kind = "hawkbit"`) and what it needs: its
//! `[server]` lines, its token file, its controller id, and releases
//! published as a DDI server holds them (the files of a release directory
//! as one chunk's artifacts, each under its last path segment, or one
//! bundle).
//!
//! The servers are the real gooseBit ([`crate::goosebit`]) or the hawkBit
//! conformance server ([`crate::ddi_server`]); this module only wires a
//! [`Device`] to one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::ddi_server::{Artifact, Chunk};
use crate::device::{Device, DeviceSpec};
use crate::publisher::{KeyPair, Repo, image, keygen, publish_ok};
use crate::tmp::TempDir;

/// The controller id the rig's devices use (their device id too).
pub const CONTROLLER: &str = "gw-0001";

/// The target token the rig's devices hold.
pub const TOKEN: &str = "t0k3n-gw-0001-3f9a";

/// How the device authenticates (`server.ddi_auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DdiAuth {
    TargetToken,
    GatewayToken,
    None,
}

impl DdiAuth {
    fn key(self) -> &'static str {
        match self {
            DdiAuth::TargetToken => "target_token",
            DdiAuth::GatewayToken => "gateway_token",
            DdiAuth::None => "none",
        }
    }
}

/// `[server]` lines for a DDI server at `base_url`: polls follow the
/// server's sleep clamped to `sleep_min` (tests poll fast), the CA file
/// trusted, the controller id given.
pub fn server_toml(
    base_url: &str,
    tenant: &str,
    ca_file: &Path,
    auth: DdiAuth,
    sleep_min: &str,
) -> String {
    format!(
        "kind = \"hawkbit\"\nddi_url = {base_url:?}\ntenant = {tenant:?}\ncontroller_id = {CONTROLLER:?}\n\
         ddi_auth = {:?}\nca_file = {:?}\nsystem_roots = false\nddi_sleep_min = {sleep_min:?}\n\
         poll_interval = \"2s\"\npoll_jitter = \"1s\"\nretry_max = \"4s\"\n",
        auth.key(),
        ca_file.display().to_string()
    )
}

/// Write the device's token where the configuration expects it by default
/// (`state_dir/ddi-token`), readable by its owner only, and its device id
/// (the controller id).
pub fn provision(dev: &Device, token: &str) {
    std::fs::create_dir_all(&dev.state_dir).expect("state_dir");
    let path = dev.state_dir.join("ddi-token");
    std::fs::write(&path, format!("{token}\n")).expect("writing the token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .expect("token mode 0600");
    std::fs::write(dev.state_dir.join("device-id"), format!("{CONTROLLER}\n"))
        .expect("writing the device id");
}

/// Keys and a device with a fresh state, ready to be pointed at a DDI
/// server with [`Device::reconfigure`] and [`server_toml`].
pub struct Rig {
    pub dev: Device,
    pub key: KeyPair,
    keys: TempDir,
}

impl Rig {
    pub fn new(name: &str) -> Rig {
        let keys = TempDir::new(&format!("{name}-keys"));
        let key = keygen(keys.path(), "release");
        let dev = Device::new(name, DeviceSpec::simple(&key));
        Rig { dev, key, keys }
    }

    /// Publish `version` (an image made from `seed`, `size` bytes) into its
    /// own release directory; `extra` adds publisher flags.
    pub fn publish(&self, version: &str, seed: u64, size: usize, extra: &[&str]) -> Release {
        let img = self.keys.join(format!("{version}.img"));
        image(&img, size, seed);
        let repo = Repo::new(self.keys.join(format!("release-{version}")));
        repo.release(&[&self.key], version, &img, extra);
        Release {
            version: version.to_string(),
            repo,
            image: img,
        }
    }

    /// Configure the device for app `app` (its health directory, no
    /// units), booted from slot A that its release marker says holds
    /// `release`.
    pub fn with_app(&mut self, release: &str, app: &str) {
        let marker = self.dev.path("etc-updraft-release");
        std::fs::write(&marker, format!("UPDRAFT_RELEASE={release}\n")).expect("release marker");
        let dir = self.dev.dir().to_path_buf();
        std::fs::create_dir_all(crate::apps::health_dir(&dir, app)).expect("health dir");
        self.dev.reconfigure(|s| {
            s.device = format!("release_file = {:?}", marker.display().to_string());
            s.sections = crate::apps::app_sections(&dir, app, "");
        });
    }

    /// A key made beside the rig's own, which the device does not trust.
    pub fn stranger_key(&self) -> KeyPair {
        keygen(self.keys.path(), "stranger")
    }
}

/// A published release.
pub struct Release {
    pub version: String,
    pub repo: Repo,
    pub image: PathBuf,
}

impl Release {
    /// Every file of the release directory, by its path in it.
    pub fn files(&self) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        walk(&self.repo.dir, &self.repo.dir, &mut out);
        out.sort();
        out
    }

    /// The release directory as one chunk of a hawkBit deployment: each
    /// file an artifact under its last path segment.
    pub fn chunk(&self) -> Chunk {
        let mut c = Chunk::new("os", "rootfs", &self.version);
        for (rel, path) in self.files() {
            let name = rel.rsplit('/').next().unwrap_or(&rel).to_string();
            c = c.artifact(Artifact::named(&name, path));
        }
        c
    }

    /// The release as a distribution set of one software module per
    /// component, as a hawkBit operator would assemble it: the slot's
    /// module (`os`) holds `manifest.json`, the key documents and the
    /// slot's artifacts; each other component's module (`application`)
    /// its payload, or its index and the blob of every file it lists.
    /// Each file is an artifact under its last path segment.
    pub fn modules(&self) -> Vec<Chunk> {
        let bytes = serde_json::to_vec(&self.repo.payload()).expect("payload JSON");
        let m = updraft::manifest::Manifest::parse(&bytes).expect("a signed release");
        let slot = m.slot.as_ref().expect("a release of components");
        let mut taken = std::collections::BTreeSet::new();
        let mut chunks = Vec::new();
        for c in &m.components {
            let mut rels = Vec::new();
            match &c.part {
                updraft::manifest::component::Part::Command(p) => rels.push(p.artifact.url.clone()),
                updraft::manifest::component::Part::App(t)
                | updraft::manifest::component::Part::Boot(t) => {
                    rels.push(t.index.url.clone());
                    let index = updraft_publish::app::read_index(&self.repo.dir, t, &c.name)
                        .unwrap_or_else(|e| panic!("{e}"));
                    for (_, _, sha256) in index.files() {
                        rels.push(format!("{}{}.zst", t.blobs, sha256.to_hex()));
                    }
                }
            }
            let mut chunk = Chunk::new("application", &c.name, &c.version);
            for rel in rels {
                let name = rel.rsplit('/').next().unwrap_or(&rel).to_string();
                chunk = chunk.artifact(Artifact::named(&name, self.repo.dir.join(&rel)));
                taken.insert(rel);
            }
            chunks.push(chunk);
        }
        let mut os = Chunk::new("os", &slot.name, &slot.version);
        for (rel, path) in self.files() {
            if !taken.contains(&rel) && !rel.starts_with("artifacts/blobs/") {
                let name = rel.rsplit('/').next().unwrap_or(&rel).to_string();
                os = os.artifact(Artifact::named(&name, path));
            }
        }
        chunks.insert(0, os);
        chunks
    }

    /// The release as one bundle file (`updraft-publish bundle`).
    pub fn bundle(&self, out: &Path) -> PathBuf {
        publish_ok(&[
            "bundle",
            "--dir",
            self.repo.dir.to_str().expect("utf-8 path"),
            "--out",
            out.to_str().expect("utf-8 path"),
        ]);
        out.to_path_buf()
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(root, &p, out);
        } else if let Ok(rel) = p.strip_prefix(root) {
            out.push((rel.to_string_lossy().into_owned(), p.clone()));
        }
    }
}
