//! `cargo xtask …`: the project's automation, in Rust so it runs wherever
//! cargo does.
//!
//! * `demo [--server auto|nginx|embedded] [--vm]` — the main job end to end
//!   on file-backed slots, served by nginx or the embedded static server;
//!   `--vm`: an update and a rollback on a QEMU machine, its console shown.
//! * `test [--no-install] [--strict]` — the whole test suite, after
//!   installing its prerequisites (as root on Debian/Ubuntu).
//! * `check-rules [--no-fetch]` — promtool checks and unit-tests the
//!   Prometheus rules in `contrib/prometheus/` (also a stage of `test`).
//! * `bench install|daemon|delta|publish|size` — figures side by side with reference tools;
//!   `bench soak` — many polls and update cycles, what the daemon holds sampled.
//! * `fuzz [TARGET] [--seconds N]` — run the cargo-fuzz targets for a bounded time.
//! * `cross-test [--full]` — build for aarch64 and armv7 and run the tests
//!   the test pyramid places there (all with `--full`) under qemu-user.
//! * `pyramid` — print where each integration test file runs (docs/testing.md).
//! * `layout` — the agent's import cycles and largest files, against the
//!   rules in docs/architecture.md (a test holds the tree to them).
//! * `dist [--deb]` — release tarballs with the binary, the systemd files and
//!   the docs; `--deb`: Debian packages of the same (docs/debian.md).
//! * `yocto-crates [--check]` — regenerate the Yocto recipe's crate list from Cargo.lock.
//! * `vm-test [x86_64|aarch64|all]` — the update cycle on a full-system QEMU
//!   machine: GRUB (x86_64) or U-Boot (aarch64), a Debian kernel, busybox and
//!   updraft, with real reboots.

mod bench;
mod cross;
mod deb;
mod demo;
mod dist;
mod emulate;
mod fuzz;
mod large_files;
mod layout;
mod nextest;
mod pyramid;
mod rules;
mod test;
mod toolchain;
mod util;
mod vm;
mod yocto;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match cmd {
        "demo" => demo::run(rest),
        "test" => test::run(rest),
        "check-rules" => rules::run(rest),
        "bench" => bench::run(rest),
        "fuzz" => fuzz::run(rest),
        "cross-test" => cross::run(rest),
        "dist" => dist::run(rest),
        "yocto-crates" => yocto::run(rest),
        "vm-test" => vm::run(rest),
        "pyramid" => pyramid::run(rest),
        "layout" => layout::run(rest),
        // The runner cross-test hands to cargo; not for direct use.
        "emulate" => return emulate::main(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => {
            eprintln!("xtask: unknown command {other:?}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: cargo xtask <command>
  demo [--server S]         an update, a delta update and a rollback on file-backed slots;
                            S: auto (nginx if installed, else embedded; UPDRAFT_NGINX=/nonexistent hides nginx),
                            nginx or embedded
  demo --vm                 an update and a rollback on a QEMU x86_64 machine, its console shown
  test [--no-install] [--strict] [--full] [TEST ARGS...]
                            the whole test suite (cargo-nextest), then check-rules; as root on
                            Debian/Ubuntu it first installs tests/prerequisites.txt (--no-install or
                            UPDRAFT_NO_INSTALL=1: don't); --strict (on with CI=true): any unexpected
                            skip fails the run; --full: then every other CI stage, nothing left out
  check-rules [--no-fetch]  promtool check rules and test rules on contrib/prometheus/ (a stage of test);
                            as root on Debian promtool is extracted from the prometheus package into
                            target/promtool/, never installed; without it: skipped, or failed with CI=true
  bench install|daemon|delta|publish|size|soak
  fuzz [TARGET] [--seconds N]
  cross-test [--full]       build for aarch64 and armv7, run under qemu-user the tests the pyramid
                            places there (docs/testing.md); --full: every test file
  pyramid                   print where each integration test file runs, as docs/testing.md's table
  layout                    the agent's import cycles and largest files against the rules of
                            docs/architecture.md (no cycle, at most 800 lines of code a file)
  dist [--target T]... [--deb [--agent PATH] [--deb-version V] [--out DIR]]
                            release tarballs (x86_64, aarch64, armv7) in target/dist; --deb: Debian
                            packages instead (updraft for amd64, arm64, armhf; updraft-publish for
                            amd64): --agent packages that binary, --deb-version sets the version
  yocto-crates [--check]    regenerate the Yocto recipe's crate list from Cargo.lock
  vm-test [x86_64|aarch64|all] [--cuts N] [--seed S]
                            the update cycle on a QEMU machine (x86_64: SeaBIOS, GRUB;
                            aarch64: U-Boot; Debian kernel, busybox): full update, failing
                            health check, unbootable release, delta, N power cuts; as root
                            on Debian it installs what it needs";
