//! The engine's in-memory picture of the store: window state per route and per
//! provider account, live leases, cooldowns, keys, models and caps. Kept current
//! incrementally from the store's change feed, and the only thing gates read.
use crate::core::calendar::Calendar;
use crate::core::cooldowns::LEARNED_CAP_TTL_MS;
use crate::core::limits::{Declared, LimitSet, Metric, Scope, WindowSpec};
use crate::core::store::{CooldownRow, HistoryKind, HistoryRow, KeptUsage, LeaseRow, UsageKind, UsageRow};
use crate::core::types::{Admission, CapOverrides, CooldownSource, KeyInfo, ModelInfo, ProviderCaps, Reason};
use crate::core::windows::{Counts, Windows};
use regex::Regex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

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
    pub win: Windows,
    leases: Vec<i64>,
    /// The last limit set whose windows `win` was made to keep (windows are never
    /// dropped, so a decision under the same set has nothing to check).
    kept: LimitSet,
}

#[derive(Debug)]
struct AccountState {
    name: Arc<str>,
    /// Requests of every model of the account (tokens are billed per route).
    win: Windows,
    routes: Vec<RouteId>,
    leases: Vec<i64>,
}

/// Usage and live leases of every key of one account on one model: what a limit at
/// account scope counts (SPEC §14.1, §14.3).
#[derive(Debug)]
struct GroupState {
    win: Windows,
    leases: Vec<i64>,
    kept: LimitSet,
}

#[derive(Debug, Clone, Copy)]
pub struct LeaseRec {
    pub route: RouteId,
    pub tokens: i64,
    /// Of `tokens`, the estimated output.
    pub output_tokens: i64,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
}

impl LeaseRec {
    /// A lease counts until it is older than `lease_max_age_ms` (SPEC §5): at exactly
    /// that age (`now == expires_at_ms`) it still counts.
    fn live(&self, now: i64) -> bool {
        now <= self.expires_at_ms
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CooldownRec {
    pub expires_at_ms: i64,
    pub source: CooldownSource,
    pub set_at_ms: i64,
}

/// The live leases one admission decision reads, derived once per decision.
#[derive(Debug, Clone, Copy)]
pub struct View {
    pub rid: Option<RouteId>,
    pub account: AccountId,
    /// The route's live leases (count and estimated tokens).
    pub route: InFlight,
    /// Live leases on the account, and their tokens billed at each lease's model rate
    /// (0 unless a provider daily token cap is set).
    pub account_count: i64,
    pub account_billed: i64,
    /// Live leases on the key (every model).
    pub key_count: i64,
    /// A shared account's (account, model) counters and their live leases: what
    /// account-scope limits read (SPEC §14.3).
    pub group: Option<(GroupId, InFlight)>,
}

/// Live in-flight totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    pub count: i64,
    pub tokens: i64,
    /// Of `tokens`, estimated output.
    pub output_tokens: i64,
}

/// How much of `requests` requests estimated at `tokens` tokens, `output` of them
/// output, counts in a metric's windows (SPEC §14.4): the requests in a request
/// window, the estimate in total-token windows, the estimate less its output in
/// input windows, the output in output windows.
pub fn estimate_in(metric: Metric, requests: i64, tokens: i64, output: i64) -> i64 {
    match metric {
        Metric::Requests => requests,
        Metric::Tokens => tokens,
        Metric::InputTokens => tokens.saturating_sub(output).max(0),
        Metric::OutputTokens => output,
    }
}

impl InFlight {
    /// What the live leases hold in a metric's windows.
    pub fn get(&self, metric: Metric) -> i64 {
        estimate_in(metric, self.count, self.tokens, self.output_tokens)
    }
}

/// An admission's estimate: `tokens` in all, `output` of them output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimate {
    pub tokens: i64,
    pub output: i64,
}

impl Estimate {
    pub fn tokens(tokens: i64) -> Estimate {
        Estimate { tokens, output: 0 }
    }
}

/// What a gate needs besides the window state.
#[derive(Debug, Clone, Default)]
pub struct GateContext {
    pub limits: LimitSet,
    pub caps: ProviderCaps,
    pub concurrency_cap: Option<i64>,
}

#[derive(Debug, Default)]
pub struct Mirror {
    routes: Vec<RouteState>,
    index: RouteIndex,
    accounts: Vec<AccountState>,
    /// platform -> account name -> account.
    account_index: FastMap<Arc<str>, FastMap<Arc<str>, AccountId>>,
    groups: Vec<GroupState>,
    group_index: FastMap<(AccountId, Arc<str>), GroupId>,
    /// (platform, account name) -> how many registered keys it has.
    account_members: HashMap<(String, Arc<str>), usize>,
    leases: FastMap<i64, LeaseRec>,
    pub cooldowns: FastMap<RouteId, CooldownRec>,
    /// Registered keys; change them through `put_key` / `replace_keys`.
    pub keys: HashMap<i64, KeyInfo>,
    /// platform -> its registered, enabled keys, kept with `keys`.
    routable: HashMap<String, Vec<i64>>,
    models: HashMap<String, HashMap<String, ModelInfo>>,
    /// platform -> model_id -> the billing multiplier of its `monthly_token_budget` label.
    billing: FastMap<String, FastMap<String, Option<Multiplier>>>,
    /// platform -> model_id -> its declared limits in gate order, built once.
    limit_sets: FastMap<String, FastMap<String, LimitSet>>,
    /// Some route started keeping a window its events were not kept for: the usage
    /// is to be loaded again from the store.
    pub needs_reload: bool,
    /// The models retention keeps rows of past `retention_ms`, with their windows
    /// (`None`: to be worked out again after a change of declarations or calendars).
    retained_windows: Option<Vec<Retained>>,
    /// (since, at): the last load read the rows stamped `since` or later, at `at`.
    loaded: Option<(i64, i64)>,
    pub caps: FastMap<String, CapOverrides>,
    /// `failure_history` by key_id, mirrored (pruned after 24 h, cleared by successes).
    history: FastMap<i64, Vec<HistoryRow>>,
    pub calendars: Calendars,
}

/// A model with declared windows wider than the minute, for retention (SPEC 14.2).
#[derive(Debug)]
struct Retained {
    platform: Arc<str>,
    model_id: Arc<str>,
    cal: Calendar,
    windows: Vec<WindowSpec>,
}

