#![allow(dead_code)] // filled in as commands land
//! Shared plumbing for xtask commands: locating the workspace, running
//! commands with their output visible, and reporting what failed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

pub type Result<T = ()> = std::result::Result<T, String>;

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// The workspace's target directory: `CARGO_TARGET_DIR` when set
/// (relative to the workspace root), else `target/` there.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root().join(d),
        _ => root().join("target"),
    }
}

/// Run a command, inheriting stdio; fail if it fails.
pub fn run(cmd: &mut Command) -> Result {
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| format!("starting {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed: {status}"))
    }
}

/// Run a command and capture stdout; fail with its stderr if it fails.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("starting {shown}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{shown} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// What [`unpack_debs`] fetched: the size of the `.deb` files and how long
/// the download and the unpacking took.
pub struct Unpacked {
    pub bytes: u64,
    pub download: std::time::Duration,
    pub unpack: std::time::Duration,
}

/// Download Debian `packages` into `debs` with `apt_get` (an `apt-get`
/// command, carrying a private `APT_CONFIG` where one is needed) and
/// unpack each into `root` with `dpkg-deb -x`: nothing is installed, and
/// the `.deb` files are removed once unpacked. apt downloads as root: its
/// unprivileged sandbox user could not write into `debs`.
pub fn unpack_debs(
    mut apt_get: Command,
    packages: &[String],
    debs: &Path,
    root: &Path,
) -> Result<Unpacked> {
    std::fs::create_dir_all(debs).map_err(|e| format!("creating {}: {e}", debs.display()))?;
    let t = std::time::Instant::now();
    run(apt_get
        .args(["-q", "-o", "APT::Sandbox::User=root", "download"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .current_dir(debs))
    .map_err(|e| format!("downloading {}: {e}", packages.join(" ")))?;
    let download = t.elapsed();
    let t = std::time::Instant::now();
    let mut bytes = 0;
    let entries =
        std::fs::read_dir(debs).map_err(|e| format!("listing {}: {e}", debs.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("listing {}: {e}", debs.display()))?
            .path();
        if path.extension().is_some_and(|x| x == "deb") {
            bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            run(Command::new("dpkg-deb").arg("-x").arg(&path).arg(root))
                .map_err(|e| format!("unpacking {}: {e}", path.display()))?;
            let _ = std::fs::remove_file(&path);
        }
    }
    Ok(Unpacked {
        bytes,
        download,
        unpack: t.elapsed(),
    })
}

/// `cargo` as invoked by the user (respects `CARGO`), in the workspace,
/// without the package variables of this `cargo run` process
/// ([`updraft_tests::cargo_command`]).
pub fn cargo() -> Command {
    let mut c = updraft_tests::cargo_command();
    c.current_dir(root());
    c
}

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// True when `name` is found on PATH.
pub fn have(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// Build the debug `updraft` and `updraft-publish` (what the tests run),
/// point the test-support code at them (`UPDRAFT_BIN_DIR`) and return their
/// directory. Call it before any thread starts: it sets an environment
/// variable.
pub fn build_binaries() -> Result<PathBuf> {
    println!("building updraft and updraft-publish ...");
    let built = std::time::Instant::now();
    run(cargo().args(["build", "--quiet", "-p", "updraft", "-p", "updraft-publish"])).map_err(
        |_| {
            "building updraft and updraft-publish failed (cargo's messages are above); \
             `cargo build -p updraft -p updraft-publish` shows the same"
                .to_string()
        },
    )?;
    println!("built in {:.1} s", built.elapsed().as_secs_f64());
    let bin_dir = target_dir().join("debug");
    for exe in ["updraft", "updraft-publish"] {
        if !bin_dir.join(exe).is_file() {
            return Err(format!(
                "{} was not built: run `cargo build -p updraft -p updraft-publish` and check CARGO_TARGET_DIR",
                bin_dir.join(exe).display()
            ));
        }
    }
    // SAFETY: called while the process is single-threaded; the variable is
    // read by the test-support code this process calls.
    unsafe {
        std::env::set_var("UPDRAFT_BIN_DIR", &bin_dir);
    }
    Ok(bin_dir)
}

/// Run `f`, turning a panic of the test-support code (written for tests,
/// it panics on failure) into an error with its message, no backtrace;
/// errors are prefixed with `{what} failed: `.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    static MESSAGE: Mutex<Option<String>> = Mutex::new(None);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into());
        let at = info
            .location()
            .map(|l| format!(" ({}:{})", l.file(), l.line()))
            .unwrap_or_default();
        let mut slot = MESSAGE.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(format!("{msg}{at}"));
        }
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    match result {
        Ok(r) => r.map_err(|e| format!("{what} failed: {e}")),
        Err(_) => {
            let msg = MESSAGE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_else(|| "unknown failure".into());
            Err(format!("{what} failed: {msg}"))
        }
    }
}
