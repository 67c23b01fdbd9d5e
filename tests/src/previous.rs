//! The previous release of updraft, built from source, for the rollback
//! compatibility tests (`tests/tests/previous_release.rs`).
//!
//! A rollback boots the previous release on the state the new one wrote, so
//! the tests run the binary of the last landed release, pinned by commit in
//! [`PINNED`], against databases written by the current one and the other
//! way round. [`binary`] extracts that commit's tree with `git archive` into
//! `target/previous-release/<commit>/src` and builds its `updraft` binary
//! there. Its binary lands in its own target directory
//! (`target/previous-release/target`), never in the workspace's
//! `target/debug` where the other tests find the current binaries, but its
//! intermediate files go to the workspace's build directory (cargo's
//! `build.build-dir`, cargo 1.91 and later): the two commits lock nearly the
//! same crates, so the dependencies the workspace already built are reused
//! and the build takes under a minute instead of a full second build of
//! every crate (about 290 s on 2 cores beside the workspace's own). The
//! built binary is kept as `target/previous-release/<commit>/updraft` and
//! reused by later runs.
//!
//! Moving the pin when a release lands: change [`PINNED`] to the full hash
//! of the new release's commit (`git rev-parse <tag or commit>`); nothing
//! else names it. See docs/compatibility.md.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

/// The commit of the last landed release: the previous release a rollback
/// runs. The one place that names it.
pub const PINNED: &str = "8b776ae4273d1445b87a2e6c198fd6a8c90170de";

/// Why the previous release cannot be tested in this run, when that is a
/// legitimate skip rather than a failure: the binaries run under an emulator
/// (`cargo xtask cross-test`), where a second toolchain build of another
/// commit for the target is not available.
pub fn unavailable() -> Option<String> {
    if crate::bin::emulated() {
        return Some(format!(
            "the binaries run under an emulator (UPDRAFT_TEST_RUNNER is set): the previous \
             release ({}) is built from source for the host only, so rollback compatibility \
             is checked by the native run (cargo xtask test)",
            short(PINNED)
        ));
    }
    None
}

/// The previous release's `updraft` binary for a test, which skips when
/// [`unavailable`] says why it cannot run here and fails when the build
/// does: `let old = updraft_tests::previous_release!();`. Needs git (to
/// extract the pinned tree), and whatever else the test names first with
/// `require!`.
#[macro_export]
macro_rules! previous_release {
    () => {{
        $crate::require!("git");
        if let Some(why) = $crate::previous::unavailable() {
            $crate::skip!("{why}");
        }
        $crate::previous::binary().unwrap_or_else(|e| panic!("{e}"))
    }};
}

/// The previous release's `updraft` binary, built on first use (once per
/// process, and under a file lock across processes). `Err` is one sentence
/// saying what is missing and how to fix it; the caller fails the test
/// with it.
pub fn binary() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| build(PINNED)).clone()
}

/// The first 12 hex digits of a commit, for messages.
pub fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// The workspace's target directory (`CARGO_TARGET_DIR` when set).
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                crate::repo_root().join(d)
            }
        }
        _ => crate::repo_root().join("target"),
    }
}

