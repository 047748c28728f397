//! The figures the reports read (SPEC §9, §12): what each route used, for the
//! routing guardrail's snapshot and for `snapshot()`.
use super::Reader;
use crate::core::limits::WindowSpec;
use crate::core::state::{CooldownRec, RouteState};
use crate::core::windows::Counts;
use std::sync::Arc;

/// What each window used, by window.
pub type WindowUse = Vec<(WindowSpec, Counts)>;

/// What one route used in every window it keeps (the guardrail's snapshot, SPEC §9).
pub struct RouteUse<'m> {
    pub route: &'m RouteState,
    pub used: WindowUse,
    /// Of a route of a shared account: the account's name and what its windows on the
    /// route's model used (SPEC §14.3).
    pub account: Option<(Arc<str>, WindowUse)>,
}

/// One route's figures for `snapshot()` (SPEC §12).
pub struct RouteFigures<'m> {
    pub route: &'m RouteState,
    /// The route's own counts in the sliding minute and the calendar day.
    pub minute: Counts,
    pub day: Counts,
    /// Its live leases.
    pub in_flight: i64,
    /// What benches it (its own cooldown or its model's, SPEC 21.1).
    pub bench: Option<CooldownRec>,
}

impl<'m> Reader<'m> {
    /// What every route used at `now`, in every window it keeps (prune first).
    pub fn route_uses(self, now: i64) -> impl Iterator<Item = RouteUse<'m>> {
        let m = self.m;
        m.routes.iter().map(move |(_, r)| {
            let account = r.group.map(|g| {
                (
                    m.config.account_name(&r.platform, r.key_id),
                    m.accounts.groups[g as usize].win.all_counts(now),
                )
            });
            RouteUse { route: r, used: r.win.all_counts(now), account }
        })
    }

    /// The figures of every route at `now` (prune first): its own minute and day, its
    /// live leases and its bench.
    pub fn route_figures(self, now: i64) -> impl Iterator<Item = RouteFigures<'m>> {
        let m = self.m;
        m.routes.iter().map(move |(rid, r)| RouteFigures {
            route: r,
            minute: r.win.minute(),
            day: r.win.day(now),
            in_flight: m.route_in_flight(rid, now).count,
            bench: m.route_bench(rid, now).map(|(c, _)| c),
        })
    }
}
