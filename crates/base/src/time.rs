//! Wall-clock time as RFC 3339 text, without a date library.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time since the epoch; a clock before 1970 counts as the epoch.
pub fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `2026-11-30T17:06:45.123456Z` for a duration since the epoch.
/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    now().as_millis() as u64
}

/// An age as a person reads it in a column: `42s`, `17m`, `5h`, `3d`
/// (whole units, rounded down; the unit changes at twice its size).
pub fn human_age(d: Duration) -> String {
    match d.as_secs() {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

pub fn rfc3339(t: Duration) -> String {
    let secs = t.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        t.subsec_micros()
    )
}

/// Parses the UTC form `rfc3339` writes (fraction optional, `Z` required).
pub fn parse_rfc3339(s: &str) -> Option<Duration> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let rest = &s[19..];
    let (frac, z) = match rest.strip_prefix('.') {
        Some(f) => {
            let end = f.find('Z')?;
            (&f[..end], &f[end..])
        }
        None => ("", rest),
    };
    if z != "Z" || frac.len() > 9 || !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nanos = if frac.is_empty() {
        0
    } else {
        frac.parse::<u32>().ok()? * 10u32.pow(9 - frac.len() as u32)
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    if secs < 0 {
        return None;
    }
    Some(Duration::new(secs as u64, nanos))
}

// Howard Hinnant's algorithms, proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_and_parse_back() {
        assert_eq!(
            rfc3339(Duration::from_secs(0)),
            "1970-01-01T00:00:00.000000Z"
        );
        let t = Duration::new(1_796_058_405, 123_456_000);
        let s = rfc3339(t);
        assert_eq!(s, "2026-11-30T17:06:45.123456Z");
        assert_eq!(parse_rfc3339(&s), Some(t));
        assert_eq!(
            rfc3339(Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000000Z"
        );
    }

    #[test]
    fn rejects_non_utc_and_garbage() {
        assert_eq!(parse_rfc3339("2026-11-30T17:06:45+01:00"), None);
        assert_eq!(parse_rfc3339("2026-13-30T17:06:45Z"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert!(parse_rfc3339("2026-11-30T17:06:45Z").is_some());
    }
}
