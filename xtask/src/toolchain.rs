//! The cross compilers: Debian's `rustc-web` with the arm64/armhf standard
//! libraries from the multiarch `libstd-rust-web-dev` packages, extracted
//! (never installed) into `target/cross-toolchain/<version>/`, so only the
//! first run downloads.
//!
//! Two versions are wanted, and neither is hard-coded, because the archive
//! moves (bookworm-security replaced 1.85 with 1.96 as the default candidate
//! and the LLVM it links from 19 to 22):
//!
//! * [`Pick::Newest`]: the newest version `apt-cache madison` lists for
//!   amd64, arm64 and armhf alike (the versions must match exactly across
//!   architectures). The cross tests and release builds use it.
//! * [`Pick::Msrv`]: the newest such version whose upstream release is the
//!   workspace's `rust-version`. Building with it is the MSRV check.
//!
//! The libraries the compiler itself runs on (`libLLVM.so.NN` above all)
//! are whatever the chosen `libstd-rust-web-<version>` runtime package
//! declares in `Depends`; missing ones are installed with apt-get when
//! running as root. A compiler that still does not start is reported in one
//! sentence naming the package to install, never as a loader error.
//!
//! This module never installs the compiler packages themselves (`dpkg -i`
//! of the arm64 packages fails on version skew of unrelated libraries).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Result};

/// Packages whose files are extracted into the toolchain cache.
pub(crate) const STD_DEV: &str = "libstd-rust-web-dev";

/// Debian architectures whose standard libraries the cache holds: the host
/// and the cross targets (see `cross::TARGETS`).
const ARCHES: [&str; 3] = ["amd64", "arm64", "armhf"];

/// Which `rustc-web` to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    /// The newest version published for every architecture.
    Newest,
    /// The newest version of the workspace's `rust-version`.
    Msrv,
}

/// An extracted `rustc-web` with the arm64/armhf standard libraries.
pub(crate) struct Toolchain {
    /// The Debian version, e.g. `1.96.0+dfsg1-1~deb12u2`.
    pub(crate) version: String,
    pub(crate) root: PathBuf,
    wrapper: PathBuf,
}

impl Toolchain {
    fn cache_dir() -> PathBuf {
        util::root().join("target").join("cross-toolchain")
    }

    /// The rustc wrapper to put in `RUSTC`.
    pub(crate) fn wrapper(&self) -> &Path {
        &self.wrapper
    }

    /// The upstream release, e.g. `1.96.0`.
    pub(crate) fn release(&self) -> &str {
        upstream(&self.version)
    }

    /// The toolchain `pick` chooses, downloaded and extracted if it is not
    /// cached yet, with its runtime libraries installed, and checked to run.
    pub(crate) fn ensure(pick: Pick) -> Result<Toolchain> {
        let mut picked = Self::ensure_each(&[pick])?;
        picked
            .pop()
            .ok_or_else(|| "no toolchain was picked".to_string())
    }

    /// [`Toolchain::ensure`] for each of `picks`, choosing among one listing
    /// of the archive.
    pub(crate) fn ensure_each(picks: &[Pick]) -> Result<Vec<Toolchain>> {
        let msrv = workspace_msrv()?;
        let versions = candidates()?;
        picks
            .iter()
            .map(|&pick| Self::ensure_version(choose(&versions, pick, &msrv)?))
            .collect()
    }

    fn ensure_version(version: String) -> Result<Toolchain> {
        let root = Self::cache_dir().join(sanitize(&version));
        let wrapper = root.join("rustc");
        let tc = Toolchain {
            version,
            root,
            wrapper,
        };
        if !tc.root.join(".complete").is_file() {
            tc.fetch()?;
        }
        let needs = tc.runtime_depends();
        tc.ensure_runtime(&needs)?;
        tc.check_runs(&needs)?;
        Ok(tc)
    }

