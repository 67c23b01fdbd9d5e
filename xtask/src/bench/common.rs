//! Plumbing shared by the benchmarks: release binaries, GNU time's report,
//! cold caches, summaries of repeated runs, and printing commands so a
//! reader can repeat them by hand.
//!
//! Nothing here asserts a timing: benchmarks print figures beside the
//! reference tools and leave the judgement to the reader.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::{self, Result, cargo, root};

/// GNU time, whose `-v` report gives the peak RSS of the process it runs.
pub const GNU_TIME: &str = "/usr/bin/time";

/// The cargo target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() { d } else { root().join(d) }
        }
        None => root().join("target"),
    }
}

/// Build `updraft` and `updraft-publish` with the release profile (what
/// ships) and return the directory holding them.
pub fn release_binaries() -> Result<PathBuf> {
    println!("building the release binaries (cargo build --release -p updraft -p updraft-publish)");
    util::run(cargo().args([
        "build",
        "--release",
        "-p",
        "updraft",
        "-p",
        "updraft-publish",
    ]))?;
    let dir = target_dir().join("release");
    for name in ["updraft", "updraft-publish"] {
        if !dir.join(name).is_file() {
            return Err(format!(
                "{} is missing after the release build",
                dir.join(name).display()
            ));
        }
    }
    Ok(dir)
}

/// Fail unless every tool is on PATH (or is an existing absolute path).
pub fn require_tools(tools: &[&str]) -> Result {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            if t.starts_with('/') {
                !Path::new(t).is_file()
            } else {
                !util::have(t)
            }
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "missing tools: {} (Debian: apt-get install time zstd e2fsprogs util-linux coreutils)",
            missing.join(", ")
        ))
    }
}

/// Write back dirty pages and empty the page cache, so the next run reads
/// and writes the medium (needs root).
pub fn drop_caches() -> Result {
    util::run(&mut Command::new("sync"))?;
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .map_err(|e| format!("writing 3 to /proc/sys/vm/drop_caches: {e}"))
}

/// What GNU `time -v -o FILE` reports about one process.
#[derive(Clone, Copy, Debug, Default)]
pub struct TimeReport {
    /// Peak resident set size.
    pub max_rss_kib: u64,
    /// User CPU time.
    pub user: Duration,
    /// System CPU time.
    pub sys: Duration,
    /// Exit status of the process.
    pub exit: i32,
}

/// `cmd` (program, arguments and environment) run under GNU time, which
/// writes its report to `report`; stdin is closed.
pub fn under_gnu_time(cmd: &Command, report: &Path) -> Command {
    let mut timed = Command::new(GNU_TIME);
    timed
        .arg("-v")
        .arg("-o")
        .arg(report)
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(std::process::Stdio::null());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => timed.env(k, v),
            None => timed.env_remove(k),
        };
    }
    timed
}

/// Parse a report written by `time -v -o FILE`.
pub fn read_time_report(path: &Path) -> Result<TimeReport> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading GNU time's report {}: {e}", path.display()))?;
    let field = |name: &str| -> Result<&str> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::trim)
            .ok_or_else(|| format!("GNU time's report {} has no {name:?}", path.display()))
    };
    let secs = |name: &str| -> Result<Duration> {
        let v = field(name)?;
        v.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| format!("GNU time's {name:?} is not a number of seconds: {v:?}"))
    };
    let num = |name: &str| -> Result<u64> {
        let v = field(name)?;
        v.parse::<u64>()
            .map_err(|_| format!("GNU time's {name:?} is not a number: {v:?}"))
    };
    Ok(TimeReport {
        max_rss_kib: num("Maximum resident set size (kbytes):")?,
        user: secs("User time (seconds):")?,
        sys: secs("System time (seconds):")?,
        exit: num("Exit status:")? as i32,
    })
}

/// Median, minimum and maximum of repeated measurements.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// Summarise `values`; `None` when there are none.
pub fn summary(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
    })
}

/// `1.23 s (1.20–1.30)`, or `n/a`.
pub fn fmt_secs(s: Option<Summary>) -> String {
    match s {
        Some(s) => format!("{:.2} s ({:.2}–{:.2})", s.median, s.min, s.max),
        None => "n/a".into(),
    }
}

/// KiB as `12.3 MiB`.
pub fn fmt_kib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

/// A command as a shell line a reader can paste.
pub fn shell_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quote one word for a POSIX shell when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Print rows as a table with aligned columns; the first row is the header.
pub fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, s)| {
                let pad = width[c].saturating_sub(s.chars().count());
                if c == 0 {
                    format!("{s}{}", " ".repeat(pad))
                } else {
                    format!("{}{s}", " ".repeat(pad))
                }
            })
            .collect();
        println!("  {}", line.join("  ").trim_end());
        if i == 0 {
            let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
            println!("  {}", "-".repeat(total));
        }
    }
}

/// `--size MIB --level N --runs N` of the benchmarks that publish the
/// bench image (defaults 256 MiB, level 19, 3 runs).
pub struct ImageRuns {
    /// The switches given (`--NAME` without a value), of those the
    /// benchmark knows.
    pub switches: Vec<&'static str>,
    pub size_mib: u64,
    /// `--level`: the zstd level of every compressed output; without it
    /// updraft-publish keeps its own default and the references use
    /// [`REFERENCE_LEVEL`].
    pub level: Option<u64>,
    pub runs: usize,
}

/// The zstd level of the reference outputs (RAUC's squashfs, plain zstd)
/// when `--level` is not given: their smallest output.
pub const REFERENCE_LEVEL: u64 = 19;

