//! `cargo xtask bench delta [--size MIB] [--bsdiff-timeout SECS]
//! [--synthetic-gib N]`: our delta beside xdelta3, zstd --patch-from and
//! classic bsdiff, on a realistic image pair, in one run.
//!
//! With `--synthetic-gib N` the pair is instead the N GiB synthetic pair of
//! [`super::synthetic`] (files from `/usr` with a rootfs upgrade's change
//! pattern), for images larger than the package set fills: zstd runs with
//! `--long=31` when both images fit its 2 GiB window and is reported as
//! unable to take the pair otherwise, classic bsdiff is skipped (its
//! suffix sort takes hours and 9 bytes per byte at this size), and each
//! decoder runs once.
//!
//! The pair is two ext4 images made with `mkfs.ext4 -d` from directory trees
//! that differ like a package upgrade: a set of Debian packages at the
//! version an image was built with and at the newest version the archive
//! offers (security and point-release updates), plus a package removed and
//! one added. Package versions are pinned in `versions.txt` on first run, and
//! the `.deb` files, trees and images are cached under
//! `target/bench-cache/delta/`, so reruns neither download nor rebuild.
//! Filesystem UUID, hash seed and every timestamp are fixed.
//!
//! Each tool runs as its own process under GNU time (`/usr/bin/time -v`),
//! which gives wall time and peak RSS; every decoded image is compared with
//! the new image byte for byte.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Result};

/// Packages whose old and new versions make the update.
const UPGRADED: &[&str] = &[
    "libc6",
    "libc-bin",
    "libssl3",
    "openssl",
    "libcurl4",
    "curl",
    "systemd",
    "libsystemd0",
    "libpython3.11-stdlib",
    "libpython3.11-minimal",
    "python3.11-minimal",
    "libperl5.36",
    "perl-base",
    "libxml2",
    "git",
    "openssh-client",
    "openssh-server",
    "libexpat1",
    "tzdata",
    "bind9-libs",
    "libnss3",
    "libglib2.0-0",
    "apt",
];

/// Packages at the same version in both images.
const UNCHANGED: &[&str] = &[
    "busybox",
    "bash",
    "util-linux",
    "libstdc++6",
    "e2fsprogs",
    "iproute2",
    "libsqlite3-0",
    "vim-tiny",
    "dpkg",
    "libdb5.3",
    "libgcc-s1",
    "zlib1g",
];

/// In the old image only, and in the new image only.
const REMOVED: &str = "nano";
const ADDED: &str = "jq";
const ADDED_LIB: &str = "libjq1";

const EPOCH: &str = "1700000000";
const UUID: &str = "6f1c1f0e-5d2b-4c53-9a57-0d2e1c3b4a59";
const HASH_SEED: &str = "2b8d3e51-7a0c-4f3e-8c1d-9e6f5a4b3c21";

