//! Starting updraft's binaries from tests, natively or under an emulator.
//!
//! Black-box tests run `updraft` and `updraft-publish` as real processes.
//! For cross-target runs (`cargo xtask cross-test`) the binaries are
//! aarch64/armv7 executables: `UPDRAFT_TEST_RUNNER` holds the emulator
//! prefix (e.g. `qemu-aarch64-static -L /usr/aarch64-linux-gnu`), the same
//! one cargo uses to run the test binaries themselves.
//!
//! Binaries are found in `UPDRAFT_BIN_DIR` when set, else next to the test
//! executable's target directory (`target/<triple>/<profile>/`).
//!
//! The publisher is a build-host tool: what a cross-target run checks is
//! the device's agent, so when `UPDRAFT_HOST_BIN_DIR` names the host's own
//! build, `updraft-publish` runs from there, natively, and only `updraft`
//! runs under the emulator.

use std::path::PathBuf;
use std::process::Command;

/// Directory holding the built `updraft` and `updraft-publish`.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UPDRAFT_BIN_DIR") {
        return PathBuf::from(d);
    }
    // target/<profile>/deps/<test-exe> → target/<profile>
    let exe = std::env::current_exe().expect("test executable path");
    let mut dir = exe.parent().expect("deps dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a built binary; panics with a hint when it was not built.
pub fn path(name: &str) -> PathBuf {
    built(bin_dir().join(name))
}

/// `p`, which must be a built binary.
fn built(p: PathBuf) -> PathBuf {
    assert!(
        p.is_file(),
        "{} is missing: build it first (cargo build -p updraft -p updraft-publish, or cargo xtask test)",
        p.display()
    );
    p
}

/// The emulator prefix for cross-target runs, if any.
pub fn runner() -> Vec<String> {
    std::env::var("UPDRAFT_TEST_RUNNER")
        .map(|r| r.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The build-host tool among the binaries (see the module documentation).
const HOST_TOOL: &str = "updraft-publish";

/// A `Command` for a built binary, through the runner when one is set;
/// `updraft-publish` natively from `UPDRAFT_HOST_BIN_DIR` when that is set.
pub fn command(name: &str) -> Command {
    if name == HOST_TOOL {
        if let Some(dir) = std::env::var_os("UPDRAFT_HOST_BIN_DIR") {
            return Command::new(built(PathBuf::from(dir).join(name)));
        }
    }
    let exe = path(name);
    let mut runner = runner();
    if runner.is_empty() {
        Command::new(exe)
    } else {
        let mut c = Command::new(runner.remove(0));
        c.args(runner).arg(exe);
        c
    }
}

/// True when the binaries run under an emulator.
pub fn emulated() -> bool {
    !runner().is_empty()
}
