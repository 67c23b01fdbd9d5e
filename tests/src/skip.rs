//! Skipping a test loudly.
//!
//! A test that cannot run here (not root, a tool missing on this target)
//! must say so, not pass silently. [`skip!`](crate::skip) prints the reason
//! on stderr and appends a line to the file named by `UPDRAFT_SKIP_LOG`, so
//! `cargo xtask test` and `cargo xtask cross-test` can count and list skips
//! ([`read_log`]). [`require!`](crate::require) skips when a tool listed in
//! `tests/prerequisites.txt` is missing.
//!
//! [`skip_expected!`](crate::skip_expected) is for a skip that is normal
//! on the platform the test runs on (libfaketime cannot be preloaded into a
//! binary running under qemu-user): it is listed like any other, and marked
//! so that strict mode (`cargo xtask test --strict`, `CI=true`) allows it.
//! Every other skip fails a strict run.
//!
//! The log has one line per skip, `TEST<TAB>REASON` or
//! `TEST<TAB>REASON<TAB>expected`, where TEST is `target::test_name`.
//! This module must never decide whether a run passes; it only records.

use std::io::Write;
use std::path::Path;

/// The marker that ends the log line of an expected skip.
pub const EXPECTED: &str = "expected";

/// One line of the skip log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Skip {
    /// `target::test_name`.
    pub test: String,
    pub reason: String,
    /// Declared normal for this platform ([`skip_expected!`](crate::skip_expected)).
    pub expected: bool,
}

/// Record a skip; used by the [`skip!`](crate::skip) macro.
pub fn record(test: &str, reason: &str) {
    record_skip(test, reason, false);
}

/// Record a skip, expected on this platform or not; used by the
/// [`skip!`](crate::skip) and [`skip_expected!`](crate::skip_expected)
/// macros.
pub fn record_skip(test: &str, reason: &str, expected: bool) {
    let test = qualified(test);
    let reason = reason.replace(['\n', '\t'], " ");
    let note = if expected {
        " (expected on this platform)"
    } else {
        ""
    };
    eprintln!("SKIPPED {test}: {reason}{note}");
    if let Some(path) = std::env::var_os("UPDRAFT_SKIP_LOG") {
        let _ = append(
            Path::new(&path),
            &Skip {
                test,
                reason,
                expected,
            },
        );
    }
}

/// Append `skip` to the skip log at `path` as one line.
pub fn append(path: &Path, skip: &Skip) -> std::io::Result<()> {
    let reason = skip.reason.replace(['\n', '\t'], " ");
    let line = if skip.expected {
        format!("{}\t{reason}\t{EXPECTED}\n", skip.test)
    } else {
        format!("{}\t{reason}\n", skip.test)
    };
    // One write(2) per line: tests skipping at the same instant in
    // parallel threads append whole lines (O_APPEND), never a mix of two.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}

/// `test` prefixed with the test binary's target name (`fleet`,
/// `updraft_tests`), without cargo's hash suffix.
fn qualified(test: &str) -> String {
    let target = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash))
                if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                name.to_string()
            }
            _ => stem,
        });
    match target {
        Some(t) if !test.starts_with(&format!("{t}::")) => format!("{t}::{test}"),
        _ => test.to_string(),
    }
}

/// Parse skip log text: one [`Skip`] per non-empty line, sorted, with the
/// duplicates a test binary run twice leaves removed.
pub fn parse_log(text: &str) -> Vec<Skip> {
    let mut skips: Vec<Skip> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut fields = l.splitn(3, '\t');
            let test = fields.next().unwrap_or("").to_string();
            let reason = fields.next().unwrap_or("").to_string();
            let expected = fields.next() == Some(EXPECTED);
            Skip {
                test,
                reason,
                expected,
            }
        })
        .collect();
    skips.sort();
    skips.dedup();
    skips
}

/// Read a skip log; a missing file means nothing was skipped.
pub fn read_log(path: &Path) -> std::io::Result<Vec<Skip>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(parse_log(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("reading the skip log {}: {e}", path.display()),
        )),
    }
}

impl std::fmt::Display for Skip {
    /// `test — reason`, and `(expected on this platform)` when it is.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} — {}", self.test, self.reason)?;
        if self.expected {
            write!(f, " (expected on this platform)")?;
        }
        Ok(())
    }
}

/// Skip the current test with a reason: `skip!("needs root for loop devices")`.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        let name = std::thread::current().name().unwrap_or("?").to_string();
        $crate::skip::record_skip(&name, &format!($($arg)*), false);
        return;
    }};
}

/// Skip the current test for a reason that is normal on this platform:
/// `skip_expected!("libfaketime cannot be preloaded into an emulated binary")`.
/// Strict mode allows these skips and no others.
#[macro_export]
macro_rules! skip_expected {
    ($($arg:tt)*) => {{
        let name = std::thread::current().name().unwrap_or("?").to_string();
        $crate::skip::record_skip(&name, &format!($($arg)*), true);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_parse_sorted_without_duplicates() {
        let text = "b::two\tno tool\na::one\tunder qemu\texpected\n\nb::two\tno tool\n";
        let skips = parse_log(text);
        assert_eq!(
            skips,
            vec![
                Skip {
                    test: "a::one".into(),
                    reason: "under qemu".into(),
                    expected: true
                },
                Skip {
                    test: "b::two".into(),
                    reason: "no tool".into(),
                    expected: false
                },
            ]
        );
        assert_eq!(
            skips[0].to_string(),
            "a::one — under qemu (expected on this platform)"
        );
        assert_eq!(skips[1].to_string(), "b::two — no tool");
    }

    #[test]
    fn names_carry_the_test_target() {
        assert_eq!(qualified("x"), "updraft_tests::x");
        assert_eq!(qualified("updraft_tests::x"), "updraft_tests::x");
    }
}
