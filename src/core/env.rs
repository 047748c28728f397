//! Settings read once from the environment mapping given at construction (SPEC §3, §5, §8).
use crate::core::calendar::Calendar;
use crate::core::limits::LimitSet;
use std::collections::HashMap;

/// The environment the engine was built with (a copy; never re-read).
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: HashMap<String, String>,
}

/// A warning produced while reading the environment (logged by the engine).
pub type EnvWarning = String;

impl Env {
    pub fn new(vars: HashMap<String, String>) -> Self {
        Self { vars }
    }
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// A positive integer from `name`; anything else is absent.
    fn positive(&self, name: &str) -> Option<i64> {
        self.get(name).and_then(|v| v.trim().parse::<i64>().ok()).filter(|v| *v > 0)
    }

    /// SPEC §5: `MAX_CONCURRENT_REQUESTS_PER_KEY_<PLATFORM>` when it holds a positive
    /// integer, else `MAX_CONCURRENT_REQUESTS_PER_KEY` when it does, else no cap.
    pub fn key_concurrency_cap(&self, platform: &str) -> Option<i64> {
        self.positive(&format!("MAX_CONCURRENT_REQUESTS_PER_KEY_{}", env_suffix(platform)))
            .or_else(|| self.positive("MAX_CONCURRENT_REQUESTS_PER_KEY"))
    }

    /// What is wrong in the environment, found once at construction (SPEC §3: read
    /// once): every `PROVIDER_*_CAP_<PLATFORM>` override that is not a non-negative
    /// integer, whatever platform it names. Sorted by variable name.
    pub fn warnings(&self) -> Vec<EnvWarning> {
        let mut bad: Vec<(&String, &String)> = self
            .vars
            .iter()
            .filter(|(k, v)| {
                CAP_VARS.iter().any(|p| k.len() > p.len() && k.starts_with(p)) && cap_override(v).is_none()
            })
            .collect();
        bad.sort();
        let mut out: Vec<EnvWarning> = bad
            .into_iter()
            .map(|(var, raw)| {
                format!("ignoring {var}={raw:?}: not a non-negative integer; the default stands")
            })
            .collect();
        let mut zones: Vec<(&String, &String)> = self
            .vars
            .iter()
            .filter(|(k, v)| {
                k.len() > DAY_TZ_VAR.len()
                    && k.starts_with(DAY_TZ_VAR)
                    && Calendar::of_zone(v.trim()).is_none()
            })
            .collect();
        zones.sort();
        out.extend(zones.into_iter().map(|(var, raw)| {
            format!("ignoring {var}={raw:?}: not a known IANA time zone; the built-in calendar stands")
        }));
        out
    }

    /// SPEC §14.2: `PROVIDER_DAY_TZ_<PLATFORM>` for every platform named, valid zones
    /// only (an unknown one is reported by [`Env::warnings`]); keys are the upper-cased
    /// platform.
    pub fn day_zones(&self) -> HashMap<String, Calendar> {
        self.vars
            .iter()
            .filter_map(|(k, v)| {
                let platform = k.strip_prefix(DAY_TZ_VAR).filter(|p| !p.is_empty())?;
                Some((platform.to_string(), Calendar::of_zone(v.trim())?))
            })
            .collect()
    }

    /// SPEC §8: the provider's defaults (`core::providers`), then env overrides (0
    /// disables; garbage is ignored, and reported by [`Env::warnings`]).
    /// The defaults apply to the platforms as the table names them (SPEC 18.6:
    /// case-sensitive); `<PLATFORM>` in a variable is the platform upper-cased.
    pub fn provider_caps(&self, platform: &str) -> LimitSet {
        let mut caps = crate::core::providers::lookup(platform).caps.values();
        let suffix = env_suffix(platform);
        for (name, slot) in CAP_VARS.iter().zip(caps.iter_mut()) {
            if let Some(v) = self.get(&format!("{name}{suffix}")).and_then(cap_override) {
                *slot = v;
            }
        }
        LimitSet::provider(caps)
    }

    /// `COOLDOWN_PROBE_MAX_PER_PASS` (default 3).
    pub fn probe_max_per_pass(&self) -> usize {
        self.positive("COOLDOWN_PROBE_MAX_PER_PASS").map_or(3, |v| usize::try_from(v).unwrap_or(3))
    }

    /// `COOLDOWN_PROBE_DISABLED=1` (also "true"/"yes").
    pub fn probe_disabled(&self) -> bool {
        matches!(
            self.get("COOLDOWN_PROBE_DISABLED").map(|v| v.trim().to_ascii_lowercase()),
            Some(v) if v == "1" || v == "true" || v == "yes"
        )
    }
}

/// The zone of a platform's calendar (SPEC §14.2), followed by `<PLATFORM>`.
const DAY_TZ_VAR: &str = "PROVIDER_DAY_TZ_";

/// The provider cap overrides (SPEC §8), each followed by `<PLATFORM>`, in the order
/// of `CapValues`.
const CAP_VARS: [&str; 3] =
    ["PROVIDER_DAILY_REQUEST_CAP_", "PROVIDER_MINUTE_REQUEST_CAP_", "PROVIDER_DAILY_TOKEN_CAP_"];

/// A cap override's value: `Some(None)` for 0 (no cap), `Some(Some(v))` for a positive
/// cap, `None` when it is not a non-negative integer (ignored).
fn cap_override(raw: &str) -> Option<Option<i64>> {
    match raw.trim().parse::<i64>() {
        Ok(0) => Some(None),
        Ok(v) if v > 0 => Some(Some(v)),
        _ => None,
    }
}

/// `<PLATFORM>` in variable names: the platform upper-cased.
pub fn env_suffix(platform: &str) -> String {
    platform.to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn key_concurrency_prefers_platform_value() {
        assert_eq!(env(&[]).key_concurrency_cap("acme"), None);
        let e =
            env(&[("MAX_CONCURRENT_REQUESTS_PER_KEY", "4"), ("MAX_CONCURRENT_REQUESTS_PER_KEY_ACME", "2")]);
        assert_eq!(e.key_concurrency_cap("acme"), Some(2));
        assert_eq!(e.key_concurrency_cap("nvidia"), Some(4));
        let e =
            env(&[("MAX_CONCURRENT_REQUESTS_PER_KEY", "4"), ("MAX_CONCURRENT_REQUESTS_PER_KEY_ACME", "0")]);
        assert_eq!(e.key_concurrency_cap("acme"), Some(4));
    }
}
