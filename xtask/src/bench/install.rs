//! `cargo xtask bench install [--size MIB] [--level N] [--runs N]
//! [--save-baseline]`: a full image from a local release directory into a
//! loop-device slot, timed beside `zstd -dc | dd` on the same artifact and
//! the same device.
//!
//! The image is a real ext4 filesystem (`mkfs.ext4 -d`) filled to about
//! three quarters with files copied from this machine's `/usr` (programs,
//! shared libraries, Python, data files), the rest left empty as on a real
//! root filesystem. It is published with the release `updraft-publish` at
//! its defaults (its level, 2 MiB frames; `--level` sets the level). Both slots are loop devices over files, with direct I/O
//! to the backing file when the kernel allows it, so writes reach the file
//! system below as they would reach a disk. Every run starts with the page
//! cache dropped.
//!
//! updraft's device is configured as a user would write it: slots, the
//! `file` bootloader, `system.reboot = "manual"` and a state directory,
//! nothing tuned. Its slot A names release 0.9.0 in a release marker, as
//! an image built with one does, so the install measures the steady
//! state; the "first install" row has no marker, so the device first
//! looks at whether slot A already holds the release (one frame read, as
//! slot A holds another image).
//!
//! Measured, each `--runs` times, interleaved: `updraft install` with
//! read-back (the default), `updraft install` with `system.readback =
//! false`, the first install, the reference pipeline `zstd -dc ARTIFACT | dd of=SLOT bs=4M
//! conv=fsync`, the same with `iflag=fullblock oflag=direct`, and RAUC and
//! SWUpdate installing the same image into the same slot B when they are
//! installed (set up by [`super::references`]; a line says which are
//! absent, and every reference run is followed by a check that slot B
//! holds the image). Wall time is measured around the whole command; peak
//! RSS comes from GNU time (for the pipeline, per process; for RAUC, the
//! client and its service). For every updraft run the sectors read from
//! slot B (`/sys/block/loopN/stat`, field 3) are printed beside the
//! image's size in sectors, showing the read-back read the device and not
//! the page cache. Then once: what the parts cost alone (decode, hashing,
//! reading the slot back), and where updraft's time goes, from when its
//! state lines appear on stderr.
//!
//! Goals printed: updraft with read-back within 1.3 × of `zstd -dc | dd
//! oflag=direct` and within 1.15 × without it, faster than RAUC and
//! SWUpdate when they are present, wall time below CPU time (the stages
//! overlap), and a peak RSS of at most 16 MiB. Beside each, the figure of
//! the stored baseline (`install-baseline.txt`, written by
//! `--save-baseline`), printed only when the machine's load (the 1-minute
//! average, read before the bench builds anything) is within 0.5 of the
//! baseline's on as many cores: runs at different loads are not compared.
//!
//! Needs root (loop devices, dropping caches). The image and release are
//! kept under `target/bench/install/` and reused by later runs with the same
//! size and level; loop devices attached here are detached on exit.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{
    self, Baseline, GNU_TIME, Load, Summary, TimeReport, drop_caches, fmt_kib, fmt_secs,
    print_table, read_time_report, shell_line, summary,
};
use super::references::{self, Tool};
use crate::util::{self, Result, is_root};

const USAGE: &str = "usage: cargo xtask bench install [--size MIB] [--level N] [--runs N]";

/// Files copied into the image: (source directory, share of the image).
const TREE: &[(&str, f64)] = &[
    ("/usr/bin", 0.15),
    ("/usr/lib/python3.11", 0.20),
    ("/usr/lib/x86_64-linux-gnu", 0.30),
    ("/usr/lib/aarch64-linux-gnu", 0.02),
    ("/usr/share", 0.08),
];