/// Which calendar each platform's days follow (SPEC §14.2): one set in the store
/// wins, then `PROVIDER_DAY_TZ_<PLATFORM>`, then the built-in zone.
#[derive(Debug, Default)]
pub struct Calendars {
    /// platform -> zone name, as stored (`set_platform_calendar`).
    set: HashMap<String, String>,
    /// Upper-cased platform -> calendar, from the environment (valid zones only).
    env: HashMap<String, Calendar>,
    /// platform -> calendar in force, resolved on first use.
    resolved: HashMap<String, Calendar>,
}

impl Calendars {
    pub fn with_env(env: HashMap<String, Calendar>) -> Calendars {
        Calendars { env, ..Calendars::default() }
    }

    /// The calendar in force for a platform.
    pub fn of(&mut self, platform: &str) -> Calendar {
        if let Some(c) = self.resolved.get(platform) {
            return c.clone();
        }
        let c = self
            .set
            .get(platform)
            .and_then(|z| Calendar::of_zone(z))
            .or_else(|| self.env.get(&crate::core::env::env_suffix(platform)).cloned())
            .or_else(|| Calendar::of_zone(crate::core::calendar::builtin_zone(platform)))
            .unwrap_or_default();
        self.resolved.insert(platform.to_string(), c.clone());
        c
    }

    /// The stored zones; the platforms whose calendar this changes.
    fn replace(&mut self, set: HashMap<String, String>) -> Vec<String> {
        let mut platforms: Vec<String> = set.keys().chain(self.set.keys()).cloned().collect();
        platforms.sort();
        platforms.dedup();
        let before: Vec<Calendar> = platforms.iter().map(|p| self.of(p)).collect();
        self.set = set;
        self.resolved.clear();
        platforms.into_iter().zip(before).filter_map(|(p, old)| (self.of(&p) != old).then_some(p)).collect()
    }

    /// Every calendar resolved so far (the platforms the mirror has seen).
    fn all(&self) -> impl Iterator<Item = &Calendar> {
        self.resolved.values()
    }
}

impl Mirror {
    pub fn with_calendars(calendars: Calendars) -> Mirror {
        Mirror { calendars, ..Mirror::default() }
    }

    /// The stored platform zones changed (ours or another engine's): routes and
    /// accounts of a platform whose calendar changed start over with its new days.
    /// True when any did: the caller reloads usage from the store.
    pub fn replace_calendars(&mut self, set: HashMap<String, String>) -> bool {
        let changed = self.calendars.replace(set);
        self.retained_windows = None;
        for p in &changed {
            let cal = self.calendars.of(p);
            for r in self.routes.iter_mut().filter(|r| &*r.platform == p.as_str()) {
                r.win = r.win.cleared(cal.clone());
            }
            if let Some(accts) = self.account_index.get(p.as_str()) {
                for a in accts.values() {
                    let acct = &mut self.accounts[*a as usize];
                    acct.win = acct.win.cleared(cal.clone());
                }
            }
            let of_platform = |a: &AccountId| {
                self.accounts[*a as usize]
                    .routes
                    .first()
                    .is_some_and(|r| &*self.routes[*r as usize].platform == p.as_str())
            };
            let gids: Vec<GroupId> =
                self.group_index.iter().filter(|((a, _), _)| of_platform(a)).map(|(_, g)| *g).collect();
            for g in gids {
                let grp = &mut self.groups[g as usize];
                grp.win = grp.win.cleared(cal.clone());
            }
        }
        !changed.is_empty()
    }

    /// The stored zones, with one changed (for a write of our own).
    pub fn zones_with(&self, platform: &str, zone: Option<&str>) -> HashMap<String, String> {
        let mut set = self.calendars.set.clone();
        match zone {
            Some(z) => set.insert(platform.to_string(), z.to_string()),
            None => set.remove(platform),
        };
        set
    }

    /// The account a key belongs to (SPEC §14.3): the one it was registered with, else
    /// its own, `"key:<key_id>"`.
    pub fn account_name(&self, platform: &str, key_id: i64) -> Arc<str> {
        match self.keys.get(&key_id) {
            Some(KeyInfo { platform: p, account: Some(a), .. }) if p == platform => Arc::from(a.as_str()),
            _ => Arc::from(format!("key:{key_id}")),
        }
    }

    /// Whether an account has more than one registered key.
    fn shared(&self, platform: &str, name: &Arc<str>) -> bool {
        self.account_members.get(&(platform.to_string(), name.clone())).is_some_and(|n| *n > 1)
    }

    /// The keys of a route's account when it has several (`None`, without allocating,
    /// for a key of its own: the hot path).
    pub fn shared_account_keys(&self, route: &crate::core::types::Route) -> Option<Vec<i64>> {
        let rid = self.find_route(&route.platform, &route.model_id, route.key_id)?;
        self.routes[rid as usize].group?;
        Some(self.account_keys(&route.platform, route.key_id))
    }

