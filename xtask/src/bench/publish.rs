//! `cargo xtask bench publish [--size MIB] [--level N] [--runs N]`: how
//! long making a release takes, beside `rauc bundle` and plain `zstd` on
//! the same image in the same run.
//!
//! The image is `bench install`'s ext4 root filesystem (shared with it
//! under `target/bench/install/`). Measured, each `--runs` times,
//! interleaved, every one under GNU time (wall, user and system CPU, peak
//! RSS) with the output's size:
//!
//! * `updraft-publish release` on every core (`--threads` = the cores
//!   here), and with `--threads 1`;
//! * `zstd -T0 -<level>`: the same compression on every core with no
//!   framing, hashing or signing, the floor for any compressed release;
//! * `rauc bundle` with squashfs zstd at the same level and 1 MiB blocks
//!   (mksquashfs uses every core), when RAUC is installed; a line says
//!   when it is absent.
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
    self, GNU_TIME, TimeReport, fmt_kib, fmt_secs, print_table, read_time_report, shell_line,
    summary, under_gnu_time,
};
use super::install::{file_len, make_image, remove_dir};
use super::references;
use crate::util::{self, Result};

const USAGE: &str = "usage: cargo xtask bench publish [--size MIB] [--level N] [--runs N]";

/// One way of making a release out of the image.
struct Method {
    label: String,
    cmd: Command,
    /// What the method writes: a file, or a release directory.
    output: PathBuf,
    runs: Vec<(f64, TimeReport, u64)>,
}

pub fn run(args: &[String]) -> Result {
    let common::ImageRuns {
        size_mib,
        level,
        runs,
    } = common::image_runs(args, USAGE)?;
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

    println!("\n== inputs");
    let image = images.join(format!("rootfs-{size_mib}M.ext4"));
    make_image(&images, &image, size)?;
    let key = work.join("release");
    if !work.join("release.key").is_file() {
        util::output(Command::new(&publish).args(["keygen", "--out"]).arg(&key))?;
    }

    let release = |threads: usize, out: &Path| {
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
            .arg(&image)
            .arg("--level")
            .arg(level.to_string())
            .arg("--threads")
            .arg(threads.to_string())
            .arg("--out")
            .arg(out);
        cmd
    };
    let all_out = work.join("release-all-cores");
    let one_out = work.join("release-1-thread");
    let mut methods = vec![
        Method {
            label: format!("updraft-publish release, {cores} threads"),
            cmd: release(cores, &all_out),
            output: all_out.clone(),
            runs: Vec::new(),
        },
        Method {
            label: "updraft-publish release, 1 thread".into(),
            cmd: release(1, &one_out),
            output: one_out.clone(),
            runs: Vec::new(),
        },
    ];
    let zst = work.join("image.zst");
    let mut zstd = Command::new("zstd");
    zstd.args(["-q", "-f", "-T0", &format!("-{level}")])
        .arg(&image)
        .arg("-o")
        .arg(&zst);
    if level > 19 {
        zstd.arg("--ultra");
    }
    methods.push(Method {
        label: format!("zstd -T0 -{level} (compression alone)"),
        cmd: zstd,
        output: zst,
        runs: Vec::new(),
    });
    let bundle = work.join("rootfs.raucb");
    let rauc_dir = work.join("rauc");
    match references::rauc_bundle(&rauc_dir, &image, level, &bundle) {
        Ok(cmd) => methods.push(Method {
            label: format!("rauc bundle (squashfs zstd -{level}, 1 MiB blocks, plain)"),
            cmd,
            output: bundle.clone(),
            runs: Vec::new(),
        }),
        Err(e) => println!("  rauc: left out, {e}"),
    }
    for m in &methods {
        println!("  {}: {}", m.label, shell_line(&m.cmd));
    }

    println!("\n== {runs} run(s) of each, interleaved ({cores} cores)");
    let report = work.join("time.txt");
    for run in 1..=runs {
        for m in &mut methods {
            remove_output(&m.output)?;
            if m.output == bundle {
                // rauc bundle consumes its content directory: make it again.
                m.cmd = references::rauc_bundle(&rauc_dir, &image, level, &bundle)?;
            }
            let (wall, r) = timed(&mut m.cmd, &report)?;
            let len = output_len(&m.output)?;
            println!(
                "  run {run}: {:<58} {wall:>6.2} s, {}",
                m.label,
                fmt_kib(len as f64 / 1024.0)
            );
            m.runs.push((wall, r, len));
        }
    }
    let _ = std::fs::remove_dir_all(rauc_dir.join("content"));

    println!(
        "\n== bench publish: {size_mib} MiB ext4 image, zstd level {level}, {cores} cores, warm page cache"
    );
    let mut rows = vec![vec![
        "method".to_string(),
        "wall median (min–max)".into(),
        "user".into(),
        "sys".into(),
        "peak RSS".into(),
        "output".into(),
    ]];
    for m in &methods {
        let med = |f: &dyn Fn(&(f64, TimeReport, u64)) -> f64| {
            summary(&m.runs.iter().map(f).collect::<Vec<_>>()).map_or(0.0, |s| s.median)
        };
        rows.push(vec![
            m.label.clone(),
            fmt_secs(summary(&m.runs.iter().map(|r| r.0).collect::<Vec<_>>())),
            format!("{:.2} s", med(&|r| r.1.user.as_secs_f64())),
            format!("{:.2} s", med(&|r| r.1.sys.as_secs_f64())),
            fmt_kib(med(&|r| r.1.max_rss_kib as f64)),
            format!("{:.2} MB", med(&|r| r.2 as f64) / 1e6),
        ]);
    }
    print_table(&rows);

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
    println!(
        "\nbench publish took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
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