pub fn run(args: &[String]) -> Result {
    let load = Load::now();
    let common::ImageRuns {
        size_mib,
        level,
        runs,
        switches,
    } = common::image_runs(args, USAGE, &["save-baseline"])?;
    let save_baseline = switches.contains(&"save-baseline");
    if !is_root() {
        return Err(
            "needs root: it attaches loop devices and drops the page cache (run it with sudo)"
                .into(),
        );
    }
    common::require_tools(&[
        GNU_TIME,
        "losetup",
        "mkfs.ext4",
        "zstd",
        "dd",
        "sha256sum",
        "sh",
        "sync",
    ])?;
    let started = Instant::now();
    let bins = common::release_binaries()?;
    let updraft = bins.join("updraft");
    let publish = bins.join("updraft-publish");
    let work = common::target_dir().join("bench").join("install");
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let size = size_mib * 1024 * 1024;

    println!("\n== inputs");
    let image = work.join(format!("rootfs-{size_mib}M.ext4"));
    make_image(&work, &image, size)?;
    let release = work.join(match level {
        Some(l) => format!("release-{size_mib}M-l{l}"),
        None => format!("release-{size_mib}M-default"),
    });
    let artifact = publish_release(&publish, &work, &image, &release, level)?;
    let frame_mib = frame_size(&publish, &release)? as f64 / (1 << 20) as f64;
    let art_len = file_len(&artifact)?;
    println!(
        "  artifact: {} ({}, {:.1}% of the image)",
        artifact.display(),
        fmt_kib(art_len as f64 / 1024.0),
        100.0 * art_len as f64 / size as f64
    );

    let slots = Slots::attach(&work, size)?;
    println!(
        "  slots: A = {} (booted), B = {} (target), {} MiB each, {}",
        slots.a.dev.display(),
        slots.b.dev.display(),
        size_mib,
        if slots.b.direct_io {
            "direct I/O to the backing file"
        } else {
            "buffered backing file (this kernel refused --direct-io)"
        }
    );
    let dev = Device::new(&work, &slots, &release)?;

    println!("\n== reference installers");
    let refs = references::prepare(&references::Inputs {
        work: &work,
        image: &image,
        artifact: &artifact,
        size,
        level: level.unwrap_or(common::REFERENCE_LEVEL),
        slot_a: &slots.a.dev,
        slot_b: &slots.b.dev,
    })?;
    for note in refs.notes() {
        println!("  {note}");
    }
    let present = refs.present();

    let mut variants = vec![
        Variant::Updraft {
            readback: true,
            first: false,
        },
        Variant::Updraft {
            readback: false,
            first: false,
        },
        Variant::Updraft {
            readback: true,
            first: true,
        },
        Variant::Pipeline { direct: false },
        Variant::Pipeline { direct: true },
    ];
    variants.extend(present.iter().map(|&t| Variant::Reference(t)));
    println!("\n== commands measured (page cache dropped before each run)");
    for v in &variants {
        println!(
            "  {:<34} {}",
            v.label(),
            v.command_line(&updraft, &dev, &artifact, &slots, &refs)
        );
    }
    println!(
        "\n  updraft's device: slots, the `file` bootloader, manual reboot and its state \
         directory, nothing tuned; slot A's root file system names release 0.9.0 in its \
         release marker, except in the first install, which has none and looks at slot A"
    );
    println!("\n  what each checks while installing:");
    println!(
        "  {:<34} signed manifest, hash of the written image; with read-back also \
         re-reads slot B (O_DIRECT) and hashes what is there",
        "updraft install"
    );
    println!("  {:<34} nothing (no signature, no hash)", "zstd -dc | dd");
    for &t in &present {
        println!("  {:<34} {}", t.label(), refs.verification(t));
    }
    if !present.is_empty() {
        println!(
            "  after every {} run slot B's first {} bytes are hashed and compared with the image",
            present
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(" and "),
            size
        );
    }
    let image_sectors = size / 512;

    let mut results: Vec<Vec<Measured>> = variants.iter().map(|_| Vec::new()).collect();
    for round in 1..=runs {
        for (i, v) in variants.iter().enumerate() {
            let m = v.measure(&updraft, &dev, &artifact, &slots, &refs)?;
            let extra = match (m.service_rss_kib, m.sectors_read) {
                (Some(s), _) => format!("  (service {})", fmt_kib(s as f64)),
                (None, Some(n)) => format!(
                    "  slot B sectors read {n} (image {image_sectors}, {:.2} ×)",
                    n as f64 / image_sectors as f64
                ),
                (None, None) => String::new(),
            };
            println!(
                "  run {round}/{runs} {:<34} {:>7.2} s  peak RSS {}{extra}",
                v.label(),
                m.wall.as_secs_f64(),
                fmt_kib(m.rss_kib as f64)
            );
            results[i].push(m);
        }
    }

    println!("\n== components alone (once each)");
    let parts = components(&artifact, &image, &slots, size)?;

    println!(
        "\n== bench install: {size_mib} MiB ext4 image, {}, {frame_mib} MiB frames, {runs} run(s), cold cache, {}",
        match level {
            Some(l) => format!("zstd level {l}"),
            None => "updraft-publish's default level".into(),
        },
        load.map_or("machine load unknown".into(), |l| format!(
            "machine {l} before the bench"
        ))
    );
    let mut rows = vec![vec![
        "command".to_string(),
        "wall median (min–max)".into(),
        "user".into(),
        "sys".into(),
        "peak RSS".into(),
    ]];
    let mut medians = Vec::new();
    for (v, ms) in variants.iter().zip(&results) {
        let wall = summary(&ms.iter().map(|m| m.wall.as_secs_f64()).collect::<Vec<_>>());
        let user = summary(&ms.iter().map(|m| m.user.as_secs_f64()).collect::<Vec<_>>());
        let sys = summary(&ms.iter().map(|m| m.sys.as_secs_f64()).collect::<Vec<_>>());
        let rss = ms.iter().map(|m| m.rss_kib).max().unwrap_or(0);
        medians.push(wall.map(|s| s.median));
        rows.push(vec![
            v.label().into(),
            fmt_secs(wall),
            secs(user),
            secs(sys),
            match v {
                Variant::Updraft { .. } => fmt_kib(rss as f64),
                Variant::Reference(_) => match ms.iter().filter_map(|m| m.service_rss_kib).max() {
                    Some(svc) => format!(
                        "{} (client {} + service {})",
                        fmt_kib((rss + svc) as f64),
                        fmt_kib(rss as f64),
                        fmt_kib(svc as f64)
                    ),
                    None => fmt_kib(rss as f64),
                },
                Variant::Pipeline { .. } => {
                    let z = ms.iter().map(|m| m.rss_parts.0).max().unwrap_or(0);
                    let d = ms.iter().map(|m| m.rss_parts.1).max().unwrap_or(0);
                    format!(
                        "{} (zstd {} + dd {})",
                        fmt_kib(rss as f64),
                        fmt_kib(z as f64),
                        fmt_kib(d as f64)
                    )
                }
            },
        ]);
    }
    print_table(&rows);

    println!("\n  goals (from the specification), beside the stored baseline:");
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let peak = |i: usize| results[i].iter().map(|m| m.rss_kib).max().unwrap_or(0);
    let at = |want: Variant| variants.iter().position(|v| *v == want);
    let median_of = |want: Variant| at(want).and_then(|i| medians[i]);
    // Wall time over CPU time (user + sys), medians: below 1 when the
    // stages overlap on several cores.
    let overlap = |i: usize| {
        let wall = summary(
            &results[i]
                .iter()
                .map(|m| m.wall.as_secs_f64())
                .collect::<Vec<_>>(),
        );
        let cpu = summary(
            &results[i]
                .iter()
                .map(|m| (m.user + m.sys).as_secs_f64())
                .collect::<Vec<_>>(),
        );
        ratio(wall.map(|s| s.median), cpu.map(|s| s.median))
    };
    let (rb, no_rb, first) = (medians[0], medians[1], medians[2]);
    let direct = median_of(Variant::Pipeline { direct: true });
    let mut goals: Vec<Goal> = vec![
        Goal::ratio(
            "readback_vs_pipeline",
            "updraft (read-back) / zstd -dc | dd oflag=direct",
            ratio(rb, direct),
            "≤ 1.3 ×",
        ),
        Goal::ratio(
            "no_readback_vs_pipeline",
            "updraft (no read-back) / zstd -dc | dd oflag=direct",
            ratio(no_rb, direct),
            "≤ 1.15 ×",
        ),
    ];
    for &t in &present {
        goals.push(Goal::ratio(
            &format!("readback_vs_{}", t.name().to_lowercase()),
            &format!("updraft (read-back) / {}", t.name()),
            ratio(rb, median_of(Variant::Reference(t))),
            "< 1 ×",
        ));
    }
    goals.extend([
        Goal::ratio(
            "readback_wall_vs_cpu",
            "updraft (read-back) wall / CPU (user + sys)",
            overlap(0),
            "< 1 × (stages overlap)",
        ),
        Goal::ratio(
            "no_readback_wall_vs_cpu",
            "updraft (no read-back) wall / CPU (user + sys)",
            overlap(1),
            "< 1 ×",
        ),
        Goal::ratio(
            "first_vs_steady",
            "updraft first install / install (both read-back)",
            ratio(first, rb),
            "(no target)",
        ),
        Goal::ratio(
            "readback_vs_pipeline_fsync",
            "updraft (read-back) / zstd|dd conv=fsync",
            ratio(rb, median_of(Variant::Pipeline { direct: false })),
            "(no target)",
        ),
        Goal::mib(
            "peak_rss_readback_mib",
            "updraft peak RSS (read-back)",
            peak(0),
        ),
        Goal::mib(
            "peak_rss_no_readback_mib",
            "updraft peak RSS (no read-back)",
            peak(1),
        ),
        Goal::mib(
            "peak_rss_first_mib",
            "updraft peak RSS (first install)",
            peak(2),
        ),
    ]);
    let baseline = Baseline::parse(BASELINE);
    let compared = match (load, baseline.load()) {
        (Some(now), Some(then)) if now.comparable(&then) => true,
        (Some(now), Some(then)) => {
            println!(
                "  not compared with the baseline: it was taken at {then}, this run at {now} \
                 (load averages more than {} apart time different machines)",
                Load::COMPARABLE
            );
            false
        }
        _ => {
            println!("  not compared with the baseline: a machine load is unknown");
            false
        }
    };
    let mut goal_rows = vec![vec![
        "goal".to_string(),
        "measured".into(),
        "target".into(),
        format!(
            "baseline ({})",
            baseline.get("commit").unwrap_or("none stored")
        ),
    ]];
    for g in &goals {
        let then = baseline.number(&g.key);
        goal_rows.push(vec![
            g.label.clone(),
            g.show(g.value),
            g.target.clone(),
            match (compared, then) {
                (true, Some(_)) => g.show(then),
                (true, None) => "—".into(),
                (false, _) => "not compared".into(),
            },
        ]);
    }
    let sectors: Vec<u64> = results[0].iter().filter_map(|m| m.sectors_read).collect();
    if !sectors.is_empty() {
        goal_rows.push(vec![
            "slot B sectors read per read-back run".into(),
            sectors
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            format!("= {image_sectors} (the image)"),
            String::new(),
        ]);
    }
    print_table(&goal_rows);
    for note in refs.notes() {
        println!("  {note}");
    }
    println!(
        "  (timings are from one machine that may be busy with other work; \
         compare medians with min–max in mind)"
    );
    if save_baseline {
        save(&goals, load, runs, size_mib, level)?;
    }

    println!("\n  where updraft's time goes (median over runs, from its state lines on stderr):");
    let mut phase_rows = vec![vec![
        "phase".to_string(),
        "read-back".into(),
        "no read-back".into(),
        "first install".into(),
    ]];
    for (p, name) in PHASES.iter().enumerate() {
        let cell = |i: usize| {
            let v: Vec<f64> = results[i]
                .iter()
                .filter_map(|m| m.phases.get(p).copied().flatten())
                .collect();
            secs(summary(&v))
        };
        phase_rows.push(vec![name.to_string(), cell(0), cell(1), cell(2)]);
    }
    print_table(&phase_rows);

    println!("\n  the same work done by the reference tools alone:");
    print_table(&parts);

    println!(
        "\nbench install took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The baseline `bench install --save-baseline` stored last.
const BASELINE: &str = include_str!("install-baseline.txt");

/// Where `--save-baseline` writes.
fn baseline_path() -> PathBuf {
    crate::util::root().join("xtask/src/bench/install-baseline.txt")
}

/// One printed goal, and its key in the baseline.
struct Goal {
    key: String,
    label: String,
    value: Option<f64>,
    target: String,
    mib: bool,
}

impl Goal {
    fn ratio(key: &str, label: &str, value: Option<f64>, target: &str) -> Goal {
        Goal {
            key: key.into(),
            label: label.into(),
            value,
            target: target.into(),
            mib: false,
        }
    }

    fn mib(key: &str, label: &str, kib: u64) -> Goal {
        Goal {
            key: key.into(),
            label: label.into(),
            value: Some(kib as f64 / 1024.0),
            target: "≤ 16 MiB".into(),
            mib: true,
        }
    }

    fn show(&self, v: Option<f64>) -> String {
        match (v, self.mib) {
            (Some(v), true) => format!("{v:.1} MiB"),
            (Some(v), false) => format!("{v:.2} ×"),
            (None, _) => "n/a".into(),
        }
    }
}

/// Store this run's goals as the baseline the next runs print.
fn save(
    goals: &[Goal],
    load: Option<Load>,
    runs: usize,
    size_mib: u64,
    level: Option<u64>,
) -> Result {
    let Some(load) = load else {
        return Err("not saving a baseline: the machine load is unknown".into());
    };
    let mut text = format!(
        "# cargo xtask bench install --runs {runs} --size {size_mib}{} --save-baseline\n\
         # figures a later run prints beside its own when taken at a comparable load\n\
         commit {}\nload {:.2}\ncores {}\n",
        level.map_or(String::new(), |l| format!(" --level {l}")),
        common::head_commit(),
        load.average,
        load.cores
    );
    for g in goals {
        if let Some(v) = g.value {
            text.push_str(&format!("{} {v:.3}\n", g.key));
        }
    }
    let path = baseline_path();
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("  baseline stored in {}", path.display());
    Ok(())
}

/// The frame size of the release in `dir`, from `updraft-publish
/// inspect`: the image's size over its frame count, rounded up.
fn frame_size(publish: &Path, dir: &Path) -> Result<u64> {
    let text = util::output(
        Command::new(publish)
            .arg("inspect")
            .arg(dir.join("manifest.json")),
    )?;
    let number_before = |line: &str, word: &str| -> Option<u64> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| w.trim_end_matches([',', ')']) == word)?;
        words
            .get(at.checked_sub(1)?)?
            .trim_start_matches('(')
            .parse()
            .ok()
    };
    let line = |key: &str| text.lines().find(|l| l.starts_with(key)).unwrap_or("");
    let image = number_before(line("image:"), "bytes");
    let frames = number_before(line("artifact:"), "frames");
    match (image, frames) {
        (Some(i), Some(f)) if f > 0 => Ok(i.div_ceil(f)),
        _ => Err(format!(
            "updraft-publish inspect printed no image size or frame count:\n{text}"
        )),
    }
}

