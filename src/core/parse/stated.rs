//! A retry delay stated in an error body (SPEC §6.2): a phrase or a field.
use super::{cached, clamp_ms, head};
use regex::Regex;
use std::sync::OnceLock;

/// Parses a retry delay stated in an error body (SPEC §6.2).
///
/// Two shapes are recognised:
/// * a retry phrase ("try again in", "try again after", "retry in",
///   "retry after", "retrying in") directly followed by a duration with a
///   unit: `7.66s`, `30 seconds`, `2m`, `250ms`, a compound `1m26.4s`;
///   units are ms, s, sec(s), second(s), m, min(s), minute(s), h, hr(s),
///   hour(s), case-insensitive;
/// * a `retryDelay` / `retry_after` / `retry-after` field (JSON, Python or
///   header style, quotes optional, escaped quotes allowed) holding a duration
///   like `"17s"` or a bare number, which means seconds (milliseconds for a
///   `..._ms` / `...Ms` field).
///
/// Phrases are tried before fields. A bare number without such a phrase or
/// field is never a delay. The result is rounded to the nearest millisecond
/// and clamped to 24 h; `None` when nothing is stated.
pub fn parse_stated_retry_ms(message: Option<&str>) -> Option<i64> {
    static PHRASE: OnceLock<Option<Regex>> = OnceLock::new();
    static FIELD: OnceLock<Option<Regex>> = OnceLock::new();
    let message = head(message?);
    let phrase = cached(&PHRASE, r"(?i)\b(?:try\s+again|retry(?:ing)?)\s+(?:in|after)\b[\s:]*")?;
    for m in phrase.find_iter(message) {
        let tail = message.get(m.end()..).unwrap_or_default();
        if let Some(ms) = parse_duration_ms(tail, None) {
            return Some(clamp_ms(ms));
        }
    }
    let field = cached(
        &FIELD,
        r#"(?i)\bretry[_-]?(?:delay|after)(?:[_-]?(ms|millis|milliseconds|secs|seconds))?\\?["']?\s*[:=]\s*\\?["']?"#,
    )?;
    for caps in field.captures_iter(message) {
        let Some(whole) = caps.get(0) else { continue };
        let default_unit_ms = match caps.get(1).map(|s| s.as_str().to_ascii_lowercase()) {
            Some(suffix) if suffix.starts_with('m') => 1.0,
            _ => 1000.0,
        };
        let tail = message.get(whole.end()..).unwrap_or_default();
        if let Some(ms) = parse_duration_ms(tail, Some(default_unit_ms)) {
            return Some(clamp_ms(ms));
        }
    }
    None
}

/// Milliseconds in one of the units a duration may use.
fn unit_ms(unit: &str) -> Option<f64> {
    let unit = unit.to_ascii_lowercase();
    let ms = match unit.as_str() {
        "ms" | "msec" | "msecs" | "millis" | "millisecond" | "milliseconds" => 1.0,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
        _ => return None,
    };
    Some(ms)
}

/// Reads a duration at the start of `text` (leading whitespace allowed): one
/// or more `number unit` parts (`1m26.4s`, `2 minutes 30 seconds`, `1 minute
/// and 30 seconds`). With `default_unit_ms`, a lone number without a unit is
/// accepted and counts in that unit. A unit must not run on into a word
/// ("5 months" is no duration).
fn parse_duration_ms(text: &str, default_unit_ms: Option<f64>) -> Option<f64> {
    static FIRST: OnceLock<Option<Regex>> = OnceLock::new();
    static NEXT: OnceLock<Option<Regex>> = OnceLock::new();
    const PART: &str = r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(milliseconds?|millis|msecs?|ms|minutes?|mins?|m|hours?|hrs?|h|seconds?|secs?|s)?";
    let first = cached(&FIRST, &format!(r"(?i)^\s*{PART}"))?;
    let next = cached(&NEXT, &format!(r"(?i)^(?:\s*,?\s*and\s+|\s*,\s*|\s*){PART}"))?;

    let runs_on = |rest: &str| rest.chars().next().is_some_and(char::is_alphabetic);
    let mut total = 0.0f64;
    let mut rest = text;
    let mut parts = 0usize;
    loop {
        let re = if parts == 0 { first } else { next };
        let Some(caps) = re.captures(rest) else { break };
        let (Some(whole), Some(number)) = (caps.get(0), caps.get(1)) else {
            break;
        };
        let after = rest.get(whole.end()..).unwrap_or_default();
        let Ok(value) = number.as_str().parse::<f64>() else {
            break;
        };
        let unit = match caps.get(2) {
            Some(unit) if !runs_on(after) => unit_ms(unit.as_str()),
            Some(_) => None,
            // A lone number: only as the whole value of a field.
            None if parts == 0 && !runs_on(after) && !after.starts_with('.') => default_unit_ms,
            None => None,
        };
        let Some(unit) = unit else { break };
        total += value * unit;
        parts += 1;
        rest = after;
        if caps.get(2).is_none() {
            break;
        }
    }
    (parts > 0).then_some(total)
}
