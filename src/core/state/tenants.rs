//! The tenants' side of the mirror (SPEC 23.2): each tenant seen has its own windows
//! (in its declaration's calendar) and its live leases, counted from the same usage
//! rows and leases as the routes they were served on.
use super::{FastMap, Mirror};
use crate::core::admission::Tally;
use crate::core::calendar::Calendar;
use crate::core::limits::{LimitSet, WindowSpec, MINUTE};
use crate::core::store::{KeptUsage, TenantLimitsRow};
use crate::core::tenants::{TenantDecl, TenantList};
use crate::core::windows::{Counts, Windows};
use std::sync::Arc;

/// One tenant's counters.
#[derive(Debug)]
pub struct TenantState {
    pub win: Windows,
    pub leases: Vec<i64>,
    /// The declarations' version its limits and calendar were last resolved at.
    version: u64,
    /// The limits in force for it when last resolved.
    limits: LimitSet,
}

/// Every tenant the mirror has seen, by name.
#[derive(Debug, Default)]
pub struct TenantStates {
    pub(super) map: FastMap<Arc<str>, TenantState>,
}

impl TenantStates {
    pub fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.map.keys()
    }
}

impl Mirror {
    /// A tenant's state, created on first sight in the calendar of the declaration in
    /// force for it.
    fn tenant_mut(&mut self, name: &Arc<str>) -> &mut TenantState {
        let table = &self.config.tenants;
        self.tenants.map.entry(name.clone()).or_insert_with(|| {
            let decl = table.of(name);
            let limits = decl.map(|d| d.limits.clone()).unwrap_or_default();
            let mut win = Windows::new(decl.map_or_else(Calendar::default, |d| d.cal.clone()));
            for spec in limits.windows() {
                // A tenant seen for the first time had no events since the last load,
                // which reached back as far as any declared window.
                win.keep(spec);
            }
            TenantState { win, leases: Vec::new(), version: table.version, limits }
        })
    }

    /// Counts an event stamped `t` for each of `tenants`.
    pub(super) fn add_tenant_counts(&mut self, tenants: &TenantList, c: Counts, t: i64, now: i64) {
        for name in tenants.iter() {
            self.tenant_mut(name).win.add_counts(t, c, now);
        }
    }

    pub(super) fn add_tenant_lease(&mut self, tenants: &TenantList, id: i64) {
        for name in tenants.iter() {
            self.tenant_mut(name).leases.push(id);
        }
    }

    pub(super) fn remove_tenant_lease(&mut self, tenants: &TenantList, id: i64) {
        for name in tenants.iter() {
            if let Some(st) = self.tenants.map.get_mut(name) {
                st.leases.retain(|l| *l != id);
            }
        }
    }

    /// Prepares the tenant gates of a call at `now`: each named tenant pruned, its
    /// limits resolved (own declaration, else the longest pattern) and its windows
    /// kept (a window that cannot be counted from memory sets `needs_reload`). Returns
    /// (tenant, limits) for the tenants with limits, in the order given.
    pub fn prepare_tenants(&mut self, tenants: &TenantList, now: i64) -> Vec<(Arc<str>, LimitSet)> {
        let mut out = Vec::new();
        let version = self.config.tenants.version;
        let mut reload = false;
        for name in tenants.iter() {
            let decl = self.config.tenants.of(name).cloned();
            self.tenant_mut(name);
            let leases = &self.leases;
            let Some(st) = self.tenants.map.get_mut(name) else { continue };
            if st.version != version {
                let cal = decl.as_ref().map_or_else(Calendar::default, |d| d.cal.clone());
                if *st.win.calendar() != cal {
                    st.win = st.win.cleared(cal);
                    reload = true;
                }
                st.limits = decl.map(|d| d.limits).unwrap_or_default();
                st.version = version;
                for spec in st.limits.windows() {
                    reload |= !st.win.keep(spec);
                }
            }
            st.win.prune(now);
            st.leases.retain(|id| leases.is_live(*id, now));
            if !st.limits.is_empty() {
                out.push((name.clone(), st.limits.clone()));
            }
        }
        self.needs_reload |= reload;
        out
    }

