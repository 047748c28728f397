//! `QuotaEngine`: argument conversion, then the core with the GIL released.
use super::convert::failure_args;
use super::convert::{
    count_arg, duration_arg, fraction_arg, int_arg, limit_list_arg, limits_arg, opt_int_arg, opt_limit,
    opt_priority_arg, priority_arg, str_arg, token_use_arg,
};
use super::errors::to_pyerr;
use super::errors::type_error;
use super::lease::PyLease;
use super::types::{
    PyAdmission, PyCooldown, PyCooldownDecision, PyFailureOutcome, PyLearnedLimit, PyLimit, PyLimits,
    PyManualClock, PyProviderCaps,
};
use super::validator::PyValidator;
use super::wait::{wait_blocking, PyLeaseWaiter};
use crate::core::admission::Can;
use crate::core::admission::Estimate;
use crate::core::clock::{Clock, SystemClock};
use crate::core::engine::{BatchOp, Engine, Settings, StoreSpec, UsageReport};
use crate::core::env::Env;
use crate::core::error::Result as CoreResult;
use crate::core::handle::Handle;
use crate::core::store::UsageFilter;
use crate::core::types::{CapSetting, CooldownSource, KeyInfo, ModelInfo, Reason, Route, Strategy};
use crate::core::wait::Waiter;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyMapping};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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

fn route(
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
) -> PyResult<Route> {
    Route::new(str_arg(platform, "platform")?, str_arg(model_id, "model_id")?, int_arg(key_id, "key_id")?)
        .map_err(to_pyerr)
}

/// A provider-level route: (platform, key_id) with no model.
fn account(platform: &Bound<'_, PyAny>, key_id: &Bound<'_, PyAny>) -> PyResult<Route> {
    let platform = str_arg(platform, "platform")?;
    crate::core::types::check_name("platform", platform).map_err(to_pyerr)?;
    Ok(Route { platform: platform.to_string(), model_id: String::new(), key_id: int_arg(key_id, "key_id")? })
}

fn window<'py>(py: Python<'py>, used: i64, limit: Option<i64>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("used", used)?;
    d.set_item("limit", limit)?;
    Ok(d)
}

/// SPEC §4's `usage()` dict from the core's list of limits: the classic four always
/// (`rpm`, `rpd`, `tpm`, `tpd`), `in_flight`, then every other declared limit by its
/// reason, in gate order.
fn usage_dict<'py>(py: Python<'py>, u: &UsageReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for r in [Reason::Rpm, Reason::Rpd, Reason::Tpm, Reason::Tpd] {
        let w = u.window(&r);
        d.set_item(r.as_str(), window(py, w.used, w.limit)?)?;
    }
    d.set_item("in_flight", u.in_flight)?;
    for (reason, w) in u.others() {
        d.set_item(reason, window(py, w.used, w.limit)?)?;
    }
    Ok(d)
}

