//! The engine's configuration (SPEC §4, §14.1-14.3, 20, 22.1, 23.1): keys and their
//! accounts and concurrency caps, the models' declared limits and prices, the
//! platforms' calendars and the priority reserves. Everything here is persisted and shared
//! through the store; [`Configuration`] writes it and reads what is in force.
use super::unit::Access;
use super::{check_priority, unit, Engine};
use crate::core::calendar::Calendar;
use crate::core::error::{Error, Result};
use crate::core::limits::{Limit, LimitSet};
use crate::core::money::Prices;
use crate::core::store::Write;
use crate::core::types::{check_name, KeyInfo, ModelInfo};

/// Keys, models, calendars and reserves (SPEC §4, §14, 20, 22.1), reached as
/// [`Engine::config`].
pub struct Configuration<'e> {
    unit: &'e mut unit::Unit,
}

impl Engine {
    /// The configuration: keys, models, calendars and priority reserves.
    pub fn config(&mut self) -> Configuration<'_> {
        Configuration { unit: &mut self.unit }
    }
}

impl Configuration<'_> {
    pub fn register_key(&mut self, key: KeyInfo) -> Result<()> {
        check_name("platform", &key.platform)?;
        if key.account.as_deref() == Some("") {
            return Err(Error::invalid("account must be a non-empty string, or None for a key of its own"));
        }
        // SPEC 18.6: "key:<key_id>" names a key's own account; an explicit one spelled
        // so would share another key's.
        if let Some(a) = key.account.as_deref().filter(|a| a.starts_with("key:")) {
            return Err(Error::invalid(format!(
                "account {a:?} begins with \"key:\", which names a key's own account; \
                 pass None for a key of its own"
            )));
        }
        // A configured concurrency cap is the key's own setting: registering the key
        // again (its account, label, ...) keeps it.
        let key = KeyInfo {
            concurrency_cap: self
                .unit
                .run(Access::Read, |tx| Ok(tx.mirror().reader().configured_concurrency_cap(key.key_id)))?,
            ..key
        };
        self.unit.run(Access::Write, |tx| {
            tx.push(Write::UpsertKey(key));
            Ok(())
        })
    }

    /// Configures a key's concurrency cap (SPEC 20): persisted and shared; the gate
    /// refuses at the lowest of it, the env cap and a learned cap. `None` forgets it.
    /// A key not yet registered is registered for `platform` (its own account).
    pub fn set_key_concurrency_cap(&mut self, platform: &str, key_id: i64, cap: Option<i64>) -> Result<()> {
        check_name("platform", platform)?;
        if let Some(c) = cap {
            if c < 0 {
                return Err(Error::Invalid(format!("cap must be an int >= 0 or None, got {c}")));
            }
        }
        let known =
            self.unit.run(Access::Read, |tx| Ok(tx.mirror().reader().registered_key(key_id).cloned()))?;
        let key = match known {
            Some(k) if k.platform != platform => {
                return Err(Error::Invalid(format!(
                    "key {key_id} is registered for platform {:?}, not {platform:?}",
                    k.platform
                )))
            }
            Some(k) => KeyInfo { concurrency_cap: cap, ..k },
            None => KeyInfo {
                key_id,
                platform: platform.to_string(),
                base_url: None,
                label: None,
                enabled: true,
                account: None,
                concurrency_cap: cap,
            },
        };
        self.unit.run(Access::Write, |tx| {
            tx.push(Write::UpsertKey(key));
            Ok(())
        })
    }

    /// The account in force for a key (SPEC §14.3): `"key:<key_id>"` for a key of its own.
    pub fn key_account(&mut self, platform: &str, key_id: i64) -> Result<String> {
        check_name("platform", platform)?;
        self.unit.run(Access::Read, |tx| Ok(tx.mirror().reader().account_name(platform, key_id).to_string()))
    }

    /// SPEC §4/§14.1: replaces the model's whole declaration (`limits`) and its
    /// monthly budget label.
    pub fn set_model_limits(
        &mut self, platform: &str, model_id: &str, limits: &LimitSet, monthly_token_budget: Option<String>,
    ) -> Result<()> {
        check_name("platform", platform)?;
        check_name("model_id", model_id)?;
        // A declared limit on a classic window at account scope IS that classic limit
        // (SPEC §14.1): kept as the store keeps it, the classic four and the others.
        let model = ModelInfo {
            platform: platform.to_string(),
            model_id: model_id.to_string(),
            limits: LimitSet::stored(limits.classic(), limits.others()),
            monthly_token_budget,
        };
        self.unit.run(Access::Write, |tx| {
            tx.push(Write::UpsertModel(model));
            Ok(())
        })
    }

    // ---- prices (SPEC 23.1) ----------------------------------------------------------

    /// Sets a model's prices (persisted, shared through the store); `None` forgets
    /// them (the model then costs nothing).
    pub fn set_model_prices(&mut self, platform: &str, model_id: &str, prices: Option<Prices>) -> Result<()> {
        check_name("platform", platform)?;
        check_name("model_id", model_id)?;
        let w =
            Write::SetModelPrices { platform: platform.to_string(), model_id: model_id.to_string(), prices };
        self.unit.run(Access::Write, |tx| {
            tx.push(w);
            Ok(())
        })
    }

    // ---- platform limits (SPEC 23.3) -------------------------------------------------

    /// Replaces the limits that hold across every model of a platform (persisted,
    /// shared through the store); an empty list forgets them. Two for the same
    /// (metric, per, scope) are an error, and nothing is written.
    pub fn set_platform_limits(&mut self, platform: &str, limits: Vec<Limit>) -> Result<()> {
        check_name("platform", platform)?;
        let limits = LimitSet::platform(limits)?.declared();
        self.unit.run(Access::Write, |tx| {
            tx.push(Write::SetPlatformLimits { platform: platform.to_string(), limits });
            Ok(())
        })
    }

    /// A model's prices as held, `None` when none are set.
    pub fn model_prices(&mut self, platform: &str, model_id: &str) -> Result<Option<Prices>> {
        self.unit.run(Access::Read, |tx| Ok(tx.mirror().config.prices(platform, model_id)))
    }

    /// The platform's limits in gate order, as declared (scope `account` or `key`).
    pub fn platform_limits(&mut self, platform: &str) -> Result<Vec<Limit>> {
        check_name("platform", platform)?;
        self.unit.run(Access::Read, |tx| Ok(tx.mirror().config.platform_set(platform).declared()))
    }

    // ---- provider calendars (SPEC §14.2) ---------------------------------------------

    /// Sets the zone of a platform's calendar (persisted, shared; wins over the
    /// environment and the built-in zone); `None` forgets it.
    pub fn set_platform_calendar(&mut self, platform: &str, zone: Option<&str>) -> Result<()> {
        check_name("platform", platform)?;
        if let Some(z) = zone {
            if Calendar::of_zone(z).is_none() {
                return Err(Error::Invalid(format!(
                    "unknown time zone {z:?}: give an IANA name such as \"America/Los_Angeles\" or \"UTC\""
                )));
            }
        }
        let w = Write::SetCalendar { platform: platform.to_string(), zone: zone.map(str::to_string) };
        self.unit.run(Access::Write, |tx| {
            tx.push(w);
            Ok(())
        })
    }

    // ---- priorities (SPEC 22.1) ----------------------------------------------------

    /// Keeps `floor(limit * fraction)` of every limit free for calls of a smaller
    /// priority number than `priority` (persisted, shared through the store).
    pub fn set_priority_reserve(&mut self, priority: i64, fraction: f64) -> Result<()> {
        check_priority(priority)?;
        if !fraction.is_finite() || !(0.0..1.0).contains(&fraction) {
            return Err(Error::Invalid(format!("fraction must be in [0, 1), got {fraction}")));
        }
        self.unit.run(Access::Write, |tx| {
            tx.push(Write::SetPriorityReserve { priority, fraction });
            Ok(())
        })
    }

    /// The reserve in force for a call of `priority`: the fraction set for the largest
    /// configured priority `<= priority` (0 when none).
    pub fn priority_reserve(&mut self, priority: i64) -> Result<f64> {
        check_priority(priority)?;
        self.unit.run(Access::Read, |tx| Ok(tx.mirror().reader().reserve_for(priority)))
    }

    /// The calendar in force for a platform (what `f` is given), after reading what
    /// other engines changed.
    fn with_calendar<T>(&mut self, platform: &str, f: impl FnOnce(&Calendar, i64) -> T) -> Result<T> {
        check_name("platform", platform)?;
        self.unit.run(Access::Read, |tx| {
            let now = tx.now();
            Ok(f(&tx.mirror().calendar(platform), now))
        })
    }

    /// The zone in force for a platform's days.
    pub fn platform_calendar(&mut self, platform: &str) -> Result<String> {
        self.with_calendar(platform, |c, _| c.name().to_string())
    }

    /// Start of the platform's day holding `at_ms` (default now).
    pub fn day_start_ms(&mut self, platform: &str, at_ms: Option<i64>) -> Result<i64> {
        self.with_calendar(platform, |c, now| c.day_start(at_ms.unwrap_or(now)))
    }

    /// Start of the platform's day after the one holding `at_ms` (default now).
    pub fn next_day_start_ms(&mut self, platform: &str, at_ms: Option<i64>) -> Result<i64> {
        self.with_calendar(platform, |c, now| c.next_day_start(at_ms.unwrap_or(now)))
    }

    /// The model's declaration, `None` when none was made.
    pub fn model_limits(&mut self, platform: &str, model_id: &str) -> Result<Option<LimitSet>> {
        self.unit.run(Access::Read, |tx| {
            let m = tx.mirror();
            Ok(m.config.model(platform, model_id).map(|_| m.config.limit_set(platform, model_id)))
        })
    }

    /// Every declared limit of a model, the classic four included, in gate order.
    pub fn model_limit_list(&mut self, platform: &str, model_id: &str) -> Result<Vec<Limit>> {
        self.unit.run(Access::Read, |tx| {
            let m = tx.mirror();
            Ok(m.config.limit_set(platform, model_id).iter().map(|d| d.limit.clone()).collect())
        })
    }
}
