//! When to try again: jittered poll intervals and full-jitter exponential
//! backoff.
//!
//! A fleet that powers up together, or comes back online after an outage,
//! must not arrive at the server at once. So every wait updraft schedules is
//! randomised: the first poll after start is uniform over the jitter window,
//! each regular poll lands within the jitter window around the poll
//! interval, and failures back off with "full jitter" (uniform between zero
//! and an exponentially growing, capped ceiling), which spreads retries
//! best. A server's `Retry-After` overrides the computed delay.
//!
//! Pure functions of their inputs and the system random generator; nothing
//! here sleeps.

use std::time::Duration;

/// A uniformly random duration in `[0, max]`.
pub fn uniform(max: Duration) -> Duration {
    let ms = max.as_millis().min(u64::MAX as u128) as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(random_u64() % (ms + 1))
}

/// The delay until the next regular poll: `interval` moved by up to half
/// of `jitter` either way.
pub fn poll_delay(interval: Duration, jitter: Duration) -> Duration {
    let half = jitter / 2;
    interval.saturating_sub(half) + uniform(jitter)
}

/// The delay before the first poll after the daemon starts.
pub fn first_poll_delay(jitter: Duration) -> Duration {
    uniform(jitter)
}

/// Full-jitter exponential backoff after `attempt` consecutive failures
/// (1-based): uniform in `[0, min(cap, base · 2^(attempt-1))]`.
pub fn full_jitter(attempt: u32, base: Duration, cap: Duration) -> Duration {
    uniform(ceiling(attempt, base, cap))
}

/// The upper bound full jitter draws from.
pub fn ceiling(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(32);
    base.saturating_mul(1u32 << exp.min(31)).min(cap)
}

/// Consecutive failures of one activity (polling, report delivery).
#[derive(Debug, Clone)]
pub struct Backoff {
    failures: u32,
    base: Duration,
    cap: Duration,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            failures: 0,
            base,
            cap,
        }
    }

    #[cfg(test)]
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Record a failure and return how long to wait; `retry_after` (from
    /// the server) wins when given.
    pub fn fail(&mut self, retry_after: Option<Duration>) -> Duration {
        self.failures = self.failures.saturating_add(1);
        match retry_after {
            // The server's word wins, even beyond our own cap.
            Some(d) => d,
            None => full_jitter(self.failures, self.base, self.cap),
        }
    }

    pub fn succeed(&mut self) {
        self.failures = 0;
    }
}

fn random_u64() -> u64 {
    match crate::random::bytes::<8>() {
        Ok(b) => u64::from_le_bytes(b),
        Err(_) => {
            // Without a random source, spread by time and process id.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos() as u64)
                .unwrap_or(0);
            t ^ (u64::from(std::process::id()) << 32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_grows_then_caps() {
        let base = Duration::from_secs(10);
        let cap = Duration::from_secs(300);
        let c: Vec<u64> = (1..=8).map(|a| ceiling(a, base, cap).as_secs()).collect();
        assert_eq!(c, vec![10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(ceiling(1000, base, cap), cap);
    }

    #[test]
    fn draws_stay_in_their_windows() {
        for _ in 0..1000 {
            let d = poll_delay(Duration::from_secs(1800), Duration::from_secs(600));
            assert!(
                d >= Duration::from_secs(1500) && d <= Duration::from_secs(2100),
                "{d:?}"
            );
            let f = full_jitter(3, Duration::from_secs(10), Duration::from_secs(300));
            assert!(f <= Duration::from_secs(40));
            assert!(first_poll_delay(Duration::from_secs(60)) <= Duration::from_secs(60));
        }
    }

    #[test]
    fn draws_are_spread() {
        // 200 draws over a 100 s window land in at least 8 of 10 buckets.
        let mut buckets = [0u32; 10];
        for _ in 0..200 {
            let d = uniform(Duration::from_secs(100)).as_secs().min(99);
            buckets[(d / 10) as usize] += 1;
        }
        assert!(
            buckets.iter().filter(|b| **b > 0).count() >= 8,
            "{buckets:?}"
        );
    }

    #[test]
    fn retry_after_wins() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(b.fail(Some(Duration::from_secs(7))), Duration::from_secs(7));
        assert_eq!(b.failures(), 1);
        b.succeed();
        assert_eq!(b.failures(), 0);
    }
}
