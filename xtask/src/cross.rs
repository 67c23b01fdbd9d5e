//! `cargo xtask cross-test [--target aarch64|armv7]... [--release]`: build
//! the workspace for aarch64 and armv7 and run its tests under qemu-user.
//!
//! No Docker and no rustup targets are needed: the compilers are Debian's
//! `rustc-web` builds, chosen and cached by toolchain.rs. Two are used:
//! first the one of the workspace's `rust-version` builds the agent and the
//! publisher for every target (the MSRV check), then the newest published
//! one builds and runs the tests. The output names both versions.
//!
//! Missing host tools (cross gcc, qemu-user-static) are installed with
//! apt-get when running as root.
//! binfmt handlers are never registered: cargo's runner and
//! `UPDRAFT_TEST_RUNNER` put `qemu-*-static -L <sysroot>` in front of every
//! foreign executable explicitly.
//!
//! The first target builds in the foreground; the MSRV check and the other
//! targets' builds run on a background thread at nice 15 while the tests
//! run, taking only the CPU the emulated tests leave idle, with their
//! output in log files under `target/` (printed when they fail).
//!
//! Tests that cannot run under emulation skip loudly; each target's skips
//! are collected through `UPDRAFT_SKIP_LOG` and listed with their reasons
//! in the summary, beside the number of tests run and the wall time.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::toolchain::{self, Pick, Toolchain, installed};
use crate::util::{self, Result};

/// The crates whose binaries are built for every target: the agent and
/// the publisher.
const BINARY_PACKAGES: [&str; 4] = ["-p", "updraft", "-p", "updraft-publish"];

/// One cross target and the host tools that serve it.
pub(crate) struct Target {
    pub(crate) short: &'static str,
    pub(crate) triple: &'static str,
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
        gcc: "aarch64-linux-gnu-gcc",
        gcc_package: "gcc-aarch64-linux-gnu",
        libc_dev_package: "libc6-dev-arm64-cross",
        qemu: "qemu-aarch64-static",
        sysroot: "/usr/aarch64-linux-gnu",
    },
    Target {
        short: "armv7",
        triple: "armv7-unknown-linux-gnueabihf",
        gcc: "arm-linux-gnueabihf-gcc",
        gcc_package: "gcc-arm-linux-gnueabihf",
        libc_dev_package: "libc6-dev-armhf-cross",
        qemu: "qemu-arm-static",
        sysroot: "/usr/arm-linux-gnueabihf",
    },
];

impl Target {
    fn env_triple(&self) -> String {
        self.triple.to_uppercase().replace('-', "_")
    }

