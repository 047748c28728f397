//! What a decision reads besides the windows, prepared by the mirror that owns the
//! tables it comes from: the route (pruned, keeping every window its limits read), the
//! declared limits, the provider caps in force (SPEC 8, 21.2: set x learned x
//! environment), the concurrency cap (15.4, 20) and the priority's reserve (22.1).
//! [`Mirror::prepare`] builds it in one pass; `admit`, the single-gate checks and the
//! forecast differ only in the gates they run on it. [`Setup`] keeps what is derived
//! from the environment and from the caps, so a decision builds neither again.
use super::{AccountId, FastMap, Mirror, RouteId};
use crate::core::admission::{Estimate, GateContext, View};
use crate::core::env::Env;
use crate::core::limits::LimitSet;
use crate::core::types::{CapOverrides, CapSetting, ProviderCaps, Route};

/// What the mirror derives from the environment and from the caps (read once each).
#[derive(Debug, Default)]
pub struct Setup {
    env: Env,
    /// Per platform: the caps and the concurrency cap its environment sets.
    platform_env: FastMap<String, (ProviderCaps, Option<i64>)>,
    /// SPEC §8's caps as limits at provider scope, by the caps they were built from.
    provider_sets: FastMap<ProviderCaps, LimitSet>,
}

impl Setup {
    pub fn new(env: Env) -> Setup {
        Setup { env, ..Setup::default() }
    }

    /// The platform's caps and concurrency cap from the environment (read once).
    fn platform_env(&mut self, platform: &str) -> (ProviderCaps, Option<i64>) {
        if let Some(v) = self.platform_env.get(platform) {
            return *v;
        }
        let caps = self.env.provider_caps(platform);
        let conc = self.env.key_concurrency_cap(platform);
        self.platform_env.insert(platform.to_string(), (caps, conc));
        (caps, conc)
    }

    /// SPEC §8's caps as limits at provider scope, built once per distinct set of caps.
    fn provider_limits(&mut self, caps: ProviderCaps) -> LimitSet {
        if let Some(set) = self.provider_sets.get(&caps) {
            return set.clone();
        }
        if self.provider_sets.len() >= 64 {
            self.provider_sets.clear();
        }
        let set = LimitSet::provider(caps);
        self.provider_sets.insert(caps, set.clone());
        set
    }
}

/// Everything one decision reads besides the windows, prepared by [`Mirror::prepare`].
#[derive(Debug)]
pub struct Prepared {
    /// The route decided on, pruned and keeping every window of `ctx.limits` (`None`
    /// for a provider gate asked without a model).
    pub route: Option<RouteId>,
    pub account: AccountId,
    pub key_id: i64,
    pub ctx: GateContext,
    /// Every window the route keeps could be counted from memory; otherwise the usage
    /// is to be counted again from the store (then `Mirror::prune_route` again).
    pub complete: bool,
}

impl Mirror {
    /// Prepares a decision at `priority` on `route` at `now`, in one pass over the
    /// mirror's tables: the limits in force (`limits`, else the model's), the caps,
    /// the concurrency cap and the reserve; the route (when it names a model) pruned
    /// and keeping every window the limits read, else the key's account pruned. The
    /// hot path: the platform's environment, its cap settings and the key are looked
    /// up once each.
    pub fn prepare(&mut self, route: &Route, limits: Option<LimitSet>, priority: i64, now: i64) -> Prepared {
        let ctx = gate_context(self, route, limits, priority, now);
        if route.model_id.is_empty() {
            let account = self.account_id(&route.platform, route.key_id);
            self.prune_account_id(account, now);
            return Prepared { route: None, account, key_id: route.key_id, ctx, complete: true };
        }
        let rid = self.route_id(&route.platform, &route.model_id, route.key_id);
        self.prune_route(rid, now);
        let complete = self.keep_windows(rid, &ctx.limits) && !self.needs_reload;
        let account = self.routes[rid as usize].account;
        Prepared { route: Some(rid), account, key_id: route.key_id, ctx, complete }
    }

