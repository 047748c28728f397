//! The store's change feed applied to the mirror: one write as this engine makes it
//! ([`Mirror::apply`], the lease a decision takes included), and what other engines
//! changed since the last section ([`Mirror::apply_changes`]). The tables' own
//! replacement rules are the private functions below.
use super::{AccountId, CooldownRec, GroupId, LeaseRec, Mirror, RouteId};
use crate::core::limits::{Limit, LimitSet};
use crate::core::store::{Changes, CooldownRow, LeaseRow, Write};
use crate::core::types::{KeyInfo, ModelInfo};
use std::collections::{HashMap, HashSet};

/// Our own writes still waiting for the store (the unit's buffer), which the feed
/// must not undo.
pub struct Waiting<'a> {
    pub writes: &'a [Write],
    /// Stored leases whose deletion is waiting.
    pub deleted: &'a HashSet<i64>,
    /// Leases whose insertion is waiting.
    pub inserted: &'a HashSet<i64>,
}

impl Mirror {
    /// Applies one write to the mirror (one of this engine's, as it is made). Returns
    /// the count of a delete (0 otherwise), and whether a platform's calendar changed
    /// (its day windows are to be counted again from the store).
    pub fn apply(&mut self, w: &Write, id: i64, now: i64) -> (i64, bool) {
        match w {
            Write::Usage(u) => self.add_usage_row(u, now),
            Write::InsertLease(l) => {
                // A lease this engine just decided names its route by the route's own
                // names (`lease_write`): no lookup by name.
                let rid = match self.lease_route.take() {
                    Some(r) if self.routes.get(r).named_by(l) => r,
                    _ => self.route_id(&l.platform, &l.model_id, l.key_id),
                };
                let mut rec = LeaseRec::of(rid, l);
                rec.others_at_admission = Some(self.key_leases_at(rid, now));
                self.add_lease(id, rec);
                return (id, false);
            }
            Write::DeleteLease(id) => return (i64::from(remove_lease(self, *id).is_some()), false),
            Write::UpsertCooldown(c) => put_cooldown(self, c),
            Write::DeleteCooldown { platform, model_id, key_id } => {
                if let Some(rid) = self.routes.find(platform, model_id, *key_id) {
                    return (i64::from(self.cooldowns.routes.remove(&rid).is_some()), false);
                }
            }
            Write::DeleteCooldownsForKey(key_id) => {
                let routes: Vec<RouteId> = self
                    .cooldowns
                    .routes
                    .keys()
                    .copied()
                    .filter(|rid| self.routes.get(*rid).key_id == *key_id)
                    .collect();
                for rid in &routes {
                    self.cooldowns.routes.remove(rid);
                }
                return (routes.len() as i64, false);
            }
            Write::DeleteExpiredCooldowns(t) => return (self.cooldowns.remove_expired(*t), false),
            Write::UpsertKey(k) => put_key(self, k.clone()),
            Write::UpsertModel(m) => self.put_model(m.clone()),
            Write::SetCaps(p, c) => {
                self.config.caps.insert(p.clone(), *c);
            }
            Write::ResetCaps(p) => {
                self.config.caps.remove(p);
            }
            Write::InsertHistory(h) => self.history.add(h.clone()),
            Write::DeleteHistory { key_id, route, kinds } => {
                return (
                    self.history.remove(*key_id, route.as_ref().map(|(p, m)| (&**p, &**m)), kinds),
                    false,
                );
            }
            Write::Sweep { history_before, .. } => {
                self.history.prune(*history_before);
            }
            Write::SetCalendar { platform, zone } => {
                let set = self.calendars.zones_with(platform, zone.as_deref());
                // The platform's day windows start over: they are counted again.
                return (0, replace_calendars(self, set));
            }
            Write::SetPriorityReserve { priority, fraction } => self.reserves.put(*priority, *fraction),
            Write::UpsertQuotaState(q) => self.quota.put(q.clone()),
            Write::SetModelPrices { platform, model_id, prices } => {
                self.config.set_prices(platform, model_id, *prices)
            }
            Write::SetPlatformLimits { platform, limits } => {
                put_platform_limits(self, platform, LimitSet::platform_stored(limits.clone()));
            }
            Write::SetTenantLimits(row) => self.put_tenant_limits(row),
            Write::RenewLeases(rows) => {
                // Counted again from their new expiry, wherever a prune left them.
                for l in rows {
                    remove_lease(self, l.id);
                    let rid = self.route_id(&l.platform, &l.model_id, l.key_id);
                    self.add_lease(l.id, LeaseRec::of(rid, l));
                }
            }
            Write::Log(_) => {}
        }
        (0, false)
    }

