//! Value types seen from Python: frozen, comparable, with readable reprs.
use super::convert::{int_arg, opt_limit, str_arg};
use super::errors::to_pyerr;
use crate::core::clock::{Clock, ManualClock};
use crate::core::limits::Limit;
use crate::core::types::{Admission, Cooldown, Limits, ProviderCaps};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "None".to_string(), |v| v.to_string())
}

/// One limit as data (SPEC §14.1): at most `limit` of `metric` per `per`, counted at
/// `scope`. `per` is "minute", "day", "week", "month" or a sliding width "<N>s",
/// "<N>m", "<N>h", "<N>d" from 1s to 31d; `metric` is "requests", "tokens",
/// "input_tokens" or "output_tokens"; `scope` is "account" (default) or "key".
#[pyclass(frozen, eq, hash, name = "Limit", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyLimit(pub Limit);

#[pymethods]
impl PyLimit {
    #[new]
    #[pyo3(signature = (metric, limit, per, scope=None), text_signature = "(metric, limit, per, scope='account')")]
    fn new(
        metric: &Bound<'_, PyAny>,
        limit: &Bound<'_, PyAny>,
        per: &Bound<'_, PyAny>,
        scope: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        super::errors::shield(|| {
            let metric = str_arg(metric, "metric")?;
            let limit = int_arg(limit, "limit")?;
            let per = str_arg(per, "per")?;
            let scope = match scope {
                Some(s) => str_arg(s, "scope")?,
                None => "account",
            };
            Limit::parse(metric, limit, per, scope).map(Self).map_err(to_pyerr)
        })
    }
    #[getter]
    fn metric(&self) -> &'static str {
        self.0.metric.as_str()
    }
    #[getter]
    fn limit(&self) -> i64 {
        self.0.limit
    }
    #[getter]
    fn per(&self) -> &str {
        &self.0.per
    }
    #[getter]
    fn scope(&self) -> &'static str {
        self.0.scope.as_str()
    }
    fn __repr__(&self) -> String {
        format!(
            "Limit(metric={:?}, limit={}, per={:?}, scope={:?})",
            self.0.metric.as_str(),
            self.0.limit,
            &*self.0.per,
            self.0.scope.as_str()
        )
    }
}

/// A model's window limits; `None` is unlimited.
#[pyclass(frozen, eq, hash, name = "Limits", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyLimits(pub Limits);

#[pymethods]
impl PyLimits {
    #[new]
    #[pyo3(signature = (rpm=None, rpd=None, tpm=None, tpd=None))]
    fn new(
        rpm: Option<&Bound<'_, PyAny>>,
        rpd: Option<&Bound<'_, PyAny>>,
        tpm: Option<&Bound<'_, PyAny>>,
        tpd: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let get = |v: Option<&Bound<'_, PyAny>>, n: &str| v.map_or(Ok(None), |v| opt_limit(v, n));
        Ok(Self(Limits {
            rpm: get(rpm, "rpm")?,
            rpd: get(rpd, "rpd")?,
            tpm: get(tpm, "tpm")?,
            tpd: get(tpd, "tpd")?,
        }))
    }
    #[getter]
    fn rpm(&self) -> Option<i64> {
        self.0.rpm
    }
    #[getter]
    fn rpd(&self) -> Option<i64> {
        self.0.rpd
    }
    #[getter]
    fn tpm(&self) -> Option<i64> {
        self.0.tpm
    }
    #[getter]
    fn tpd(&self) -> Option<i64> {
        self.0.tpd
    }
    /// The limits as a dict {"rpm": .., "rpd": .., "tpm": .., "tpd": ..}.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("rpm", self.0.rpm)?;
        d.set_item("rpd", self.0.rpd)?;
        d.set_item("tpm", self.0.tpm)?;
        d.set_item("tpd", self.0.tpd)?;
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!(
            "Limits(rpm={}, rpd={}, tpm={}, tpd={})",
            opt(self.0.rpm),
            opt(self.0.rpd),
            opt(self.0.tpm),
            opt(self.0.tpd)
        )
    }
}