pub fn run(args: &[String]) -> Result {
    let mut size_mib: u64 = 256;
    let mut bsdiff_timeout: u64 = 600;
    let mut synthetic_gib: Option<u64> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || -> Result<u64> {
            let v = it.next().ok_or(format!("{a} needs a value"))?;
            v.parse().map_err(|_| format!("{a} {v:?} is not a number"))
        };
        match a.as_str() {
            "--size" => size_mib = value()?,
            "--bsdiff-timeout" => bsdiff_timeout = value()?,
            "--synthetic-gib" => synthetic_gib = Some(value()?),
            other => {
                return Err(format!(
                    "unknown option {other:?} (usage: cargo xtask bench delta [--size MIB] [--bsdiff-timeout SECS] [--synthetic-gib N])"
                ));
            }
        }
    }
    for tool in [
        "mkfs.ext4",
        "dpkg",
        "apt-get",
        "xdelta3",
        "zstd",
        "bsdiff",
        "bspatch",
        "timeout",
    ] {
        if !util::have(tool) {
            return Err(format!(
                "{tool} is not installed (apt-get install e2fsprogs xdelta3 zstd bsdiff)"
            ));
        }
    }
    if !Path::new("/usr/bin/time").is_file() {
        return Err("GNU time (/usr/bin/time) is not installed (apt-get install time)".into());
    }

    if let Some(gib) = synthetic_gib {
        return run_synthetic(gib);
    }
    let cache = util::root().join("target/bench-cache/delta");
    std::fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let (old_img, new_img) = images(&cache, size_mib)?;
    build_tools()?;
    let release = util::root().join("target/release/examples");
    let work = cache.join("out");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let old_s = old_img.to_string_lossy().into_owned();
    let new_s = new_img.to_string_lossy().into_owned();
    let new_len = file_len(&new_img)?;
    let p = |name: &str| work.join(name).to_string_lossy().into_owned();

    let mut rows = Vec::new();

    eprintln!("bench delta: updraft (bsdiff + zstd -19, window 2^23)");
    let make = release.join("delta_make").to_string_lossy().into_owned();
    let apply = release.join("delta_apply").to_string_lossy().into_owned();
    let len_s = new_len.to_string();
    let enc = measure(&[&make, &old_s, &new_s, &p("updraft.delta")], None)?;
    let dec = best_of(&[
        &apply,
        &old_s,
        &p("updraft.delta"),
        &p("updraft.img"),
        &len_s,
    ])?;
    rows.push(row(
        "updraft delta",
        &p("updraft.delta"),
        enc,
        Some(dec),
        &p("updraft.img"),
        &new_img,
    )?);
    let no_sync = best_of(&[
        &apply,
        "--no-sync",
        &old_s,
        &p("updraft.delta"),
        &p("updraft.img"),
        &len_s,
    ])?;
    let _ = std::fs::remove_file(p("updraft.img"));

    rows.push(xdelta3_row(&old_s, &new_s, &work, &new_img)?);

    eprintln!("bench delta: zstd -19 --long=27 --patch-from");
    let patch_from = format!("--patch-from={old_s}");
    let enc = measure(
        &[
            "zstd",
            "-q",
            "-f",
            "-19",
            "--long=27",
            &patch_from,
            &new_s,
            "-o",
            &p("zstd.zst"),
        ],
        None,
    )?;
    let dec = best_of(&[
        "zstd",
        "-q",
        "-f",
        "-d",
        "--long=31",
        "--memory=2048MB",
        &patch_from,
        &p("zstd.zst"),
        "-o",
        &p("zstd.img"),
    ])?;
    rows.push(row(
        "zstd -19 --long=27 --patch-from",
        &p("zstd.zst"),
        enc,
        Some(dec),
        &p("zstd.img"),
        &new_img,
    )?);

    eprintln!("bench delta: classic bsdiff (limit {bsdiff_timeout} s)");
    let enc = measure(
        &["bsdiff", &old_s, &new_s, &p("classic.bsdiff")],
        Some(bsdiff_timeout),
    )?;
    if enc.finished {
        let dec = measure(
            &["bspatch", &old_s, &p("classic.img"), &p("classic.bsdiff")],
            None,
        )?;
        rows.push(row(
            "bsdiff 4.3 / bspatch",
            &p("classic.bsdiff"),
            enc,
            Some(dec),
            &p("classic.img"),
            &new_img,
        )?);
    } else {
        rows.push(Row {
            name: "bsdiff 4.3 / bspatch".into(),
            size: None,
            enc,
            dec: None,
            correct: None,
            note: None,
        });
    }

    let old_len = file_len(&old_img)?;
    println!("{}", table(&rows, old_len, new_len));
    println!(
        "updraft apply writes through the slot writer (write-back in steps, fdatasync, page cache dropped)\n\
         and hashes the image; into the page cache only, as the other tools write: {:.1} s ({:.1} s CPU), {} peak RSS.\n\
         Apply times are the best of {APPLY_RUNS} runs; make times are one run.\n",
        no_sync.seconds,
        no_sync.cpu_seconds,
        mib(no_sync.max_rss_kib)
    );
    println!("{}", goals(&rows, old_len));
    Ok(())
}

/// Build the generator and the device patcher (release).
fn build_tools() -> Result {
    eprintln!("bench delta: building the generator and the device patcher (release)");
    util::run(util::cargo().args([
        "build",
        "--release",
        "-p",
        "updraft-publish",
        "--example",
        "delta_make",
    ]))?;
    util::run(util::cargo().args([
        "build",
        "--release",
        "-p",
        "updraft",
        "--example",
        "delta_apply",
    ]))
}

/// zstd's largest window: --patch-from needs the old image within it.
const ZSTD_MAX_WINDOW: u64 = 1 << 31;

