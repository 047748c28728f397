//! Google (Gemini): one pool for the Cloud project (SPEC §8.1), days that start at
//! midnight Pacific time (SPEC §14.2), and an RPC error JSON whose `QuotaFailure`
//! names the quota by a CamelCase id (`GenerateRequestsPerDayPerProjectPerModel-FreeTier`)
//! and states its `quotaValue` (SPEC §15.3); its `RetryInfo.retryDelay` is read by
//! `parse`'s generic field reader. The corpus: `google/`.
use super::{generic, Pool, Provider};
use crate::core::text::{cached, parse_integer};
use regex::Regex;
use std::sync::OnceLock;

pub(super) const PROVIDER: Provider = Provider {
    name: "google",
    hosts: &["generativelanguage.googleapis.com"],
    // Gemini's daily quotas reset at midnight Pacific time.
    day_zone: "America/Los_Angeles",
    pool: Pool::Fixed("google::project"),
    ..generic::PROVIDER
};

/// SPEC §15.3: a quota id names an axis by its noun and, later in the same identifier,
/// `Per<Period>` (`Requests` ... `PerDay` is RPD; `Tokens` ... `PerMinute` is TPM). A
/// regex fragment, case-insensitive in use.
pub fn quota_id_pattern(noun: &str, period: &str) -> String {
    format!(r"{noun}[a-zA-Z0-9]*?per{period}")
}

/// The quota's `"quotaValue": "N"` (a JSON string or number), read whole (SPEC 24.6):
/// an integer > 0 within i64, else `None` (`"2e1"` or 20 digits teach nothing).
pub fn stated_quota_value(message: &str) -> Option<i64> {
    static VALUE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = cached(&VALUE, r#""quotaValue"\s*:\s*(?:"([^"]*)"|([^\s,}\]]*))"#)?;
    let caps = re.captures(message)?;
    parse_integer(caps.get(1).or_else(|| caps.get(2))?.as_str()).filter(|n| *n > 0)
}
