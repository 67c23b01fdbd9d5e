//! What becomes of a step that failed: tried again within its job, a delta
//! given up for the full image, or the job failed.
//!
//! A network outage must never fail a download while its job's deadline
//! allows (a device on a flaky link would otherwise fail and re-fetch
//! releases for ever), yet a corrupt artifact must fail at once, and a
//! delta that cannot produce its image must fall back to the full image
//! rather than end the update. These rules are [`after_failure`], a
//! function of values — the error's [`Kind`] and [`Cause`], the failures
//! so far, the job's method and deadline — tested row by row. It never
//! looks at an error's text, sleeps, logs or writes;
//! [`Machine::guard`](super::Machine) carries its answer out.

use std::time::Duration;

use crate::error::{Cause, Kind};

/// Consecutive transient failures other than the network's (a busy
/// bootloader, a busy slot) before a job is failed. A network failure has
/// no budget: it is retried while the job's download deadline and its
/// manifest's validity allow ([`retries_after`]).
const MAX_DOWNLOAD_RETRIES: u32 = 8;

/// The longest wait between two attempts of a download the network
/// interrupted, whatever `server.retry_max` says: an outage's end is found
/// within it.
const NETWORK_RETRY_CAP: Duration = Duration::from_secs(300);

/// Whether a step that failed with `kind`, after `failures` consecutive
/// failures, is tried again (rather than failing its job): network
/// failures always (the deadline ends them), others up to
/// [`MAX_DOWNLOAD_RETRIES`]. Only a daemon retries.
pub(crate) fn retries_after(kind: Kind, failures: u32, daemon: bool) -> bool {
    daemon
        && match kind {
            Kind::Network => true,
            Kind::Busy => failures < MAX_DOWNLOAD_RETRIES,
            _ => false,
        }
}

/// How long to wait before trying a failed step again: what the server
/// asked for (`Retry-After`), else a jittered backoff over `failures` from
/// 5 s up to `retry_max`, never above [`NETWORK_RETRY_CAP`].
pub(super) fn delay(retry_after: Option<Duration>, failures: u32, retry_max: Duration) -> Duration {
    retry_after.unwrap_or_else(|| {
        crate::backoff::full_jitter(
            failures,
            Duration::from_secs(5),
            retry_max.min(NETWORK_RETRY_CAP),
        )
    })
}

/// What is known when a download or install step fails.
#[derive(Debug, Clone, Copy)]
pub(super) struct Failed {
    pub(super) kind: Kind,
    pub(super) cause: Option<Cause>,
    /// Failures of this job in a row before this one.
    pub(super) failures: u32,
    /// The process is the daemon (a one-shot command never retries).
    pub(super) daemon: bool,
    /// The job is downloading and its download deadline has passed.
    pub(super) past_deadline: bool,
    /// The job applies a delta.
    pub(super) delta: bool,
}

/// What [`after_failure`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recovery {
    /// Try the step again after a delay; the job goes on.
    Retry,
    /// The delta cannot produce the image: download the full image.
    FullImage,
    /// The job fails. `deadline`: because the download deadline passed
    /// (the operator is told so unless the error already says it).
    Fail { deadline: bool },
}

/// The rule: transient failures (network, busy) are retried within the
/// deadline and their budget; past the deadline nothing transient is; a
/// delta whose bytes are wrong falls back to the full image; everything
/// else fails the job.
pub(super) fn after_failure(f: Failed) -> Recovery {
    let transient = matches!(f.kind, Kind::Network | Kind::Busy);
    let deadline = transient && (f.past_deadline || f.cause == Some(Cause::Deadline));
    if transient && !deadline && retries_after(f.kind, f.failures, f.daemon) {
        return Recovery::Retry;
    }
    if f.delta && matches!(f.kind, Kind::Integrity | Kind::Malformed) {
        return Recovery::FullImage;
    }
    Recovery::Fail { deadline }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(kind: Kind) -> Failed {
        Failed {
            kind,
            cause: None,
            failures: 0,
            daemon: true,
            past_deadline: false,
            delta: false,
        }
    }

    #[test]
    fn each_failure_has_one_recovery() {
        use Recovery::*;
        let at_deadline = |mut f: Failed| {
            f.past_deadline = true;
            f
        };
        let by = |mut f: Failed, cause| {
            f.cause = Some(cause);
            f
        };
        let after = |mut f: Failed, n| {
            f.failures = n;
            f
        };
        let delta = |mut f: Failed| {
            f.delta = true;
            f
        };
        let oneshot = |mut f: Failed| {
            f.daemon = false;
            f
        };
        let rows: Vec<(&str, Failed, Recovery)> = vec![
            // The network: retried without a budget until the deadline.
            ("network", failed(Kind::Network), Retry),
            ("network, 1000th", after(failed(Kind::Network), 1000), Retry),
            (
                "network past the deadline",
                at_deadline(failed(Kind::Network)),
                Fail { deadline: true },
            ),
            (
                "the deadline's own error",
                by(failed(Kind::Network), Cause::Deadline),
                Fail { deadline: true },
            ),
            (
                "network in a one-shot command",
                oneshot(failed(Kind::Network)),
                Fail { deadline: false },
            ),
            // Busy: a budget.
            ("busy", failed(Kind::Busy), Retry),
            (
                "busy, budget left",
                after(failed(Kind::Busy), MAX_DOWNLOAD_RETRIES - 1),
                Retry,
            ),
            (
                "busy, budget spent",
                after(failed(Kind::Busy), MAX_DOWNLOAD_RETRIES),
                Fail { deadline: false },
            ),
            // Wrong bytes: a delta falls back, a full image fails.
            (
                "corrupt full image",
                failed(Kind::Integrity),
                Fail { deadline: false },
            ),
            ("corrupt delta", delta(failed(Kind::Integrity)), FullImage),
            ("malformed delta", delta(failed(Kind::Malformed)), FullImage),
            (
                "malformed delta past the deadline",
                at_deadline(delta(failed(Kind::Malformed))),
                FullImage,
            ),
            ("delta, network", delta(failed(Kind::Network)), Retry),
            // Local trouble fails the job whatever the method.
            ("slot", delta(failed(Kind::Slot)), Fail { deadline: false }),
            ("io", failed(Kind::Io), Fail { deadline: false }),
            (
                "full disk",
                by(failed(Kind::Io), Cause::NoSpace),
                Fail { deadline: false },
            ),
            (
                "a deadline does not make a slot error a deadline failure",
                at_deadline(failed(Kind::Slot)),
                Fail { deadline: false },
            ),
        ];
        for (name, f, want) in rows {
            assert_eq!(after_failure(f), want, "{name}: {f:?}");
        }
    }
}
