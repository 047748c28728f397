//! Observed provider quota: parsing rate-limit response headers (SPEC §8.2).
//!
//! Pure: no clock (the caller passes `now_ms`), no I/O, and no input can make
//! a parser panic (checked arithmetic, no slicing off char boundaries).
//!
//! Header families, per metric, in order of preference: plain, windowed, anthropic,
//! bare (the table is at `core::providers::HeaderFamily`; each provider's file names
//! the families it sends).
//!
//! Anthropic meters input and output tokens apart (SPEC §14.4):
//! `anthropic-ratelimit-input-tokens-{..}` and `anthropic-ratelimit-output-tokens-{..}`
//! are metrics of their own, `input_tokens` and `output_tokens`.
//!
//! Choices where the SPEC leaves room:
//! * One family per metric: the first family in the table above with at least
//!   one known value supplies limit, remaining and reset together; values of
//!   different families (which may describe different windows) are never mixed.
//! * Other window suffixes (`-requests-minute`, `-tokens-day`, ...) are not read.
//! * A repeated header: the first value that parses wins.
//! * Counts (limit, remaining): ASCII digits with optional fraction, which is
//!   truncated (`"14400.0"` and `"14400.7"` read 14400); surrounding whitespace
//!   is ignored; signs, exponents, overflow of i64 and anything else are unknown.
//! * `retry-after`: delta seconds (fraction allowed) or an HTTP-date (IMF-fixdate,
//!   RFC 850, asctime); a past date gives 0; rounded to the nearest ms and
//!   clamped to `[0, 24 h]`. Only `retry-after` is read (not `retry-after-ms`).
//! * Reset values are not clamped: they are absolute times. A reset value that
//!   is not representable in i64 ms is unknown. An HTTP-date is also accepted
//!   as a reset value.

use crate::core::parse::{
    cached, days_from_civil, days_in_month, parse_http_date_ms, parse_plain_decimal, parse_retry_after_ms,
};
/// Where a quota header comes from (the table is at its definition).
use crate::core::providers::HeaderFamily as Family;
use regex::Regex;
use std::sync::OnceLock;

/// Largest millisecond amount computed in f64 that is accepted (keeps the
/// conversion to i64 exact-ish and far from overflow).
const MAX_MS_F64: f64 = 9.0e18;

/// What a header speaks of: the metrics of limits (SPEC §14.1).
pub use crate::core::limits::Metric;

const METRIC_COUNT: usize = Metric::ALL.len();

/// What one response's headers say about one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderQuota {
    pub metric: Metric,
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
    pub reset_at_ms: Option<i64>,
}

/// Parsed quota headers of one response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedHeaders {
    pub quotas: Vec<HeaderQuota>,
    pub retry_after_ms: Option<i64>,
}

// ---------------------------------------------------------------------------
// Header classification
// ---------------------------------------------------------------------------

const FAMILY_COUNT: usize = 4;

impl Family {
    fn index(self) -> usize {
        match self {
            Family::Plain => 0,
            Family::Windowed => 1,
            Family::Anthropic => 2,
            Family::Bare => 3,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Limit,
    Remaining,
    Reset,
}

fn field_of(word: &str) -> Option<Field> {
    match word {
        "limit" => Some(Field::Limit),
        "remaining" => Some(Field::Remaining),
        "reset" => Some(Field::Reset),
        _ => None,
    }
}

/// Classifies a trimmed, ASCII-lowercased header name.
fn classify(name: &str) -> Option<(Metric, Family, Field)> {
    if let Some(rest) = name.strip_prefix("x-ratelimit-") {
        if let Some(field) = field_of(rest) {
            return Some((Metric::Requests, Family::Bare, field));
        }
        let (word, target) = rest.split_once('-')?;
        let field = field_of(word)?;
        let (metric, family) = match target {
            "requests" => (Metric::Requests, Family::Plain),
            "tokens" => (Metric::Tokens, Family::Plain),
            "requests-day" => (Metric::Requests, Family::Windowed),
            "tokens-minute" => (Metric::Tokens, Family::Windowed),
            _ => return None,
        };
        return Some((metric, family, field));
    }
    let rest = name.strip_prefix("anthropic-ratelimit-")?;
    let (target, word) = rest.rsplit_once('-')?;
    let field = field_of(word)?;
    let (metric, family) = match target {
        "requests" => (Metric::Requests, Family::Anthropic),
        "tokens" => (Metric::Tokens, Family::Anthropic),
        "input-tokens" => (Metric::InputTokens, Family::Anthropic),
        "output-tokens" => (Metric::OutputTokens, Family::Anthropic),
        _ => return None,
    };
    Some((metric, family, field))
}

/// The family of a header name (any case, surrounding blanks ignored): what a
/// provider's tests check its `header_families` against.
#[cfg(test)]
pub(crate) fn family_of(name: &str) -> Option<Family> {
    classify(&name.trim().to_ascii_lowercase()).map(|(_, family, _)| family)
}

/// The values one family states for one metric.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    limit: Option<i64>,
    remaining: Option<i64>,
    reset_at_ms: Option<i64>,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset_at_ms.is_none()
    }

