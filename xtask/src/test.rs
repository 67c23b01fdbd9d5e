//! `cargo xtask test`: the whole test suite, with what it needs.
//!
//! First the prerequisites in `tests/prerequisites.txt` (Debian and Python
//! packages, and the pinned packages of the tests' venv `target/venv`): as
//! root on Debian or Ubuntu the missing ones are installed with apt-get,
//! pip and the venv's own pip, saying so (opt out with `--no-install` or
//! `UPDRAFT_NO_INSTALL=1`); otherwise the one command that would install
//! them is printed and the suite runs without them. Then the binaries the
//! black-box tests run are built and every test in the workspace runs:
//! under cargo-nextest's `ci` profile (eight tests at once; see
//! [`crate::nextest`] for why), or `cargo test` where nextest is missing,
//! and then the doc tests, which nextest does not run. A whole-suite run
//! under nextest runs the bitbake test (`yocto_bitbake`, two parses of
//! oe-core's recipes on every core) on its own after the others, so that
//! it neither slows the tests that wait on real time nor is slowed by
//! them (docs/testing.md, "The bitbake test").
//!
//! `--full` then runs every other stage CI runs, each with its whole
//! scope: the demo with each server, `cross-test --full` (every test file
//! on both emulated targets, where CI runs the pyramid's selection) and the
//! real boots of both machines with eight power cuts each and six in
//! releases of an app.
//!
//! A test that cannot run here skips and says why; the skips are collected
//! through `UPDRAFT_SKIP_LOG` and listed at the end, one line each (`name —
//! reason`), so a green run never hides what it did not check. Strict mode
//! (`--strict`, or `CI=true`) fails the run when any test skipped, except
//! skips a test declares expected on its platform (`skip_expected!`): a
//! green CI run means every test ran.
//!
//! After the cargo tests, the Prometheus rules in `contrib/prometheus/` are
//! checked and unit-tested by promtool ([`crate::rules`]); without
//! promtool that stage is listed as a skip like any other.
//!
//! This module installs only what the prerequisites file lists, and only
//! as root on Debian or Ubuntu when not told otherwise.

use std::path::Path;
use std::process::Command;

use updraft_tests::prereq::{self, Kind, Prerequisite};
use updraft_tests::skip::{self, Skip};

use crate::nextest;
use crate::rules;
use crate::util::{self, Result, cargo, is_root};

const USAGE: &str = "usage: cargo xtask test [--no-install] [--strict] [--full] [TEST ARGS...]
  --no-install   do not install missing prerequisites (also UPDRAFT_NO_INSTALL=1)
  --strict       fail when a test skipped, except expected skips (on when CI=true)
  --full         then the demos, cross-test --full and vm-test of both machines with 8 power cuts
                 and 6 in app releases:
                 everything CI runs, and what it leaves out
  other arguments go to `cargo nextest run` (or `cargo test` without nextest),
  e.g. -p updraft-tests --test fleet";

struct Options {
    install: bool,
    /// Why installing is off, when it is.
    no_install_reason: Option<&'static str>,
    strict: bool,
    strict_reason: &'static str,
    full: bool,
    cargo_args: Vec<String>,
}

fn truthy(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        !v.is_empty() && v != "0" && v != "false" && v != "no"
    })
}

fn parse_args(args: &[String]) -> std::result::Result<Option<Options>, String> {
    let mut o = Options {
        install: true,
        no_install_reason: None,
        strict: false,
        strict_reason: "",
        full: false,
        cargo_args: Vec::new(),
    };
    if truthy("UPDRAFT_NO_INSTALL") {
        o.install = false;
        o.no_install_reason = Some("UPDRAFT_NO_INSTALL is set");
    }
    if truthy("CI") {
        o.strict = true;
        o.strict_reason = "CI is set";
    }
    for a in args {
        match a.as_str() {
            "--no-install" => {
                o.install = false;
                o.no_install_reason = Some("--no-install");
            }
            "--strict" => {
                o.strict = true;
                o.strict_reason = "--strict";
            }
            "--full" => o.full = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            _ => o.cargo_args.push(a.clone()),
        }
    }
    Ok(Some(o))
}

