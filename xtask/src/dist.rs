//! `cargo xtask dist [--target x86_64|aarch64|armv7]...`: release tarballs.
//!
//! Builds the device binary with the release profile (size-tuned, stripped)
//! for each target — cross targets with the same Debian rustc 1.85
//! toolchain `cargo xtask cross-test` uses — and packs it with the files a
//! system integration needs, laid out as they install:
//!
//! ```text
//! usr/bin/updraft                      (and usr/bin/updraft-publish on x86_64)
//! lib/systemd/system/updraft.service
//! usr/lib/tmpfiles.d/updraft.conf
//! usr/lib/sysusers.d/updraft.conf
//! etc/updraft/updraft.toml             (the default configuration)
//! etc/updraft/health.d/
//! usr/share/bash-completion/completions/updraft   (and updraft-publish)
//! usr/share/doc/updraft/               (README and docs)
//! ```
//!
//! into `target/dist/updraft-VERSION-TRIPLE.tar.gz`, and prints each
//! tarball's sha256. The Yocto layer builds from source instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cross::{self, TARGETS};
use crate::util::{self, Result, root};

const HOST_TRIPLE: &str = "x86_64-unknown-linux-gnu";

pub fn run(args: &[String]) -> Result {
    let mut wanted =
        cross::target_flags(args, "cargo xtask dist [--target x86_64|aarch64|armv7]...")?;
    if wanted.is_empty() {
        wanted.push("x86_64".into());
    }
    let version = env!("CARGO_PKG_VERSION");
    let dist = root().join("target").join("dist");
    std::fs::create_dir_all(&dist).map_err(|e| format!("creating {}: {e}", dist.display()))?;
    for w in &wanted {
        let (triple, bins) = if w == "x86_64" || w == HOST_TRIPLE {
            (HOST_TRIPLE, build_host()?)
        } else {
            let t = TARGETS
                .iter()
                .find(|t| t.short == w || t.triple == w)
                .ok_or_else(|| format!("unknown target {w:?} (x86_64, aarch64, armv7)"))?;
            (t.triple, build_cross(t)?)
        };
        let name = format!("updraft-{version}-{triple}");
        let stage = dist.join(&name);
        let _ = std::fs::remove_dir_all(&stage);
        stage_tree(&stage, &bins)?;
        let tarball = dist.join(format!("{name}.tar.gz"));
        util::run(
            Command::new("tar")
                .arg("--owner=0")
                .arg("--group=0")
                .arg("--sort=name")
                .arg("-czf")
                .arg(&tarball)
                .arg("-C")
                .arg(&dist)
                .arg(&name),
        )?;
        let sum = util::output(Command::new("sha256sum").arg(&tarball))?;
        println!("{}", sum.trim());
    }
    Ok(())
}

/// Release build for the host: the agent and the publisher.
fn build_host() -> Result<Vec<PathBuf>> {
    let dir = crate::bench::release_binaries()?;
    Ok(vec![dir.join("updraft"), dir.join("updraft-publish")])
}

/// Release build of the agent for a cross target.
fn build_cross(t: &cross::Target) -> Result<Vec<PathBuf>> {
    Ok(vec![cross::release_agent(t)?])
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    std::fs::copy(from, to)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", to.display()))
}

fn stage_tree(stage: &Path, bins: &[PathBuf]) -> Result {
    let r = root();
    for b in bins {
        let name = b.file_name().ok_or("binary without a name")?;
        copy(b, &stage.join("usr/bin").join(name), 0o755)?;
        // What `NAME completions bash` prints, kept in the tree.
        copy(
            &r.join("contrib/bash-completion").join(name),
            &stage
                .join("usr/share/bash-completion/completions")
                .join(name),
            0o644,
        )?;
    }
    copy(
        &r.join("systemd/updraft.service"),
        &stage.join("lib/systemd/system/updraft.service"),
        0o644,
    )?;
    copy(
        &r.join("systemd/updraft.tmpfiles"),
        &stage.join("usr/lib/tmpfiles.d/updraft.conf"),
        0o644,
    )?;
    copy(
        &r.join("systemd/updraft.sysusers"),
        &stage.join("usr/lib/sysusers.d/updraft.conf"),
        0o644,
    )?;
    copy(
        &r.join("yocto/meta-updraft/recipes-support/updraft/files/updraft.toml"),
        &stage.join("etc/updraft/updraft.toml"),
        0o644,
    )?;
    let health = stage.join("etc/updraft/health.d");
    std::fs::create_dir_all(&health).map_err(|e| format!("creating {}: {e}", health.display()))?;
    let docs = stage.join("usr/share/doc/updraft");
    copy(&r.join("README.md"), &docs.join("README.md"), 0o644)?;
    let entries = std::fs::read_dir(r.join("docs")).map_err(|e| format!("reading docs: {e}"))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "md") {
            copy(&p, &docs.join(e.file_name()), 0o644)?;
        }
    }
    Ok(())
}
