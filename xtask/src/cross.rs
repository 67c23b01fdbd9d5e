//! `cargo xtask cross-test [--target aarch64|armv7]... [--release]`: build
//! the workspace for aarch64 and armv7 and run its tests under qemu-user.
//!
//! No Docker and no rustup targets are needed. The compiler is Debian's
//! `rustc-web` with the arm64/armhf standard libraries from the multiarch
//! `libstd-rust-web-dev` packages, extracted (never installed) into a cache
//! under `target/cross-toolchain/<version>/` so only the first run
//! downloads. The version is the newest one that `apt-cache madison` lists
//! for amd64, arm64 and armhf alike; because that rustc is the oldest one
//! updraft supports (1.85), this run is also the MSRV check.
//!
//! Missing host tools (cross gcc, qemu-user-static, the LLVM library
//! `rustc-web` links to) are installed with apt-get when running as root.
//! binfmt handlers are never registered: cargo's runner and
//! `UPDRAFT_TEST_RUNNER` put `qemu-*-static -L <sysroot>` in front of every
//! foreign executable explicitly.
//!
//! Tests that cannot run under emulation skip loudly; each target's skips
//! are collected through `UPDRAFT_SKIP_LOG` and listed with their reasons
//! in the summary, beside the number of tests run and the wall time.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::util::{self, Result};

/// One cross target and the host tools that serve it.
pub(crate) struct Target {
    pub(crate) short: &'static str,
    pub(crate) triple: &'static str,
    debian_arch: &'static str,
    pub(crate) gcc: &'static str,
    gcc_package: &'static str,
    /// Headers and crt files the C dependencies (ring, zstd-sys, SQLite)
    /// compile and link against; only recommended by the gcc package.
    libc_dev_package: &'static str,
    qemu: &'static str,
    sysroot: &'static str,
}

pub(crate) const TARGETS: &[Target] = &[
    Target {
        short: "aarch64",
        triple: "aarch64-unknown-linux-gnu",
        debian_arch: "arm64",
        gcc: "aarch64-linux-gnu-gcc",
        gcc_package: "gcc-aarch64-linux-gnu",
        libc_dev_package: "libc6-dev-arm64-cross",
        qemu: "qemu-aarch64-static",
        sysroot: "/usr/aarch64-linux-gnu",
    },
    Target {
        short: "armv7",
        triple: "armv7-unknown-linux-gnueabihf",
        debian_arch: "armhf",
        gcc: "arm-linux-gnueabihf-gcc",
        gcc_package: "gcc-arm-linux-gnueabihf",
        libc_dev_package: "libc6-dev-armhf-cross",
        qemu: "qemu-arm-static",
        sysroot: "/usr/arm-linux-gnueabihf",
    },
];

/// The LLVM library `rustc-web` 1.85 is linked against.
const LLVM_PACKAGE: &str = "libllvm19";

/// Packages whose files are extracted into the toolchain cache.
const STD_DEV: &str = "libstd-rust-web-dev";

impl Target {
    fn env_triple(&self) -> String {
        self.triple.to_uppercase().replace('-', "_")
    }

    fn runner(&self) -> String {
        format!("{} -L {}", self.qemu, self.sysroot)
    }

    fn from_name(name: &str) -> Result<&'static Target> {
        TARGETS
            .iter()
            .find(|t| t.short == name || t.triple == name)
            .ok_or_else(|| format!("unknown target {name:?} (aarch64, armv7)"))
    }
}

struct Options {
    targets: Vec<&'static Target>,
    release: bool,
}

fn parse_args(args: &[String]) -> Result<Options> {
    let mut targets = Vec::new();
    let mut release = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--target" => {
                let name = it.next().ok_or("--target needs a value (aarch64, armv7)")?;
                targets.push(Target::from_name(name)?);
            }
            "--release" => release = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: cargo xtask cross-test [--target aarch64|armv7]... [--release]"
                ));
            }
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().collect();
    }
    Ok(Options { targets, release })
}

