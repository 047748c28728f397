//! The questions the engine's desks ask of the mirror, in their own words: a
//! [`Reader`] over the mirror's tables, asked for by [`Mirror::reader`] (as a store
//! asks its storage for a reader), so no desk walks the tables itself. Grouped by
//! topic: the routes and their leases here, cooldowns and failure history in
//! `failures`, keys and accounts in `keys`, the reports' figures in `reports`.
use super::{Mirror, RouteId};
use crate::core::admission::Estimate;
use crate::core::limits::LimitSet;
use crate::core::money::Prices;
use crate::core::types::Route;
use crate::core::windows::Counts;
use std::sync::Arc;

mod failures;
mod keys;
mod reports;
pub use reports::{RouteFigures, RouteUse};

/// A shared view of the mirror that answers the desks' questions (see the module).
#[derive(Clone, Copy)]
pub struct Reader<'m> {
    m: &'m Mirror,
}

impl Mirror {
    /// A reader over the mirror's tables, for the desks' questions.
    #[inline]
    pub fn reader(&self) -> Reader<'_> {
        Reader { m: self }
    }
}

impl<'m> Reader<'m> {
    /// The route's platform and model as the mirror holds them (shared, not copied).
    #[inline]
    pub fn route_names(self, rid: RouteId) -> (Arc<str>, Arc<str>) {
        let r = self.m.routes.get(rid);
        (r.platform.clone(), r.model_id.clone())
    }

    /// What the route itself recorded in the sliding minute (as of its last prune).
    pub fn route_minute(self, rid: RouteId) -> Counts {
        self.m.routes.get(rid).win.minute()
    }

    /// What the route itself recorded in its platform's calendar day holding `now`.
    pub fn route_day(self, rid: RouteId, now: i64) -> Counts {
        self.m.routes.get(rid).win.day(now)
    }

    /// When the route's platform's next day starts after `now` (its calendar's).
    pub fn next_day_start(self, rid: RouteId, now: i64) -> i64 {
        self.m.routes.calendar(rid).next_day_start(now)
    }

    /// Whether the route of (`platform`, `model_id`, `key_id`) is known and keeps every
    /// window of `set` (false for a route not seen yet).
    pub fn keeps_windows(self, platform: &str, model_id: &str, key_id: i64, set: &LimitSet) -> bool {
        self.m.routes.find(platform, model_id, key_id).is_some_and(|rid| {
            let win = &self.m.routes.get(rid).win;
            set.windows().all(|w| win.keeps(w))
        })
    }

    /// Whether lease `id` is held and still counts at `now` (SPEC §5).
    #[inline]
    pub fn lease_is_live(self, id: i64, now: i64) -> bool {
        self.m.leases.is_live(id, now)
    }

    /// A model's prices in force (SPEC 23.1), `None` when it has none.
    #[inline]
    pub fn prices(self, platform: &str, model_id: &str) -> Option<Prices> {
        self.m.config.prices(platform, model_id)
    }

    /// A lease that still counts at `now`: its route and its estimate.
    pub fn live_lease(self, id: i64, now: i64) -> Option<(Route, Estimate)> {
        let rec = self.m.leases.get(id).filter(|l| l.live(now))?;
        let r = self.m.routes.get(rec.route);
        let route =
            Route { platform: r.platform.to_string(), model_id: r.model_id.to_string(), key_id: r.key_id };
        Some((route, rec.estimate()))
    }
}

#[cfg(test)]
mod tests;
