//! Debian packages of another architecture, fetched without adding that
//! architecture to the host: a private `APT_CONFIG` (`APT::Architecture`,
//! its own lists, cache and status under `target/vm-debs/<arch>/`), then
//! `apt-get update`, `apt-get download` and `dpkg-deb -x` into one root.
//! The arm64 machine's kernel (with its modules) and busybox come from here;
//! nothing is installed, and the extracted root is kept for later runs.
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
    /// The kernel's version (`6.1.0-57-cloud-arm64`).
    pub kernel_version: String,
}

/// The newest `linux-image-*-cloud-<arch>` and `busybox-static` of `arch`,
/// extracted (or found from an earlier run) under `target/vm-debs/<arch>`.
pub fn kernel_and_busybox(arch: &str) -> Result<Extracted> {
    let dir = util::target_dir().join("vm-debs").join(arch);
    let root = dir.join("root");
    let done = dir.join("kernel-version");
    if let Ok(v) = std::fs::read_to_string(&done) {
        let v = v.trim().to_string();
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
    let meta = format!("linux-image-cloud-{arch}");
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
    util::unpack_debs(apt("apt-get"), &packages, &dir.join("debs"), &root)?;
    let modules = root.join("lib/modules").join(&kernel_version);
    write_modules_dep(&modules)?;
    write(&done, &kernel_version)?;
    println!(
        "fetched {image} and busybox-static for {arch} into {} in {:.1} s",
        root.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(Extracted {
        root,
        kernel_version,
    })
}

/// `modules.dep` as `depmod` writes it (which the package's postinst would
/// run): each module of `modules.order` with the modules its `.modinfo`
/// `depends=` names.
fn write_modules_dep(modules: &Path) -> Result {
    let order_file = modules.join("modules.order");
    let order = std::fs::read_to_string(&order_file)
        .map_err(|e| format!("reading {}: {e}", order_file.display()))?;
    let paths: Vec<&str> = order
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let by_name = |name: &str| {
        paths
            .iter()
            .find(|p| super::guest::module_name(p) == name.replace('-', "_"))
            .copied()
    };
    let mut out = String::new();
    for p in &paths {
        let file = modules.join(p);
        let bytes = std::fs::read(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
        let deps: Vec<&str> = modinfo_depends(&bytes)
            .split(',')
            .filter(|d| !d.is_empty())
            .filter_map(by_name)
            .collect();
        out.push_str(&format!("{p}: {}\n", deps.join(" ")));
    }
    write(&modules.join("modules.dep"), &out)
}

/// The `depends=` entry of a module's `.modinfo` (empty when none).
fn modinfo_depends(ko: &[u8]) -> String {
    let key = b"\0depends=";
    ko.windows(key.len())
        .position(|w| w == key)
        .map(|i| {
            let rest = &ko[i + key.len()..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end]).into_owned()
        })
        .unwrap_or_default()
}

fn mkdir(p: &Path) -> Result {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

fn write(p: &Path, text: &str) -> Result {
    std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_come_out_of_the_modinfo_section() {
        let ko = b"\x7fELF...\0license=GPL\0depends=virtio,virtio_ring\0intree=Y\0";
        assert_eq!(modinfo_depends(ko), "virtio,virtio_ring");
        assert_eq!(modinfo_depends(b"\0depends=\0name=x\0"), "");
        assert_eq!(modinfo_depends(b"no modinfo"), "");
    }
}