fn secs(s: Option<Summary>) -> String {
    s.map_or("n/a".into(), |s| format!("{:.2} s", s.median))
}

pub(super) fn file_len(p: &Path) -> Result<u64> {
    std::fs::metadata(p)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", p.display()))
}

// ---- the image ----------------------------------------------------------------

/// Make (or reuse) an ext4 image of `size` bytes filled from [`TREE`].
pub(super) fn make_image(work: &Path, image: &Path, size: u64) -> Result {
    let stamp = image.with_extension("done");
    if stamp.is_file() && file_len(image).ok() == Some(size) {
        println!(
            "  image: reusing {} ({})",
            image.display(),
            std::fs::read_to_string(&stamp).unwrap_or_default().trim()
        );
        return Ok(());
    }
    let tree = work.join("tree");
    remove_dir(&tree)?;
    let mut copied = Vec::new();
    let mut total = 0u64;
    for (src, share) in TREE {
        let src = Path::new(src);
        if !src.is_dir() {
            continue;
        }
        let budget = (size as f64 * share) as u64;
        let rel = src.strip_prefix("/").unwrap_or(src);
        let mut c = Copier {
            budget,
            used: 0,
            files: 0,
        };
        c.copy_dir(src, &tree.join(rel))?;
        total += c.used;
        copied.push(format!(
            "{} {} files {}",
            src.display(),
            c.files,
            fmt_kib(c.used as f64 / 1024.0)
        ));
    }
    let _ = std::fs::remove_file(image);
    let f = std::fs::File::create(image).map_err(|e| format!("{}: {e}", image.display()))?;
    f.set_len(size)
        .map_err(|e| format!("sizing {}: {e}", image.display()))?;
    drop(f);
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args(["-q", "-F", "-L", "rootfs", "-b", "4096", "-d"])
        .arg(&tree)
        .arg(image);
    println!("  image: {}", shell_line(&mkfs));
    util::output(&mut mkfs)?;
    remove_dir(&tree)?;
    let what = format!(
        "ext4, {} of files: {}",
        fmt_kib(total as f64 / 1024.0),
        copied.join(", ")
    );
    println!("  image: {} ({what})", image.display());
    std::fs::write(&stamp, format!("{what}\n")).map_err(|e| format!("{}: {e}", stamp.display()))
}

