//! `cargo xtask fuzz [TARGET] [--seconds N]`: run the cargo-fuzz targets for
//! a bounded time each and report how many inputs each ran clean.
//!
//! The targets are the `[[bin]]` entries of `fuzz/Cargo.toml` (or the one
//! named). cargo-fuzz is installed if missing. The sanitizer flags cargo-fuzz
//! passes need a nightly compiler; `RUSTC_BOOTSTRAP=1` lets the stable one
//! accept them. Each run's output is kept in `target/fuzz-logs/TARGET.log`;
//! a crash leaves its input under `fuzz/artifacts/TARGET/`.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;

use crate::util::{self, Result};

pub fn run(args: &[String]) -> Result {
    let mut seconds: u64 = 60;
    let mut only: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                let v = it.next().ok_or("--seconds needs a value")?;
                seconds = v
                    .parse()
                    .map_err(|_| format!("--seconds {v:?} is not a number"))?;
            }
            s if s.starts_with('-') => {
                return Err(format!(
                    "unknown option {s:?} (usage: cargo xtask fuzz [TARGET] [--seconds N])"
                ));
            }
            name => only = Some(name.to_string()),
        }
    }

    let root = util::root();
    let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml"))
        .map_err(|e| format!("reading fuzz/Cargo.toml: {e}"))?;
    let all = targets(&manifest);
    let chosen: Vec<String> = match only {
        Some(t) if all.contains(&t) => vec![t],
        Some(t) => {
            return Err(format!(
                "no fuzz target {t:?} (targets: {})",
                all.join(", ")
            ));
        }
        None => all,
    };

    ensure_cargo_fuzz()?;
    let logs = root.join("target/fuzz-logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("creating {}: {e}", logs.display()))?;

    let mut summary = String::new();
    let mut failed = Vec::new();
    for target in &chosen {
        eprintln!("fuzz: {target} for {seconds} s");
        let outcome = run_target(&root, &logs, target, seconds)?;
        let _ = writeln!(
            summary,
            "  {target:<16} {:>12} executions in {:>4} s  {}",
            outcome
                .executions
                .map_or("?".to_string(), |n| n.to_string()),
            outcome.seconds.map_or(seconds, |s| s),
            outcome.verdict
        );
        if !outcome.clean {
            failed.push(target.clone());
        }
    }
    println!("fuzz results:\n{summary}");
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "fuzz targets failed: {} (logs in target/fuzz-logs/)",
            failed.join(", ")
        ))
    }
}

/// The `name` of every `[[bin]]` in the fuzz crate's manifest.
fn targets(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_bin = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
            continue;
        }
        if in_bin {
            if let Some(v) = line.strip_prefix("name") {
                let v = v
                    .trim_start()
                    .trim_start_matches('=')
                    .trim()
                    .trim_matches('"');
                if !v.is_empty() {
                    out.push(v.to_string());
                }
            }
        }
    }
    out
}

fn ensure_cargo_fuzz() -> Result {
    let present = util::cargo()
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if present {
        return Ok(());
    }
    eprintln!("fuzz: installing cargo-fuzz");
    util::run(util::cargo().args(["install", "cargo-fuzz", "--locked"]))
}

struct Outcome {
    executions: Option<u64>,
    seconds: Option<u64>,
    clean: bool,
    verdict: String,
}

fn run_target(root: &Path, logs: &Path, target: &str, seconds: u64) -> Result<Outcome> {
    let log = logs.join(format!("{target}.log"));
    let file =
        std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let err_file = file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let status = util::cargo()
        .current_dir(root)
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["fuzz", "run", target, "--"])
        .arg(format!("-max_total_time={seconds}"))
        .args(["-print_final_stats=1", "-rss_limit_mb=2048"])
        .stdout(file)
        .stderr(err_file)
        .status()
        .map_err(|e| format!("running cargo fuzz run {target}: {e}"))?;
    let text =
        std::fs::read_to_string(&log).map_err(|e| format!("reading {}: {e}", log.display()))?;
    let stat = |name: &str| -> Option<u64> {
        text.lines().rev().find_map(|l| {
            l.trim()
                .strip_prefix(name)?
                .trim()
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        })
    };
    // libFuzzer's last words: "Done 123456 runs in 61 second(s)".
    let done = text.lines().rev().find_map(|l| {
        let rest = l.trim().strip_prefix("Done ")?;
        let mut f = rest.split_whitespace();
        let runs = f.next()?.parse::<u64>().ok()?;
        let secs = f.nth(2)?.parse::<u64>().ok()?;
        Some((runs, secs))
    });
    let executions = stat("stat::number_of_executed_units").or(done.map(|d| d.0));
    let elapsed = done.map(|d| d.1);
    let crash = text
        .lines()
        .find(|l| {
            l.contains("SUMMARY: libFuzzer:")
                || l.contains("ERROR: libFuzzer:")
                || l.contains("panicked at")
        })
        .map(str::trim);
    let artifact = text
        .lines()
        .find_map(|l| l.split("Test unit written to ").nth(1))
        .map(str::trim);
    let clean = status.success() && crash.is_none();
    let verdict = if clean {
        "clean".to_string()
    } else {
        let mut v = format!("FAILED ({status})");
        if let Some(c) = crash {
            let _ = write!(v, ": {c}");
        }
        if let Some(a) = artifact {
            let _ = write!(v, "; input saved in fuzz/{a}");
        }
        if executions.is_none() && crash.is_none() {
            let _ = write!(v, "; see {}", log.display());
        }
        v
    };
    Ok(Outcome {
        executions,
        seconds: elapsed,
        clean,
        verdict,
    })
}
