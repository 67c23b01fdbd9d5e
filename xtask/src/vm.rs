//! `cargo xtask vm-test [x86_64|aarch64|all]`: the whole update cycle on a
//! real full-system QEMU machine. On x86_64, SeaBIOS and GRUB boot the
//! shipped GRUB fragment (`grub.cfg.in`), which reads the `grubenv`
//! updraft's own GRUB backend writes; on aarch64 (`-M virt`), Debian's
//! U-Boot runs the shipped `boot.cmd.in` with its FAT-file environment
//! hooks, reading the redundant pair updraft's U-Boot backend writes. A
//! real Debian kernel (the generic flavour: it drives QEMU's emulated
//! Intel 6300ESB watchdog, which resets a hung release) boots a busybox
//! userspace that starts `updraft daemon` (the host build on x86_64, the
//! aarch64 release build on aarch64) as the systemd unit would, with the
//! real `/proc/cmdline`, boot id and `reboot -f`. Releases come from
//! `updraft-publish`, served by nginx over TLS on 127.0.0.1.
//!
//! * [`machine`]: what differs between the machines, as values;
//! * [`debs`]: the machine's kernel and busybox, fetched without installing
//!   them (nor adding the architecture);
//! * [`disk`]: the MBR disk image (boot, rootfs A, rootfs B, data) and
//!   GRUB, and reading results back from it;
//! * [`guest`]: the initramfs, the slot images and their scripts;
//! * [`console`]: the QEMU process and its serial console, split into boots;
//! * [`app`]: the application component a guest runs (its tree, its
//!   configuration tables, its health check, its console line);
//! * [`scenario`]: the server, the releases and the assertions; scenario 6
//!   (`vm/systemd.rs`, a child of it) boots slots that hold a Debian
//!   systemd userspace running the shipped unit and an app's unit,
//!   scenario 8 (`vm/app_cuts.rs`, another child) cuts the power in
//!   releases of an app, scenario 10 (`vm/deb_package.rs`, a child of
//!   `systemd`) installs updraft's Debian package on the same Debian tree.
//!
//! This module owns the prerequisites (installed with apt-get as root on
//! Debian; otherwise the command is printed and the run skips, or fails
//! with `CI=true`), the build of the binaries and the summary. It must
//! never start QEMU or write a disk itself.

mod app;
mod console;
mod debs;
mod disk;
mod guest;
mod machine;
mod scenario;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::toolchain;
use crate::util::{self, Result};
use machine::{Loader, Machine};