/// What one target's run produced, for the summary.
struct Outcome {
    target: &'static str,
    build_secs: f64,
    test_secs: f64,
    passed: u64,
    failed: u64,
    ignored: u64,
    skips: Vec<String>,
    /// Test binaries killed after hanging in the emulator (and run again).
    hangs: Vec<String>,
    error: Option<String>,
}

pub fn run(args: &[String]) -> Result {
    let opts = parse_args(args)?;
    ensure_host_tools(&opts.targets)?;
    let toolchain = Toolchain::ensure()?;
    println!(
        "cross-test: rustc {} from {} (this is also the MSRV check)",
        toolchain.version,
        toolchain.root.display()
    );
    let rustc_version = util::output(Command::new(&toolchain.wrapper).arg("--version"))?;
    println!("cross-test: {}", rustc_version.trim());

    let mut outcomes = Vec::new();
    for t in &opts.targets {
        outcomes.push(run_target(t, &toolchain, opts.release));
    }

    println!("\ncross-test summary (rustc {}):", toolchain.version);
    let mut failed = false;
    for o in &outcomes {
        let run = o.passed.saturating_sub(o.skips.len() as u64) + o.failed;
        println!(
            "  {:8} build {:6.1}s  tests {:6.1}s  run {run}, passed {}, failed {}, skipped {}, ignored {}",
            o.target,
            o.build_secs,
            o.test_secs,
            o.passed.saturating_sub(o.skips.len() as u64),
            o.failed,
            o.skips.len(),
            o.ignored
        );
        for s in &o.skips {
            println!("           skipped: {s}");
        }
        for h in &o.hangs {
            println!("           emulator hang: {h} (killed and run again)");
        }
        if let Some(e) = &o.error {
            println!("           FAILED: {e}");
            failed = true;
        }
    }
    if failed {
        Err("cross-test failed for at least one target (see above)".into())
    } else {
        Ok(())
    }
}

fn run_target(t: &'static Target, tc: &Toolchain, release: bool) -> Outcome {
    let mut o = Outcome {
        target: t.short,
        build_secs: 0.0,
        test_secs: 0.0,
        passed: 0,
        failed: 0,
        ignored: 0,
        skips: Vec::new(),
        hangs: Vec::new(),
        error: None,
    };
    let target_dir = util::root().join("target").join("cross");
    let profile_dir = target_dir
        .join(t.triple)
        .join(if release { "release" } else { "debug" });
    let skip_log = target_dir.join(format!("{}-skips.log", t.short));
    let _ = std::fs::remove_file(&skip_log);
    let hang_log = target_dir.join(format!("{}-hangs.log", t.short));
    let _ = std::fs::remove_file(&hang_log);

    println!(
        "\n== {}: building updraft, updraft-publish and the tests",
        t.triple
    );
    let start = Instant::now();
    let mut build = cross_cargo(t, tc, &target_dir);
    build.args([
        "build",
        "--target",
        t.triple,
        "-p",
        "updraft",
        "-p",
        "updraft-publish",
    ]);
    // The binaries are built with the profile the tests use, so the
    // workspace crates compile once for both (the test profile writes to
    // target/<triple>/debug, where the tests look for the binaries).
    build.args(["--profile", if release { "release" } else { "test" }]);
    let built = util::run(&mut build).and_then(|()| {
        let mut tests = test_cargo(t, tc, &target_dir, release);
        tests.arg("--no-run");
        util::run(&mut tests)
    });
    o.build_secs = start.elapsed().as_secs_f64();
    if let Err(e) = built {
        o.error = Some(format!("build: {e}"));
        return o;
    }

    println!("\n== {}: running the tests under {}", t.triple, t.qemu);
    let start = Instant::now();
    let mut test = test_cargo(t, tc, &target_dir, release);
    test.arg("--no-fail-fast");
    // Each test binary runs under `xtask emulate`, which ends and re-runs
    // one that hangs in the emulator (see emulate.rs).
    match supervised_runner(t, &hang_log) {
        Ok(r) => {
            test.env(format!("CARGO_TARGET_{}_RUNNER", t.env_triple()), r);
        }
        Err(e) => println!("cross-test: running the tests without a hang guard: {e}"),
    }
    test.env("UPDRAFT_TEST_RUNNER", t.runner())
        .env("UPDRAFT_BIN_DIR", &profile_dir)
        .env("UPDRAFT_SKIP_LOG", &skip_log);
    let result = run_counting(&mut test, &mut o);
    o.test_secs = start.elapsed().as_secs_f64();
    o.hangs = std::fs::read_to_string(&hang_log)
        .map(|s| s.lines().map(|l| l.replace('\t', ": ")).collect())
        .unwrap_or_default();
    o.skips = std::fs::read_to_string(&skip_log)
        .map(|s| s.lines().map(|l| l.replace('\t', ": ")).collect())
        .unwrap_or_default();
    // A test binary run again after a hang records its skips twice.
    o.skips.sort();
    o.skips.dedup();
    if let Err(e) = result {
        o.error = Some(format!("tests: {e}"));
    }
    o
}

