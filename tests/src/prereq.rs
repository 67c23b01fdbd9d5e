//! The test suite's prerequisites, as listed in `tests/prerequisites.txt`.
//!
//! That file is the one list of the Debian and Python packages the tests
//! use and of what shows each one is installed (a command, a file, a
//! library, a Python module). This module owns reading it and looking those
//! things up: [`require!`](crate::require) skips a test whose tools are
//! missing, naming the package; `cargo xtask test` asks [`missing`] what to
//! install; `.ci/run` reads the same file with awk.
//!
//! This module only looks: it must never install, download or run anything
//! but `python3 -c "import MODULE"` for a `py:` item.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The prerequisites file, compiled in so a test binary run anywhere knows
/// the packages.
pub const TEXT: &str = include_str!("../prerequisites.txt");

/// Where the prerequisites file lives in the repository.
pub const PATH: &str = "tests/prerequisites.txt";

/// Which installer a package comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A Debian package (`apt-get install`).
    Deb,
    /// A Python package (`python3 -m pip install`).
    Pip,
}

/// One line of the prerequisites file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prerequisite {
    pub kind: Kind,
    /// The package name the installer knows.
    pub package: String,
    /// What shows the package is installed (see the file's header).
    pub provides: Vec<String>,
}

impl Prerequisite {
    /// `Debian package nginx` / `Python package oelint-adv`.
    pub fn describe(&self) -> String {
        match self.kind {
            Kind::Deb => format!("Debian package {}", self.package),
            Kind::Pip => format!("Python package {}", self.package),
        }
    }

    /// The first item this package provides that cannot be found, if any.
    pub fn first_missing(&self) -> Option<&str> {
        self.provides
            .iter()
            .map(String::as_str)
            .find(|item| !present(item))
    }
}

/// Parse the prerequisites format: `deb|pip PACKAGE PROVIDES...`, `#`
/// comments and blank lines. Errors name the line.
pub fn parse(text: &str) -> Result<Vec<Prerequisite>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let kind = match words.next() {
            Some("deb") => Kind::Deb,
            Some("pip") => Kind::Pip,
            Some(other) => {
                return Err(format!(
                    "{PATH} line {}: unknown kind {other:?} (expected deb or pip)",
                    n + 1
                ));
            }
            None => continue,
        };
        let package = words
            .next()
            .ok_or_else(|| format!("{PATH} line {}: no package name", n + 1))?
            .to_string();
        let provides: Vec<String> = words.map(str::to_string).collect();
        if provides.is_empty() {
            return Err(format!(
                "{PATH} line {}: {package} names nothing it provides",
                n + 1
            ));
        }
        out.push(Prerequisite {
            kind,
            package,
            provides,
        });
    }
    Ok(out)
}

/// Every prerequisite, in file order (Debian packages first).
pub fn all() -> Vec<Prerequisite> {
    // The file is compiled in and checked by this module's tests; a
    // malformed line cannot reach a test binary.
    parse(TEXT).unwrap_or_default()
}

/// The prerequisite that provides `item`.
pub fn package_of(item: &str) -> Option<Prerequisite> {
    all()
        .into_iter()
        .find(|p| p.provides.iter().any(|i| i == item))
}

/// The prerequisites not installed here, each with the first item of it
/// that is missing.
pub fn missing() -> Vec<(Prerequisite, String)> {
    all()
        .into_iter()
        .filter_map(|p| {
            let item = p.first_missing()?.to_string();
            Some((p, item))
        })
        .collect()
}

/// Why a test needing `items` cannot run, or `None` when all are here:
/// `fw_printenv is not installed (Debian package libubootenv-tool)`.
pub fn unavailable(items: &[&str]) -> Option<String> {
    let item = items.iter().find(|i| !present(i))?;
    let package = match package_of(item) {
        Some(p) => p.describe(),
        None => format!("not listed in {PATH}"),
    };
    Some(format!(
        "{} is not installed ({package})",
        describe_item(item)
    ))
}

/// A PROVIDES item for people: `the Python module prometheus_client`,
/// `faketime/libfaketime.so.1`, `fw_printenv`.
pub fn describe_item(item: &str) -> String {
    item.strip_prefix("py:")
        .map(|m| format!("the Python module {m}"))
        .or_else(|| item.strip_prefix("lib:").map(str::to_string))
        .unwrap_or_else(|| item.to_string())
}

/// True when `item` (a PROVIDES entry) is found here.
pub fn present(item: &str) -> bool {
    if let Some(module) = item.strip_prefix("py:") {
        return python_has(module);
    }
    find(item).is_some()
}

