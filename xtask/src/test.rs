//! `cargo xtask test`: the whole test suite.
//!
//! Builds the binaries the black-box tests run, then runs every test in the
//! workspace (unit tests, interop tests against the real tools, end-to-end
//! tests against nginx, loop devices and the power-cut filesystem). Tests
//! that cannot run here skip loudly; the skips are collected and listed at
//! the end so a green run never hides what it did not check.

use std::path::PathBuf;

use crate::util::{self, Result, cargo, root};

pub fn run_tests(extra: &[String]) -> Result {
    let skip_log = root().join("target").join("test-skips.log");
    let _ = std::fs::remove_file(&skip_log);
    util::run(cargo().args(["build", "--quiet", "-p", "updraft", "-p", "updraft-publish"]))?;
    let mut test = cargo();
    test.args(["test", "--workspace", "--quiet", "--no-fail-fast"])
        .args(extra)
        .env("UPDRAFT_SKIP_LOG", &skip_log);
    let result = util::run(&mut test);
    report_skips(&skip_log);
    result
}

fn report_skips(path: &PathBuf) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        println!("xtask test: no test was skipped");
        return;
    }
    println!("xtask test: {} test(s) skipped:", lines.len());
    for l in lines {
        let (name, why) = l.split_once('\t').unwrap_or((l, ""));
        println!("  SKIPPED {name}: {why}");
    }
}

pub fn run(args: &[String]) -> Result {
    run_tests(args)
}
