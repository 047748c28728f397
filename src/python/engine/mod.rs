//! `QuotaEngine`: argument conversion, then the core with the GIL released.
//!
//! The class's one `#[pymethods]` block is here, each method with its docstring and
//! signature; a longer body lives in its topic's file: opening (`open`), keys, models
//! and caps (`config`), leases (`leases`), what callers record (`record`), the probe
//! (`probe`), what the engine reports (`reports`), the way into the core (`run`) and
//! the conversions they share (`args`).
use super::convert::failure_args;
use super::convert::{count_arg, fraction_arg, int_arg, limits_arg, opt_int_arg, priority_arg, str_arg};
use super::errors::to_pyerr;
use super::lease::PyLease;
use super::types::{
    PyAdmission, PyCooldown, PyCooldownDecision, PyFailureOutcome, PyLearnedLimit, PyLimit, PyLimits,
    PyProviderCaps,
};
use super::validator::PyValidator;
use super::wait::PyLeaseWaiter;
use crate::core::admission::Can;
use crate::core::clock::Clock;
use crate::core::engine::BatchOp;
use crate::core::handle::Handle;
use crate::core::types::CooldownSource;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::Arc;

mod args;
mod config;
mod leases;
mod open;
mod probe;
mod record;
mod reports;
mod run;

use args::{account, route, usage_dict};

/// The quota and cooldown engine (SPEC §3). Every method releases the GIL while it
/// works; it is safe to share one engine between threads. `path` is a SQLite file,
/// `":memory:"`, or a Redis URL (`redis://[:password@]host:port/db[?prefix=name]`, `rediss://` with
/// `?ssl_ca_certs=ca.pem` for a private CA; `redis+sentinel://` and `redis+cluster://`, SPEC 19.3).
#[pyclass(frozen, weakref, name = "_QuotaEngine", module = "quotaengine._quotaengine", subclass)]
pub struct PyQuotaEngine {
    handle: Handle,
    clock: Arc<dyn Clock>,
    path: String,
    readonly: bool,
    /// The validator given to `start_probe` (used by `run_probe_pass(None)`).
    validator: parking_lot::Mutex<Option<Arc<PyValidator>>>,
    probe_disabled: bool,
    probe_max_per_pass: usize,
}

impl Drop for PyQuotaEngine {
    /// An engine dropped without `close()`: stop its threads and write what is
    /// buffered, with the GIL released (the threads may be waiting for it).
    fn drop(&mut self) {
        let handle = self.handle.clone();
        // Nothing to raise to from a destructor; a caught panic is dropped here.
        let _ = Python::attach(|py| py.detach(|| handle.close()));
    }
}

