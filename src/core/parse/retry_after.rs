//! A `Retry-After` value (SPEC §6.2): delta-seconds or an HTTP date.
//! The plain decimal numbers in it are read here too.
use super::{clamp_ms, head, parse_http_date_ms};
use crate::core::clock::DAY_MS;

/// Parses a `Retry-After` value into a delay from `now_ms` (SPEC §6.2).
///
/// Accepts delta-seconds (`"30"`, `"1.5"`, surrounding whitespace ignored) and
/// HTTP-dates: IMF-fixdate (`"Wed, 21 Oct 2015 07:28:00 GMT"`), RFC 850
/// (`"Wednesday, 21-Oct-15 07:28:00 GMT"`) and asctime
/// (`"Wed Oct 21 07:28:00 2015"`). A date in the past gives 0. Results are
/// rounded to the nearest millisecond and clamped to `[0, 24 h]`. Signs,
/// exponents, `inf`/`nan`, empty text and anything else give `None`.
pub fn parse_retry_after_ms(value: Option<&str>, now_ms: i64) -> Option<i64> {
    let text = head(value?).trim();
    if text.is_empty() {
        return None;
    }
    if let Some(seconds) = parse_plain_decimal(text) {
        return Some(clamp_ms(seconds * 1000.0));
    }
    let at_ms = parse_http_date_ms(text, now_ms)?;
    Some(at_ms.saturating_sub(now_ms).clamp(0, DAY_MS))
}

/// `digits[.digits]` (or `.digits` / `digits.`), nothing else: no sign, no
/// exponent, no `inf`/`nan` text. The result is finite or +inf, never negative.
pub(crate) fn parse_plain_decimal(text: &str) -> Option<f64> {
    let mut dots = 0usize;
    let mut digits = 0usize;
    for c in text.chars() {
        match c {
            '0'..='9' => digits = digits.saturating_add(1),
            '.' => dots = dots.saturating_add(1),
            _ => return None,
        }
    }
    if digits == 0 || dots > 1 {
        return None;
    }
    // Only digits and one dot get here, so the value is >= 0; a huge digit
    // string becomes +inf, which `clamp_ms` turns into a day.
    text.parse::<f64>().ok().filter(|v| *v >= 0.0)
}
