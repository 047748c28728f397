//! The engine's in-memory picture of the store: window state per route and per
//! provider account, live leases, cooldowns, keys, models, caps and the observed
//! provider quota. Kept current incrementally from the store's change feed, and the
//! only thing gates read. The engine's desks ask it their questions through its
//! [`Reader`] (`reader/`).
pub use crate::core::admission::Estimate;
use crate::core::admission::{Billed, GateContext, InFlight, Tally, View};
use crate::core::calendar::Calendar;
use crate::core::limits::{LimitSet, Scope, WindowSpec, DAY};
use crate::core::store::{KeptUsage, LeaseRow, UsageKind, UsageRow, Write};
use crate::core::tenants::TenantList;
use crate::core::types::{CooldownSource, ModelInfo};
use crate::core::windows::{Counts, Windows};

mod accounts;
mod config;
mod feed;
mod history;
mod leases;
mod prepare;
mod quota;
mod reader;
mod tenants;
use accounts::{Accounts, TotalId};
pub use config::{parse_multiplier, Calendars, Config, Multiplier, Reserves};
pub use feed::Waiting;
pub use history::{pool_cap_row, pool_reset_row, Cooldowns, History, PoolState};
pub use leases::{LeaseRec, Leases};
pub use prepare::{min_cap, Prepared, Setup};
use quota::Quota;
pub use reader::{Reader, RouteFigures, RouteUse};
use std::collections::HashMap;
use std::sync::Arc;
pub use tenants::{TenantState, TenantStates};

pub type RouteId = u32;
/// platform -> model_id -> key_id -> route (lookups by `&str`, no allocation).
/// A map looked up on every admission by names the router chose (no flooding to resist).
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type RouteIndex = FastMap<Arc<str>, FastMap<Arc<str>, FastMap<i64, RouteId>>>;
pub type AccountId = u32;
pub type GroupId = u32;

#[derive(Debug)]
pub struct RouteState {
    pub platform: Arc<str>,
    pub model_id: Arc<str>,
    pub key_id: i64,
    account: AccountId,
    /// The (account, model) counters of an account of several keys (SPEC §14.3);
    /// `None` while the key is its account's only one (its own windows serve).
    group: Option<GroupId>,
    /// The key's counters over every model (SPEC 23.3), of an account of several keys
    /// (`None`: the account's serve).
    total: Option<TotalId>,
    pub win: Windows,
    leases: Vec<i64>,
    /// The last limit set whose windows `win` was made to keep (windows are never
    /// dropped, so a decision under the same set has nothing to check).
    kept: LimitSet,
}

/// Every route the mirror has seen, by id (ids are never reused), with an index by
/// name: platform -> model_id -> key_id -> route.
#[derive(Debug, Default)]
pub struct Routes {
    list: Vec<RouteState>,
    index: RouteIndex,
}

impl Routes {
    pub fn get(&self, id: RouteId) -> &RouteState {
        &self.list[id as usize]
    }

    pub fn find(&self, platform: &str, model_id: &str, key_id: i64) -> Option<RouteId> {
        self.index.get(platform)?.get(model_id)?.get(&key_id).copied()
    }

    /// Where the days of a route start.
    pub fn calendar(&self, id: RouteId) -> &Calendar {
        self.list[id as usize].win.calendar()
    }

    pub fn iter(&self) -> impl Iterator<Item = (RouteId, &RouteState)> {
        self.list.iter().enumerate().map(|(i, r)| (i as RouteId, r))
    }
}

impl std::ops::Index<usize> for Routes {
    type Output = RouteState;
    fn index(&self, i: usize) -> &RouteState {
        &self.list[i]
    }
}

impl std::ops::IndexMut<usize> for Routes {
    fn index_mut(&mut self, i: usize) -> &mut RouteState {
        &mut self.list[i]
    }
}

impl RouteState {
    /// The provider account the route's key belongs to.
    pub fn account(&self) -> AccountId {
        self.account
    }
    /// `row` names this route by the route's own names (the same `Arc`s).
    fn named_by(&self, row: &LeaseRow) -> bool {
        Arc::ptr_eq(&self.platform, &row.platform)
            && Arc::ptr_eq(&self.model_id, &row.model_id)
            && self.key_id == row.key_id
    }