/// Seconds a test binary may run under the emulator before it counts as
/// hung; the slowest takes about 35 s.
const HANG_LIMIT_SECS: u64 = 600;

/// `t`'s emulator command behind `xtask emulate` (cargo splits a runner on
/// whitespace, so none of the paths may contain any).
fn supervised_runner(t: &Target, hang_log: &Path) -> Result<String> {
    let xtask = std::env::current_exe().map_err(|e| format!("locating xtask: {e}"))?;
    let (xtask, log) = (xtask.display().to_string(), hang_log.display().to_string());
    if xtask.contains(char::is_whitespace) || log.contains(char::is_whitespace) {
        return Err(format!("{xtask} or {log} contains whitespace"));
    }
    Ok(format!(
        "{xtask} emulate --limit {HANG_LIMIT_SECS} --log {log} -- {}",
        t.runner()
    ))
}

/// The values of repeated `--target NAME` flags (`x86_64`, `aarch64`,
/// `armv7` or a full triple), the only flag `usage` allows.
pub(crate) fn target_flags(args: &[String], usage: &str) -> Result<Vec<String>> {
    let mut wanted = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--target" => wanted.push(
                it.next()
                    .ok_or("--target needs a value (x86_64, aarch64, armv7)")?
                    .clone(),
            ),
            other => return Err(format!("unknown argument {other:?}; usage: {usage}")),
        }
    }
    Ok(wanted)
}

/// `cargo test` of the workspace's crates for `t`. `--tests`: unit and
/// integration tests; doc tests are about the documentation, and this
/// cargo's rustdoc has no std for the target.
fn test_cargo(t: &Target, tc: &Toolchain, target_dir: &Path, release: bool) -> Command {
    let mut c = cross_cargo(t, tc, target_dir);
    c.args(["test", "--tests", "--target", t.triple]);
    c.args([
        "-p",
        "updraft",
        "-p",
        "updraft-publish",
        "-p",
        "updraft-tests",
    ]);
    if release {
        c.arg("--release");
    }
    c
}

/// A cargo command set up to cross-compile for `t` with the cached rustc.
pub(crate) fn cross_cargo(t: &Target, tc: &Toolchain, target_dir: &Path) -> Command {
    let mut c = util::cargo();
    let up = t.env_triple();
    let low = t.triple.replace('-', "_");
    c.env("RUSTC", &tc.wrapper)
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env("CARGO_TARGET_DIR", target_dir)
        .env(format!("CARGO_TARGET_{up}_LINKER"), t.gcc)
        .env(format!("CARGO_TARGET_{up}_RUNNER"), t.runner())
        .env(format!("CC_{low}"), t.gcc)
        .env(format!("AR_{low}"), t.gcc.replace("-gcc", "-ar"));
    c
}

/// Run `cmd`, echoing its stdout, and add up libtest's result lines.
fn run_counting(cmd: &mut Command, o: &mut Outcome) -> Result {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {shown}: {e}"))?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("reading test output: {e}"))?;
            println!("{line}");
            if let Some((p, f, i)) = parse_result_line(&line) {
                o.passed += p;
                o.failed += f;
                o.ignored += i;
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed: {status}"))
    }
}

