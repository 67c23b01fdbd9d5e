//! Debian packages of updraft, for `cargo xtask dist --deb` (and the VM
//! scenario that installs them): `updraft_VERSION_ARCH.deb` and, for
//! amd64, `updraft-publish_VERSION_amd64.deb`.
//!
//! The tree is staged by [`crate::dist::stage_tree`], the very layout of the
//! release tarballs, then made a Debian binary package:
//!
//! * the Debian configuration `contrib/debian/updraft.toml` replaces the
//!   tarball's template as `/etc/updraft/updraft.toml`, and every file
//!   under `etc/` is a conffile (`DEBIAN/conffiles`);
//! * the documents in `usr/share/doc/PACKAGE/` are compressed
//!   (`gzip -9n`), beside `copyright` (machine-readable format 1.0, the
//!   licence of the workspace manifest) and `changelog.Debian.gz`;
//! * the maintainer scripts are `contrib/debian/{postinst,prerm,postrm}`,
//!   the lintian overrides `contrib/debian/PACKAGE.lintian-overrides`;
//! * `Depends:` comes from the binary itself: the shared libraries it
//!   names (`DT_NEEDED`), each mapped to its Debian package, versioned by
//!   the newest symbol version it asks for (`GLIBC_x.y` as
//!   `libc6 (>= x.y)`, `GCC_x.y` as `libgcc-s1 (>= x.y)`): what
//!   `dpkg-shlibdeps` derives from those libraries' symbols files, computed
//!   the same way for every architecture without that architecture's dpkg
//!   database. `readelf` reads any ELF.
//!
//! Then `dpkg-deb --build --root-owner-group`: every file root's.
//!
//! This module owns the package's control data and its layout on top of
//! the tarball's. It must not build binaries (that is `dist`) nor decide
//! what a maintainer script does (the scripts in `contrib/debian/` and
//! docs/debian.md do).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::dist::copy;
use crate::util::{self, Result, root};

/// The maintainer of the packages, as `Maintainer:` and the changelog name it.
pub const MAINTAINER: &str = "updraft developers <updraft-ota@users.noreply.github.com>";
const HOMEPAGE: &str = "https://github.com/updraft-ota/updraft";

/// The Debian architecture of a Rust target triple.
pub fn debian_arch(triple: &str) -> Result<&'static str> {
    match triple {
        "x86_64-unknown-linux-gnu" => Ok("amd64"),
        "aarch64-unknown-linux-gnu" => Ok("arm64"),
        "armv7-unknown-linux-gnueabihf" => Ok("armhf"),
        other => Err(format!("no Debian architecture known for {other}")),
    }
}

/// The Debian version of this tree's packages: the crate's version and
/// Debian revision 1.
pub fn version() -> String {
    format!("{}-1", env!("CARGO_PKG_VERSION"))
}

/// What one package is made of.
pub struct Input<'a> {
    /// The Debian architecture (`amd64`, `arm64`, `armhf`).
    pub arch: &'a str,
    /// The Debian version (`0.1.0-1`).
    pub version: &'a str,
    /// The binary to ship as `/usr/bin/updraft` (or `updraft-publish`).
    pub binary: &'a Path,
    /// Where the `.deb` goes; the staged tree goes beside it.
    pub out_dir: &'a Path,
    /// What the changelog entry says of this build.
    pub changes: &'a str,
}

/// `updraft_VERSION_ARCH.deb`: the agent, its unit and snippets, its
/// configuration as a conffile, the maintainer scripts.
pub fn agent(input: &Input) -> Result<PathBuf> {
    let name = "updraft";
    let stage = stage_dir(input, name)?;
    // Whatever the input is called, it ships as /usr/bin/updraft.
    crate::dist::stage_binary(&stage, name, input.binary)?;
    crate::dist::stage_files(&stage)?;
    let r = root();
    let contrib = r.join("contrib/debian");
    // The tarball's configuration is the Yocto recipe's template; the
    // package ships a file that parses and says what is missing.
    copy(
        &contrib.join("updraft.toml"),
        &stage.join("etc/updraft/updraft.toml"),
        0o644,
    )?;
    let doc = stage.join("usr/share/doc").join(name);
    copy(
        &r.join("systemd/updraft.service.d/50-health-checks.conf.example"),
        &doc.join("examples/50-health-checks.conf.example"),
        0o644,
    )?;
    finish_doc(&doc, input, name)?;
    overrides(&stage, name)?;
    let debian = stage.join("DEBIAN");
    for script in ["postinst", "prerm", "postrm"] {
        copy(&contrib.join(script), &debian.join(script), 0o755)?;
    }
    let depends = depends(input.binary)?;
    let control = control(
        name,
        input,
        &stage,
        &format!("{depends}, systemd"),
        "admin",
        "over-the-air A/B update agent\n \
         updraft installs signed releases of a device's root file system into\n \
         the inactive slot of an A/B partition layout, switches the bootloader\n \
         (U-Boot, GRUB, a script or the Raspberry Pi firmware's tryboot) to it,\n \
         commits the release when the new system passes its health checks and\n \
         rolls back otherwise. It polls a static update server or a hawkBit DDI\n \
         server and reports each install.\n \
         .\n \
         The package enables updraft.service but does not start it:\n \
         /etc/updraft/updraft.toml must be completed first.",
    )?;
    build(&stage, &control, input, name)
}