pub(super) fn remove_dir(p: &Path) -> Result {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", p.display())),
    }
}

/// Copies regular files and symlinks, in name order, while they fit. What a
/// file uses is counted in whole 4 KiB blocks and every directory as one,
/// as ext4 will store them, so a small image of many small files fits.
struct Copier {
    budget: u64,
    used: u64,
    files: u64,
}

const BLOCK: u64 = 4096;

/// Bytes of whole blocks a file of `len` bytes takes.
fn blocks(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

impl Copier {
    fn copy_dir(&mut self, src: &Path, dst: &Path) -> Result {
        std::fs::create_dir_all(dst).map_err(|e| format!("creating {}: {e}", dst.display()))?;
        let mut entries: Vec<_> = std::fs::read_dir(src)
            .map_err(|e| format!("listing {}: {e}", src.display()))?
            .filter_map(|e| e.ok())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if self.used >= self.budget {
                return Ok(());
            }
            let from = e.path();
            let to = dst.join(e.file_name());
            let Ok(md) = std::fs::symlink_metadata(&from) else {
                continue;
            };
            let ft = md.file_type();
            if ft.is_symlink() {
                if let Ok(target) = std::fs::read_link(&from) {
                    std::os::unix::fs::symlink(&target, &to)
                        .map_err(|e| format!("linking {}: {e}", to.display()))?;
                }
            } else if ft.is_dir() {
                self.used += BLOCK;
                self.copy_dir(&from, &to)?;
            } else if ft.is_file() && self.used + blocks(md.len()) <= self.budget {
                // Files that vanish or cannot be read are left out.
                if std::fs::copy(&from, &to).is_ok() {
                    self.used += blocks(md.len());
                    self.files += 1;
                }
            }
        }
        Ok(())
    }
}