/// `test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; …`
fn parse_result_line(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let mut passed = None;
    let mut failed = None;
    let mut ignored = None;
    for part in rest.split(';') {
        let words: Vec<&str> = part.split_whitespace().collect();
        let n = words
            .iter()
            .rev()
            .nth(1)
            .and_then(|w| w.parse::<u64>().ok());
        match words.last() {
            Some(&"passed") => passed = n,
            Some(&"failed") => failed = n,
            Some(&"ignored") => ignored = n,
            _ => {}
        }
    }
    Some((passed?, failed?, ignored.unwrap_or(0)))
}

/// Cross gcc, qemu-user-static and the LLVM library: installed with apt-get
/// when missing.
pub(crate) fn ensure_host_tools(targets: &[&Target]) -> Result {
    let mut missing = Vec::new();
    for t in targets {
        for p in [t.gcc_package, t.libc_dev_package] {
            if !installed(p) {
                missing.push(p);
            }
        }
        if !util::have(t.qemu) && !missing.contains(&"qemu-user-static") {
            missing.push("qemu-user-static");
        }
    }
    if !installed(LLVM_PACKAGE) {
        missing.push(LLVM_PACKAGE);
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !util::is_root() {
        return Err(format!(
            "missing host packages {}: install them (apt-get install -y {}) or run as root",
            missing.join(" "),
            missing.join(" ")
        ));
    }
    println!("cross-test: installing {}", missing.join(" "));
    apt_update();
    let mut c = Command::new("apt-get");
    c.args(["install", "-y", "--no-install-recommends"])
        .args(&missing);
    c.env("DEBIAN_FRONTEND", "noninteractive");
    util::run(&mut c)
}

/// True when dpkg lists `package` as installed.
fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout) == "install ok installed"
        })
}

/// `apt-get update`, tolerating a failure: one architecture's index being
/// mid-sync on the mirror must not stop the run, the main index is enough.
fn apt_update() {
    let status = Command::new("apt-get").args(["update", "-q"]).status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!(
            "cross-test: apt-get update exited with {s}; continuing with the indexes it got"
        ),
        Err(e) => eprintln!("cross-test: apt-get update could not start: {e}; continuing"),
    }
}

/// The extracted `rustc-web` with the arm64/armhf standard libraries.
pub(crate) struct Toolchain {
    pub(crate) version: String,
    root: PathBuf,
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

    pub(crate) fn ensure() -> Result<Toolchain> {
        let version = match common_version() {
            Ok(v) => v,
            Err(e) => match cached_versions().pop() {
                Some(v) => {
                    eprintln!("cross-test: {e}; using the cached toolchain {v}");
                    v
                }
                None => return Err(e),
            },
        };
        let root = Self::cache_dir().join(sanitize(&version));
        let wrapper = root.join("rustc");
        let tc = Toolchain {
            version,
            root,
            wrapper,
        };
        if tc.root.join(".complete").is_file() {
            return Ok(tc);
        }
        tc.fetch()?;
        Ok(tc)
    }

