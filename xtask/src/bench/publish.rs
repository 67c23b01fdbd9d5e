//! `cargo xtask bench publish [--size MIB] [--level N] [--runs N]
//! [--levels]`: how long making a release takes and how large it is,
//! beside `rauc bundle` and plain `zstd` on the same image in the same run.
//!
//! The image is `bench install`'s ext4 root filesystem (shared with it
//! under `target/bench/install/`). Measured, each `--runs` times,
//! interleaved, every one under GNU time (wall, user and system CPU, peak
//! RSS) with the output's size:
//!
//! * `updraft-publish release` at its defaults (every core, its level and
//!   frame size; `--level` overrides the level), and with `--threads 1`;
//! * `zstd -T0 -<level>`: the same compression on every core with no
//!   framing, hashing or signing, the floor for any compressed release;
//! * `rauc bundle` three ways, when RAUC is installed (a line says when it
//!   is absent): at its defaults (mksquashfs's gzip, 128 KiB blocks), with
//!   `-comp zstd` (mksquashfs's zstd level 15, 128 KiB blocks), and at its
//!   smallest (zstd level 19 or `--level`, 1 MiB blocks); mksquashfs uses
//!   every core.
//!
//! The goals printed: updraft-publish at its defaults no slower than
//! `rauc bundle` and its artifact no larger, against RAUC's defaults and
//! its zstd; against RAUC's smallest the ratios are printed without a
//! target. `--levels` adds one release per zstd level and frame size: the
//! table the publisher's defaults were chosen from (docs/manifest.md).
//!
//! After the runs the artifacts of the one-thread and all-core releases are
//! compared byte for byte: frames are compressed independently, so the
//! thread count must not change a single byte (`tests/tests/publish_output.rs`
//! checks the same for 1, 2 and 4 threads on a small image).
//!
//! Timings are printed, never asserted. The page cache is left warm: a
//! publisher reads its image once, and the first run of each tool pays any
//! cold read alike.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::common::{
    self, GNU_TIME, Load, TimeReport, fmt_kib, fmt_secs, print_table, read_time_report, shell_line,
    summary, under_gnu_time,
};
use super::install::{file_len, make_image, remove_dir};
use super::references;
use crate::util::{self, Result};

const USAGE: &str =
    "usage: cargo xtask bench publish [--size MIB] [--level N] [--runs N] [--levels]";

/// One way of making a release out of the image.
struct Method {
    label: String,
    cmd: Command,
    /// What the method writes: a file, or a release directory.
    output: PathBuf,
    runs: Vec<(f64, TimeReport, u64)>,
}

