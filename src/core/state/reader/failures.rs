//! Cooldowns and failure history (SPEC §6, §7, 15, 21), as the failure desk asks:
//! what benches a route, which cooldowns are held, and what the ladders count.
use super::Reader;
use crate::core::state::{CooldownRec, RouteId};
use crate::core::store::HistoryKind;
use crate::core::types::{Cooldown, Route};

impl<'m> Reader<'m> {
    /// What benches the route of (`platform`, `model_id`, `key_id`) at `now` (SPEC
    /// 21.1): whichever of its own cooldown and its model's ends later; of a key not
    /// seen yet on the model, only the model's bench.
    pub fn bench(self, platform: &str, model_id: &str, key_id: i64, now: i64) -> Option<Cooldown> {
        match self.m.routes.find(platform, model_id, key_id).and_then(|rid| self.m.route_bench(rid, now)) {
            Some((c, wide)) => Some(cooldown_row(platform, model_id, key_id, c, wide)),
            None => self
                .model_bench(platform, model_id, now)
                .map(|c| cooldown_row(platform, model_id, key_id, c, true)),
        }
    }

    /// The route's own active cooldown at `now` (not its model's, SPEC 21.1).
    pub fn own_cooldown(self, rid: RouteId, now: i64) -> Option<CooldownRec> {
        self.m.cooldowns.of_route(rid, now)
    }

    /// The active model-wide bench of (`platform`, `model_id`) at `now` (SPEC 21.1).
    pub fn model_bench(self, platform: &str, model_id: &str, now: i64) -> Option<CooldownRec> {
        self.m.cooldowns.of_model(platform, model_id, now)
    }

    /// Every cooldown the mirror holds, expired ones included until they are cleaned
    /// up: each route's own first, then the model-wide benches (SPEC 21.1: `key_id` 0,
    /// `model_wide`). In no particular order within each.
    pub fn held_cooldowns(self) -> impl Iterator<Item = Cooldown> + 'm {
        let m = self.m;
        let routes = m.cooldowns.routes.iter().map(move |(rid, c)| {
            let r = m.routes.get(*rid);
            cooldown_row(&r.platform, &r.model_id, r.key_id, *c, false)
        });
        let models = m.cooldowns.models.iter().flat_map(|(platform, models)| {
            models.iter().map(move |(model_id, c)| cooldown_row(platform, model_id, 0, *c, true))
        });
        routes.chain(models)
    }

    /// The steps the route took on its failure ladder after `since` (SPEC §6.1).
    pub fn ladder_steps(self, route: &Route, since: i64) -> i64 {
        self.m.history.count(route, HistoryKind::Ladder, since)
    }

    /// The route's limit failures of an unknown limit after `since` (SPEC §6.1).
    pub fn unknown_limit_hits(self, route: &Route, since: i64) -> i64 {
        self.m.history.count(route, HistoryKind::Unknown, since)
    }

    /// The route's transient benches after `since` (SPEC 15.2).
    pub fn transient_benches(self, route: &Route, since: i64) -> i64 {
        self.m.history.count(route, HistoryKind::Transient, since)
    }

    /// The route's empty completions in a row since its last other outcome (SPEC §6.2).
    pub fn empty_streak(self, route: &Route) -> i64 {
        self.m.history.count(route, HistoryKind::Empty, i64::MIN)
    }

    /// The auth failures of the route's key on its platform after `since` (SPEC §6.2).
    pub fn auth_failures(self, route: &Route, since: i64) -> i64 {
        self.m.history.count(route, HistoryKind::Auth, since)
    }

    /// Whether a success on `route` has history to clear: (the route's ladder,
    /// unknown-limit, transient and empty-completion rows; the key's auth rows). O(1)
    /// for a key without failures (the hot path).
    #[inline]
    pub fn history_to_clear(self, route: &Route) -> (bool, bool) {
        self.m.history.has_to_clear(route)
    }

    /// The times of the upstream failures of (`platform`, `model_id`) on any key (SPEC 21.1).
    pub fn upstream_hits(self, platform: &str, model_id: &str) -> Vec<i64> {
        self.m.history.upstream_hits(platform, model_id)
    }

    /// The key concurrency cap the key's concurrency failures taught, while it holds
    /// at `now` (SPEC 15.4).
    pub fn learned_concurrency_cap(self, platform: &str, key_id: i64, now: i64) -> Option<i64> {
        self.m.history.learned_concurrency_cap(platform, key_id, now)
    }

    /// A key's concurrency failures `(hit_at_ms, cap)` in time order (SPEC 24.2).
    pub fn concurrency_chain(self, platform: &str, key_id: i64) -> Vec<(i64, i64)> {
        self.m.history.concurrency_chain(platform, key_id)
    }

    /// How many other leases were live on its key when lease `id` was admitted (SPEC
    /// 24.2), when this engine admitted it.
    pub fn others_at_admission(self, id: i64) -> Option<i64> {
        self.m.leases.get(id).and_then(|l| l.others_at_admission)
    }

    /// Live leases on `key_id` of `platform`, any model, leaving out lease `except`.
    pub fn key_live_leases(self, platform: &str, key_id: i64, except: Option<i64>, now: i64) -> i64 {
        self.m
            .leases
            .by_id
            .iter()
            .filter(|(id, l)| {
                let r = self.m.routes.get(l.route);
                Some(**id) != except && l.live(now) && r.key_id == key_id && &*r.platform == platform
            })
            .count() as i64
    }
}

/// A cooldown as the engine reports it; of a model-wide bench, `key_id` 0.
fn cooldown_row(platform: &str, model_id: &str, key_id: i64, c: CooldownRec, model_wide: bool) -> Cooldown {
    Cooldown {
        route: Route {
            platform: platform.to_string(),
            model_id: model_id.to_string(),
            key_id: if model_wide { 0 } else { key_id },
        },
        expires_at_ms: c.expires_at_ms,
        source: c.source,
        set_at_ms: c.set_at_ms,
        model_wide,
    }
}