fn build(commit: &str) -> Result<PathBuf, String> {
    let root = crate::repo_root();
    let base = target_dir().join("previous-release");
    let dir = base.join(commit);
    let exe = dir.join("updraft");
    if exe.is_file() {
        return Ok(exe);
    }
    check_commit(&root, commit)?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Another test process (nextest, a second cargo test) may be building
    // the same commit: one builds, the others wait and reuse.
    let _lock = FileLock::take(&base.join("lock"))?;
    if exe.is_file() {
        return Ok(exe);
    }
    let src = extracted(&root, commit, &dir)?;
    let log_path = dir.join("build.log");
    let log = File::create(&log_path)
        .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("cannot write {}: {e}", log_path.display()))?;
    let build_target = base.join("target");
    note(&format!(
        "building the previous release of updraft ({}) in {} (log: {})",
        short(commit),
        build_target.display(),
        log_path.display()
    ));
    let mut cargo_build = crate::cargo_command();
    cargo_build
        .args(["build", "--locked", "-p", "updraft", "--bin", "updraft"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &build_target)
        .env("CARGO_BUILD_BUILD_DIR", build_dir());
    cargo_build
        .args(shared_build_args(&src, "dev"))
        // A host build, whatever the surrounding run targets.
        .env_remove("CARGO_BUILD_TARGET")
        .env("CARGO_TERM_COLOR", "never");
    // The cargo running these tests put the workspace's `[env]` settings
    // into their environment, where they would override the old tree's
    // own (an environment variable wins over `[env]`): build the previous
    // release as it was built then.
    for key in config_env_keys(&root.join(".cargo").join("config.toml")) {
        cargo_build.env_remove(key);
    }
    let started = Instant::now();
    let status = cargo_build
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .status()
        .map_err(|e| {
            format!(
                "cannot run {:?} to build the previous release ({e}): set CARGO or put cargo on PATH",
                cargo_build.get_program()
            )
        })?;
    let took = started.elapsed();
    if !status.success() {
        return Err(format!(
            "building the previous release of updraft ({}) failed after {:.0} s ({status}); \
             the end of {}:\n{}",
            short(commit),
            took.as_secs_f64(),
            log_path.display(),
            tail(&log_path, 40)
        ));
    }
    note(&format!(
        "built the previous release of updraft ({}) in {:.1} s",
        short(commit),
        took.as_secs_f64()
    ));
    let built = build_target.join("debug").join("updraft");
    // Copy, then rename: a half-copied binary is never taken for a cached one.
    let staged = dir.join("updraft.partial");
    std::fs::copy(&built, &staged)
        .and_then(|_| std::fs::rename(&staged, &exe))
        .map_err(|e| format!("cannot copy {} to {}: {e}", built.display(), exe.display()))?;
    Ok(exe)
}

/// The previous release's source tree, extracted on first use into
/// `target/previous-release/<commit>/src`: for a build with another
/// toolchain than the host's (the aarch64 guest of `cargo xtask vm-test`
/// builds it for its target). A cargo run in it should not see the
/// current workspace's `[env]` settings ([`current_env_keys`]).
pub fn source() -> Result<PathBuf, String> {
    let root = crate::repo_root();
    let base = target_dir().join("previous-release");
    let dir = base.join(PINNED);
    check_commit(&root, PINNED)?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let _lock = FileLock::take(&base.join("lock"))?;
    extracted(&root, PINNED, &dir)
}

/// The names the current workspace's `.cargo/config.toml` sets in its
/// `[env]` table: a cargo started from this workspace's tools has them in
/// its environment, where they would override the previous tree's own.
pub fn current_env_keys() -> Vec<String> {
    config_env_keys(&crate::repo_root().join(".cargo").join("config.toml"))
}

/// The workspace's build directory (cargo's `build.build-dir`): the
/// intermediate files the previous release's build shares with the
/// workspace's. `CARGO_BUILD_BUILD_DIR` when set, else the target directory
/// (cargo's default).
fn build_dir() -> PathBuf {
    match std::env::var_os("CARGO_BUILD_BUILD_DIR") {
        Some(d) if !d.is_empty() => crate::repo_root().join(d),
        _ => target_dir(),
    }
}

/// The arguments a build of the pinned tree at `src` in `profile` adds
/// when it shares the workspace's build directory.
///
/// Cargo names a unit by a hash of its package, version, features and
/// profile, and a path package's by its path relative to its workspace: the
/// pinned agent and the workspace's would share one name, and cargo, which
/// judges a local package fresh by file times, would take the other's
/// build for its own (the files `git archive` extracts carry the commit's
/// older time). So the pinned agent is built with a number of codegen units
/// the workspace never uses (255 in the dev profile, whose default is 256;
/// 2 in the release profile, which ships with 1), which gives its units
/// names of their own; the registry crates, the same versions from the same
/// sources, are shared. (The agent has no path dependencies; a pin whose
/// agent has some needs the same for each.)
///
/// Where the two trees' cargo configurations differ
/// (`.cargo/config.toml`), the pinned tree may set other SQLite compile
/// options (its `[env]`), which reach libsqlite3-sys's build script only:
/// that crate gets a name of its own too, so that neither build overwrites
/// the other's and then rebuilds it, and all that depends on it, each time.
pub fn shared_build_args(src: &Path, profile: &str) -> Vec<String> {
    let units = if profile == "release" { 2 } else { 255 };
    let mut args = vec![
        "--config".to_string(),
        format!("profile.{profile}.package.updraft.codegen-units = {units}"),
    ];
    let config = |dir: &Path| std::fs::read(dir.join(".cargo").join("config.toml")).ok();
    if config(&crate::repo_root()) != config(src) {
        args.push("--config".into());
        args.push(format!(
            "profile.{profile}.package.libsqlite3-sys.codegen-units = 255"
        ));
    }
    args
}