    /// The registered keys of the account a key belongs to (the key alone when it is
    /// its own account).
    pub fn account_keys(&self, platform: &str, key_id: i64) -> Vec<i64> {
        let name = self.account_name(platform, key_id);
        if !self.shared(platform, &name) {
            return vec![key_id];
        }
        let mut keys: Vec<i64> = self
            .keys
            .values()
            .filter(|k| k.platform == platform && k.account.as_deref() == Some(&*name))
            .map(|k| k.key_id)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The id of a provider account (platform, key_id), created on first sight.
    pub fn account_id(&mut self, platform: &str, key_id: i64) -> AccountId {
        let name = self.account_name(platform, key_id);
        if let Some(a) = self.account_index.get(platform).and_then(|k| k.get(&name)) {
            return *a;
        }
        let p: Arc<str> =
            self.index.get_key_value(platform).map_or_else(|| Arc::from(platform), |(k, _)| k.clone());
        let a = self.accounts.len() as AccountId;
        let win = Windows::new(self.calendars.of(platform));
        self.accounts.push(AccountState { name: name.clone(), win, routes: vec![], leases: vec![] });
        self.account_index.entry(p).or_default().insert(name, a);
        a
    }

    /// The (account, model) counters of a route of a shared account, created on first
    /// sight with the model's windows.
    fn group_id(&mut self, a: AccountId, model_id: &Arc<str>, platform: &str) -> GroupId {
        if let Some(g) = self.group_index.get(&(a, model_id.clone())) {
            return *g;
        }
        let g = self.groups.len() as GroupId;
        let mut win = Windows::new(self.calendars.of(platform));
        for spec in self.limit_set(platform, model_id).windows() {
            win.keep(spec);
        }
        self.groups.push(GroupState { win, leases: vec![], kept: LimitSet::default() });
        self.group_index.insert((a, model_id.clone()), g);
        g
    }

    /// Puts every route in the account its key belongs to now, after keys changed
    /// accounts; the account and group counters are then recounted from the store.
    fn reassign_accounts(&mut self) {
        self.accounts.clear();
        self.account_index.clear();
        self.groups.clear();
        self.group_index.clear();
        for rid in 0..self.routes.len() {
            let (platform, model, key) = {
                let r = &self.routes[rid];
                (r.platform.clone(), r.model_id.clone(), r.key_id)
            };
            let a = self.account_id(&platform, key);
            self.accounts[a as usize].routes.push(rid as RouteId);
            let name = self.accounts[a as usize].name.clone();
            let group = self.shared(&platform, &name).then(|| self.group_id(a, &model, &platform));
            let r = &mut self.routes[rid];
            r.account = a;
            r.group = group;
        }
        let mut ids: Vec<(i64, RouteId)> = self.leases.iter().map(|(id, l)| (*id, l.route)).collect();
        ids.sort_unstable();
        for (id, rid) in ids {
            let r = &self.routes[rid as usize];
            self.accounts[r.account as usize].leases.push(id);
            if let Some(g) = r.group {
                self.groups[g as usize].leases.push(id);
            }
        }
        self.needs_reload = true;
    }

    /// After the keys changed: when a route's account (or whether it is shared)
    /// changed, reassign.
    fn accounts_changed(&mut self) {
        let mut members: HashMap<(String, Arc<str>), usize> = HashMap::new();
        for k in self.keys.values() {
            if let Some(a) = &k.account {
                *members.entry((k.platform.clone(), Arc::from(a.as_str()))).or_default() += 1;
            }
        }
        self.account_members = members;
        let stale = self.routes.iter().any(|r| {
            let name = self.account_name(&r.platform, r.key_id);
            let acct = &self.accounts[r.account as usize];
            acct.name != name || r.group.is_some() != self.shared(&r.platform, &name)
        });
        if stale {
            self.reassign_accounts();
        }
    }

    /// The account a route belongs to.
    pub fn account_of_route(&self, rid: RouteId) -> AccountId {
        self.routes[rid as usize].account
    }

    /// Prunes an account's own windows and lease list.
    pub fn prune_account_id(&mut self, a: AccountId, now: i64) {
        let leases = &self.leases;
        let acct = &mut self.accounts[a as usize];
        acct.win.prune(now);
        acct.leases.retain(|id| leases.get(id).is_some_and(|l| l.live(now)));
    }

    /// The id of a route, created on first sight.
    pub fn route_id(&mut self, platform: &str, model_id: &str, key_id: i64) -> RouteId {
        if let Some(id) = self.index.get(platform).and_then(|m| m.get(model_id)).and_then(|k| k.get(&key_id))
        {
            return *id;
        }
        let p: Arc<str> =
            self.index.get_key_value(platform).map_or_else(|| Arc::from(platform), |(k, _)| k.clone());
        let m: Arc<str> = Arc::from(model_id);
        let account = self.account_id(platform, key_id);
        let name = self.accounts[account as usize].name.clone();
        let group = self.shared(platform, &name).then(|| self.group_id(account, &m, platform));
        let id = self.routes.len() as RouteId;
        let mut win = Windows::new(self.calendars.of(platform));
        // A route seen for the first time had no events since the last load, which
        // reached back as far as any declared window: its windows are complete.
        for spec in self.limit_set(platform, model_id).windows() {
            win.keep(spec);
        }
        self.routes.push(RouteState {
            platform: p.clone(),
            model_id: m.clone(),
            key_id,
            account,
            group,
            win,
            leases: vec![],
            kept: LimitSet::default(),
        });
        self.accounts[account as usize].routes.push(id);
        self.index.entry(p).or_default().entry(m).or_default().insert(key_id, id);
        id
    }

    pub fn find_route(&self, platform: &str, model_id: &str, key_id: i64) -> Option<RouteId> {
        self.index.get(platform)?.get(model_id)?.get(&key_id).copied()
    }

    pub fn route(&self, id: RouteId) -> &RouteState {
        &self.routes[id as usize]
    }

    /// Where the days of a route start.
    pub fn route_calendar(&self, id: RouteId) -> &Calendar {
        self.routes[id as usize].win.calendar()
    }

    /// The earliest start of today among the calendars that may be in use: the
    /// oldest row a day window may count at `now`. Platforms not seen yet may have a
    /// zone 14 hours behind UTC at most: their day started at most 14 h before UTC's.
    pub fn earliest_day_start(&self, now: i64) -> i64 {
        let mut earliest = Calendar::utc().day_start(now.saturating_sub(14 * 3_600_000));
        for c in self.calendars.all() {
            earliest = earliest.min(c.day_start(now));
        }
        earliest
    }

    pub fn routes(&self) -> impl Iterator<Item = (RouteId, &RouteState)> {
        self.routes.iter().enumerate().map(|(i, r)| (i as RouteId, r))
    }

    fn account_of(&self, platform: &str, key_id: i64) -> Option<AccountId> {
        self.account_index.get(platform)?.get(&self.account_name(platform, key_id)).copied()
    }

    // ---- usage -------------------------------------------------------------------

    /// Counts `req` requests and `tok` tokens stamped `t` in the route's windows.
    pub fn add_usage(&mut self, rid: RouteId, req: i64, tok: i64, t: i64, now: i64) {
        self.add_counts(rid, Counts::of(req, tok.max(0)), t, now);
    }

    /// Counts an event stamped `t` in the route's windows (its requests also in the
    /// account's).
    pub fn add_counts(&mut self, rid: RouteId, c: Counts, t: i64, now: i64) {
        let route = &mut self.routes[rid as usize];
        route.win.add_counts(t, c, now);
        if let Some(g) = route.group {
            self.groups[g as usize].win.add_counts(t, c, now);
        }
        if c.requests > 0 {
            self.accounts[route.account as usize].win.add(t, c.requests, 0, now);
        }
    }

    pub fn add_usage_row(&mut self, row: &UsageRow, now: i64) {
        let rid = self.route_id(&row.platform, &row.model_id, row.key_id);
        let c = match row.kind {
            UsageKind::Tokens => Counts {
                requests: 0,
                tokens: row.tokens.max(0),
                input_tokens: row.kinds.metered_input(),
                output_tokens: row.kinds.output.unwrap_or(0).max(0),
            },
            UsageKind::Request => Counts::of(row.requests(), 0),
        };
        self.add_counts(rid, c, row.created_at_ms, now);
    }

    /// Forgets all window state (before a reload from the store).
    pub fn reset_usage(&mut self) {
        for r in &mut self.routes {
            r.win = r.win.cleared(r.win.calendar().clone());
        }
        for a in &mut self.accounts {
            a.win = a.win.cleared(a.win.calendar().clone());
        }
        for g in &mut self.groups {
            g.win = g.win.cleared(g.win.calendar().clone());
        }
        self.needs_reload = false;
    }

    /// The oldest row any window of the mirror counts at `now`: the 60 s window, the
    /// earliest day start, and every window a route keeps or a model declares.
    pub fn usage_horizon(&mut self, now: i64) -> i64 {
        let from = self.usage_horizon_at(now);
        self.loaded = Some((from, now));
        from
    }

    fn usage_horizon_at(&mut self, now: i64) -> i64 {
        let mut from =
            now.saturating_sub(crate::core::clock::MINUTE_MS - 1).min(self.earliest_day_start(now));
        let mut specs: Vec<(String, WindowSpec)> = Vec::new();
        for (platform, models) in &self.limit_sets {
            for set in models.values() {
                specs.extend(set.windows().map(|w| (platform.clone(), w)));
            }
        }
        for r in &self.routes {
            from = from.min(r.win.oldest_counted(now));
        }
        for g in &self.groups {
            from = from.min(g.win.oldest_counted(now));
        }
        for (platform, spec) in specs {
            from = from.min(self.window_start(&platform, spec, now));
        }
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
            for (platform, sets) in &self.limit_sets {
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
        retained
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
                (from < before).then(|| KeptUsage {
                    platform: r.platform.clone(),
                    model_id: r.model_id.clone(),
                    before: from,
                })
            })
            .collect()
    }

