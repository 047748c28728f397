//! What the engine is told (SPEC §4, §8, §14, 22.1, 23.1): keys and their accounts,
//! models and their limits and prices, provider calendars, priority reserves and
//! provider caps.
use super::PyQuotaEngine;
use crate::core::types::KeyInfo;
use crate::python::convert::{fraction_arg, int_arg, opt_int_arg, opt_limit, priority_arg, str_arg, Arg};
use crate::python::errors::type_error;
use crate::python::limits::{cap_settings, declaration, limit_list_arg, PyLimit, PyLimits, PyProviderCaps};
use crate::python::money::PyPrices;
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[pymethods]
impl PyQuotaEngine {
    // ---- keys and models ---------------------------------------------------------

    /// Inserts or updates a key. `account` names the provider-side unit that meters
    /// it (SPEC §14.3); `None` makes the key its own account; one beginning with
    /// `"key:"` is a ValueError (SPEC 18.6).
    #[pyo3(signature = (key_id, platform, *, base_url=None, label=None, enabled=true, account=None))]
    #[allow(clippy::too_many_arguments)]
    fn register_key(
        &self, py: Python<'_>, key_id: &Arg, platform: &Arg, base_url: Option<String>, label: Option<String>,
        enabled: bool, account: Option<&Arg>,
    ) -> PyResult<()> {
        let account = match account.filter(|a| !a.is_none()) {
            Some(a) => Some(str_arg(a, "account")?.to_string()),
            None => None,
        };
        let key = KeyInfo {
            key_id: int_arg(key_id, "key_id")?,
            platform: str_arg(platform, "platform")?.to_string(),
            base_url,
            label,
            enabled,
            account,
            concurrency_cap: None, // the engine keeps the key's configured cap
        };
        self.run(py, move |e| e.config().register_key(key))
    }

