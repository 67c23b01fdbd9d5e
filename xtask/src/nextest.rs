//! Running test binaries with cargo-nextest, and reading what it counted.
//!
//! Why nextest: most of updraft's end-to-end tests wait on real time (a
//! daemon's poll, a drip, a health-check timeout, a lock's backoff), so
//! libtest, which runs one test binary after the other, leaves the CPU idle
//! for most of a run. nextest runs every test in a process of its own and
//! as many at once as `.config/nextest.toml`'s profile says, across
//! binaries: on a 2-core machine the host suite's wall time fell from about
//! 770 s to about 180 s, every test still run and asserted as before. A
//! process per test also isolates tests from each other's global state.
//!
//! The profiles live in `.config/nextest.toml`: `ci` for the host run,
//! `cross` for the emulated runs. Without cargo-nextest the callers fall
//! back to `cargo test` and say so; nothing is skipped either way.
//!
//! This module runs nothing but the command it is given and never decides
//! whether a run passed beyond nextest's own exit status.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::util::{self, Result};

/// What a test run counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    /// Ignored (libtest) or not selected to run (nextest's "skipped").
    pub(crate) ignored: u64,
}

/// True when `cargo nextest` runs here.
pub(crate) fn available() -> bool {
    util::cargo()
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run `cmd` (a `cargo nextest run` or a `cargo test`), passing its output
/// through with `prefix` before each line (runs side by side stay
/// readable), and add up the result lines of either runner.
pub(crate) fn run_counting(cmd: &mut Command, prefix: &str, counts: &mut Counts) -> Result {
    let shown = format!("{cmd:?}");
    // nextest reports on stderr, libtest on stdout: read both, one thread
    // each, so neither pipe fills while the other is read.
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {shown}: {e}"))?;
    let stderr = child.stderr.take();
    let err_prefix = prefix.to_string();
    let from_stderr = std::thread::spawn(move || {
        let mut c = Counts::default();
        if let Some(err) = stderr {
            for line in BufReader::new(err)
                .lines()
                .map_while(std::result::Result::ok)
            {
                eprintln!("{err_prefix}{line}");
                c.add(parse_line(&line));
            }
        }
        c
    });
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("reading test output: {e}"))?;
            println!("{prefix}{line}");
            counts.add(parse_line(&line));
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {shown}: {e}"))?;
    if let Ok(c) = from_stderr.join() {
        counts.add(Some(c));
    }
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed: {status}"))
    }
}

impl Counts {
    /// Add a result line's counts, if the line was one.
    pub(crate) fn add(&mut self, other: Option<Counts>) {
        if let Some(o) = other {
            self.passed += o.passed;
            self.failed += o.failed;
            self.ignored += o.ignored;
        }
    }
}

/// One runner's result line, if `line` is one: libtest's
/// `test result: ok. 12 passed; 0 failed; 1 ignored; …` or nextest's
/// `Summary [ 183.1s] 684 tests run: 683 passed (2 slow), 1 failed, 3 skipped`.
pub(crate) fn parse_line(line: &str) -> Option<Counts> {
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("test result: ") {
        return counted(rest, ';');
    }
    let rest = line.strip_prefix("Summary [")?;
    let (_, run) = rest.split_once("tests run:")?;
    let mut c = counted(run, ',')?;
    // nextest counts a test that timed out apart from the failures.
    c.failed += count_of(run, ',', "timed out").unwrap_or(0);
    Some(c)
}

/// `N word` counts in `text`, separated by `sep`: passed, failed, and
/// ignored or skipped.
fn counted(text: &str, sep: char) -> Option<Counts> {
    Some(Counts {
        passed: count_of(text, sep, "passed")?,
        failed: count_of(text, sep, "failed").unwrap_or(0),
        ignored: count_of(text, sep, "ignored")
            .or_else(|| count_of(text, sep, "skipped"))
            .unwrap_or(0),
    })
}

/// The number before `word` in the part of `text` (split on `sep`) that
/// has it, ignoring parenthesised notes such as `(2 slow, 1 leaky)`.
fn count_of(text: &str, sep: char, word: &str) -> Option<u64> {
    let mut depth = 0usize;
    let mut plain = String::new();
    for ch in text.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(ch),
            _ => {}
        }
    }
    plain.split(sep).find_map(|part| {
        let part = part.trim();
        let n = part.strip_suffix(word)?.trim();
        // "1 failed" but not "3 passed" for "failed"; the number is the
        // last word before the label.
        n.split_whitespace().last()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_result_lines_are_counted() {
        assert_eq!(
            parse_line(
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s"
            ),
            Some(Counts {
                passed: 12,
                failed: 0,
                ignored: 1
            })
        );
        assert_eq!(
            parse_line(
                "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out"
            ),
            Some(Counts {
                passed: 3,
                failed: 2,
                ignored: 0
            })
        );
        assert_eq!(parse_line("running 3 tests"), None);
    }

    #[test]
    fn nextest_summaries_are_counted() {
        assert_eq!(
            parse_line(
                "     Summary [ 183.095s] 684 tests run: 684 passed (2 slow, 2 leaky), 0 skipped"
            ),
            Some(Counts {
                passed: 684,
                failed: 0,
                ignored: 0
            })
        );
        assert_eq!(
            parse_line(
                "     Summary [ 321.276s] 684 tests run: 683 passed (2 slow, 2 leaky), 1 failed, 3 skipped"
            ),
            Some(Counts {
                passed: 683,
                failed: 1,
                ignored: 3
            })
        );
        assert_eq!(
            parse_line(
                "     Summary [  60.000s] 10 tests run: 8 passed, 1 failed, 1 timed out, 0 skipped"
            ),
            Some(Counts {
                passed: 8,
                failed: 2,
                ignored: 0
            })
        );
        assert_eq!(
            parse_line("        PASS [   1.0s] updraft::x summary"),
            None
        );
    }
}