pub fn run(args: &[String]) -> Result {
    let Some(opts) = parse_args(args)? else {
        return Ok(());
    };
    provision(&opts);
    let skip_log = util::target_dir().join("test-skips.log");
    let _ = std::fs::remove_file(&skip_log);
    // Every crate of Cargo.lock, those of other platforms too, in cargo's
    // download cache: the bitbake test fetches updraft's crate list from
    // there, as from a mirror. Offline, the build needs none of them; that
    // test then names the crates it misses.
    if let Err(e) = util::run(cargo().args(["fetch", "--locked", "--quiet"])) {
        println!(
            "xtask test: cargo fetch failed ({e}): the bitbake test will name the crates it misses"
        );
    }
    util::run(cargo().args(["build", "--quiet", "-p", "updraft", "-p", "updraft-publish"]))?;
    let result = run_tests(&opts, &skip_log);
    let rules = check_rules(&opts, &skip_log);
    let skips = skip::read_log(&skip_log).map_err(|e| e.to_string())?;
    report_skips(&skips);
    result.map_err(|e| format!("some tests failed (see above): {e}"))?;
    rules?;
    let unexpected = skips.iter().filter(|s| !s.expected).count();
    if opts.strict && unexpected > 0 {
        return Err(format!(
            "strict mode ({}): {unexpected} test(s) skipped; in strict mode every test must run. \
             Install what the skips above name (cargo xtask test as root installs it), \
             or run without --strict",
            opts.strict_reason
        ));
    }
    if opts.full {
        full_stages()?;
    }
    Ok(())
}