    /// Records `value` for `field` unless an earlier header already did.
    fn set(&mut self, field: Field, value: &str, now_ms: i64) {
        match field {
            Field::Limit if self.limit.is_none() => self.limit = parse_count(value),
            Field::Remaining if self.remaining.is_none() => self.remaining = parse_count(value),
            Field::Reset if self.reset_at_ms.is_none() => self.reset_at_ms = parse_reset_ms(value, now_ms),
            _ => {}
        }
    }
}

/// The slot that speaks for a metric: the first non-empty family in order.
fn choose(slots: &[Slot; FAMILY_COUNT]) -> Option<Slot> {
    let get = |family: Family| slots.get(family.index()).copied().unwrap_or_default();
    for family in [Family::Plain, Family::Windowed, Family::Anthropic] {
        let slot = get(family);
        if !slot.is_empty() {
            return Some(slot);
        }
    }
    Some(get(Family::Bare)).filter(|slot| !slot.is_empty())
}

/// SPEC §8.2: header names case-insensitive. Reads
///  - `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (the plain family)
///  - `x-ratelimit-{limit,remaining,reset}-requests-day` and
///    `x-ratelimit-{limit,remaining,reset}-tokens-minute` (windowed: metric requests / tokens)
///  - `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`, and
///    `anthropic-ratelimit-{input,output}-tokens-*` as metrics `input_tokens` and
///    `output_tokens`
///  - a bare `x-ratelimit-{limit,remaining,reset}` as metric requests
///  - `retry-after` (delta seconds or HTTP-date, clamped to [0, 24 h])
///
/// A metric appears in `quotas` only if at least one of limit/remaining/reset
/// is known for it; in the order requests, tokens, input, output. See the module docs for how
/// families are preferred and how values are read.
pub fn parse_quota_headers(headers: &[(String, String)], now_ms: i64) -> ParsedHeaders {
    let mut slots = [[Slot::default(); FAMILY_COUNT]; METRIC_COUNT];
    let mut retry_after_ms = None;
    for (name, value) in headers {
        let name = name.trim().to_ascii_lowercase();
        if name == "retry-after" {
            if retry_after_ms.is_none() {
                retry_after_ms = parse_retry_after_ms(Some(value), now_ms);
            }
            continue;
        }
        let Some((metric, family, field)) = classify(&name) else { continue };
        if let Some(slot) = slots.get_mut(metric as usize).and_then(|row| row.get_mut(family.index())) {
            slot.set(field, value, now_ms);
        }
    }
    let quotas = Metric::ALL
        .into_iter()
        .filter_map(|metric| {
            let slot = choose(slots.get(metric as usize)?)?;
            Some(HeaderQuota {
                metric,
                limit: slot.limit,
                remaining: slot.remaining,
                reset_at_ms: slot.reset_at_ms,
            })
        })
        .collect();
    ParsedHeaders { quotas, retry_after_ms }
}

// ---------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------