    fn fetch(&self) -> Result {
        let v = &self.version;
        println!("cross-test: fetching rustc-web {v} and the arm64/armhf standard libraries");
        let runtime = runtime_package(v)?;
        let debs = self.root.join("debs");
        let _ = std::fs::remove_dir_all(&self.root);
        let mut packages = vec![format!("rustc-web={v}"), format!("{runtime}={v}")];
        packages.extend(ARCHES.iter().map(|arch| format!("{STD_DEV}:{arch}={v}")));
        let sysroot = self.root.join("sysroot");
        util::unpack_debs(Command::new("apt-get"), &packages, &debs, &sysroot)?;
        let rustc = sysroot.join("usr/bin/rustc");
        if !rustc.is_file() {
            return Err(format!(
                "{} is missing after extracting rustc-web {v}",
                rustc.display()
            ));
        }
        for triple in ["aarch64-unknown-linux-gnu", "armv7-unknown-linux-gnueabihf"] {
            let lib = sysroot.join("usr/lib/rustlib").join(triple).join("lib");
            if !lib.is_dir() {
                return Err(format!(
                    "{} is missing after extracting {STD_DEV} {v}",
                    lib.display()
                ));
            }
        }
        // What the compiler needs from the host, recorded so a cached
        // toolchain on a machine that lost those packages installs them
        // again without asking apt for an index it may no longer have.
        let needs = runtime_depends(&runtime, v)?;
        std::fs::write(self.root.join("runtime-depends"), needs.join("\n"))
            .map_err(|e| format!("writing {}: {e}", self.root.display()))?;
        let script = format!(
            "#!/bin/sh\n# rustc-web {v}, extracted by `cargo xtask cross-test`\nLD_LIBRARY_PATH='{lib}'${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} exec '{rustc}' \"$@\"\n",
            lib = sysroot.join("usr/lib/x86_64-linux-gnu").display(),
            rustc = rustc.display(),
        );
        write_executable(&self.wrapper, &script)?;
        let _ = std::fs::remove_dir_all(&debs);
        std::fs::write(self.root.join(".complete"), v)
            .map_err(|e| format!("marking {} complete: {e}", self.root.display()))
    }

    /// Install the host packages the runtime package depends on (the LLVM
    /// library first of all) that are not installed.
    fn ensure_runtime(&self, needs: &[String]) -> Result {
        let missing: Vec<&str> = needs
            .iter()
            .map(String::as_str)
            .filter(|p| !installed(p))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        install_packages(
            &missing,
            &format!("the libraries rustc-web {} runs on", self.version),
        )
    }