    /// The oldest time a window of a platform counts at `now`.
    fn window_start(&mut self, platform: &str, spec: WindowSpec, now: i64) -> i64 {
        match spec {
            WindowSpec::Sliding(w) => now.saturating_sub(w - 1),
            WindowSpec::Calendar(p) => self.calendars.of(platform).period_start(p, now),
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
            let group = &mut self.groups[g as usize];
            if !group.kept.same(set) {
                for spec in set.windows() {
                    complete &= group.win.keep(spec);
                }
                group.kept = set.clone();
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
        route.leases.retain(|id| leases.get(id).is_some_and(|l| l.live(now)));
        let acct = &mut self.accounts[route.account as usize];
        acct.win.prune(now);
        acct.leases.retain(|id| leases.get(id).is_some_and(|l| l.live(now)));
        if let Some(g) = route.group {
            let group = &mut self.groups[g as usize];
            group.win.prune(now);
            group.leases.retain(|id| leases.get(id).is_some_and(|l| l.live(now)));
        }
    }

    /// Prunes every route; drops expired leases from the lease table.
    pub fn prune_all(&mut self, now: i64) {
        for rid in 0..self.routes.len() as RouteId {
            self.prune_route(rid, now);
        }
        self.leases.retain(|_, l| l.live(now));
    }

    // ---- leases ------------------------------------------------------------------

    pub fn add_lease(&mut self, id: i64, rec: LeaseRec) {
        let route = &mut self.routes[rec.route as usize];
        route.leases.push(id);
        self.accounts[route.account as usize].leases.push(id);
        if let Some(g) = route.group {
            self.groups[g as usize].leases.push(id);
        }
        self.leases.insert(id, rec);
    }

    /// A lease the mirror holds (live or not yet pruned).
    pub fn lease(&self, id: i64) -> Option<&LeaseRec> {
        self.leases.get(&id)
    }

    pub fn remove_lease(&mut self, id: i64) -> Option<LeaseRec> {
        let rec = self.leases.remove(&id)?;
        let route = &mut self.routes[rec.route as usize];
        route.leases.retain(|l| *l != id);
        self.accounts[route.account as usize].leases.retain(|l| *l != id);
        if let Some(g) = route.group {
            self.groups[g as usize].leases.retain(|l| *l != id);
        }
        Some(rec)
    }

    /// Replaces the leases with the stored `rows`, keeping those whose insertion is
    /// still waiting to be written and skipping those whose deletion is.
    pub fn replace_stored_leases(
        &mut self,
        rows: &[LeaseRow],
        pending_deleted: &HashSet<i64>,
        pending_inserted: &HashSet<i64>,
    ) {
        let stored: Vec<i64> =
            self.leases.keys().copied().filter(|id| !pending_inserted.contains(id)).collect();
        for id in stored {
            self.remove_lease(id);
        }
        for row in rows {
            if pending_deleted.contains(&row.id) {
                continue;
            }
            let rid = self.route_id(&row.platform, &row.model_id, row.key_id);
            self.add_lease(
                row.id,
                LeaseRec {
                    route: rid,
                    tokens: row.tokens,
                    output_tokens: row.output_tokens,
                    created_at_ms: row.created_at_ms,
                    expires_at_ms: row.expires_at_ms,
                },
            );
        }
    }

    pub fn route_in_flight(&self, rid: RouteId, now: i64) -> InFlight {
        let mut f = InFlight::default();
        for id in &self.routes[rid as usize].leases {
            if let Some(l) = self.leases.get(id).filter(|l| l.live(now)) {
                f.count += 1;
                f.tokens = f.tokens.saturating_add(l.tokens);
                f.output_tokens = f.output_tokens.saturating_add(l.output_tokens);
            }
        }
        f
    }

    /// Live leases of a shared account on one model.
    fn group_in_flight(&self, g: GroupId, now: i64) -> InFlight {
        let mut f = InFlight::default();
        for id in &self.groups[g as usize].leases {
            if let Some(l) = self.leases.get(id).filter(|l| l.live(now)) {
                f.count += 1;
                f.tokens = f.tokens.saturating_add(l.tokens);
                f.output_tokens = f.output_tokens.saturating_add(l.output_tokens);
            }
        }
        f
    }

    /// What a limit's scope has recorded in its window for a route: the route's own
    /// counts, or its shared account's on the model for a limit at account scope.
    pub fn scoped_counts(&self, rid: RouteId, l: &crate::core::limits::Limit, now: i64) -> Counts {
        let r = &self.routes[rid as usize];
        let win = match r.group {
            Some(g) if l.scope == Scope::Account => &self.groups[g as usize].win,
            _ => &r.win,
        };
        win.counts(l.window, now).unwrap_or_default()
    }

    /// Every window a route's account keeps on its model, when the account is shared.
    pub fn group_counts(&self, rid: RouteId, now: i64) -> Option<Vec<(WindowSpec, Counts)>> {
        let g = self.routes[rid as usize].group?;
        Some(self.groups[g as usize].win.all_counts(now))
    }

    /// Live leases on an account, with tokens billed per lease at its own model's rate.
    /// With the live leases of `key_id` alone among them (the key concurrency cap is
    /// the key's, SPEC §4).
    fn account_in_flight(&self, a: AccountId, key_id: i64, cap: Option<i64>, now: i64) -> (InFlight, i64) {
        let acct = &self.accounts[a as usize];
        let mut f = InFlight::default();
        let mut of_key = 0;
        for id in &acct.leases {
            if let Some(l) = self.leases.get(id).filter(|l| l.live(now)) {
                f.count += 1;
                if self.routes[l.route as usize].key_id == key_id {
                    of_key += 1;
                }
                if let Some(cap) = cap {
                    let mult = self.multiplier(l.route, cap);
                    f.tokens = f.tokens.saturating_add(mult.bill(l.tokens));
                }
            }
        }
        (f, of_key)
    }

    // ---- keys, models, caps, cooldowns ---------------------------------------------

    pub fn model(&self, platform: &str, model_id: &str) -> Option<&ModelInfo> {
        self.models.get(platform)?.get(model_id)
    }

    pub fn put_model(&mut self, m: ModelInfo) {
        // The label's billing multiplier and the gate order are worked out once here,
        // not at every admission.
        let billing = m.monthly_token_budget.as_deref().and_then(parse_multiplier);
        self.billing.entry(m.platform.clone()).or_default().insert(m.model_id.clone(), billing);
        let set = LimitSet::with_classic(m.limits, m.others.clone())
            .unwrap_or_else(|_| LimitSet::from_classic(m.limits));
        let routes: Vec<RouteId> = self
            .index
            .get(m.platform.as_str())
            .and_then(|ms| ms.get(m.model_id.as_str()))
            .map(|ks| ks.values().copied().collect())
            .unwrap_or_default();
        for rid in routes {
            self.keep_windows(rid, &set);
        }
        // A declaration that reaches further back than the last load: the routes not
        // seen yet have rows in the store to count too.
        if let Some((since, at)) = self.loaded {
            let platform = m.platform.clone();
            if set.windows().any(|w| self.window_start(&platform, w, at) < since) {
                self.needs_reload = true;
            }
        }
        self.limit_sets.entry(m.platform.clone()).or_default().insert(m.model_id.clone(), set);
        self.retained_windows = None;
        self.models.entry(m.platform.clone()).or_default().insert(m.model_id.clone(), m);
    }

    /// A model's declared limits (empty when it has none).
    pub fn limit_set(&self, platform: &str, model_id: &str) -> LimitSet {
        self.limit_sets.get(platform).and_then(|m| m.get(model_id)).cloned().unwrap_or_default()
    }

    pub fn replace_models(&mut self, rows: Vec<ModelInfo>) {
        self.models.clear();
        self.billing.clear();
        self.limit_sets.clear();
        self.retained_windows = None;
        for m in rows {
            self.put_model(m);
        }
    }

    pub fn replace_keys(&mut self, rows: Vec<KeyInfo>) {
        self.keys = rows.into_iter().map(|k| (k.key_id, k)).collect();
        self.routable = HashMap::new();
        for k in self.keys.values().filter(|k| k.enabled) {
            self.routable.entry(k.platform.clone()).or_default().push(k.key_id);
        }
        self.accounts_changed();
    }

    /// Registers (or updates) one key; the routable keys follow at once.
    pub fn put_key(&mut self, k: KeyInfo) {
        if let Some(old) = self.keys.get(&k.key_id) {
            if let Some(ids) = self.routable.get_mut(&old.platform) {
                ids.retain(|id| *id != k.key_id);
            }
        }
        if k.enabled {
            self.routable.entry(k.platform.clone()).or_default().push(k.key_id);
        }
        self.keys.insert(k.key_id, k);
        self.accounts_changed();
    }

    /// The registered, enabled keys of a platform (SPEC §9's routable keys).
    pub fn routable_keys(&self, platform: &str) -> &[i64] {
        self.routable.get(platform).map_or(&[], Vec::as_slice)
    }

    pub fn replace_cooldowns(&mut self, rows: &[CooldownRow]) {
        self.cooldowns.clear();
        for r in rows {
            let rid = self.route_id(&r.platform, &r.model_id, r.key_id);
            self.cooldowns.insert(
                rid,
                CooldownRec { expires_at_ms: r.expires_at_ms, source: r.source, set_at_ms: r.set_at_ms },
            );
        }
    }

    pub fn active_cooldown(&self, rid: RouteId, now: i64) -> Option<CooldownRec> {
        self.cooldowns.get(&rid).copied().filter(|c| now < c.expires_at_ms)
    }

    // ---- failure history -----------------------------------------------------------

    pub fn replace_history(&mut self, rows: Vec<HistoryRow>) {
        self.history.clear();
        for r in rows {
            self.add_history(r);
        }
    }

    pub fn prune_history(&mut self, before: i64) {
        self.history.retain(|_, rows| {
            rows.retain(|h| h.hit_at_ms >= before);
            !rows.is_empty()
        });
    }

    pub fn add_history(&mut self, row: HistoryRow) {
        self.history.entry(row.key_id).or_default().push(row);
    }

    /// Removes matching history; returns how many rows went.
    pub fn remove_history(&mut self, key_id: i64, route: Option<(&str, &str)>, kinds: &[HistoryKind]) -> i64 {
        let Some(rows) = self.history.get_mut(&key_id) else { return 0 };
        let before = rows.len();
        rows.retain(|h| {
            !(kinds.contains(&h.kind) && route.is_none_or(|(p, m)| &*h.platform == p && &*h.model_id == m))
        });
        let removed = (before - rows.len()) as i64;
        if rows.is_empty() {
            self.history.remove(&key_id);
        }
        removed
    }

    /// Hits of one kind on a route (or, for `Auth`, on the key) with `hit_at_ms > since`.
    pub fn history_count(&self, route: &crate::core::types::Route, kind: HistoryKind, since: i64) -> i64 {
        let Some(rows) = self.history.get(&route.key_id) else { return 0 };
        rows.iter()
            .filter(|h| {
                h.kind == kind
                    && h.hit_at_ms > since
                    && (if kind.of_key() {
                        &*h.platform == route.platform.as_str()
                    } else {
                        &*h.platform == route.platform.as_str() && &*h.model_id == route.model_id.as_str()
                    })
            })
            .count() as i64
    }

    /// Whether a success on `route` has history to clear: the route's ladder,
    /// unknown-limit, transient and empty-completion rows, and the key's auth rows (a
    /// learned concurrency cap stays). O(1) for a key without failures (the hot path).
    pub fn has_history_to_clear(&self, route: &crate::core::types::Route) -> (bool, bool) {
        let Some(rows) = self.history.get(&route.key_id) else { return (false, false) };
        let mut route_rows = false;
        let mut auth_rows = false;
        for h in rows {
            match h.kind {
                HistoryKind::Auth => auth_rows = true,
                HistoryKind::Concurrency => {}
                _ => {
                    route_rows |=
                        &*h.platform == route.platform.as_str() && &*h.model_id == route.model_id.as_str()
                }
            }
        }
        (route_rows, auth_rows)
    }

    /// Live leases on `key_id` of `platform`, any model, leaving out lease `except`.
    pub fn key_live_leases(&self, platform: &str, key_id: i64, except: Option<i64>, now: i64) -> i64 {
        self.leases
            .iter()
            .filter(|(id, l)| {
                let r = &self.routes[l.route as usize];
                Some(**id) != except && l.live(now) && r.key_id == key_id && &*r.platform == platform
            })
            .count() as i64
    }

    /// The key concurrency cap learned from concurrency failures (SPEC 15.4): the cap
    /// the key's latest such failure taught or confirmed, until 1 h after it.
    pub fn learned_concurrency_cap(&self, platform: &str, key_id: i64, now: i64) -> Option<i64> {
        let rows = self.history.get(&key_id)?;
        rows.iter()
            .filter(|h| h.kind == HistoryKind::Concurrency && &*h.platform == platform)
            .max_by_key(|h| h.hit_at_ms)
            .filter(|h| now < h.hit_at_ms.saturating_add(LEARNED_CAP_TTL_MS))
            .and_then(|h| h.value)
    }

    // ---- provider accounts ---------------------------------------------------------

    /// The billing multiplier of a route's model on a platform whose daily token cap is `cap`.
    pub fn multiplier(&self, rid: RouteId, cap: i64) -> Multiplier {
        let r = &self.routes[rid as usize];
        let model = self.model(&r.platform, &r.model_id);
        let billing = self.billing.get(&*r.platform).and_then(|m| m.get(&*r.model_id)).copied().flatten();
        if let Some(m) = billing {
            return m;
        }
        match model.and_then(|m| m.limits.tpd) {
            Some(tpd) if tpd > 0 && tpd < cap => Multiplier { num: cap, den: tpd },
            _ => Multiplier::ONE,
        }
    }

    /// Requests since midnight on the account (all models).
    pub fn provider_day_requests(&self, platform: &str, key_id: i64, now: i64) -> i64 {
        self.account_of(platform, key_id).map_or(0, |a| self.accounts[a as usize].win.day(now).requests)
    }

    pub fn provider_minute_requests(&self, platform: &str, key_id: i64, _now: i64) -> i64 {
        self.account_of(platform, key_id).map_or(0, |a| self.accounts[a as usize].win.minute().requests)
    }

    /// Billed tokens since midnight on the account: each model's raw tokens times its
    /// multiplier, rounded up per model. Without a cap, raw tokens.
    pub fn provider_day_tokens(&self, platform: &str, key_id: i64, cap: Option<i64>, now: i64) -> i64 {
        self.account_of(platform, key_id).map_or(0, |a| self.account_day_tokens(a, cap, now))
    }

    fn account_day_tokens(&self, a: AccountId, cap: Option<i64>, now: i64) -> i64 {
        let mut total = 0i64;
        for rid in &self.accounts[a as usize].routes {
            let raw = self.routes[*rid as usize].win.day(now).tokens;
            let billed = match cap {
                Some(cap) => self.multiplier(*rid, cap).bill(raw),
                None => raw,
            };
            total = total.saturating_add(billed);
        }
        total
    }

    // ---- gates ---------------------------------------------------------------------

    /// What one decision on a route (or, with `rid` None, on an account) reads of the
    /// live leases, each sum derived once (SPEC §4's "in flight").
    pub fn view(&self, rid: Option<RouteId>, a: AccountId, key_id: i64, ctx: &GateContext, now: i64) -> View {
        let route = rid.map(|r| self.route_in_flight(r, now)).unwrap_or_default();
        let (account, key_count) = self.account_in_flight(a, key_id, ctx.caps.daily_tokens, now);
        let group =
            rid.and_then(|r| self.routes[r as usize].group).map(|g| (g, self.group_in_flight(g, now)));
        View {
            rid,
            account: a,
            route,
            account_count: account.count,
            account_billed: account.tokens,
            key_count,
            group,
        }
    }

    /// Runs the gates of SPEC §4 and §14.1 in order; the first that fails decides.
    /// Call `prune_route` and `keep_windows` first. A pure read of the mirror.
    pub fn evaluate(&self, rid: RouteId, est: Estimate, ctx: &GateContext, now: i64) -> Admission {
        let v = self.view(Some(rid), self.account_of_route(rid), self.routes[rid as usize].key_id, ctx, now);
        self.gates(rid, &v, est, ctx, now).err().unwrap_or(Admission::ALLOWED)
    }

    /// `evaluate`, and when it admits, SPEC 17.1's headroom of the route (one view for
    /// both).
    pub fn evaluate_scored(
        &self,
        rid: RouteId,
        est: Estimate,
        ctx: &GateContext,
        now: i64,
    ) -> (Admission, f64) {
        let v = self.view(Some(rid), self.account_of_route(rid), self.routes[rid as usize].key_id, ctx, now);
        match self.gates(rid, &v, est, ctx, now) {
            Ok(room) => (Admission::ALLOWED, room.min(self.caps_room(rid, &v, est, ctx, now))),
            Err(refused) => (refused, 0.0),
        }
    }

    /// Every gate in order on one view: the first refusal, or the room the declared
    /// limits leave (their gates and rooms in one pass over their windows).
    fn gates(
        &self,
        rid: RouteId,
        v: &View,
        est: Estimate,
        ctx: &GateContext,
        now: i64,
    ) -> Result<f64, Admission> {
        if let Some(refused) = self.gate_cooldown(rid, now) {
            return Err(refused);
        }
        let mut room = 1.0f64;
        for d in ctx.limits.iter() {
            match self.limit_room(v, d, est, now) {
                Some((Some(refused), _)) => return Err(refused),
                Some((None, r)) => room = room.min(r),
                None => {}
            }
        }
        let refused = self
            .gate_provider_daily(v, ctx, now)
            .or_else(|| self.gate_provider_minute(v, ctx))
            .or_else(|| self.gate_provider_tokens(v, est.tokens, ctx, now))
            .or_else(|| self.gate_concurrency(v, ctx));
        refused.map_or(Ok(room), Err)
    }

    /// SPEC 17.1's room the provider caps leave a route for one more request: the
    /// smallest `(cap - used - in_flight - this request) / cap`; 1.0 without caps.
    fn caps_room(&self, rid: RouteId, v: &View, est: Estimate, ctx: &GateContext, now: i64) -> f64 {
        let mut score = 1.0f64;
        let win = &self.accounts[v.account as usize].win;
        if let Some(cap) = ctx.caps.daily_requests {
            score =
                score.min(room(cap, win.day(now).requests.saturating_add(v.account_count).saturating_add(1)));
        }
        if let Some(cap) = ctx.caps.minute_requests {
            score =
                score.min(room(cap, win.minute().requests.saturating_add(v.account_count).saturating_add(1)));
        }
        if let Some(cap) = ctx.caps.daily_tokens {
            let taken = self
                .account_day_tokens(v.account, Some(cap), now)
                .saturating_add(v.account_billed)
                .saturating_add(self.multiplier(rid, cap).bill(est.tokens));
            score = score.min(room(cap, taken));
        }
        score
    }

    pub fn gate_cooldown(&self, rid: RouteId, now: i64) -> Option<Admission> {
        self.active_cooldown(rid, now).map(|c| Admission::refused(Reason::Cooldown, Some(c.expires_at_ms)))
    }

    fn route_win(&self, v: &View) -> Option<&Windows> {
        v.rid.map(|r| &self.routes[r as usize].win)
    }

    /// What a route has used in a window (`None` when it does not keep it).
    pub fn route_counts(&self, rid: RouteId, spec: WindowSpec, now: i64) -> Option<Counts> {
        self.routes[rid as usize].win.counts(spec, now)
    }

    /// One declared limit: a request window refuses when recorded requests and live
    /// leases reach the limit; a token window when they and the estimate exceed it.
    /// Each key is its own account, so both scopes count the route (SPEC §14.3).
    pub fn gate_limit(&self, v: &View, d: &Declared, est: Estimate, now: i64) -> Option<Admission> {
        self.limit_room(v, d, est, now).and_then(|(refused, _)| refused)
    }

    /// One declared limit for one more request: its refusal (when it refuses) and the
    /// room it leaves, `(limit - used - in_flight - this request) / limit` (SPEC 17.1).
    /// `None` when the route does not keep the window.
    fn limit_room(
        &self,
        v: &View,
        d: &Declared,
        est: Estimate,
        now: i64,
    ) -> Option<(Option<Admission>, f64)> {
        let l = &d.limit;
        // A key of its own account: both scopes count the key (SPEC §14.3).
        let (win, in_flight) = match v.group {
            Some((g, f)) if l.scope == Scope::Account => (&self.groups[g as usize].win, f),
            _ => (self.route_win(v)?, v.route),
        };
        let used = win.counts(l.window, now)?.get(l.metric).saturating_add(in_flight.get(l.metric));
        let this = estimate_in(l.metric, 1, est.tokens, est.output);
        let (over, excess) = if l.metric.is_tokens() {
            let total = used.saturating_add(this);
            (total > l.limit, total.saturating_sub(l.limit))
        } else {
            (used >= l.limit, used.saturating_sub(l.limit).saturating_add(1))
        };
        let refused = over
            .then(|| Admission::refused(d.reason.clone(), win.release_time(l.window, l.metric, excess, now)));
        Some((refused, room(l.limit, used.saturating_add(this))))
    }

    /// The gates of one metric group of `set`: requests (`tokens = false`) or tokens.
    pub fn gate_metrics(
        &self,
        v: &View,
        set: &LimitSet,
        tokens: bool,
        est: Estimate,
        now: i64,
    ) -> Option<Admission> {
        set.iter()
            .filter(|d| d.limit.metric.is_tokens() == tokens)
            .find_map(|d| self.gate_limit(v, d, est, now))
    }

    pub fn gate_provider_daily(&self, v: &View, ctx: &GateContext, now: i64) -> Option<Admission> {
        let cap = ctx.caps.daily_requests?;
        let win = &self.accounts[v.account as usize].win;
        let used = win.day(now).requests.saturating_add(v.account_count);
        (used >= cap).then(|| {
            Admission::refused(Reason::ProviderDailyRequests, Some(win.calendar().next_day_start(now)))
        })
    }

    pub fn gate_provider_minute(&self, v: &View, ctx: &GateContext) -> Option<Admission> {
        let cap = ctx.caps.minute_requests?;
        let win = &self.accounts[v.account as usize].win;
        let used = win.minute().requests.saturating_add(v.account_count);
        (used >= cap).then(|| {
            let excess = used.saturating_sub(cap).saturating_add(1);
            Admission::refused(Reason::ProviderMinuteRequests, win.minute_release_time(excess, false))
        })
    }

    /// The route of `v` bills the estimate at its model's multiplier (raw without one).
    pub fn gate_provider_tokens(&self, v: &View, est: i64, ctx: &GateContext, now: i64) -> Option<Admission> {
        let cap = ctx.caps.daily_tokens?;
        let billed_est = v.rid.map_or(est, |rid| self.multiplier(rid, cap).bill(est));
        let total = self
            .account_day_tokens(v.account, Some(cap), now)
            .saturating_add(v.account_billed)
            .saturating_add(billed_est);
        let next_day = self.accounts[v.account as usize].win.calendar().next_day_start(now);
        (total > cap).then(|| Admission::refused(Reason::ProviderDailyTokens, Some(next_day)))
    }

    pub fn gate_concurrency(&self, v: &View, ctx: &GateContext) -> Option<Admission> {
        let cap = ctx.concurrency_cap?;
        (v.key_count >= cap).then(|| Admission::refused(Reason::KeyConcurrency, None))
    }
}

/// A billing multiplier as an exact fraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Multiplier {
    pub num: i64,
    pub den: i64,
}

impl Multiplier {
    pub const ONE: Multiplier = Multiplier { num: 1, den: 1 };
    /// `ceil(tokens * num / den)`, saturating.
    pub fn bill(self, tokens: i64) -> i64 {
        if self.den <= 0 || tokens <= 0 {
            return tokens.max(0);
        }
        let n = i128::from(tokens) * i128::from(self.num);
        let d = i128::from(self.den);
        let q = (n + d - 1) / d;
        i64::try_from(q).unwrap_or(i64::MAX)
    }
}

/// The `N` of an `Nx` in a budget label such as `"150K/day · 2x"` (decimals allowed).
pub fn parse_multiplier(label: &str) -> Option<Multiplier> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(r"(?i)(?:^|[^\w.])(\d{1,9})(?:\.(\d{1,6}))?\s*[x×](?:\W|$)").ok());
    let caps = re.as_ref()?.captures(label)?;
    let int: i64 = caps.get(1)?.as_str().parse().ok()?;
    let (frac, den) = match caps.get(2) {
        Some(f) => (f.as_str().parse::<i64>().ok()?, 10i64.pow(f.as_str().len() as u32)),
        None => (0, 1),
    };
    let num = int.checked_mul(den)?.checked_add(frac)?;
    (num > 0).then_some(Multiplier { num, den })
}