/// The answer of `check()`. Truthy when allowed.
#[pyclass(frozen, eq, name = "Admission", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyAdmission(pub Admission);

#[pymethods]
impl PyAdmission {
    #[getter]
    fn allowed(&self) -> bool {
        self.0.allowed
    }
    #[getter]
    fn reason(&self) -> Option<&str> {
        self.0.reason.as_ref().map(|r| r.as_str())
    }
    #[getter]
    fn retry_at_ms(&self) -> Option<i64> {
        self.0.retry_at_ms
    }
    fn __bool__(&self) -> bool {
        self.0.allowed
    }
    fn __repr__(&self) -> String {
        match &self.0.reason {
            None => "Admission(allowed=True, reason=None, retry_at_ms=None)".into(),
            Some(r) => format!(
                "Admission(allowed=False, reason={:?}, retry_at_ms={})",
                r.as_str(),
                opt(self.0.retry_at_ms)
            ),
        }
    }
}

/// An active bench of one (platform, model_id, key_id); with key_id None, of the
/// model for every key of the platform (source "upstream", SPEC 21.1).
#[pyclass(frozen, eq, name = "Cooldown", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyCooldown {
    pub cd: Cooldown,
    /// Computed at the time the object was read.
    pub remaining_ms: i64,
}

#[pymethods]
impl PyCooldown {
    #[getter]
    fn platform(&self) -> &str {
        &self.cd.route.platform
    }
    #[getter]
    fn model_id(&self) -> &str {
        &self.cd.route.model_id
    }
    /// None for a model-wide bench (SPEC 21.1).
    #[getter]
    fn key_id(&self) -> Option<i64> {
        (!self.cd.model_wide).then_some(self.cd.route.key_id)
    }
    #[getter]
    fn expires_at_ms(&self) -> i64 {
        self.cd.expires_at_ms
    }
    /// Milliseconds left when this object was read.
    #[getter]
    fn remaining_ms(&self) -> i64 {
        self.remaining_ms
    }
    #[getter]
    fn source(&self) -> &'static str {
        self.cd.source.as_str()
    }
    #[getter]
    fn set_at_ms(&self) -> i64 {
        self.cd.set_at_ms
    }
    fn __repr__(&self) -> String {
        format!(
            "Cooldown(platform={:?}, model_id={:?}, key_id={}, expires_at_ms={}, remaining_ms={}, source={:?}, set_at_ms={})",
            self.cd.route.platform,
            self.cd.route.model_id,
            if self.cd.model_wide { "None".to_string() } else { self.cd.route.key_id.to_string() },
            self.cd.expires_at_ms,
            self.remaining_ms,
            self.cd.source.as_str(),
            self.cd.set_at_ms
        )
    }
}

impl PyCooldown {
    pub fn new(cd: Cooldown, now: i64) -> Self {
        let remaining_ms = cd.expires_at_ms.saturating_sub(now).max(0);
        Self { cd, remaining_ms }
    }
}

/// Provider-wide caps of a platform; `None` is no cap.
#[pyclass(frozen, eq, name = "ProviderCaps", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyProviderCaps(pub ProviderCaps);

#[pymethods]
impl PyProviderCaps {
    #[getter]
    fn daily_requests(&self) -> Option<i64> {
        self.0.daily_requests
    }
    #[getter]
    fn minute_requests(&self) -> Option<i64> {
        self.0.minute_requests
    }
    #[getter]
    fn daily_tokens(&self) -> Option<i64> {
        self.0.daily_tokens
    }
    fn __repr__(&self) -> String {
        format!(
            "ProviderCaps(daily_requests={}, minute_requests={}, daily_tokens={})",
            opt(self.0.daily_requests),
            opt(self.0.minute_requests),
            opt(self.0.daily_tokens)
        )
    }
}

/// A clock that moves only when told to (SPEC §2). Shared with the engine and its
/// background threads.
#[pyclass(frozen, name = "ManualClock", module = "quotaengine")]
pub struct PyManualClock(pub Arc<ManualClock>);