    /// SPEC §14.3: the account in force for a key (`"key:<key_id>"` for a key of its own).
    fn key_account(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<String> {
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        self.run(py, |e| e.config().key_account(p, k))
    }

    /// SPEC 15.4: the key concurrency cap in force, the smaller of the configured one
    /// (`MAX_CONCURRENT_REQUESTS_PER_KEY[_<PLATFORM>]`) and the one learned from
    /// concurrency failures; `None` when there is neither.
    fn set_key_concurrency_cap(
        &self, py: Python<'_>, platform: &Arg, key_id: &Arg, cap: &Arg,
    ) -> PyResult<()> {
        let p = str_arg(platform, "platform")?.to_string();
        let k = int_arg(key_id, "key_id")?;
        let c = if cap.is_none() { None } else { Some(int_arg(cap, "cap")?) };
        self.run(py, move |e| e.config().set_key_concurrency_cap(&p, k, c))
    }

    /// SPEC 15.4, 20: the key concurrency cap in force: the lowest of the configured
    /// cap (`set_key_concurrency_cap`), the env cap and a learned cap.
    fn key_concurrency_cap(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<Option<i64>> {
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        self.run(py, |e| e.failures().key_concurrency_cap(p, k))
    }

    /// SPEC §4/§14.1: replaces the model's whole declaration, the classic keywords and
    /// `limits=` (an iterable of `Limit`).
    #[pyo3(signature = (platform, model_id, *, rpm=None, rpd=None, tpm=None, tpd=None, monthly_token_budget=None, limits=None))]
    #[allow(clippy::too_many_arguments)]
    fn set_model_limits(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, rpm: Option<&Arg>, rpd: Option<&Arg>,
        tpm: Option<&Arg>, tpd: Option<&Arg>, monthly_token_budget: Option<String>, limits: Option<&Arg>,
    ) -> PyResult<()> {
        let others = match limits.filter(|l| !l.is_none()) {
            Some(l) => limit_list_arg(l, "limits")?,
            None => Vec::new(),
        };
        let get = |v: Option<&Arg>, n: &str| v.map_or(Ok(None), |v| opt_limit(v, n));
        let platform = str_arg(platform, "platform")?;
        let model_id = str_arg(model_id, "model_id")?;
        let classic = [get(rpm, "rpm")?, get(rpd, "rpd")?, get(tpm, "tpm")?, get(tpd, "tpd")?];
        let limits = declaration(platform, model_id, classic, others)?;
        self.run(py, move |e| e.config().set_model_limits(platform, model_id, &limits, monthly_token_budget))
    }

    fn model_limits(&self, py: Python<'_>, platform: &Arg, model_id: &Arg) -> PyResult<Option<PyLimits>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        Ok(self.run(py, |e| e.config().model_limits(p, m))?.map(|s| PyLimits::from(s.classic())))
    }

    /// SPEC §14.1: every declared limit of the model, the classic ones included, in
    /// gate order (a classic one with `per` "minute" or "day").
    fn model_limit_list(&self, py: Python<'_>, platform: &Arg, model_id: &Arg) -> PyResult<Vec<PyLimit>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        Ok(self.run(py, |e| e.config().model_limit_list(p, m))?.into_iter().map(PyLimit::from).collect())
    }

    // ---- prices (SPEC 23.1) ------------------------------------------------------

    /// SPEC 23.1: sets the model's prices (a `Prices`), persisted and shared: every
    /// engine on the store sees them at its next call. `None` forgets them (the model
    /// then costs nothing).
    #[pyo3(signature = (platform, model_id, prices))]
    fn set_model_prices(&self, py: Python<'_>, platform: &Arg, model_id: &Arg, prices: &Arg) -> PyResult<()> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        let prices = if prices.is_none() {
            None
        } else {
            let given = prices.cast::<PyPrices>().map_err(|_| {
                type_error(format!(
                    "prices must be a Prices or None, not {}",
                    prices.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                ))
            })?;
            Some(given.get().core)
        };
        self.run(py, |e| e.config().set_model_prices(p, m, prices))
    }

    /// SPEC 23.1: the model's prices as held (dollars: pico-dollars / 10**6 per million
    /// tokens, / 10**12 per request); `None` when none are set.
    #[pyo3(signature = (platform, model_id))]
    fn model_prices(&self, py: Python<'_>, platform: &Arg, model_id: &Arg) -> PyResult<Option<PyPrices>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        Ok(self.run(py, |e| e.config().model_prices(p, m))?.map(PyPrices::from))
    }

    // ---- platform limits (SPEC 23.3) ---------------------------------------------

    /// SPEC 23.3: replaces the limits that hold across every model of `platform`
    /// (an iterable of `Limit`; empty forgets them). Scope `"account"` counts every key
    /// of the key's account, `"key"` the key alone; a refusal's reason is
    /// `"platform:<metric>/<per>"`. The gates run after the provider caps and before
    /// key concurrency. Persisted and shared through the store. Two limits for the same
    /// window and scope are a `ValueError`, a value that is not a `Limit` a
    /// `TypeError`; nothing is written then.
    #[pyo3(signature = (platform, limits))]
    fn set_platform_limits(&self, py: Python<'_>, platform: &Arg, limits: &Arg) -> PyResult<()> {
        let p = str_arg(platform, "platform")?;
        if limits.is_none() || limits.cast::<PyDict>().is_ok() {
            return Err(pyo3::exceptions::PyTypeError::new_err("limits must be an iterable of Limit"));
        }
        let list = limit_list_arg(limits, "limits")?;
        self.run(py, move |e| e.config().set_platform_limits(p, list))
    }

    /// SPEC 23.3: the platform's limits in gate order (metric, window, scope), as
    /// declared; an empty list when none.
    #[pyo3(signature = (platform))]
    fn platform_limits(&self, py: Python<'_>, platform: &Arg) -> PyResult<Vec<PyLimit>> {
        let p = str_arg(platform, "platform")?;
        Ok(self.run(py, |e| e.config().platform_limits(p))?.into_iter().map(PyLimit::from).collect())
    }

    // ---- priority reserves (SPEC 22.1) -------------------------------------------

    /// SPEC 22.1: a call of priority `priority` or larger (up to the next configured
    /// one) leaves `floor(limit * fraction)` of every window, provider cap and
    /// concurrency cap free. Persisted and shared through the store. A negative
    /// priority or a fraction outside `[0, 1)` is a `ValueError`.
    #[pyo3(signature = (priority, fraction))]
    fn set_priority_reserve(&self, py: Python<'_>, priority: &Arg, fraction: &Arg) -> PyResult<()> {
        let p = priority_arg(priority)?;
        let f = fraction_arg(fraction, "fraction")?;
        self.run(py, |e| e.config().set_priority_reserve(p, f))
    }

    /// SPEC 22.1: the reserve in force for a call of `priority`, the fraction set for
    /// the largest configured priority `<= priority` (0.0 when none).
    #[pyo3(signature = (priority))]
    fn priority_reserve(&self, py: Python<'_>, priority: &Arg) -> PyResult<f64> {
        let p = priority_arg(priority)?;
        self.run(py, |e| e.config().priority_reserve(p))
    }

    // ---- provider calendars (SPEC §14.2) -----------------------------------------

    /// Sets the IANA zone of a platform's days (persisted, shared by every engine on the
    /// store; wins over `PROVIDER_DAY_TZ_<PLATFORM>` and the built-in zone). `None`
    /// forgets it. An unknown zone is a `ValueError`.
    #[pyo3(signature = (platform, tz))]
    fn set_platform_calendar(&self, py: Python<'_>, platform: &Arg, tz: Option<&Arg>) -> PyResult<()> {
        let p = str_arg(platform, "platform")?;
        let z = match tz {
            Some(t) if !t.is_none() => Some(str_arg(t, "tz")?),
            _ => None,
        };
        self.run(py, |e| e.config().set_platform_calendar(p, z))
    }

    /// The IANA zone in force for a platform's days ("UTC" unless set, in the
    /// environment, or built in: "google" is "America/Los_Angeles").
    fn platform_calendar(&self, py: Python<'_>, platform: &Arg) -> PyResult<String> {
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.config().platform_calendar(p))
    }