/// A non-negative count: ASCII digits, optionally `.` and more digits (the
/// fraction is truncated); surrounding whitespace ignored. Anything else, or a
/// value beyond i64, is `None`.
fn parse_count(value: &str) -> Option<i64> {
    let text = value.trim();
    let (int, frac) = match text.split_once('.') {
        Some((int, frac)) => (int, frac),
        None => (text, ""),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !all_digits(int) || !all_digits(frac) {
        return None;
    }
    int.parse::<i64>().ok()
}

/// A non-negative millisecond amount rounded to the nearest ms, or `None` if
/// it is not finite or too large for i64.
fn ms_from_f64(ms: f64) -> Option<i64> {
    let rounded = ms.round();
    if !(0.0..=MAX_MS_F64).contains(&rounded) {
        return None;
    }
    // In [0, 9e18]: in range for i64.
    Some(rounded as i64)
}

// ---------------------------------------------------------------------------
// Reset values
// ---------------------------------------------------------------------------

/// SPEC §8.2 reset value -> absolute epoch ms: epoch ms (> 1e12), epoch s
/// (> 1e9), RFC 3339 time (`"2026-01-01T12:00:30Z"`, fractional seconds and
/// offsets like `+02:00` allowed), a Go-style duration such as `"6m0s"`,
/// `"2m59.56s"`, `"1.5s"`, `"250ms"`, `"1h2m3s"` (units ns, us/µs, ms, s, m, h),
/// or plain seconds from now (`"30"`, `"0.5"`); also an HTTP-date. Surrounding
/// whitespace is ignored. Durations and seconds are relative to `now_ms`
/// (rounded to the nearest ms). Returns `None` for garbage, signs, and values
/// not representable in i64 ms. Never panics.
pub fn parse_reset_ms(value: &str, now_ms: i64) -> Option<i64> {
    let text = value.trim();
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        // Exact integer path (epoch ms must not lose precision).
        let n = text.parse::<i64>().ok()?;
        return if n > 1_000_000_000_000 {
            Some(n)
        } else if n > 1_000_000_000 {
            n.checked_mul(1000)
        } else {
            now_ms.checked_add(n.checked_mul(1000)?)
        };
    }
    if let Some(v) = parse_plain_decimal(text) {
        return if v > 1e12 {
            ms_from_f64(v)
        } else if v > 1e9 {
            ms_from_f64(v * 1000.0)
        } else {
            now_ms.checked_add(ms_from_f64(v * 1000.0)?)
        };
    }
    if let Some(at_ms) = parse_rfc3339_ms(text) {
        return Some(at_ms);
    }
    if let Some(ms) = parse_go_duration_ms(text) {
        return now_ms.checked_add(ms_from_f64(ms)?);
    }
    parse_http_date_ms(text, now_ms)
}

/// Milliseconds in one Go duration unit.
fn go_unit_ms(unit: &str) -> Option<f64> {
    let ms = match unit.to_ascii_lowercase().as_str() {
        "ns" => 1e-6,
        "us" | "µs" | "μs" => 1e-3,
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return None,
    };
    Some(ms)
}

/// A Go-style duration (`"1h2m3.5s"`): one or more `number unit` parts with
/// nothing between them; every part needs a unit. No sign.
fn parse_go_duration_ms(text: &str) -> Option<f64> {
    let is_number_char = |c: char| c.is_ascii_digit() || c == '.';
    let mut total = 0.0f64;
    let mut parts = 0usize;
    let mut rest = text;
    while !rest.is_empty() {
        // `find` returns char boundaries, so both splits are safe.
        let number_len = rest.find(|c: char| !is_number_char(c)).unwrap_or(rest.len());
        let (number, after) = rest.split_at_checked(number_len)?;
        let unit_len = after.find(is_number_char).unwrap_or(after.len());
        let (unit, next) = after.split_at_checked(unit_len)?;
        let value = parse_plain_decimal(number)?;
        total += value * go_unit_ms(unit)?;
        parts = parts.saturating_add(1);
        rest = next;
    }
    (parts > 0 && total.is_finite()).then_some(total)
}

