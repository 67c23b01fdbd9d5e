//! When queued reports are sent: the delivery timer and its backoff.
//!
//! Reports wait in the outbox ([`crate::store`]) until a delivery succeeds.
//! A failed delivery backs off with full jitter up to `retry_max` (six
//! hours by default) or waits for the server's `Retry-After`, so a fleet
//! does not hammer a report server that is down. But a backoff that grew
//! during an outage must not outlive it: once a poll has been answered, the
//! network is back, and reports made during the outage should follow
//! within that poll, not hours later. [`after_poll`] decides how much of
//! the wait a successful poll ends; it is a pure function of what is known
//! about the two servers, tested row by row below.
//!
//! This module owns the timer only. It never sends (that is
//! [`crate::machine::Machine::deliver_reports`]) and never decides what is
//! queued.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// What a successful poll does to the delivery timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterPoll {
    /// Nothing: no wait is running, or the report server asked for it.
    Keep,
    /// Try once now; a failure goes on backing off from where it was.
    TryNow,
    /// The report server itself answered: its backoff is over.
    Reset,
}

/// How a successful poll changes a running delivery wait. `same_server`:
/// the reports go to the server that just answered (a DDI server, or a
/// static report URL of the same scheme, host and port as the manifest).
/// `told_to_wait`: the wait is the report server's own `Retry-After`.
pub(crate) fn after_poll(waiting: bool, same_server: bool, told_to_wait: bool) -> AfterPoll {
    match (waiting, same_server, told_to_wait) {
        (false, _, _) => AfterPoll::Keep,
        // The server that asked us to wait has since answered a poll.
        (true, true, _) => AfterPoll::Reset,
        // Another server's request to wait is honoured.
        (true, false, true) => AfterPoll::Keep,
        // The network is back; whether the report server is, only a try
        // tells, and a failure keeps the backoff growing.
        (true, false, false) => AfterPoll::TryNow,
    }
}

/// The delivery timer.
pub(crate) struct Delivery {
    /// Reports are not sent before this instant.
    pub(crate) next: Instant,
    backoff: Backoff,
    /// The current wait is the server's `Retry-After`.
    told_to_wait: bool,
}

impl Delivery {
    pub(crate) fn new(now: Instant, base: Duration, cap: Duration) -> Delivery {
        Delivery {
            next: now,
            backoff: Backoff::new(base, cap),
            told_to_wait: false,
        }
    }

    pub(crate) fn succeeded(&mut self) {
        self.backoff.succeed();
        self.told_to_wait = false;
    }

    /// A delivery failed: the next one waits the returned time.
    pub(crate) fn failed(&mut self, retry_after: Option<Duration>) -> Duration {
        self.told_to_wait = retry_after.is_some();
        let d = self.backoff.fail(retry_after);
        self.next = Instant::now() + d;
        d
    }

    /// Put the next attempt off by `d` without counting a failure (the
    /// status could not be read).
    pub(crate) fn postpone(&mut self, d: Duration) {
        self.next = Instant::now() + d;
    }

    /// A poll of the configured server succeeded. Returns what it changed.
    pub(crate) fn poll_answered(&mut self, same_server: bool) -> AfterPoll {
        let now = Instant::now();
        let rule = after_poll(self.next > now, same_server, self.told_to_wait);
        match rule {
            AfterPoll::Keep => {}
            AfterPoll::TryNow => self.next = now,
            AfterPoll::Reset => {
                self.succeeded();
                self.next = now;
            }
        }
        rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_successful_poll_ends_the_waits_it_may_end() {
        use AfterPoll::*;
        // (waiting, same server, told to wait) → rule
        let rows = [
            ((false, false, false), Keep),
            ((false, true, true), Keep),
            ((true, true, false), Reset),
            ((true, true, true), Reset),
            ((true, false, true), Keep),
            ((true, false, false), TryNow),
        ];
        for ((waiting, same, told), want) in rows {
            assert_eq!(
                after_poll(waiting, same, told),
                want,
                "waiting {waiting}, same server {same}, told to wait {told}"
            );
        }
    }

    #[test]
    fn a_reset_clears_the_retry_after_and_the_failures() {
        let base = Duration::from_secs(10);
        let mut d = Delivery::new(Instant::now(), base, Duration::from_secs(3600));
        d.failed(Some(Duration::from_secs(3600)));
        assert_eq!(d.poll_answered(false), AfterPoll::Keep);
        assert!(d.next > Instant::now() + Duration::from_secs(3000));
        assert_eq!(d.poll_answered(true), AfterPoll::Reset);
        assert!(d.next <= Instant::now());
        // The next failure starts from the base again.
        assert!(d.failed(None) <= base);
    }

    #[test]
    fn a_try_keeps_the_backoff_growing() {
        let base = Duration::from_secs(1);
        let mut d = Delivery::new(Instant::now(), base, Duration::from_secs(1 << 20));
        for _ in 0..12 {
            d.failed(None);
        }
        d.next = Instant::now() + Duration::from_secs(600);
        assert_eq!(d.poll_answered(false), AfterPoll::TryNow);
        assert!(d.next <= Instant::now());
        // The 13th failure draws from a ceiling of 4096 s: over a thousand
        // draws, some exceed the base by far.
        let longest = (0..1000)
            .map(|_| {
                let mut c = Delivery {
                    next: d.next,
                    backoff: d.backoff.clone(),
                    told_to_wait: false,
                };
                c.failed(None)
            })
            .max()
            .unwrap_or_default();
        assert!(longest > Duration::from_secs(1024), "{longest:?}");
    }
}