/// Parse and check [`ImageRuns`]; errors end with `usage`.
pub fn image_runs(args: &[String], usage: &str, switches: &[&'static str]) -> Result<ImageRuns> {
    let (on, args): (Vec<&String>, Vec<&String>) = args
        .iter()
        .partition(|a| switches.iter().any(|s| a.strip_prefix("--") == Some(s)));
    let args: Vec<String> = args.into_iter().cloned().collect();
    let f = flags(&args, &["size", "level", "runs"]).map_err(|e| format!("{e}\n{usage}"))?;
    let size_mib = number_flag(&f, "size", 256)?;
    let level = match f.iter().find(|(k, _)| *k == "level") {
        Some(_) => Some(number_flag(&f, "level", 0)?),
        None => None,
    };
    let runs = number_flag(&f, "runs", 3)?.max(1) as usize;
    if !(16..=4096).contains(&size_mib) || level.is_some_and(|l| !(1..=22).contains(&l)) {
        return Err(format!(
            "--size must be 16..4096 MiB and --level 1..22\n{usage}"
        ));
    }
    Ok(ImageRuns {
        size_mib,
        level,
        runs,
        switches: switches
            .iter()
            .copied()
            .filter(|s| on.iter().any(|a| a.strip_prefix("--") == Some(s)))
            .collect(),
    })
}

/// The machine's load: the 1-minute load average, read before a benchmark
/// builds or runs anything, beside the number of cores.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub average: f64,
    pub cores: usize,
}

impl Load {
    pub fn now() -> Option<Load> {
        let text = std::fs::read_to_string("/proc/loadavg").ok()?;
        let average = text.split_whitespace().next()?.parse().ok()?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Some(Load { average, cores })
    }

    /// Load averages further apart than this are different machines as far
    /// as timings go: a run is not compared with a baseline taken at
    /// another load.
    pub const COMPARABLE: f64 = 0.5;

    pub fn comparable(&self, other: &Load) -> bool {
        self.cores == other.cores && (self.average - other.average).abs() <= Load::COMPARABLE
    }
}

impl std::fmt::Display for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "load {:.2} on {} cores", self.average, self.cores)
    }
}

/// Figures of an earlier run, kept in the source tree so that the next run
/// prints them beside its own: `key value` lines, `#` comments.
pub struct Baseline {
    pub values: Vec<(String, String)>,
}

impl Baseline {
    pub fn parse(text: &str) -> Baseline {
        let values = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once(char::is_whitespace))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect();
        Baseline { values }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn number(&self, key: &str) -> Option<f64> {
        self.get(key)?.parse().ok()
    }

    pub fn load(&self) -> Option<Load> {
        Some(Load {
            average: self.number("load")?,
            cores: self.number("cores")? as usize,
        })
    }
}

/// The commit checked out (`+` when the tree has changes), for a stored
/// baseline.
pub fn head_commit() -> String {
    util::output(Command::new("git").arg("-C").arg(root()).args([
        "describe",
        "--always",
        "--dirty=+",
    ]))
    .map(|s| s.trim().to_string())
    .unwrap_or_else(|_| "unknown".into())
}

/// Parse `--name VALUE` flags; anything else is a usage error.
pub fn flags<'a>(args: &'a [String], known: &[&str]) -> Result<Vec<(&'a str, &'a str)>> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let name = a
            .strip_prefix("--")
            .filter(|n| known.contains(n))
            .ok_or_else(|| {
                format!(
                    "unknown argument {a:?} (known: {})",
                    known
                        .iter()
                        .map(|k| format!("--{k}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
        out.push((name, v.as_str()));
    }
    Ok(out)
}

/// The value of a numeric flag, or `default`.
pub fn number_flag(flags: &[(&str, &str)], name: &str, default: u64) -> Result<u64> {
    match flags.iter().rev().find(|(n, _)| *n == name) {
        Some((_, v)) => v
            .parse()
            .map_err(|_| format!("--{name} takes a number, not {v:?}")),
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let s = summary(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        assert_eq!(summary(&[3.0, 1.0, 2.0]).unwrap().median, 2.0);
        assert!(summary(&[]).is_none());
    }

    #[test]
    fn gnu_time_reports_parse_into_rss_cpu_and_status() {
        let dir = std::env::temp_dir().join(format!("xtask-time-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.txt");
        std::fs::write(
            &p,
            "\tCommand being timed: \"true\"\n\tUser time (seconds): 1.25\n\
             \tSystem time (seconds): 0.50\n\tMaximum resident set size (kbytes): 9216\n\
             \tExit status: 0\n",
        )
        .unwrap();
        let r = read_time_report(&p).unwrap();
        assert_eq!(r.max_rss_kib, 9216);
        assert_eq!(r.user, Duration::from_millis(1250));
        assert_eq!(r.sys, Duration::from_millis(500));
        assert_eq!(r.exit, 0);
        std::fs::write(&p, "Exit status: 0\n").unwrap();
        assert!(read_time_report(&p).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shell_lines_quote_only_what_needs_quoting() {
        let mut c = Command::new("dd");
        c.args(["of=/dev/loop3", "bs=4M", "it's"]);
        assert_eq!(shell_line(&c), "dd of=/dev/loop3 bs=4M 'it'\\''s'");
    }

    #[test]
    fn unknown_flags_and_missing_values_are_usage_errors() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let args = a(&["--runs", "5"]);
        let f = flags(&args, &["runs"]).unwrap();
        assert_eq!(number_flag(&f, "runs", 3).unwrap(), 5);
        assert_eq!(number_flag(&f, "level", 19).unwrap(), 19);
        assert!(flags(&a(&["--bogus", "1"]), &["runs"]).is_err());
        assert!(flags(&a(&["--runs"]), &["runs"]).is_err());
        let bad = a(&["--runs", "x"]);
        assert!(number_flag(&flags(&bad, &["runs"]).unwrap(), "runs", 3).is_err());
    }
}
