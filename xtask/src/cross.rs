//! `cargo xtask cross-test [--target aarch64|armv7]... [--release] [--full]`:
//! build the workspace for aarch64 and armv7 and run its tests under
//! qemu-user.
//!
//! Which tests: the unit tests of the agent, the publisher and the test
//! support on every target, and the integration test files that
//! [`crate::pyramid`] places on that target (what the target can change:
//! word size, `time_t`, ioctls, the bootloader environments, slot I/O,
//! SQLite, the delta patcher, TLS); the rest is proven by the host run and,
//! for aarch64, by real boots. Only the selected test binaries are built.
//! The run prints one line naming what it left to the host; `--full`
//! builds and runs every test file on every target.
//!
//! The tests run under cargo-nextest (a process per test, several at once:
//! emulated tests mostly wait, on timers, sockets and child processes),
//! with `cargo test` as the fallback where nextest is not installed.
//!
//! No Docker and no rustup targets are needed: the compilers are Debian's
//! `rustc-web` builds, chosen and cached by toolchain.rs. Two are used,
//! and each target is built once, by one of them, which then runs its
//! tests: armv7 with the compiler of the workspace's `rust-version` (the
//! MSRV check, a build that is also tested), aarch64 with the newest
//! published one. Only when no target asked for is built by the MSRV
//! compiler and the versions differ does a separate `cargo check` with it
//! run. The output names both versions.
//!
//! Missing host tools (cross gcc, qemu-user-static) are installed with
//! apt-get when running as root.
//! binfmt handlers are never registered: cargo's runner and
//! `UPDRAFT_TEST_RUNNER` put `qemu-*-static -L <sysroot>` in front of every
//! foreign executable explicitly.
//!
//! The targets build side by side, each in its own target directory with
//! its output in a log file under `target/` (printed when it fails); each
//! target's tests run as soon as its build ends, beside the other target's
//! build or tests, every line prefixed with the target's name.
//!
//! Tests that cannot run under emulation skip loudly; each target's skips
//! are collected through `UPDRAFT_SKIP_LOG` and listed with their reasons
//! in the summary, beside the number of tests run and the wall time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::nextest::{self, Counts};
use crate::pyramid;
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
    /// Whether `off_t` of glibc's plain file calls is 32 bits here (see
    /// [`crate::large_files`]).
    offsets_32: bool,
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
        offsets_32: false,
    },
    Target {
        short: "armv7",
        triple: "armv7-unknown-linux-gnueabihf",
        gcc: "arm-linux-gnueabihf-gcc",
        gcc_package: "gcc-arm-linux-gnueabihf",
        libc_dev_package: "libc6-dev-armhf-cross",
        qemu: "qemu-arm-static",
        sysroot: "/usr/arm-linux-gnueabihf",
        offsets_32: true,
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

    /// Fail when the device binary at `binary` would refuse files of
    /// 2 GiB or more on this target ([`crate::large_files`]).
    pub(crate) fn check_large_files(&self, binary: &Path) -> Result {
        if !self.offsets_32 {
            return Ok(());
        }
        crate::large_files::check(binary, self.gcc.trim_end_matches("-gcc"))
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
    /// Every test file on every target, not only the pyramid's selection.
    full: bool,
}

fn parse_args(args: &[String]) -> Result<Options> {
    let mut targets = Vec::new();
    let mut release = false;
    let mut full = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--target" => {
                let name = it.next().ok_or("--target needs a value (aarch64, armv7)")?;
                targets.push(Target::from_name(name)?);
            }
            "--release" => release = true,
            "--full" => full = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: cargo xtask cross-test [--target aarch64|armv7]... [--release] [--full]"
                ));
            }
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().collect();
    }
    Ok(Options {
        targets,
        release,
        full,
    })
}

/// What one target's run produced, for the summary.
struct Outcome {
    target: &'static str,
    build_secs: f64,
    test_secs: f64,
    counts: Counts,
    skips: Vec<String>,
    /// Test binaries killed after hanging in the emulator (and run again).
    hangs: Vec<String>,
    error: Option<String>,
}