/// Publish (or reuse) the release; returns the artifact's path.
fn publish_release(
    publish: &Path,
    work: &Path,
    image: &Path,
    release: &Path,
    level: Option<u64>,
) -> Result<PathBuf> {
    let key = work.join("release.key");
    if !key.is_file() || !work.join("release.pub").is_file() {
        util::output(
            Command::new(publish)
                .args(["keygen", "--out"])
                .arg(work.join("release")),
        )?;
    }
    let stamp = release.join("done");
    let image_stamp = image.with_extension("done");
    let fresh = match (std::fs::metadata(&stamp), std::fs::metadata(&image_stamp)) {
        (Ok(r), Ok(i)) => match (r.modified(), i.modified()) {
            (Ok(r), Ok(i)) => r >= i,
            _ => false,
        },
        _ => false,
    };
    if fresh {
        println!("  release: reusing {}", release.display());
    } else {
        remove_dir(release)?;
        let mut cmd = Command::new(publish);
        cmd.args(["release", "--key"])
            .arg(&key)
            .args([
                "--version",
                "1.0.0",
                "--compatible",
                "benchboard",
                "--image",
            ])
            .arg(image);
        if let Some(l) = level {
            cmd.arg("--level").arg(l.to_string());
        }
        cmd.arg("--out").arg(release);
        println!("  release: {}", shell_line(&cmd));
        let t = Instant::now();
        util::output(&mut cmd)?;
        println!(
            "  release: published in {:.1} s ({}; decode speed barely depends on the level)",
            t.elapsed().as_secs_f64(),
            level.map_or("its default level".into(), |l| format!("level {l}"))
        );
        std::fs::write(&stamp, "").map_err(|e| format!("{}: {e}", stamp.display()))?;
    }
    let dir = release.join("artifacts");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("listing {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    if found.len() != 1 {
        return Err(format!(
            "expected one artifact in {}, found {}",
            dir.display(),
            found.len()
        ));
    }
    Ok(found.remove(0))
}

