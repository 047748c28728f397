//! SPEC 21: what an aggregator's errors say beyond the route that failed. An
//! upstream congested for one model, on every key (21.1), and a provider-wide pool
//! whose cap and reset a 429 states (21.2). Pure rules; the engine applies them.
use crate::core::parse::{cached, head};
use regex::Regex;
use std::sync::OnceLock;

// Read by the failure rules, so defined beside them in `parse`.
pub use crate::core::parse::upstream_provider_name;

/// The first bench of a congested upstream (SPEC 21.1).
pub const UPSTREAM_FIRST_BENCH_MS: i64 = 60_000;
/// The longest bench a doubling reaches.
pub const UPSTREAM_MAX_BENCH_MS: i64 = 300_000;
/// A further upstream failure doubles the bench when it comes this soon after the
/// last one of the (platform, model).
pub const UPSTREAM_CHAIN_MS: i64 = 600_000;

/// How many earlier upstream failures of one (platform, model) lead up to `now`,
/// each within [`UPSTREAM_CHAIN_MS`] of the next: `hits` are their times, any order.
pub fn upstream_chain(hits: &mut [i64], now: i64) -> u32 {
    hits.sort_unstable_by(|a, b| b.cmp(a));
    let mut last = now;
    let mut n = 0u32;
    for t in hits.iter().copied().filter(|t| *t <= now) {
        if last.saturating_sub(t) > UPSTREAM_CHAIN_MS {
            break;
        }
        n = n.saturating_add(1);
        last = t;
    }
    n
}

/// The bench of an upstream failure with `chain` earlier ones leading up to it: 60 s,
/// doubling per earlier failure, at most 5 min; a stated delay instead when there is one.
pub fn upstream_bench_ms(chain: u32, stated_ms: Option<i64>) -> i64 {
    if let Some(ms) = stated_ms {
        return ms.max(0);
    }
    let doubled = UPSTREAM_FIRST_BENCH_MS.checked_shl(chain.min(16)).unwrap_or(UPSTREAM_MAX_BENCH_MS);
    doubled.min(UPSTREAM_MAX_BENCH_MS)
}

/// Which provider-wide cap a pool 429 names (SPEC 21.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAxis {
    /// Requests per minute of the account (`free-models-per-min`).
    Minute,
    /// Requests per day of the account (`free-models-per-day`).
    Day,
}

/// What a 429 naming a provider-wide pool states: which cap, its limit
/// (`X-RateLimit-Limit`) and when it resets (`X-RateLimit-Reset`, epoch ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSignal {
    pub axis: PoolAxis,
    pub limit: Option<i64>,
    pub reset_at_ms: Option<i64>,
}