    /// Start (ms) of the platform's day holding `at_ms` (default: now).
    #[pyo3(signature = (platform, at_ms=None))]
    fn day_start_ms(&self, py: Python<'_>, platform: &Arg, at_ms: Option<&Arg>) -> PyResult<i64> {
        let (p, at) = (str_arg(platform, "platform")?, opt_int_arg(at_ms, "at_ms")?);
        self.run(py, |e| e.config().day_start_ms(p, at))
    }

    /// Start (ms) of the platform's day after the one holding `at_ms` (default: now).
    #[pyo3(signature = (platform, at_ms=None))]
    fn next_day_start_ms(&self, py: Python<'_>, platform: &Arg, at_ms: Option<&Arg>) -> PyResult<i64> {
        let (p, at) = (str_arg(platform, "platform")?, opt_int_arg(at_ms, "at_ms")?);
        self.run(py, |e| e.config().next_day_start_ms(p, at))
    }

    // ---- provider caps (SPEC §8) -------------------------------------------------

    fn provider_caps(&self, py: Python<'_>, platform: &Arg) -> PyResult<PyProviderCaps> {
        let p = str_arg(platform, "platform")?;
        Ok(self.run(py, |e| e.observed().provider_caps(p))?.into())
    }

    /// SPEC 21.2, 24.6: the provider caps learned for the key's account from pool
    /// 429s (daily and minute requests; None where nothing was learned). They belong
    /// to the account: a key moved to another account reports that account's.
    fn learned_provider_caps(
        &self, py: Python<'_>, platform: &Arg, key_id: &Arg,
    ) -> PyResult<PyProviderCaps> {
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        Ok(self.run(py, |e| e.failures().learned_provider_caps(p, k))?.into())
    }

    /// An int sets a cap (0 refuses everything), None means no cap, an omitted
    /// argument keeps what is set. Persisted; wins over env and defaults.
    #[pyo3(signature = (platform, **caps))]
    fn set_provider_caps(
        &self, py: Python<'_>, platform: &Arg, caps: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let settings = cap_settings(caps)?;
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.observed().set_provider_caps(p, settings))
    }

    fn reset_provider_caps(&self, py: Python<'_>, platform: &Arg) -> PyResult<()> {
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.observed().reset_provider_caps(p))
    }
}