/// The path of a command, file or library item; `None` for `py:` items
/// and for anything not found. `nginx` is the binary the tests would run
/// (`UPDRAFT_NGINX`, else `/usr/sbin/nginx`; see [`crate::nginx`]).
pub fn find(item: &str) -> Option<PathBuf> {
    if item.starts_with("py:") {
        return None;
    }
    if let Some(rel) = item.strip_prefix("lib:") {
        return [
            PathBuf::from("/usr/lib").join(multiarch()),
            "/usr/lib".into(),
        ]
        .into_iter()
        .map(|d| d.join(rel))
        .find(|p| p.is_file());
    }
    if item.starts_with('/') {
        let p = PathBuf::from(item);
        return p.is_file().then_some(p);
    }
    if item == "nginx" {
        let p = crate::nginx::Nginx::binary();
        return executable(&p).then_some(p);
    }
    command(item)
}

/// A command on `PATH`, then in `/usr/sbin` and `/sbin` (which a
/// non-root `PATH` often lacks).
pub fn command(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

fn executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Debian's multiarch library directory name for this architecture.
pub fn multiarch() -> String {
    match std::env::consts::ARCH {
        "arm" => "arm-linux-gnueabihf".to_string(),
        arch => format!("{arch}-linux-gnu"),
    }
}

fn python_has(module: &str) -> bool {
    if !module
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    {
        return false;
    }
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The package names of `packages` of one kind, in order.
pub fn names_of<'a>(packages: &[&'a Prerequisite], kind: Kind) -> Vec<&'a str> {
    packages
        .iter()
        .filter(|p| p.kind == kind)
        .map(|p| p.package.as_str())
        .collect()
}

/// The one command that installs `packages` (as root, with `sudo` in
/// front when `sudo` is true): apt-get for the Debian ones, then pip.
pub fn install_command(packages: &[&Prerequisite], sudo: bool) -> String {
    let sudo = if sudo { "sudo " } else { "" };
    let names = |k: Kind| names_of(packages, k);
    let mut parts = Vec::new();
    let deb = names(Kind::Deb);
    if !deb.is_empty() {
        parts.push(format!(
            "{sudo}apt-get install -y --no-install-recommends {}",
            deb.join(" ")
        ));
    }
    let pip = names(Kind::Pip);
    if !pip.is_empty() {
        parts.push(format!(
            "{sudo}python3 -m pip install --break-system-packages {}",
            pip.join(" ")
        ));
    }
    parts.join(" && ")
}

/// Skip the current test unless every item is installed:
/// `require!("fw_printenv", "mkenvimage")`. Items are PROVIDES entries of
/// `tests/prerequisites.txt`; the skip names the package to install.
#[macro_export]
macro_rules! require {
    ($($item:expr),+ $(,)?) => {{
        if let Some(why) = $crate::prereq::unavailable(&[$($item),+]) {
            $crate::skip!("{why}");
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prerequisites_file_parses_and_lists_debian_packages_first() {
        let all = parse(TEXT).unwrap();
        assert!(all.len() > 10, "{all:?}");
        let first_pip = all.iter().position(|p| p.kind == Kind::Pip).unwrap();
        assert!(
            all[first_pip..].iter().all(|p| p.kind == Kind::Pip),
            "deb lines must come before pip lines (pip needs python3-pip)"
        );
        for p in &all {
            assert!(
                p.package
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b)),
                "{p:?}"
            );
        }
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        assert!(parse("apt nginx nginx").unwrap_err().contains("line 1"));
        assert!(parse("# c\ndeb\n").unwrap_err().contains("line 2"));
        assert!(parse("deb nginx\n").unwrap_err().contains("nothing"));
        assert_eq!(parse("\n# only comments\n").unwrap(), Vec::new());
    }

    #[test]
    fn every_item_a_test_requires_is_listed() {
        let listed: Vec<String> = all().into_iter().flat_map(|p| p.provides).collect();
        let dir = crate::repo_root().join("tests/tests");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for call in text.split("require!(").skip(1) {
                let args = call.split(')').next().unwrap();
                for arg in args.split(',') {
                    let item = arg.trim().trim_matches('"');
                    if item.is_empty() {
                        continue;
                    }
                    assert!(
                        listed.iter().any(|l| l == item),
                        "{} requires {item:?}, which {PATH} does not list",
                        path.display()
                    );
                }
            }
        }
    }

    #[test]
    fn a_missing_item_is_named_with_its_package() {
        let why = unavailable(&["sh", "/nonexistent/updraft-tool"]).unwrap();
        assert_eq!(
            why,
            format!("/nonexistent/updraft-tool is not installed (not listed in {PATH})")
        );
        assert_eq!(unavailable(&["sh"]), None);
        let cmd = install_command(
            &[
                &Prerequisite {
                    kind: Kind::Deb,
                    package: "nginx".into(),
                    provides: vec!["nginx".into()],
                },
                &Prerequisite {
                    kind: Kind::Pip,
                    package: "oelint-adv".into(),
                    provides: vec!["oelint-adv".into()],
                },
            ],
            true,
        );
        assert_eq!(
            cmd,
            "sudo apt-get install -y --no-install-recommends nginx && \
             sudo python3 -m pip install --break-system-packages oelint-adv"
        );
    }
}
