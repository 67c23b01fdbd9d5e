//! Maintenance windows: weekly spans of time in which an update may
//! switch slots and reboot (`policy.windows`).
//!
//! A window is written `"<days> HH:MM/<duration>[ UTC]"`: `Mon`, `Mon-Fri`,
//! `Sat,Sun` or `Fri-Mon` (wrapping), a start on the wall clock, a length
//! such as `3h` or `90m` (at most 7 days), in local time unless `UTC`
//! follows. Several windows are a union.
//!
//! Local time is the system's zone (`TZ`, else `/etc/localtime`, read
//! through libc's `localtime_r`). What happens when the clock is changed
//! for daylight saving is defined here, and it is the same rule for every
//! zone:
//!
//! * a window starts at its wall-clock time on each of its days, and lasts
//!   its duration of *elapsed* time: a `02:00/3h` window is three real
//!   hours long on the nights the clocks change too;
//! * a start that does not exist (the clocks jump from 02:00 to 03:00 and
//!   the window starts at 02:30) is the instant of the jump, so the window
//!   still opens that day;
//! * a start that exists twice (the clocks go back from 03:00 to 02:00) is
//!   the first of the two instants: the window opens once.
//!
//! This module computes only: whether an instant is inside a window, and
//! when the current or next one opens and closes. It never reads the
//! clock and never decides what a window allows; the zone is given as the
//! offset from UTC at an instant ([`Zone`]), so the rules above are tested
//! with zones of any shape, and the system's zone is a thin call into libc.

use std::time::Duration;

use crate::timestamp::{Timestamp, parse_duration};

const DAY: i64 = 86_400;
/// The longest window: a week (a longer one would always be open).
const MAX_LENGTH: Duration = Duration::from_secs(7 * 86_400);
const DAY_NAMES: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// The offset of a zone from UTC, in seconds east, at an instant.
pub trait Zone {
    fn offset_at(&self, t: i64) -> i64;
}

/// UTC.
pub struct Utc;

impl Zone for Utc {
    fn offset_at(&self, _t: i64) -> i64 {
        0
    }
}

/// The system's local zone, through libc (`TZ`, else `/etc/localtime`).
pub struct Local;

impl Local {
    /// Read the zone again (`tzset`), so a changed `/etc/localtime` or a
    /// new zone file after a tzdata update counts from the next call on.
    pub fn refresh() {
        unsafe extern "C" {
            // POSIX; not bound by the libc crate.
            fn tzset();
        }
        // SAFETY: tzset takes no arguments and only updates libc's own
        // zone state; updraft does not change TZ while running.
        unsafe { tzset() };
    }
}

impl Zone for Local {
    fn offset_at(&self, t: i64) -> i64 {
        let time = t as libc::time_t;
        // SAFETY: an all-zero `tm` is a valid value to be overwritten;
        // localtime_r writes only into it and reads only `time`.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        let ok = unsafe { !libc::localtime_r(&time, &mut tm).is_null() };
        if ok { tm.tm_gmtoff as i64 } else { 0 }
    }
}

/// One weekly window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Bit `d` set: the window starts on day `d` (0 = Monday).
    days: u8,
    /// Start, seconds after midnight on the wall clock.
    start: i64,
    length: Duration,
    utc: bool,
}

/// A window open now or coming: when it opens and when it closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub opens: Timestamp,
    pub closes: Timestamp,
}