/// The bench on the synthetic pair of [`super::synthetic`].
fn run_synthetic(gib: u64) -> Result {
    let cache = util::root().join("target/bench-cache/delta-synthetic");
    let (old_img, new_img) = super::synthetic::images(&cache, gib)?;
    build_tools()?;
    let release = util::root().join("target/release/examples");
    let work = cache.join("out");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let old_s = old_img.to_string_lossy().into_owned();
    let new_s = new_img.to_string_lossy().into_owned();
    let (old_len, new_len) = (file_len(&old_img)?, file_len(&new_img)?);
    let p = |name: &str| work.join(name).to_string_lossy().into_owned();
    let len_s = new_len.to_string();
    let mut rows = Vec::new();

    eprintln!("bench delta: updraft (memory budget 2 GiB)");
    let make = release.join("delta_make").to_string_lossy().into_owned();
    let apply = release.join("delta_apply").to_string_lossy().into_owned();
    let enc = measure(&[&make, &old_s, &new_s, &p("updraft.delta")], None)?;
    let dec = measure(
        &[
            &apply,
            &old_s,
            &p("updraft.delta"),
            &p("updraft.img"),
            &len_s,
        ],
        None,
    )?;
    rows.push(row(
        "updraft delta",
        &p("updraft.delta"),
        enc,
        Some(dec),
        &p("updraft.img"),
        &new_img,
    )?);

    rows.push(xdelta3_row(&old_s, &new_s, &work, &new_img)?);

    let zstd_name = "zstd -19 --long=31 --patch-from";
    if old_len > ZSTD_MAX_WINDOW || new_len > ZSTD_MAX_WINDOW {
        rows.push(Row::skipped(
            zstd_name,
            "cannot take this pair: its window is at most 2 GiB",
        ));
    } else {
        eprintln!("bench delta: {zstd_name}");
        let patch_from = format!("--patch-from={old_s}");
        let enc = measure(
            &[
                "zstd",
                "-q",
                "-f",
                "-19",
                "--long=31",
                &patch_from,
                &new_s,
                "-o",
                &p("zstd.zst"),
            ],
            None,
        )?;
        let dec = measure(
            &[
                "zstd",
                "-q",
                "-f",
                "-d",
                "--long=31",
                "--memory=2048MB",
                &patch_from,
                &p("zstd.zst"),
                "-o",
                &p("zstd.img"),
            ],
            None,
        )?;
        rows.push(row(
            zstd_name,
            &p("zstd.zst"),
            enc,
            Some(dec),
            &p("zstd.img"),
            &new_img,
        )?);
    }
    rows.push(Row::skipped(
        "bsdiff 4.3 / bspatch",
        "not run: its suffix sort needs about 9 bytes per old byte and hours at this size",
    ));
    let text = table(&rows, old_len, new_len).replace(
        "MiB ext4 images",
        &format!("MiB synthetic images ({gib} GiB)"),
    );
    println!("{text}");
    println!(
        "Apply times are one run each; updraft apply writes through the slot writer (fdatasync, page cache dropped).\n"
    );
    let ours = &rows[0];
    println!(
        "Goals:\n  make peak RSS: {} (goal ≤ 2048 MiB) {}\n  apply peak RSS: {} (goal ≤ 16 MiB) {}",
        mib(ours.enc.max_rss_kib),
        if ours.enc.max_rss_kib <= 2 << 20 {
            "met"
        } else {
            "NOT met"
        },
        ours.dec.map_or("—".into(), |d| mib(d.max_rss_kib)),
        if ours.dec.is_some_and(|d| d.max_rss_kib <= 16 << 10) {
            "met"
        } else {
            "NOT met"
        },
    );
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// Decoders are quick and the machine may be busy: each runs this often.
const APPLY_RUNS: usize = 3;

/// The fastest of [`APPLY_RUNS`] runs, with the largest peak RSS seen.
fn best_of(argv: &[&str]) -> Result<Measured> {
    let mut best = measure(argv, None)?;
    for _ in 1..APPLY_RUNS {
        let m = measure(argv, None)?;
        if m.seconds < best.seconds {
            best.seconds = m.seconds;
            best.cpu_seconds = m.cpu_seconds;
        }
        best.max_rss_kib = best.max_rss_kib.max(m.max_rss_kib);
    }
    Ok(best)
}

/// Wall time and peak RSS of one process.
#[derive(Clone, Copy)]
struct Measured {
    seconds: f64,
    /// User plus system time: steadier than wall time on a busy machine.
    cpu_seconds: f64,
    max_rss_kib: u64,
    finished: bool,
}

fn measure(argv: &[&str], limit: Option<u64>) -> Result<Measured> {
    let report = std::env::temp_dir().join(format!("updraft-bench-time-{}", std::process::id()));
    let mut child = Command::new("/usr/bin/time")
        .arg("-v")
        .arg("-o")
        .arg(&report)
        .args(argv)
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("running {argv:?}: {e}"))?;
    let started = std::time::Instant::now();
    let mut killed = false;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("waiting for {argv:?}: {e}"))?
        {
            break status;
        }
        if let Some(secs) = limit {
            if !killed && started.elapsed().as_secs() >= secs {
                // Kill the tool, not GNU time, so time still reports the
                // tool's peak RSS.
                let children = format!("/proc/{0}/task/{0}/children", child.id());
                let pids = std::fs::read_to_string(&children).unwrap_or_default();
                for pid in pids.split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
                killed = true;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text =
        std::fs::read_to_string(&report).map_err(|e| format!("reading GNU time's report: {e}"))?;
    let _ = std::fs::remove_file(&report);
    let mut m = Measured {
        seconds: 0.0,
        cpu_seconds: 0.0,
        max_rss_kib: 0,
        finished: status.success() && !killed,
    };
    for line in text.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("Maximum resident set size (kbytes): ") {
            m.max_rss_kib = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("Elapsed (wall clock) time (h:mm:ss or m:ss): ") {
            m.seconds = v.trim().split(':').fold(0.0, |acc, part| {
                acc * 60.0 + part.parse::<f64>().unwrap_or(0.0)
            });
        } else if let Some(v) = line
            .strip_prefix("User time (seconds): ")
            .or_else(|| line.strip_prefix("System time (seconds): "))
        {
            m.cpu_seconds += v.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    if !m.finished && !killed {
        return Err(format!("{argv:?} failed: {status}\n{text}"));
    }
    Ok(m)
}

struct Row {
    name: String,
    size: Option<u64>,
    enc: Measured,
    dec: Option<Measured>,
    correct: Option<bool>,
    /// Why the tool was not run, if it was not.
    note: Option<String>,
}

impl Row {
    fn skipped(name: &str, why: &str) -> Row {
        Row {
            name: name.into(),
            size: None,
            enc: Measured {
                seconds: 0.0,
                cpu_seconds: 0.0,
                max_rss_kib: 0,
                finished: false,
            },
            dec: None,
            correct: None,
            note: Some(why.into()),
        }
    }
}

/// `xdelta3 -e -9` and its decoding of the pair, in `work`.
fn xdelta3_row(old_s: &str, new_s: &str, work: &Path, new_img: &Path) -> Result<Row> {
    eprintln!("bench delta: xdelta3 -9");
    let p = |name: &str| work.join(name).to_string_lossy().into_owned();
    let (delta, decoded) = (p("xdelta3.vcdiff"), p("xdelta3.img"));
    let enc = measure(
        &["xdelta3", "-e", "-9", "-f", "-s", old_s, new_s, &delta],
        None,
    )?;
    let dec = measure(
        &["xdelta3", "-d", "-f", "-s", old_s, &delta, &decoded],
        None,
    )?;
    row("xdelta3 -e -9", &delta, enc, Some(dec), &decoded, new_img)
}

fn row(
    name: &str,
    delta: &str,
    enc: Measured,
    dec: Option<Measured>,
    decoded: &str,
    new_img: &Path,
) -> Result<Row> {
    let correct = same_file(Path::new(decoded), new_img)?;
    let _ = std::fs::remove_file(decoded);
    Ok(Row {
        name: name.into(),
        size: Some(file_len(Path::new(delta))?),
        enc,
        dec,
        correct: Some(correct),
        note: None,
    })
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

fn table(rows: &[Row], old_len: u64, new_len: u64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nDelta between two {} MiB ext4 images (old {} bytes, new {} bytes):\n",
        new_len >> 20,
        old_len,
        new_len
    );
    let _ = writeln!(
        s,
        "| tool | delta size | make: wall (CPU) | make: peak RSS | apply: wall (CPU) | apply: peak RSS | output |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let size = r
            .size
            .map_or("—".into(), |b| format!("{:.2} MB", b as f64 / 1e6));
        let (et, er) = if let Some(note) = &r.note {
            (note.clone(), "—".into())
        } else if r.enc.finished {
            (
                format!("{:.1} s ({:.1} s)", r.enc.seconds, r.enc.cpu_seconds),
                mib(r.enc.max_rss_kib),
            )
        } else {
            (
                format!("did not finish in {:.0} s", r.enc.seconds),
                format!("≥ {}", mib(r.enc.max_rss_kib)),
            )
        };
        let (dt, dr) = r.dec.map_or(("—".into(), "—".into()), |d| {
            (
                format!("{:.1} s ({:.1} s)", d.seconds, d.cpu_seconds),
                mib(d.max_rss_kib),
            )
        });
        let ok = match r.correct {
            Some(true) => "identical",
            Some(false) => "WRONG",
            None => "—",
        };
        let _ = writeln!(
            s,
            "| {} | {size} | {et} | {er} | {dt} | {dr} | {ok} |",
            r.name
        );
    }
    s
}

fn goals(rows: &[Row], old_len: u64) -> String {
    let (Some(ours), Some(xd)) = (rows.first(), rows.get(1)) else {
        return String::new();
    };
    let mut s = String::from("Goals:\n");
    let mut line = |what: &str, got: f64, limit: f64, unit: &str| {
        let verdict = if got <= limit { "met" } else { "NOT met" };
        let _ = writeln!(
            s,
            "  {what}: {got:.2}{unit} (goal ≤ {limit:.2}{unit}) {verdict}"
        );
    };
    if let (Some(a), Some(b)) = (ours.size, xd.size) {
        line("delta size / xdelta3's", a as f64 / b as f64, 0.8, "");
    }
    if let (Some(d), Some(xdd)) = (ours.dec, xd.dec) {
        line(
            "apply peak RSS",
            d.max_rss_kib as f64 / 1024.0,
            16.0,
            " MiB",
        );
        line(
            "apply time / xdelta3's",
            d.seconds / xdd.seconds.max(0.001),
            1.0,
            "",
        );
        line(
            "  (CPU time / xdelta3's)",
            d.cpu_seconds / xdd.cpu_seconds.max(0.001),
            1.0,
            "",
        );
    }
    line(
        "make time / xdelta3's",
        ours.enc.seconds / xd.enc.seconds.max(0.001),
        4.0,
        "",
    );
    line(
        "  (CPU time / xdelta3's)",
        ours.enc.cpu_seconds / xd.enc.cpu_seconds.max(0.001),
        4.0,
        "",
    );
    line(
        "make peak RSS / old image",
        ours.enc.max_rss_kib as f64 * 1024.0 / old_len as f64,
        8.0,
        "",
    );
    s
}

fn file_len(p: &Path) -> Result<u64> {
    std::fs::metadata(p)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", p.display()))
}

fn same_file(a: &Path, b: &Path) -> Result<bool> {
    let st = Command::new("cmp")
        .arg("-s")
        .arg(a)
        .arg(b)
        .status()
        .map_err(|e| format!("running cmp: {e}"))?;
    Ok(st.success())
}

/// Build (or reuse) the old and new images.
fn images(cache: &Path, size_mib: u64) -> Result<(PathBuf, PathBuf)> {
    let old_img = cache.join(format!("old-{size_mib}M.ext4"));
    let new_img = cache.join(format!("new-{size_mib}M.ext4"));
    if old_img.is_file() && new_img.is_file() {
        return Ok((old_img, new_img));
    }
    let versions = pinned_versions(cache)?;
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs).map_err(|e| format!("creating {}: {e}", debs.display()))?;
    let mut old_set = Vec::new();
    let mut new_set = Vec::new();
    for (pkg, old_v, new_v) in &versions {
        if let Some(v) = old_v {
            old_set.push(fetch(&debs, pkg, v)?);
        }
        if let Some(v) = new_v {
            new_set.push(fetch(&debs, pkg, v)?);
        }
    }
    for (set, img, name) in [(&old_set, &old_img, "old"), (&new_set, &new_img, "new")] {
        let tree = cache.join(format!("tree-{name}"));
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree).map_err(|e| format!("creating {}: {e}", tree.display()))?;
        for deb in set.iter() {
            util::run(Command::new("dpkg").arg("-x").arg(deb).arg(&tree))?;
        }
        // Every timestamp fixed, so the image depends on the packages only.
        util::run(Command::new("find").arg(&tree).args([
            "-exec",
            "touch",
            "-h",
            "-d",
            &format!("@{EPOCH}"),
            "{}",
            "+",
        ]))?;
        let tmp = img.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        util::run(
            Command::new("mkfs.ext4")
                .env("E2FSPROGS_FAKE_TIME", EPOCH)
                .env("SOURCE_DATE_EPOCH", EPOCH)
                .args(["-q", "-F", "-b", "4096", "-L", "rootfs", "-U", UUID])
                .arg("-E")
                .arg(format!(
                    "hash_seed={HASH_SEED},root_owner=0:0,lazy_itable_init=0,nodiscard"
                ))
                .arg("-d")
                .arg(&tree)
                .arg(&tmp)
                .arg(format!("{size_mib}M")),
        )?;
        std::fs::rename(&tmp, img).map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
        let _ = std::fs::remove_dir_all(&tree);
    }
    Ok((old_img, new_img))
}

/// A package and its version in the old and in the new image (`None`: absent).
type Pin = (String, Option<String>, Option<String>);

/// (package, version in the old image, version in the new image), pinned in
/// `versions.txt` the first time so later runs use the same packages.
fn pinned_versions(cache: &Path) -> Result<Vec<Pin>> {
    let file = cache.join("versions.txt");
    if let Ok(text) = std::fs::read_to_string(&file) {
        let opt = |s: &str| (s != "-").then(|| s.to_string());
        return Ok(text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3).then(|| (f[0].to_string(), opt(f[1]), opt(f[2])))
            })
            .collect());
    }
    let mut out = Vec::new();
    for pkg in UPGRADED {
        let mut vs = madison(pkg)?;
        if vs.len() < 2 {
            return Err(format!(
                "{pkg}: the archive offers one version only ({vs:?}); run apt-get update"
            ));
        }
        let new = vs.remove(0);
        out.push((pkg.to_string(), Some(vs.remove(0)), Some(new)));
    }
    for pkg in UNCHANGED {
        let v = madison(pkg)?.remove(0);
        out.push((pkg.to_string(), Some(v.clone()), Some(v)));
    }
    out.push((REMOVED.to_string(), Some(madison(REMOVED)?.remove(0)), None));
    for pkg in [ADDED, ADDED_LIB] {
        out.push((pkg.to_string(), None, Some(madison(pkg)?.remove(0))));
    }
    let text: String = out
        .iter()
        .map(|(p, o, n)| {
            format!(
                "{p} {} {}\n",
                o.as_deref().unwrap_or("-"),
                n.as_deref().unwrap_or("-")
            )
        })
        .collect();
    std::fs::write(&file, text).map_err(|e| format!("writing {}: {e}", file.display()))?;
    Ok(out)
}

