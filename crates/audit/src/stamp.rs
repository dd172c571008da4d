//! The time an event was made, as RFC 3339 text in UTC: byte for byte what jiff's
//! `Timestamp` display writes (`2026-11-27T10:14:01.123456789Z`, the fraction trimmed of
//! trailing zeros and left out when zero), written without `fmt`, since every request
//! stamps two events on a proxy worker (issue 32: 2% of a GET's CPU went to `fmt` here).

use std::time::{SystemTime, UNIX_EPOCH};

/// The time now.
pub(crate) fn now() -> String {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => rfc3339(d.as_secs(), d.subsec_nanos()),
        // A clock before 1970: not worth a fast path.
        Err(_) => jiff::Timestamp::now().to_string(),
    }
}

/// `secs` and `nanos` since the Unix epoch as RFC 3339 text in UTC.
fn rfc3339(secs: u64, nanos: u32) -> String {
    let days = secs / 86_400;
    let of_day = secs % 86_400;
    let (year, month, day) = civil(days);
    let mut text = String::with_capacity(30);
    push_digits(&mut text, year, 4);
    text.push('-');
    push_digits(&mut text, month, 2);
    text.push('-');
    push_digits(&mut text, day, 2);
    text.push('T');
    push_digits(&mut text, of_day / 3600, 2);
    text.push(':');
    push_digits(&mut text, of_day / 60 % 60, 2);
    text.push(':');
    push_digits(&mut text, of_day % 60, 2);
    if nanos > 0 {
        let mut fraction = u64::from(nanos);
        let mut width = 9;
        while fraction % 10 == 0 {
            fraction /= 10;
            width -= 1;
        }
        text.push('.');
        push_digits(&mut text, fraction, width);
    }
    text.push('Z');
    text
}

/// Year, month and day of the civil (proleptic Gregorian) calendar for `days` since
/// 1970-01-01 (Howard Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// `n` in decimal, zero-padded to `width` digits (more when it needs more).
fn push_digits(text: &mut String, n: u64, width: u32) {
    let mut digits = [b'0'; 20];
    let mut rest = n;
    let mut len = 0;
    while rest > 0 || len < width as usize {
        if let Some(d) = digits.get_mut(len) {
            *d = b'0' + (rest % 10) as u8;
        }
        rest /= 10;
        len += 1;
        if len >= digits.len() {
            break;
        }
    }
    for d in digits.iter().take(len).rev() {
        text.push(char::from(*d));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jiff_text(secs: u64, nanos: u32) -> String {
        jiff::Timestamp::new(secs as i64, nanos as i32)
            .unwrap()
            .to_string()
    }

    #[test]
    fn writes_what_jiff_writes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut cases = vec![(0, 0), (0, 1), (951_782_400, 0), (4_107_542_399, 999_999_999)];
        // Leap days, century years, year ends.
        for (secs, nanos) in [(68_169_600, 500), (946_684_799, 10), (1_709_164_800, 120_000_000)] {
            cases.push((secs, nanos));
        }
        for _ in 0..20_000 {
            let secs = next() % 253_402_207_200; // up to jiff's own last instant, 9999-12-30T22:00:00Z
            let nanos = match next() % 4 {
                0 => 0,
                1 => (next() % 1000) as u32 * 1_000_000,
                2 => (next() % 1_000_000) as u32 * 1000,
                _ => (next() % 1_000_000_000) as u32,
            };
            cases.push((secs, nanos));
        }
        for (secs, nanos) in cases {
            assert_eq!(rfc3339(secs, nanos), jiff_text(secs, nanos), "{secs}.{nanos}");
        }
    }

    #[test]
    fn now_reads_back_as_a_timestamp() {
        let text = now();
        let parsed: jiff::Timestamp = text.parse().unwrap();
        assert_eq!(parsed.to_string(), text);
    }
}
