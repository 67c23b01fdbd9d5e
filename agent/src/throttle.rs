//! The bandwidth cap on artifact downloads (`policy.max_rate`): a token
//! bucket.
//!
//! A device on a metered or shared link (cellular, a site's only uplink)
//! must not take the whole link for an update. The bucket fills at the cap
//! and holds at most [`Throttle::burst`] bytes; every byte read takes a
//! token, and a read that leaves the bucket in debt is followed by a sleep
//! that pays the debt back. Reads are never larger than the burst, so one
//! sleep is at most an eighth of a second from 32 KiB/s up (below that, the
//! 4 KiB minimum burst at the cap: 16 s at the 256 B/s slow-retrieval
//! floor, well inside its 120 s window). Over a minute the rate is the cap
//! to within the burst: at 4 MiB/s that is half a MiB in 240, 0.2 %.
//!
//! The throttle only computes; the sleeping is done by the reader that owns
//! it, which runs on a transfer thread ([`crate::worker`]), never on the
//! state machine's thread. It never looks at what the bytes are, and it
//! does not slow manifests, key documents or reports: only the caller that
//! streams an artifact uses one.

use std::time::{Duration, Instant};

/// A token bucket for one transfer.
#[derive(Debug)]
pub struct Throttle {
    rate: u64,
    burst: u64,
    /// Tokens held when `at` was observed; negative is debt.
    tokens: f64,
    at: Instant,
}

impl Throttle {
    /// A full bucket for a cap of `rate` bytes/s (at least 1).
    pub fn new(rate: u64, now: Instant) -> Throttle {
        let rate = rate.max(1);
        let burst = Throttle::burst_for(rate);
        Throttle {
            rate,
            burst,
            tokens: burst as f64,
            at: now,
        }
    }

    /// The bucket's size for a cap: an eighth of a second of the cap, at
    /// least 4 KiB (one small TLS record's worth, so a low cap still reads
    /// in useful pieces) and at most 1 MiB.
    fn burst_for(rate: u64) -> u64 {
        (rate / 8).clamp(4 * 1024, 1024 * 1024)
    }

    /// The most one read may ask for.
    pub fn burst(&self) -> usize {
        self.burst as usize
    }

    /// Take `n` bytes just read at `now`; returns how long to wait before
    /// the next read (zero when the bucket is not in debt).
    pub fn take(&mut self, n: usize, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.burst as f64);
        self.tokens -= n as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read as fast as allowed for `secs` of simulated time in pieces of
    /// `piece` bytes; returns the bytes read.
    fn simulate(rate: u64, piece: usize, secs: u64) -> u64 {
        let start = Instant::now();
        let mut t = Throttle::new(rate, start);
        let mut now = start;
        let end = start + Duration::from_secs(secs);
        let mut read = 0u64;
        while now < end {
            let n = piece.min(t.burst());
            read += n as u64;
            now += t.take(n, now);
        }
        read
    }

    #[test]
    fn over_a_minute_the_rate_is_the_cap_within_the_burst() {
        for (rate, piece) in [
            (4u64 << 20, 64 * 1024),
            (4 << 20, 16 * 1024 * 1024),
            (1_000_000, 1500),
            (5_000, 64 * 1024),
            (300, 16 * 1024),
        ] {
            let read = simulate(rate, piece, 60);
            let want = rate * 60;
            let burst = Throttle::burst_for(rate);
            assert!(
                read >= want && read <= want + burst + piece as u64,
                "cap {rate} B/s, pieces of {piece}: {read} bytes in 60 s, want {want} (+ burst {burst})"
            );
        }
    }

    #[test]
    fn a_read_in_debt_waits_out_the_debt_at_the_cap() {
        for rate in [1u64, 300, 4096, 1_000_000, 4 << 20, 1 << 30] {
            let now = Instant::now();
            let mut t = Throttle::new(rate, now);
            assert_eq!(t.take(t.burst(), now), Duration::ZERO, "cap {rate}");
            let wait = t.take(t.burst(), now);
            let debt = t.burst() as f64 / rate as f64;
            assert!(
                (wait.as_secs_f64() - debt).abs() < 1e-6,
                "cap {rate}: {wait:?}"
            );
            if rate >= 32 * 1024 {
                assert!(wait <= Duration::from_millis(125), "cap {rate}: {wait:?}");
            }
        }
    }

    #[test]
    fn an_idle_bucket_refills_only_to_its_burst() {
        let start = Instant::now();
        let mut t = Throttle::new(1_000_000, start);
        // An hour idle does not bank an hour of bytes.
        let later = start + Duration::from_secs(3600);
        assert_eq!(t.take(t.burst(), later), Duration::ZERO);
        assert!(t.take(t.burst(), later) > Duration::ZERO);
    }
}