#[pymethods]
impl PyManualClock {
    #[new]
    fn new(now_ms: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self(Arc::new(ManualClock::new(int_arg(now_ms, "now_ms")?))))
    }
    fn now_ms(&self) -> i64 {
        self.0.now_ms()
    }
    /// Moves the clock by `ms` milliseconds (negative moves it back).
    fn advance(&self, ms: &Bound<'_, PyAny>) -> PyResult<()> {
        self.0.advance(int_arg(ms, "ms")?);
        Ok(())
    }
    fn set(&self, now_ms: &Bound<'_, PyAny>) -> PyResult<()> {
        self.0.set(int_arg(now_ms, "now_ms")?);
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!("ManualClock(now_ms={})", self.0.now_ms())
    }
}

/// A bench decided for a failure.
#[pyclass(frozen, eq, name = "CooldownDecision", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyCooldownDecision(pub crate::core::cooldowns::CooldownDecision);

#[pymethods]
impl PyCooldownDecision {
    #[getter]
    fn duration_ms(&self) -> i64 {
        self.0.duration_ms
    }
    #[getter]
    fn source(&self) -> &'static str {
        self.0.source.as_str()
    }
    fn __repr__(&self) -> String {
        format!("CooldownDecision(duration_ms={}, source={:?})", self.0.duration_ms, self.0.source.as_str())
    }
}

/// A limit read from a provider's error body, or a key concurrency cap learned from a
/// concurrency failure (SPEC 15.4).
#[pyclass(frozen, eq, hash, name = "LearnedLimit", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyLearnedLimit(pub crate::core::parse::LearnedLimit);

#[pymethods]
impl PyLearnedLimit {
    /// "tpm", "tpd", "rpm" or "rpd"; "concurrency" for a key concurrency cap (SPEC 15.4).
    #[getter]
    fn kind(&self) -> &'static str {
        self.0.kind.as_str()
    }
    #[getter]
    fn limit(&self) -> i64 {
        self.0.limit
    }
    fn __repr__(&self) -> String {
        format!("LearnedLimit(kind={:?}, limit={})", self.0.kind.as_str(), self.0.limit)
    }
}

/// What `record_failure` decided.
#[pyclass(frozen, eq, name = "FailureOutcome", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyFailureOutcome(pub crate::core::engine::FailureOutcome);

#[pymethods]
impl PyFailureOutcome {
    #[getter]
    fn kind(&self) -> &'static str {
        self.0.kind.as_str()
    }
    #[getter]
    fn cooldown(&self) -> Option<PyCooldownDecision> {
        self.0.cooldown.map(PyCooldownDecision)
    }
    #[getter]
    fn learned(&self) -> Option<PyLearnedLimit> {
        self.0.learned.map(PyLearnedLimit)
    }
    fn __repr__(&self) -> String {
        format!(
            "FailureOutcome(kind={:?}, cooldown={}, learned={})",
            self.0.kind.as_str(),
            self.cooldown().map_or("None".into(), |c| c.__repr__()),
            self.learned().map_or("None".into(), |l| l.__repr__())
        )
    }
}

fn opt_f(v: Option<i64>) -> String {
    opt(v)
}

/// One observation of a provider's quota (SPEC §8.2).
#[pyclass(frozen, name = "QuotaObservation", module = "quotaengine")]
pub struct PyQuotaObservation(pub crate::core::engine::QuotaObservation);

