//! Scenario 8: an `app` component under power cuts, on a disk of its own
//! whose factory slot configures the app `web` (the busybox guest, where
//! no service manager restarts it: what is tested is the generation on
//! the disk, [`super::super::app`]). It installs an application-only
//! release, then cuts the power (QEMU killed) at seeded instants of two
//! kinds of release, alternately:
//!
//! * an **application-only release** (no reboot): while its generation is
//!   written, between the written generation and the switch of `current`,
//!   and during its health checks;
//! * a **release of a new slot and the app**: between the app's written
//!   generation and the switch of the slot, in the trial boot around the
//!   app's switch, and during the app's health checks before the commit.
//!
//! After each cut the machine is started again and must converge: an
//! application-only release commits (an interrupted one is installed
//! again), a slot-and-app release commits or (a cut in a GRUB trial boot,
//! which has one try) is rolled back. Never a mixed state: the app the
//! status reports, the generation `current` names and the files in it
//! (each checked against the tree's `SUMS`, in the guest and again on the
//! host from the disk) are the app of the release the slot belongs to, or
//! of a later application-only release.
//!
//! This module owns scenario 8's releases, cuts and assertions. It must
//! never start QEMU itself (that is `console`) nor build slot images or
//! app trees (that is `guest` and `app`).

use std::time::Instant;

use updraft_tests::publisher::publish_ok;

use super::super::app::{APP, app_line, check_on_disk, component_version, tree};
use super::super::guest::USERSPACE_MARK;
use super::{INSTALL_WAIT, Lab, Vm, cut_after, healthy, wait_status_for, wait_userspace};
use crate::util::Result;

/// Which release a cut falls in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A release of the app alone: installed without a reboot.
    AppOnly,
    /// A release of a new slot and the app.
    SlotAndApp,
}

/// Where a cut is aimed: after a console line holding every part of
/// `marker` (`{v}`: the release), a seeded jitter below `jitter_ms`.
struct Point {
    kind: Kind,
    phase: &'static str,
    marker: &'static [&'static str],
    jitter_ms: u64,
}

/// The cut points, alternating between the kinds so that any two
/// consecutive cuts cover both.
const POINTS: &[Point] = &[
    Point {
        kind: Kind::AppOnly,
        phase: "app generation write",
        marker: &["release {v}: installing component(s) web "],
        jitter_ms: 1500,
    },
    Point {
        kind: Kind::SlotAndApp,
        phase: "app written, before the switch of the slot",
        marker: &[
            "release {v} component web: generation ",
            " written and checked",
        ],
        jitter_ms: 600,
    },
    Point {
        kind: Kind::AppOnly,
        phase: "app switch",
        marker: &[
            "release {v} component web: generation ",
            " written and checked",
        ],
        jitter_ms: 400,
    },
    Point {
        kind: Kind::SlotAndApp,
        phase: "trial boot, the app's switch",
        marker: &[USERSPACE_MARK, " version={v} "],
        jitter_ms: 4000,
    },
    Point {
        kind: Kind::AppOnly,
        phase: "app health check and commit",
        marker: &["release {v} component web: running its health checks"],
        jitter_ms: 400,
    },
    Point {
        kind: Kind::SlotAndApp,
        phase: "trial boot, the app's health check and the commit",
        marker: &["release {v} component web: running its health checks"],
        jitter_ms: 400,
    },
];

/// What one cut of scenario 8 found.
pub struct AppCut {
    pub release: String,
    pub phase: &'static str,
    pub after_ms: u64,
    /// How the release ended: `committed` or `rolled_back`.
    pub result: String,
    /// The slot's release and the app's version the device ran after.
    pub running: (String, String),
}

/// Data files in the app's tree: enough that writing a generation takes
/// a moment under emulation.
const FILES: usize = 120;

impl Lab {
    /// Publish release `version`: the app at `version` beside the slot
    /// image of release `slot` (a new image, configured for the app, when
    /// `slot` is `version`; else the one the device runs, so that the
    /// release is its app alone).
    fn publish_app(&mut self, version: &str, slot: &str) -> Result {
        let tree_dir = self.work.join(format!("app-{version}"));
        tree(&tree_dir, version, FILES)?;
        let mut r = healthy(slot);
        r.app = true;
        let img = self.image(&r)?;
        let args: Vec<String> = vec![
            "release".into(),
            "--key".into(),
            self.key.key.display().to_string(),
            "--version".into(),
            version.into(),
            "--compatible".into(),
            self.machine.compatible(),
            "--level".into(),
            "3".into(),
            "--image".into(),
            img.display().to_string(),
            "--app".into(),
            format!("{APP}@{version}={}", tree_dir.display()),
            "--out".into(),
            self.site.display().to_string(),
        ];
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        publish_ok(&refs);
        println!(
            "published {version}: app {APP} {version} ({FILES} data files) beside slot image {slot}{}",
            if slot == version {
                " (new)"
            } else {
                " (running)"
            }
        );
        Ok(())
    }

    /// Scenario 8: the app on a disk of its own, then `n` power cuts.
    pub fn app_power_cuts(&mut self, n: u32, seed: u64) -> Result {
        let name = "8-apps";
        let mut factory = healthy("9.0");
        factory.app = true;
        let image = self.image(&factory)?;
        self.build_disk(&image, "9.0, configured for the app")?;
        // The factory slot as the release's slot: the device runs it, so
        // the release is its app alone.
        self.publish_app("9.0", "9.0")?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "A", "9.0", 0)?;
        let t = Instant::now();
        self.wait_app(&mut vm, "9.0", "9.0")?;
        println!(
            "   console: app {APP} 9.0 installed without a reboot and committed ({:.1} s from userspace, \
             its files intact in the guest)",
            t.elapsed().as_secs_f64()
        );
        self.finish(vm, name)?;
        self.app_on_disk("9.0")?;

