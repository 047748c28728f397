//! What a decision reads besides the windows: the provider caps in force (SPEC 8,
//! 21.2), the declared limits, the concurrency cap (15.4, 20) and the priority's
//! reserve (22.1), gathered into one [`GateContext`]. [`Setup`] keeps what it derives
//! from the environment and from the caps, so a decision builds neither again.
use super::unit;
use crate::core::admission::GateContext;
use crate::core::env::Env;
use crate::core::limits::LimitSet;
use crate::core::state::{FastMap, Mirror};
use crate::core::types::{CapOverrides, CapSetting, ProviderCaps, Route};

#[derive(Default)]
pub(super) struct Setup {
    /// Per platform: the caps and the concurrency cap its environment sets.
    platform_env: FastMap<String, (ProviderCaps, Option<i64>)>,
    /// SPEC §8's caps as limits at provider scope, by the caps they were built from.
    provider_sets: FastMap<ProviderCaps, LimitSet>,
}

impl Setup {
    /// The platform's caps and concurrency cap from the environment (read once).
    pub(super) fn platform_env(&mut self, env: &Env, platform: &str) -> (ProviderCaps, Option<i64>) {
        if let Some(v) = self.platform_env.get(platform) {
            return *v;
        }
        let caps = env.provider_caps(platform);
        let conc = env.key_concurrency_cap(platform);
        self.platform_env.insert(platform.to_string(), (caps, conc));
        (caps, conc)
    }

    /// Effective caps: `set_provider_caps` wins over env, env over defaults.
    pub(super) fn caps_for(&mut self, unit: &unit::Unit, platform: &str) -> ProviderCaps {
        let (env_caps, _) = self.platform_env(&unit.settings.env, platform);
        overridden(env_caps, unit.mirror.config.caps.get(platform).copied().unwrap_or_default())
    }

    /// What a decision at `priority` on `route` reads besides the windows. The hot
    /// path: the platform's environment, its cap settings and the key are looked up
    /// once each.
    pub(super) fn gate_context(
        &mut self,
        unit: &unit::Unit,
        route: &Route,
        limits: Option<LimitSet>,
        priority: i64,
        now: i64,
    ) -> GateContext {
        let (env_caps, env_conc) = self.platform_env(&unit.settings.env, &route.platform);
        let m = &unit.mirror;
        let key = m.config.keys.get(&route.key_id).filter(|k| k.platform == route.platform);
        let set = m.config.caps.get(&route.platform).copied().unwrap_or_default();
        // SPEC 21.2: the lower of the platform's caps and the account's learned ones.
        let shared = key.is_some_and(|k| k.account.is_some());
        let caps =
            lowered_to_learned(m, overridden(env_caps, set), set, &route.platform, route.key_id, shared);
        // The cap in force (SPEC 15.4, 20): the lowest of the env cap, the key's
        // configured cap and the learned one.
        let conc = min_cap(env_conc, key.and_then(|k| k.concurrency_cap));
        let learned = m.history.learned_concurrency_cap(&route.platform, route.key_id, now);
        GateContext {
            limits: m.limits_for(&route.platform, &route.model_id, limits),
            provider: self.provider_limits(caps),
            concurrency_cap: min_cap(conc, learned),
            reserve: m.reserves.for_priority(priority),
        }
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

/// The smaller of two optional caps (`None`: no cap).
pub(super) fn min_cap(a: Option<i64>, b: Option<i64>) -> Option<i64> {
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

/// The provider caps the gates apply to a key's account: `caps`, each lowered to the
/// account's learned one (SPEC 21.2) unless `set_provider_caps` set it (`set`). The
/// one place the gates read provider caps.
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