// ---- slots and device ---------------------------------------------------------

/// A loop device attached here, detached on drop.
struct Loop {
    dev: PathBuf,
    direct_io: bool,
}

impl Loop {
    fn attach(file: &Path) -> Result<Loop> {
        let attach = |direct: bool| {
            let mut c = Command::new("losetup");
            c.args(["--find", "--show"]);
            if direct {
                c.arg("--direct-io=on");
            }
            c.arg(file);
            util::output(&mut c)
        };
        let (out, direct_io) = match attach(true) {
            Ok(o) => (o, true),
            Err(_) => (attach(false)?, false),
        };
        let dev = PathBuf::from(out.trim());
        if !dev.starts_with("/dev/") {
            return Err(format!("losetup printed {out:?} for {}", file.display()));
        }
        Ok(Loop { dev, direct_io })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Err(e) = util::output(Command::new("losetup").arg("-d").arg(&self.dev)) {
            eprintln!("detaching {}: {e}", self.dev.display());
        }
    }
}

struct Slots {
    a: Loop,
    b: Loop,
}

impl Slots {
    /// Two backing files of `size` bytes, fully allocated, on loop devices.
    fn attach(work: &Path, size: u64) -> Result<Slots> {
        let make = |name: &str| -> Result<PathBuf> {
            let p = work.join(name);
            if file_len(&p).ok() != Some(size) {
                let mut f =
                    std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                let block = vec![0u8; 4 << 20];
                let mut left = size;
                while left > 0 {
                    let n = left.min(block.len() as u64) as usize;
                    f.write_all(&block[..n])
                        .map_err(|e| format!("writing {}: {e}", p.display()))?;
                    left -= n as u64;
                }
                f.sync_all()
                    .map_err(|e| format!("fsync {}: {e}", p.display()))?;
            }
            Ok(p)
        };
        let a = Loop::attach(&make("slot-a.img")?)?;
        let b = Loop::attach(&make("slot-b.img")?)?;
        Ok(Slots { a, b })
    }
}

/// The device's files: configurations with and without read-back, state.
struct Device {
    dir: PathBuf,
    state: PathBuf,
    manifest: PathBuf,
}

impl Device {
    fn new(work: &Path, slots: &Slots, release: &Path) -> Result<Device> {
        let dir = work.join("device");
        remove_dir(&dir)?;
        std::fs::create_dir_all(dir.join("run")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let state = dir.join("state");
        let w = |name: &str, text: &str| -> Result {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(|e| format!("writing {}: {e}", p.display()))
        };
        w("cmdline", "console=ttyS0 root=/dev/root updraft.slot=A\n")?;
        w("boot_id", "bench-boot-1\n")?;
        // Slot A's root file system says which release it is, as an image
        // built with a release marker does.
        w("release", "UPDRAFT_RELEASE=0.9.0\n")?;
        for (readback, first) in [(true, false), (false, false), (true, true)] {
            // A first install has no marker to read (the path is absent):
            // the device looks at slot A itself.
            let marker = dir.join(if first {
                "no-release-marker"
            } else {
                "release"
            });
            let text = format!(
                "[device]\ncompatible = \"benchboard\"\nid_file = {id:?}\nrelease_file = {marker:?}\n\
                 [trust]\nkeys = [{key:?}]\n\
                 [slots]\na = {a:?}\nb = {b:?}\ncmdline = {cmdline:?}\n\
                 [bootloader]\nkind = \"file\"\npath = {boot:?}\n\
                 [health]\nchecks_dir = {checks:?}\n\
                 [system]\nstate_dir = {state:?}\nsocket = {sock:?}\nboot_id_file = {bootid:?}\n\
                 reboot = \"manual\"\nreadback = {readback}\n",
                id = state.join("device-id"),
                key = work.join("release.pub"),
                a = slots.a.dev,
                b = slots.b.dev,
                cmdline = dir.join("cmdline"),
                boot = state.join("boot.state"),
                checks = dir.join("health.d"),
                state = state,
                sock = dir.join("run/updraft.sock"),
                bootid = dir.join("boot_id"),
            );
            w(Device::config_name(readback, first), &text)?;
        }
        Ok(Device {
            dir,
            state,
            manifest: release.join("manifest.json"),
        })
    }

    fn config_name(readback: bool, first: bool) -> &'static str {
        match (readback, first) {
            (_, true) => "updraft-first.toml",
            (true, false) => "updraft.toml",
            (false, false) => "updraft-no-readback.toml",
        }
    }

    fn config(&self, readback: bool, first: bool) -> PathBuf {
        self.dir.join(Device::config_name(readback, first))
    }