/// Versions the archive offers for `pkg`, newest first, without duplicates.
fn madison(pkg: &str) -> Result<Vec<String>> {
    let text = util::output(Command::new("apt-cache").args(["madison", pkg]))?;
    let mut vs: Vec<String> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('|').map(str::trim).collect();
        if f.len() >= 3 && f[0] == pkg && !vs.iter().any(|v| v == f[1]) {
            vs.push(f[1].to_string());
        }
    }
    vs.sort_by(|a, b| {
        let newer = Command::new("dpkg")
            .args(["--compare-versions", a, "gt", b])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if newer {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    });
    if vs.is_empty() {
        return Err(format!(
            "apt-cache madison {pkg}: no versions (run apt-get update)"
        ));
    }
    Ok(vs)
}

/// The cached `.deb` for `pkg` at `version`, downloaded once.
fn fetch(debs: &Path, pkg: &str, version: &str) -> Result<PathBuf> {
    // apt-get download names files pkg_version_arch.deb, with ':' escaped.
    let escaped = version.replace(':', "%3a");
    let prefix = format!("{pkg}_{escaped}_");
    let find = || -> Option<PathBuf> {
        std::fs::read_dir(debs)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
            })
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    eprintln!("bench delta: downloading {pkg}={version}");
    util::run(Command::new("apt-get").current_dir(debs).args([
        "download",
        "-q",
        &format!("{pkg}={version}"),
    ]))?;
    find().ok_or(format!(
        "apt-get download {pkg}={version} left no {prefix}*.deb"
    ))
}