pub fn run(args: &[String]) -> Result {
    let opts = parse_args(args)?;
    ensure_host_tools(&opts.targets)?;
    // The host's own publisher, which the emulated tests run natively
    // (tests/src/bin.rs); built now, while this process has one thread.
    let host_bins = util::build_binaries()?;
    let msrv = toolchain::workspace_msrv()?;
    let mut picked = Toolchain::ensure_each(&[Pick::Msrv, Pick::Newest])?.into_iter();
    let (Some(oldest), Some(newest)) = (picked.next(), picked.next()) else {
        return Err("the MSRV and the newest toolchain were not both picked".into());
    };
    println!(
        "cross-test: the MSRV compiler is rustc {} (Debian {}; rust-version {msrv})",
        oldest.release(),
        oldest.version
    );
    println!(
        "cross-test: the newest is rustc {} (Debian {}, the newest published for amd64, arm64 and armhf)",
        newest.release(),
        newest.version
    );

    // Build once: each target is built by one compiler, which then runs
    // its tests. armv7 is built with the MSRV compiler, so the MSRV check
    // is a build that is also tested; the other targets with the newest.
    // A separate MSRV check is made only when no target asked for is
    // built by it and the two versions differ.
    let same_compiler = oldest.version == newest.version;
    let compiler = |t: &Target| {
        if builds_with_msrv(t.short) {
            &oldest
        } else {
            &newest
        }
    };
    let msrv_built = !same_compiler && opts.targets.iter().any(|t| builds_with_msrv(t.short));
    for t in &opts.targets {
        let tc = compiler(t);
        println!(
            "cross-test: {} built and tested with rustc {}{}",
            t.short,
            tc.release(),
            if same_compiler || !builds_with_msrv(t.short) {
                ""
            } else {
                " (the MSRV check)"
            }
        );
    }

    // The targets build side by side, each in its own target directory
    // with its output in a log file (its tail printed when it fails): a
    // build is a chain of single-crate steps (the agent, its test harness,
    // the links) that leave a core idle, which the other target's build
    // fills. Each target's tests start as soon as its own build ends, beside
    // the other target's build or tests: emulated tests mostly wait (armv7's
    // longest, a maintenance window, on the next minute boundary), so the
    // two runs share the cores instead of queueing for them. Each line of a
    // test run is prefixed with its target.
    let nextest = nextest::available();
    let (outcomes, msrv_outcome) = std::thread::scope(|s| {
        let msrv_check = (!same_compiler && !msrv_built).then(|| {
            let first = opts.targets[0];
            let oldest = &oldest;
            s.spawn(move || {
                lower_priority();
                msrv_build(first, oldest)
            })
        });
        let runs: Vec<_> = opts
            .targets
            .iter()
            .map(|t| {
                let (opts, tc, host_bins) = (&opts, compiler(t), &host_bins);
                println!(
                    "\n== {}: building the agent and the tests ({})",
                    t.triple,
                    build_log(t).display()
                );
                s.spawn(move || {
                    let mut o = new_outcome(t);
                    build_target(t, tc, opts, &build_log(t), &mut o);
                    println!("\n== {}: built in {:.1} s", t.triple, o.build_secs);
                    if o.error.is_some() {
                        print_tail(&build_log(t), 80);
                    } else {
                        test_target(t, tc, opts, host_bins, nextest, &mut o);
                    }
                    o
                })
            })
            .collect();
        let outcomes: Vec<Outcome> = opts
            .targets
            .iter()
            .zip(runs)
            .map(|(t, run)| {
                run.join().unwrap_or_else(|_| {
                    let mut o = new_outcome(t);
                    o.error = Some("the build and test thread panicked".into());
                    o
                })
            })
            .collect();
        let msrv_outcome = msrv_check.map(|h| {
            h.join()
                .unwrap_or_else(|_| (0.0, Err("the MSRV check's thread panicked".to_string())))
        });
        (outcomes, msrv_outcome)
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
        None if msrv_built => println!(
            "  MSRV     rustc {} (rust-version {msrv}) built and ran the armv7 tests below",
            oldest.release()
        ),
        None => println!(
            "  MSRV     rustc {} is also the newest published: the test build below is the MSRV build",
            oldest.release()
        ),
    }
    for o in &outcomes {
        let c = o.counts;
        let rustc = if builds_with_msrv(o.target) {
            oldest.release()
        } else {
            newest.release()
        };
        let run = c.passed.saturating_sub(o.skips.len() as u64) + c.failed;
        println!(
            "  {:8} build {:6.1}s  tests {:6.1}s  rustc {}  run {run}, passed {}, failed {}, skipped {}, ignored {}",
            o.target,
            o.build_secs,
            o.test_secs,
            rustc,
            c.passed.saturating_sub(o.skips.len() as u64),
            c.failed,
            o.skips.len(),
            c.ignored
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
    for t in &opts.targets {
        println!("cross-test: {}", not_run_line(t, &opts));
    }
    if failed {
        Err("cross-test failed (see above)".into())
    } else {
        Ok(())
    }
}

/// Whether the cross target `short` is built (and tested) with the MSRV
/// compiler rather than the newest: armv7, the target most unlike the
/// host, so the oldest supported compiler's code is also the one most
/// exercised; aarch64 gets the newest, as its release builds do.
fn builds_with_msrv(short: &str) -> bool {
    short == "armv7"
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
        counts: Counts::default(),
        skips: Vec::new(),
        hangs: Vec::new(),
        error: None,
    }
}

/// Build the binaries and the tests of `t`, their output going to `log`.
fn build_target(t: &Target, tc: &Toolchain, opts: &Options, log: &Path, o: &mut Outcome) {
    let release = opts.release;
    let target_dir = test_dir(t);
    let start = Instant::now();
    // One feature resolution for both steps: the binaries are built in an
    // invocation with the same packages and test targets as the test build
    // below, since cargo's resolver unifies dev-dependency features only
    // where a test target is built. Built with `-p updraft` alone, the
    // proc macros and everything above them (serde, the agent itself)
    // came out with other features and compiled twice (about two minutes
    // of each target's build). The binaries use the tests' profile, which
    // writes to target/<triple>/debug, where the tests look for them.
    let mut build = cross_cargo(t, tc, &target_dir);
    build.args(["build", "--target", t.triple]);
    test_selection(&mut build, t, opts);
    // The emulated tests run the target's agent and the host's publisher
    // (tests/src/bin.rs); --full selects the publisher's package too, and
    // its selection (`--tests`) names no binaries.
    if opts.full {
        build.arg("--bins");
    }
    if !release {
        build.args(["--profile", "test"]);
    }
    let profile = if release { "release" } else { "debug" };
    let agent = target_dir.join(t.triple).join(profile).join("updraft");
    let built = run_logged(&mut build, log).and_then(|()| {
        t.check_large_files(&agent)?;
        let mut tests = test_cargo(t, tc, &target_dir, opts);
        tests.arg("--no-run");
        // Appended to the build's log.
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(log)
            .map_err(|e| format!("opening {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("opening {}: {e}", log.display()))?;
        tests.stdout(out).stderr(err);
        util::run(&mut tests)
    });
    o.build_secs = start.elapsed().as_secs_f64();
    if let Err(e) = built {
        o.error = Some(format!("build: {e}"));
    }
}

/// Run the tests of `t`, built by [`build_target`], under its emulator.
fn test_target(
    t: &Target,
    tc: &Toolchain,
    opts: &Options,
    host_bins: &Path,
    nextest: bool,
    o: &mut Outcome,
) {
    let release = opts.release;
    let target_dir = test_dir(t);
    let profile_dir = target_dir
        .join(t.triple)
        .join(if release { "release" } else { "debug" });
    let skip_log = target_dir.join(format!("{}-skips.log", t.short));
    let _ = std::fs::remove_file(&skip_log);
    let hang_log = target_dir.join(format!("{}-hangs.log", t.short));
    let _ = std::fs::remove_file(&hang_log);

    println!(
        "\n== {}: running the tests under {} ({})",
        t.triple,
        t.qemu,
        if nextest {
            "cargo-nextest, profile cross"
        } else {
            "cargo test: cargo-nextest is not installed"
        }
    );
    let start = Instant::now();
    let mut test = if nextest {
        nextest_cargo(t, tc, &target_dir, opts)
    } else {
        test_cargo(t, tc, &target_dir, opts)
    };
    test.arg("--no-fail-fast");
    // Each test process runs under `xtask emulate`, which ends and re-runs
    // one that hangs in the emulator (see emulate.rs).
    match supervised_runner(t, &hang_log) {
        Ok(r) => {
            test.env(format!("CARGO_TARGET_{}_RUNNER", t.env_triple()), r);
        }
        Err(e) => println!("cross-test: running the tests without a hang guard: {e}"),
    }
    test.env("UPDRAFT_TEST_RUNNER", t.runner())
        .env("UPDRAFT_BIN_DIR", &profile_dir)
        .env("UPDRAFT_HOST_BIN_DIR", host_bins)
        .env("UPDRAFT_SKIP_LOG", &skip_log);
    let prefix = format!("[{}] ", t.short);
    let result = nextest::run_counting(&mut test, &prefix, &mut o.counts);
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
/// cargo's rustdoc has no std for the target. Without `--full`, only the
/// unit tests and the integration test files [`pyramid`] places on `t`.
fn test_cargo(t: &Target, tc: &Toolchain, target_dir: &Path, opts: &Options) -> Command {
    let mut c = cross_cargo(t, tc, target_dir);
    c.args(["test", "--target", t.triple]);
    test_selection(&mut c, t, opts);
    c
}

/// `cargo nextest run` of the same tests as [`test_cargo`], with the
/// `cross` profile of `.config/nextest.toml`.
fn nextest_cargo(t: &Target, tc: &Toolchain, target_dir: &Path, opts: &Options) -> Command {
    let mut c = cross_cargo(t, tc, target_dir);
    c.args(["nextest", "run", "--profile", "cross", "--target", t.triple]);
    test_selection(&mut c, t, opts);
    c
}

/// The packages, targets and profile a cross test run builds and runs.
///
/// The publisher is a build-host tool: its unit tests run on the host, and
/// under `--full` on the targets too. Its library is compiled for every
/// target all the same, since the test support links it.
fn test_selection(c: &mut Command, t: &Target, opts: &Options) {
    if opts.full {
        c.args([
            "-p",
            "updraft",
            "-p",
            "updraft-publish",
            "-p",
            "updraft-tests",
            "--tests",
        ]);
    } else {
        c.args(["-p", "updraft", "-p", "updraft-tests"]);
        c.args(["--lib", "--bins"]);
        for f in pyramid::emulated_on(t.short) {
            c.args(["--test", f.target()]);
        }
    }
    if opts.release {
        c.arg("--release");
    }
}

/// The line that says which test files a run left to the host.
fn not_run_line(t: &Target, opts: &Options) -> String {
    if opts.full {
        return format!("{}: every test file ran (--full)", t.short);
    }
    let left: Vec<&str> = pyramid::host_only_on(t.short)
        .iter()
        .map(|f| f.target())
        .collect();
    format!(
        "{}: {} of {} test files and the publisher's unit tests not run under emulation (host only, docs/testing.md; --full runs them): {}",
        t.short,
        left.len(),
        pyramid::FILES.len(),
        left.join(" ")
    )
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
    let target_dir = release_dir();
    util::run(&mut release_build(t, &tc, &target_dir))?;
    let agent = target_dir.join(t.triple).join("release").join("updraft");
    t.check_large_files(&agent)?;
    Ok(agent)
}

/// Where [`release_agent`] builds: `target/cross`.
fn release_dir() -> PathBuf {
    util::root().join("target").join("cross")
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
/// `target/previous-release/<commit>/<triple>/updraft` for later runs. Its
/// intermediate files go to the build directory of [`release_agent`]
/// (`target/cross`): the dependencies that build compiled are reused, and
/// only the agent itself is compiled and linked again
/// ([`updraft_tests::previous::shared_build_args`]).
pub(crate) fn previous_release_agent(t: &Target) -> Result<PathBuf> {
    // One build at a time in this process: `vm-test` starts it early on a
    // thread of its own, and scenario 7 then waits here for that build
    // rather than starting a second one.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    c.arg("--locked")
        .env("CARGO_BUILD_BUILD_DIR", release_dir())
        .args(updraft_tests::previous::shared_build_args(&src, "release"));
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
    fn targets_have_cargo_env_names() {
        let t = Target::from_name("armv7").unwrap();
        assert_eq!(t.env_triple(), "ARMV7_UNKNOWN_LINUX_GNUEABIHF");
        assert_eq!(t.runner(), "qemu-arm-static -L /usr/arm-linux-gnueabihf");
        assert!(Target::from_name("mips").is_err());
    }
}
