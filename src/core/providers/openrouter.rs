//! OpenRouter, the aggregator (SPEC 21): two pools for the whole account, `::free` for
//! a model id ending in `:free` and `::account` otherwise (SPEC §8.1); 1,000 free
//! requests a day by default (SPEC §8); the plain and the bare `x-ratelimit-*` headers
//! (SPEC §8.2). Its errors say which upstream is congested ("... is temporarily
//! rate-limited upstream", `error.metadata.provider_name`, SPEC 21.1) and which
//! account-wide pool ran out ("Rate limit exceeded: free-models-per-min", the cap and
//! reset in `error.metadata.headers`, SPEC 21.2). The corpus: `openrouter/`.
use super::{generic, DefaultCaps, HeaderFamily, Pool, PoolAxis, PoolSignal, Provider};
use crate::core::text::{cached, head, parse_integer};
use regex::Regex;
use std::sync::OnceLock;

pub(super) const PROVIDER: Provider = Provider {
    name: "openrouter",
    hosts: &["openrouter.ai"],
    pool: Pool::Rule(pool),
    caps: DefaultCaps { requests_per_day: Some(1000), ..DefaultCaps::NONE },
    header_families: &[HeaderFamily::Plain, HeaderFamily::Bare],
    ..generic::PROVIDER
};

/// The pool of a model: `openrouter::free` for a model id ending in `:free` (any
/// case), else `openrouter::account`.
fn pool(model: Option<&str>) -> &'static str {
    let free = model.is_some_and(|m| ends_with_ignore_ascii_case(m, ":free"));
    if free {
        "openrouter::free"
    } else {
        "openrouter::account"
    }
}

fn ends_with_ignore_ascii_case(text: &str, suffix: &str) -> bool {
    let (text, suffix) = (text.as_bytes(), suffix.as_bytes());
    text.len() >= suffix.len()
        && text.get(text.len() - suffix.len()..).is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
}

/// SPEC 21.1: "... is temporarily rate-limited upstream ..." and its kin.
pub const UPSTREAM_PHRASES: &[&str] = &["rate-limited upstream", "overloaded upstream"];

/// The name of the upstream a JSON error body blames:
/// `"metadata": {"provider_name": "...", "raw": ...}`. `None` when the body names none
/// (`"provider_name": null` names none).
pub fn upstream_provider_name(message: &str) -> Option<&str> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = cached(&RE, r#""provider_name"\s*:\s*"([^"\\]+)""#)?;
    let name = re.captures(head(message))?.get(1)?.as_str().trim();
    (!name.is_empty()).then_some(name)
}

/// The pool a message names: "Rate limit exceeded: free-models-per-min" or "...
/// free-models-per-day" (also "free-models-per-day-high-balance").
pub fn pool_axis(message: &str) -> Option<PoolAxis> {
    let text = head(message).to_ascii_lowercase();
    if text.contains("free-models-per-min") {
        Some(PoolAxis::Minute)
    } else if text.contains("free-models-per-day") {
        Some(PoolAxis::Day)
    } else {
        None
    }
}

/// A header's value: from the response headers (any case) or, failing that, from the
/// JSON body's `error.metadata.headers` (`"X-RateLimit-Limit": "20"`, a JSON string or
/// number), whole: the value up to its closing quote, or up to the next `,`, `}` or
/// space when unquoted (SPEC 24.6: `2e1` is read as written, and is not an integer).
fn stated_header<'a>(name: &str, headers: &'a [(String, String)], message: &'a str) -> Option<&'a str> {
    if let Some((_, v)) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)) {
        return Some(v.trim());
    }
    static LIMIT: OnceLock<Option<Regex>> = OnceLock::new();
    static RESET: OnceLock<Option<Regex>> = OnceLock::new();
    let re = match name {
        "x-ratelimit-limit" => cached(&LIMIT, r#"(?i)"x-ratelimit-limit"\s*:\s*(?:"([^"]*)"|([^\s,}\]]*))"#)?,
        "x-ratelimit-reset" => cached(&RESET, r#"(?i)"x-ratelimit-reset"\s*:\s*(?:"([^"]*)"|([^\s,}\]]*))"#)?,
        _ => return None,
    };
    let caps = re.captures(head(message))?;
    Some(caps.get(1).or_else(|| caps.get(2))?.as_str())
}

/// SPEC 21.2: a 429 naming a provider-wide pool, with the cap and reset it states.
/// `X-RateLimit-Reset` is ms since the epoch, or seconds when below 10^11. `None`
/// for any other failure.
pub fn parse_pool_429(
    status: Option<i64>, message: Option<&str>, headers: &[(String, String)],
) -> Option<PoolSignal> {
    if status != Some(429) {
        return None;
    }
    let message = message?;
    let axis = pool_axis(message)?;
    let number = |name: &str| stated_header(name, headers, message).and_then(parse_integer);
    let limit = number("x-ratelimit-limit").filter(|l| *l > 0);
    let reset_at_ms = number("x-ratelimit-reset").filter(|r| *r > 0).map(|r| {
        if r < 100_000_000_000 {
            r.saturating_mul(1000)
        } else {
            r
        }
    });
    Some(PoolSignal { axis, limit, reset_at_ms })
}
