//! The reader's answers over a mirror fed as the change feed feeds it.
use crate::core::state::{LeaseRec, Mirror};
use crate::core::store::{CooldownRow, Write};
use crate::core::types::{CooldownSource, Route};
use std::sync::Arc;

fn bench(key_id: Option<i64>, expires_at_ms: i64, source: CooldownSource) -> Write {
    Write::UpsertCooldown(CooldownRow {
        platform: Arc::from("acme"),
        model_id: Arc::from("llama"),
        key_id,
        expires_at_ms,
        source,
        set_at_ms: 0,
    })
}

#[test]
fn a_route_is_benched_by_the_later_of_its_own_cooldown_and_its_models() {
    let mut m = Mirror::default();
    let rid = m.route_id("acme", "llama", 1);
    m.apply(&bench(Some(1), 500, CooldownSource::Heuristic), 0, 0);
    m.apply(&bench(None, 900, CooldownSource::Upstream), 0, 0);
    let read = m.reader();
    let own = read.bench("acme", "llama", 1, 100).map(|c| (c.route.key_id, c.model_wide, c.expires_at_ms));
    assert_eq!(own, Some((0, true, 900)));
    // A key not seen yet on the model: only the model's bench holds it.
    assert!(read.bench("acme", "llama", 2, 100).is_some_and(|c| c.model_wide));
    assert_eq!(read.own_cooldown(rid, 100).map(|c| c.expires_at_ms), Some(500));
    assert_eq!(read.own_cooldown(rid, 500), None);
    assert_eq!(read.model_bench("acme", "llama", 899).map(|c| c.source), Some(CooldownSource::Upstream));
    // Held: the route's own first, then the model-wide, expired ones included.
    let held: Vec<(i64, bool)> = read.held_cooldowns().map(|c| (c.route.key_id, c.model_wide)).collect();
    assert_eq!(held, vec![(1, false), (0, true)]);
}

#[test]
fn a_lease_is_live_until_its_max_age() {
    let mut m = Mirror::default();
    let rid = m.route_id("acme", "llama", 1);
    m.add_lease(
        7,
        LeaseRec {
            route: rid,
            tokens: 5,
            output_tokens: 0,
            cost: 0,
            created_at_ms: 0,
            expires_at_ms: 100,
            tenants: crate::core::tenants::none(),
            others_at_admission: None,
        },
    );
    let read = m.reader();
    let route = Route { platform: "acme".into(), model_id: "llama".into(), key_id: 1 };
    assert_eq!(read.live_lease(7, 100).map(|(r, est)| (r, est.tokens)), Some((route, 5)));
    assert_eq!(read.live_lease(7, 101), None);
    assert!(read.lease_is_live(7, 100) && !read.lease_is_live(7, 101));
    assert_eq!(read.key_live_leases("acme", 1, None, 50), 1);
    assert_eq!(read.key_live_leases("acme", 1, Some(7), 50), 0);
    assert_eq!(read.route_names(rid), (Arc::from("acme"), Arc::from("llama")));
}
