//! What a verified manifest means for this device, as one pure function.
//!
//! A signed, current manifest is not yet a reason to write a slot: the
//! release may be the one running, the one being installed, one this device
//! rolled back or the operator cancelled before, or outside its staged
//! rollout; a job in progress may be superseded by it or must be finished
//! first. [`verdict`] answers from [`Facts`] — values the machine gathered
//! from the store, the state and the manifest — in a fixed order, and every
//! row of that order is a unit test below. It reads nothing, writes
//! nothing and never logs; [`Machine::decide`](super::Machine) gathers the
//! facts and carries the verdict out.
//!
//! Two facts cost something to learn and are asked for only when the
//! order reaches them: whether a booted slot with no install recorded
//! already holds the image ([`Verdict::Probe`]: the machine hashes it once
//! and decides again), and the operator's policy for writing
//! (`policy.write`, asked by the machine after [`Verdict::Install`]).

use crate::hash::Sha256;
use crate::manifest::Freshness;
use crate::slot::SlotName;
use crate::state::Job;

/// A job in progress when the manifest arrived.
#[derive(Debug, Clone, Copy)]
pub(super) struct InProgress<'a> {
    pub(super) job: &'a Job,
    /// Its state's name (`downloading`, `installed`, …).
    pub(super) state: &'static str,
    /// It came from the server this manifest came from and has not been
    /// switched in: a manifest naming another image ends it.
    pub(super) supersedable: bool,
}

/// What is known of the release in the booted slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Booted {
    /// An install of this image (sha256, size) is recorded for the slot.
    Recorded(Sha256, u64),
    /// Nothing recorded, not yet looked at: the device may be fresh from
    /// the factory with this very release.
    Unrecorded,
    /// Nothing recorded, and looked at: it does not hold this image.
    NotThisImage,
}

/// Everything [`verdict`] decides on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Facts<'a> {
    pub(super) version: &'a str,
    pub(super) serial: u64,
    pub(super) image: (Sha256, u64),
    pub(super) freshness: Freshness,
    /// An explicit `updraft install`: rollout and earlier rejections or
    /// cancels do not apply, and nothing is superseded.
    pub(super) operator: bool,
    pub(super) in_progress: Option<InProgress<'a>>,
    pub(super) booted_slot: SlotName,
    pub(super) booted: Booted,
    /// Why this image was rolled back here before, if it was.
    pub(super) rejected: Option<&'a str>,
    /// The operator cancelled a job of this image.
    pub(super) cancelled: bool,
    /// The staged rollout's percentage, when the release has one, and
    /// whether this device is among it.
    pub(super) rollout: Option<(f64, bool)>,
}

/// What the manifest leads to.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Verdict {
    /// Nothing to do now, and why.
    NoChange(String),
    /// The job in progress ends; the manifest is acted on afresh.
    Supersede,
    /// Another job is in progress and must finish first: an error.
    Busy(String),
    /// Hash the booted slot (no install recorded) and decide again.
    Probe,
    /// The release is the one running.
    Running(String),
    /// Not for this device.
    Declined(String),
    /// Install it (after the write policy allows). `unreject`/`uncancel`:
    /// the operator installs an image rolled back or cancelled before, and
    /// that mark is lifted.
    Install { unreject: bool, uncancel: bool },
}