const USAGE: &str =
    "usage: cargo xtask vm-test [x86_64|aarch64|all] [--cuts N] [--app-cuts N] [--seed S] [--systemd-only|--previous-only|--apps-only|--adopt-only|--deb-only|--floor-only|--no-previous|--no-deb|--no-floor|--prerequisites]
  boots a QEMU machine with Debian's generic kernel, busybox and updraft: x86_64 (SeaBIOS,
  GRUB; the default) or aarch64 (-M virt, U-Boot, the aarch64 release build), or both,
  and runs: 1 full-image update, 3 failing health check, 4 release that cannot boot
  (a kernel panic, then a hang reset by QEMU's emulated 6300ESB watchdog), 2 delta update;
  6 a release of a slot and an app on slots holding Debian with systemd, updraft from
  its unit, the app's unit restarted; then an app-only release without a reboot;
  --cuts N: then 5, N power cuts (QEMU killed) at points chosen from --seed S (default 1);
  --app-cuts N: then 8, an app on a disk of its own: an app-only release, then N power
  cuts alternating between app-only releases and releases of a slot and the app;
  then 7, slot A holding the previous landed release of updraft: its update to this
  one rolled back (old code on the new state), then committed;
  then 9, a device another updater's boot script boots and its files describe (aarch64:
  RAUC on U-Boot; x86_64: Mender on GRUB), taken over by `updraft adopt`: a release
  rolled back to the other updater's, one committed, one under a power cut in the switch,
  all in the other updater's variables;
  then on x86_64 10, updraft's Debian package on the systemd guest: the previous build
  installed, degraded until configured, then idle, upgraded to this one, removed, purged;
  then on x86_64 11, the hardware rollback floor in QEMU's TPM (swtpm on the host): a release
  raising the security version committed and the TPM counter advanced; the data partition
  rewritten empty and an older signed release refused by the counter;
  --systemd-only: scenario 6 alone; --previous-only: scenario 7 alone; --apps-only: scenario
  8 alone; --adopt-only: scenario 9 alone; --deb-only: scenario 10 alone; --floor-only: scenario 11 alone; --no-previous: all
  but 7 (CI's x86_64 run: the aarch64 machine boots 7 beside it); --no-deb: all but 10; --no-floor: all but 11;
  --prerequisites: install (as root on Debian) what the machines need, and stop: two runs
  for different machines can then go on side by side without both calling apt-get";

/// Debian packages every machine needs, each with a file that shows it is
/// there (each machine adds its own, see [`Machine::packages`]).
const PACKAGES: &[(&str, &str)] = &[
    ("fdisk", "/usr/sbin/sfdisk"),
    ("e2fsprogs", "/usr/sbin/debugfs"),
    ("cpio", "/usr/bin/cpio"),
    ("binutils", "/usr/bin/strip"),
    ("nginx", "/usr/sbin/nginx"),
    ("mmdebstrap", "/usr/bin/mmdebstrap"),
    ("systemd", "/usr/bin/systemd-sysusers"),
];

pub fn run(args: &[String]) -> Result {
    let mut cuts: u32 = 0;
    let mut app_cuts: u32 = 0;
    let mut seed: u64 = 1;
    let mut only: Option<Only> = None;
    let mut previous = true;
    let mut deb = true;
    let mut floor = true;
    let mut prerequisites_only = false;
    let mut machines: Vec<&'static Machine> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "all" => machines.extend(machine::MACHINES),
            "--systemd-only" => only = Some(Only::Systemd),
            "--previous-only" => only = Some(Only::Previous),
            "--apps-only" => only = Some(Only::Apps),
            "--adopt-only" => only = Some(Only::Adopt),
            "--deb-only" => only = Some(Only::Deb),
            "--floor-only" => only = Some(Only::Floor),
            "--no-deb" => deb = false,
            "--no-floor" => floor = false,
            "--no-previous" => previous = false,
            "--prerequisites" => prerequisites_only = true,
            name if Machine::by_name(name).is_some() => {
                machines.extend(Machine::by_name(name));
            }
            "--cuts" | "--app-cuts" | "--seed" => {
                let v = it
                    .next()
                    .ok_or_else(|| format!("{a} needs a number\n{USAGE}"))?;
                let bad = || format!("{a} {v:?} is not a number\n{USAGE}");
                if a == "--cuts" {
                    cuts = v.parse().map_err(|_| bad())?;
                } else if a == "--app-cuts" {
                    app_cuts = v.parse().map_err(|_| bad())?;
                } else {
                    seed = v.parse().map_err(|_| bad())?;
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "armv7" => {
                return Err(format!(
                    "vm-test {a}: only x86_64 and aarch64 machines are built so far\n{USAGE}"
                ));
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if machines.is_empty() {
        machines.push(&machine::X86_64);
    }
    machines.dedup_by_key(|m| m.name);
    if prerequisites_only {
        for m in machines {
            if prerequisites(m)? {
                println!("vm-test {}: everything it needs is installed", m.name);
            }
        }
        return Ok(());
    }
    for m in machines {
        let total = Instant::now();
        let Some(p) = prepare(m, "vm-test")? else {
            return Ok(());
        };
        // What later scenarios need and takes minutes to make starts now,
        // beside the first scenarios: the previous release for a machine
        // booting a cross build (7), the Debian tree of the systemd guest
        // on x86_64 (6).
        let mut early = Vec::new();
        if previous
            && !matches!(
                only,
                Some(Only::Systemd | Only::Apps | Only::Adopt | Only::Deb | Only::Floor)
            )
        {
            early.extend(build_previous_release_early(m));
        }
        if m.name == machine::X86_64.name
            && !matches!(
                only,
                Some(Only::Previous | Only::Apps | Only::Adopt | Only::Floor)
            )
        {
            early.extend(scenario::prepare_debian_tree());
        }
        let counts = Cuts {
            slot: cuts,
            app: app_cuts,
            seed,
        };
        let result = util::guarded("vm-test", || {
            scenarios(
                m,
                &p,
                counts,
                only,
                Leave {
                    previous,
                    deb,
                    floor,
                },
            )
        });
        // Never leave a build running behind a failed run.
        for work in early {
            let _ = work.join();
        }
        let (outcomes, cut, app_cut) = result?;
        summary(m, &outcomes, total.elapsed(), &p.work);
        if cuts > 0 {
            cut_summary(&cut, seed);
        }
        scenario::app_cut_summary(&app_cut, seed);
    }
    Ok(())
}

/// Start building the previous release for a machine that boots a cross
/// build (aarch64), on a thread of its own at nice 15, so that the build
/// overlaps the first scenarios: the emulated CPU keeps one core, the
/// build takes the other. Scenario 7 waits for it (see
/// [`crate::cross::previous_release_agent`]); a failure here is reported
/// there, when the build is tried again.
fn build_previous_release_early(m: &'static Machine) -> Option<std::thread::JoinHandle<()>> {
    if m.loader != Loader::UBoot {
        return None;
    }
    let t = crate::cross::TARGETS.iter().find(|t| t.short == m.name)?;
    println!(
        "vm-test {}: building the previous release for scenario 7 beside the first scenarios (nice 15)",
        m.name
    );
    Some(std::thread::spawn(move || {
        if let Err(e) = crate::cross::previous_release_agent(t) {
            println!(
                "vm-test {}: building the previous release early failed: {e}",
                m.name
            );
        }
    }))
}

/// One scenario run alone.
#[derive(Clone, Copy)]
enum Only {
    /// Scenario 6, the systemd guest.
    Systemd,
    /// Scenario 7, the previous release in slot A.
    Previous,
    /// Scenario 8, the app under power cuts.
    Apps,
    /// Scenario 9, a device RAUC's U-Boot script boots, adopted.
    Adopt,
    /// Scenario 10, the Debian package on the systemd guest.
    Deb,
    /// Scenario 11, the hardware rollback floor in QEMU's TPM.
    Floor,
}

/// The scenarios a full run may leave out: 7 (`--no-previous`), 10
/// (`--no-deb`) and 11 (`--no-floor`).
#[derive(Clone, Copy)]
struct Leave {
    previous: bool,
    deb: bool,
    floor: bool,
}

/// How many power cuts scenarios 5 and 8 make, and from which seed.
#[derive(Clone, Copy)]
struct Cuts {
    slot: u32,
    app: u32,
    seed: u64,
}

/// What a run works with: the host binaries' directory (the publisher,
/// and `updraft history` over the disk), the updraft binary for the guest,
/// and the run's empty work directory.
struct Prepared {
    bin_dir: PathBuf,
    guest_updraft: PathBuf,
    work: PathBuf,
}

/// `cargo xtask demo --vm`: scenarios 1 (a full update) and 3 (a failing
/// health check, rolled back by a real reboot) with the console shown.
pub fn demo() -> Result {
    let total = Instant::now();
    let m = &machine::X86_64;
    let Some(p) = prepare(m, "vm-demo")? else {
        return Ok(());
    };
    console::show_console();
    let outcomes = util::guarded("demo --vm", || {
        let mut lab = scenario::Lab::new(m, &p.work, &p.bin_dir, &p.guest_updraft)?;
        lab.full_update()?;
        lab.failed_health_check()?;
        Ok(std::mem::take(&mut lab.outcomes))
    })?;
    summary(m, &outcomes, total.elapsed(), &p.work);
    Ok(())
}

/// The prerequisites (`None`: the run skips), the binaries, and an empty
/// `target/<dir>/<machine>`.
fn prepare(m: &'static Machine, dir: &str) -> Result<Option<Prepared>> {
    if !prerequisites(m)? {
        return Ok(None);
    }
    let bin_dir = util::build_binaries()?;
    let guest_updraft = match m.loader {
        Loader::Grub => bin_dir.join("updraft"),
        Loader::UBoot => {
            let t = crate::cross::TARGETS
                .iter()
                .find(|t| t.short == m.name)
                .ok_or_else(|| format!("no cross target for {}", m.name))?;
            crate::cross::release_agent(t)?
        }
    };
    let work = util::target_dir().join(dir).join(m.name);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    Ok(Some(Prepared {
        bin_dir,
        guest_updraft,
        work,
    }))
}

type Outcomes = (
    Vec<scenario::Outcome>,
    Vec<scenario::Cut>,
    Vec<scenario::AppCut>,
);

fn scenarios(
    m: &'static Machine,
    p: &Prepared,
    cuts: Cuts,
    only: Option<Only>,
    run: Leave,
) -> Result<Outcomes> {
    let work = &p.work;
    let mut lab = scenario::Lab::new(m, work, &p.bin_dir, &p.guest_updraft)?;
    // Scenario 6 (a Debian systemd root, GRUB) runs on the x86_64
    // machine; 7 (the previous release) on both, built for each.
    let x86 = m.name == machine::X86_64.name;
    let result = if let Some(only) = only {
        match only {
            Only::Systemd if !x86 => Err(format!(
                "scenario 6 (systemd) runs on the x86_64 machine only, not on {}",
                m.name
            )),
            Only::Systemd => lab.systemd_update(),
            Only::Previous => lab.previous_release(),
            Only::Apps => lab.app_power_cuts(cuts.app, cuts.seed),
            Only::Adopt => lab.adopt(cuts.seed),
            Only::Deb if !x86 => Err(format!(
                "scenario 10 (the Debian package) runs on the x86_64 machine only, not on {}",
                m.name
            )),
            Only::Deb => lab.deb_package(),
            Only::Floor if !x86 => Err(format!(
                "scenario 11 (the hardware rollback floor) runs on the x86_64 machine only, not on {}",
                m.name
            )),
            Only::Floor => lab.hardware_floor(),
        }
    } else {
        lab.full_update()
            .and_then(|()| lab.failed_health_check())
            .and_then(|()| lab.cannot_boot())
            .and_then(|()| lab.hangs())
            .and_then(|()| lab.delta_update())
            .and_then(|()| if x86 { lab.systemd_update() } else { Ok(()) })
            .and_then(|()| lab.power_cuts(cuts.slot, cuts.seed))
            .and_then(|()| {
                if cuts.app > 0 {
                    lab.app_power_cuts(cuts.app, cuts.seed)
                } else {
                    println!("== 8-apps: left out (--app-cuts 0)");
                    Ok(())
                }
            })
            .and_then(|()| {
                if run.previous {
                    lab.previous_release()
                } else {
                    println!("== 7-previous-release: left out (--no-previous)");
                    Ok(())
                }
            })
            .and_then(|()| lab.adopt(cuts.seed))
            .and_then(|()| match (x86, run.deb) {
                (false, _) => Ok(()),
                (true, true) => lab.deb_package(),
                (true, false) => {
                    println!("== 10-deb: left out (--no-deb)");
                    Ok(())
                }
            })
            .and_then(|()| match (x86, run.floor) {
                (false, _) => Ok(()),
                (true, true) => lab.hardware_floor(),
                (true, false) => {
                    println!("== 11-hardware-floor: left out (--no-floor)");
                    Ok(())
                }
            })
    };
    match result {
        Ok(()) => Ok((
            std::mem::take(&mut lab.outcomes),
            std::mem::take(&mut lab.cuts),
            std::mem::take(&mut lab.app_cuts),
        )),
        Err(e) => Err(format!(
            "{e}\n(the disk, the console logs and the server's files are in {})",
            work.display()
        )),
    }
}

fn summary(m: &Machine, outcomes: &[scenario::Outcome], total: Duration, work: &Path) {
    println!("\n== summary ({})", m.name);
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
            "{:8} cut in {:34} {:5} ms after its marker (last status printed: {:11}) -> {} after {} boots",
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
fn prerequisites(m: &Machine) -> Result<bool> {
    let missing: Vec<&str> = m
        .packages
        .iter()
        .chain(PACKAGES)
        .filter(|(pkg, file)| {
            !toolchain::installed(pkg) || (!file.is_empty() && !Path::new(file).exists())
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(true);
    }
    let command = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    let debian = Path::new("/etc/debian_version").is_file();
    if util::is_root() && debian {
        toolchain::install_packages(&missing, "the VM test's tools")?;
        return Ok(true);
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

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
