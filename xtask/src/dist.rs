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
//!
//! `--deb`: Debian packages of the same tree instead, made by
//! [`crate::deb`]: `target/dist/updraft_VERSION_ARCH.deb` for each target
//! (amd64, arm64, armhf) and `updraft-publish_VERSION_amd64.deb` with the
//! x86_64 one (docs/debian.md). `--agent PATH` packages that `updraft`
//! binary instead of building one (a single target; no publisher package),
//! `--deb-version V` sets the Debian version (default `VERSION-1`) and
//! `--out DIR` the directory: what the tests and the VM scenario that
//! install a package use.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cross::{self, TARGETS};
use crate::util::{self, Result, root};

const HOST_TRIPLE: &str = "x86_64-unknown-linux-gnu";

const USAGE: &str = "cargo xtask dist [--target x86_64|aarch64|armv7]... \
     [--deb [--agent PATH] [--deb-version V] [--out DIR]]";

/// The options besides `--target`.
#[derive(Default)]
struct Options {
    deb: bool,
    agent: Option<PathBuf>,
    deb_version: Option<String>,
    out: Option<PathBuf>,
}

pub fn run(args: &[String]) -> Result {
    let mut opts = Options::default();
    let mut targets = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value; usage: {USAGE}"))
        };
        match a.as_str() {
            "--deb" => opts.deb = true,
            "--agent" => opts.agent = Some(PathBuf::from(value()?)),
            "--deb-version" => opts.deb_version = Some(value()?),
            "--out" => opts.out = Some(PathBuf::from(value()?)),
            _ => targets.push(a.clone()),
        }
    }
    let mut wanted = cross::target_flags(&targets, USAGE)?;
    if wanted.is_empty() {
        wanted.push("x86_64".into());
    }
    if !opts.deb && (opts.agent.is_some() || opts.deb_version.is_some()) {
        return Err(format!(
            "--agent and --deb-version go with --deb; usage: {USAGE}"
        ));
    }
    if opts.agent.is_some() && wanted.len() != 1 {
        return Err(format!(
            "--agent packages one binary: name one --target; usage: {USAGE}"
        ));
    }
    let version = env!("CARGO_PKG_VERSION");
    let dist = opts
        .out
        .clone()
        .unwrap_or_else(|| root().join("target").join("dist"));
    std::fs::create_dir_all(&dist).map_err(|e| format!("creating {}: {e}", dist.display()))?;
    for w in &wanted {
        let host = w == "x86_64" || w == HOST_TRIPLE;
        let target = if host {
            None
        } else {
            Some(
                TARGETS
                    .iter()
                    .find(|t| t.short == w || t.triple == w)
                    .ok_or_else(|| format!("unknown target {w:?} (x86_64, aarch64, armv7)"))?,
            )
        };
        let triple = target.map_or(HOST_TRIPLE, |t| t.triple);
        if opts.deb {
            let t = std::time::Instant::now();
            let bins = match (&opts.agent, target) {
                (Some(agent), _) => vec![agent.clone()],
                (None, None) => build_host()?,
                (None, Some(t)) => build_cross(t)?,
            };
            let built = t.elapsed();
            for deb in debian_packages(&bins, triple, &dist, &opts)? {
                let sum = util::output(Command::new("sha256sum").arg(&deb))?;
                println!("{}", sum.trim());
            }
            println!(
                "dist --deb {triple}: binaries {:.1} s, packages {:.1} s",
                built.as_secs_f64(),
                (t.elapsed() - built).as_secs_f64()
            );
            continue;
        }
        let bins = match target {
            None => build_host()?,
            Some(t) => build_cross(t)?,
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

/// The agent's package from `bins[0]`, and the publisher's from the
/// `updraft-publish` among `bins` when there is one.
fn debian_packages(
    bins: &[PathBuf],
    triple: &str,
    dist: &Path,
    opts: &Options,
) -> Result<Vec<PathBuf>> {
    let arch = crate::deb::debian_arch(triple)?;
    let version = opts.deb_version.clone().unwrap_or_else(crate::deb::version);
    let commit = util::output(Command::new("git").arg("-C").arg(root()).args([
        "rev-parse",
        "--short=12",
        "HEAD",
    ]))
    .map(|c| format!(" from commit {}", c.trim()))
    .unwrap_or_default();
    let changes = format!("Built by `cargo xtask dist --deb`{commit}.");
    let agent = bins.first().ok_or("no binary to package")?;
    let input = |binary| crate::deb::Input {
        arch,
        version: &version,
        binary,
        out_dir: dist,
        changes: &changes,
    };
    let mut debs = vec![crate::deb::agent(&input(agent))?];
    if let Some(publish) = bins
        .iter()
        .find(|b| b.file_name().is_some_and(|n| n == "updraft-publish"))
    {
        debs.push(crate::deb::publisher(&input(publish))?);
    }
    Ok(debs)
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

/// Copy `from` to `to` (its directories made) with permissions `mode`.
pub(crate) fn copy(from: &Path, to: &Path, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    std::fs::copy(from, to)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", to.display()))
}

/// Binary `from` as `usr/bin/NAME` under `stage`, with its bash
/// completion (what `NAME completions bash` prints, kept in the tree).
pub(crate) fn stage_binary(stage: &Path, name: &str, from: &Path) -> Result {
    copy(from, &stage.join("usr/bin").join(name), 0o755)?;
    copy(
        &root().join("contrib/bash-completion").join(name),
        &stage
            .join("usr/share/bash-completion/completions")
            .join(name),
        0o644,
    )
}

/// The tarball's tree for `bins` (each installed under its file name)
/// under `stage`.
fn stage_tree(stage: &Path, bins: &[PathBuf]) -> Result {
    for b in bins {
        let name = b
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: a binary needs a UTF-8 file name", b.display()))?;
        stage_binary(stage, name, b)?;
    }
    stage_files(stage)
}

/// What the tarball ships besides the binaries: the unit and its
/// snippets, the configuration, the health checks' directory, the
/// documentation (also the start of the agent's Debian package, see
/// [`crate::deb`]).
pub(crate) fn stage_files(stage: &Path) -> Result {
    let r = root();
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
        &r.join("systemd/updraft.catalog"),
        &stage.join("usr/lib/systemd/catalog/updraft.catalog"),
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