    /// The host packages recorded at extraction (`runtime-depends`).
    fn runtime_depends(&self) -> Vec<String> {
        std::fs::read_to_string(self.root.join("runtime-depends"))
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Run `rustc --version`; a compiler that cannot start is one sentence.
    fn check_runs(&self, needs: &[String]) -> Result {
        let out = Command::new(&self.wrapper)
            .arg("--version")
            .output()
            .map_err(|e| format!("cannot start {}: {e}", self.wrapper.display()))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = stderr.lines().next().unwrap_or("no message").trim();
        Err(format!(
            "rustc-web {} in {} does not start ({why}); it needs {} installed \
             (apt-get install -y {}), or remove {} to fetch it again",
            self.version,
            self.root.display(),
            if needs.is_empty() {
                "its runtime libraries".to_string()
            } else {
                needs.join(" ")
            },
            needs.join(" "),
            self.root.display()
        ))
    }
}

/// The versions to choose from, oldest first: what the archive publishes
/// for every architecture, or, when apt cannot tell, what the cache holds.
fn candidates() -> Result<Vec<String>> {
    match published_versions() {
        Ok(v) => Ok(v),
        Err(e) => {
            let cached = cached_versions();
            if cached.is_empty() {
                return Err(e);
            }
            eprintln!(
                "cross-test: {e}; choosing among the cached toolchains {}",
                cached.join(", ")
            );
            Ok(cached)
        }
    }
}

/// Choose the version `pick` wants from `versions` (ascending).
fn choose(versions: &[String], pick: Pick, msrv: &str) -> Result<String> {
    let found = match pick {
        Pick::Newest => versions.last(),
        Pick::Msrv => versions.iter().rev().find(|v| same_release(v, msrv)),
    };
    found.cloned().ok_or_else(|| match pick {
        Pick::Newest => {
            format!("no {STD_DEV} version is published for all of amd64, arm64 and armhf")
        }
        Pick::Msrv => format!(
            "no rustc-web {msrv}.x is published for all of amd64, arm64 and armhf \
             (the archive has {}), so the MSRV build (rust-version {msrv}) cannot run",
            if versions.is_empty() {
                "none".to_string()
            } else {
                versions.join(", ")
            }
        ),
    })
}

/// `1.85.0+dfsg3-1~deb12u3` → `1.85.0`.
fn upstream(version: &str) -> &str {
    let v = version.split_once(':').map_or(version, |(_, v)| v);
    v.split(['+', '-', '~']).next().unwrap_or(v)
}

/// True when Debian version `v` packages upstream release `msrv` (`1.85`
/// matches `1.85.0` and `1.85.1`, not `1.850`).
fn same_release(v: &str, msrv: &str) -> bool {
    let up = upstream(v);
    up == msrv
        || up
            .strip_prefix(msrv)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// The workspace's `rust-version` (`[workspace.package]` in Cargo.toml).
pub(crate) fn workspace_msrv() -> Result<String> {
    let path = util::root().join("Cargo.toml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    parse_rust_version(&text)
        .ok_or_else(|| format!("{} sets no rust-version = \"…\"", path.display()))
}

fn parse_rust_version(cargo_toml: &str) -> Option<String> {
    cargo_toml.lines().find_map(|l| {
        let (key, value) = l.split_once('=')?;
        if key.trim() != "rust-version" {
            return None;
        }
        let v = value.trim().strip_prefix('"')?.split('"').next()?;
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// Every `libstd-rust-web-dev` version published for amd64, arm64 and
/// armhf alike, oldest first. Adds the foreign architectures and updates
/// the index when apt does not know them yet.
fn published_versions() -> Result<Vec<String>> {
    match madison_common() {
        Ok(v) if !v.is_empty() => return Ok(v),
        Ok(_) => {
            let e = format!("no {STD_DEV} version is listed for all of amd64, arm64 and armhf");
            if !util::is_root() {
                return Err(e);
            }
            eprintln!("cross-test: {e}; adding arm64/armhf to dpkg and updating the index");
        }
        Err(e) if !util::is_root() => return Err(e),
        Err(e) => eprintln!("cross-test: {e}; adding arm64/armhf to dpkg and updating the index"),
    }
    let foreign = util::output(Command::new("dpkg").arg("--print-foreign-architectures"))?;
    for arch in &ARCHES[1..] {
        if !foreign.lines().any(|l| l.trim() == *arch) {
            util::run(Command::new("dpkg").args(["--add-architecture", arch]))?;
        }
    }
    apt_update();
    madison_common()
}

fn madison_common() -> Result<Vec<String>> {
    let mut per_arch: Vec<Vec<String>> = Vec::new();
    for arch in ARCHES {
        let out = util::output(
            Command::new("apt-cache").args(["madison", &format!("{STD_DEV}:{arch}")]),
        )?;
        let versions = madison_versions(&out, arch);
        if versions.is_empty() {
            return Err(format!("apt-cache madison lists no {STD_DEV} for {arch}"));
        }
        per_arch.push(versions);
    }
    let mut common: Vec<String> = per_arch[0]
        .iter()
        .filter(|v| per_arch[1..].iter().all(|vs| vs.contains(v)))
        .cloned()
        .collect();
    common.sort_by(|a, b| compare_debian_versions(a, b));
    common.dedup();
    Ok(common)
}

/// The versions in `apt-cache madison` output that come from `arch`'s index
/// (`package | version | source  Packages`).
fn madison_versions(out: &str, arch: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            match cols.as_slice() {
                [_, v, src] if src.ends_with(&format!("{arch} Packages")) => Some((*v).to_string()),
                _ => None,
            }
        })
        .collect()
}

fn cached_versions() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(Toolchain::cache_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join(".complete")).ok())
        .collect();
    v.sort_by(|a, b| compare_debian_versions(a, b));
    v
}

/// The versioned runtime package (`libstd-rust-web-1.96`) that
/// `libstd-rust-web-dev` of version `v` depends on.
fn runtime_package(v: &str) -> Result<String> {
    let out = util::output(Command::new("apt-cache").args(["show", &format!("{STD_DEV}={v}")]))?;
    depends_of(&out)
        .into_iter()
        .find(|p| {
            p.strip_prefix("libstd-rust-web-")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .ok_or_else(|| {
            format!(
                "apt-cache show {STD_DEV}={v} names no libstd-rust-web-<version> runtime package in Depends"
            )
        })
}

/// The host packages `runtime` of version `v` declares in `Depends`: the
/// LLVM library the compiler links (`libllvm22` for 1.96), libstdc++, ...
fn runtime_depends(runtime: &str, v: &str) -> Result<Vec<String>> {
    let out = util::output(Command::new("apt-cache").args(["show", &format!("{runtime}={v}")]))?;
    let deps = depends_of(&out);
    if !deps.iter().any(|d| d.starts_with("libllvm")) {
        return Err(format!(
            "apt-cache show {runtime}={v} declares no libllvm package in Depends ({}); \
             cannot tell which LLVM rustc-web {v} runs on",
            deps.join(", ")
        ));
    }
    Ok(deps)
}

/// Package names in the first `Depends:` field of `apt-cache show` output,
/// without version constraints or architecture qualifiers; of a set of
/// alternatives (`a | b`), the first.
fn depends_of(show: &str) -> Vec<String> {
    let Some(field) = show.lines().find_map(|l| l.strip_prefix("Depends:")) else {
        return Vec::new();
    };
    field
        .split(',')
        .filter_map(|dep| {
            let first = dep.split('|').next()?.trim();
            let name = first.split([' ', '(']).next()?.trim();
            let name = name.split(':').next()?;
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// Install `packages` with apt-get as root; otherwise one sentence saying
/// the command that would.
pub(crate) fn install_packages(packages: &[&str], what: &str) -> Result {
    let list = packages.join(" ");
    if !util::is_root() {
        return Err(format!(
            "{what} are missing: install them (apt-get install -y {list}) or run as root"
        ));
    }
    println!("xtask: installing {list} ({what})");
    let mut c = Command::new("apt-get");
    c.args(["install", "-y", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive");
    if util::run(&mut c).is_ok() {
        return Ok(());
    }
    // A fresh machine may not have fetched the index yet.
    apt_update();
    util::run(&mut c).map_err(|e| format!("installing {what} ({list}): {e}"))
}

/// True when dpkg lists `package` as installed.
pub(crate) fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout) == "install ok installed"
        })
}

/// `apt-get update`, tolerating a failure: one architecture's index being
/// mid-sync on the mirror must not stop the run, the main index is enough.
pub(crate) fn apt_update() {
    let status = Command::new("apt-get").args(["update", "-q"]).status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!(
            "cross-test: apt-get update exited with {s}; continuing with the indexes it got"
        ),
        Err(e) => eprintln!("cross-test: apt-get update could not start: {e}; continuing"),
    }
}

fn write_executable(path: &Path, text: &str) -> Result {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

fn sanitize(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Order Debian version strings with `dpkg --compare-versions`.
fn compare_debian_versions(a: &str, b: &str) -> std::cmp::Ordering {
    if a == b {
        return std::cmp::Ordering::Equal;
    }
    let lt = Command::new("dpkg")
        .args(["--compare-versions", a, "lt", b])
        .status()
        .is_ok_and(|s| s.success());
    if lt {
        std::cmp::Ordering::Less
    } else {
        std::cmp::Ordering::Greater
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V185: &str = "1.85.0+dfsg3-1~deb12u3";
    const V196: &str = "1.96.0+dfsg1-1~deb12u2";

    #[test]
    fn the_msrv_pick_is_the_newest_build_of_that_release() {
        let published = vec![
            "1.85.0+dfsg3-1~deb12u1".to_string(),
            V185.to_string(),
            V196.to_string(),
        ];
        assert_eq!(choose(&published, Pick::Newest, "1.85").unwrap(), V196);
        assert_eq!(choose(&published, Pick::Msrv, "1.85").unwrap(), V185);
        let err = choose(&published[2..], Pick::Msrv, "1.85").unwrap_err();
        assert!(err.contains("no rustc-web 1.85.x"), "{err}");
        assert!(err.contains(V196), "{err}");
        assert!(choose(&[], Pick::Newest, "1.85").is_err());
    }

    #[test]
    fn releases_match_on_whole_components() {
        assert_eq!(upstream(V185), "1.85.0");
        assert_eq!(upstream("1:1.85.1-2"), "1.85.1");
        assert!(same_release(V185, "1.85"));
        assert!(same_release(V185, "1.85.0"));
        assert!(!same_release("1.850.0-1", "1.85"));
        assert!(!same_release(V196, "1.85"));
    }

    #[test]
    fn runtime_depends_are_read_from_the_package() {
        let show = "Package: libstd-rust-web-1.96\nVersion: 1.96.0+dfsg1-1~deb12u2\n\
                    Depends: libc6 (>= 2.34), libgcc-s1 (>= 4.2), libllvm22, libstdc++6 (>= 11)\n\
                    Description: x\n";
        assert_eq!(
            depends_of(show),
            ["libc6", "libgcc-s1", "libllvm22", "libstdc++6"]
        );
        let dev = "Package: libstd-rust-web-dev\nDepends: libstd-rust-web-1.96 (= 1.96.0+dfsg1-1~deb12u2)\n";
        assert_eq!(depends_of(dev), ["libstd-rust-web-1.96"]);
        assert_eq!(depends_of("Depends: a:any | b, c\n"), ["a", "c"]);
        assert!(depends_of("Package: x\n").is_empty());
    }

    #[test]
    fn madison_lines_are_filtered_by_architecture() {
        let out = format!(
            "libstd-rust-web-dev:arm64 | {V196} | http://mirror/debian-security bookworm-security/main arm64 Packages\n\
             libstd-rust-web-dev:arm64 | {V185} | http://mirror/debian bookworm/main arm64 Packages\n\
             libstd-rust-web-dev | 1.99 | http://mirror/debian sid/main amd64 Packages\n"
        );
        assert_eq!(madison_versions(&out, "arm64"), [V196, V185]);
    }

    #[test]
    fn rust_version_is_read_from_the_workspace() {
        let toml = "[workspace.package]\nversion = \"0.1.0\"\nrust-version = \"1.85\"\n";
        assert_eq!(parse_rust_version(toml).as_deref(), Some("1.85"));
        assert_eq!(parse_rust_version("[package]\n"), None);
        assert_eq!(workspace_msrv().unwrap(), "1.85");
    }
}