    /// Makes a tenant's windows keep `spec` too (after `prepare_tenants`); false when it
    /// could not be counted from memory (`needs_reload` is then set).
    pub fn tenant_keep(&mut self, name: &str, spec: WindowSpec) -> bool {
        let Some(st) = self.tenants.map.get_mut(name) else { return true };
        let complete = st.win.keep(spec);
        self.needs_reload |= !complete;
        complete
    }

    /// What a tenant has recorded and has in flight (after `prepare_tenants`).
    pub fn tenant_tally(&self, name: &str, now: i64) -> Option<Tally<'_>> {
        let st = self.tenants.map.get(name)?;
        Some(Tally { win: &st.win, in_flight: self.leases.in_flight(&st.leases, now) })
    }

    /// A tenant's declaration, written by this engine or read from the store.
    pub fn put_tenant_limits(&mut self, row: &TenantLimitsRow) {
        let decl = TenantDecl::stored(row.limits.clone(), row.tz.clone());
        self.tenant_decl_changed(&decl);
        self.config.tenants.put(&row.tenant, decl);
        self.retained_windows = None;
    }

    /// Every stored declaration (the feed's replacement rule).
    pub(super) fn replace_tenant_limits(&mut self, rows: Vec<TenantLimitsRow>) {
        let decls: Vec<(String, TenantDecl)> =
            rows.into_iter().map(|r| (r.tenant, TenantDecl::stored(r.limits, r.tz))).collect();
        for (_, d) in &decls {
            self.tenant_decl_changed(d);
        }
        self.config.tenants.replace(decls);
        self.retained_windows = None;
    }

    /// A declaration whose windows reach back further than the last load: the
    /// tenants not seen yet have rows in the store to count too.
    fn tenant_decl_changed(&mut self, d: &TenantDecl) {
        if let Some((since, at)) = self.loaded {
            if d.limits.windows().any(|w| window_start(&d.cal, w, at) < since) {
                self.needs_reload = true;
            }
        }
    }

    /// Forgets the tenants' window state (before a reload from the store).
    pub(super) fn reset_tenant_usage(&mut self) {
        for st in self.tenants.map.values_mut() {
            st.win = st.win.cleared(st.win.calendar().clone());
        }
    }

    /// The oldest row the tenants' windows count at `now`: each tenant's kept windows
    /// and every declared window (patterns included) in its own calendar.
    pub(super) fn tenant_horizon(&self, now: i64) -> i64 {
        let mut from = i64::MAX;
        for st in self.tenants.map.values() {
            from = from.min(st.win.oldest_counted(now));
        }
        for (_, d) in self.config.tenants.declared() {
            for w in d.limits.windows() {
                from = from.min(window_start(&d.cal, w, now));
            }
        }
        from
    }

    /// SPEC 23.2 (and 14.2, 24.3): a tenant's week, month or long sliding window keeps
    /// the rows carrying the tenant (and no others), from the oldest its windows count.
    pub(super) fn retain_for_tenants(
        &self, kept: &mut Vec<KeptUsage>, now: i64, before: i64, with_day: bool,
    ) {
        let mut added = false;
        for name in self.tenants.map.keys() {
            // The declaration in force now (a tenant's state is resolved again only when
            // it is next decided on).
            let Some(decl) = self.config.tenants.of(name) else { continue };
            let from = decl
                .limits
                .windows()
                .filter(|w| *w != MINUTE && (with_day || *w != crate::core::limits::DAY))
                .map(|w| window_start(&decl.cal, w, now))
                .min();
            let Some(from) = from.filter(|f| *f < before) else { continue };
            kept.push(KeptUsage::tenant(name.clone(), from));
            added = true;
        }
        if added {
            // In one order, whatever the map's: a store's sweep knows its classes by it.
            kept.sort_by(|a, b| {
                (&a.tenant, &a.platform, &a.model_id).cmp(&(&b.tenant, &b.platform, &b.model_id))
            });
        }
    }
}

/// The oldest time a window of `cal` counts at `now`.
fn window_start(cal: &Calendar, w: WindowSpec, now: i64) -> i64 {
    match w {
        WindowSpec::Sliding(width) => now.saturating_sub(width - 1),
        WindowSpec::Calendar(p) => cal.period_start(p, now),
    }
}