/// The pool a message names: OpenRouter's "Rate limit exceeded: free-models-per-min"
/// or "... free-models-per-day" (also "free-models-per-day-high-balance").
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
/// JSON body's `error.metadata.headers` (`"X-RateLimit-Limit": "20"`).
fn stated_header<'a>(name: &str, headers: &'a [(String, String)], message: &'a str) -> Option<&'a str> {
    if let Some((_, v)) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)) {
        return Some(v.trim());
    }
    static LIMIT: OnceLock<Option<Regex>> = OnceLock::new();
    static RESET: OnceLock<Option<Regex>> = OnceLock::new();
    let re = match name {
        "x-ratelimit-limit" => cached(&LIMIT, r#"(?i)"x-ratelimit-limit"\s*:\s*"?\s*([0-9]{1,18})"#)?,
        "x-ratelimit-reset" => cached(&RESET, r#"(?i)"x-ratelimit-reset"\s*:\s*"?\s*([0-9]{1,18})"#)?,
        _ => return None,
    };
    Some(re.captures(head(message))?.get(1)?.as_str())
}

/// SPEC 21.2: a 429 naming a provider-wide pool, with the cap and reset it states.
/// `X-RateLimit-Reset` is ms since the epoch, or seconds when below 10^11. `None`
/// for any other failure.
pub fn parse_pool_429(
    status: Option<i64>,
    message: Option<&str>,
    headers: &[(String, String)],
) -> Option<PoolSignal> {
    if status != Some(429) {
        return None;
    }
    let message = message?;
    let axis = pool_axis(message)?;
    let number = |name: &str| stated_header(name, headers, message).and_then(|v| v.parse::<i64>().ok());
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

#[cfg(test)]
mod tests {
    use super::*;

    // Real OpenRouter bodies (see tests/provider_bodies.py for their sources).
    const UPSTREAM: &str = r#"{"error":{"message":"Provider returned error","code":429,"metadata":{"raw":"google/gemini-2.0-flash-exp:free is temporarily rate-limited upstream. Please retry shortly, or add your own key to accumulate your rate limits: https://openrouter.ai/settings/integrations","provider_name":"Google AI Studio"}}}"#;
    const PER_DAY: &str = r#"{"error":{"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":429,"metadata":{"headers":{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0","X-RateLimit-Reset":"1745971200000"}}}}"#;
    const PAYMENT: &str = r#"{"error":{"message":"This request requires more credits","code":402,"metadata":{"provider_name":null}}}"#;

    #[test]
    fn provider_name_is_read_and_null_names_none() {
        assert_eq!(upstream_provider_name(UPSTREAM), Some("Google AI Studio"));
        assert_eq!(upstream_provider_name(PAYMENT), None);
        assert_eq!(upstream_provider_name("no json"), None);
    }

    #[test]
    fn the_bench_doubles_along_a_chain_up_to_five_minutes() {
        let now = 10_000_000;
        assert_eq!(upstream_chain(&mut [], now), 0);
        // 9 min apart, then one 11 min before that: the chain stops there.
        let mut hits = [now - 540_000, now - 1_080_000, now - 1_740_000];
        assert_eq!(upstream_chain(&mut hits, now), 2);
        assert_eq!(upstream_chain(&mut [now - 600_001], now), 0);
        let benches: Vec<i64> = (0..5).map(|n| upstream_bench_ms(n, None)).collect();
        assert_eq!(benches, vec![60_000, 120_000, 240_000, 300_000, 300_000]);
        assert_eq!(upstream_bench_ms(40, None), 300_000);
        assert_eq!(upstream_bench_ms(3, Some(7_000)), 7_000);
    }

    #[test]
    fn pool_429s_state_cap_and_reset_in_body_or_headers() {
        let s = parse_pool_429(Some(429), Some(PER_DAY), &[]);
        assert_eq!(
            s,
            Some(PoolSignal { axis: PoolAxis::Day, limit: Some(50), reset_at_ms: Some(1_745_971_200_000) })
        );
        let hs = vec![
            ("x-ratelimit-limit".to_string(), "20".to_string()),
            ("X-RateLimit-Reset".to_string(), "1745971260".to_string()),
        ];
        let s = parse_pool_429(Some(429), Some("Rate limit exceeded: free-models-per-min. "), &hs);
        assert_eq!(
            s,
            Some(PoolSignal {
                axis: PoolAxis::Minute,
                limit: Some(20),
                reset_at_ms: Some(1_745_971_260_000)
            })
        );
        // Headers win over the body; another status or no pool named: nothing.
        assert_eq!(parse_pool_429(Some(429), Some(PER_DAY), &hs).and_then(|s| s.limit), Some(20));
        assert_eq!(parse_pool_429(Some(503), Some(PER_DAY), &[]), None);
        assert_eq!(parse_pool_429(Some(429), Some("Rate limit exceeded"), &hs), None);
        let bare =
            parse_pool_429(Some(429), Some("Rate limit exceeded: free-models-per-day-high-balance."), &[]);
        assert_eq!(bare, Some(PoolSignal { axis: PoolAxis::Day, limit: None, reset_at_ms: None }));
    }
}