/// The workspace's tests: nextest's `ci` profile when nextest is
/// installed (then the doc tests, which it does not run), else `cargo test`.
fn run_tests(opts: &Options, skip_log: &std::path::Path) -> Result {
    let started = std::time::Instant::now();
    let result = if nextest::available() {
        // The test binaries first (nextest's own build is then a no-op).
        util::run(cargo().args(["test", "--workspace", "--no-run", "--quiet"]))?;
        // Then the previous landed release (tests/src/previous.rs), which the
        // rollback compatibility tests run: after the workspace's build,
        // whose dependencies it reuses (under a minute), rather than by the
        // first test that needs it, where it held a test slot while seven
        // other tests ran beside it. A failed build fails those tests, with
        // this reason.
        if opts.cargo_args.is_empty() {
            match updraft_tests::previous::binary() {
                Ok(exe) => println!("xtask test: the previous release is {}", exe.display()),
                Err(e) => println!("xtask test: building the previous release failed: {e}"),
            }
        }
        println!(
            "xtask test: the workspace's tests under cargo-nextest, profile ci (.config/nextest.toml)"
        );
        // The whole suite: the bitbake test after the others, alone.
        let apart = opts.cargo_args.is_empty();
        let nextest = |filter: Option<&str>, extra: &[&str]| {
            let mut test = cargo();
            test.args([
                "nextest",
                "run",
                "--workspace",
                "--profile",
                "ci",
                "--no-fail-fast",
            ])
            .args(&opts.cargo_args)
            .env("UPDRAFT_SKIP_LOG", skip_log);
            if let Some(f) = filter {
                test.args(["-E", f]);
            }
            test.args(extra);
            util::run(&mut test)
        };
        let main = nextest(apart.then_some("not binary(yocto_bitbake)"), &[]);
        let bitbake = if apart {
            println!("xtask test: the bitbake test, alone");
            let started = std::time::Instant::now();
            // Its output (each step and its time) is shown when it passes.
            let r = nextest(
                Some("binary(yocto_bitbake)"),
                &["--success-output", "final"],
            );
            println!(
                "xtask test: the bitbake test took {:.0} s",
                started.elapsed().as_secs_f64()
            );
            r
        } else {
            Ok(())
        };
        main.and(bitbake).and_then(|()| doc_tests(skip_log))
    } else {
        println!(
            "xtask test: cargo-nextest is not installed (cargo install cargo-nextest --locked): \
             running the tests with cargo test, one test binary at a time"
        );
        let mut test = cargo();
        test.args(["test", "--workspace", "--quiet", "--no-fail-fast"])
            .args(&opts.cargo_args)
            .env("UPDRAFT_SKIP_LOG", skip_log);
        util::run(&mut test)
    };
    println!(
        "xtask test: the tests took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    result
}

/// The doc tests (nextest runs none), summed up in one line; their whole
/// output is shown only when they fail.
fn doc_tests(skip_log: &std::path::Path) -> Result {
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc", "--quiet"])
        .env("UPDRAFT_SKIP_LOG", skip_log);
    let out = doc
        .output()
        .map_err(|e| format!("running the doc tests: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut counts = nextest::Counts::default();
    for line in text.lines() {
        counts.add(nextest::parse_line(line));
    }
    if !out.status.success() {
        print!("{text}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        return Err(format!("the doc tests failed: {}", out.status));
    }
    if counts.passed == 0 {
        println!("xtask test: doc tests: the workspace's documentation has none");
    } else {
        println!("xtask test: doc tests: {} passed", counts.passed);
    }
    Ok(())
}

/// `--full`: every stage CI runs after the host suite, with nothing left
/// out, each through its own `cargo xtask` command; each stage's time is
/// printed, and the first failure ends the run.
fn full_stages() -> Result {
    // Each machine with every power cut: 8 in slot releases, 6 in app releases.
    let vm = |m| {
        [
            "vm-test",
            m,
            "--cuts",
            "8",
            "--app-cuts",
            "6",
            "--seed",
            "3",
        ]
    };
    let (x86, arm) = (vm("x86_64"), vm("aarch64"));
    let stages: [&[&str]; 5] = [
        &["demo", "--server", "embedded"],
        &["demo", "--server", "nginx"],
        &["cross-test", "--full"],
        &x86,
        &arm,
    ];
    for args in stages {
        let shown = args.join(" ");
        println!("\nxtask test --full: cargo xtask {shown}");
        let started = std::time::Instant::now();
        let mut c = cargo();
        c.args(["xtask"]).args(args);
        util::run(&mut c).map_err(|e| format!("--full: cargo xtask {shown}: {e}"))?;
        println!(
            "xtask test --full: cargo xtask {shown} took {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The Prometheus rules stage: promtool's check and tests. Without
/// promtool it is recorded in the skip log as `xtask::check_rules`.
fn check_rules(opts: &Options, skip_log: &std::path::Path) -> Result {
    println!("\nxtask test: the Prometheus rules in {}", rules::DIR);
    match rules::check(opts.install) {
        Ok(rules::Outcome::Passed) => Ok(()),
        Ok(rules::Outcome::Skipped(why)) => {
            println!("SKIPPED xtask::check_rules: {why}");
            let skip = Skip {
                test: "xtask::check_rules".into(),
                reason: why,
                expected: false,
            };
            skip::append(skip_log, &skip)
                .map_err(|e| format!("recording a skip in {}: {e}", skip_log.display()))
        }
        Err(e) => Err(format!("the Prometheus rules: {e}")),
    }
}

/// Install the missing prerequisites when allowed, else say how.
fn provision(opts: &Options) {
    let all = prereq::all();
    let missing = prereq::missing();
    if missing.is_empty() {
        println!(
            "xtask test: all {} test prerequisites in {} are installed",
            all.len(),
            prereq::PATH
        );
        return;
    }
    println!(
        "xtask test: {} of the {} test prerequisites in {} are missing:",
        missing.len(),
        all.len(),
        prereq::PATH
    );
    for (p, item) in &missing {
        println!(
            "  {}: {} not found",
            p.describe(),
            prereq::describe_item(item)
        );
    }
    let packages: Vec<&Prerequisite> = missing.iter().map(|(p, _)| p).collect();
    let skip_note = "the tests that need them skip";
    if let Some(why) = opts.no_install_reason {
        println!(
            "xtask test: not installing them ({why}); {skip_note}. To install them:\n  {}",
            prereq::install_command(&packages, !is_root())
        );
        return;
    }
    if !is_root() {
        println!(
            "xtask test: not root, so not installing them; {skip_note}. To install them:\n  {}",
            prereq::install_command(&packages, true)
        );
        return;
    }
    if let Some(why) = not_debian() {
        println!(
            "xtask test: {why}, so not installing them; {skip_note}. \
             Install the equivalents of: {}",
            packages
                .iter()
                .map(|p| p.package.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
        return;
    }
    println!(
        "xtask test: installing them now (as root on Debian/Ubuntu; opt out with --no-install or UPDRAFT_NO_INSTALL=1)"
    );
    let started = std::time::Instant::now();
    if let Err(e) = install(&packages) {
        println!("xtask test: installing failed: {e}; {skip_note}");
    }
    let still: Vec<String> = prereq::missing()
        .into_iter()
        .map(|(p, item)| {
            format!(
                "{} ({} not found)",
                p.describe(),
                prereq::describe_item(&item)
            )
        })
        .collect();
    if still.is_empty() {
        println!(
            "xtask test: prerequisites installed in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    } else {
        println!(
            "xtask test: still missing after installing: {}; {skip_note}",
            still.join(", ")
        );
    }
}

/// Why apt-get is not the installer here, if it is not.
fn not_debian() -> Option<String> {
    if prereq::command("apt-get").is_none() {
        return Some("apt-get is not installed".into());
    }
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |name: &str| -> String {
        os.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .map(|v| v.trim_matches('"').to_ascii_lowercase())
            .unwrap_or_default()
    };
    let ids = format!("{} {}", field("ID"), field("ID_LIKE"));
    if ids
        .split_whitespace()
        .any(|i| i == "debian" || i == "ubuntu")
    {
        None
    } else {
        Some(format!(
            "this is not Debian or Ubuntu (/etc/os-release ID {:?})",
            field("ID")
        ))
    }
}

/// Debian's `policy-rc.d` answering 101 ("action forbidden") while it is
/// held: a package installed for the tests starts no service (Debian's
/// mender-client would start its daemon). An existing policy is left as it
/// is; the one written here is removed on drop.
struct NoServiceStarts(Option<&'static Path>);

impl NoServiceStarts {
    fn hold() -> NoServiceStarts {
        let path = Path::new("/usr/sbin/policy-rc.d");
        if path.exists() {
            return NoServiceStarts(None);
        }
        let written = std::fs::write(
            path,
            "#!/bin/sh\n# cargo xtask test: no service starts while installing\nexit 101\n",
        )
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        });
        NoServiceStarts(written.is_ok().then_some(path))
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn install(packages: &[&Prerequisite]) -> Result {
    let names = |k: Kind| prereq::names_of(packages, k);
    let deb = names(Kind::Deb);
    if !deb.is_empty() {
        let mut update = Command::new("apt-get");
        update
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive");
        if let Err(e) = util::run(&mut update) {
            println!("xtask test: {e}; continuing with the package indexes there are");
        }
        let mut apt = Command::new("apt-get");
        apt.args(["install", "-y", "--no-install-recommends"])
            .args(&deb)
            .env("DEBIAN_FRONTEND", "noninteractive");
        let _quiet = NoServiceStarts::hold();
        util::run(&mut apt)?;
    }
    let pip = names(Kind::Pip);
    if !pip.is_empty() {
        let mut plain = Command::new("python3");
        plain.args(["-m", "pip", "install", "--quiet"]).args(&pip);
        if util::run(&mut plain).is_err() {
            // Debian 12 and later refuse a system-wide pip install
            // unless told (PEP 668).
            let mut forced = Command::new("python3");
            forced
                .args(["-m", "pip", "install", "--quiet", "--break-system-packages"])
                .args(&pip);
            util::run(&mut forced)?;
        }
    }
    let venv = names(Kind::Venv);
    if !venv.is_empty() {
        install_venv(&venv)?;
    }
    Ok(())
}

/// Install pinned packages into the tests' venv, making the venv first
/// when its python is missing or no longer runs (the system Python was
/// upgraded under it).
fn install_venv(packages: &[&str]) -> Result {
    let dir = prereq::venv_dir();
    let python = prereq::venv_python();
    let started = std::time::Instant::now();
    let runs = Command::new(&python)
        .args(["-c", ""])
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        println!(
            "xtask test: making the tests' Python venv {}",
            dir.display()
        );
        let mut make = Command::new("python3");
        make.args(["-m", "venv", "--clear"]).arg(&dir);
        util::run(&mut make)?;
    }
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .args(packages);
    util::run(&mut pip)?;
    println!(
        "xtask test: {} installed in {} in {:.0} s",
        packages.join(" "),
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn report_skips(skips: &[Skip]) {
    if skips.is_empty() {
        println!("\nxtask test: no test was skipped");
        return;
    }
    let expected = skips.iter().filter(|s| s.expected).count();
    println!(
        "\nxtask test: {} test(s) skipped{}:",
        skips.len(),
        if expected > 0 {
            format!(" ({expected} expected on this platform)")
        } else {
            String::new()
        }
    );
    for s in skips {
        println!("  {s}");
    }
}