/// `updraft-publish_VERSION_ARCH.deb`: the release publisher of the build
/// host, with its completion and its documentation.
pub fn publisher(input: &Input) -> Result<PathBuf> {
    let name = "updraft-publish";
    let stage = stage_dir(input, name)?;
    let r = root();
    crate::dist::stage_binary(&stage, name, input.binary)?;
    let bin = stage.join("usr/bin").join(name);
    // The publisher's profile (opt-level 3 for delta generation) leaves
    // its symbols in; the package ships it stripped as Debian Policy 10.1
    // asks. It is built for the host only, so the host's strip serves.
    util::run(
        Command::new("strip")
            .args(["--strip-unneeded", "--remove-section=.comment"])
            .arg(&bin),
    )?;
    let doc = stage.join("usr/share/doc").join(name);
    for d in ["manifest.md", "deltas.md", "cli.md"] {
        copy(&r.join("docs").join(d), &doc.join(d), 0o644)?;
    }
    finish_doc(&doc, input, name)?;
    overrides(&stage, name)?;
    let depends = depends(input.binary)?;
    let control = control(
        name,
        input,
        &stage,
        &depends,
        "devel",
        "release publisher for the updraft update agent\n \
         updraft-publish signs releases for updraft devices: full images,\n \
         binary deltas between releases, application trees and release\n \
         bundles, with the manifest a device polls. It runs on the build\n \
         host or in CI, never on the device.",
    )?;
    build(&stage, &control, input, name)
}

fn stage_dir(input: &Input, name: &str) -> Result<PathBuf> {
    let stage = input
        .out_dir
        .join(format!("{name}_{}_{}", input.version, input.arch));
    let _ = std::fs::remove_dir_all(&stage);
    mkdir(&stage)?;
    Ok(stage)
}

/// The documents compressed (Debian Policy 12.3), the copyright file and
/// the Debian changelog added.
fn finish_doc(doc: &Path, input: &Input, name: &str) -> Result {
    if doc.is_dir() {
        for e in std::fs::read_dir(doc).map_err(|e| format!("reading {}: {e}", doc.display()))? {
            let p = e
                .map_err(|e| format!("reading {}: {e}", doc.display()))?
                .path();
            if p.extension().is_some_and(|x| x == "md") {
                util::run(Command::new("gzip").args(["-9nf"]).arg(&p))?;
            }
        }
    }
    write(&doc.join("copyright"), &copyright(), 0o644)?;
    let changelog = doc.join("changelog.Debian");
    write(&changelog, &changelog_entry(name, input)?, 0o644)?;
    util::run(Command::new("gzip").args(["-9nf"]).arg(&changelog))
}

fn overrides(stage: &Path, name: &str) -> Result {
    let src = root()
        .join("contrib/debian")
        .join(format!("{name}.lintian-overrides"));
    if src.is_file() {
        copy(
            &src,
            &stage.join("usr/share/lintian/overrides").join(name),
            0o644,
        )?;
    }
    Ok(())
}

/// The machine-readable copyright file: the workspace's licence.
fn copyright() -> String {
    let license = env!("CARGO_PKG_LICENSE");
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: updraft\n\
         Upstream-Contact: {HOMEPAGE}/issues\n\
         Source: {HOMEPAGE}\n\
         Comment: The binaries link statically the Rust crates Cargo.lock lists\n \
         (each under its own licence, as its Cargo.toml declares), SQLite (public\n \
         domain) and zstd (BSD-3-Clause).\n\
         \n\
         Files: *\n\
         Copyright: the updraft developers\n\
         License: {spdx}\n\
         \n\
         License: Apache-2.0\n \
         Licensed under the Apache License, Version 2.0 (the \"License\"); you may\n \
         not use this software except in compliance with the License.\n \
         .\n \
         On Debian systems, the complete text of the Apache License, Version 2.0\n \
         can be found in \"/usr/share/common-licenses/Apache-2.0\".\n\
         \n\
         License: MIT\n \
         Permission is hereby granted, free of charge, to any person obtaining a\n \
         copy of this software and associated documentation files (the\n \
         \"Software\"), to deal in the Software without restriction, including\n \
         without limitation the rights to use, copy, modify, merge, publish,\n \
         distribute, sublicense, and/or sell copies of the Software, and to\n \
         permit persons to whom the Software is furnished to do so, subject to\n \
         the following conditions:\n \
         .\n \
         The above copyright notice and this permission notice shall be included\n \
         in all copies or substantial portions of the Software.\n \
         .\n \
         THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS\n \
         OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF\n \
         MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.\n \
         IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY\n \
         CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT,\n \
         TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE\n \
         SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.\n",
        spdx = license.replace(" OR ", " or "),
    )
}

