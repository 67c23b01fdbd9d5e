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
        self.with_marker(release);
        let dir = self.dev.dir().to_path_buf();
        std::fs::create_dir_all(crate::apps::health_dir(&dir, app)).expect("health dir");
        self.dev.reconfigure(|s| {
            s.sections = crate::apps::app_sections(&dir, app, "");
        });
    }

    /// Boot the device from slot A with a release marker naming `release`
    /// (an image from the factory, no install recorded).
    pub fn with_marker(&mut self, release: &str) {
        let marker = self.dev.path("etc-updraft-release");
        std::fs::write(&marker, format!("UPDRAFT_RELEASE={release}\n")).expect("release marker");
        self.dev.reconfigure(|s| {
            s.device = format!("release_file = {:?}", marker.display().to_string());
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
    /// component, as `updraft-publish modules` writes it into `out` and an
    /// operator uploads it: the slot's module (`os`) holds `manifest.json`,
    /// the key documents and the slot's artifacts; an app's (`application`)
    /// its index and its pack; a command's its payload. Each file is an
    /// artifact under its own name.
    pub fn modules(&self, out: &Path) -> Vec<Chunk> {
        let printed = publish_ok(&[
            "modules",
            "--dir",
            self.repo.dir.to_str().expect("utf-8 path"),
            "--out",
            out.to_str().expect("utf-8 path"),
        ]);
        printed
            .lines()
            .filter_map(|l| l.strip_prefix("module "))
            .map(|l| {
                let (head, files) = l
                    .split_once("): ")
                    .expect("module NAME VERSION (KIND): FILES");
                let (name_version, kind) = head.split_once(" (").expect("a module's kind");
                let (name, version) = name_version.split_once(' ').expect("a module's version");
                files
                    .split(' ')
                    .map(PathBuf::from)
                    .fold(Chunk::new(kind, name, version), |c, f| {
                        c.artifact(Artifact::file(f))
                    })
            })
            .collect()
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