    /// The emulator prefix that runs this target's executables here.
    pub(crate) fn runner(&self) -> String {
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
    let msrv = toolchain::workspace_msrv()?;
    let mut picked = Toolchain::ensure_each(&[Pick::Msrv, Pick::Newest])?.into_iter();
    let (Some(oldest), Some(newest)) = (picked.next(), picked.next()) else {
        return Err("the MSRV and the newest toolchain were not both picked".into());
    };
    println!(
        "cross-test: MSRV check with rustc {} (Debian {}; rust-version {msrv})",
        oldest.release(),
        oldest.version
    );
    println!(
        "cross-test: tests with rustc {} (Debian {}, the newest published for amd64, arm64 and armhf)",
        newest.release(),
        newest.version
    );

    // The first target builds in the foreground. Everything else that
    // only compiles (the MSRV check, the other targets' builds) runs on a
    // background thread at a low CPU priority while tests run under the
    // emulator: the tests keep the CPU they need, and the compiler takes
    // what they leave idle (they spend much of their time waiting on
    // timers, sockets and child processes). Background output goes to log
    // files, printed when the build fails.
    let first = opts.targets[0];
    let mut outcomes = Vec::new();
    let mut lead = new_outcome(first);
    build_target(first, &newest, opts.release, None, &mut lead);
    let same_compiler = oldest.version == newest.version;
    let msrv_outcome = std::thread::scope(|s| {
        let (built_tx, built_rx) = std::sync::mpsc::channel::<Outcome>();
        let background = s.spawn(|| {
            lower_priority();
            // With only one version published the test build is the MSRV
            // build.
            let msrv = (!same_compiler).then(|| msrv_build(first, &oldest));
            for t in &opts.targets[1..] {
                let mut o = new_outcome(t);
                let log = build_log(t);
                build_target(t, &newest, opts.release, Some(&log), &mut o);
                if built_tx.send(o).is_err() {
                    break;
                }
            }
            drop(built_tx);
            msrv
        });
        if lead.error.is_none() {
            test_target(first, &newest, opts.release, &mut lead);
        }
        outcomes.push(lead);
        for t in &opts.targets[1..] {
            let Ok(mut o) = built_rx.recv() else {
                break;
            };
            let log = build_log(t);
            println!(
                "\n== {}: built in the background in {:.1} s ({})",
                t.triple,
                o.build_secs,
                log.display()
            );
            if o.error.is_some() {
                print_tail(&log, 80);
            } else {
                test_target(t, &newest, opts.release, &mut o);
            }
            outcomes.push(o);
        }
        background.join().unwrap_or_else(|_| {
            Some((0.0, Err("the background build thread panicked".to_string())))
        })
    });

    println!("\ncross-test summary:");
    let mut failed = false;
    match &msrv_outcome {
        Some((secs, result)) => {
            println!(
                "  MSRV     check {secs:6.1}s  rustc {} (rust-version {msrv}): updraft and updraft-publish for {}: {}",
                oldest.release(),
                opts.targets[0].short,
                match result {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("FAILED: {e}"),
                }
            );
            failed |= result.is_err();
        }
        None => println!(
            "  MSRV     rustc {} is also the newest published: the test build below is the MSRV build",
            oldest.release()
        ),
    }
    for o in &outcomes {
        let run = o.passed.saturating_sub(o.skips.len() as u64) + o.failed;
        println!(
            "  {:8} build {:6.1}s  tests {:6.1}s  rustc {}  run {run}, passed {}, failed {}, skipped {}, ignored {}",
            o.target,
            o.build_secs,
            o.test_secs,
            newest.release(),
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
        Err("cross-test failed (see above)".into())
    } else {
        Ok(())
    }
}

/// The MSRV check: the agent and the publisher, type- and borrow-checked
/// for `t` (the first target asked for: which std APIs and language
/// features a compiler has does not depend on the target, and the newest
/// compiler builds every target for the tests) with the compiler of the
/// workspace's `rust-version`, in a target directory of their own. `cargo
/// check` runs every front-end check a build does, the C dependencies'
/// build scripts included; code generation and linking, which the newest
/// compiler exercises below, are what it leaves out. Returns the wall time
/// and the result.
fn msrv_build(t: &Target, tc: &Toolchain) -> (f64, Result) {
    let target_dir = util::root().join("target").join("cross-msrv");
    let start = Instant::now();
    let log = target_dir.join("check.log");
    println!(
        "\n== {}: MSRV check of updraft and updraft-publish with rustc {}, in the background ({})",
        t.triple,
        tc.release(),
        log.display()
    );
    let mut build = cross_cargo(t, tc, &target_dir);
    build
        .args(["check", "--locked", "--target", t.triple])
        .args(BINARY_PACKAGES);
    let result = run_logged(&mut build, &log).map_err(|e| {
        print_tail(&log, 80);
        format!("{}: {e}", t.short)
    });
    (start.elapsed().as_secs_f64(), result)
}

/// Where a background build of `t` writes its output.
fn build_log(t: &Target) -> PathBuf {
    test_dir(t).join("build.log")
}

/// The cargo target directory of `t`'s test build: one per target, so a
/// build in the background never waits for the lock of a directory whose
/// tests are running.
fn test_dir(t: &Target) -> PathBuf {
    util::root().join("target").join("cross-test").join(t.short)
}

/// Run `cmd` with its output going to `log` (created afresh).
fn run_logged(cmd: &mut Command, log: &Path) -> Result {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let out = std::fs::File::create(log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("opening {}: {e}", log.display()))?;
    cmd.stdout(out).stderr(err);
    util::run(cmd)
}

/// Print the last `n` lines of a log file.
fn print_tail(log: &Path, n: usize) {
    match std::fs::read_to_string(log) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            println!("-- last lines of {}:", log.display());
            for l in &lines[lines.len().saturating_sub(n)..] {
                println!("{l}");
            }
        }
        Err(e) => println!("-- {} cannot be read: {e}", log.display()),
    }
}

