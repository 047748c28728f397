//! HTTP dates (IMF-fixdate, RFC 850, asctime) and the proleptic Gregorian
//! arithmetic they need; `headers` reads reset times with the same helpers.
use super::cached;
use crate::core::clock::DAY_MS;
use regex::Regex;
use std::sync::OnceLock;

/// `days_from_civil`). Valid for every year this module produces (1..=9999).
pub(crate) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = (month + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + day - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The Gregorian year that contains `ms` since the epoch (the inverse of
/// [`days_from_civil`], year part only).
pub(crate) fn year_of_ms(ms: i64) -> i64 {
    let z = ms.div_euclid(DAY_MS) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let year = yoe + era * 400;
    if mp >= 10 {
        year + 1 // January or February belong to the next civil year
    } else {
        year
    }
}

pub(crate) fn is_leap_year(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

pub(crate) fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(year) => 29,
        2 => 28,
        _ => 0,
    }
}

pub(crate) fn month_number(name: &str) -> Option<i64> {
    const MONTHS: [&str; 12] =
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
    let lower = name.to_ascii_lowercase();
    let index = MONTHS.iter().position(|m| *m == lower)?;
    i64::try_from(index).ok().map(|i| i + 1)
}

/// An HTTP-date (IMF-fixdate, RFC 850 or asctime) as ms since the epoch.
/// Two-digit RFC 850 years use RFC 9110's rule: a year more than 50 years
/// after `now_ms`'s year is taken from the previous century.
pub(crate) fn parse_http_date_ms(text: &str, now_ms: i64) -> Option<i64> {
    static IMF_OR_850: OnceLock<Option<Regex>> = OnceLock::new();
    static ASCTIME: OnceLock<Option<Regex>> = OnceLock::new();
    const WEEKDAY: &str = r"(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*";
    let imf = cached(
        &IMF_OR_850,
        &format!(
            r"(?i)^(?:{WEEKDAY}\s*,?\s*)?([0-9]{{1,2}})[\s-]+([a-z]{{3}})[\s-]+([0-9]{{4}}|[0-9]{{2}})\s+([0-9]{{1,2}}):([0-9]{{2}}):([0-9]{{2}})(?:\s*(?:gmt|utc|ut|z|[+-]0000))?$"
        ),
    )?;
    let asctime = cached(
        &ASCTIME,
        &format!(
            r"(?i)^(?:{WEEKDAY}\s*,?\s*)?([a-z]{{3}})\s+([0-9]{{1,2}})\s+([0-9]{{1,2}}):([0-9]{{2}}):([0-9]{{2}})\s+([0-9]{{4}})(?:\s*(?:gmt|utc|ut|z))?$"
        ),
    )?;

    let num =
        |caps: &regex::Captures<'_>, i: usize| -> Option<i64> { caps.get(i)?.as_str().parse::<i64>().ok() };
    let (year, month, day, hour, minute, second) = if let Some(c) = imf.captures(text) {
        let year_text = c.get(3)?.as_str();
        let mut year = num(&c, 3)?;
        if year_text.len() == 2 {
            let now_year = year_of_ms(now_ms);
            year += now_year.div_euclid(100) * 100;
            if year > now_year + 50 {
                year -= 100;
            }
        }
        let month = month_number(c.get(2)?.as_str())?;
        (year, month, num(&c, 1)?, num(&c, 4)?, num(&c, 5)?, num(&c, 6)?)
    } else if let Some(c) = asctime.captures(text) {
        let month = month_number(c.get(1)?.as_str())?;
        (num(&c, 6)?, month, num(&c, 2)?, num(&c, 3)?, num(&c, 4)?, num(&c, 5)?)
    } else {
        return None;
    };
    let valid = (1..=9999).contains(&year)
        && (1..=days_in_month(year, month)).contains(&day)
        && (0..=23).contains(&hour)
        && (0..=59).contains(&minute)
        && (0..=60).contains(&second); // 60: a leap second
    if !valid {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    seconds.checked_mul(1000)
}