/// Epoch ms of a validated UTC date and time (leap second 60 allowed).
fn civil_to_ms(year: i64, month: i64, day: i64, hour: i64, minute: i64, second: i64) -> Option<i64> {
    let valid = (0..=9999).contains(&year)
        && (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && (0..=23).contains(&hour)
        && (0..=59).contains(&minute)
        && (0..=60).contains(&second);
    if !valid {
        return None;
    }
    let seconds = days_from_civil(year, month, day)
        .checked_mul(86_400)?
        .checked_add(hour * 3_600 + minute * 60 + second)?;
    seconds.checked_mul(1000)
}

/// An RFC 3339 date-time (`T`, `t` or a space between date and time;
/// fraction of any length, rounded to the nearest ms; `Z` or `±HH:MM` /
/// `±HHMM`) as epoch ms.
fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    static RFC3339: OnceLock<Option<Regex>> = OnceLock::new();
    let re = cached(
        &RFC3339,
        r"(?i)^([0-9]{4})-([0-9]{2})-([0-9]{2})[t ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(z|([+-])([0-9]{2}):?([0-9]{2}))$",
    )?;
    let c = re.captures(text)?;
    let num = |i: usize| -> Option<i64> { c.get(i)?.as_str().parse::<i64>().ok() };
    let base = civil_to_ms(num(1)?, num(2)?, num(3)?, num(4)?, num(5)?, num(6)?)?;
    // Fraction: the first three digits are ms, the fourth rounds.
    let frac_ms = match c.get(7) {
        Some(frac) => {
            let digit = |i: usize| {
                i64::from(frac.as_str().as_bytes().get(i).and_then(|b| b.checked_sub(b'0')).unwrap_or(0))
            };
            digit(0) * 100 + digit(1) * 10 + digit(2) + i64::from(digit(3) >= 5)
        }
        None => 0,
    };
    let offset_ms = match c.get(9) {
        Some(sign) => {
            let (hours, minutes) = (num(10)?, num(11)?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            let ms = (hours * 60 + minutes) * 60_000;
            if sign.as_str() == "-" {
                -ms
            } else {
                ms
            }
        }
        None => 0,
    };
    base.checked_add(frac_ms)?.checked_sub(offset_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::DAY_MS;
    use proptest::prelude::*;

    /// 2026-01-01T12:00:00Z.
    const NOW: i64 = 1_767_268_800_000;

    fn hs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn q(
        metric: Metric, limit: Option<i64>, remaining: Option<i64>, reset_at_ms: Option<i64>,
    ) -> HeaderQuota {
        HeaderQuota { metric, limit, remaining, reset_at_ms }
    }

    #[test]
    fn every_regex_compiles() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_http_date_ms("Thu, 01 Jan 1970 00:00:00 GMT", 0), Some(0));
        assert_eq!(parse_http_date_ms("Thu Jan  1 00:00:00 1970", 0), Some(0));
        assert_eq!(civil_to_ms(2026, 1, 1, 12, 0, 0), Some(NOW));
    }

    #[test]
    fn anthropic() {
        let p = parse_quota_headers(
            &hs(&[
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "49"),
                ("anthropic-ratelimit-requests-reset", "2026-01-01T12:00:30Z"),
                ("anthropic-ratelimit-tokens-limit", "40000"),
                ("anthropic-ratelimit-tokens-remaining", "39000"),
                ("anthropic-ratelimit-tokens-reset", "2026-01-01T12:00:05Z"),
                ("anthropic-ratelimit-input-tokens-limit", "30000"),
                ("anthropic-ratelimit-input-tokens-remaining", "1"),
                ("anthropic-ratelimit-input-tokens-reset", "2026-01-01T12:00:09Z"),
                ("anthropic-ratelimit-output-tokens-limit", "8000"),
                ("anthropic-ratelimit-output-tokens-remaining", "8000"),
                ("anthropic-ratelimit-output-tokens-reset", "2026-01-01T12:00:01Z"),
                ("retry-after", "12"),
            ]),
            NOW,
        );
        assert_eq!(
            p,
            ParsedHeaders {
                quotas: vec![
                    q(Metric::Requests, Some(50), Some(49), Some(NOW + 30_000)),
                    q(Metric::Tokens, Some(40_000), Some(39_000), Some(NOW + 5_000)),
                    // Input and output apart (SPEC §14.4).
                    q(Metric::InputTokens, Some(30_000), Some(1), Some(NOW + 9_000)),
                    q(Metric::OutputTokens, Some(8_000), Some(8_000), Some(NOW + 1_000)),
                ],
                retry_after_ms: Some(12_000),
            }
        );
    }

    #[test]
    fn anthropic_input_and_output_stay_apart() {
        let p = parse_quota_headers(
            &hs(&[
                ("anthropic-ratelimit-input-tokens-limit", "30000"),
                ("anthropic-ratelimit-input-tokens-remaining", "29000"),
                ("anthropic-ratelimit-output-tokens-limit", "8000"),
                ("anthropic-ratelimit-output-tokens-remaining", "0"),
                ("anthropic-ratelimit-output-tokens-reset", "2026-01-01T12:00:01Z"),
            ]),
            NOW,
        );
        assert_eq!(
            p.quotas,
            vec![
                q(Metric::InputTokens, Some(30_000), Some(29_000), None),
                q(Metric::OutputTokens, Some(8_000), Some(0), Some(NOW + 1_000)),
            ]
        );
        let only_output = hs(&[("anthropic-ratelimit-output-tokens-remaining", "5")]);
        assert_eq!(
            parse_quota_headers(&only_output, NOW).quotas,
            vec![q(Metric::OutputTokens, None, Some(5), None)]
        );
    }

    #[test]
    fn names_are_case_insensitive_and_trimmed() {
        let p = parse_quota_headers(
            &hs(&[
                ("X-RateLimit-Limit-Requests", " 60 "),
                ("  x-ratelimit-REMAINING-requests ", "59"),
                ("X-RATELIMIT-RESET-TOKENS", " 6m0s "),
                ("Anthropic-RateLimit-Requests-Limit", "999"), // lower family: ignored
                ("Retry-After", " 3 "),
            ]),
            NOW,
        );
        assert_eq!(
            p.quotas,
            vec![
                q(Metric::Requests, Some(60), Some(59), None),
                q(Metric::Tokens, None, None, Some(NOW + 360_000)),
            ]
        );
        assert_eq!(p.retry_after_ms, Some(3_000));
    }

    #[test]
    fn no_quota_headers() {
        let p = parse_quota_headers(&[], NOW);
        assert_eq!(p, ParsedHeaders::default());
        let p = parse_quota_headers(
            &hs(&[
                ("content-type", "application/json"),
                ("x-request-id", "req_123"),
                ("x-ratelimit-limit-requests-minute", "5"), // window not read
                ("x-ratelimit-limit-images", "5"),
                ("x-ratelimit-", "5"),
                ("x-ratelimit-limit-", "5"),
                ("anthropic-ratelimit-requests", "5"),
                ("anthropic-ratelimit-images-limit", "5"),
            ]),
            NOW,
        );
        assert_eq!(p, ParsedHeaders::default());
        let p = parse_quota_headers(&hs(&[("retry-after", "30")]), NOW);
        assert_eq!(p, ParsedHeaders { quotas: vec![], retry_after_ms: Some(30_000) });
    }

    #[test]
    fn garbage_values_are_unknown() {
        let p = parse_quota_headers(
            &hs(&[
                ("x-ratelimit-limit-requests", "-1"),
                ("x-ratelimit-remaining-requests", "lots"),
                ("x-ratelimit-reset-requests", "soon"),
                ("x-ratelimit-limit-tokens", "1e5"),
                ("x-ratelimit-remaining-tokens", "-0"),
                ("x-ratelimit-reset-tokens", ""),
                ("retry-after", "later"),
            ]),
            NOW,
        );
        assert_eq!(p, ParsedHeaders::default());

        // A metric appears when any one value is known.
        let p = parse_quota_headers(
            &hs(&[("x-ratelimit-limit-tokens", "abc"), ("x-ratelimit-reset-tokens", "1s")]),
            NOW,
        );
        assert_eq!(p.quotas, vec![q(Metric::Tokens, None, None, Some(NOW + 1_000))]);
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("14400"), Some(14_400));
        assert_eq!(parse_count(" 14400.0 "), Some(14_400));
        assert_eq!(parse_count("14400.7"), Some(14_400));
        assert_eq!(parse_count("0"), Some(0));
        assert_eq!(parse_count("5."), Some(5));
        assert_eq!(parse_count("9223372036854775807"), Some(i64::MAX));
        for bad in ["", " ", "-1", "+1", "1e3", ".5", "1.2.3", "1,000", "12 34", "١٢", "NaN", "inf", "1.x"]
        {
            assert_eq!(parse_count(bad), None, "{bad:?}");
        }
        assert_eq!(parse_count("9223372036854775808"), None);
    }

    #[test]
    fn family_preference_never_mixes() {
        let p = parse_quota_headers(
            &hs(&[
                ("x-ratelimit-limit", "20"),
                ("x-ratelimit-remaining-requests-day", "100"),
                ("x-ratelimit-remaining-requests", "5"),
                ("x-ratelimit-limit-tokens-minute", "60000"),
            ]),
            NOW,
        );
        assert_eq!(
            p.quotas,
            vec![q(Metric::Requests, None, Some(5), None), q(Metric::Tokens, Some(60_000), None, None)]
        );
        // Windowed beats bare.
        let p = parse_quota_headers(
            &hs(&[("x-ratelimit-limit", "20"), ("x-ratelimit-limit-requests-day", "14400")]),
            NOW,
        );
        assert_eq!(p.quotas, vec![q(Metric::Requests, Some(14_400), None, None)]);
        // A family whose values are all garbage does not count.
        let p = parse_quota_headers(
            &hs(&[("x-ratelimit-limit-requests", "x"), ("x-ratelimit-limit", "20")]),
            NOW,
        );
        assert_eq!(p.quotas, vec![q(Metric::Requests, Some(20), None, None)]);
    }

    #[test]
    fn repeated_headers_first_parseable_wins() {
        let p = parse_quota_headers(
            &hs(&[
                ("x-ratelimit-limit-requests", "junk"),
                ("x-ratelimit-limit-requests", "60"),
                ("X-RateLimit-Limit-Requests", "70"),
                ("retry-after", "x"),
                ("retry-after", "4"),
                ("retry-after", "5"),
            ]),
            NOW,
        );
        assert_eq!(p.quotas, vec![q(Metric::Requests, Some(60), None, None)]);
        assert_eq!(p.retry_after_ms, Some(4_000));
    }

    #[test]
    fn reset_epoch_values() {
        assert_eq!(parse_reset_ms("1741305600000", NOW), Some(1_741_305_600_000));
        assert_eq!(parse_reset_ms("1741305600", NOW), Some(1_741_305_600_000));
        assert_eq!(parse_reset_ms(" 1741305600.5 ", NOW), Some(1_741_305_600_500));
        assert_eq!(parse_reset_ms("1741305600000.4", NOW), Some(1_741_305_600_000));
        // Thresholds are strict: exactly 1e9 is seconds from now.
        assert_eq!(parse_reset_ms("1000000000", 0), Some(1_000_000_000_000));
        assert_eq!(parse_reset_ms("1000000001", 0), Some(1_000_000_001_000));
        assert_eq!(parse_reset_ms("1000000000000", 0), Some(1_000_000_000_000_000));
        assert_eq!(parse_reset_ms("1000000000001", 0), Some(1_000_000_000_001));
        // Not representable.
        assert_eq!(parse_reset_ms("99999999999999999999", NOW), None);
        assert_eq!(parse_reset_ms("9999999999999999", NOW), Some(9_999_999_999_999_999)); // > 1e12: ms
        assert_eq!(parse_reset_ms(&"9".repeat(400), NOW), None);
        assert_eq!(parse_reset_ms(&format!("{}.5", "9".repeat(400)), NOW), None);
    }

    #[test]
    fn reset_plain_seconds() {
        assert_eq!(parse_reset_ms("30", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("0", NOW), Some(NOW));
        assert_eq!(parse_reset_ms("0.5", NOW), Some(NOW + 500));
        assert_eq!(parse_reset_ms(".25", NOW), Some(NOW + 250));
        assert_eq!(parse_reset_ms("0.0004", NOW), Some(NOW));
        assert_eq!(parse_reset_ms("0.0005", NOW), Some(NOW + 1));
        assert_eq!(parse_reset_ms("10", i64::MAX), None);
        assert_eq!(parse_reset_ms("10", i64::MIN), Some(i64::MIN + 10_000));
    }

    #[test]
    fn reset_go_durations() {
        let cases = [
            ("6m0s", 360_000),
            ("2m59.56s", 179_560),
            ("1.5s", 1_500),
            ("250ms", 250),
            ("1h2m3s", 3_723_000),
            ("7.66s", 7_660),
            ("1s", 1_000),
            ("1h", 3_600_000),
            ("1.s", 1_000),
            (".5s", 500),
            ("1500us", 2),
            ("1499µs", 1),
            ("2000000ns", 2),
            ("1m30s500ms", 90_500),
            ("6M0S", 360_000),
        ];
        for (text, delta) in cases {
            assert_eq!(parse_reset_ms(text, NOW), Some(NOW + delta), "{text:?}");
        }
        for bad in ["s", "5x", "1d", "1.2.3s", "-1s", "+1s", "1 s", "1m 2s", "m5", "5s5", "ms", "1e3s"] {
            assert_eq!(parse_reset_ms(bad, NOW), None, "{bad:?}");
        }
        assert_eq!(parse_reset_ms(&format!("{}h", "9".repeat(400)), NOW), None);
        assert_eq!(parse_reset_ms("99999999999999h", NOW), None);
    }

    #[test]
    fn reset_rfc3339() {
        assert_eq!(parse_reset_ms("2026-01-01T12:00:30Z", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("2026-01-01t12:00:30z", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("2026-01-01 12:00:30Z", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("2026-01-01T12:00:30.25Z", NOW), Some(NOW + 30_250));
        assert_eq!(parse_reset_ms("2026-01-01T12:00:30.1234Z", NOW), Some(NOW + 30_123));
        assert_eq!(parse_reset_ms("2026-01-01T12:00:30.1235Z", NOW), Some(NOW + 30_124));
        assert_eq!(parse_reset_ms("2026-01-01T12:00:30.9999999Z", NOW), Some(NOW + 31_000));
        assert_eq!(parse_reset_ms("2026-01-01T14:00:30+02:00", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("2026-01-01T07:30:30-04:30", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("2026-01-01T14:00:30+0200", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("2026-01-01T12:00:30+00:00", NOW), Some(NOW + 30_000));
        assert_eq!(parse_reset_ms("2024-02-29T00:00:00Z", NOW), Some(1_709_164_800_000));
        assert_eq!(parse_reset_ms("1969-12-31T23:59:59Z", NOW), Some(-1_000));
        for bad in [
            "2026-01-01T12:00:30",       // no offset
            "2026-02-29T00:00:00Z",      // not a leap year
            "2026-13-01T00:00:00Z",      // month
            "2026-01-01T24:00:00Z",      // hour
            "2026-01-01T12:60:00Z",      // minute
            "2026-01-01T12:00:61Z",      // second
            "2026-01-01T12:00:00+24:00", // offset hour
            "2026-01-01T12:00:00+02:60", // offset minute
            "2026-01-01",                // date only
            "2026-01-01T12:00:30.Z",     // empty fraction
            "２０２６-01-01T12:00:30Z",  // non-ASCII digits
        ] {
            assert_eq!(parse_reset_ms(bad, NOW), None, "{bad:?}");
        }
    }

    #[test]
    fn reset_http_date() {
        assert_eq!(parse_reset_ms("Thu, 01 Jan 2026 12:00:45 GMT", NOW), Some(NOW + 45_000));
    }

    #[test]
    fn reset_garbage() {
        for bad in ["", "   ", "soon", "never", "-5", "+5", "1e9", "inf", "NaN", "null", "💥", "1,5", "0x10"]
        {
            assert_eq!(parse_reset_ms(bad, NOW), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_formats() {
        let ra = |v: &str| parse_quota_headers(&hs(&[("retry-after", v)]), NOW).retry_after_ms;
        assert_eq!(ra("12"), Some(12_000));
        assert_eq!(ra("1.5"), Some(1_500));
        assert_eq!(ra("0"), Some(0));
        assert_eq!(ra("86401"), Some(DAY_MS));
        assert_eq!(ra(&"9".repeat(400)), Some(DAY_MS));
        assert_eq!(ra("Thu, 01 Jan 2026 12:00:45 GMT"), Some(45_000));
        assert_eq!(ra("Thursday, 01-Jan-26 12:00:45 GMT"), Some(45_000));
        assert_eq!(ra("Thu Jan  1 12:00:45 2026"), Some(45_000));
        assert_eq!(ra("Wed, 21 Oct 2015 07:28:00 GMT"), Some(0)); // past
        assert_eq!(ra("Fri, 01 Jan 2027 00:00:00 GMT"), Some(DAY_MS)); // clamped
        for bad in
            ["", "-1", "+1", "1e3", "soon", "2026-01-01T12:00:45Z", "5s", "Thu, 32 Jan 2026 12:00:45 GMT"]
        {
            assert_eq!(ra(bad), None, "{bad:?}");
        }
    }

    const KNOWN_NAMES: [&str; 22] = [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-limit-requests-day",
        "x-ratelimit-remaining-requests-day",
        "x-ratelimit-reset-requests-day",
        "x-ratelimit-limit-tokens-minute",
        "x-ratelimit-remaining-tokens-minute",
        "x-ratelimit-reset-tokens-minute",
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
        "Retry-After",
        "content-type",
    ];

    fn header_name() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(KNOWN_NAMES.to_vec()).prop_map(str::to_string),
            any::<String>(),
            "[xX]-[rR]ate[lL]imit-[a-z-]{0,20}",
        ]
    }

    fn header_value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[0-9. +-]{0,25}",
            "[0-9.]{0,6}[a-zµ]{0,3}[0-9.]{0,6}[a-zµ]{0,3}",
            "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?([Zz]|[+-][0-9]{2}:?[0-9]{2})",
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|n| n.to_string()),
        ]
    }

    proptest! {
        #[test]
        fn never_panics_and_counts_are_non_negative(
            headers in proptest::collection::vec((header_name(), header_value()), 0..12),
            now_ms in prop_oneof![any::<i64>(), 0i64..4_000_000_000_000],
        ) {
            let p = parse_quota_headers(&headers, now_ms);
            prop_assert!(p.quotas.len() <= METRIC_COUNT);
            // One quota per metric, in the order of `Metric::ALL`.
            let order: Vec<usize> = p.quotas.iter().map(|x| x.metric as usize).collect();
            prop_assert!(order.windows(2).all(|w| w[0] < w[1]), "{:?}", order);
            for quota in &p.quotas {
                prop_assert!(quota.limit.is_none_or(|v| v >= 0));
                prop_assert!(quota.remaining.is_none_or(|v| v >= 0));
                prop_assert!(
                    quota.limit.is_some() || quota.remaining.is_some() || quota.reset_at_ms.is_some()
                );
            }
            if let Some(ra) = p.retry_after_ms {
                prop_assert!((0..=DAY_MS).contains(&ra));
            }
        }

        #[test]
        fn reset_never_panics(value in header_value(), now_ms in any::<i64>()) {
            let _ = parse_reset_ms(&value, now_ms);
        }

        #[test]
        fn relative_seconds_round_trip(secs in 0u32..1_000_000, millis in 0u32..1000, now_ms in 0i64..4_000_000_000_000) {
            let text = format!("{secs}.{millis:03}");
            let expected = now_ms + i64::from(secs) * 1000 + i64::from(millis);
            prop_assert_eq!(parse_reset_ms(&text, now_ms), Some(expected));
            let go = format!("{}m{}.{:03}s", secs / 60, secs % 60, millis);
            prop_assert_eq!(parse_reset_ms(&go, now_ms), Some(expected));
        }
    }
}