#[pymethods]
impl PyQuotaObservation {
    #[getter]
    fn platform(&self) -> &str {
        &self.0.platform
    }
    #[getter]
    fn key_id(&self) -> i64 {
        self.0.key_id
    }
    #[getter]
    fn model_id(&self) -> Option<&str> {
        self.0.model_id.as_deref()
    }
    #[getter]
    fn pool_key(&self) -> &str {
        &self.0.pool_key
    }
    /// "requests" or "tokens".
    #[getter]
    fn metric(&self) -> &'static str {
        self.0.metric
    }
    #[getter]
    fn limit(&self) -> Option<i64> {
        self.0.limit
    }
    #[getter]
    fn remaining(&self) -> Option<i64> {
        self.0.remaining
    }
    #[getter]
    fn reset_at_ms(&self) -> Option<i64> {
        self.0.reset_at_ms
    }
    #[getter]
    fn retry_after_ms(&self) -> Option<i64> {
        self.0.retry_after_ms
    }
    /// "header", "error_body", "probe", "local_usage" or "documentation".
    #[getter]
    fn source(&self) -> &'static str {
        self.0.source
    }
    #[getter]
    fn confidence(&self) -> f64 {
        self.0.confidence
    }
    #[getter]
    fn status(&self) -> i64 {
        self.0.status
    }
    fn __repr__(&self) -> String {
        format!(
            "QuotaObservation(platform={:?}, key_id={}, pool_key={:?}, metric={:?}, limit={}, remaining={}, reset_at_ms={}, source={:?}, confidence={:?})",
            self.0.platform,
            self.0.key_id,
            self.0.pool_key,
            self.0.metric,
            opt_f(self.0.limit),
            opt_f(self.0.remaining),
            opt_f(self.0.reset_at_ms),
            self.0.source,
            self.0.confidence
        )
    }
}

/// The merged quota of one (platform, key_id, pool_key, metric) (SPEC §8.2).
#[pyclass(frozen, name = "QuotaState", module = "quotaengine")]
pub struct PyQuotaState(pub crate::core::store::QuotaStateRow);

#[pymethods]
impl PyQuotaState {
    #[getter]
    fn platform(&self) -> &str {
        &self.0.platform
    }
    #[getter]
    fn key_id(&self) -> i64 {
        self.0.key_id
    }
    #[getter]
    fn pool_key(&self) -> &str {
        &self.0.pool_key
    }
    #[getter]
    fn metric(&self) -> &str {
        &self.0.metric
    }
    #[getter]
    fn limit(&self) -> Option<i64> {
        self.0.limit
    }
    #[getter]
    fn remaining(&self) -> Option<i64> {
        self.0.remaining
    }
    #[getter]
    fn reset_at_ms(&self) -> Option<i64> {
        self.0.reset_at_ms
    }
    #[getter]
    fn source(&self) -> &str {
        &self.0.source
    }
    #[getter]
    fn confidence(&self) -> f64 {
        self.0.confidence
    }
    #[getter]
    fn observed_at_ms(&self) -> i64 {
        self.0.observed_at_ms
    }
    fn __repr__(&self) -> String {
        format!(
            "QuotaState(platform={:?}, key_id={}, pool_key={:?}, metric={:?}, limit={}, remaining={}, reset_at_ms={}, source={:?}, confidence={:?}, observed_at_ms={})",
            self.0.platform,
            self.0.key_id,
            self.0.pool_key,
            self.0.metric,
            opt_f(self.0.limit),
            opt_f(self.0.remaining),
            opt_f(self.0.reset_at_ms),
            self.0.source,
            self.0.confidence,
            self.0.observed_at_ms
        )
    }
}

/// What one probe pass did.
#[pyclass(frozen, eq, name = "ProbePassResult", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyProbePassResult(pub crate::core::handle::ProbePassResult);

#[pymethods]
impl PyProbePassResult {
    /// Keys whose validator ran in this pass, in order.
    #[getter]
    fn probed_key_ids(&self) -> Vec<i64> {
        self.0.probed_key_ids.clone()
    }
    /// Heuristic cooldowns cleared by passing keys.
    #[getter]
    fn cleared_cooldowns(&self) -> i64 {
        self.0.cleared_cooldowns
    }
    fn __repr__(&self) -> String {
        format!(
            "ProbePassResult(probed_key_ids={:?}, cleared_cooldowns={})",
            self.0.probed_key_ids, self.0.cleared_cooldowns
        )
    }
}
