//! What a start of the process concludes from the persisted state and the
//! boot it finds itself in.
//!
//! This is the on-boot table of `docs/architecture.md` as one pure function:
//! [`reconcile`] takes the state last written, the slot the kernel booted
//! and this boot's id, and returns a [`Decision`]. It reads nothing and
//! writes nothing; [`crate::machine::Machine::on_boot`] carries the decision
//! out through the state machine's one entry point. Keeping the two apart
//! means every row of the table is a unit test, and a change to a row fails
//! one.
//!
//! The rule it must never break: with the same boot id nothing is
//! concluded. The job records the boot id when the reboot is requested, so
//! the same id at start means the reboot has not happened yet (a daemon
//! restart, a crash, a delayed shutdown): the persisted state's action runs
//! again and requests the reboot again. Only a new boot id, read together
//! with the slot the kernel booted, says where the bootloader went.
//!
//! The bootloader's own view (order, attempts left) is not an input: no row
//! depends on it, the booted slot is what the bootloader chose, and reading
//! it at every start would add a failure mode to every start for nothing.
//! Marking the booted slot good is idempotent in every backend (it writes
//! nothing when the selection is already right).

use crate::slot::SlotName;
use crate::state::{Job, RebootPurpose, State};

/// What the start of a process does before the first step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Nothing to conclude: the persisted state's action runs again.
    Resume,
    /// Outside any update: mark the booted slot good again, since boot
    /// scripts count every boot down.
    MarkBootedGood,
    /// A check an older version persisted was interrupted: back to idle
    /// (history `check-interrupted`).
    Settle,
    /// The new slot booted: (re)start its health checks in `testing`
    /// (history `trial-boot`, with `why`).
    Test { job: Job, why: &'static str },
    /// Back on the old slot: `rolled_back` with `reason`; with `reject`, the
    /// image is remembered as rejected first (not when a health check
    /// already rejected it).
    RollBack {
        job: Job,
        reason: String,
        reject: bool,
    },
    /// The rollback reboot came back on the rejected slot: `rebooting`
    /// (rollback) again, history `rollback-retry`.
    RetryRollback { job: Job },
    /// The kernel booted the slot that was being written: the attempt
    /// `failed` with `reason`.
    Fail { job: Job, reason: String },
}