fn cap_setting(v: &Bound<'_, PyAny>, name: &str) -> PyResult<CapSetting> {
    Ok(match opt_limit(v, name)? {
        None => CapSetting::NoCap,
        Some(c) => CapSetting::Cap(c),
    })
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

impl PyQuotaEngine {
    /// The single way into the core: drop the GIL, lock, run; panics and errors come
    /// back as Python exceptions.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&mut Engine) -> CoreResult<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.handle.with(op)).map_err(to_pyerr)
    }

    fn gate(
        &self,
        py: Python<'_>,
        can: Can,
        route: Route,
        est: i64,
        limits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let limits = limits_arg(limits)?;
        self.run(py, move |e| e.check_gate(can, &route, est, limits))
    }

    /// `day_start_ms` / `next_day_start_ms`: the arguments, then `bound` in the core.
    fn day_bound(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        at_ms: Option<&Bound<'_, PyAny>>,
        bound: fn(&mut Engine, &str, Option<i64>) -> CoreResult<i64>,
    ) -> PyResult<i64> {
        let (p, at) = (str_arg(platform, "platform")?, opt_int_arg(at_ms, "at_ms")?);
        self.run(py, |e| bound(e, p, at))
    }

    fn make_lease(&self, py: Python<'_>, id: i64, route: Route, est: i64) -> PyResult<Py<PyLease>> {
        PyLease::create(py, &self.handle, id, route, est)
    }

    /// An admission: at once (`wait` zero), or waiting for capacity (SPEC 17.2).
    fn admit(&self, py: Python<'_>, op: BatchOp, wait: Duration) -> PyResult<(i64, usize)> {
        if wait.is_zero() {
            return py.detach(|| self.handle.batch(op).chosen()).map_err(to_pyerr);
        }
        let waiter = Waiter::new(&self.handle, op, wait);
        wait_blocking(py, waiter)
    }

    /// `lease_any`'s arguments: the candidates, the estimate, the strategy, the wait.
    fn lease_any_op(
        routes: &Bound<'_, PyAny>,
        estimated_tokens: Option<&Bound<'_, PyAny>>,
        estimated_output_tokens: Option<&Bound<'_, PyAny>>,
        strategy: Option<&Bound<'_, PyAny>>,
        wait_s: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(BatchOp, Vec<Route>, i64, Duration)> {
        let rs = routes_arg(routes)?;
        let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
        let output = estimated_output_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_output_tokens"))?;
        let strategy: Strategy = match strategy.filter(|s| !s.is_none()) {
            Some(s) => str_arg(s, "strategy")?.parse().map_err(to_pyerr)?,
            None => Strategy::default(),
        };
        let wait = wait_arg(wait_s)?;
        let priority = opt_priority_arg(priority)?;
        let op = BatchOp::LeaseAny {
            routes: rs.clone(),
            est: Estimate { tokens: est, output },
            strategy,
            priority,
        };
        Ok((op, rs, est, wait))
    }
}

impl PyQuotaEngine {
    fn waiter(&self, op: BatchOp, routes: Vec<Route>, est: i64, wait: Duration) -> PyLeaseWaiter {
        PyLeaseWaiter {
            waiter: std::sync::Mutex::new(Some(Waiter::new(&self.handle, op, wait))),
            handle: self.handle.clone(),
            routes,
            estimated_tokens: est,
        }
    }
}

/// `lease()`'s arguments: the operation, its route, the estimate, the wait.
#[allow(clippy::too_many_arguments)]
fn lease_op(
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
    limits: Option<&Bound<'_, PyAny>>,
    estimated_output_tokens: Option<&Bound<'_, PyAny>>,
    wait_s: Option<&Bound<'_, PyAny>>,
    priority: Option<&Bound<'_, PyAny>>,
) -> PyResult<(BatchOp, Route, i64, Duration)> {
    let r = route(platform, model_id, key_id)?;
    let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
    let output = estimated_output_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_output_tokens"))?;
    let l = limits_arg(limits)?;
    let wait = wait_arg(wait_s)?;
    let priority = opt_priority_arg(priority)?;
    let op = BatchOp::Lease {
        route: r.clone(),
        est: Estimate { tokens: est, output },
        limits: l,
        check: true,
        priority,
    };
    Ok((op, r, est, wait))
}

/// `wait_s`: seconds, finite and >= 0 (None: 0).
fn wait_arg(wait_s: Option<&Bound<'_, PyAny>>) -> PyResult<Duration> {
    match wait_s.filter(|w| !w.is_none()) {
        None => Ok(Duration::ZERO),
        Some(w) => duration_arg(w, "wait_s"),
    }
}

/// `routes`: an iterable of (platform, model_id, key_id).
fn routes_arg(routes: &Bound<'_, PyAny>) -> PyResult<Vec<Route>> {
    if routes.is_instance_of::<pyo3::types::PyString>() || routes.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(type_error(
            "routes must be an iterable of (platform, model_id, key_id) tuples, not a str",
        ));
    }
    let it = routes
        .try_iter()
        .map_err(|_| type_error("routes must be an iterable of (platform, model_id, key_id) tuples"))?;
    let mut out = Vec::new();
    for item in it {
        let item = item?;
        let bad = || {
            type_error(format!(
                "each route must be a (platform, model_id, key_id) tuple, got {}",
                item.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        };
        // A tuple (the common case) is read in place; a list is accepted too.
        let r = if let Ok(t) = item.cast::<pyo3::types::PyTuple>() {
            if t.len() != 3 {
                return Err(bad());
            }
            route(&t.get_item(0)?, &t.get_item(1)?, &t.get_item(2)?)?
        } else if let Ok(l) = item.cast::<PyList>() {
            if l.len() != 3 {
                return Err(bad());
            }
            route(&l.get_item(0)?, &l.get_item(1)?, &l.get_item(2)?)?
        } else {
            return Err(bad());
        };
        out.push(r);
    }
    if out.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "routes is empty: give at least one (platform, model_id, key_id)",
        ));
    }
    Ok(out)
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
        // A panic anywhere in here (conversions, opening the store) is an exception.
        super::errors::shield(|| {
            // The environment is read once, here: a mapping replaces os.environ.
            let env_obj = match env {
                Some(e) if !e.is_none() => e.clone(),
                _ => py.import("os")?.getattr("environ")?,
            };
            let mapping = env_obj
                .cast::<PyMapping>()
                .map_err(|_| super::errors::type_error("env must be a mapping"))?;
            let mut vars = HashMap::new();
            for item in mapping.items()?.iter() {
                let (k, v): (String, String) = item
                    .extract()
                    .map_err(|_| super::errors::type_error("env keys and values must be str"))?;
                vars.insert(k, v);
            }
            let path: String = match path {
                Some(p) if !p.is_none() => py.import("os")?.getattr("fsdecode")?.call1((p,))?.extract()?,
                _ => vars
                    .get("QUOTAENGINE_DB")
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "./quota.db".into()),
            };
            let clock: Arc<dyn Clock> = match clock {
                Some(c) if !c.is_none() => {
                    let c = c.cast::<PyManualClock>().map_err(|_| {
                        super::errors::type_error("clock must be a quotaengine.ManualClock or None")
                    })?;
                    c.get().0.clone()
                }
                _ => Arc::new(SystemClock),
            };
            let d = Settings::default();
            let ms = |v: Option<&Bound<'_, PyAny>>, name: &str, default: i64| match v {
                Some(v) if !v.is_none() => count_arg(v, name),
                _ => Ok(default),
            };
            let settings = Settings {
                retention_ms: ms(retention_ms, "retention_ms", d.retention_ms)?,
                lease_max_age_ms: ms(lease_max_age_ms, "lease_max_age_ms", d.lease_max_age_ms)?,
                window_usage_ttl_ms: ms(window_usage_ttl_ms, "window_usage_ttl_ms", d.window_usage_ttl_ms)?,
                busy_timeout_ms: ms(busy_timeout_ms, "busy_timeout_ms", d.busy_timeout_ms)?,
                flush_interval_ms: ms(flush_interval_ms, "flush_interval_ms", d.flush_interval_ms)?,
                readonly,
                env: Env::new(vars),
            };
            let probe_disabled = settings.env.probe_disabled();
            let probe_max_per_pass = settings.env.probe_max_per_pass();
            let spec = StoreSpec::from_path(&path);
            let clock2 = clock.clone();
            let handle = py.detach(move || Handle::open(&spec, clock2, settings)).map_err(to_pyerr)?;
            Ok(Self {
                handle,
                clock,
                path,
                readonly,
                validator: parking_lot::Mutex::new(None),
                probe_disabled,
                probe_max_per_pass,
            })
        })
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
        self.run(py, move |e| e.register_key(key))
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
        self.run(py, |e| e.key_account(p, k))
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
        self.run(py, move |e| e.set_key_concurrency_cap(&p, k, c))
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
        self.run(py, |e| e.key_concurrency_cap(p, k))
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
        let others = match limits.filter(|l| !l.is_none()) {
            Some(l) => limit_list_arg(l, "limits")?,
            None => Vec::new(),
        };
        let get = |v: Option<&Bound<'_, PyAny>>, n: &str| v.map_or(Ok(None), |v| opt_limit(v, n));
        let model = ModelInfo {
            platform: str_arg(platform, "platform")?.to_string(),
            model_id: str_arg(model_id, "model_id")?.to_string(),
            limits: crate::core::types::Limits {
                rpm: get(rpm, "rpm")?,
                rpd: get(rpd, "rpd")?,
                tpm: get(tpm, "tpm")?,
                tpd: get(tpd, "tpd")?,
            },
            others,
            monthly_token_budget,
        };
        self.run(py, move |e| e.set_model_limits(model))
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
        self.run(py, |e| e.set_priority_reserve(p, f))
    }

    /// SPEC 22.1: the reserve in force for a call of `priority`, the fraction set for
    /// the largest configured priority `<= priority` (0.0 when none).
    #[pyo3(signature = (priority))]
    fn priority_reserve(&self, py: Python<'_>, priority: &Bound<'_, PyAny>) -> PyResult<f64> {
        let p = priority_arg(priority)?;
        self.run(py, |e| e.priority_reserve(p))
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
        let p = str_arg(platform, "platform")?;
        let z = match tz {
            Some(t) if !t.is_none() => Some(str_arg(t, "tz")?),
            _ => None,
        };
        self.run(py, |e| e.set_platform_calendar(p, z))
    }

    /// The IANA zone in force for a platform's days ("UTC" unless set, in the
    /// environment, or built in: "google" is "America/Los_Angeles").
    fn platform_calendar(&self, py: Python<'_>, platform: &Bound<'_, PyAny>) -> PyResult<String> {
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.platform_calendar(p))
    }

    /// Start (ms) of the platform's day holding `at_ms` (default: now).
    #[pyo3(signature = (platform, at_ms=None))]
    fn day_start_ms(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        at_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        self.day_bound(py, platform, at_ms, Engine::day_start_ms)
    }

    /// Start (ms) of the platform's day after the one holding `at_ms` (default: now).
    #[pyo3(signature = (platform, at_ms=None))]
    fn next_day_start_ms(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        at_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        self.day_bound(py, platform, at_ms, Engine::next_day_start_ms)
    }

    fn model_limits(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PyLimits>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        Ok(self.run(py, |e| e.model_limits(p, m))?.map(PyLimits))
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
        Ok(self.run(py, |e| e.model_limit_list(p, m))?.into_iter().map(PyLimit).collect())
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
        self.run(py, move |e| e.record_request(&r))
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
        let r = route(platform, model_id, key_id)?;
        let used = token_use_arg(tokens, input_tokens, output_tokens, cached_tokens)?.ok_or_else(|| {
            type_error("record_tokens needs tokens, input_tokens, output_tokens or cached_tokens")
        })?;
        self.run(py, move |e| e.record_token_use(&r, used))
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
        let r = route(platform, model_id, key_id)?;
        let lookback = match lookback_ms.filter(|l| !l.is_none()) {
            None => crate::core::engine::DEFAULT_LOOKBACK_MS,
            Some(l) => int_arg(l, "lookback_ms")?,
        };
        let f = self.run(py, move |e| e.forecast(&r, lookback))?;
        let d = PyDict::new(py);
        for (k, t) in f {
            d.set_item(k, t)?;
        }
        Ok(d)
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
        let u = self.run(py, move |e| e.usage(&r, l))?;
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
        let r = route(platform, model_id, key_id)?;
        let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
        let op =
            BatchOp::Lease { route: r, est: Estimate::tokens(est), limits: None, check: false, priority: 0 };
        py.detach(|| self.handle.batch(op).lease_id()).map_err(to_pyerr)
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
        let (op, r, est, wait) = lease_op(
            platform,
            model_id,
            key_id,
            estimated_tokens,
            limits,
            estimated_output_tokens,
            wait_s,
            priority,
        )?;
        let (id, _) = self.admit(py, op, wait)?;
        self.make_lease(py, id, r, est)
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
        let (op, rs, est, wait) = Self::lease_any_op(
            routes,
            estimated_tokens,
            estimated_output_tokens,
            strategy,
            wait_s,
            priority,
        )?;
        let (id, i) = self.admit(py, op, wait)?;
        self.make_lease(py, id, rs[i].clone(), est)
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
        let (op, r, est, wait) = lease_op(
            platform,
            model_id,
            key_id,
            estimated_tokens,
            limits,
            estimated_output_tokens,
            wait_s,
            priority,
        )?;
        Ok(self.waiter(op, vec![r], est, wait))
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
        let (op, rs, est, wait) = Self::lease_any_op(
            routes,
            estimated_tokens,
            estimated_output_tokens,
            strategy,
            wait_s,
            priority,
        )?;
        Ok(self.waiter(op, rs, est, wait))
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
        self.run(py, move |e| e.set_cooldown(&r, d, s))
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
        let (cd, now) = self.run(py, move |e| Ok((e.cooldown(&r)?, e.now_ms())))?;
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
        let ids: Option<Vec<i64>> = match key_ids {
            Some(k) if !k.is_none() => {
                Some(k.try_iter()?.map(|i| int_arg(&i?, "key_ids[]")).collect::<PyResult<Vec<i64>>>()?)
            }
            _ => None,
        };
        let (v, now) = self.run(py, move |e| Ok((e.active_cooldowns(ids.as_deref())?, e.now_ms())))?;
        Ok(v.into_iter().map(|c| PyCooldown::new(c, now)).collect())
    }

    /// Every stored cooldown, expired ones included until cleaned up, by route.
    fn stored_cooldowns(&self, py: Python<'_>) -> PyResult<Vec<PyCooldown>> {
        let (v, now) = self.run(py, |e| Ok((e.stored_cooldowns()?, e.now_ms())))?;
        Ok(v.into_iter().map(|c| PyCooldown::new(c, now)).collect())
    }

    /// Operator reset of a key: deletes its cooldowns; returns how many.
    fn clear_cooldowns_for_key(&self, py: Python<'_>, key_id: &Bound<'_, PyAny>) -> PyResult<i64> {
        let k = int_arg(key_id, "key_id")?;
        self.run(py, move |e| e.clear_cooldowns_for_key(k))
    }

    fn clear_cooldown_early(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        self.run(py, move |e| e.clear_cooldown_early(&r).map(|_| ()))
    }

    fn cleanup_expired_cooldowns(&self, py: Python<'_>) -> PyResult<i64> {
        self.run(py, |e| e.cleanup_expired_cooldowns())
    }

    fn soonest_cooldown_expiry(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        self.run(py, |e| Ok(e.active_cooldowns(None)?.first().map(|c| c.expires_at_ms)))
    }

    /// Active heuristic cooldowns (those a probe may clear), soonest first.
    fn probeable_cooldowns(&self, py: Python<'_>) -> PyResult<Vec<PyCooldown>> {
        let (v, now) = self.run(py, |e| Ok((e.probeable_cooldowns()?, e.now_ms())))?;
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
        let r = route(platform, model_id, key_id)?;
        let l = limits_arg(limits)?;
        let ra = opt_int_arg(retry_after_ms, "retry_after_ms")?;
        Ok(PyCooldownDecision(self.run(py, move |e| e.cooldown_decision_for_limit(&r, l, ra, quota_signal))?))
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
        Ok(PyFailureOutcome(self.run(py, move |e| e.record_failure(&r, input))?))
    }

    /// SPEC §7: writes the model's limit only when it tightens it; returns what changed.
    fn learn_limit_from_error(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        model_id: &Bound<'_, PyAny>,
        message: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyLearnedLimit>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        let msg = match message.filter(|m| !m.is_none()) {
            Some(x) => Some(str_arg(x, "message")?),
            None => None,
        };
        Ok(self.run(py, |e| e.learn_limit_from_error(p, m, msg))?.map(PyLearnedLimit))
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
        self.run(py, |e| e.model_window_used_fraction(p, m, l, k))
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
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        let m = match model_id.filter(|m| !m.is_none()) {
            Some(m) => Some(str_arg(m, "model_id")?),
            None => None,
        };
        let st = opt_int_arg(status, "status")?.unwrap_or(200);
        let hs = super::convert::headers_arg(headers)?;
        let obs = self.run(py, |e| e.record_quota_headers(p, k, &hs, m, st))?;
        Ok(obs.into_iter().map(super::types::PyQuotaObservation).collect())
    }

    /// The merged quota rows, one per (platform, key_id, pool_key, metric).
    fn quota_state(&self, py: Python<'_>) -> PyResult<Vec<super::types::PyQuotaState>> {
        Ok(self.run(py, |e| e.quota_state())?.into_iter().map(super::types::PyQuotaState).collect())
    }

    /// SPEC §8.2: key_id -> worst remaining/limit over its confident rows (<= 1.0).
    fn key_quota_headroom<'py>(
        &self,
        py: Python<'py>,
        platform: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = str_arg(platform, "platform")?;
        let v = self.run(py, |e| e.key_quota_headroom(p))?;
        let d = PyDict::new(py);
        for (k, h) in v {
            d.set_item(k, h)?;
        }
        Ok(d)
    }

    /// Drops the guardrail snapshot so the next call rebuilds it.
    fn invalidate_window_usage(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |e| {
            e.invalidate_window_usage();
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
        if !validator.is_callable() {
            return Err(super::errors::type_error("validator must be callable"));
        }
        let interval = match interval_s.filter(|v| !v.is_none()) {
            Some(v) => duration_arg(v, "interval_s")?,
            None => Duration::from_secs(60),
        };
        let max = match max_per_pass.filter(|v| !v.is_none()) {
            Some(v) => usize::try_from(count_arg(v, "max_per_pass")?).unwrap_or(usize::MAX),
            None => self.probe_max_per_pass,
        };
        let event_loop = r#loop.filter(|l| !l.is_none()).map(|l| l.clone().unbind());
        if event_loop.is_none() && PyValidator::is_coroutine_function(py, validator)? {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a coroutine validator needs loop= (the event loop to run it on)",
            ));
        }
        let v = Arc::new(PyValidator::new(validator.clone().unbind(), event_loop, self.handle.id()));
        *self.validator.lock() = Some(v.clone());
        if self.probe_disabled {
            return Ok(false);
        }
        if py.detach(|| self.handle.probe_running()).map_err(to_pyerr)? {
            return Ok(true);
        }
        let period = interval.max(Duration::from_millis(1));
        py.detach(|| self.handle.start_probe(v, period, max)).map_err(to_pyerr)?;
        Ok(true)
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
        // SPEC 18.3: from inside a pass (its validator, or what that calls) this would
        // wait for itself. The core sees a pass on this thread; a coroutine validator runs
        // on its loop's thread, in a context that names the engine.
        let id = self.handle.id();
        if crate::core::handle::in_probe_pass(id) || PyValidator::in_coroutine_pass(py, id)? {
            return Err(to_pyerr(crate::core::handle::pass_running()));
        }
        let v: Arc<PyValidator> = match validator.filter(|v| !v.is_none()) {
            Some(f) => {
                if !f.is_callable() {
                    return Err(super::errors::type_error("validator must be callable"));
                }
                Arc::new(PyValidator::new(f.clone().unbind(), None, self.handle.id()))
            }
            None => self.validator.lock().clone().ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err("no validator: pass one or call start_probe first")
            })?,
        };
        let max = match max_probes.filter(|v| !v.is_none()) {
            Some(m) => usize::try_from(count_arg(m, "max_probes")?).unwrap_or(usize::MAX),
            None => self.probe_max_per_pass,
        };
        let jitter_fn: Option<Py<PyAny>> = jitter.filter(|j| !j.is_none()).map(|j| j.clone().unbind());
        let out = py.detach(|| {
            let mut jit = || -> f64 {
                match &jitter_fn {
                    Some(f) => Python::attach(|py| {
                        f.bind(py).call0().and_then(|v| v.extract::<f64>()).unwrap_or(0.0)
                    }),
                    None => crate::core::handle::default_jitter(),
                }
            };
            self.handle.run_probe_pass(&*v, &mut jit, max)
        });
        Ok(super::types::PyProbePassResult(out.map_err(to_pyerr)?))
    }

    // ---- provider pools ----------------------------------------------------------

    fn provider_caps(&self, py: Python<'_>, platform: &Bound<'_, PyAny>) -> PyResult<PyProviderCaps> {
        let p = str_arg(platform, "platform")?;
        Ok(PyProviderCaps(self.run(py, |e| e.provider_caps(p))?))
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
        Ok(PyProviderCaps(self.run(py, |e| e.learned_provider_caps(p, k))?))
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
        let mut slots: [Option<CapSetting>; 3] = [None; 3];
        if let Some(caps) = caps {
            for (k, v) in caps.iter() {
                let name: String = k.extract()?;
                let i = match name.as_str() {
                    "daily_requests" => 0,
                    "minute_requests" => 1,
                    "daily_tokens" => 2,
                    _ => {
                        return Err(super::errors::type_error(format!(
                            "set_provider_caps() got an unexpected keyword argument {name:?}"
                        )))
                    }
                };
                slots[i] = Some(cap_setting(&v, &name)?);
            }
        }
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.set_provider_caps(p, slots[0], slots[1], slots[2]))
    }

    fn reset_provider_caps(&self, py: Python<'_>, platform: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = str_arg(platform, "platform")?;
        self.run(py, |e| e.reset_provider_caps(p))
    }

    fn provider_daily_request_count(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.provider_daily_request_count(&a.platform, a.key_id))
    }

    fn provider_minute_request_count(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.provider_minute_request_count(&a.platform, a.key_id))
    }

    fn provider_daily_token_count(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        key_id: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.provider_daily_token_count(&a.platform, a.key_id))
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
        let f = UsageFilter {
            since_ms: opt_int_arg(since_ms, "since_ms")?,
            until_ms: opt_int_arg(until_ms, "until_ms")?,
            platform,
            model_id,
            key_id: opt_int_arg(key_id, "key_id")?,
        };
        let rows = self.run(py, move |e| e.usage_events(&f))?;
        let out = PyList::empty(py);
        for r in rows {
            let d = PyDict::new(py);
            d.set_item("platform", &*r.platform)?;
            d.set_item("model_id", &*r.model_id)?;
            d.set_item("key_id", r.key_id)?;
            d.set_item("kind", r.kind.as_str())?;
            d.set_item("tokens", r.tokens)?;
            // SPEC §14.4: what the call reported of its split, None where it did not.
            d.set_item("input_tokens", r.kinds.input)?;
            d.set_item("output_tokens", r.kinds.output)?;
            d.set_item("cached_tokens", r.kinds.cached)?;
            d.set_item("created_at_ms", r.created_at_ms)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// `server_logs` rows, newest first.
    #[pyo3(signature = (limit=None), text_signature = "(self, limit=100)")]
    fn server_logs<'py>(
        &self,
        py: Python<'py>,
        limit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let n = limit.map_or(Ok(100), |l| count_arg(l, "limit"))?;
        let rows = self.run(py, move |e| e.server_logs(n))?;
        let out = PyList::empty(py);
        for (id, r, request_id) in rows {
            let d = PyDict::new(py);
            d.set_item("id", id)?;
            d.set_item("level", r.level)?;
            d.set_item("source", r.source)?;
            d.set_item("provider", r.provider)?;
            d.set_item("model", r.model)?;
            d.set_item("event", r.event)?;
            d.set_item("request_id", request_id)?;
            d.set_item("message", r.message)?;
            d.set_item("created_at_ms", r.created_at_ms)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Rows of the snapshot as dicts (wrapped by `quotaengine.QuotaSnapshot`).
    fn _snapshot_rows<'py>(&self, py: Python<'py>) -> PyResult<(i64, Bound<'py, PyList>)> {
        let (rows, now) = self.run(py, |e| Ok((e.snapshot()?, e.now_ms())))?;
        let out = PyList::empty(py);
        for r in rows {
            let d = PyDict::new(py);
            d.set_item("platform", &r.route.platform)?;
            d.set_item("model_id", &r.route.model_id)?;
            d.set_item("key_id", r.route.key_id)?;
            d.set_item("rpm_used", r.rpm_used)?;
            d.set_item("rpm_limit", r.limits.rpm)?;
            d.set_item("rpd_used", r.rpd_used)?;
            d.set_item("rpd_limit", r.limits.rpd)?;
            d.set_item("tpm_used", r.tpm_used)?;
            d.set_item("tpm_limit", r.limits.tpm)?;
            d.set_item("tpd_used", r.tpd_used)?;
            d.set_item("tpd_limit", r.limits.tpd)?;
            d.set_item("used_fraction", r.used_fraction())?;
            // SPEC §14.1: every other declared limit, as (reason, used, limit).
            d.set_item("declared", r.others.clone())?;
            d.set_item("in_flight", r.in_flight)?;
            d.set_item("cooldown_source", r.cooldown.map(|c| c.source.as_str()))?;
            d.set_item("cooldown_expires_at_ms", r.cooldown.map(|c| c.expires_at_ms))?;
            d.set_item("exhausts_at_ms", r.exhausts_at_ms)?;
            out.append(d)?;
        }
        Ok((now, out))
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
