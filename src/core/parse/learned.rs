//! A limit stated in an error body (SPEC §7): in words, or by a quota id.
use super::{cached, head};
use crate::core::limits::{classic_name, Metric, WindowSpec, DAY, MINUTE};
use crate::core::providers::{quota_id_pattern, stated_quota_value};
use regex::Regex;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// The window a provider-stated limit belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitAxis {
    Tpd,
    Tpm,
    Rpd,
    Rpm,
    /// A key concurrency cap, learned from a concurrency failure (SPEC 15.4), never
    /// from a message's axis (not in [`LimitAxis::ALL`]).
    Concurrency,
}

impl LimitAxis {
    /// Every axis, in the order [`parse_provider_limit`] tries them.
    pub const ALL: [LimitAxis; 4] = [LimitAxis::Tpd, LimitAxis::Tpm, LimitAxis::Rpd, LimitAxis::Rpm];

    /// The classic window the axis tightens: its metric per its window (a concurrency
    /// cap has none).
    pub fn window(self) -> Option<(Metric, WindowSpec)> {
        match self {
            LimitAxis::Tpd => Some((Metric::Tokens, DAY)),
            LimitAxis::Tpm => Some((Metric::Tokens, MINUTE)),
            LimitAxis::Rpd => Some((Metric::Requests, DAY)),
            LimitAxis::Rpm => Some((Metric::Requests, MINUTE)),
            LimitAxis::Concurrency => None,
        }
    }

    /// The name of the classic limit it tightens (`"concurrency"` for a concurrency cap).
    pub fn as_str(self) -> &'static str {
        self.window().and_then(|(metric, window)| classic_name(metric, window)).unwrap_or("concurrency")
    }
}

impl fmt::Display for LimitAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LimitAxis {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LimitAxis::ALL.into_iter().find(|axis| axis.as_str() == s).ok_or_else(|| {
            let names = LimitAxis::ALL.map(LimitAxis::as_str);
            format!(
                "unknown limit kind {s:?}; expected {}, {}, {} or {}",
                names[0], names[1], names[2], names[3]
            )
        })
    }
}

/// A limit a provider stated in an error body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LearnedLimit {
    pub kind: LimitAxis,
    pub limit: i64,
}

/// Learns a real limit from an error body (SPEC §7).
///
/// Needs BOTH a number after the word "limit" (`Limit 30000`, `limit: 1,000`,
/// `limit of 50`; thousands separators allowed; > 0 and within i64) AND a
/// confident axis: "tokens per day"/TPD, "tokens per minute"/TPM, "requests per
/// day"/RPD, "requests per minute"/RPM (case-insensitive, whole words; spaces,
/// `_` or `-` between the words), tried in exactly that order: the first axis
/// named anywhere in the message wins. The first well-formed number after
/// "limit" is the limit (`limit 30k` or `limit 1.5` are not well-formed and are
/// skipped). Otherwise `None`.
///
/// SPEC §15.3: a CamelCase quota id counts as an axis too (`Requests`, later
/// `PerDay`, is RPD; `Tokens` ... `PerMinute` is TPM), and the number may come from
/// the JSON details' `"quotaValue": "N"` when no "limit" states one (both read by
/// the provider that sends them, `core::providers`).
pub fn parse_provider_limit(message: Option<&str>) -> Option<LearnedLimit> {
    let message = head(message?);
    let limit = stated_limit(message).or_else(|| stated_quota_value(message))?;
    let kind =
        LimitAxis::ALL.into_iter().find(|axis| axis_regex(*axis).is_some_and(|re| re.is_match(message)))?;
    Some(LearnedLimit { kind, limit })
}

/// The first well-formed number after the word "limit", if it is > 0 and
/// fits in i64.
pub(super) fn stated_limit(message: &str) -> Option<i64> {
    static LIMIT: OnceLock<Option<Regex>> = OnceLock::new();
    let re = cached(&LIMIT, r"(?i)\blimit\b(?:\s*(?:[:=]|of\b|is\b))?\s*([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)")?;
    for caps in re.captures_iter(message) {
        let Some(number) = caps.get(1) else { continue };
        let after = message.get(number.end()..).unwrap_or_default();
        let mut next = after.chars();
        let malformed = match next.next() {
            Some(c) if c.is_alphanumeric() => true, // "30k", "1,0000"
            Some('.' | ',') => next.next().is_some_and(|c| c.is_ascii_digit()), // "1.5", "6000,123"
            _ => false,
        };
        if malformed {
            continue;
        }
        let digits: String = number.as_str().chars().filter(char::is_ascii_digit).collect();
        return digits.parse::<i64>().ok().filter(|n| *n > 0);
    }
    None
}

pub(super) fn axis_regex(axis: LimitAxis) -> Option<&'static Regex> {
    static TPD: OnceLock<Option<Regex>> = OnceLock::new();
    static TPM: OnceLock<Option<Regex>> = OnceLock::new();
    static RPD: OnceLock<Option<Regex>> = OnceLock::new();
    static RPM: OnceLock<Option<Regex>> = OnceLock::new();
    // Word boundaries are "not an ASCII letter or digit", so `tpm_limit` and
    // `(TPM)` count while `rpms` or `xtpd` do not.
    const L: &str = r"(?:^|[^a-zA-Z0-9])";
    const R: &str = r"(?:$|[^a-zA-Z0-9])";
    const SEP: &str = r"[\s_-]+";
    let cell = match axis {
        LimitAxis::Tpd => &TPD,
        LimitAxis::Tpm => &TPM,
        LimitAxis::Rpd => &RPD,
        LimitAxis::Rpm => &RPM,
        LimitAxis::Concurrency => return None,
    };
    // The words for its metric and window, and its classic name as an abbreviation.
    let (metric, window) = axis.window()?;
    let noun = if metric == Metric::Tokens { "tokens?" } else { "requests?" };
    let period = if window == MINUTE { "minute" } else { "day" };
    let abbr = axis.as_str();
    // A quota id: the noun, and later in the same identifier `Per<Period>`.
    let camel = quota_id_pattern(noun, period);
    cached(cell, &format!(r"(?i)(?:{L}(?:{noun}{SEP}per{SEP}{period}|{abbr}){R}|{camel})"))
}