/// The on-boot table. `booted` is the slot the kernel booted, `boot_id`
/// this boot's id.
pub(crate) fn reconcile(state: State, booted: SlotName, boot_id: &str) -> Decision {
    let rebooted = |j: &Job| j.boot_id.as_deref().is_some_and(|b| b != boot_id);
    let this_boot = |mut job: Job| {
        job.boot_id = Some(boot_id.to_string());
        job
    };
    match state {
        State::Checking => Decision::Settle,
        // Held by the policy, or verified but the switch not recorded (the
        // power went before or during the bootloader-environment write):
        // no trial boot is known to have been armed, so a boot of the old
        // slot says nothing about the image; it is still the good one (and
        // boot scripts count every boot down), and the switch is made again
        // at the next step. Should the bootloader have booted the target
        // after all (the write landed), its trial starts.
        State::Installed(job) if job.switch_pending() && rebooted(&job) => {
            if booted == job.target {
                Decision::Test {
                    job: this_boot(job),
                    why: "booted the new slot",
                }
            } else {
                Decision::MarkBootedGood
            }
        }
        State::Installed(job) | State::Rebooting(job) if rebooted(&job) => {
            let on_target = booted == job.target;
            match (job.purpose, on_target) {
                (Some(RebootPurpose::Rollback), false) => Decision::RollBack {
                    reason: job.reason.clone().unwrap_or_else(|| "rolled back".into()),
                    job: this_boot(job),
                    reject: false,
                },
                (Some(RebootPurpose::Rollback), true) => Decision::RetryRollback {
                    job: this_boot(job),
                },
                (_, true) => Decision::Test {
                    job: this_boot(job),
                    why: "booted the new slot",
                },
                (_, false) => Decision::RollBack {
                    reason: format!(
                        "slot {} did not boot: the bootloader fell back to slot {booted}",
                        job.target
                    ),
                    job: this_boot(job),
                    reject: true,
                },
            }
        }
        State::Testing(job) if rebooted(&job) => {
            if booted == job.target {
                Decision::Test {
                    job: this_boot(job),
                    why: "rebooted during health checks; testing again",
                }
            } else {
                Decision::RollBack {
                    reason: format!(
                        "rebooted during health checks and the bootloader fell back to slot {booted}"
                    ),
                    job: this_boot(job),
                    reject: true,
                }
            }
        }
        State::Downloading(job) | State::Installing(job) if booted == job.target => {
            Decision::Fail {
                reason: format!("booted slot {} while it was being written", job.target),
                job,
            }
        }
        s if !s.busy() => Decision::MarkBootedGood,
        _ => Decision::Resume,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Method;
    use crate::test_support::job_into;

    const OLD_BOOT: &str = "boot-1";
    const NEW_BOOT: &str = "boot-2";

    /// A job into slot B whose reboot was requested in boot 1.
    fn job(purpose: Option<RebootPurpose>) -> Job {
        let mut j = job_into(SlotName::B);
        j.boot_id = Some(OLD_BOOT.into());
        j.purpose = purpose;
        j
    }

    fn in_boot(mut j: Job, id: &str) -> Job {
        j.boot_id = Some(id.into());
        j
    }

    fn trial() -> Job {
        job(Some(RebootPurpose::Trial))
    }

    fn held() -> Job {
        let mut j = trial();
        j.held = Some(crate::timestamp::Timestamp(1_800_000_000));
        j
    }

    #[test]
    fn a_slot_held_by_the_policy_survives_a_boot_of_the_old_slot() {
        assert_eq!(
            reconcile(State::Installed(held()), SlotName::A, NEW_BOOT),
            Decision::MarkBootedGood
        );
        assert_eq!(
            reconcile(State::Installed(held()), SlotName::A, OLD_BOOT),
            Decision::Resume
        );
        // Not held: the same boot of the old slot is a failed trial.
        assert!(matches!(
            reconcile(State::Installed(trial()), SlotName::A, NEW_BOOT),
            Decision::RollBack { reject: true, .. }
        ));
    }

    /// The slot verified, then the power went before the switch was
    /// recorded: the environment may or may not hold the trial.
    fn awaiting_switch() -> Job {
        let mut j = trial();
        j.awaiting_switch = true;
        j
    }

    #[test]
    fn a_power_cut_before_the_switch_is_recorded_rejects_nothing() {
        // Back on the old slot: the old slot is marked good again and the
        // persisted state's action (the switch) runs again.
        assert_eq!(
            reconcile(State::Installed(awaiting_switch()), SlotName::A, NEW_BOOT),
            Decision::MarkBootedGood
        );
        // The write reached the environment and the new slot booted.
        assert_eq!(
            reconcile(State::Installed(awaiting_switch()), SlotName::B, NEW_BOOT),
            Decision::Test {
                job: in_boot(awaiting_switch(), NEW_BOOT),
                why: "booted the new slot"
            }
        );
        assert_eq!(
            reconcile(State::Installed(awaiting_switch()), SlotName::A, OLD_BOOT),
            Decision::Resume
        );
    }

    #[test]
    fn a_held_slot_that_booted_after_all_starts_its_trial() {
        assert!(matches!(
            reconcile(State::Installed(held()), SlotName::B, NEW_BOOT),
            Decision::Test { .. }
        ));
    }

    fn rollback() -> Job {
        let mut j = job(Some(RebootPurpose::Rollback));
        j.reason = Some("health check web failed".into());
        j
    }

    #[test]
    fn an_interrupted_check_of_an_older_version_settles_to_idle() {
        assert_eq!(
            reconcile(State::Checking, SlotName::A, NEW_BOOT),
            Decision::Settle
        );
    }

    #[test]
    fn the_same_boot_id_concludes_nothing() {
        for state in [
            State::Installed(trial()),
            State::Rebooting(trial()),
            State::Rebooting(rollback()),
            State::Testing(trial()),
        ] {
            for booted in [SlotName::A, SlotName::B] {
                assert_eq!(
                    reconcile(state.clone(), booted, OLD_BOOT),
                    Decision::Resume,
                    "{state:?} booted {booted}"
                );
            }
        }
    }

    #[test]
    fn a_trial_that_booted_the_target_is_tested() {
        for state in [State::Installed(trial()), State::Rebooting(trial())] {
            assert_eq!(
                reconcile(state, SlotName::B, NEW_BOOT),
                Decision::Test {
                    job: in_boot(trial(), NEW_BOOT),
                    why: "booted the new slot"
                }
            );
        }
        // A one-shot install records no purpose; the daemon after the
        // reboot treats it as a trial.
        assert_eq!(
            reconcile(State::Installed(job(None)), SlotName::B, NEW_BOOT),
            Decision::Test {
                job: in_boot(job(None), NEW_BOOT),
                why: "booted the new slot"
            }
        );
    }

    #[test]
    fn a_trial_that_came_back_on_the_old_slot_is_rejected_and_rolled_back() {
        for state in [
            State::Installed(trial()),
            State::Rebooting(trial()),
            State::Installed(job(None)),
        ] {
            let expected_job = in_boot(state.job().cloned().unwrap_or_else(trial), NEW_BOOT);
            assert_eq!(
                reconcile(state, SlotName::A, NEW_BOOT),
                Decision::RollBack {
                    job: expected_job,
                    reason: "slot B did not boot: the bootloader fell back to slot A".into(),
                    reject: true,
                }
            );
        }
    }

    #[test]
    fn a_rollback_reboot_onto_the_old_slot_completes_the_rollback() {
        assert_eq!(
            reconcile(State::Rebooting(rollback()), SlotName::A, NEW_BOOT),
            Decision::RollBack {
                job: in_boot(rollback(), NEW_BOOT),
                reason: "health check web failed".into(),
                reject: false,
            }
        );
        let mut unexplained = rollback();
        unexplained.reason = None;
        assert_eq!(
            reconcile(State::Rebooting(unexplained.clone()), SlotName::A, NEW_BOOT),
            Decision::RollBack {
                job: in_boot(unexplained, NEW_BOOT),
                reason: "rolled back".into(),
                reject: false,
            }
        );
    }

    #[test]
    fn a_rollback_reboot_still_on_the_target_is_retried() {
        assert_eq!(
            reconcile(State::Rebooting(rollback()), SlotName::B, NEW_BOOT),
            Decision::RetryRollback {
                job: in_boot(rollback(), NEW_BOOT)
            }
        );
    }

    #[test]
    fn a_reboot_during_health_checks_on_the_target_tests_again() {
        assert_eq!(
            reconcile(State::Testing(trial()), SlotName::B, NEW_BOOT),
            Decision::Test {
                job: in_boot(trial(), NEW_BOOT),
                why: "rebooted during health checks; testing again"
            }
        );
    }

    #[test]
    fn a_reboot_during_health_checks_onto_the_old_slot_rolls_back() {
        assert_eq!(
            reconcile(State::Testing(trial()), SlotName::A, NEW_BOOT),
            Decision::RollBack {
                job: in_boot(trial(), NEW_BOOT),
                reason: "rebooted during health checks and the bootloader fell back to slot A"
                    .into(),
                reject: true,
            }
        );
    }

    #[test]
    fn booting_the_slot_being_written_fails_the_attempt() {
        let mut writing = job_into(SlotName::B);
        writing.writing = true;
        for state in [
            State::Downloading(writing.clone()),
            State::Installing(writing.clone()),
        ] {
            assert_eq!(
                reconcile(state, SlotName::B, NEW_BOOT),
                Decision::Fail {
                    job: writing.clone(),
                    reason: "booted slot B while it was being written".into()
                }
            );
        }
    }

    #[test]
    fn a_download_on_the_other_slot_resumes() {
        let mut delta = job_into(SlotName::B);
        delta.method = Method::Delta {
            url: "d".into(),
            size: 1,
        };
        for state in [
            State::Downloading(job_into(SlotName::B)),
            State::Installing(delta),
        ] {
            assert_eq!(reconcile(state, SlotName::A, NEW_BOOT), Decision::Resume);
        }
    }

    #[test]
    fn outside_an_update_the_booted_slot_is_marked_good() {
        for state in [
            State::Idle,
            State::Committed(in_boot(trial(), NEW_BOOT)),
            State::RolledBack(rollback()),
            State::Failed {
                reason: "x".into(),
                job: Some(trial()),
            },
            State::Failed {
                reason: "x".into(),
                job: None,
            },
        ] {
            for booted in [SlotName::A, SlotName::B] {
                for id in [OLD_BOOT, NEW_BOOT] {
                    assert_eq!(
                        reconcile(state.clone(), booted, id),
                        Decision::MarkBootedGood,
                        "{state:?} booted {booted} boot {id}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_job_without_a_boot_id_concludes_nothing() {
        let mut j = trial();
        j.boot_id = None;
        for state in [
            State::Installed(j.clone()),
            State::Rebooting(j.clone()),
            State::Testing(j.clone()),
        ] {
            assert_eq!(reconcile(state, SlotName::A, NEW_BOOT), Decision::Resume);
        }
    }
}
