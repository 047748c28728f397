//! Google (Gemini): one pool for the Cloud project (SPEC §8.1), days that start at
//! midnight Pacific time (SPEC §14.2), and an RPC error JSON whose `QuotaFailure`
//! names the quota by a CamelCase id (`GenerateRequestsPerDayPerProjectPerModel-FreeTier`)
//! and states its `quotaValue` (SPEC §15.3); its `RetryInfo.retryDelay` is read by
//! `parse`'s generic field reader. The corpus: `google/`.
use super::{generic, Pool, Provider};
use crate::core::text::cached;
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

/// The quota's `"quotaValue": "N"` (a JSON string or number), if > 0 and within i64.
pub fn stated_quota_value(message: &str) -> Option<i64> {
    static VALUE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = cached(&VALUE, r#""quotaValue"\s*:\s*"?([0-9]{1,19})"?"#)?;
    re.captures(message)?.get(1)?.as_str().parse::<i64>().ok().filter(|n| *n > 0)
}