    /// The billing multiplier of the route's model on a platform whose daily token
    /// cap is `cap` (SPEC §8).
    fn billing(&self, config: &Config, cap: i64) -> Multiplier {
        config.multiplier(&self.platform, &self.model_id, cap)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CooldownRec {
    pub expires_at_ms: i64,
    pub source: CooldownSource,
    pub set_at_ms: i64,
}

#[derive(Debug, Default)]
pub struct Mirror {
    /// Every route seen, by id, and the index of their names.
    pub routes: Routes,
    /// Provider accounts and, of a shared one, its (account, model) groups.
    accounts: Accounts,
    /// The live leases (and expired ones not yet pruned).
    pub leases: Leases,
    pub cooldowns: Cooldowns,
    /// Keys, models and provider caps; change keys and models through the mirror's
    /// `put_key` / `replace_keys` / `put_model` / `replace_models`.
    pub config: Config,
    /// Some route started keeping a window its events were not kept for: the usage
    /// is to be loaded again from the store.
    pub needs_reload: bool,
    /// The models retention keeps rows of past `retention_ms`, with their windows
    /// (`None`: to be worked out again after a change of declarations or calendars).
    retained_windows: Option<Vec<Retained>>,
    /// (since, at): the last load read the rows stamped `since` or later, at `at`.
    loaded: Option<(i64, i64)>,
    pub history: History,
    pub calendars: Calendars,
    pub reserves: Reserves,
    /// The observed provider quota (SPEC §8.2), read through the [`Reader`].
    quota: Quota,
    /// What is derived from the environment and the caps (see [`Mirror::prepare`]).
    setup: Setup,
    /// The route of the last lease write built (`lease_write`), for `apply`.
    lease_route: Option<RouteId>,
    /// Every tenant seen (SPEC 23.2): its windows and live leases.
    pub tenants: TenantStates,
}

/// A model with declared windows wider than the minute, for retention (SPEC 14.2).
#[derive(Debug)]
struct Retained {
    platform: Arc<str>,
    model_id: Arc<str>,
    cal: Calendar,
    windows: Vec<WindowSpec>,
}

impl Mirror {
    /// The mirror of an engine built with `env` (its day zones and caps read once).
    pub fn with_env(env: crate::core::env::Env) -> Mirror {
        let calendars = Calendars::with_env(env.day_zones());
        Mirror { calendars, setup: Setup::new(env), ..Mirror::default() }
    }

    /// The limits a call uses: the given ones, else the model's declared ones, else none.
    pub fn limits_for(&self, platform: &str, model_id: &str, given: Option<LimitSet>) -> LimitSet {
        given.unwrap_or_else(|| self.config.limit_set(platform, model_id))
    }

    /// The keys of the account of the route a lease write names when it has several
    /// (`None`, without allocating, for a key of its own: the hot path).
    pub fn lease_account_keys(&self, l: &LeaseRow) -> Option<Vec<i64>> {
        let rid = match self.lease_route {
            Some(r) if self.routes.get(r).named_by(l) => r,
            _ => self.routes.find(&l.platform, &l.model_id, l.key_id)?,
        };
        let r = &self.routes[rid as usize];
        r.group?;
        Some(self.account_keys(&r.platform, r.key_id))
    }

    /// The registered keys of the account a key belongs to (the key alone when it is
    /// its own account).
    pub fn account_keys(&self, platform: &str, key_id: i64) -> Vec<i64> {
        let name = self.config.account_name(platform, key_id);
        if !self.accounts.shared(platform, &name) {
            return vec![key_id];
        }
        let mut keys: Vec<i64> = self
            .config
            .keys
            .values()
            .filter(|k| k.platform == platform && k.account.as_deref() == Some(&*name))
            .map(|k| k.key_id)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The calendar in force for a platform's days (SPEC §14.2), resolved once.
    pub fn calendar(&mut self, platform: &str) -> Calendar {
        self.calendars.of(platform)
    }

    /// The id of a provider account (platform, key_id), created on first sight.
    pub fn account_id(&mut self, platform: &str, key_id: i64) -> AccountId {
        let name = self.config.account_name(platform, key_id);
        if let Some(a) = self.accounts.of(platform, &name) {
            return a;
        }
        let p: Arc<str> =
            self.routes.index.get_key_value(platform).map_or_else(|| Arc::from(platform), |(k, _)| k.clone());
        self.accounts.add(p, name, self.calendars.of(platform))
    }

    /// The group of a route of account `a` on `model_id` when the account is shared
    /// (`None` for a key of its own), created on first sight with the model's windows.
    fn group_of(&mut self, a: AccountId, model_id: &Arc<str>, platform: &str) -> Option<GroupId> {
        if !self.accounts.shared(platform, &self.accounts.list[a as usize].name) {
            return None;
        }
        let set = self.config.limit_set(platform, model_id);
        Some(self.accounts.group(a, model_id, self.calendars.of(platform), &set))
    }

    /// After the keys changed: when a route's account (or whether it is shared)
    /// changed, puts every route in the account its key belongs to now; the account
    /// and group counters are then recounted from the store.
    fn accounts_changed(&mut self) {
        self.accounts.count_members(self.config.keys.values());
        let stale = self.routes.list.iter().any(|r| {
            let name = self.config.account_name(&r.platform, r.key_id);
            let acct = &self.accounts.list[r.account as usize];
            acct.name != name || r.group.is_some() != self.accounts.shared(&r.platform, &name)
        });
        if !stale {
            return;
        }
        self.accounts.clear();
        for rid in 0..self.routes.list.len() {
            let (platform, model, key) = {
                let r = &self.routes[rid];
                (r.platform.clone(), r.model_id.clone(), r.key_id)
            };
            let a = self.account_id(&platform, key);
            self.accounts.list[a as usize].routes.push(rid as RouteId);
            let group = self.group_of(a, &model, &platform);
            let total = group.map(|_| self.accounts.total(a, key));
            let r = &mut self.routes[rid];
            r.account = a;
            r.group = group;
            r.total = total;
        }
        let mut ids: Vec<(i64, RouteId)> = self.leases.by_id.iter().map(|(id, l)| (*id, l.route)).collect();
        ids.sort_unstable();
        for (id, rid) in ids {
            let r = &self.routes[rid as usize];
            self.accounts.add_lease(r.account, r.group, r.total, id);
        }
        self.needs_reload = true;
    }

    /// Prunes an account's own windows and lease list.
    pub fn prune_account_id(&mut self, a: AccountId, now: i64) {
        self.accounts.prune(a, &self.leases, now);
    }

    /// The id of a route, created on first sight.
    pub fn route_id(&mut self, platform: &str, model_id: &str, key_id: i64) -> RouteId {
        if let Some(id) =
            self.routes.index.get(platform).and_then(|m| m.get(model_id)).and_then(|k| k.get(&key_id))
        {
            return *id;
        }
        let p: Arc<str> =
            self.routes.index.get_key_value(platform).map_or_else(|| Arc::from(platform), |(k, _)| k.clone());
        let m: Arc<str> = Arc::from(model_id);
        let account = self.account_id(platform, key_id);
        let group = self.group_of(account, &m, platform);
        let total = group.map(|_| self.accounts.total(account, key_id));
        let id = self.routes.list.len() as RouteId;
        let mut win = Windows::new(self.calendars.of(platform));
        // A route seen for the first time had no events since the last load, which
        // reached back as far as any declared window: its windows are complete.
        for spec in self.config.limit_set(platform, model_id).windows() {
            win.keep(spec);
        }
        self.routes.list.push(RouteState {
            platform: p.clone(),
            model_id: m.clone(),
            key_id,
            account,
            group,
            total,
            win,
            leases: vec![],
            kept: LimitSet::default(),
        });
        self.accounts.list[account as usize].routes.push(id);
        self.routes.index.entry(p).or_default().entry(m).or_default().insert(key_id, id);
        id
    }

    // ---- usage -------------------------------------------------------------------

    /// Counts an event stamped `t` in the route's windows, its account's (every model)
    /// and, of a shared account, its key's over every model.
    pub fn add_counts(&mut self, rid: RouteId, c: Counts, t: i64, now: i64) {
        let route = &mut self.routes[rid as usize];
        route.win.add_counts(t, c, now);
        if let Some(g) = route.group {
            self.accounts.groups[g as usize].win.add_counts(t, c, now);
        }
        if let Some(k) = route.total {
            self.accounts.totals[k as usize].win.add_counts(t, c, now);
        }
        self.accounts.list[route.account as usize].win.add_counts(t, c, now);
    }

    pub fn add_usage_row(&mut self, row: &UsageRow, now: i64) {
        let rid = self.route_id(&row.platform, &row.model_id, row.key_id);
        let c = match row.kind {
            UsageKind::Tokens => Counts {
                requests: 0,
                tokens: row.tokens.max(0),
                input_tokens: row.kinds.metered_input(),
                output_tokens: row.kinds.output.unwrap_or(0).max(0),
                cost: row.cost,
            },
            UsageKind::Request => Counts { cost: row.cost, ..Counts::of(row.requests(), 0) },
        };
        self.add_counts(rid, c, row.created_at_ms, now);
        if !row.tenants.is_empty() {
            self.add_tenant_counts(&row.tenants, c, row.created_at_ms, now);
        }
    }

    /// Forgets all window state (before a reload from the store).
    pub fn reset_usage(&mut self) {
        for r in &mut self.routes.list {
            r.win = r.win.cleared(r.win.calendar().clone());
        }
        for a in &mut self.accounts.list {
            a.win = a.win.cleared(a.win.calendar().clone());
        }
        for g in &mut self.accounts.groups {
            g.win = g.win.cleared(g.win.calendar().clone());
        }
        for k in &mut self.accounts.totals {
            k.win = k.win.cleared(k.win.calendar().clone());
        }
        self.reset_tenant_usage();
        self.needs_reload = false;
    }

    /// The oldest row any window of the mirror counts at `now`: the 60 s window, the
    /// earliest day start, and every window a route keeps or a model declares.
    pub fn usage_horizon(&mut self, now: i64) -> i64 {
        let mut from =
            now.saturating_sub(crate::core::clock::MINUTE_MS - 1).min(self.calendars.earliest_day_start(now));
        let mut specs: Vec<(String, WindowSpec)> = Vec::new();
        for (platform, models) in &self.config.limit_sets {
            for set in models.values() {
                specs.extend(set.windows().map(|w| (platform.clone(), w)));
            }
        }
        for (platform, set) in &self.config.platform_sets {
            specs.extend(set.windows().map(|w| (platform.clone(), w)));
        }
        for r in &self.routes.list {
            from = from.min(r.win.oldest_counted(now));
        }
        for g in &self.accounts.groups {
            from = from.min(g.win.oldest_counted(now));
        }
        for a in &self.accounts.list {
            from = from.min(a.win.oldest_counted(now));
        }
        for k in &self.accounts.totals {
            from = from.min(k.win.oldest_counted(now));
        }
        for (platform, spec) in specs {
            from = from.min(self.calendars.window_start(&platform, spec, now));
        }
        from = from.min(self.tenant_horizon(now));
        self.loaded = Some((from, now));
        from
    }

    /// The models whose usage retention keeps past `before` at `now` (SPEC 14.2), each
    /// with its own cut-off: the oldest row its declared week, month or sliding window
    /// (wider than the minute) counts, in its own platform's calendar; with `with_day`,
    /// also the start of today for a model declaring a day window (what the degraded
    /// buffer keeps, SPEC 18.2). Every other model's rows go at `before`. Worked out
    /// once per change of the declarations or calendars, not per commit.
    pub fn retained_usage(&mut self, now: i64, before: i64, with_day: bool) -> Vec<KeptUsage> {
        if self.retained_windows.is_none() {
            let mut models: Vec<(String, String, Vec<WindowSpec>)> = Vec::new();
            for (platform, sets) in &self.config.limit_sets {
                for (model_id, set) in sets {
                    let kept: Vec<WindowSpec> =
                        set.windows().filter(|w| *w != crate::core::limits::MINUTE).collect();
                    if !kept.is_empty() {
                        models.push((platform.clone(), model_id.clone(), kept));
                    }
                }
            }
            models.sort();
            let retained = models
                .into_iter()
                .map(|(p, m, windows)| Retained {
                    cal: self.calendars.of(&p),
                    platform: Arc::from(p),
                    model_id: Arc::from(m),
                    windows,
                })
                .collect();
            self.retained_windows = Some(retained);
        }
        let retained = self.retained_windows.as_deref().unwrap_or_default();
        let mut kept: Vec<KeptUsage> = retained
            .iter()
            .filter_map(|r| {
                let from = r
                    .windows
                    .iter()
                    // The day is retention's own business (SPEC §10): `retention_ms`.
                    .filter(|w| with_day || **w != crate::core::limits::DAY)
                    .map(|w| match w {
                        WindowSpec::Sliding(width) => now.saturating_sub(width - 1),
                        WindowSpec::Calendar(p) => r.cal.period_start(*p, now),
                    })
                    .min()?;
                (from < before).then(|| KeptUsage::model(r.platform.clone(), r.model_id.clone(), from))
            })
            .collect();
        if !self.config.platform_sets.is_empty() {
            self.retain_for_platforms(&mut kept, now, before, with_day);
        }
        if !self.config.tenants.is_empty() {
            self.retain_for_tenants(&mut kept, now, before, with_day);
        }
        kept
    }

    /// SPEC 23.3 (and 14.2): a platform limit's window keeps the rows of every model of
    /// the platform the mirror knows (each model with rows in the window is a route
    /// once they are loaded): each such model keeps its rows from the oldest its
    /// platform's windows count, or its own cut-off when that is older. Sorted by name,
    /// as the models' own.
    fn retain_for_platforms(&mut self, kept: &mut Vec<KeptUsage>, now: i64, before: i64, with_day: bool) {
        let mut sets: Vec<(String, LimitSet)> =
            self.config.platform_sets.iter().map(|(p, s)| (p.clone(), s.clone())).collect();
        sets.sort_by(|a, b| a.0.cmp(&b.0));
        let mut added = false;
        for (platform, set) in sets {
            let from = set
                .windows()
                .filter(|w| *w != crate::core::limits::MINUTE && (with_day || *w != DAY))
                .map(|w| self.calendars.window_start(&platform, w, now))
                .min();
            let Some(from) = from.filter(|f| *f < before) else { continue };
            let Some((name, models)) = self.routes.index.get_key_value(platform.as_str()) else { continue };
            for model_id in models.keys() {
                match kept
                    .iter_mut()
                    .find(|k| k.tenant.is_none() && k.platform == *name && k.model_id == *model_id)
                {
                    Some(k) => k.before = k.before.min(from),
                    None => {
                        kept.push(KeptUsage::model(name.clone(), model_id.clone(), from));
                        added = true;
                    }
                }
            }
        }
        if added {
            kept.sort_by(|a, b| {
                (&a.tenant, &a.platform, &a.model_id).cmp(&(&b.tenant, &b.platform, &b.model_id))
            });
        }
    }

    /// Makes a route keep every window of `set` (after `prune_route`). False when one
    /// of them could not be counted from memory: `needs_reload` is then set.
    pub fn keep_windows(&mut self, rid: RouteId, set: &LimitSet) -> bool {
        let route = &mut self.routes[rid as usize];
        let mut complete = true;
        if !route.kept.same(set) {
            for spec in set.windows() {
                complete &= route.win.keep(spec);
            }
            route.kept = set.clone();
        }
        if let Some(g) = route.group {
            let group = &mut self.accounts.groups[g as usize];
            if !group.kept.same(set) {
                for spec in set.windows() {
                    complete &= group.win.keep(spec);
                }
                group.kept = set.clone();
            }
        }
        // SPEC 23.3: the platform's limits count the account's (and the key's) usage
        // over every model.
        let platform = if self.config.platform_sets.is_empty() {
            None
        } else {
            self.config.platform_sets.get(&*route.platform)
        };
        if let Some(platform) = platform {
            let (a, total) = (route.account, route.total);
            for spec in platform.windows() {
                complete &= self.accounts.list[a as usize].win.keep(spec);
                if let Some(k) = total {
                    complete &= self.accounts.totals[k as usize].win.keep(spec);
                }
            }
        }
        self.needs_reload |= !complete;
        complete
    }

    /// Drops events that left the windows and leases that expired at `now`.
    pub fn prune_route(&mut self, rid: RouteId, now: i64) {
        let leases = &self.leases;
        let route = &mut self.routes[rid as usize];
        route.win.prune(now);
        route.leases.retain(|id| leases.is_live(*id, now));
        let acct = &mut self.accounts.list[route.account as usize];
        acct.win.prune(now);
        acct.leases.retain(|id| leases.is_live(*id, now));
        if let Some(g) = route.group {
            let group = &mut self.accounts.groups[g as usize];
            group.win.prune(now);
            group.leases.retain(|id| leases.is_live(*id, now));
        }
        if let Some(k) = route.total {
            let total = &mut self.accounts.totals[k as usize];
            total.win.prune(now);
            total.leases.retain(|id| leases.is_live(*id, now));
        }
    }

    /// Prunes every route; drops expired leases from the lease table.
    pub fn prune_all(&mut self, now: i64) {
        for rid in 0..self.routes.list.len() as RouteId {
            self.prune_route(rid, now);
        }
        self.leases.by_id.retain(|_, l| l.live(now));
    }

    // ---- leases ------------------------------------------------------------------

    pub fn add_lease(&mut self, id: i64, rec: LeaseRec) {
        let route = &mut self.routes[rec.route as usize];
        route.leases.push(id);
        self.accounts.list[route.account as usize].leases.push(id);
        if let Some(g) = route.group {
            self.accounts.groups[g as usize].leases.push(id);
        }
        if let Some(k) = route.total {
            self.accounts.totals[k as usize].leases.push(id);
        }
        if !rec.tenants.is_empty() {
            let tenants = rec.tenants.clone();
            self.add_tenant_lease(&tenants, id);
        }
        self.leases.by_id.insert(id, rec);
    }

    /// The live leases on route `rid`'s key (any model of its account) at `now`: what
    /// a lease admitted on it now finds (SPEC 24.2).
    pub fn key_leases_at(&self, rid: RouteId, now: i64) -> i64 {
        let route = &self.routes[rid as usize];
        let of_key = |l: &LeaseRec| {
            let r = &self.routes[l.route as usize];
            l.live(now) && r.key_id == route.key_id && r.platform == route.platform
        };
        self.accounts.list[route.account as usize]
            .leases
            .iter()
            .filter(|id| self.leases.by_id.get(id).is_some_and(of_key))
            .count() as i64
    }

    pub fn route_in_flight(&self, rid: RouteId, now: i64) -> InFlight {
        self.leases.in_flight(&self.routes[rid as usize].leases, now)
    }

    /// What a limit's scope has recorded in its window for a route: the route's own
    /// counts, or its shared account's on the model for a limit at account scope.
    pub fn scoped_counts(&self, rid: RouteId, l: &crate::core::limits::Limit, now: i64) -> Counts {
        let r = &self.routes[rid as usize];
        let win = match r.group {
            Some(g) if l.scope == Scope::Account => &self.accounts.groups[g as usize].win,
            _ => &r.win,
        };
        win.counts(l.window, now).unwrap_or_default()
    }

    /// SPEC 23.3: a platform scope's counters for a route (the key's over every model,
    /// or its account's) and what it has in flight, raw tokens; a model's scope has
    /// none.
    pub fn platform_tally(&self, a: AccountId, key_id: i64, scope: Scope, now: i64) -> Option<Tally<'_>> {
        let total = match scope {
            Scope::PlatformKey => self.accounts.total_index.get(&(a, key_id)),
            Scope::PlatformAccount => None,
            _ => return None,
        };
        let (win, leases) = match total {
            Some(k) => (&self.accounts.totals[*k as usize].win, &self.accounts.totals[*k as usize].leases),
            None => (&self.accounts.list[a as usize].win, &self.accounts.list[a as usize].leases),
        };
        Some(Tally { win, in_flight: self.leases.in_flight(leases, now) })
    }

    // ---- keys, models, caps, cooldowns ---------------------------------------------

    pub fn put_model(&mut self, m: ModelInfo) {
        // The label's billing multiplier and the gate order are worked out once here,
        // not at every admission.
        let platform = m.platform.clone();
        let model_id = m.model_id.clone();
        let set = self.config.put_model(m);
        let routes: Vec<RouteId> = self
            .routes
            .index
            .get(platform.as_str())
            .and_then(|ms| ms.get(model_id.as_str()))
            .map(|ks| ks.values().copied().collect())
            .unwrap_or_default();
        for rid in routes {
            self.keep_windows(rid, &set);
        }
        // A declaration that reaches further back than the last load: the routes not
        // seen yet have rows in the store to count too.
        if let Some((since, at)) = self.loaded {
            if set.windows().any(|w| self.calendars.window_start(&platform, w, at) < since) {
                self.needs_reload = true;
            }
        }
        self.retained_windows = None;
    }

    /// What benches a route (SPEC 21.1): whichever of its own cooldown and its model's
    /// ends later; true when it is the model's.
    #[inline]
    pub fn route_bench(&self, rid: RouteId, now: i64) -> Option<(CooldownRec, bool)> {
        let own = self.cooldowns.of_route(rid, now);
        let r = &self.routes[rid as usize];
        match (own, self.cooldowns.of_model(&r.platform, &r.model_id, now)) {
            (Some(o), Some(m)) if m.expires_at_ms > o.expires_at_ms => Some((m, true)),
            (Some(o), _) => Some((o, false)),
            (None, m) => m.map(|m| (m, true)),
        }
    }

    // ---- provider accounts ---------------------------------------------------------

    /// Requests since midnight on the account (all models).
    pub fn provider_day_requests(&self, platform: &str, key_id: i64, now: i64) -> i64 {
        self.accounts
            .of(platform, &self.config.account_name(platform, key_id))
            .map_or(0, |a| self.accounts.list[a as usize].win.day(now).requests)
    }

    pub fn provider_minute_requests(&self, platform: &str, key_id: i64, _now: i64) -> i64 {
        self.accounts
            .of(platform, &self.config.account_name(platform, key_id))
            .map_or(0, |a| self.accounts.list[a as usize].win.minute().requests)
    }

    /// Billed tokens since midnight on the account: each model's raw tokens times its
    /// multiplier, rounded up per model. Without a cap, raw tokens.
    pub fn provider_day_tokens(&self, platform: &str, key_id: i64, cap: Option<i64>, now: i64) -> i64 {
        self.accounts
            .of(platform, &self.config.account_name(platform, key_id))
            .map_or(0, |a| self.accounts.tokens(a, DAY, cap, (&self.routes.list, &self.config), now))
    }

    // ---- forecasts (SPEC 22.2) --------------------------------------------------------

    /// Makes the windows a forecast of `rid` reads keep a sliding window of `width`:
    /// the route's and its group's, every route of its account (billed tokens) and the
    /// account's (requests). False when one of them could not be counted from memory:
    /// `needs_reload` is then set. Prunes what it touches at `now` first.
    pub fn keep_recent(&mut self, rid: RouteId, width: i64, now: i64) -> bool {
        let spec = WindowSpec::Sliding(width);
        let a = self.routes[rid as usize].account;
        let mut complete = true;
        for r in self.accounts.list[a as usize].routes.clone() {
            self.prune_route(r, now);
            let route = &mut self.routes[r as usize];
            complete &= route.win.keep(spec);
            if let Some(g) = route.group {
                complete &= self.accounts.groups[g as usize].win.keep(spec);
            }
        }
        complete &= self.accounts.list[a as usize].win.keep(spec);
        let totals: Vec<TotalId> =
            self.accounts.total_index.iter().filter(|((of, _), _)| *of == a).map(|(_, k)| *k).collect();
        for k in totals {
            complete &= self.accounts.totals[k as usize].win.keep(spec);
        }
        self.needs_reload |= !complete;
        complete
    }

    /// Requests of the route's account (every model) in the last `width`, and its
    /// tokens billed per model at `cap`'s multipliers (`keep_recent` first).
    pub fn recent_account(&self, rid: RouteId, cap: Option<i64>, width: i64, now: i64) -> (i64, i64) {
        let spec = WindowSpec::Sliding(width);
        let a = self.routes[rid as usize].account;
        let requests = self.accounts.list[a as usize].win.counts(spec, now).unwrap_or_default().requests;
        let mut billed = 0i64;
        if let Some(cap) = cap {
            for r in &self.accounts.list[a as usize].routes {
                let raw = self.routes[*r as usize].win.counts(spec, now).unwrap_or_default().tokens;
                billed = billed.saturating_add(self.routes[*r as usize].billing(&self.config, cap).bill(raw));
            }
        }
        (requests, billed)
    }

    /// The write that takes lease `id` on route `rid` at `now` for `est`, counting
    /// until `max_age_ms` from now (SPEC §5).
    pub fn lease_write(
        &mut self, rid: RouteId, id: i64, est: Estimate, tenants: &TenantList, now: i64, max_age_ms: i64,
    ) -> Write {
        self.lease_route = Some(rid);
        let r = self.routes.get(rid);
        Write::InsertLease(LeaseRow {
            id,
            tenants: tenants.clone(),
            platform: r.platform.clone(),
            model_id: r.model_id.clone(),
            key_id: r.key_id,
            tokens: est.tokens,
            output_tokens: est.output,
            cost: est.cost,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(max_age_ms),
        })
    }

    // ---- the view of a decision -----------------------------------------------------

    /// Everything one admission on a route (or, with `rid` None, a provider gate on an
    /// account) reads, gathered once: each scope's windows and live leases (SPEC §4's
    /// "in flight"), the account's billed tokens when a provider token limit is in
    /// force, the cooldown. Call `prune_route` and `keep_windows` first.
    pub fn view<'a>(
        &'a self, rid: Option<RouteId>, a: AccountId, key_id: i64, ctx: &'a GateContext, est: Estimate,
        now: i64,
    ) -> View<'a> {
        let key =
            rid.map(|r| Tally { win: &self.routes[r as usize].win, in_flight: self.route_in_flight(r, now) });
        let account = match rid.and_then(|r| self.routes[r as usize].group) {
            Some(g) => Some(Tally {
                win: &self.accounts.groups[g as usize].win,
                in_flight: self.leases.in_flight(&self.accounts.groups[g as usize].leases, now),
            }),
            None => key,
        };
        // SPEC §8: tokens at provider scope are billed at each model's multiplier.
        let token_cap = ctx.provider.iter().find(|d| d.limit.metric.is_tokens()).map(|d| &d.limit);
        let parts = (&self.routes.list[..], &self.leases, &self.config);
        let (in_flight, key_leases) =
            self.accounts.in_flight(a, key_id, token_cap.map(|l| l.limit), parts, now);
        let billed = token_cap.map(|l| Billed {
            window: l.window,
            used: self.accounts.tokens(a, l.window, Some(l.limit), (&self.routes.list, &self.config), now),
            estimate: rid.map_or(est.tokens, |r| {
                self.routes[r as usize].billing(&self.config, l.limit).bill(est.tokens)
            }),
        });
        // SPEC 23.3: read only when the platform declares limits (the hot path).
        let platform =
            |scope| if ctx.platform.is_empty() { None } else { self.platform_tally(a, key_id, scope, now) };
        View {
            now,
            est,
            ctx,
            cooldown_until: rid.and_then(|r| self.route_bench(r, now)).map(|(c, _)| c.expires_at_ms),
            key,
            account,
            provider: Tally { win: &self.accounts.list[a as usize].win, in_flight },
            billed,
            key_leases,
            platform_key: platform(Scope::PlatformKey),
            platform_account: platform(Scope::PlatformAccount),
        }
    }

    /// The view of a decision on a route.
    pub fn route_view<'a>(&'a self, rid: RouteId, ctx: &'a GateContext, est: Estimate, now: i64) -> View<'a> {
        let r = &self.routes[rid as usize];
        self.view(Some(rid), r.account, r.key_id, ctx, est, now)
    }
}

#[cfg(test)]
mod tests;