/// `dir/src`, extracted from `commit` unless an earlier run did (the
/// caller holds the lock).
fn extracted(root: &Path, commit: &str, dir: &Path) -> Result<PathBuf, String> {
    let src = dir.join("src");
    if !src.join("Cargo.lock").is_file() {
        extract(root, commit, &src)?;
    }
    Ok(src)
}

/// Insist that git can read `commit` in the repository at `root`.
fn check_commit(root: &Path, commit: &str) -> Result<(), String> {
    let fix = format!(
        "the rollback compatibility test builds updraft at commit {commit}, and git cannot \
         read that commit in {}: install git and fetch the history (git fetch --unshallow, \
         or a clone with full history) so the previous release can be built",
        root.display()
    );
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["cat-file", "-e"])
        .arg(format!("{commit}^{{commit}}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{fix} (running git: {e})"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{fix} ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `git archive COMMIT | tar -x` into `src`, through a staging directory
/// renamed into place, so an interrupted extraction is never reused.
fn extract(root: &Path, commit: &str, src: &Path) -> Result<(), String> {
    let staged = src.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staged);
    let _ = std::fs::remove_dir_all(src);
    std::fs::create_dir_all(&staged)
        .map_err(|e| format!("cannot create {}: {e}", staged.display()))?;
    let mut git = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["archive", "--format=tar", commit])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git archive: {e}"))?;
    let Some(tar_input) = git.stdout.take() else {
        return Err("git archive: no output pipe".into());
    };
    let tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&staged)
        .stdin(tar_input)
        .output()
        .map_err(|e| format!("cannot run tar to extract the previous release: {e}"))?;
    let git = git
        .wait_with_output()
        .map_err(|e| format!("git archive: {e}"))?;
    if !git.status.success() {
        return Err(format!(
            "git archive {commit} failed ({}): {}",
            git.status,
            String::from_utf8_lossy(&git.stderr).trim()
        ));
    }
    if !tar.status.success() {
        return Err(format!(
            "tar -x of commit {commit} failed ({}): {}",
            tar.status,
            String::from_utf8_lossy(&tar.stderr).trim()
        ));
    }
    std::fs::rename(&staged, src).map_err(|e| {
        format!(
            "cannot rename {} to {}: {e}",
            staged.display(),
            src.display()
        )
    })
}

/// The variable names set in the `[env]` table of a cargo configuration
/// file (top-level `NAME = …` lines of that table; none when unreadable).
fn config_env_keys(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut in_env = false;
    let mut keys = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_env = line == "[env]";
            continue;
        }
        if !in_env {
            continue;
        }
        if let Some((name, _)) = line.split_once('=') {
            let name = name.trim().trim_matches('"');
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                keys.push(name.to_string());
            }
        }
    }
    keys
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A line on the real stderr, past the test harness's output capture (the
/// build takes minutes when cold; its duration belongs in the CI log).
fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "previous release: {line}");
}

/// An exclusive `flock` on a file, released when the file is closed (dropped).
struct FileLock {
    _file: File,
}

impl FileLock {
    fn take(path: &Path) -> Result<FileLock, String> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot open the lock file {}: {e}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file descriptor this struct owns.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(format!(
                "cannot lock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(FileLock { _file: f })
    }
}
