//! The test suite's prerequisites, as listed in `tests/prerequisites.txt`.
//!
//! That file is the one list of the Debian and Python packages the tests
//! use and of what shows each one is installed (a command, a file, a
//! library, a Python module). This module owns reading it and looking those
//! things up: [`require!`](crate::require) skips a test whose tools are
//! missing, naming the package; `cargo xtask test` asks [`missing`] what to
//! install; `.ci/run` reads the same file with awk.
//!
//! `venv` lines are Python packages pinned to one version in the tests' own
//! virtual environment, [`venv_dir`] (`target/venv` of the workspace, kept
//! across runs): servers the tests run (gooseBit) with dependencies that
//! must not touch the system Python.
//!
//! This module only looks: it must never install, download or run anything
//! but `python3 -c "import MODULE"` for a `py:` item and the venv's python
//! asking the version of a `venv` package.

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
    /// A Python package pinned as `NAME==VERSION`, installed into the
    /// tests' virtual environment [`venv_dir`] (`python3 -m venv`, then
    /// the venv's pip).
    Venv,
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
    /// `Debian package nginx` / `Python package oelint-adv` /
    /// `Python package goosebit==0.2.12 in the tests' venv target/venv`.
    pub fn describe(&self) -> String {
        match self.kind {
            Kind::Deb => format!("Debian package {}", self.package),
            Kind::Pip => format!("Python package {}", self.package),
            Kind::Venv => format!(
                "Python package {} in the tests' venv {}",
                self.package,
                shown(&venv_dir())
            ),
        }
    }

    /// `(name, version)` of a `venv` line's `NAME==VERSION`.
    pub fn pin(&self) -> Option<(&str, &str)> {
        self.package.split_once("==")
    }

    /// The first item this package provides that cannot be found, if any.
    /// For a `venv` package the package spec itself (`goosebit==0.2.12`)
    /// when the venv holds no such version.
    pub fn first_missing(&self) -> Option<&str> {
        if self.kind == Kind::Venv && !venv_pin_installed(self) {
            return Some(&self.package);
        }
        self.provides
            .iter()
            .map(String::as_str)
            .find(|item| !present(item))
    }
}

/// The tests' Python virtual environment: `target/venv` of the workspace
/// (not `CARGO_TARGET_DIR`, which `cargo xtask cross-test` points
/// elsewhere), so every run and every target finds the one `cargo xtask
/// test` made.
pub fn venv_dir() -> PathBuf {
    crate::repo_root().join("target").join("venv")
}

