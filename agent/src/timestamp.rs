//! Wall-clock instants and human durations, without a date library.
//!
//! Signed metadata carries RFC 3339 times (`expires`, `issued`); the
//! configuration and the publisher take durations like `30m` or `30d`.
//! Both are parsed strictly here: a value that does not parse is an error
//! naming the text, never a silent default. Times are whole seconds since the
//! Unix epoch in UTC; sub-second precision is accepted and dropped.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Kind};
use crate::hash::truncate;

/// Seconds since 1970-01-01T00:00:00Z.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The system clock now. A clock before 1970 reads as the epoch; the
    /// clock-sanity check in `clock` rejects it anyway.
    pub fn now() -> Timestamp {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(d.as_secs() as i64),
            Err(_) => Timestamp(0),
        }
    }

    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(d.as_secs().min(i64::MAX as u64) as i64),
        )
    }

    /// Parse RFC 3339 (`2026-11-30T12:00:00Z`, `2026-11-30T13:00:00.5+01:00`).
    pub fn parse_rfc3339(s: &str) -> Result<Timestamp, Error> {
        parse_rfc3339(s).ok_or_else(|| {
            Error::new(
                Kind::Malformed,
                format!("{:?} is not an RFC 3339 time", truncate(s, 64)),
            )
        })
    }

    /// Format as RFC 3339 in UTC with a `Z` suffix.
    pub fn to_rfc3339(self) -> String {
        let days = self.0.div_euclid(86_400);
        let secs = self.0.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&s).map_err(serde::de::Error::custom)
    }
}

fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    let b = s.as_bytes();
    if b.len() < 20 || !b.is_ascii() {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let year = num(0..4)?;
    let month = num(5..7)?;
    let day = num(8..10)?;
    let hour = num(11..13)?;
    let minute = num(14..16)?;
    let second = num(17..19)?;
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let rb = rest.as_bytes();
            if rb.len() != 6 || !matches!(rb[0], b'+' | b'-') || rb[3] != b':' {
                return None;
            }
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            if oh > 23 || om > 59 {
                return None;
            }
            let off = oh * 3600 + om * 60;
            if rb[0] == b'-' { -off } else { off }
        }
    };
    // A leap second is folded onto the next second.
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(Timestamp(secs - offset))
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(y) => 29,
        _ => 28,
    }
}

// Howard Hinnant's days_from_civil / civil_from_days algorithms.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parse a duration such as `90s`, `30m`, `6h`, `30d`, `500ms` or a
/// combination like `1h30m`. A bare number is refused: the unit is never
/// guessed.
pub fn parse_duration(s: &str) -> Result<Duration, Error> {
    let bad = || {
        Error::new(
            Kind::Malformed,
            format!(
                "{:?} is not a duration (use e.g. 90s, 30m, 6h, 30d)",
                truncate(s, 64)
            ),
        )
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|c| c.is_ascii_alphabetic()).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms_per: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(ms_per)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    Ok(Duration::from_millis(total))
}

/// Format a duration the way [`parse_duration`] reads it, largest units
/// first (`1h30m`, `45s`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let mut secs = d.as_secs();
    let mut out = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        for (text, secs) in [
            ("1970-01-01T00:00:00Z", 0),
            ("2000-02-29T12:34:56Z", 951_827_696),
            ("2026-11-30T00:00:00Z", 1_795_996_800),
            ("1969-12-31T23:59:59Z", -1),
        ] {
            let t = Timestamp::parse_rfc3339(text).unwrap();
            assert_eq!(t.0, secs, "{text}");
            assert_eq!(t.to_rfc3339(), text);
        }
    }

    #[test]
    fn rfc3339_offsets_and_fractions() {
        let a = Timestamp::parse_rfc3339("2026-11-30T13:00:00.123+01:00").unwrap();
        let b = Timestamp::parse_rfc3339("2026-11-30T12:00:00Z").unwrap();
        assert_eq!(a, b);
        let c = Timestamp::parse_rfc3339("2026-11-30T07:00:00-05:00").unwrap();
        assert_eq!(c, b);
    }

    #[test]
    fn rfc3339_rejects_garbage() {
        for bad in [
            "",
            "2026-11-30",
            "2026-11-30T12:00:00",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-11-30T24:00:00Z",
            "2026-11-30T12:00:00+1:00",
            "2026-11-30T12:00:00.Z",
            "2026-11-30T12:00:00Zjunk",
            "+026-11-30T12:00:00Z",
            "２026-11-30T12:00:00Z",
        ] {
            assert!(Timestamp::parse_rfc3339(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        for bad in ["", "30", "m", "3x", "-1s", "1.5h", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
