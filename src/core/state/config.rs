//! The engine's configuration as mirrored: registered keys, models and their limit
//! sets and prices, provider caps, the platforms' calendars and the priority reserves.
use crate::core::calendar::Calendar;
use crate::core::limits::{LimitSet, Metric, WindowSpec, DAY};
use crate::core::money::Prices;
use crate::core::state::FastMap;
use crate::core::types::{CapOverrides, KeyInfo, ModelInfo};
use regex::Regex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Registered keys, declared models (with their billing multipliers and limit sets,
/// built once), provider caps and the models' prices.
#[derive(Debug, Default)]
pub struct Config {
    /// Registered keys; change them through `Mirror::put_key` / `Mirror::replace_keys`.
    pub keys: HashMap<i64, KeyInfo>,
    /// platform -> its registered, enabled keys, kept with `keys`.
    routable: HashMap<String, Vec<i64>>,
    models: HashMap<String, HashMap<String, ModelInfo>>,
    /// platform -> model_id -> how its tokens are billed against a daily token cap.
    billing: FastMap<String, FastMap<String, Billing>>,
    /// platform -> model_id -> its declared limits in gate order, built once.
    pub(super) limit_sets: FastMap<String, FastMap<String, LimitSet>>,
    pub caps: FastMap<String, CapOverrides>,
    /// platform -> model_id -> its prices (SPEC 23.1); a model not here costs nothing.
    prices: FastMap<String, FastMap<String, Prices>>,
    /// platform -> its platform limits (SPEC 23.3), in gate order, built once.
    pub(super) platform_sets: FastMap<String, LimitSet>,
    /// The tenants' declarations and patterns (SPEC 23.2).
    pub tenants: crate::core::tenants::TenantTable,
}

impl Config {
    pub fn model(&self, platform: &str, model_id: &str) -> Option<&ModelInfo> {
        self.models.get(platform)?.get(model_id)
    }

    /// Registers a model; its limit set (the label's billing multiplier and the gate
    /// order are worked out once here, not at every admission).
    pub fn put_model(&mut self, m: ModelInfo) -> LimitSet {
        let billing = Billing {
            label: m.monthly_token_budget.as_deref().and_then(parse_multiplier),
            daily_tokens: m.limits.classic_limit(Metric::Tokens, DAY),
        };
        self.billing.entry(m.platform.clone()).or_default().insert(m.model_id.clone(), billing);
        let set = m.limits.clone();
        self.limit_sets.entry(m.platform.clone()).or_default().insert(m.model_id.clone(), set.clone());
        self.models.entry(m.platform.clone()).or_default().insert(m.model_id.clone(), m);
        set
    }

    pub fn clear_models(&mut self) {
        self.models.clear();
        self.billing.clear();
        self.limit_sets.clear();
    }

    /// A platform's limits (SPEC 23.3; empty when it has none).
    pub fn platform_set(&self, platform: &str) -> LimitSet {
        self.platform_sets.get(platform).cloned().unwrap_or_default()
    }

    /// A model's declared limits (empty when it has none).
    pub fn limit_set(&self, platform: &str, model_id: &str) -> LimitSet {
        self.limit_sets.get(platform).and_then(|m| m.get(model_id)).cloned().unwrap_or_default()
    }

    /// A model's prices (SPEC 23.1), `None` when none are set.
    pub fn prices(&self, platform: &str, model_id: &str) -> Option<Prices> {
        if self.prices.is_empty() {
            // No prices at all (the common case): no lookup on the hot path.
            return None;
        }
        self.prices.get(platform)?.get(model_id).copied()
    }

    /// Sets (or with `None` forgets) a model's prices.
    pub fn set_prices(&mut self, platform: &str, model_id: &str, prices: Option<Prices>) {
        match prices {
            Some(p) => {
                self.prices.entry(platform.to_string()).or_default().insert(model_id.to_string(), p);
            }
            None => {
                if let Some(m) = self.prices.get_mut(platform) {
                    m.remove(model_id);
                    if m.is_empty() {
                        self.prices.remove(platform);
                    }
                }
            }
        }
    }

    /// Replaces every model's prices (the store's whole table).
    pub fn replace_prices(&mut self, rows: Vec<(String, String, Prices)>) {
        self.prices = FastMap::default();
        for (platform, model_id, p) in rows {
            self.prices.entry(platform).or_default().insert(model_id, p);
        }
    }

    pub fn replace_keys(&mut self, rows: Vec<KeyInfo>) {
        self.keys = rows.into_iter().map(|k| (k.key_id, k)).collect();
        self.routable = HashMap::new();
        for k in self.keys.values().filter(|k| k.enabled) {
            self.routable.entry(k.platform.clone()).or_default().push(k.key_id);
        }
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
    }

    /// The registered, enabled keys of a platform (SPEC §9's routable keys).
    pub fn routable_keys(&self, platform: &str) -> &[i64] {
        self.routable.get(platform).map_or(&[], Vec::as_slice)
    }

    /// The account a key belongs to (SPEC §14.3): the one it was registered with, else
    /// its own, `"key:<key_id>"`.
    pub fn account_name(&self, platform: &str, key_id: i64) -> Arc<str> {
        match self.keys.get(&key_id) {
            Some(KeyInfo { platform: p, account: Some(a), .. }) if p == platform => Arc::from(a.as_str()),
            _ => Arc::from(format!("key:{key_id}")),
        }
    }

    /// The billing multiplier of a model on a platform whose daily token cap is `cap`:
    /// its label's, else the cap over the model's own daily token limit when lower.
    pub fn multiplier(&self, platform: &str, model_id: &str, cap: i64) -> Multiplier {
        let Some(b) = self.billing.get(platform).and_then(|m| m.get(model_id)) else {
            return Multiplier::ONE;
        };
        if let Some(m) = b.label {
            return m;
        }
        match b.daily_tokens {
            Some(tpd) if tpd > 0 && tpd < cap => Multiplier { num: cap, den: tpd },
            _ => Multiplier::ONE,
        }
    }
}

/// What billing a model's tokens against a daily token cap reads, worked out when the
/// model is declared.
#[derive(Debug, Clone, Copy)]
struct Billing {
    /// The multiplier of its `monthly_token_budget` label.
    label: Option<Multiplier>,
    /// Its own daily token limit.
    daily_tokens: Option<i64>,
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

    /// The oldest time a window of a platform counts at `now`.
    pub fn window_start(&mut self, platform: &str, spec: WindowSpec, now: i64) -> i64 {
        match spec {
            WindowSpec::Sliding(w) => now.saturating_sub(w - 1),
            WindowSpec::Calendar(p) => self.of(platform).period_start(p, now),
        }
    }

    /// The stored zones; the platforms whose calendar this changes.
    pub(super) fn replace(&mut self, set: HashMap<String, String>) -> Vec<String> {
        let mut platforms: Vec<String> = set.keys().chain(self.set.keys()).cloned().collect();
        platforms.sort();
        platforms.dedup();
        let before: Vec<Calendar> = platforms.iter().map(|p| self.of(p)).collect();
        self.set = set;
        self.resolved.clear();
        platforms.into_iter().zip(before).filter_map(|(p, old)| (self.of(&p) != old).then_some(p)).collect()
    }

    /// Every calendar resolved so far (the platforms the mirror has seen).
    pub(super) fn all(&self) -> impl Iterator<Item = &Calendar> {
        self.resolved.values()
    }

    /// The stored zones, with one changed (for a write of our own).
    pub fn zones_with(&self, platform: &str, zone: Option<&str>) -> HashMap<String, String> {
        let mut set = self.set.clone();
        match zone {
            Some(z) => set.insert(platform.to_string(), z.to_string()),
            None => set.remove(platform),
        };
        set
    }

    /// The earliest start of today among the calendars that may be in use: the
    /// oldest row a day window may count at `now`. Platforms not seen yet may have a
    /// zone 14 hours behind UTC at most: their day started at most 14 h before UTC's.
    pub fn earliest_day_start(&self, now: i64) -> i64 {
        let mut earliest = Calendar::utc().day_start(now.saturating_sub(14 * 3_600_000));
        for c in self.all() {
            earliest = earliest.min(c.day_start(now));
        }
        earliest
    }
}

/// SPEC 22.1: (priority, reserve fraction) as stored, by priority.
#[derive(Debug, Default)]
pub struct Reserves {
    rows: Vec<(i64, f64)>,
}

impl Reserves {
    /// SPEC 22.1: the reserve of a call of `priority`, the fraction set for the largest
    /// configured priority `<= priority` (0 when none).
    #[inline]
    pub fn for_priority(&self, priority: i64) -> f64 {
        if self.rows.is_empty() {
            return 0.0;
        }
        self.rows.iter().rev().find(|(p, _)| *p <= priority).map_or(0.0, |(_, f)| *f)
    }

    /// Replaces the stored reserves (the store's whole table).
    pub fn replace(&mut self, mut rows: Vec<(i64, f64)>) {
        rows.sort_by_key(|(p, _)| *p);
        rows.dedup_by_key(|(p, _)| *p);
        self.rows = rows;
    }

    /// Sets one priority's reserve.
    pub fn put(&mut self, priority: i64, fraction: f64) {
        match self.rows.binary_search_by_key(&priority, |(p, _)| *p) {
            Ok(i) => self.rows[i].1 = fraction,
            Err(i) => self.rows.insert(i, (priority, fraction)),
        }
    }
}