/// `path` relative to the workspace when it is inside it.
fn shown(path: &Path) -> String {
    path.strip_prefix(crate::repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The venv's python interpreter.
pub fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

/// True when the venv holds exactly the version `p` pins.
fn venv_pin_installed(p: &Prerequisite) -> bool {
    let Some((name, version)) = p.pin() else {
        return false;
    };
    venv_version(name).as_deref() == Some(version)
}

/// The version of the distribution `name` installed in the venv, if any.
pub fn venv_version(name: &str) -> Option<String> {
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return None;
    }
    let python = venv_python();
    if !executable(&python) {
        return None;
    }
    let out = Command::new(python)
        .args([
            "-c",
            &format!("import importlib.metadata as m; print(m.version({name:?}))"),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Parse the prerequisites format: `deb|pip|venv PACKAGE PROVIDES...`,
/// `#` comments and blank lines. A `venv` package must be pinned
/// (`NAME==VERSION`). Errors name the line.
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
            Some("venv") => Kind::Venv,
            Some(other) => {
                return Err(format!(
                    "{PATH} line {}: unknown kind {other:?} (expected deb, pip or venv)",
                    n + 1
                ));
            }
            None => continue,
        };
        let package = words
            .next()
            .ok_or_else(|| format!("{PATH} line {}: no package name", n + 1))?
            .to_string();
        if kind == Kind::Venv
            && !package
                .split_once("==")
                .is_some_and(|(n, v)| !n.is_empty() && !v.is_empty())
        {
            return Err(format!(
                "{PATH} line {}: venv package {package} is not pinned (NAME==VERSION)",
                n + 1
            ));
        }
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

/// Every prerequisite, in file order (Debian packages, then pip, then
/// venv).
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
/// `faketime/libfaketime.so.1`, `fw_printenv`, `target/venv/bin/uvicorn`.
pub fn describe_item(item: &str) -> String {
    item.strip_prefix("py:")
        .map(|m| format!("the Python module {m}"))
        .or_else(|| item.strip_prefix("lib:").map(str::to_string))
        .or_else(|| {
            item.strip_prefix("venv:")
                .map(|c| shown(&venv_dir().join("bin").join(c)))
        })
        .unwrap_or_else(|| item.to_string())
}

/// True when `item` (a PROVIDES entry) is found here. A `venv:` item
/// counts only when the venv holds the pinned version of the package
/// that provides it.
pub fn present(item: &str) -> bool {
    if let Some(module) = item.strip_prefix("py:") {
        return python_has(module);
    }
    if item.starts_with("venv:") {
        let pinned = package_of(item).is_some_and(|p| venv_pin_installed(&p));
        return pinned && find(item).is_some();
    }
    find(item).is_some()
}

/// The path of a command, file, library or venv command item; `None` for
/// `py:` items and for anything not found. `nginx` is the binary the tests would run
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
    if let Some(name) = item.strip_prefix("venv:") {
        let p = venv_dir().join("bin").join(name);
        return (!name.contains('/') && executable(&p)).then_some(p);
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
/// front when `sudo` is true): apt-get for the Debian ones, then pip, then
/// the venv (made with `python3 -m venv` when missing, never with `sudo`:
/// it lives in the workspace).
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
    let venv = names(Kind::Venv);
    if !venv.is_empty() {
        let dir = venv_dir().display().to_string();
        parts.push(format!(
            "python3 -m venv {dir} && {dir}/bin/python -m pip install {}",
            venv.join(" ")
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
        let rank = |k: Kind| match k {
            Kind::Deb => 0,
            Kind::Pip => 1,
            Kind::Venv => 2,
        };
        assert!(
            all.windows(2).all(|w| rank(w[0].kind) <= rank(w[1].kind)),
            "deb lines must come before pip lines (pip needs python3-pip), \
             and pip lines before venv lines (the venv needs python3-venv)"
        );
        assert!(all.iter().any(|p| p.kind == Kind::Venv), "{all:?}");
        for p in &all {
            assert!(
                p.package
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.+=".contains(&b)),
                "{p:?}"
            );
            if p.kind == Kind::Venv {
                assert!(p.pin().is_some(), "{p:?}");
                assert!(
                    p.provides.iter().all(|i| i.starts_with("venv:")),
                    "a venv package provides commands of the venv: {p:?}"
                );
            }
        }
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        assert!(parse("apt nginx nginx").unwrap_err().contains("line 1"));
        assert!(parse("# c\ndeb\n").unwrap_err().contains("line 2"));
        assert!(parse("deb nginx\n").unwrap_err().contains("nothing"));
        assert!(
            parse("venv goosebit venv:uvicorn")
                .unwrap_err()
                .contains("not pinned")
        );
        assert!(
            parse("venv goosebit== venv:uvicorn")
                .unwrap_err()
                .contains("not pinned")
        );
        let pinned = parse("venv goosebit==0.2.12 venv:uvicorn").unwrap();
        assert_eq!(pinned[0].kind, Kind::Venv);
        assert_eq!(pinned[0].pin(), Some(("goosebit", "0.2.12")));
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
                &Prerequisite {
                    kind: Kind::Venv,
                    package: "goosebit==0.2.12".into(),
                    provides: vec!["venv:uvicorn".into()],
                },
            ],
            true,
        );
        let venv = venv_dir().display().to_string();
        assert_eq!(
            cmd,
            format!(
                "sudo apt-get install -y --no-install-recommends nginx && \
                 sudo python3 -m pip install --break-system-packages oelint-adv && \
                 python3 -m venv {venv} && {venv}/bin/python -m pip install goosebit==0.2.12"
            )
        );
    }

    #[test]
    fn a_venv_item_is_a_command_of_the_tests_venv() {
        let why = unavailable(&["venv:no-such-updraft-tool"]).unwrap();
        assert_eq!(
            why,
            format!(
                "{} is not installed (not listed in {PATH})",
                shown(&venv_dir().join("bin/no-such-updraft-tool"))
            )
        );
        assert!(describe_item("venv:uvicorn").ends_with("target/venv/bin/uvicorn"));
        assert_eq!(find("venv:../../bin/sh"), None);
    }
}