        let mut rng = updraft_tests::rng::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (mut slot, mut app) = ("9.0".to_string(), "9.0".to_string());
        for i in 0..n {
            let point = &POINTS[(seed as usize + i as usize) % POINTS.len()];
            let version = format!("9.{}", i + 1);
            let slot_of_release = match point.kind {
                Kind::AppOnly => slot.clone(),
                Kind::SlotAndApp => version.clone(),
            };
            self.publish_app(&version, &slot_of_release)?;
            let name = format!("8-cut-{i}-{}", point.phase.replace([' ', ','], "-"));
            let mut vm = self.start(&name)?;
            let (marker, after_ms) =
                cut_after(&mut vm, point.marker, &version, point.jitter_ms, &mut rng)?;
            println!(
                "   power cut {after_ms} ms after {marker:?} ({})",
                point.phase
            );
            self.record(vm, &name)?;

            let name_after = format!("{name}-after");
            let mut vm = self.start(&name_after)?;
            let (result, now_slot, now_app) = match point.kind {
                Kind::AppOnly => {
                    self.wait_app(&mut vm, &version, &slot)?;
                    ("committed".to_string(), slot.clone(), version.clone())
                }
                Kind::SlotAndApp => {
                    let st = wait_status_for(
                        &mut vm,
                        &format!("{version} settled"),
                        INSTALL_WAIT,
                        |s| {
                            s["state"] == "idle"
                                && s["last_install"]["release"] == version.as_str()
                                && (s["last_install"]["result"] == "committed"
                                    || s["last_install"]["result"] == "rolled_back")
                        },
                    )?;
                    let result = st["last_install"]["result"]
                        .as_str()
                        .unwrap_or("?")
                        .to_string();
                    let trial = point.phase.starts_with("trial boot");
                    if result != "committed" && (!trial || self.machine.trial_tries() > 1) {
                        return Err(vm.failure(&format!(
                            "a power cut ({}) of {version} ended it as {result}: it must resume and commit",
                            point.phase
                        )));
                    }
                    let (s, a) = if result == "committed" {
                        (version.clone(), version.clone())
                    } else {
                        (slot.clone(), app.clone())
                    };
                    self.wait_app(&mut vm, &a, &s)?;
                    (result, s, a)
                }
            };
            for b in vm.boots() {
                if b.to_userspace().is_none() {
                    return Err(vm.failure("after the cut a boot never reached userspace"));
                }
            }
            println!(
                "   after the cut: {version} {result}; the device runs slot {now_slot} with app {APP} {now_app}, \
                 its files intact ({} boots)",
                vm.boots().len()
            );
            self.finish(vm, &name_after)?;
            let target = self.app_on_disk(&now_app)?;
            println!(
                "   disk: {APP}/current -> {target}, holding {now_app}, every file as SUMS lists"
            );
            self.app_cuts.push(AppCut {
                release: version.clone(),
                phase: point.phase,
                after_ms,
                result,
                running: (now_slot.clone(), now_app.clone()),
            });
            (slot, app) = (now_slot, now_app);
        }
        Ok(())
    }

    /// Wait until the device is idle running slot release `slot` with app
    /// `version`, and the guest's newest app line this boot (printed when
    /// `current` changes: once at boot, then at each switch) shows that
    /// version intact.
    fn wait_app(&mut self, vm: &mut Vm, version: &str, slot: &str) -> Result {
        let from = 0;
        wait_status_for(
            vm,
            &format!("app {APP} {version} running beside slot {slot}"),
            INSTALL_WAIT,
            |s| {
                s["state"] == "idle"
                    && s["running_version"] == slot
                    && component_version(s, APP).as_deref() == Some(version)
            },
        )?;
        vm.wait_line(
            &format!("the guest's app line for {APP} {version}"),
            from,
            super::SETTLE_WAIT,
            |l| app_line(l, APP).is_some_and(|(_, v, _)| v == version),
        )?;
        let newest = vm.lines()[from..]
            .iter()
            .rev()
            .find_map(|l| app_line(l, APP).map(|a| (l.clone(), a)));
        match newest {
            Some((_, (_, v, true))) if v == version => Ok(()),
            Some((line, _)) => Err(vm.failure(&format!(
                "the status says app {APP} {version} runs, but the guest's newest app line says otherwise: {line}"
            ))),
            None => Err(vm.failure(&format!("no app line for {APP}"))),
        }
    }

    /// The app's directory copied off the disk (with the history) and
    /// checked: `current` holds `version`, intact. Its target.
    fn app_on_disk(&self, version: &str) -> Result<String> {
        let _ = self.history()?;
        let dir = self.work.join("state-copy/updraft/apps").join(APP);
        check_on_disk(&dir, version)
    }
}

/// The summary of scenario 8's cuts.
pub fn cut_summary(cuts: &[AppCut], seed: u64) {
    if cuts.is_empty() {
        return;
    }
    println!("\n== app power cuts (seed {seed})");
    for c in cuts {
        println!(
            "   {}: cut {} ms into {}: {}; then slot {} with app {APP} {}",
            c.release, c.after_ms, c.phase, c.result, c.running.0, c.running.1
        );
    }
    println!(
        "   {} cuts: 0 mixed states (the app always the one of the slot's release or of a later \
         application-only release), 0 bricks",
        cuts.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_cut_points_cover_both_kinds_of_release() {
        for i in 0..POINTS.len() {
            let next = &POINTS[(i + 1) % POINTS.len()];
            assert_ne!(
                POINTS[i].kind, next.kind,
                "{} then {}",
                POINTS[i].phase, next.phase
            );
        }
    }
}