/// The room a limit leaves once `taken` counts in it: `(limit - taken) / limit`.
fn room(limit: i64, taken: i64) -> f64 {
    if limit <= 0 {
        0.0
    } else {
        limit.saturating_sub(taken) as f64 / limit as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiplier_from_label() {
        assert_eq!(parse_multiplier("150K/day · 2x"), Some(Multiplier { num: 2, den: 1 }));
        assert_eq!(parse_multiplier("1.5x"), Some(Multiplier { num: 15, den: 10 }));
        assert_eq!(parse_multiplier("150K/day"), None);
        assert_eq!(parse_multiplier("0x"), None);
        assert_eq!(Multiplier { num: 15, den: 10 }.bill(3), 5);
        assert_eq!(Multiplier { num: 2, den: 1 }.bill(i64::MAX), i64::MAX);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn retention_keeps_each_model_from_its_own_cut_off() {
        // SPEC 14.2: only the models with a week, month or wide sliding window keep
        // rows past the retention, each from its own window in its own calendar.
        let model = |platform: &str, model_id: &str, others: &str, limits| ModelInfo {
            platform: platform.into(),
            model_id: model_id.into(),
            limits,
            others: crate::core::limits::decode_limits(others).unwrap(),
            monthly_token_budget: None,
        };
        let mut m = Mirror::default();
        let day = crate::core::types::Limits { rpd: Some(5), rpm: Some(1), ..Default::default() };
        m.put_model(model("mistral", "month", "requests/month=3", Default::default()));
        m.put_model(model("mistral", "week", "tokens/week=3", Default::default()));
        m.put_model(model("mistral", "slide", "requests/7d=3", Default::default()));
        m.put_model(model("mistral", "day", "", day));
        m.put_model(model("google", "month", "requests/month=3", Default::default()));
        m.put_model(model("mistral", "minute", "requests/1m=3", Default::default()));
        let dec10 = 1_796_083_200_000 + 9 * 86_400_000 + 10 * 3_600_000; // Thursday 2026-12-10 10:00 UTC
        let before = dec10 - 3_600_000;
        let kept: Vec<(String, String, i64)> = m
            .retained_usage(dec10, before, false)
            .into_iter()
            .map(|k| (k.platform.to_string(), k.model_id.to_string(), k.before))
            .collect();
        let dec1 = 1_796_083_200_000;
        assert_eq!(
            kept,
            vec![
                ("google".into(), "month".into(), dec1 + 8 * 3_600_000), // 00:00 Pacific
                ("mistral".into(), "month".into(), dec1),
                ("mistral".into(), "slide".into(), dec10 - 7 * 86_400_000 + 1),
                ("mistral".into(), "week".into(), dec1 + 6 * 86_400_000), // Monday Dec 7
            ]
        );
        // The degraded buffer also keeps today of a model declaring a day window.
        let buffered = m.retained_usage(dec10, before, true);
        let day_model = buffered.iter().find(|k| &*k.model_id == "day").unwrap();
        assert_eq!(day_model.before, dec1 + 9 * 86_400_000);
        // A window that reaches back less than the retention keeps nothing more.
        assert!(m.retained_usage(dec10, dec10 - 30 * 86_400_000, true).is_empty());
    }

    #[test]
    fn gates_refuse_at_limit_and_report_retry() {
        let mut m = Mirror::default();
        let rid = m.route_id("groq", "llama", 1);
        let ctx = GateContext {
            limits: LimitSet::from_classic(crate::core::types::Limits { rpm: Some(2), ..Default::default() }),
            ..Default::default()
        };
        let t0 = 1_000_000;
        m.add_usage(rid, 1, 0, t0, t0);
        assert_eq!(m.evaluate(rid, Estimate::default(), &ctx, t0), Admission::ALLOWED);
        m.add_usage(rid, 1, 0, t0 + 10, t0 + 10);
        let a = m.evaluate(rid, Estimate::default(), &ctx, t0 + 10);
        assert_eq!(a, Admission::refused(Reason::Rpm, Some(t0 + 60_000)));
        m.prune_route(rid, t0 + 60_000);
        assert!(m.evaluate(rid, Estimate::default(), &ctx, t0 + 60_000).allowed);
    }

    #[test]
    fn leases_count_until_they_expire() {
        let mut m = Mirror::default();
        let rid = m.route_id("groq", "llama", 1);
        let ctx = GateContext {
            limits: LimitSet::from_classic(crate::core::types::Limits { rpm: Some(1), ..Default::default() }),
            ..Default::default()
        };
        m.add_lease(
            7,
            LeaseRec { route: rid, tokens: 5, output_tokens: 0, created_at_ms: 0, expires_at_ms: 100 },
        );
        // only the lease blocks: no retry time for a sliding window
        assert_eq!(m.evaluate(rid, Estimate::default(), &ctx, 50), Admission::refused(Reason::Rpm, None));
        // at exactly its max age it still counts; one millisecond later it does not
        m.prune_route(rid, 100);
        assert_eq!(m.evaluate(rid, Estimate::default(), &ctx, 100), Admission::refused(Reason::Rpm, None));
        m.prune_route(rid, 101);
        assert!(m.evaluate(rid, Estimate::default(), &ctx, 101).allowed);
    }
}
