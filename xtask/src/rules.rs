//! `cargo xtask check-rules [--no-fetch]`: the Prometheus rules in
//! `contrib/prometheus/` checked and unit-tested by promtool
//! (`promtool check rules`, `promtool test rules`), and a stage of
//! `cargo xtask test`.
//!
//! promtool comes from `UPDRAFT_PROMTOOL`, `PATH`, or a copy taken out of
//! Debian's `prometheus` package into `target/promtool/`: installing that
//! package would start a Prometheus server, so as root on Debian the
//! package is downloaded (`apt-get download`) and only its `promtool` is
//! extracted (`dpkg-deb -x`), never installed. Without promtool the check
//! skips and says why and how to get it; with `CI=true` that is a failure.
//!
//! It also checks, without promtool, that the test file exercises every
//! rule: each recording rule's value is asserted, and each alert is
//! asserted firing and not firing.
//!
//! This module installs nothing and starts no service; it writes only
//! under the target directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Result};

const USAGE: &str = "usage: cargo xtask check-rules [--no-fetch]
  runs `promtool check rules` and `promtool test rules` on contrib/prometheus/;
  promtool from UPDRAFT_PROMTOOL, PATH or target/promtool/ (as root on Debian it is
  extracted there from the prometheus package, never installed; --no-fetch or
  UPDRAFT_NO_INSTALL=1: don't). Without promtool it skips, or fails with CI=true";

/// The directory of the rules, relative to the workspace root.
pub const DIR: &str = "contrib/prometheus";
/// The rule files promtool checks.
const RULE_FILES: [&str; 2] = ["updraft.rules.yml", "updraft.target.yml"];
/// The unit tests of `updraft.rules.yml`.
const TEST_FILE: &str = "updraft.rules.test.yml";
/// The Debian package promtool is taken from.
const PACKAGE: &str = "prometheus";

/// How `check-rules` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// promtool is not available; the reason and how to get it.
    Skipped(String),
}

