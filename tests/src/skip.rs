//! Skipping a test loudly.
//!
//! A test that cannot run here (not root, a tool missing on this target)
//! must say so, not pass silently. [`skip!`](crate::skip) prints the reason
//! on stderr and appends a line to the file named by `UPDRAFT_SKIP_LOG`, so
//! `cargo xtask test` and `cargo xtask cross-test` can count and list skips.

use std::io::Write;

/// Record a skip; used by the [`skip!`](crate::skip) macro.
pub fn record(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("UPDRAFT_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write(2) per line: tests skipping at the same instant
            // in parallel threads append whole lines (O_APPEND), never a
            // mix of two.
            let line = format!("{test}\t{}\n", reason.replace('\n', " "));
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// Skip the current test with a reason: `skip!("needs root for loop devices")`.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        let name = std::thread::current().name().unwrap_or("?").to_string();
        $crate::skip::record(&name, &format!($($arg)*));
        return;
    }};
}

/// True when `tool` is an executable file in a `PATH` directory.
pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { geteuid() == 0 }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}