pub fn run(args: &[String]) -> Result {
    let load = Load::now();
    let common::ImageRuns {
        size_mib,
        level,
        runs,
        switches,
    } = common::image_runs(args, USAGE, &["levels"])?;
    common::require_tools(&[GNU_TIME, "mkfs.ext4", "zstd"])?;
    let started = Instant::now();
    let bins = common::release_binaries()?;
    let publish = bins.join("updraft-publish");
    let images = common::target_dir().join("bench").join("install");
    let work = common::target_dir().join("bench").join("publish");
    for d in [&images, &work] {
        std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let size = size_mib * 1024 * 1024;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default_level = publisher_default_level(&publish)?;
    let updraft_level = level.unwrap_or(default_level);
    let reference_level = level.unwrap_or(common::REFERENCE_LEVEL);

    println!("\n== inputs");
    let image = images.join(format!("rootfs-{size_mib}M.ext4"));
    make_image(&images, &image, size)?;
    let key = work.join("release");
    if !work.join("release.key").is_file() {
        util::output(Command::new(&publish).args(["keygen", "--out"]).arg(&key))?;
    }

    // updraft-publish as a build runs it: its defaults, unless --level.
    let release = |threads: Option<usize>, extra: &[String], out: &Path| {
        let mut cmd = Command::new(&publish);
        cmd.arg("release")
            .arg("--key")
            .arg(work.join("release.key"))
            .args([
                "--version",
                "1.0.0",
                "--compatible",
                "benchboard",
                "--image",
            ])
            .arg(&image);
        if let Some(l) = level {
            cmd.arg("--level").arg(l.to_string());
        }
        if let Some(t) = threads {
            cmd.arg("--threads").arg(t.to_string());
        }
        cmd.args(extra).arg("--out").arg(out);
        cmd
    };
    let all_out = work.join("release-all-cores");
    let one_out = work.join("release-1-thread");
    let at = match level {
        Some(l) => format!("level {l}"),
        None => "its defaults".into(),
    };
    let mut methods = vec![
        Method {
            label: format!("updraft-publish release, {at}"),
            cmd: release(None, &[], &all_out),
            output: all_out.clone(),
            runs: Vec::new(),
        },
        Method {
            label: format!("updraft-publish release, {at}, 1 thread"),
            cmd: release(Some(1), &[], &one_out),
            output: one_out.clone(),
            runs: Vec::new(),
        },
    ];
    let zst = work.join("image.zst");
    let mut zstd = Command::new("zstd");
    zstd.args(["-q", "-f", "-T0", &format!("-{updraft_level}")])
        .arg(&image)
        .arg("-o")
        .arg(&zst);
    if updraft_level > 19 {
        zstd.arg("--ultra");
    }
    methods.push(Method {
        label: format!("zstd -T0 -{updraft_level} (compression alone)"),
        cmd: zstd,
        output: zst,
        runs: Vec::new(),
    });
    // RAUC: its defaults (mksquashfs's gzip, 128 KiB blocks), zstd as
    // mksquashfs makes it when asked (level 15, 128 KiB blocks), and its
    // smallest (zstd at the reference level, 1 MiB blocks).
    let rauc_configs: Vec<(&str, String, Option<String>)> = vec![
        (
            "defaults",
            "its defaults: squashfs gzip, 128 KiB blocks".into(),
            None,
        ),
        (
            "zstd",
            "-comp zstd: level 15, 128 KiB blocks".into(),
            Some("-comp zstd".into()),
        ),
        (
            "smallest",
            format!("zstd -{reference_level}, 1 MiB blocks"),
            Some(references::smallest(reference_level)),
        ),
    ];
    let mut rauc = Vec::new();
    for (name, what, args) in &rauc_configs {
        let bundle = work.join(format!("rootfs-{name}.raucb"));
        let dir = work.join(format!("rauc-{name}"));
        match references::rauc_bundle(&dir, &image, args.as_deref(), &bundle) {
            Ok(cmd) => {
                rauc.push((methods.len(), *name, dir, args.clone()));
                methods.push(Method {
                    label: format!("rauc bundle ({what})"),
                    cmd,
                    output: bundle,
                    runs: Vec::new(),
                });
            }
            Err(e) => println!("  rauc: left out, {e}"),
        }
    }
    for m in &methods {
        println!("  {}: {}", m.label, shell_line(&m.cmd));
    }

    println!("\n== {runs} run(s) of each, interleaved ({cores} cores)");
    let report = work.join("time.txt");
    for run in 1..=runs {
        for (i, m) in methods.iter_mut().enumerate() {
            remove_output(&m.output)?;
            if let Some((_, _, dir, args)) = rauc.iter().find(|r| r.0 == i) {
                // rauc bundle consumes its content directory: make it again.
                m.cmd = references::rauc_bundle(dir, &image, args.as_deref(), &m.output)?;
            }
            let (wall, r) = timed(&mut m.cmd, &report)?;
            let len = output_len(&m.output)?;
            println!(
                "  run {run}: {:<62} {wall:>6.2} s, {}",
                m.label,
                fmt_kib(len as f64 / 1024.0)
            );
            m.runs.push((wall, r, len));
        }
    }
    for (_, _, dir, _) in &rauc {
        let _ = std::fs::remove_dir_all(dir.join("content"));
    }

    println!(
        "\n== bench publish: {size_mib} MiB ext4 image, {cores} cores, warm page cache, {}",
        load.map_or("machine load unknown".into(), |l| format!(
            "machine {l} before the bench"
        ))
    );
    let mut rows = vec![vec![
        "method".to_string(),
        "wall median (min–max)".into(),
        "user".into(),
        "sys".into(),
        "peak RSS".into(),
        "output".into(),
    ]];
    let median = |m: &Method, f: &dyn Fn(&(f64, TimeReport, u64)) -> f64| {
        summary(&m.runs.iter().map(f).collect::<Vec<_>>()).map_or(0.0, |s| s.median)
    };
    for m in &methods {
        rows.push(vec![
            m.label.clone(),
            fmt_secs(summary(&m.runs.iter().map(|r| r.0).collect::<Vec<_>>())),
            format!("{:.2} s", median(m, &|r| r.1.user.as_secs_f64())),
            format!("{:.2} s", median(m, &|r| r.1.sys.as_secs_f64())),
            fmt_kib(median(m, &|r| r.1.max_rss_kib as f64)),
            format!("{:.2} MB", median(m, &|r| r.2 as f64) / 1e6),
        ]);
    }
    print_table(&rows);

    println!("\n  goals (from the specification): updraft-publish at {at}, all cores, against");
    let mut goals = vec![vec![
        "rauc bundle".to_string(),
        "time ratio".into(),
        "size ratio".into(),
        "target".into(),
    ]];
    let ours = &methods[0];
    for (i, name, _, _) in &rauc {
        let theirs = &methods[*i];
        let ratio = |f: &dyn Fn(&(f64, TimeReport, u64)) -> f64| {
            let b = median(theirs, f);
            if b > 0.0 {
                format!("{:.2} ×", median(ours, f) / b)
            } else {
                "n/a".into()
            }
        };
        goals.push(vec![
            theirs.label.clone(),
            ratio(&|r| r.0),
            ratio(&|r| r.2 as f64),
            if *name == "smallest" {
                "(no target: RAUC's slowest)".into()
            } else {
                "both ≤ 1 ×".into()
            },
        ]);
    }
    print_table(&goals);

    let all = artifacts_digest(&all_out)?;
    let one = artifacts_digest(&one_out)?;
    if all == one {
        println!(
            "  artifacts of the {cores}-thread and 1-thread releases: byte-identical ({})",
            all.join(", ")
        );
    } else {
        return Err(format!(
            "the {cores}-thread and 1-thread releases differ: {all:?} vs {one:?}"
        ));
    }

    if switches.contains(&"levels") {
        level_table(&release, &work, &report, default_level)?;
    }
    println!(
        "\nbench publish took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The `updraft-publish release` command: threads (`None`: its default),
/// extra arguments, output directory.
type ReleaseCommand<'a> = dyn Fn(Option<usize>, &[String], &Path) -> Command + 'a;

/// `--levels`: one all-core release per level and frame size, the table
/// the publisher's defaults are chosen from.
fn level_table(release: &ReleaseCommand, work: &Path, report: &Path, default_level: u64) -> Result {
    println!("\n== level × frame size (one run each, all cores)");
    let out = work.join("release-levels");
    let mut rows = vec![vec![
        "level".to_string(),
        "frames".into(),
        "wall".into(),
        "CPU (user + sys)".into(),
        "peak RSS".into(),
        "artifact".into(),
    ]];
    for frame_mib in [2u64, 4] {
        for level in [3u64, 6, 9, 12, 15, 16, 17, 19] {
            remove_output(&out)?;
            let extra = vec![
                "--level".to_string(),
                level.to_string(),
                "--frame-size".into(),
                (frame_mib << 20).to_string(),
            ];
            let mut cmd = release(None, &extra, &out);
            let (wall, r) = timed(&mut cmd, report)?;
            let len = artifacts_len(&out)?;
            let mark = if level == default_level && frame_mib == 2 {
                " (default)"
            } else {
                ""
            };
            println!(
                "  level {level:>2}, {frame_mib} MiB frames: {wall:.1} s, {:.2} MB",
                len as f64 / 1e6
            );
            rows.push(vec![
                format!("{level}{mark}"),
                format!("{frame_mib} MiB"),
                format!("{wall:.1} s"),
                format!("{:.1} s", (r.user + r.sys).as_secs_f64()),
                fmt_kib(r.max_rss_kib as f64),
                format!("{:.2} MB", len as f64 / 1e6),
            ]);
        }
    }
    remove_output(&out)?;
    print_table(&rows);
    Ok(())
}

/// The publisher's default zstd level, from its help text.
fn publisher_default_level(publish: &Path) -> Result<u64> {
    let help = util::output(Command::new(publish).args(["release", "--help"]))?;
    help.lines()
        .find(|l| l.contains("--level") && l.contains("(default "))
        .and_then(|l| l.split("(default ").nth(1))
        .and_then(|rest| rest.split(')').next())
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "updraft-publish release --help names no default --level".into())
}

/// Run `cmd` under GNU time; wall seconds and the report.
fn timed(cmd: &mut Command, report: &Path) -> Result<(f64, TimeReport)> {
    let mut timed = under_gnu_time(cmd, report);
    let t0 = Instant::now();
    let out = timed
        .output()
        .map_err(|e| format!("starting {}: {e}", shell_line(cmd)))?;
    let wall = t0.elapsed().as_secs_f64();
    let r = read_time_report(report)?;
    if !out.status.success() || r.exit != 0 {
        return Err(format!(
            "{} failed ({}):\n{}",
            shell_line(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((wall, r))
}

fn remove_output(p: &Path) -> Result {
    if p.is_dir() {
        remove_dir(p)
    } else {
        match std::fs::remove_file(p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("removing {}: {e}", p.display())),
        }
    }
}

/// Bytes a method wrote: a file's length, or a release directory's files.
fn output_len(p: &Path) -> Result<u64> {
    if !p.is_dir() {
        return file_len(p);
    }
    let mut total = 0;
    for sub in [p.to_path_buf(), p.join("artifacts")] {
        let entries =
            std::fs::read_dir(&sub).map_err(|e| format!("listing {}: {e}", sub.display()))?;
        for e in entries.flatten() {
            if e.path().is_file() {
                total += file_len(&e.path())?;
            }
        }
    }
    Ok(total)
}

/// Bytes of a release directory's artifacts.
fn artifacts_len(release: &Path) -> Result<u64> {
    let dir = release.join("artifacts");
    let mut total = 0;
    for e in std::fs::read_dir(&dir)
        .map_err(|e| format!("listing {}: {e}", dir.display()))?
        .flatten()
    {
        if e.path().is_file() {
            total += file_len(&e.path())?;
        }
    }
    Ok(total)
}

/// `name sha256` of each artifact of a release directory, by name.
fn artifacts_digest(release: &Path) -> Result<Vec<String>> {
    let dir = release.join("artifacts");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("listing {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    names.sort();
    let mut out = Vec::new();
    for p in names {
        let line = util::output(Command::new("sha256sum").arg(&p))?;
        let hash = line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let name = p
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        out.push(format!("{name} {}", &hash[..hash.len().min(16)]));
    }
    Ok(out)
}