/// Lower this thread's CPU priority (nice 15); the processes it starts
/// inherit it. Best effort: at the normal priority the builds are only
/// less polite.
fn lower_priority() {
    // SAFETY: setpriority on the calling thread (who = 0) with a plain
    // integer; no memory is passed.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 15) };
    if rc != 0 {
        println!(
            "background builds run at the normal priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn new_outcome(t: &Target) -> Outcome {
    Outcome {
        target: t.short,
        build_secs: 0.0,
        test_secs: 0.0,
        passed: 0,
        failed: 0,
        ignored: 0,
        skips: Vec::new(),
        hangs: Vec::new(),
        error: None,
    }
}

/// Build the binaries and the tests of `t` (output to `log` when given).
fn build_target(t: &Target, tc: &Toolchain, release: bool, log: Option<&Path>, o: &mut Outcome) {
    let target_dir = test_dir(t);
    if log.is_none() {
        println!(
            "\n== {}: building updraft, updraft-publish and the tests",
            t.triple
        );
    }
    let start = Instant::now();
    let mut build = cross_cargo(t, tc, &target_dir);
    build
        .args(["build", "--target", t.triple])
        .args(BINARY_PACKAGES);
    // The binaries are built with the profile the tests use, so the
    // workspace crates compile once for both (the test profile writes to
    // target/<triple>/debug, where the tests look for the binaries).
    build.args(["--profile", if release { "release" } else { "test" }]);
    let run = |cmd: &mut Command| match log {
        Some(log) => run_logged(cmd, log),
        None => util::run(cmd),
    };
    let built = run(&mut build).and_then(|()| {
        let mut tests = test_cargo(t, tc, &target_dir, release);
        tests.arg("--no-run");
        if let Some(log) = log {
            // Appended to the build's log.
            let out = std::fs::OpenOptions::new()
                .append(true)
                .open(log)
                .map_err(|e| format!("opening {}: {e}", log.display()))?;
            let err = out
                .try_clone()
                .map_err(|e| format!("opening {}: {e}", log.display()))?;
            tests.stdout(out).stderr(err);
        }
        util::run(&mut tests)
    });
    o.build_secs = start.elapsed().as_secs_f64();
    if let Err(e) = built {
        o.error = Some(format!("build: {e}"));
    }
}

/// Run the tests of `t`, built by [`build_target`], under its emulator.
fn test_target(t: &Target, tc: &Toolchain, release: bool, o: &mut Outcome) {
    let target_dir = test_dir(t);
    let profile_dir = target_dir
        .join(t.triple)
        .join(if release { "release" } else { "debug" });
    let skip_log = target_dir.join(format!("{}-skips.log", t.short));
    let _ = std::fs::remove_file(&skip_log);
    let hang_log = target_dir.join(format!("{}-hangs.log", t.short));
    let _ = std::fs::remove_file(&hang_log);

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
    let result = run_counting(&mut test, o);
    o.test_secs = start.elapsed().as_secs_f64();
    o.hangs = std::fs::read_to_string(&hang_log)
        .map(|s| s.lines().map(|l| l.replace('\t', ": ")).collect())
        .unwrap_or_default();
    // Sorted, and without the duplicates a test binary run again after a
    // hang records.
    o.skips = match updraft_tests::skip::read_log(&skip_log) {
        Ok(skips) => skips.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    };
    if let Err(e) = result {
        o.error = Some(format!("tests: {e}"));
    }
}

/// Seconds a test binary may run under the emulator before it counts as
/// hung: about seven times the slowest (35 s), while a hang, which costs
/// the whole limit before the binary runs again, stays cheap.
const HANG_LIMIT_SECS: u64 = 240;

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
///
/// Test builds carry line tables only, not full debug info: a backtrace
/// still names file and line, and the two targets' builds spend about a
/// third less time generating and linking debug info nobody reads under
/// an emulator. Incremental compilation is off: every cross build starts
/// from a clean tree in CI, where it only costs time and disk.
pub(crate) fn cross_cargo(t: &Target, tc: &Toolchain, target_dir: &Path) -> Command {
    let mut c = util::cargo();
    c.env("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")
        .env("CARGO_PROFILE_TEST_DEBUG", "line-tables-only")
        .env("CARGO_INCREMENTAL", "0");
    let up = t.env_triple();
    let low = t.triple.replace('-', "_");
    c.env("RUSTC", tc.wrapper())
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env("CARGO_TARGET_DIR", target_dir)
        .env(format!("CARGO_TARGET_{up}_LINKER"), t.gcc)
        .env(format!("CARGO_TARGET_{up}_RUNNER"), t.runner())
        .env(format!("CC_{low}"), t.gcc)
        .env(format!("AR_{low}"), t.gcc.replace("-gcc", "-ar"));
    c
}

/// Leave unwind tables out of a release build of the device binary for
/// `triple`. It ships with `panic = "abort"` (Cargo.toml), so nothing
/// unwinds; without the tables of its Rust code and of the C code the build
/// compiles (SQLite, zstd, ring), the aarch64 binary is about 130 KB
/// smaller (3,160,512 → 3,029,440 bytes). Only for builds with `--target`,
/// whose flags reach neither build scripts nor proc macros (which unwind).
pub(crate) fn without_unwind_tables(c: &mut Command, triple: &str) {
    let up = triple.to_uppercase().replace('-', "_");
    let low = triple.replace('-', "_");
    c.env(
        format!("CARGO_TARGET_{up}_RUSTFLAGS"),
        "-C force-unwind-tables=no",
    )
    .env(
        format!("CFLAGS_{low}"),
        "-fno-asynchronous-unwind-tables -fno-unwind-tables",
    );
}

/// Build the release `updraft` for `t` (installing the host tools and the
/// cross toolchain when missing) under `target/cross`; returns its path.
pub(crate) fn release_agent(t: &Target) -> Result<PathBuf> {
    ensure_host_tools(&[t])?;
    let tc = Toolchain::ensure(Pick::Newest)?;
    let target_dir = util::root().join("target").join("cross");
    util::run(&mut release_build(t, &tc, &target_dir))?;
    Ok(target_dir.join(t.triple).join("release").join("updraft"))
}

/// `cargo build --release -p updraft --bin updraft --target <t>` in
/// `target_dir`, without unwind tables: the device binary as it ships.
fn release_build(t: &Target, tc: &Toolchain, target_dir: &Path) -> Command {
    let mut c = cross_cargo(t, tc, target_dir);
    without_unwind_tables(&mut c, t.triple);
    c.args([
        "build",
        "--release",
        "-p",
        "updraft",
        "--bin",
        "updraft",
        "--target",
        t.triple,
    ]);
    c
}

/// The previous landed release's `updraft` (the commit
/// `updraft_tests::previous::PINNED` names), built in release mode for `t`
/// from its own tree with the cached cross toolchain, under
/// `target/previous-release/cross`, at a lower CPU priority (nice 15, as
/// the background builds of cross-test: it is built while other machines
/// boot); kept as
/// `target/previous-release/<commit>/<triple>/updraft` for later runs.
pub(crate) fn previous_release_agent(t: &Target) -> Result<PathBuf> {
    let src = updraft_tests::previous::source()?;
    let dir = src
        .parent()
        .ok_or_else(|| format!("{} has no parent", src.display()))?
        .join(t.triple);
    let exe = dir.join("updraft");
    if exe.is_file() {
        return Ok(exe);
    }
    ensure_host_tools(&[t])?;
    let tc = Toolchain::ensure(Pick::Newest)?;
    let target_dir = util::root()
        .join("target")
        .join("previous-release")
        .join("cross");
    let mut c = release_build(t, &tc, &target_dir);
    c.arg("--locked");
    for key in updraft_tests::previous::current_env_keys() {
        c.env_remove(key);
    }
    let started = Instant::now();
    println!(
        "building the previous release of updraft ({}) for {} in {}",
        updraft_tests::previous::short(updraft_tests::previous::PINNED),
        t.triple,
        target_dir.display()
    );
    c.current_dir(&src);
    // On a thread of its own at a lower priority, which the build inherits.
    std::thread::spawn(move || {
        lower_priority();
        util::run(&mut c)
    })
    .join()
    .map_err(|_| "the build of the previous release panicked".to_string())??;
    println!(
        "built the previous release for {} in {:.1} s",
        t.triple,
        started.elapsed().as_secs_f64()
    );
    let built = target_dir.join(t.triple).join("release").join("updraft");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let staged = dir.join("updraft.partial");
    std::fs::copy(&built, &staged)
        .and_then(|_| std::fs::rename(&staged, &exe))
        .map_err(|e| format!("copying {} to {}: {e}", built.display(), exe.display()))?;
    Ok(exe)
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

/// Cross gcc, its libc headers and qemu-user-static: installed with apt-get
/// when missing. (The libraries the compiler runs on are the toolchain's
/// business, see toolchain.rs.)
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
    if missing.is_empty() {
        return Ok(());
    }
    toolchain::install_packages(&missing, "the cross compilers and qemu-user")
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