    /// The view of a prepared decision with the call's estimate.
    pub fn prepared_view<'a>(&'a self, p: &'a Prepared, est: Estimate, now: i64) -> View<'a> {
        self.view(p.route, p.account, p.key_id, &p.ctx, est, now)
    }

    /// Effective caps: `set_provider_caps` wins over env, env over defaults.
    pub fn caps_for(&mut self, platform: &str) -> ProviderCaps {
        let (env_caps, _) = self.setup.platform_env(platform);
        overridden(env_caps, self.config.caps.get(platform).copied().unwrap_or_default())
    }

    /// The key concurrency cap in force (SPEC 15.4, 20): the lowest of the env cap,
    /// the key's configured cap and the one learned from concurrency failures.
    pub fn key_concurrency_cap(&mut self, platform: &str, key_id: i64, now: i64) -> Option<i64> {
        let (_, env) = self.setup.platform_env(platform);
        let configured =
            self.config.keys.get(&key_id).filter(|k| k.platform == platform).and_then(|k| k.concurrency_cap);
        min_cap(min_cap(env, configured), self.history.learned_concurrency_cap(platform, key_id, now))
    }
}

/// The smaller of two optional caps (`None`: no cap).
pub fn min_cap(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The caps in force: `set_provider_caps`'s settings `o` over the environment's.
fn overridden(env_caps: ProviderCaps, o: CapOverrides) -> ProviderCaps {
    fn pick(s: CapSetting, env: Option<i64>) -> Option<i64> {
        match s {
            CapSetting::Inherit => env,
            CapSetting::NoCap => None,
            CapSetting::Cap(v) => Some(v),
        }
    }
    ProviderCaps {
        daily_requests: pick(o.daily_requests, env_caps.daily_requests),
        minute_requests: pick(o.minute_requests, env_caps.minute_requests),
        daily_tokens: pick(o.daily_tokens, env_caps.daily_tokens),
    }
}

/// What a decision at `priority` on `route` reads besides the windows.
fn gate_context(
    m: &mut Mirror,
    route: &Route,
    limits: Option<LimitSet>,
    priority: i64,
    now: i64,
) -> GateContext {
    let (env_caps, env_conc) = m.setup.platform_env(&route.platform);
    let key = m.config.keys.get(&route.key_id).filter(|k| k.platform == route.platform);
    let set = m.config.caps.get(&route.platform).copied().unwrap_or_default();
    // SPEC 21.2: the lower of the platform's caps and the account's learned ones.
    let shared = key.is_some_and(|k| k.account.is_some());
    // The cap in force (SPEC 15.4, 20): the lowest of the env cap, the key's
    // configured cap and the learned one.
    let conc = min_cap(env_conc, key.and_then(|k| k.concurrency_cap));
    let caps = lowered_to_learned(m, overridden(env_caps, set), set, &route.platform, route.key_id, shared);
    let learned = m.history.learned_concurrency_cap(&route.platform, route.key_id, now);
    GateContext {
        limits: m.limits_for(&route.platform, &route.model_id, limits),
        provider: m.setup.provider_limits(caps),
        concurrency_cap: min_cap(conc, learned),
        reserve: m.reserves.for_priority(priority),
    }
}

/// The provider caps the gates apply to a key's account: `caps`, each lowered to
/// the account's learned one (SPEC 21.2) unless `set_provider_caps` set it
/// (`set`). The one place the gates read provider caps.
fn lowered_to_learned(
    m: &Mirror,
    caps: ProviderCaps,
    set: CapOverrides,
    platform: &str,
    key_id: i64,
    shared: bool,
) -> ProviderCaps {
    let learned = m.history.learned_pool_caps(platform, key_id, shared, || m.account_keys(platform, key_id));
    let Some((day, minute)) = learned else { return caps };
    let lower = |s: CapSetting, cap: Option<i64>, learned: Option<i64>| match s {
        CapSetting::Inherit => min_cap(cap, learned),
        _ => cap,
    };
    ProviderCaps {
        daily_requests: lower(set.daily_requests, caps.daily_requests, day),
        minute_requests: lower(set.minute_requests, caps.minute_requests, minute),
        daily_tokens: caps.daily_tokens,
    }
}