    fn fetch(&self) -> Result {
        let v = &self.version;
        println!("cross-test: fetching rustc-web {v} and the arm64/armhf standard libraries");
        let runtime = runtime_package(v)?;
        let debs = self.root.join("debs");
        let _ = std::fs::remove_dir_all(&self.root);
        std::fs::create_dir_all(&debs).map_err(|e| format!("creating {}: {e}", debs.display()))?;
        let mut dl = Command::new("apt-get");
        // The cache belongs to root; apt's unprivileged download user
        // cannot write there.
        dl.current_dir(&debs)
            .args(["-o", "APT::Sandbox::User=root", "download"]);
        dl.arg(format!("rustc-web={v}"));
        dl.arg(format!("{runtime}={v}"));
        dl.arg(format!("{STD_DEV}={v}"));
        for t in TARGETS {
            dl.arg(format!("{STD_DEV}:{}={v}", t.debian_arch));
        }
        util::run(&mut dl)?;
        let sysroot = self.root.join("sysroot");
        let entries =
            std::fs::read_dir(&debs).map_err(|e| format!("listing {}: {e}", debs.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("listing {}: {e}", debs.display()))?
                .path();
            if path.extension().is_some_and(|x| x == "deb") {
                util::run(Command::new("dpkg").arg("-x").arg(&path).arg(&sysroot))?;
            }
        }
        let rustc = sysroot.join("usr/bin/rustc");
        if !rustc.is_file() {
            return Err(format!(
                "{} is missing after extracting rustc-web {v}",
                rustc.display()
            ));
        }
        for t in TARGETS {
            let lib = sysroot.join("usr/lib/rustlib").join(t.triple).join("lib");
            if !lib.is_dir() {
                return Err(format!(
                    "{} is missing after extracting {STD_DEV}:{}",
                    lib.display(),
                    t.debian_arch
                ));
            }
        }
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

/// The newest `libstd-rust-web-dev` version published for amd64, arm64 and
/// armhf alike. Adds the foreign architectures and updates the index when
/// apt does not know them yet.
fn common_version() -> Result<String> {
    match madison_common() {
        Ok(v) => return Ok(v),
        Err(e) if !util::is_root() => return Err(e),
        Err(e) => eprintln!("cross-test: {e}; adding arm64/armhf to dpkg and updating the index"),
    }
    let foreign = util::output(Command::new("dpkg").arg("--print-foreign-architectures"))?;
    for t in TARGETS {
        if !foreign.lines().any(|l| l.trim() == t.debian_arch) {
            util::run(Command::new("dpkg").args(["--add-architecture", t.debian_arch]))?;
        }
    }
    apt_update();
    madison_common()
}

fn madison_common() -> Result<String> {
    let mut per_arch: Vec<Vec<String>> = Vec::new();
    for arch in ["amd64"]
        .into_iter()
        .chain(TARGETS.iter().map(|t| t.debian_arch))
    {
        let out = util::output(
            Command::new("apt-cache").args(["madison", &format!("{STD_DEV}:{arch}")]),
        )?;
        let versions: Vec<String> = out
            .lines()
            .filter_map(|l| {
                let cols: Vec<&str> = l.split('|').map(str::trim).collect();
                // package | version | source  Packages
                match cols.as_slice() {
                    [_, v, src] if src.ends_with(&format!("{arch} Packages")) => {
                        Some((*v).to_string())
                    }
                    _ => None,
                }
            })
            .collect();
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
    common.pop().ok_or_else(|| {
        format!("no {STD_DEV} version is published for all of amd64, arm64 and armhf")
    })
}

/// The versioned runtime package (`libstd-rust-web-1.85`) that
/// `libstd-rust-web-dev` of version `v` depends on.
fn runtime_package(v: &str) -> Result<String> {
    let out = util::output(Command::new("apt-cache").args(["depends", &format!("{STD_DEV}={v}")]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| {
            p.starts_with("libstd-rust-web-")
                && p.as_bytes().get(16).is_some_and(u8::is_ascii_digit)
        })
        .map(|p| p.split(':').next().unwrap_or(p).to_string())
        .ok_or_else(|| {
            format!(
                "apt-cache depends {STD_DEV}={v} names no libstd-rust-web-<version> runtime package"
            )
        })
}

/// Order Debian version strings with `dpkg --compare-versions`.
fn compare_debian_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let lt = Command::new("dpkg")
        .args(["--compare-versions", a, "lt", b])
        .status()
        .is_ok_and(|s| s.success());
    if lt {
        std::cmp::Ordering::Less
    } else if a == b {
        std::cmp::Ordering::Equal
    } else {
        std::cmp::Ordering::Greater
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_are_counted() {
        assert_eq!(
            parse_result_line(
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s"
            ),
            Some((12, 0, 1))
        );
        assert_eq!(
            parse_result_line(
                "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out"
            ),
            Some((3, 2, 0))
        );
        assert_eq!(parse_result_line("running 3 tests"), None);
    }

    #[test]
    fn targets_have_cargo_env_names() {
        let t = Target::from_name("armv7").unwrap();
        assert_eq!(t.env_triple(), "ARMV7_UNKNOWN_LINUX_GNUEABIHF");
        assert_eq!(t.runner(), "qemu-arm-static -L /usr/arm-linux-gnueabihf");
        assert!(Target::from_name("mips").is_err());
    }
}
