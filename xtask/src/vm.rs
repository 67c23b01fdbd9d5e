//! `cargo xtask vm-test [x86_64]`: the whole update cycle on a real
//! full-system QEMU machine. SeaBIOS and GRUB boot the shipped GRUB
//! fragment (`grub.cfg.in`), which reads the `grubenv` updraft's own GRUB
//! backend writes; a real Debian cloud kernel boots a busybox userspace
//! that starts `updraft daemon` as the systemd unit would, with the real
//! `/proc/cmdline`, boot id and `reboot -f`. Releases come from
//! `updraft-publish`, served by nginx over TLS on 127.0.0.1.
//!
//! * [`disk`]: the MBR disk image (boot, rootfs A, rootfs B, data) and
//!   GRUB, and reading results back from it;
//! * [`guest`]: the initramfs, the slot images and their scripts;
//! * [`console`]: the QEMU process and its serial console, split into boots;
//! * [`scenario`]: the server, the releases and the assertions.
//!
//! This module owns the prerequisites (installed with apt-get as root on
//! Debian; otherwise the command is printed and the run skips, or fails
//! with `CI=true`), the build of the binaries and the summary. It must
//! never start QEMU or write a disk itself.

mod console;
mod disk;
mod guest;
mod scenario;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::toolchain;
use crate::util::{self, Result};

const USAGE: &str = "usage: cargo xtask vm-test [x86_64] [--cuts N] [--seed S]
  boots a QEMU x86_64 machine (SeaBIOS, GRUB, Debian's cloud kernel, busybox, updraft)
  and runs: 1 full-image update, 3 failing health check, 4 release that cannot boot
  (a kernel panic, then a hang caught by the watchdog), 2 delta update;
  --cuts N: then 5, N power cuts (QEMU killed) at points chosen from --seed S (default 1)";

/// Debian packages the VM needs, each with a file that shows it is there.
const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("grub-pc-bin", "/usr/lib/grub/i386-pc/boot.img"),
    ("grub-common", "/usr/bin/grub-editenv"),
    ("linux-image-cloud-amd64", ""),
    ("busybox-static", "/bin/busybox"),
    ("fdisk", "/usr/sbin/sfdisk"),
    ("e2fsprogs", "/usr/sbin/debugfs"),
    ("cpio", "/usr/bin/cpio"),
    ("binutils", "/usr/bin/strip"),
    ("nginx", "/usr/sbin/nginx"),
];