impl Window {
    /// Parse `"Mon-Fri 02:00/3h"`, `"Sat,Sun 00:00/8h UTC"`.
    pub fn parse(text: &str) -> Result<Window, String> {
        let bad = |why: String| {
            Err(format!(
                "{text:?}: {why} (expected e.g. \"Mon-Fri 02:00/3h\" or \"Sat,Sun 00:00/8h UTC\")"
            ))
        };
        let mut words = text.split_whitespace();
        let (Some(days), Some(when)) = (words.next(), words.next()) else {
            return bad("needs days and a start/duration".into());
        };
        let utc = match words.next() {
            None => false,
            Some("UTC") => true,
            Some(other) => {
                return bad(format!("{other:?} after the duration: only UTC may follow"));
            }
        };
        if words.next().is_some() {
            return bad("too many words".into());
        }
        let days = match parse_days(days) {
            Ok(d) => d,
            Err(why) => return bad(why),
        };
        let Some((start, length)) = when.split_once('/') else {
            return bad(format!("{when:?} has no /duration"));
        };
        let start = match parse_clock(start) {
            Some(s) => s,
            None => return bad(format!("{start:?} is not a time HH:MM from 00:00 to 23:59")),
        };
        let length = match parse_duration(length) {
            Ok(d) => d,
            Err(e) => return bad(e.to_string()),
        };
        if length < Duration::from_secs(60) || length > MAX_LENGTH {
            return bad("the duration must be from 1m to 7d".into());
        }
        Ok(Window {
            days,
            start,
            length,
            utc,
        })
    }

    /// Occurrences that start from a week and a day before `t` to a week
    /// and a day after it, in order.
    fn spans_around(&self, t: i64, zone: &dyn Zone) -> Vec<Span> {
        let today = (t + zone.offset_at(t)).div_euclid(DAY);
        let mut out = Vec::new();
        for day in today - 8..=today + 8 {
            // 1970-01-01 was a Thursday (3, counting Monday as 0).
            let weekday = (day + 3).rem_euclid(7);
            if self.days & (1 << weekday) == 0 {
                continue;
            }
            let opens = instant_of(day * DAY + self.start, zone);
            out.push(Span {
                opens: Timestamp(opens),
                closes: Timestamp(opens.saturating_add(self.length.as_secs() as i64)),
            });
        }
        out
    }
}