pub fn run(args: &[String]) -> Result {
    let mut fetch = !truthy("UPDRAFT_NO_INSTALL");
    for a in args {
        match a.as_str() {
            "--no-fetch" => fetch = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    match check(fetch)? {
        Outcome::Passed => Ok(()),
        Outcome::Skipped(why) if ci() => Err(format!(
            "promtool is needed with CI set, and it is not here: {why}"
        )),
        Outcome::Skipped(why) => {
            println!("check-rules: SKIPPED, the rules were not checked: {why}");
            Ok(())
        }
    }
}

/// Check the rules: coverage of the test file, then promtool's check and
/// tests. `fetch`: may take promtool out of the Debian package.
pub fn check(fetch: bool) -> Result<Outcome> {
    let dir = util::root().join(DIR);
    let rules = read(&dir.join(RULE_FILES[0]))?;
    let tests = read(&dir.join(TEST_FILE))?;
    let counts = coverage(&rules, &tests)
        .map_err(|e| format!("{DIR}/{TEST_FILE} does not test every rule: {e}"))?;
    let promtool = match promtool(fetch)? {
        Ok(p) => p,
        Err(why) => return Ok(Outcome::Skipped(why)),
    };
    println!(
        "check-rules: {} ({})",
        version(&promtool)?,
        promtool.display()
    );
    util::run(
        Command::new(&promtool)
            .args(["check", "rules"])
            .args(RULE_FILES)
            .current_dir(&dir),
    )
    .map_err(|e| format!("the rules in {DIR} are not valid: {e}"))?;
    util::run(
        Command::new(&promtool)
            .args(["test", "rules", TEST_FILE])
            .current_dir(&dir),
    )
    .map_err(|e| format!("the rule tests in {DIR}/{TEST_FILE} failed: {e}"))?;
    println!(
        "check-rules: {} recording and {} alerting rules; {} tests with {} value and {} alert assertions passed",
        counts.records, counts.alerts, counts.tests, counts.values, counts.alert_checks
    );
    Ok(Outcome::Passed)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

fn truthy(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        !v.is_empty() && v != "0" && v != "false" && v != "no"
    })
}

fn ci() -> bool {
    truthy("CI")
}

/// The first line `promtool --version` prints.
fn version(promtool: &Path) -> Result<String> {
    let out = Command::new(promtool)
        .arg("--version")
        .output()
        .map_err(|e| format!("running {} --version: {e}", promtool.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match text.lines().next() {
        Some(l) if out.status.success() => Ok(l.trim().to_string()),
        _ => Err(format!(
            "{} --version failed ({}): {}",
            promtool.display(),
            out.status,
            text.trim()
        )),
    }
}

/// Where the extracted promtool lives.
fn extracted() -> PathBuf {
    util::target_dir().join("promtool").join("promtool")
}

/// promtool's path, or why there is none (`Ok(Err(why))`).
fn promtool(fetch: bool) -> Result<std::result::Result<PathBuf, String>> {
    if let Some(p) = std::env::var_os("UPDRAFT_PROMTOOL").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(Ok(p))
        } else {
            Err(format!(
                "UPDRAFT_PROMTOOL names {}, which is not a file",
                p.display()
            ))
        };
    }
    if let Some(p) = updraft_tests::prereq::command("promtool") {
        return Ok(Ok(p));
    }
    let local = extracted();
    if local.is_file() {
        return Ok(Ok(local));
    }
    let how = format!(
        "as root on Debian `cargo xtask check-rules` extracts it into {} from the {PACKAGE} \
         package without installing it; or point UPDRAFT_PROMTOOL at a promtool binary",
        local.display()
    );
    if !fetch {
        return Ok(Err(format!(
            "promtool is not installed and fetching it is off (--no-fetch or UPDRAFT_NO_INSTALL); {how}"
        )));
    }
    if !util::is_root() {
        return Ok(Err(format!(
            "promtool is not installed and this is not root; {how}"
        )));
    }
    for tool in ["apt-get", "dpkg-deb"] {
        if updraft_tests::prereq::command(tool).is_none() {
            return Ok(Err(format!(
                "promtool is not installed and {tool} is not here (not Debian?); {how}"
            )));
        }
    }
    extract(&local).map(Ok)
}

/// Download the package and take promtool out of it, into `dest`.
fn extract(dest: &Path) -> Result<PathBuf> {
    let work = dest
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", dest.display()))?
        .to_path_buf();
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    println!(
        "check-rules: promtool is not installed; downloading the {PACKAGE} package into {} \
         to extract promtool (the package is not installed)",
        work.display()
    );
    let tree = work.join("package");
    let unpack = || {
        util::unpack_debs(
            Command::new("apt-get"),
            &[PACKAGE.to_string()],
            &work,
            &tree,
        )
    };
    if unpack().is_err() {
        println!("check-rules: the download failed; updating the package indexes and trying again");
        util::run(
            Command::new("apt-get")
                .args(["update", "-q"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        unpack().map_err(|e| format!("the {PACKAGE} package: {e}"))?;
    }
    let inside = tree.join("usr/bin/promtool");
    std::fs::rename(&inside, dest).map_err(|e| {
        format!(
            "moving {} to {}: {e} (the package has no promtool?)",
            inside.display(),
            dest.display()
        )
    })?;
    // Only promtool is kept: the rest of the package (the server) is removed.
    let _ = std::fs::remove_dir_all(&tree);
    Ok(dest.to_path_buf())
}

/// What the rules and their tests hold.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    records: usize,
    alerts: usize,
    tests: usize,
    values: usize,
    alert_checks: usize,
}

/// The value of `key: VALUE` on a trimmed line that starts a list item or
/// a mapping entry (`- key: v` or `key: v`).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let t = line.trim();
    let t = t.strip_prefix("- ").unwrap_or(t);
    let v = t.strip_prefix(key)?.strip_prefix(':')?.trim();
    Some(v.trim_matches(|c| c == '"' || c == '\''))
}

/// Check that the test file asserts every recording rule's value (an
/// `expr:` naming it) and every alert both firing and not firing (an
/// `alertname:` followed by a non-empty and by an empty `exp_alerts`).
/// Line based: the files are the repository's, written in one layout.
fn coverage(rules: &str, tests: &str) -> std::result::Result<Counts, String> {
    let mut c = Counts::default();
    let mut records: Vec<&str> = Vec::new();
    let mut alerts: Vec<&str> = Vec::new();
    for l in rules.lines() {
        if let Some(r) = field(l, "record") {
            if !records.contains(&r) {
                records.push(r);
            }
            c.records += 1;
        } else if let Some(a) = field(l, "alert") {
            alerts.push(a);
            c.alerts += 1;
        }
    }
    let lines: Vec<&str> = tests.lines().collect();
    let mut asserted: Vec<&str> = Vec::new();
    let mut firing: Vec<&str> = Vec::new();
    let mut quiet: Vec<&str> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if field(l, "name").is_some() && l.trim_start().starts_with("- name:") {
            c.tests += 1;
        } else if let Some(e) = field(l, "expr") {
            asserted.push(e);
            c.values += 1;
        } else if let Some(a) = field(l, "alertname") {
            c.alert_checks += 1;
            match lines.get(i + 1).map(|n| n.trim()) {
                Some("exp_alerts: []") => quiet.push(a),
                Some("exp_alerts:") => firing.push(a),
                other => {
                    return Err(format!(
                        "line {}: alertname {a} is not followed by exp_alerts (found {other:?})",
                        i + 2
                    ));
                }
            }
        }
    }
    let mut gaps = Vec::new();
    for r in &records {
        if !asserted.contains(r) {
            gaps.push(format!("no value asserted for {r}"));
        }
    }
    for a in &alerts {
        if !firing.contains(a) {
            gaps.push(format!("{a} is never asserted firing"));
        }
        if !quiet.contains(a) {
            gaps.push(format!("{a} is never asserted not firing"));
        }
    }
    for a in firing.iter().chain(&quiet) {
        if !alerts.contains(a) {
            gaps.push(format!(
                "the tests name {a}, which is not an alert of the rules"
            ));
        }
    }
    if gaps.is_empty() {
        Ok(c)
    } else {
        Err(gaps.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "groups:
  - name: g
    rules:
      - record: a:b:c
        expr: x
      - alert: Hot
        expr: a:b:c > 1
";

    const TESTS: &str = "tests:
  - name: one
    promql_expr_test:
      - expr: a:b:c
        eval_time: 1m
    alert_rule_test:
      - eval_time: 1m
        alertname: Hot
        exp_alerts: []
      - eval_time: 5m
        alertname: Hot
        exp_alerts:
          - exp_labels: {}
";

    #[test]
    fn a_test_file_covering_every_rule_is_counted() {
        let c = coverage(RULES, TESTS).unwrap();
        assert_eq!(
            c,
            Counts {
                records: 1,
                alerts: 1,
                tests: 1,
                values: 1,
                alert_checks: 2
            }
        );
    }

    #[test]
    fn a_rule_without_an_assertion_is_named() {
        let rules = format!("{RULES}      - record: d:e:f\n        expr: y\n");
        let e = coverage(&rules, TESTS).unwrap_err();
        assert_eq!(e, "no value asserted for d:e:f");
    }

    #[test]
    fn an_alert_asserted_only_quiet_is_named() {
        let tests = TESTS.replace("exp_alerts:\n          - exp_labels: {}", "exp_alerts: []");
        let e = coverage(RULES, &tests).unwrap_err();
        assert_eq!(e, "Hot is never asserted firing");
    }

    #[test]
    fn an_alert_the_rules_do_not_have_is_named() {
        let tests = TESTS.replacen("alertname: Hot", "alertname: Cold", 1);
        let e = coverage(RULES, &tests).unwrap_err();
        assert_eq!(
            e,
            "Hot is never asserted not firing; the tests name Cold, which is not an alert of the rules"
        );
    }

    #[test]
    fn the_shipped_tests_cover_the_shipped_rules() {
        let dir = util::root().join(DIR);
        let rules = read(&dir.join(RULE_FILES[0])).unwrap();
        let tests = read(&dir.join(TEST_FILE)).unwrap();
        let c = coverage(&rules, &tests).unwrap();
        assert!(c.records > 0 && c.alerts > 0, "{c:?}");
    }
}