pub fn run(args: &[String]) -> Result {
    let mut cuts: u32 = 0;
    let mut seed: u64 = 1;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "x86_64" => {}
            "--cuts" | "--seed" => {
                let v = it
                    .next()
                    .ok_or_else(|| format!("{a} needs a number\n{USAGE}"))?;
                let bad = || format!("{a} {v:?} is not a number\n{USAGE}");
                if a == "--cuts" {
                    cuts = v.parse().map_err(|_| bad())?;
                } else {
                    seed = v.parse().map_err(|_| bad())?;
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "aarch64" | "armv7" => {
                return Err(format!(
                    "vm-test {a}: only x86_64 machines are built so far\n{USAGE}"
                ));
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let total = Instant::now();
    let Some((bin_dir, work)) = prepare("vm-test")? else {
        return Ok(());
    };
    let (outcomes, cut) = util::guarded("vm-test", || scenarios(&work, &bin_dir, cuts, seed))?;
    summary(&outcomes, total.elapsed(), &work);
    if cuts > 0 {
        cut_summary(&cut, seed);
    }
    Ok(())
}

/// `cargo xtask demo --vm`: scenarios 1 (a full update) and 3 (a failing
/// health check, rolled back by a real reboot) with the console shown.
pub fn demo() -> Result {
    let total = Instant::now();
    let Some((bin_dir, work)) = prepare("vm-demo")? else {
        return Ok(());
    };
    console::show_console();
    let outcomes = util::guarded("demo --vm", || {
        let mut lab = scenario::Lab::new(&work, &bin_dir)?;
        lab.full_update()?;
        lab.failed_health_check()?;
        Ok(std::mem::take(&mut lab.outcomes))
    })?;
    summary(&outcomes, total.elapsed(), &work);
    Ok(())
}

/// The prerequisites (`None`: the run skips), the binaries, and an empty
/// `target/<dir>/x86_64`; the binaries' directory and that one.
fn prepare(dir: &str) -> Result<Option<(PathBuf, PathBuf)>> {
    if !prerequisites()? {
        return Ok(None);
    }
    let bin_dir = util::build_binaries()?;
    let work = util::target_dir().join(dir).join("x86_64");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    Ok(Some((bin_dir, work)))
}

fn scenarios(
    work: &Path,
    bin_dir: &Path,
    cuts: u32,
    seed: u64,
) -> Result<(Vec<scenario::Outcome>, Vec<scenario::Cut>)> {
    let mut lab = scenario::Lab::new(work, bin_dir)?;
    let result = lab
        .full_update()
        .and_then(|()| lab.failed_health_check())
        .and_then(|()| lab.cannot_boot())
        .and_then(|()| lab.hangs())
        .and_then(|()| lab.delta_update())
        .and_then(|()| lab.power_cuts(cuts, seed));
    match result {
        Ok(()) => Ok((
            std::mem::take(&mut lab.outcomes),
            std::mem::take(&mut lab.cuts),
        )),
        Err(e) => Err(format!(
            "{e}\n(the disk, the console logs and the server's files are in {})",
            work.display()
        )),
    }
}

fn summary(outcomes: &[scenario::Outcome], total: Duration, work: &Path) {
    println!("\n== summary");
    let mut in_qemu = Duration::ZERO;
    for o in outcomes {
        let boots: Vec<String> = o
            .boots
            .iter()
            .map(|b| {
                format!(
                    "{}{} {}",
                    b.slot.as_deref().unwrap_or("?"),
                    b.version
                        .as_deref()
                        .map(|v| format!("/{v}"))
                        .unwrap_or_default(),
                    b.to_userspace()
                        .map(|d| format!("{:.1} s", d.as_secs_f64()))
                        .unwrap_or_else(|| "-".into())
                )
            })
            .collect();
        println!(
            "{:24} {:6.1} s in qemu; boots (reset to userspace): {}",
            o.name,
            o.qemu_time.as_secs_f64(),
            boots.join(", ")
        );
        in_qemu += o.qemu_time;
    }
    let reached: Vec<f64> = outcomes
        .iter()
        .flat_map(|o| o.boots.iter())
        .filter_map(|b| b.to_userspace())
        .map(|d| d.as_secs_f64())
        .collect();
    if !reached.is_empty() {
        let min = reached.iter().copied().fold(f64::INFINITY, f64::min);
        let max = reached.iter().copied().fold(0.0, f64::max);
        println!(
            "{} boots reached userspace in {min:.1}–{max:.1} s",
            reached.len()
        );
    }
    println!(
        "all scenarios passed: {:.1} s in qemu, {:.1} s in all (console logs in {})",
        in_qemu.as_secs_f64(),
        total.as_secs_f64(),
        work.display()
    );
}

/// Where the power cuts landed and how each release ended. Every cut has
/// converged by the time this prints (a brick or a lost report fails the
/// run before), so bricks and lost reports are 0 by construction here.
fn cut_summary(cuts: &[scenario::Cut], seed: u64) {
    println!("\n== power cuts (seed {seed})");
    for c in cuts {
        println!(
            "{:8} cut in {:34} {:5} ms after its marker (state {:11}) -> {} after {} boots",
            c.release, c.phase, c.after_ms, c.state_before, c.result, c.boots_after
        );
    }
    let mut by_phase: Vec<(&str, usize)> = Vec::new();
    for c in cuts {
        match by_phase.iter_mut().find(|(p, _)| *p == c.phase) {
            Some((_, n)) => *n += 1,
            None => by_phase.push((c.phase, 1)),
        }
    }
    let committed = cuts.iter().filter(|c| c.result == "committed").count();
    println!(
        "{} cuts: {}; {committed} releases committed after the cut, {} rolled back (a trial boot cut); bricks 0; install reports lost 0",
        cuts.len(),
        by_phase
            .iter()
            .map(|(p, n)| format!("{n} in {p}"))
            .collect::<Vec<_>>()
            .join(", "),
        cuts.len() - committed
    );
}

/// Check (and as root on Debian, install) the packages. `Ok(false)`: skip.
fn prerequisites() -> Result<bool> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(pkg, file)| {
            !toolchain::installed(pkg) || (!file.is_empty() && !Path::new(file).exists())
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return kernel_there();
    }
    let command = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    let debian = Path::new("/etc/debian_version").is_file();
    if util::is_root() && debian {
        toolchain::install_packages(&missing, "the VM test's tools and kernel")?;
        return kernel_there();
    }
    let why = if debian {
        "not running as root"
    } else {
        "not a Debian system"
    };
    let msg = format!(
        "vm-test needs {} ({why}); install them with:\n  {command}",
        missing.join(", ")
    );
    if ci() {
        return Err(msg);
    }
    println!("vm-test: skipped: {msg}");
    Ok(false)
}

fn kernel_there() -> Result<bool> {
    guest::Kernel::find().map(|_| true)
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