#[pymethods]
impl PyQuotaEngine {
    #[new]
    #[pyo3(signature = (path=None, *, clock=None, env=None, retention_ms=None, lease_max_age_ms=None,
                        window_usage_ttl_ms=None, busy_timeout_ms=None, flush_interval_ms=None, readonly=false))]
    #[pyo3(
        text_signature = "(path=None, *, clock=None, env=None, retention_ms=86400000, lease_max_age_ms=120000, window_usage_ttl_ms=5000, busy_timeout_ms=5000, flush_interval_ms=0, readonly=False)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
        env: Option<&Bound<'_, PyAny>>,
        retention_ms: Option<&Bound<'_, PyAny>>,
        lease_max_age_ms: Option<&Bound<'_, PyAny>>,
        window_usage_ttl_ms: Option<&Bound<'_, PyAny>>,
        busy_timeout_ms: Option<&Bound<'_, PyAny>>,
        flush_interval_ms: Option<&Bound<'_, PyAny>>,
        readonly: bool,
    ) -> PyResult<Self> {
        open::new(
            py,
            path,
            clock,
            env,
            retention_ms,
            lease_max_age_ms,
            window_usage_ttl_ms,
            busy_timeout_ms,
            flush_interval_ms,
            readonly,
        )
    }

    /// The database path this engine opened.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    #[getter]
    fn readonly(&self) -> bool {
        self.readonly
    }

    #[getter]
    fn closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// True while the database fails and the engine serves from memory (SPEC §10).
    #[getter]
    fn degraded(&self, py: Python<'_>) -> PyResult<bool> {
        self.run(py, |e| Ok(e.degraded()))
    }

    /// The engine's current time (its clock), in ms since the epoch.
    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Ends every live `Lease` of this engine as leaving its `with` block does (SPEC
    /// 18.5), writes what is buffered and closes the database. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.handle.close()).map_err(to_pyerr)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("QuotaEngine({:?}{})", self.path, if self.readonly { ", readonly=True" } else { "" })
    }

    // ---- keys and models ---------------------------------------------------------

    /// Inserts or updates a key. `account` names the provider-side unit that meters
    /// it (SPEC §14.3); `None` makes the key its own account; one beginning with
    /// `"key:"` is a ValueError (SPEC 18.6).
    #[pyo3(signature = (key_id, platform, *, base_url=None, label=None, enabled=true, account=None))]
    #[allow(clippy::too_many_arguments)]
    fn register_key(
        &self,
        py: Python<'_>,
        key_id: &Bound<'_, PyAny>,
        platform: &Bound<'_, PyAny>,
        base_url: Option<String>,
        label: Option<String>,
        enabled: bool,
        account: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        config::register_key(self, py, key_id, platform, base_url, label, enabled, account)
    }

    /// SPEC §14.3: the account in force for a key (`"key:<key_id>"` for a key of its own).
    fn key_account(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        self.run(py, |e| e.config().key_account(p, k))
    }

    /// SPEC 15.4: the key concurrency cap in force, the smaller of the configured one
    /// (`MAX_CONCURRENT_REQUESTS_PER_KEY[_<PLATFORM>]`) and the one learned from
    /// concurrency failures; `None` when there is neither.
    fn set_key_concurrency_cap(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        cap: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let p = str_arg(platform, "platform")?.to_string();
        let k = int_arg(key_id, "key_id")?;
        let c = if cap.is_none() { None } else { Some(int_arg(cap, "cap")?) };
        self.run(py, move |e| e.config().set_key_concurrency_cap(&p, k, c))
    }

    /// SPEC 15.4, 20: the key concurrency cap in force: the lowest of the configured
    /// cap (`set_key_concurrency_cap`), the env cap and a learned cap.
    fn key_concurrency_cap(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<i64>> {
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        self.run(py, |e| e.failures().key_concurrency_cap(p, k))
    }

    /// SPEC §4/§14.1: replaces the model's whole declaration, the classic keywords and
    /// `limits=` (an iterable of `Limit`).
    #[pyo3(signature = (platform, model_id, *, rpm=None, rpd=None, tpm=None, tpd=None, monthly_token_budget=None, limits=None))]
    #[allow(clippy::too_many_arguments)]
    fn set_model_limits(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        rpm: Option<&Bound<'_, PyAny>>,
        rpd: Option<&Bound<'_, PyAny>>,
        tpm: Option<&Bound<'_, PyAny>>,
        tpd: Option<&Bound<'_, PyAny>>,
        monthly_token_budget: Option<String>,
        limits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        config::set_model_limits(
            self,
            py,
            platform,
            model_id,
            rpm,
            rpd,
            tpm,
            tpd,
            monthly_token_budget,
            limits,
        )
    }

    // ---- provider calendars (SPEC §14.2) ----------------------------------------------

    /// SPEC 22.1: a call of priority `priority` or larger (up to the next configured
    /// one) leaves `floor(limit * fraction)` of every window, provider cap and
    /// concurrency cap free. Persisted and shared through the store. A negative
    /// priority or a fraction outside `[0, 1)` is a `ValueError`.
    #[pyo3(signature = (priority, fraction))]
    fn set_priority_reserve(
        &self,
        py: Python<'_>,
        priority: &Bound<'_, PyAny>,
        fraction: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let p = priority_arg(priority)?;
        let f = fraction_arg(fraction, "fraction")?;
        self.run(py, |e| e.config().set_priority_reserve(p, f))
    }

    /// SPEC 22.1: the reserve in force for a call of `priority`, the fraction set for
    /// the largest configured priority `<= priority` (0.0 when none).
    #[pyo3(signature = (priority))]
    fn priority_reserve(&self, py: Python<'_>, priority: &Bound<'_, PyAny>) -> PyResult<f64> {
        let p = priority_arg(priority)?;
        self.run(py, |e| e.config().priority_reserve(p))
    }

    /// Sets the IANA zone of a platform's days (persisted, shared by every engine on the
    /// store; wins over `PROVIDER_DAY_TZ_<PLATFORM>` and the built-in zone). `None`
    /// forgets it. An unknown zone is a `ValueError`.
    #[pyo3(signature = (platform, tz))]
    fn set_platform_calendar(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        tz: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        config::set_platform_calendar(self, py, platform, tz)
    }

    /// The IANA zone in force for a platform's days ("UTC" unless set, in the
    /// environment, or built in: "google" is "America/Los_Angeles").
    fn platform_calendar(&self, py: Python<'_>, platform: &Bound<'_, PyAny>) -> PyResult<String> {
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.config().platform_calendar(p))
    }

    /// Start (ms) of the platform's day holding `at_ms` (default: now).
    #[pyo3(signature = (platform, at_ms=None))]
    fn day_start_ms(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        at_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        self.day_bound(py, platform, at_ms, |e, p, at| e.config().day_start_ms(p, at))
    }

    /// Start (ms) of the platform's day after the one holding `at_ms` (default: now).
    #[pyo3(signature = (platform, at_ms=None))]
    fn next_day_start_ms(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        at_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        self.day_bound(py, platform, at_ms, |e, p, at| e.config().next_day_start_ms(p, at))
    }

    fn model_limits(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PyLimits>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        Ok(self.run(py, |e| e.config().model_limits(p, m))?.map(PyLimits))
    }

    /// SPEC §14.1: every declared limit of the model, the classic ones included, in
    /// gate order (a classic one with `per` "minute" or "day").
    fn model_limit_list(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<PyLimit>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        Ok(self.run(py, |e| e.config().model_limit_list(p, m))?.into_iter().map(PyLimit).collect())
    }

    // ---- usage -------------------------------------------------------------------

    fn record_request(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        self.run(py, move |e| e.usage().record_request(&r))
    }

    /// SPEC §4/§14.4: one call's tokens: the total, or input and output apart (the
    /// total is then their sum), and the cached part of the input.
    #[pyo3(signature = (platform, model_id, key_id, tokens=None, *, input_tokens=None, output_tokens=None, cached_tokens=None))]
    #[allow(clippy::too_many_arguments)]
    fn record_tokens(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        tokens: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        cached_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        record::record_tokens(
            self,
            py,
            platform,
            model_id,
            key_id,
            tokens,
            input_tokens,
            output_tokens,
            cached_tokens,
        )
    }

    /// SPEC 22.2: for each declared window of an hour or longer (keyed as `usage()`
    /// keys them) and each daily provider cap (keyed `provider_daily_requests`,
    /// `provider_daily_tokens`), the time in epoch ms at which it would run out if
    /// the pace of the last `lookback_ms` went on; `None` when it would not before the
    /// window resets, or nothing was used lately.
    #[pyo3(signature = (platform, model_id, key_id, *, lookback_ms=None), text_signature = "(self, platform, model_id, key_id, *, lookback_ms=600000)")]
    fn forecast<'py>(
        &self,
        py: Python<'py>,
        platform: &Bound<'py, PyAny>,
        model_id: &Bound<'py, PyAny>,
        key_id: &Bound<'py, PyAny>,
        lookback_ms: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        reports::forecast(self, py, platform, model_id, key_id, lookback_ms)
    }

    #[pyo3(signature = (platform, model_id, key_id, limits=None))]
    fn usage<'py>(
        &self,
        py: Python<'py>,
        platform: &Bound<'py, PyAny>,
        model_id: &Bound<'py, PyAny>,
        key_id: &Bound<'py, PyAny>,
        limits: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let r = route(platform, model_id, key_id)?;
        let l = limits_arg(limits)?;
        let u = self.run(py, move |e| e.usage().report(&r, l))?;
        usage_dict(py, &u)
    }

    // ---- gates -------------------------------------------------------------------

    #[pyo3(signature = (platform, model_id, key_id, limits=None))]
    fn can_make_request(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        limits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.gate(py, Can::Request, route(platform, model_id, key_id)?, 0, limits)
    }

    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens, limits=None))]
    fn can_use_tokens(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        estimated_tokens: &Bound<'_, PyAny>,
        limits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let est = count_arg(estimated_tokens, "estimated_tokens")?;
        self.gate(py, Can::Tokens, route(platform, model_id, key_id)?, est, limits)
    }

    fn can_use_provider(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.gate(py, Can::ProviderDaily, account(platform, key_id)?, 0, None)
    }

    fn can_use_provider_minute(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.gate(py, Can::ProviderMinute, account(platform, key_id)?, 0, None)
    }

    fn can_use_provider_tokens(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        estimated_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let est = count_arg(estimated_tokens, "estimated_tokens")?;
        self.gate(py, Can::ProviderTokens, route(platform, model_id, key_id)?, est, None)
    }

    fn can_use_key_concurrency(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.gate(py, Can::KeyConcurrency, account(platform, key_id)?, 0, None)
    }

    fn is_on_cooldown(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        Ok(!self.gate(py, Can::Cooldown, route(platform, model_id, key_id)?, 0, None)?)
    }

    /// Every gate, in order; the first that fails names the reason (SPEC §4).
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0, limits=None)")]
    fn check(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
        limits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyAdmission> {
        let r = route(platform, model_id, key_id)?;
        let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
        let l = limits_arg(limits)?;
        Ok(PyAdmission(self.run(py, move |e| e.check(&r, est, l))?))
    }

    /// Benchmark floor, not part of the API: takes `check()`'s arguments and does
    /// nothing (`benches/bench_compare.py` compares `check()` with it).
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None))]
    fn _noop_check(
        &self,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
        limits: Option<&Bound<'_, PyAny>>,
    ) {
        let _ = (platform, model_id, key_id, estimated_tokens, limits);
    }

    // ---- leases ------------------------------------------------------------------

    /// Takes a lease without checking any gate; returns its id.
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0)")]
    fn acquire_lease(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        leases::acquire_lease(self, py, platform, model_id, key_id, estimated_tokens)
    }

    /// Releases a lease; idempotent.
    fn release_lease(&self, py: Python<'_>, lease_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = int_arg(lease_id, "lease_id")?;
        py.detach(|| self.handle.batch(BatchOp::Release(id)).done()).map_err(to_pyerr)
    }

    /// Runs every gate and takes the lease as one atomic step (across threads and
    /// processes); raises QuotaExceeded when a gate refuses. With `wait_s`, waits up to
    /// that many seconds for a gate to open (SPEC 17.2), the GIL released.
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None, *, estimated_output_tokens=None, wait_s=None, priority=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0, limits=None, *, estimated_output_tokens=0, wait_s=0.0, priority=0)")]
    #[allow(clippy::too_many_arguments)]
    fn lease(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
        limits: Option<&Bound<'_, PyAny>>,
        estimated_output_tokens: Option<&Bound<'_, PyAny>>,
        wait_s: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyLease>> {
        leases::lease(
            self,
            py,
            platform,
            model_id,
            key_id,
            estimated_tokens,
            limits,
            estimated_output_tokens,
            wait_s,
            priority,
        )
    }

    /// SPEC 17.1: among `routes` ((platform, model_id, key_id) candidates, each with
    /// its stored limits), every gate of every candidate, one of those that pass
    /// picked by `strategy` ("headroom", "order" or "spread"), and its lease taken, in
    /// one atomic step; with `wait_s`, waits for capacity as `lease()` does.
    #[pyo3(signature = (routes, estimated_tokens=None, *, estimated_output_tokens=None, strategy=None, wait_s=None, priority=None), text_signature = "(self, routes, estimated_tokens=0, *, estimated_output_tokens=0, strategy='headroom', wait_s=0.0, priority=0)")]
    #[allow(clippy::too_many_arguments)]
    fn lease_any(
        &self,
        py: Python<'_>,
        routes: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
        estimated_output_tokens: Option<&Bound<'_, PyAny>>,
        strategy: Option<&Bound<'_, PyAny>>,
        wait_s: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyLease>> {
        leases::lease_any(
            self,
            py,
            routes,
            estimated_tokens,
            estimated_output_tokens,
            strategy,
            wait_s,
            priority,
        )
    }

    /// The stepper behind `lease_async` (see `quotaengine.QuotaEngine.lease_async`).
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None, *, estimated_output_tokens=None, wait_s=None, priority=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0, limits=None, *, estimated_output_tokens=0, wait_s=0.0, priority=0)")]
    #[allow(clippy::too_many_arguments)]
    fn _lease_waiter(
        &self,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
        limits: Option<&Bound<'_, PyAny>>,
        estimated_output_tokens: Option<&Bound<'_, PyAny>>,
        wait_s: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyLeaseWaiter> {
        leases::lease_waiter(
            self,
            platform,
            model_id,
            key_id,
            estimated_tokens,
            limits,
            estimated_output_tokens,
            wait_s,
            priority,
        )
    }

    /// The stepper behind `lease_any_async`.
    #[pyo3(signature = (routes, estimated_tokens=None, *, estimated_output_tokens=None, strategy=None, wait_s=None, priority=None), text_signature = "(self, routes, estimated_tokens=0, *, estimated_output_tokens=0, strategy='headroom', wait_s=0.0, priority=0)")]
    fn _lease_any_waiter(
        &self,
        routes: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
        estimated_output_tokens: Option<&Bound<'_, PyAny>>,
        strategy: Option<&Bound<'_, PyAny>>,
        wait_s: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyLeaseWaiter> {
        leases::lease_any_waiter(
            self,
            routes,
            estimated_tokens,
            estimated_output_tokens,
            strategy,
            wait_s,
            priority,
        )
    }

    // ---- cooldowns ---------------------------------------------------------------

    #[pyo3(signature = (platform, model_id, key_id, duration_ms=None, source="heuristic"), text_signature = "(self, platform, model_id, key_id, duration_ms=60000, source='heuristic')")]
    fn set_cooldown(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        duration_ms: Option<&Bound<'_, PyAny>>,
        source: &str,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        let d = duration_ms.map_or(Ok(60_000), |d| count_arg(d, "duration_ms"))?;
        let s: CooldownSource = source.parse().map_err(to_pyerr)?;
        self.run(py, move |e| e.failures().set_cooldown(&r, d, s))
    }

    /// The route's bench: whichever of its own cooldown and its model's model-wide one
    /// (key_id None, SPEC 21.1) ends later; None when neither is active.
    fn cooldown(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PyCooldown>> {
        let r = route(platform, model_id, key_id)?;
        let (cd, now) = self.run(py, move |e| Ok((e.failures().cooldown(&r)?, e.now_ms())))?;
        Ok(cd.map(|c| PyCooldown::new(c, now)))
    }

    /// Active cooldowns, soonest expiry first; the model-wide ones (key_id None) only
    /// when `key_ids` is None.
    #[pyo3(signature = (key_ids=None))]
    fn active_cooldowns(
        &self,
        py: Python<'_>,
        key_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<PyCooldown>> {
        reports::active_cooldowns(self, py, key_ids)
    }

    /// Every stored cooldown, expired ones included until cleaned up, by route.
    fn stored_cooldowns(&self, py: Python<'_>) -> PyResult<Vec<PyCooldown>> {
        let (v, now) = self.run(py, |e| Ok((e.observed().stored_cooldowns()?, e.now_ms())))?;
        Ok(v.into_iter().map(|c| PyCooldown::new(c, now)).collect())
    }

    /// Operator reset of a key: deletes its cooldowns; returns how many.
    fn clear_cooldowns_for_key(&self, py: Python<'_>, key_id: &Bound<'_, PyAny>) -> PyResult<i64> {
        let k = int_arg(key_id, "key_id")?;
        self.run(py, move |e| e.failures().clear_cooldowns_for_key(k))
    }

    fn clear_cooldown_early(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        self.run(py, move |e| e.failures().clear_cooldown_early(&r).map(|_| ()))
    }

    fn cleanup_expired_cooldowns(&self, py: Python<'_>) -> PyResult<i64> {
        self.run(py, |e| e.failures().cleanup_expired_cooldowns())
    }

    fn soonest_cooldown_expiry(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        self.run(py, |e| Ok(e.failures().active_cooldowns(None)?.first().map(|c| c.expires_at_ms)))
    }

    /// Active heuristic cooldowns (those a probe may clear), soonest first.
    fn probeable_cooldowns(&self, py: Python<'_>) -> PyResult<Vec<PyCooldown>> {
        let (v, now) = self.run(py, |e| Ok((e.failures().probeable_cooldowns()?, e.now_ms())))?;
        Ok(v.into_iter().map(|c| PyCooldown::new(c, now)).collect())
    }

    /// SPEC §6.1: decides (and counts hits and ladder steps) but sets no cooldown.
    #[pyo3(signature = (platform, model_id, key_id, limits=None, retry_after_ms=None, quota_signal=true))]
    #[allow(clippy::too_many_arguments)]
    fn cooldown_decision_for_limit(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        limits: Option<&Bound<'_, PyAny>>,
        retry_after_ms: Option<&Bound<'_, PyAny>>,
        quota_signal: bool,
    ) -> PyResult<PyCooldownDecision> {
        record::cooldown_decision_for_limit(
            self,
            py,
            platform,
            model_id,
            key_id,
            limits,
            retry_after_ms,
            quota_signal,
        )
    }

    /// SPEC §6.2: one call for any failure; benches the route and learns limits. An
    /// "upstream" failure benches the model on every key of the platform instead (SPEC
    /// 21.1); a pool 429 teaches the account a provider cap (21.2).
    #[pyo3(signature = (platform, model_id, key_id, *, status=None, retry_after=None, message=None, kind=None, limits=None))]
    #[allow(clippy::too_many_arguments)]
    fn record_failure(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        status: Option<&Bound<'_, PyAny>>,
        retry_after: Option<&Bound<'_, PyAny>>,
        message: Option<&Bound<'_, PyAny>>,
        kind: Option<&Bound<'_, PyAny>>,
        limits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyFailureOutcome> {
        let r = route(platform, model_id, key_id)?;
        let input = failure_args(status, retry_after, message, kind, limits)?;
        Ok(PyFailureOutcome(self.run(py, move |e| e.failures().record_failure(&r, input))?))
    }

    /// SPEC §7: writes the model's limit only when it tightens it; returns what changed.
    fn learn_limit_from_error(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        message: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyLearnedLimit>> {
        record::learn_limit_from_error(self, py, platform, model_id, message)
    }

    /// SPEC §9: the used fraction of the model's windows on its key with the most
    /// headroom, from a snapshot reused for `window_usage_ttl_ms`; None when it has no
    /// window limit, no routable key, or the database cannot be read.
    #[pyo3(signature = (platform, model_id, limits=None, key_id=None))]
    fn model_window_used_fraction(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        limits: Option<&Bound<'_, PyAny>>,
        key_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<f64>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        let l = limits_arg(limits)?;
        let k = opt_int_arg(key_id, "key_id")?;
        self.run(py, |e| e.observed().model_window_used_fraction(p, m, l, k))
    }

    /// SPEC §8.2: reads x-ratelimit-*, anthropic-ratelimit-* and retry-after headers
    /// (names case-insensitive); merges them into the quota state.
    #[pyo3(signature = (platform, key_id, headers, *, model_id=None, status=None), text_signature = "(self, platform, key_id, headers, *, model_id=None, status=200)")]
    fn record_quota_headers(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
        headers: &Bound<'_, PyAny>,
        model_id: Option<&Bound<'_, PyAny>>,
        status: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<super::types::PyQuotaObservation>> {
        reports::record_quota_headers(self, py, platform, key_id, headers, model_id, status)
    }

    /// The merged quota rows, one per (platform, key_id, pool_key, metric).
    fn quota_state(&self, py: Python<'_>) -> PyResult<Vec<super::types::PyQuotaState>> {
        Ok(self
            .run(py, |e| e.observed().quota_state())?
            .into_iter()
            .map(super::types::PyQuotaState)
            .collect())
    }

    /// SPEC §8.2: key_id -> worst remaining/limit over its confident rows (<= 1.0).
    fn key_quota_headroom<'py>(
        &self,
        py: Python<'py>,
        platform: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        reports::key_quota_headroom(self, py, platform)
    }

    /// Drops the guardrail snapshot so the next call rebuilds it.
    fn invalidate_window_usage(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |e| {
            e.observed().invalidate_window_usage();
            Ok(())
        })
    }

    // ---- background probe (SPEC §11) ----------------------------------------------

    /// Starts the background probe thread; True when it runs (a second call starts
    /// nothing and returns True); False with COOLDOWN_PROBE_DISABLED=1. A coroutine
    /// validator needs `loop` (ValueError otherwise).
    #[pyo3(signature = (validator, *, interval_s=None, max_per_pass=None, r#loop=None), text_signature = "(self, validator, *, interval_s=60.0, max_per_pass=None, loop=None)")]
    fn start_probe(
        &self,
        py: Python<'_>,
        validator: &Bound<'_, PyAny>,
        interval_s: Option<&Bound<'_, PyAny>>,
        max_per_pass: Option<&Bound<'_, PyAny>>,
        r#loop: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        probe::start_probe(self, py, validator, interval_s, max_per_pass, r#loop)
    }

    /// Stops the background probe; returns promptly, also while a validator runs.
    fn stop_probe(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.handle.stop_probe()).map_err(to_pyerr)
    }

    /// One probe pass in the calling thread (SPEC §11). `validator=None` uses the one
    /// given to `start_probe` (ValueError when there is none); `jitter()` returns a
    /// number in [0, 1) for first-sighting schedules. From inside a pass of this engine
    /// (its validator, or what that calls): RuntimeError (SPEC 18.3).
    #[pyo3(signature = (validator=None, *, jitter=None, max_probes=None))]
    fn run_probe_pass(
        &self,
        py: Python<'_>,
        validator: Option<&Bound<'_, PyAny>>,
        jitter: Option<&Bound<'_, PyAny>>,
        max_probes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<super::types::PyProbePassResult> {
        probe::run_probe_pass(self, py, validator, jitter, max_probes)
    }

    // ---- provider pools ----------------------------------------------------------

    fn provider_caps(&self, py: Python<'_>, platform: &Bound<'_, PyAny>) -> PyResult<PyProviderCaps> {
        let p = str_arg(platform, "platform")?;
        Ok(PyProviderCaps(self.run(py, |e| e.observed().provider_caps(p))?))
    }

    /// SPEC 21.2: the provider caps learned for the key's account from pool 429s
    /// (daily and minute requests; None where nothing was learned).
    fn learned_provider_caps(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<PyProviderCaps> {
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        Ok(PyProviderCaps(self.run(py, |e| e.failures().learned_provider_caps(p, k))?))
    }

    /// An int sets a cap (0 refuses everything), None means no cap, an omitted
    /// argument keeps what is set. Persisted; wins over env and defaults.
    #[pyo3(signature = (platform, **caps))]
    fn set_provider_caps(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        caps: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        config::set_provider_caps(self, py, platform, caps)
    }

    fn reset_provider_caps(&self, py: Python<'_>, platform: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.observed().reset_provider_caps(p))
    }

    fn provider_daily_request_count(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.observed().provider_daily_request_count(&a.platform, a.key_id))
    }

    fn provider_minute_request_count(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.observed().provider_minute_request_count(&a.platform, a.key_id))
    }

    fn provider_daily_token_count(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.observed().provider_daily_token_count(&a.platform, a.key_id))
    }

    // ---- analysis ----------------------------------------------------------------

    /// Usage rows with `since_ms <= created_at_ms < until_ms`, oldest first.
    #[pyo3(signature = (since_ms=None, until_ms=None, platform=None, model_id=None, key_id=None))]
    fn usage_events<'py>(
        &self,
        py: Python<'py>,
        since_ms: Option<&Bound<'py, PyAny>>,
        until_ms: Option<&Bound<'py, PyAny>>,
        platform: Option<String>,
        model_id: Option<String>,
        key_id: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        reports::usage_events(self, py, since_ms, until_ms, platform, model_id, key_id)
    }

    /// `server_logs` rows, newest first.
    #[pyo3(signature = (limit=None), text_signature = "(self, limit=100)")]
    fn server_logs<'py>(
        &self,
        py: Python<'py>,
        limit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        reports::server_logs(self, py, limit)
    }

    /// Rows of the snapshot as dicts (wrapped by `quotaengine.QuotaSnapshot`).
    fn _snapshot_rows<'py>(&self, py: Python<'py>) -> PyResult<(i64, Bound<'py, PyList>)> {
        reports::snapshot_rows(self, py)
    }

    /// Test hook: panics inside the engine; the panic must come back as an exception.
    fn _debug_panic(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |e| e.debug_panic())
    }

    /// Test hook: the next `n` calls into the engine (any method, a lease's too) panic
    /// inside the boundary, which must turn each into `QuotaEngineError`.
    fn _inject_panics(&self, n: u32) {
        self.handle.inject_panics(n);
    }

    /// Number of changes waiting for the database (degraded mode, grouped writes).
    fn _pending_writes(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |e| Ok(e.pending_writes()))
    }
}
