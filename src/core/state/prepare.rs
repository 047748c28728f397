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
use crate::core::limits::{CapValues, LimitSet};
use crate::core::pools::infer_quota_pool_key;
use crate::core::types::{CapOverrides, CapSetting, Route};

/// What the mirror derives from the environment and from the caps (read once each).
#[derive(Debug, Default)]
pub struct Setup {
    env: Env,
    /// Per platform: the caps (the provider's defaults, then the environment's) and the
    /// concurrency cap its environment sets.
    platform_env: FastMap<String, (CapValues, Option<i64>)>,
    /// SPEC §8's caps as limits at provider scope, by the caps they were built from.
    provider_sets: FastMap<CapValues, LimitSet>,
}

impl Setup {
    pub fn new(env: Env) -> Setup {
        Setup { env, ..Setup::default() }
    }

    /// The platform's caps and concurrency cap from the environment (read once).
    fn platform_env(&mut self, platform: &str) -> (CapValues, Option<i64>) {
        if let Some(v) = self.platform_env.get(platform) {
            return *v;
        }
        let caps = self.env.provider_caps(platform).cap_values();
        let conc = self.env.key_concurrency_cap(platform);
        self.platform_env.insert(platform.to_string(), (caps, conc));
        (caps, conc)
    }

    /// SPEC §8's caps as limits at provider scope, built once per distinct set of caps.
    fn provider_limits(&mut self, caps: CapValues) -> LimitSet {
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
    pub fn caps_for(&mut self, platform: &str) -> LimitSet {
        let (env_caps, _) = self.setup.platform_env(platform);
        let set = self.config.caps.get(platform).copied().unwrap_or_default();
        self.setup.provider_limits(caps_in_force(&set, &env_caps, &CapValues::default()))
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

/// The caps in force (SPEC §8, 21.2), the one place the three are merged: per cap,
/// what `set_provider_caps` set (`set`: a cap, or no cap), else the lower of the
/// environment's (the provider's default, then the environment variable) and the
/// account's learned one.
fn caps_in_force(set: &CapOverrides, env: &CapValues, learned: &CapValues) -> CapValues {
    std::array::from_fn(|i| match set[i] {
        CapSetting::Inherit => min_cap(env[i], learned[i]),
        CapSetting::NoCap => None,
        CapSetting::Cap(v) => Some(v),
    })
}

/// What a decision at `priority` on `route` reads besides the windows.
fn gate_context(
    m: &mut Mirror, route: &Route, limits: Option<LimitSet>, priority: i64, now: i64,
) -> GateContext {
    let (env_caps, env_conc) = m.setup.platform_env(&route.platform);
    let key = m.config.keys.get(&route.key_id).filter(|k| k.platform == route.platform);
    let set = m.config.caps.get(&route.platform).copied().unwrap_or_default();
    // The cap in force (SPEC 15.4, 20): the lowest of the env cap, the key's
    // configured cap and the learned one.
    let conc = min_cap(env_conc, key.and_then(|k| k.concurrency_cap));
    // SPEC 21.2, 24.6: what pool 429s taught the key's account (the gates use the lower
    // of the platform's caps and its learned ones), and until when they spent the
    // route's pool (the rows name the account, so they stay with it).
    let pool = m.history.pool_state(
        &route.platform,
        || m.config.account_name(&route.platform, route.key_id),
        || infer_quota_pool_key(&route.platform, Some(&route.model_id)),
        now,
    );
    let (caps, pool_spent) = match pool {
        // The hot path: nothing learned from pool 429s.
        None => (caps_in_force(&set, &env_caps, &CapValues::default()), None),
        Some(pool) => {
            let mut caps = caps_in_force(&set, &env_caps, &pool.caps);
            for (cap, spent) in caps.iter_mut().zip(pool.spent) {
                // A spent pool refuses through its cap's gate, which it needs to have.
                if spent.is_some() && cap.is_none() {
                    *cap = Some(0);
                }
            }
            (caps, pool.spent.iter().any(Option::is_some).then(|| Box::new(pool.spent)))
        }
    };
    let learned_conc = m.history.learned_concurrency_cap(&route.platform, route.key_id, now);
    GateContext {
        limits: m.limits_for(&route.platform, &route.model_id, limits),
        provider: m.setup.provider_limits(caps),
        pool_spent,
        platform: m.config.platform_set(&route.platform),
        concurrency_cap: min_cap(conc, learned_conc),
        reserve: m.reserves.for_priority(priority),
    }
}
