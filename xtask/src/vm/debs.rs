//! The machines' Debian kernel and busybox, fetched without installing
//! them and, for another architecture, without adding that architecture to
//! the host: a private `APT_CONFIG` (`APT::Architecture`, its own lists,
//! cache and status under `target/vm-debs/<arch>/`), then `apt-get update`,
//! `apt-get download` and `dpkg-deb -x` into one root. Nothing is
//! installed, and the extracted root is kept for later runs (while the
//! kernel package it was made from is the one the machine names).
//!
//! This module owns that directory. It must never touch the host's APT
//! state (`/var/lib/apt`, `/etc/apt`, dpkg's database) nor run anything
//! it extracts.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Result};

/// The packages extracted, all of `arch`, under `root`.
pub struct Extracted {
    pub root: PathBuf,
    /// The kernel's version (`6.1.0-57-amd64`).
    pub kernel_version: String,
}

/// The kernel `linux-image-<flavour>` of `arch` depends on (its newest
/// `linux-image-<ver>-<flavour>`) and `busybox-static` of `arch`, extracted
/// (or found from an earlier run) under `target/vm-debs/<arch>`.
pub fn kernel_and_busybox(arch: &str, flavour: &str) -> Result<Extracted> {
    let dir = util::target_dir().join("vm-debs").join(arch);
    let root = dir.join("root");
    let meta = format!("linux-image-{flavour}");
    // `<meta> <version>`: a root made from another flavour is made again.
    let done = dir.join("kernel-version");
    if let Some(v) = std::fs::read_to_string(&done).ok().and_then(|t| {
        t.trim()
            .strip_prefix(&format!("{meta} "))
            .map(str::to_string)
    }) {
        if root.join("boot").join(format!("vmlinuz-{v}")).is_file() {
            return Ok(Extracted {
                root,
                kernel_version: v,
            });
        }
    }
    let t = std::time::Instant::now();
    for d in ["lists/partial", "cache/archives/partial"] {
        mkdir(&dir.join(d))?;
    }
    let status = dir.join("status");
    write(&status, "")?;
    let conf = dir.join("apt.conf");
    write(
        &conf,
        &format!(
            "APT::Architecture \"{arch}\";\nAPT::Architectures {{ \"{arch}\"; }};\n\
             Dir::State::Lists \"{lists}\";\nDir::Cache \"{cache}\";\nDir::State::status \"{status}\";\n\
             Debug::NoLocking \"true\";\n",
            lists = dir.join("lists").display(),
            cache = dir.join("cache").display(),
            status = status.display(),
        ),
    )?;
    let apt = |tool: &str| {
        let mut c = Command::new(tool);
        c.env("APT_CONFIG", &conf);
        c
    };
    // A partial index failure (one suite mid-sync) still leaves main.
    if let Err(e) = util::output(apt("apt-get").args(["-q", "update"])) {
        println!("vm-test: apt-get update for {arch} reported an error (going on): {e}");
    }
    let indexes = t.elapsed();
    let depends = util::output(apt("apt-cache").args(["depends", &meta]))?;
    let image = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .ok_or_else(|| format!("apt-cache depends {meta} names no kernel image:\n{depends}"))?
        .to_string();
    let kernel_version = image
        .strip_prefix("linux-image-")
        .unwrap_or(&image)
        .to_string();
    let _ = std::fs::remove_dir_all(&root);
    mkdir(&root)?;
    let packages = [image.clone(), format!("busybox-static:{arch}")];
    let got = util::unpack_debs(apt("apt-get"), &packages, &dir.join("debs"), &root)?;
    write(&done, &format!("{meta} {kernel_version}"))?;
    println!(
        "fetched {image} and busybox-static for {arch} into {} in {:.1} s: the package \
         indexes {:.1} s, {:.1} MB of packages downloaded in {:.1} s, unpacked in {:.1} s",
        root.display(),
        t.elapsed().as_secs_f64(),
        indexes.as_secs_f64(),
        got.bytes as f64 / 1e6,
        got.download.as_secs_f64(),
        got.unpack.as_secs_f64(),
    );
    Ok(Extracted {
        root,
        kernel_version,
    })
}

fn mkdir(p: &Path) -> Result {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

fn write(p: &Path, text: &str) -> Result {
    std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))
}