/// One changelog entry for this build, dated by the commit it is built
/// from (the same tree packs the same date), or now outside a git tree.
fn changelog_entry(name: &str, input: &Input) -> Result<String> {
    let date =
        util::output(
            Command::new("git")
                .arg("-C")
                .arg(root())
                .args(["log", "-1", "--format=%aD"]),
        )
        .or_else(|_| util::output(Command::new("date").arg("-uR")))?;
    Ok(format!(
        "{name} ({version}) unstable; urgency=medium\n\n  * {changes}\n\n -- {MAINTAINER}  {date}\n",
        version = input.version,
        changes = input.changes,
        date = date.trim(),
    ))
}

/// `Depends:` of a binary: its libraries' packages, glibc's and
/// libgcc_s's with the newest symbol version the binary needs (what
/// `dpkg-shlibdeps` gives on amd64: `libc6 (>= 2.34), libgcc-s1 (>= 4.2)`).
pub fn depends(binary: &Path) -> Result<String> {
    let dynamic = util::output(Command::new("readelf").args(["-d", "-W"]).arg(binary))?;
    let versions = util::output(Command::new("readelf").args(["-V", "-W"]).arg(binary))?;
    shlib_depends(&dynamic, &versions)
}

/// [`depends`] from `readelf -d` and `readelf -V` output.
fn shlib_depends(dynamic: &str, versions: &str) -> Result<String> {
    let mut packages: Vec<String> = Vec::new();
    let mut glibc = false;
    for l in dynamic.lines().filter(|l| l.contains("(NEEDED)")) {
        let lib = l
            .split('[')
            .nth(1)
            .and_then(|s| s.split(']').next())
            .ok_or_else(|| format!("readelf -d: a NEEDED line without a name: {l}"))?;
        let package = match lib {
            "libc.so.6" | "libm.so.6" | "libpthread.so.0" | "libdl.so.2" | "librt.so.1"
            | "libutil.so.1" => {
                glibc = true;
                continue;
            }
            l if l.starts_with("ld-linux") => {
                glibc = true;
                continue;
            }
            "libgcc_s.so.1" => {
                // libgcc-s1's symbols file dates each GCC_x.y by GCC's version.
                match symbol_versions(versions, "GCC_").into_iter().max() {
                    Some((major, minor)) => format!("libgcc-s1 (>= {major}.{minor})"),
                    None => "libgcc-s1".to_string(),
                }
            }
            other => {
                return Err(format!(
                    "the binary needs {other}, which has no Debian package named here (xtask/src/deb.rs)"
                ));
            }
        };
        if !packages.contains(&package) {
            packages.push(package);
        }
    }
    if glibc {
        let newest = symbol_versions(versions, "GLIBC_")
            .into_iter()
            .max()
            .ok_or("readelf -V: the binary links glibc but names no GLIBC_ symbol version")?;
        let v: Vec<String> = [newest.0, newest.1].iter().map(u32::to_string).collect();
        packages.insert(0, format!("libc6 (>= {})", v.join(".")));
    }
    Ok(packages.join(", "))
}

/// Every `PREFIXx.y` (or `x.y.z`, counted as `x.y`) in `readelf -V`'s
/// version needs (`GLIBC_2.34`, `GCC_4.2.0`).
fn symbol_versions(text: &str, prefix: &str) -> Vec<(u32, u32)> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix(prefix))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|n| n.parse::<u32>());
            match (parts.next(), parts.next()) {
                (Some(Ok(major)), Some(Ok(minor))) => Some((major, minor)),
                _ => None,
            }
        })
        .collect()
}

