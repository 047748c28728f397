//! Shared by the core's tests on SQLite (`engine_core.rs`) and on Redis
//! (`redis_core.rs`): what one engine observes of a provider's quota (SPEC §8.2)
//! reaches another engine on the same store through the change feed.
use quotaengine::core::clock::ManualClock;
use quotaengine::core::engine::Engine;
use quotaengine::core::state::Estimate;
use quotaengine::core::types::{Route, Strategy};

/// Quota headers of `remaining` requests, out of 100 when `limit` is said.
fn headers(limit: bool, remaining: i64) -> Vec<(String, String)> {
    let mut h = vec![("x-ratelimit-remaining-requests".to_string(), remaining.to_string())];
    if limit {
        h.push(("x-ratelimit-limit-requests".into(), "100".into()));
    }
    h
}

/// `b` sees what `a` observed of a key's quota at its next call: its
/// `key_quota_headroom`, the merge of its own next observation and, on a store that
/// decides under its lock (`at_once`), the `headroom` pick of its next `lease_any`. A
/// store that decides optimistically brings others' writes with each round trip, and
/// before a pick when the last was 5 s ago or more (SPEC §8.2: at most 5 s old).
pub fn another_engines_observation_is_seen_at_once(
    a: &mut Engine, b: &mut Engine, clock: &ManualClock, at_once: bool,
) {
    let routes = [Route::new("pa", "m", 1).unwrap(), Route::new("pb", "m", 2).unwrap()];
    let pick = |e: &mut Engine| {
        let (id, i) = e.lease_any(&routes, Estimate::tokens(0), Strategy::Headroom).unwrap();
        e.release_lease(id).unwrap();
        i
    };
    assert_eq!(pick(b), 0, "nothing observed: ties go to the given order");
    a.observed().record_quota_headers("pa", 1, &headers(true, 5), None, 200).unwrap();
    if !at_once {
        clock.advance(5_000);
    }
    assert_eq!(pick(b), 1, "key 1's observed 5% bounds its score");
    assert_eq!(b.observed().key_quota_headroom("pa").unwrap(), vec![(1, 0.05)]);
    // `b` merges its observation without a limit onto the limit `a` observed.
    a.observed().record_quota_headers("pb", 2, &headers(true, 80), None, 200).unwrap();
    b.observed().record_quota_headers("pb", 2, &headers(false, 50), None, 200).unwrap();
    assert_eq!(a.observed().key_quota_headroom("pb").unwrap(), vec![(2, 0.5)]);
    a.observed().record_quota_headers("pa", 1, &headers(true, 90), None, 200).unwrap();
    if !at_once {
        clock.advance(5_000);
    }
    assert_eq!(pick(b), 0, "key 2 has 50% left, key 1 90%");
}