    /// What other engines changed since the last section (the store's change feed),
    /// applied under our own writes still `waiting` for the store. True when a
    /// platform's calendar changed (its day windows are to be counted again).
    #[inline]
    pub fn apply_changes(&mut self, ch: Changes, now: i64, waiting: Waiting<'_>) -> bool {
        for r in &ch.usage {
            self.add_usage_row(r, now);
        }
        if let Some(leases) = &ch.leases {
            replace_stored_leases(self, leases, waiting.deleted, waiting.inserted);
        }
        let tables_changed =
            ch.cooldowns.is_some() || ch.keys.is_some() || ch.models.is_some() || ch.caps.is_some();
        if let Some(c) = &ch.cooldowns {
            replace_cooldowns(self, c);
        }
        if let Some(k) = ch.keys {
            replace_keys(self, k);
        }
        if let Some(m) = ch.models {
            replace_models(self, m);
        }
        if let Some(c) = ch.caps {
            self.config.caps = c.into_iter().collect();
        }
        let tables_changed = tables_changed
            || ch.history.is_some()
            || ch.calendars.is_some()
            || ch.priorities.is_some()
            || ch.prices.is_some()
            || ch.platform_limits.is_some()
            || ch.tenant_limits.is_some();
        if let Some(p) = ch.priorities {
            self.reserves.replace(p);
        }
        let quota_changed = ch.quota_states.is_some();
        if let Some(q) = ch.quota_states {
            self.quota.replace(q);
        }
        if let Some(p) = ch.prices {
            self.config.replace_prices(p);
        }
        if let Some(h) = ch.history {
            self.history.replace(h);
        }
        if let Some(p) = ch.platform_limits {
            replace_platform_limits(self, p);
        }
        if let Some(t) = ch.tenant_limits {
            self.replace_tenant_limits(t);
        }
        let mut recount = false;
        if let Some(c) = ch.calendars {
            recount |= replace_calendars(self, c.into_iter().collect());
        }
        if tables_changed {
            // Our own buffered changes are newer than what the store holds. Leases are
            // reconciled by `replace_stored_leases` (pending inserts kept, pending
            // deletes skipped); re-applying an insert would resurrect a lease finished
            // while its writes waited.
            for w in waiting
                .writes
                .iter()
                .filter(|w| !matches!(w, Write::Usage(_) | Write::DeleteLease(_) | Write::InsertLease(_)))
            {
                recount |= self.apply(w, 0, now).1;
            }
        } else if quota_changed {
            // Only the observed quota (the most frequent change): our own waiting rows.
            for w in waiting.writes.iter().filter(|w| matches!(w, Write::UpsertQuotaState(_))) {
                self.apply(w, 0, now);
            }
        }
        recount
    }
}

/// The stored platform zones changed (ours or another engine's): routes and
/// accounts of a platform whose calendar changed start over with its new days.
/// True when any did: the caller reloads usage from the store.
fn replace_calendars(m: &mut Mirror, set: HashMap<String, String>) -> bool {
    let changed = m.calendars.replace(set);
    m.retained_windows = None;
    for p in &changed {
        let cal = m.calendars.of(p);
        for r in m.routes.list.iter_mut().filter(|r| &*r.platform == p.as_str()) {
            r.win = r.win.cleared(cal.clone());
        }
        if let Some(accts) = m.accounts.index.get(p.as_str()) {
            for a in accts.values() {
                let acct = &mut m.accounts.list[*a as usize];
                acct.win = acct.win.cleared(cal.clone());
            }
        }
        let of_platform = |a: &AccountId| {
            m.accounts.list[*a as usize]
                .routes
                .first()
                .is_some_and(|r| &*m.routes[*r as usize].platform == p.as_str())
        };
        let gids: Vec<GroupId> =
            m.accounts.group_index.iter().filter(|((a, _), _)| of_platform(a)).map(|(_, g)| *g).collect();
        for g in gids {
            let grp = &mut m.accounts.groups[g as usize];
            grp.win = grp.win.cleared(cal.clone());
        }
        for k in 0..m.accounts.totals.len() {
            if of_platform(&m.accounts.totals[k].account) {
                let total = &mut m.accounts.totals[k];
                total.win = total.win.cleared(cal.clone());
            }
        }
    }
    !changed.is_empty()
}