    /// A device that has run before: state database present, booted slot
    /// marked good, nothing installed yet.
    fn reset(&self, updraft: &Path, readback: bool, first: bool) -> Result {
        remove_dir(&self.state)?;
        std::fs::create_dir_all(&self.state)
            .map_err(|e| format!("creating {}: {e}", self.state.display()))?;
        util::output(
            Command::new(updraft)
                .arg("--config")
                .arg(self.config(readback, first))
                .arg("mark-good"),
        )
        .map(|_| ())
    }
}

// ---- what is measured -----------------------------------------------------------

/// updraft's phases, delimited by its state lines.
const PHASES: [&str; 4] = [
    "start, manifest, plan (until `downloading`)",
    "read, decode, verify, write, fdatasync (until `installing`)",
    "read-back and hash (until `installed`)",
    "bootloader, database, exit",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// `first`: the device's first install, with no release marker: it
    /// first looks at whether the booted slot already holds the release.
    Updraft {
        readback: bool,
        first: bool,
    },
    Pipeline {
        direct: bool,
    },
    Reference(Tool),
}

#[derive(Default)]
struct Measured {
    wall: Duration,
    user: Duration,
    sys: Duration,
    rss_kib: u64,
    /// Pipeline: (zstd, dd) peak RSS.
    rss_parts: (u64, u64),
    /// updraft: seconds spent in each of [`PHASES`].
    phases: Vec<Option<f64>>,
    /// RAUC: peak RSS of the `rauc service` that did the install.
    service_rss_kib: Option<u64>,
    /// updraft: 512-byte sectors read from slot B during the run.
    sectors_read: Option<u64>,
}

impl Variant {
    fn label(&self) -> &'static str {
        match self {
            Variant::Updraft {
                readback: true,
                first: false,
            } => "updraft install (read-back)",
            Variant::Updraft {
                readback: false,
                first: false,
            } => "updraft install (no read-back)",
            Variant::Updraft { first: true, .. } => "updraft first install (read-back)",
            Variant::Pipeline { direct: false } => "zstd -dc | dd bs=4M conv=fsync",
            Variant::Pipeline { direct: true } => "zstd -dc | dd oflag=direct",
            Variant::Reference(t) => t.label(),
        }
    }

    fn dd_args(direct: bool) -> &'static str {
        if direct {
            "bs=4M iflag=fullblock oflag=direct conv=fsync status=none"
        } else {
            "bs=4M conv=fsync status=none"
        }
    }

    fn command_line(
        &self,
        updraft: &Path,
        dev: &Device,
        artifact: &Path,
        slots: &Slots,
        refs: &references::References,
    ) -> String {
        match *self {
            Variant::Updraft { readback, first } => shell_line(
                Command::new(updraft)
                    .arg("--config")
                    .arg(dev.config(readback, first))
                    .arg("install")
                    .arg(&dev.manifest),
            ),
            Variant::Pipeline { direct } => format!(
                "zstd -dc {} | dd of={} {}",
                common::shell_quote(&artifact.to_string_lossy()),
                slots.b.dev.display(),
                Variant::dd_args(direct)
            ),
            Variant::Reference(t) => refs.command_line(t),
        }
    }

    fn measure(
        &self,
        updraft: &Path,
        dev: &Device,
        artifact: &Path,
        slots: &Slots,
        refs: &references::References,
    ) -> Result<Measured> {
        match *self {
            Variant::Updraft { readback, first } => {
                measure_updraft(updraft, dev, readback, first, &slots.b.dev)
            }
            Variant::Pipeline { direct } => measure_pipeline(dev, artifact, &slots.b.dev, direct),
            Variant::Reference(t) => {
                let r = refs.measure(t)?;
                Ok(Measured {
                    wall: r.wall,
                    user: r.user,
                    sys: r.sys,
                    rss_kib: r.rss_kib,
                    service_rss_kib: r.service_rss_kib,
                    ..Measured::default()
                })
            }
        }
    }
}

/// Sectors read from a block device so far (`/sys/block/NAME/stat`,
/// field 3, in 512-byte units whatever the device's block size).
fn sectors_read(dev: &Path) -> Result<u64> {
    let name = dev
        .file_name()
        .ok_or_else(|| format!("{} has no device name", dev.display()))?;
    let stat = Path::new("/sys/block").join(name).join("stat");
    let text =
        std::fs::read_to_string(&stat).map_err(|e| format!("reading {}: {e}", stat.display()))?;
    text.split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{} has no sectors-read field: {text:?}", stat.display()))
}