/// The order: a job in progress first (the same image, superseded, or
/// busy); then what the booted slot holds; then this device's own history
/// with the image (rolled back, cancelled) unless the operator asks; then
/// the staged rollout unless the operator asks; then install.
pub(super) fn verdict(f: &Facts<'_>) -> Verdict {
    let (sha, size) = f.image;
    if let Some(p) = f.in_progress {
        if p.job.image.sha256 == sha && p.job.image.size == size {
            return Verdict::NoChange(format!(
                "release {} is already being installed into slot {} ({})",
                p.job.version, p.job.target, p.state
            ));
        }
        if !f.operator && p.supersedable {
            return Verdict::Supersede;
        }
        return Verdict::Busy(format!(
            "an update to {} is in progress ({}); finish it before installing {}",
            p.job.version, p.state, f.version
        ));
    }
    match f.booted {
        Booted::Unrecorded => return Verdict::Probe,
        Booted::Recorded(s, n) if s == sha && n == size => {
            return Verdict::Running(match f.freshness {
                Freshness::Unchanged => format!(
                    "manifest serial {} is unchanged; release {} is running",
                    f.serial, f.version
                ),
                Freshness::New => format!(
                    "release {} (serial {}) is already running in slot {}",
                    f.version, f.serial, f.booted_slot
                ),
            });
        }
        Booted::Recorded(..) | Booted::NotThisImage => {}
    }
    if !f.operator {
        if let Some(reason) = f.rejected {
            return Verdict::Declined(format!(
                "release {} was rolled back before ({reason}); it is not installed again automatically",
                f.version
            ));
        }
        if f.cancelled {
            return Verdict::Declined(format!(
                "release {} was cancelled by the operator; it is installed again by `updraft install` or when a manifest names another image",
                f.version
            ));
        }
        if let Some((percent, false)) = f.rollout {
            return Verdict::Declined(format!(
                "release {} is rolled out to {percent}% of devices; this device is not selected",
                f.version
            ));
        }
    }
    Verdict::Install {
        unreject: f.rejected.is_some(),
        uncancel: f.cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::job_into;

    const SHA: fn() -> Sha256 = || Sha256::of(b"image 2.0");
    const OTHER: fn() -> Sha256 = || Sha256::of(b"image 1.0");

    fn facts<'a>() -> Facts<'a> {
        Facts {
            version: "2.0",
            serial: 7,
            image: (SHA(), 100),
            freshness: Freshness::New,
            operator: false,
            in_progress: None,
            booted_slot: SlotName::A,
            booted: Booted::Recorded(OTHER(), 100),
            rejected: None,
            cancelled: false,
            rollout: None,
        }
    }

    fn install() -> Verdict {
        Verdict::Install {
            unreject: false,
            uncancel: false,
        }
    }

    fn kind(v: &Verdict) -> &'static str {
        match v {
            Verdict::NoChange(_) => "no change",
            Verdict::Supersede => "supersede",
            Verdict::Busy(_) => "busy",
            Verdict::Probe => "probe",
            Verdict::Running(_) => "running",
            Verdict::Declined(_) => "declined",
            Verdict::Install { .. } => "install",
        }
    }

    #[test]
    fn a_new_release_for_this_device_is_installed() {
        assert_eq!(verdict(&facts()), install());
    }

    #[test]
    fn each_fact_leads_where_the_order_says() {
        let mut same_job = job_into(SlotName::B);
        same_job.image.sha256 = SHA();
        same_job.image.size = 100;
        let mut other_job = job_into(SlotName::B);
        other_job.image.sha256 = OTHER();
        let in_progress = |job, supersedable| {
            Some(InProgress {
                job,
                state: "downloading",
                supersedable,
            })
        };
        let same = in_progress(&same_job, true);
        let other_here = in_progress(&other_job, true);
        let other_elsewhere = in_progress(&other_job, false);
        type Edit<'e, 'j> = Box<dyn Fn(&mut Facts<'j>) + 'e>;
        let rows: Vec<(&str, Edit<'_, '_>, &str)> = vec![
            ("nothing in the way", Box::new(|_| {}), "install"),
            // A job in progress.
            (
                "the same image in progress",
                Box::new(|f| f.in_progress = same),
                "no change",
            ),
            (
                "another image, same server",
                Box::new(|f| f.in_progress = other_here),
                "supersede",
            ),
            (
                "another image, switched in or another source",
                Box::new(|f| f.in_progress = other_elsewhere),
                "busy",
            ),
            (
                "the operator never supersedes",
                Box::new(|f| {
                    f.in_progress = other_here;
                    f.operator = true;
                }),
                "busy",
            ),
            // What the booted slot holds.
            (
                "running, recorded",
                Box::new(|f| f.booted = Booted::Recorded(SHA(), 100)),
                "running",
            ),
            (
                "same hash, other size",
                Box::new(|f| f.booted = Booted::Recorded(SHA(), 99)),
                "install",
            ),
            (
                "nothing recorded: look first",
                Box::new(|f| f.booted = Booted::Unrecorded),
                "probe",
            ),
            (
                "looked: not this image",
                Box::new(|f| f.booted = Booted::NotThisImage),
                "install",
            ),
            (
                "running beats a rejection",
                Box::new(|f| {
                    f.booted = Booted::Recorded(SHA(), 100);
                    f.rejected = Some("health check failed");
                }),
                "running",
            ),
            // This device's history with the image.
            (
                "rolled back before",
                Box::new(|f| f.rejected = Some("health check failed")),
                "declined",
            ),
            (
                "cancelled before",
                Box::new(|f| f.cancelled = true),
                "declined",
            ),
            (
                "outside the rollout",
                Box::new(|f| f.rollout = Some((10.0, false))),
                "declined",
            ),
            (
                "inside the rollout",
                Box::new(|f| f.rollout = Some((10.0, true))),
                "install",
            ),
            // The operator's install passes all three.
            (
                "operator, rolled back before",
                Box::new(|f| {
                    f.operator = true;
                    f.rejected = Some("x");
                }),
                "install",
            ),
            (
                "operator, cancelled before",
                Box::new(|f| {
                    f.operator = true;
                    f.cancelled = true;
                }),
                "install",
            ),
            (
                "operator, outside the rollout",
                Box::new(|f| {
                    f.operator = true;
                    f.rollout = Some((0.0, false));
                }),
                "install",
            ),
        ];
        for (name, edit, want) in rows {
            let mut f = facts();
            edit(&mut f);
            let v = verdict(&f);
            assert_eq!(kind(&v), want, "{name}: {v:?}");
        }
    }

    #[test]
    fn an_operators_install_lifts_the_marks_it_passes() {
        let mut f = facts();
        f.operator = true;
        f.rejected = Some("x");
        f.cancelled = true;
        assert_eq!(
            verdict(&f),
            Verdict::Install {
                unreject: true,
                uncancel: true
            }
        );
    }

    #[test]
    fn the_reasons_name_the_release_and_the_cause() {
        let mut f = facts();
        f.rejected = Some("health check 20-db failed");
        assert_eq!(
            verdict(&f),
            Verdict::Declined(
                "release 2.0 was rolled back before (health check 20-db failed); it is not installed again automatically".into()
            )
        );
        let mut f = facts();
        f.booted = Booted::Recorded(SHA(), 100);
        f.freshness = Freshness::Unchanged;
        assert_eq!(
            verdict(&f),
            Verdict::Running("manifest serial 7 is unchanged; release 2.0 is running".into())
        );
    }
}