fn remove_lease(m: &mut Mirror, id: i64) -> Option<LeaseRec> {
    let rec = m.leases.by_id.remove(&id)?;
    let route = &mut m.routes[rec.route as usize];
    route.leases.retain(|l| *l != id);
    m.accounts.list[route.account as usize].leases.retain(|l| *l != id);
    if let Some(g) = route.group {
        m.accounts.groups[g as usize].leases.retain(|l| *l != id);
    }
    if let Some(k) = route.total {
        m.accounts.totals[k as usize].leases.retain(|l| *l != id);
    }
    if !rec.tenants.is_empty() {
        m.remove_tenant_lease(&rec.tenants, id);
    }
    Some(rec)
}

/// Replaces the leases with the stored `rows`, keeping those whose insertion is
/// still waiting to be written and skipping those whose deletion is.
fn replace_stored_leases(
    m: &mut Mirror, rows: &[LeaseRow], pending_deleted: &HashSet<i64>, pending_inserted: &HashSet<i64>,
) {
    let stored: Vec<i64> =
        m.leases.by_id.keys().copied().filter(|id| !pending_inserted.contains(id)).collect();
    // What this engine knew of its own leases' admission (SPEC 24.2) stays.
    let mut admitted: HashMap<i64, i64> = HashMap::new();
    for id in stored {
        if let Some(n) = remove_lease(m, id).and_then(|l| l.others_at_admission) {
            admitted.insert(id, n);
        }
    }
    for row in rows {
        if pending_deleted.contains(&row.id) {
            continue;
        }
        let rid = m.route_id(&row.platform, &row.model_id, row.key_id);
        let mut rec = LeaseRec::of(rid, row);
        rec.others_at_admission = admitted.get(&row.id).copied();
        m.add_lease(row.id, rec);
    }
}

/// The stored platform limits (SPEC 23.3), every platform's: a platform no longer
/// listed has none.
fn replace_platform_limits(m: &mut Mirror, rows: Vec<(String, Vec<Limit>)>) {
    let mut gone: Vec<String> = m.config.platform_sets.keys().cloned().collect();
    for (platform, limits) in rows {
        gone.retain(|p| *p != platform);
        put_platform_limits(m, &platform, LimitSet::platform_stored(limits));
    }
    for platform in gone {
        put_platform_limits(m, &platform, LimitSet::default());
    }
}

fn replace_models(m: &mut Mirror, rows: Vec<ModelInfo>) {
    m.config.clear_models();
    m.retained_windows = None;
    for model in rows {
        m.put_model(model);
    }
}

fn replace_keys(m: &mut Mirror, rows: Vec<KeyInfo>) {
    m.config.replace_keys(rows);
    m.accounts_changed();
}

/// Registers (or updates) one key; the routable keys follow at once.
/// SPEC 23.3: a platform's limits changed (this engine's or another's): the windows
/// they read reach back further than the last load, or are new.
fn put_platform_limits(m: &mut Mirror, platform: &str, set: LimitSet) {
    if let Some((since, at)) = m.loaded {
        if set.windows().any(|w| m.calendars.window_start(platform, w, at) < since) {
            m.needs_reload = true;
        }
    }
    if set.is_empty() {
        m.config.platform_sets.remove(platform);
    } else {
        m.config.platform_sets.insert(platform.to_string(), set);
    }
}

fn put_key(m: &mut Mirror, k: KeyInfo) {
    m.config.put_key(k);
    m.accounts_changed();
}

fn replace_cooldowns(m: &mut Mirror, rows: &[CooldownRow]) {
    m.cooldowns.routes.clear();
    m.cooldowns.models.clear();
    for r in rows {
        put_cooldown(m, r);
    }
}

/// One stored cooldown: a route's, or with no key the model's (SPEC 21.1).
fn put_cooldown(m: &mut Mirror, r: &CooldownRow) {
    let rec = CooldownRec { expires_at_ms: r.expires_at_ms, source: r.source, set_at_ms: r.set_at_ms };
    match r.key_id {
        Some(key_id) => {
            let rid = m.route_id(&r.platform, &r.model_id, key_id);
            m.cooldowns.routes.insert(rid, rec);
        }
        None => {
            m.cooldowns.models.entry(r.platform.clone()).or_default().insert(r.model_id.clone(), rec);
        }
    }
}
