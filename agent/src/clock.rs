//! Clock sanity: when the device may believe its own clock.
//!
//! Expiry checks (freeze attacks) and TLS certificate validation both need
//! the real time. A board without an RTC boots in 1970, or at the time of its
//! last shutdown, until NTP answers. updraft therefore treats the clock as
//! unsynchronised while it reads earlier than the newest time it knows to
//! have passed: the binary's build time, and the `issued` time of the newest
//! manifest it verified (persisted). It then waits for time synchronisation
//! instead of trusting the clock or refusing a valid update as "expired".

use crate::error::{Error, Kind, Result};
use crate::timestamp::Timestamp;

/// When this binary was built (from `SOURCE_DATE_EPOCH` when set).
pub fn build_time() -> Timestamp {
    Timestamp(env!("UPDRAFT_BUILD_TIME").parse::<i64>().unwrap_or(0))
}

/// Fail with [`Kind::Clock`] when `now` is before the build time or before
/// `floor` (the newest time verified so far).
pub fn check(now: Timestamp, floor: Option<Timestamp>) -> Result<()> {
    let build = build_time();
    if now < build {
        return Err(Error::new(
            Kind::Clock,
            format!(
                "system clock reads {now}, before this updraft's build time {build}: waiting for time synchronisation"
            ),
        ));
    }
    if let Some(floor) = floor {
        if now < floor {
            return Err(Error::new(
                Kind::Clock,
                format!(
                    "system clock reads {now}, before {floor}, the newest time already verified: waiting for time synchronisation"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_build_time_is_refused() {
        let e = check(Timestamp(0), None).unwrap_err();
        assert_eq!(e.kind(), Kind::Clock);
        assert!(e.to_string().contains("before this updraft's build time"));
        assert!(check(Timestamp::now(), None).is_ok());
    }

    #[test]
    fn before_verified_floor_is_refused() {
        let now = Timestamp::now();
        let e = check(now, Some(Timestamp(now.0 + 3600))).unwrap_err();
        assert!(e.to_string().contains("newest time already verified"));
        assert!(check(now, Some(Timestamp(now.0 - 1))).is_ok());
    }
}
