//! SPEC 21: what an aggregator's errors say beyond the route that failed. An
//! upstream congested for one model, on every key (21.1), and a provider-wide pool
//! whose cap and reset a 429 states (21.2). Pure rules; the engine applies them. How
//! an aggregator's body says so is read in its own file (`core::providers`).

pub use crate::core::providers::{parse_pool_429, pool_axis, upstream_provider_name, PoolAxis, PoolSignal};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