/// `DEBIAN/control`, `DEBIAN/conffiles` and `DEBIAN/md5sums` for the staged
/// tree; returns the control text.
fn control(
    name: &str,
    input: &Input,
    stage: &Path,
    depends: &str,
    section: &str,
    description: &str,
) -> Result<String> {
    let debian = stage.join("DEBIAN");
    mkdir(&debian)?;
    let files = files_under(stage)?;
    let conffiles: Vec<&String> = files.iter().filter(|f| f.starts_with("etc/")).collect();
    if !conffiles.is_empty() {
        let text: String = conffiles.iter().map(|f| format!("/{f}\n")).collect();
        write(&debian.join("conffiles"), &text, 0o644)?;
    }
    let mut md5 = String::new();
    for f in &files {
        let sum = util::output(Command::new("md5sum").arg(stage.join(f)))?;
        let hash = sum.split_whitespace().next().unwrap_or_default();
        md5.push_str(&format!("{hash}  {f}\n"));
    }
    write(&debian.join("md5sums"), &md5, 0o644)?;
    let installed_kib = installed_size(stage)?;
    let text = format!(
        "Package: {name}\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {installed_kib}\n\
         Depends: {depends}\n\
         Section: {section}\n\
         Priority: optional\n\
         Homepage: {HOMEPAGE}\n\
         Description: {description}\n",
        version = input.version,
        arch = input.arch,
    );
    write(&debian.join("control"), &text, 0o644)?;
    Ok(text)
}

/// Every regular file under `stage` outside `DEBIAN/`, relative, sorted.
fn files_under(stage: &Path) -> Result<Vec<String>> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) -> Result {
        for e in std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
            let p = e
                .map_err(|e| format!("reading {}: {e}", dir.display()))?
                .path();
            let meta =
                std::fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            if meta.is_dir() {
                if p != base.join("DEBIAN") {
                    walk(&p, base, out)?;
                }
            } else if meta.is_file() {
                let rel = p
                    .strip_prefix(base)
                    .map_err(|e| format!("{}: {e}", p.display()))?;
                out.push(rel.to_string_lossy().into_owned());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(stage, stage, &mut out)?;
    out.sort();
    Ok(out)
}

/// `Installed-Size:` in KiB, as `dpkg-gencontrol` counts it: each file's
/// size rounded up to a KiB, and one KiB for each directory.
fn installed_size(stage: &Path) -> Result<u64> {
    fn walk(dir: &Path, skip: &Path) -> Result<u64> {
        let mut kib = 1;
        for e in std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
            let p = e
                .map_err(|e| format!("reading {}: {e}", dir.display()))?
                .path();
            if p == skip {
                continue;
            }
            let meta =
                std::fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            kib += if meta.is_dir() {
                walk(&p, skip)?
            } else {
                meta.len().div_ceil(1024)
            };
        }
        Ok(kib)
    }
    walk(stage, &stage.join("DEBIAN"))
}

/// Directories 0755 (whatever the umask made them), then `dpkg-deb`.
fn build(stage: &Path, control: &str, input: &Input, name: &str) -> Result<PathBuf> {
    fn dirs_0755(dir: &Path) -> Result {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
        for e in std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
            let p = e
                .map_err(|e| format!("reading {}: {e}", dir.display()))?
                .path();
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                dirs_0755(&p)?;
            }
        }
        Ok(())
    }
    dirs_0755(stage)?;
    let deb = input
        .out_dir
        .join(format!("{name}_{}_{}.deb", input.version, input.arch));
    util::output(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group", "-Zxz"])
            .arg(stage)
            .arg(&deb),
    )
    .map_err(|e| format!("{e}\n(control:\n{control})"))?;
    Ok(deb)
}

fn write(to: &Path, text: &str, mode: u32) -> Result {
    if let Some(dir) = to.parent() {
        mkdir(dir)?;
    }
    std::fs::write(to, text).map_err(|e| format!("writing {}: {e}", to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", to.display()))
}

fn mkdir(p: &Path) -> Result {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_depends_on_the_newest_symbol_version() {
        let dynamic = " 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]\n \
                       0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n \
                       0x0000000000000001 (NEEDED)             Shared library: [ld-linux-x86-64.so.2]\n";
        let versions = "  0x0010:   Name: GLIBC_2.2.5  Flags: none  Version: 7\n\
                        0x0020:   Name: GLIBC_2.34  Flags: none  Version: 3\n\
                        0x0030:   Name: GLIBC_2.9  Flags: none  Version: 4\n\
                        0x0040:   Name: GCC_3.0  Flags: none  Version: 5\n\
                        0x0050:   Name: GCC_4.2.0  Flags: none  Version: 6\n";
        assert_eq!(
            shlib_depends(dynamic, versions).as_deref(),
            Ok("libc6 (>= 2.34), libgcc-s1 (>= 4.2)")
        );
    }

    #[test]
    fn an_unknown_library_is_refused() {
        let dynamic = " 0x1 (NEEDED) Shared library: [libssl.so.3]\n";
        assert!(shlib_depends(dynamic, "").is_err());
    }

    #[test]
    fn the_architectures_are_debians() {
        assert_eq!(debian_arch("armv7-unknown-linux-gnueabihf"), Ok("armhf"));
        assert_eq!(debian_arch("aarch64-unknown-linux-gnu"), Ok("arm64"));
        assert!(debian_arch("riscv64gc-unknown-linux-gnu").is_err());
    }
}
