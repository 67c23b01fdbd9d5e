//! Per-test scratch directories, removed when the test passes and kept
//! (with their path printed) when it fails, so a failure can be inspected.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A scratch directory under `$UPDRAFT_TEST_TMP` or the system temp dir.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let base = std::env::var_os("UPDRAFT_TEST_TMP")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = base.join(format!("updraft-{safe}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating a test directory");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test files kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Write an executable file without this process ever holding it open for
/// writing. Tests run in parallel threads that fork; a child forked while
/// the file is open for writing keeps it open until it execs, and running
/// the file in that window fails with ETXTBSY ("Text file busy"). So the
/// bytes go to a sibling file that is never executed, and `install(1)`
/// copies them into place in its own process.
pub fn write_executable(path: &Path, content: &str) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, content).expect("writing a staged script");
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&staged)
        .arg(path)
        .status()
        .expect("running install(1)");
    assert!(
        status.success(),
        "install -m 0755 {}: {status}",
        path.display()
    );
    let _ = std::fs::remove_file(&staged);
}