/// The instant a wall-clock time (seconds since the epoch, as if it were
/// UTC) stands for in `zone`: the earlier one when it exists twice, the end
/// of the jump when it does not exist.
fn instant_of(wall: i64, zone: &dyn Zone) -> i64 {
    // Every transition is less than a day away from these two probes'
    // offsets: before and after any change near `wall`.
    let before = zone.offset_at(wall - DAY);
    let after = zone.offset_at(wall + DAY);
    let earliest = [before, after]
        .into_iter()
        .map(|o| wall - o)
        .filter(|&t| wall - zone.offset_at(t) == t)
        .min();
    if let Some(t) = earliest {
        return t;
    }
    // A gap: find the first instant with the later offset between the two
    // candidates (the transition).
    let (mut lo, mut hi) = {
        let (a, b) = (wall - before, wall - after);
        (a.min(b), a.max(b))
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if zone.offset_at(mid) == zone.offset_at(lo) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

fn parse_days(text: &str) -> Result<u8, String> {
    let day = |name: &str| {
        DAY_NAMES
            .iter()
            .position(|d| *d == name)
            .ok_or_else(|| format!("{name:?} is not a day (Mon, Tue, Wed, Thu, Fri, Sat, Sun)"))
    };
    let mut days = 0u8;
    for part in text.split(',') {
        match part.split_once('-') {
            Some((from, to)) => {
                let (from, to) = (day(from)?, day(to)?);
                let mut d = from;
                loop {
                    days |= 1 << d;
                    if d == to {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => days |= 1 << day(part)?,
        }
    }
    Ok(days)
}

/// `HH:MM` → seconds after midnight.
fn parse_clock(text: &str) -> Option<i64> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let h: i64 = h.parse().ok()?;
    let m: i64 = m.parse().ok()?;
    (h < 24 && m < 60 && text.bytes().all(|b| b.is_ascii_digit() || b == b':'))
        .then_some(h * 3600 + m * 60)
}

/// A set of windows; empty means "no window is ever open".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Windows(pub Vec<Window>);

impl Windows {
    /// The window open at `now` (the one closing last when several
    /// overlap), or else the next one to open; `None` without windows.
    pub fn current_or_next(&self, now: Timestamp, local: &dyn Zone) -> Option<Span> {
        let mut open: Option<Span> = None;
        let mut next: Option<Span> = None;
        for w in &self.0 {
            let zone: &dyn Zone = if w.utc { &Utc } else { local };
            for s in w.spans_around(now.0, zone) {
                if s.opens <= now && now < s.closes {
                    if open.is_none_or(|o| s.closes > o.closes) {
                        open = Some(s);
                    }
                } else if s.opens > now && next.is_none_or(|n| s.opens < n.opens) {
                    next = Some(s);
                }
            }
        }
        open.or(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Central European time: +1 h, +2 h from the last Sunday of March
    /// 01:00 UTC to the last Sunday of October 01:00 UTC (2026: 29 March
    /// and 25 October).
    struct Berlin;
    const SPRING: i64 = 1_774_746_000; // 2026-03-29T01:00:00Z
    const AUTUMN: i64 = 1_792_890_000; // 2026-10-25T01:00:00Z

    impl Zone for Berlin {
        fn offset_at(&self, t: i64) -> i64 {
            if (SPRING..AUTUMN).contains(&t) {
                7200
            } else {
                3600
            }
        }
    }

    fn at(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).unwrap()
    }

    /// How long the window open at `now` stays open; `None` when none is.
    fn open_for(w: &Windows, now: Timestamp) -> Option<Duration> {
        let s = w.current_or_next(now, &Utc)?;
        (s.opens <= now).then(|| Duration::from_secs((s.closes.0 - now.0).max(0) as u64))
    }

    fn windows(list: &[&str]) -> Windows {
        Windows(list.iter().map(|w| Window::parse(w).unwrap()).collect())
    }

    #[test]
    fn windows_are_parsed_with_day_ranges_lists_and_utc() {
        let w = Window::parse("Mon-Fri 02:00/3h").unwrap();
        assert_eq!((w.days, w.start, w.utc), (0b0001_1111, 7200, false));
        assert_eq!(w.length, Duration::from_secs(3 * 3600));
        let w = Window::parse("Sat,Sun 00:00/8h UTC").unwrap();
        assert_eq!((w.days, w.utc), (0b0110_0000, true));
        let w = Window::parse("Fri-Mon 23:30/90m").unwrap();
        assert_eq!(w.days, 0b0111_0001);
        assert_eq!(w.start, 23 * 3600 + 1800);
    }

    #[test]
    fn malformed_windows_are_refused_with_the_reason() {
        for (text, why) in [
            ("", "needs days and a start/duration"),
            ("Mon", "needs days and a start/duration"),
            ("Monday 02:00/3h", "\"Monday\" is not a day"),
            ("mon 02:00/3h", "\"mon\" is not a day"),
            ("Mon-Xyz 02:00/3h", "\"Xyz\" is not a day"),
            ("Mon 02:00", "has no /duration"),
            ("Mon 24:00/3h", "is not a time HH:MM"),
            ("Mon 2:00/3h", "is not a time HH:MM"),
            ("Mon 02:60/3h", "is not a time HH:MM"),
            ("Mon 02:00/3", "not a duration"),
            ("Mon 02:00/30s", "from 1m to 7d"),
            ("Mon 02:00/8d", "from 1m to 7d"),
            ("Mon 02:00/3h CET", "only UTC may follow"),
            ("Mon 02:00/3h UTC x", "too many words"),
        ] {
            let e = Window::parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
            assert!(e.contains("expected e.g."), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_window_is_open_from_its_start_for_its_length() {
        let w = windows(&["Mon-Fri 02:00/3h UTC"]);
        // 2026-12-02 is a Wednesday.
        let open = w.current_or_next(at("2026-12-02T03:00:00Z"), &Utc).unwrap();
        assert_eq!(open.opens, at("2026-12-02T02:00:00Z"));
        assert_eq!(open.closes, at("2026-12-02T05:00:00Z"));
        assert_eq!(
            open_for(&w, at("2026-12-02T03:00:00Z")),
            Some(Duration::from_secs(7200))
        );
        // Closed at its end; the next opens on Thursday.
        assert_eq!(open_for(&w, at("2026-12-02T05:00:00Z")), None);
        let next = w.current_or_next(at("2026-12-02T05:00:00Z"), &Utc).unwrap();
        assert_eq!(next.opens, at("2026-12-03T02:00:00Z"));
        // Friday evening: the next is Monday.
        let next = w.current_or_next(at("2026-12-04T06:00:00Z"), &Utc).unwrap();
        assert_eq!(next.opens, at("2026-12-07T02:00:00Z"));
    }

    #[test]
    fn a_window_past_midnight_is_open_on_the_next_day() {
        let w = windows(&["Sun 22:00/4h UTC"]);
        // Monday 2026-12-07 01:00 is inside Sunday's window.
        let s = w.current_or_next(at("2026-12-07T01:00:00Z"), &Utc).unwrap();
        assert_eq!(
            (s.opens, s.closes),
            (at("2026-12-06T22:00:00Z"), at("2026-12-07T02:00:00Z"))
        );
    }

    #[test]
    fn overlapping_windows_are_a_union() {
        let w = windows(&["Wed 02:00/2h UTC", "Wed 03:00/3h UTC"]);
        assert_eq!(
            open_for(&w, at("2026-12-02T03:30:00Z")),
            Some(Duration::from_secs(9000))
        );
        assert_eq!(
            Windows::default().current_or_next(at("2026-12-02T03:30:00Z"), &Utc),
            None
        );
    }

    #[test]
    fn local_windows_follow_the_zone_offset() {
        let w = windows(&["Wed 02:00/3h"]);
        // Winter, +1 h: 02:00 local is 01:00 UTC.
        let s = w
            .current_or_next(at("2026-12-01T12:00:00Z"), &Berlin)
            .unwrap();
        assert_eq!(s.opens, at("2026-12-02T01:00:00Z"));
        // Summer, +2 h: 00:00 UTC.
        let s = w
            .current_or_next(at("2026-07-01T12:00:00Z"), &Berlin)
            .unwrap();
        assert_eq!(s.opens, at("2026-07-08T00:00:00Z"));
    }

    #[test]
    fn a_start_inside_the_spring_forward_gap_opens_at_the_jump() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST at 01:00 UTC; 02:30
        // does not exist that night.
        let w = windows(&["Sun 02:30/3h"]);
        let s = w
            .current_or_next(at("2026-03-28T12:00:00Z"), &Berlin)
            .unwrap();
        assert_eq!(s.opens, at("2026-03-29T01:00:00Z"));
        // Three elapsed hours: until 07:00 CEST.
        assert_eq!(s.closes, at("2026-03-29T04:00:00Z"));
        // A start just after the gap is unaffected; one before it too.
        let s = windows(&["Sun 03:00/1h"])
            .current_or_next(at("2026-03-28T12:00:00Z"), &Berlin)
            .unwrap();
        assert_eq!(s.opens, at("2026-03-29T01:00:00Z"));
        let s = windows(&["Sun 01:30/1h"])
            .current_or_next(at("2026-03-28T12:00:00Z"), &Berlin)
            .unwrap();
        assert_eq!(s.opens, at("2026-03-29T00:30:00Z"));
    }

    #[test]
    fn a_start_in_the_repeated_autumn_hour_opens_once_at_the_first() {
        // 2026-10-25: 03:00 CEST goes back to 02:00 CET at 01:00 UTC; 02:30
        // happens at 00:30 UTC and again at 01:30 UTC.
        let w = windows(&["Sun 02:30/1h"]);
        let s = w
            .current_or_next(at("2026-10-24T12:00:00Z"), &Berlin)
            .unwrap();
        assert_eq!(s.opens, at("2026-10-25T00:30:00Z"));
        assert_eq!(s.closes, at("2026-10-25T01:30:00Z"));
        // At the second 02:30 it is closed, and the next is a week later.
        let next = w
            .current_or_next(at("2026-10-25T01:30:00Z"), &Berlin)
            .unwrap();
        assert_eq!(next.opens, at("2026-11-01T01:30:00Z"));
    }

    #[test]
    fn utc_windows_ignore_the_local_zone() {
        let w = windows(&["Sun 02:30/1h UTC"]);
        let s = w
            .current_or_next(at("2026-03-28T12:00:00Z"), &Berlin)
            .unwrap();
        assert_eq!(s.opens, at("2026-03-29T02:30:00Z"));
    }
}