fn measure_updraft(
    updraft: &Path,
    dev: &Device,
    readback: bool,
    first: bool,
    slot: &Path,
) -> Result<Measured> {
    dev.reset(updraft, readback, first)?;
    drop_caches()?;
    let read_before = sectors_read(slot)?;
    let report = dev.dir.join("time-updraft.txt");
    let mut cmd = Command::new(GNU_TIME);
    cmd.arg("-v")
        .arg("-o")
        .arg(&report)
        .arg(updraft)
        .arg("--config")
        .arg(dev.config(readback, first))
        .arg("install")
        .arg(&dev.manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", shell_line(&cmd)))?;
    let stderr = child.stderr.take().ok_or("no stderr pipe")?;
    // Lines are timestamped as they arrive; updraft's own timestamps are
    // not relied on.
    let lines = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(|l| l.ok())
            .map(|l| (t0.elapsed(), l))
            .collect::<Vec<_>>()
    });
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for updraft install: {e}"))?;
    let wall = t0.elapsed();
    let read_after = sectors_read(slot)?;
    let lines = lines.join().map_err(|_| "stderr reader panicked")?;
    let text = || {
        lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let r: TimeReport = read_time_report(&report)?;
    if !out.status.success() || r.exit != 0 {
        return Err(format!(
            "updraft install failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            text()
        ));
    }
    let at = |state: &str| {
        let needle = format!("{state}: release ");
        lines
            .iter()
            .find(|(_, l)| l.contains(&needle))
            .map(|(t, _)| t.as_secs_f64())
    };
    let marks = [
        Some(0.0),
        at("downloading"),
        at("installing"),
        at("installed"),
        Some(wall.as_secs_f64()),
    ];
    let phases = marks
        .windows(2)
        .map(|w| match (w[0], w[1]) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        })
        .collect();
    Ok(Measured {
        wall,
        user: r.user,
        sys: r.sys,
        rss_kib: r.max_rss_kib,
        rss_parts: (0, 0),
        phases,
        service_rss_kib: None,
        sectors_read: Some(read_after.saturating_sub(read_before)),
    })
}

fn measure_pipeline(dev: &Device, artifact: &Path, slot: &Path, direct: bool) -> Result<Measured> {
    drop_caches()?;
    let tz = dev.dir.join("time-zstd.txt");
    let td = dev.dir.join("time-dd.txt");
    let q = |p: &Path| common::shell_quote(&p.to_string_lossy());
    let script = format!(
        "{GNU_TIME} -v -o {} zstd -q -dc {} | {GNU_TIME} -v -o {} dd of={} {}",
        q(&tz),
        q(artifact),
        q(&td),
        q(slot),
        Variant::dd_args(direct)
    );
    let t0 = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("starting sh -c {script:?}: {e}"))?;
    let wall = t0.elapsed();
    let z = read_time_report(&tz)?;
    let d = read_time_report(&td)?;
    if !out.status.success() || z.exit != 0 || d.exit != 0 {
        return Err(format!(
            "{script} failed ({}, zstd exit {}, dd exit {}):\n{}",
            out.status,
            z.exit,
            d.exit,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Measured {
        wall,
        user: z.user + d.user,
        sys: z.sys + d.sys,
        rss_kib: z.max_rss_kib + d.max_rss_kib,
        rss_parts: (z.max_rss_kib, d.max_rss_kib),
        ..Measured::default()
    })
}

/// The parts of an install done alone by standard tools, each timed once.
fn components(artifact: &Path, image: &Path, slots: &Slots, size: u64) -> Result<Vec<Vec<String>>> {
    let mut rows = vec![vec![
        "work (commands above)".to_string(),
        "wall".into(),
        "user+sys".into(),
    ]];
    let q = |p: &Path| common::shell_quote(&p.to_string_lossy());
    let mib = size / (1024 * 1024);
    let jobs: Vec<(&str, String, bool)> = vec![
        (
            "decode (cold cache)",
            format!("zstd -q -dc {} > /dev/null", q(artifact)),
            true,
        ),
        (
            "sha256 of the image (warm cache)",
            format!("sha256sum {} > /dev/null", q(image)),
            false,
        ),
        (
            "sha256 of the artifact (warm cache)",
            format!("sha256sum {} > /dev/null", q(artifact)),
            false,
        ),
        (
            "read the slot back (direct I/O)",
            format!(
                "dd if={} of=/dev/null bs=1M count={mib} iflag=direct status=none",
                slots.b.dev.display()
            ),
            true,
        ),
        (
            "read + sha256 the slot (cold)",
            format!(
                "dd if={} bs=1M count={mib} status=none | sha256sum > /dev/null",
                slots.b.dev.display()
            ),
            true,
        ),
    ];
    for (what, script, cold) in jobs {
        if cold {
            drop_caches()?;
        } else {
            // Warm the cache so only the CPU work is timed.
            util::output(Command::new("sh").arg("-c").arg(format!(
                "cat {} {} > /dev/null",
                q(image),
                q(artifact)
            )))?;
        }
        let report = std::env::temp_dir().join(format!("xtask-bench-{}.txt", std::process::id()));
        let timed = format!(
            "{GNU_TIME} -o {} -v sh -c {}",
            q(&report),
            common::shell_quote(&script)
        );
        let t0 = Instant::now();
        util::output(Command::new("sh").arg("-c").arg(&timed))?;
        let wall = t0.elapsed();
        let r = read_time_report(&report)?;
        let _ = std::fs::remove_file(&report);
        println!("  {what:<36} {:>6.2} s  {script}", wall.as_secs_f64());
        rows.push(vec![
            what.into(),
            format!("{:.2} s", wall.as_secs_f64()),
            format!("{:.2} s", (r.user + r.sys).as_secs_f64()),
        ]);
    }
    Ok(rows)
}
