//! Value types seen from Python: frozen, comparable, with readable reprs, each
//! converted once from the core's value (`From`), its fields read as attributes.
use super::convert::{int_arg, Arg};
use super::limits::opt;
use crate::core::clock::{Clock, ManualClock};
use crate::core::cooldowns::CooldownDecision;
use crate::core::engine::{FailureOutcome, QuotaObservation};
use crate::core::handle::ProbePassResult;
use crate::core::parse::LearnedLimit;
use crate::core::store::QuotaStateRow;
use crate::core::types::{Admission, Cooldown};
use pyo3::prelude::*;
use std::sync::Arc;

/// The answer of `check()`. Truthy when allowed.
#[pyclass(frozen, eq, get_all, name = "Admission", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyAdmission {
    allowed: bool,
    reason: Option<String>,
    retry_at_ms: Option<i64>,
}

impl From<Admission> for PyAdmission {
    fn from(a: Admission) -> Self {
        Self {
            allowed: a.allowed,
            reason: a.reason.map(|r| r.as_str().to_string()),
            retry_at_ms: a.retry_at_ms,
        }
    }
}

#[pymethods]
impl PyAdmission {
    fn __bool__(&self) -> bool {
        self.allowed
    }
    fn __repr__(&self) -> String {
        match &self.reason {
            None => "Admission(allowed=True, reason=None, retry_at_ms=None)".into(),
            Some(r) => {
                format!("Admission(allowed=False, reason={r:?}, retry_at_ms={})", opt(self.retry_at_ms))
            }
        }
    }
}

/// An active bench of one (platform, model_id, key_id); with key_id None, of the
/// model for every key of the platform (source "upstream", SPEC 21.1).
#[pyclass(frozen, eq, get_all, name = "Cooldown", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyCooldown {
    platform: String,
    model_id: String,
    /// None for a model-wide bench (SPEC 21.1).
    key_id: Option<i64>,
    expires_at_ms: i64,
    /// Milliseconds left when this object was read.
    remaining_ms: i64,
    source: &'static str,
    set_at_ms: i64,
}

impl PyCooldown {
    /// The bench as read at `now` (its `remaining_ms`).
    pub fn new(cd: Cooldown, now: i64) -> Self {
        Self {
            key_id: (!cd.model_wide).then_some(cd.route.key_id),
            remaining_ms: cd.expires_at_ms.saturating_sub(now).max(0),
            expires_at_ms: cd.expires_at_ms,
            source: cd.source.as_str(),
            set_at_ms: cd.set_at_ms,
            platform: cd.route.platform,
            model_id: cd.route.model_id,
        }
    }
}

#[pymethods]
impl PyCooldown {
    fn __repr__(&self) -> String {
        format!(
            "Cooldown(platform={:?}, model_id={:?}, key_id={}, expires_at_ms={}, remaining_ms={}, source={:?}, set_at_ms={})",
            self.platform,
            self.model_id,
            opt(self.key_id),
            self.expires_at_ms,
            self.remaining_ms,
            self.source,
            self.set_at_ms
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
    fn new(now_ms: &Arg) -> PyResult<Self> {
        Ok(Self(Arc::new(ManualClock::new(int_arg(now_ms, "now_ms")?))))
    }
    fn now_ms(&self) -> i64 {
        self.0.now_ms()
    }
    /// Moves the clock by `ms` milliseconds (negative moves it back).
    fn advance(&self, ms: &Arg) -> PyResult<()> {
        self.0.advance(int_arg(ms, "ms")?);
        Ok(())
    }
    fn set(&self, now_ms: &Arg) -> PyResult<()> {
        self.0.set(int_arg(now_ms, "now_ms")?);
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!("ManualClock(now_ms={})", self.0.now_ms())
    }
}

/// A bench decided for a failure.
#[pyclass(frozen, eq, get_all, name = "CooldownDecision", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyCooldownDecision {
    duration_ms: i64,
    source: &'static str,
}

impl From<CooldownDecision> for PyCooldownDecision {
    fn from(d: CooldownDecision) -> Self {
        Self { duration_ms: d.duration_ms, source: d.source.as_str() }
    }
}

#[pymethods]
impl PyCooldownDecision {
    fn __repr__(&self) -> String {
        format!("CooldownDecision(duration_ms={}, source={:?})", self.duration_ms, self.source)
    }
}

/// A limit read from a provider's error body, or a key concurrency cap learned from a
/// concurrency failure (SPEC 15.4).
#[pyclass(frozen, eq, hash, get_all, name = "LearnedLimit", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyLearnedLimit {
    /// "tpm", "tpd", "rpm" or "rpd"; "concurrency" for a key concurrency cap (SPEC 15.4).
    kind: &'static str,
    limit: i64,
}

impl From<LearnedLimit> for PyLearnedLimit {
    fn from(l: LearnedLimit) -> Self {
        Self { kind: l.kind.as_str(), limit: l.limit }
    }
}

#[pymethods]
impl PyLearnedLimit {
    fn __repr__(&self) -> String {
        format!("LearnedLimit(kind={:?}, limit={})", self.kind, self.limit)
    }
}

/// What `record_failure` decided.
#[pyclass(frozen, eq, get_all, name = "FailureOutcome", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyFailureOutcome {
    kind: &'static str,
    cooldown: Option<PyCooldownDecision>,
    learned: Option<PyLearnedLimit>,
    /// What the rest of the request skips (SPEC 24.7): "route", "model" or "platform".
    skip: &'static str,
}

impl From<FailureOutcome> for PyFailureOutcome {
    fn from(o: FailureOutcome) -> Self {
        Self {
            kind: o.kind.as_str(),
            cooldown: o.cooldown.map(Into::into),
            learned: o.learned.map(Into::into),
            skip: o.skip.as_str(),
        }
    }
}

#[pymethods]
impl PyFailureOutcome {
    fn __repr__(&self) -> String {
        format!(
            "FailureOutcome(kind={:?}, cooldown={}, learned={}, skip={:?})",
            self.kind,
            self.cooldown.as_ref().map_or("None".into(), PyCooldownDecision::__repr__),
            self.learned.as_ref().map_or("None".into(), PyLearnedLimit::__repr__),
            self.skip
        )
    }
}

/// One observation of a provider's quota (SPEC §8.2).
#[pyclass(frozen, get_all, name = "QuotaObservation", module = "quotaengine")]
pub struct PyQuotaObservation {
    platform: String,
    key_id: i64,
    model_id: Option<String>,
    pool_key: String,
    /// "requests" or "tokens".
    metric: &'static str,
    limit: Option<i64>,
    remaining: Option<i64>,
    reset_at_ms: Option<i64>,
    retry_after_ms: Option<i64>,
    /// "header", "error_body", "probe", "local_usage" or "documentation".
    source: &'static str,
    confidence: f64,
    status: i64,
}

impl From<QuotaObservation> for PyQuotaObservation {
    fn from(o: QuotaObservation) -> Self {
        Self {
            platform: o.platform,
            key_id: o.key_id,
            model_id: o.model_id,
            pool_key: o.pool_key,
            metric: o.metric,
            limit: o.limit,
            remaining: o.remaining,
            reset_at_ms: o.reset_at_ms,
            retry_after_ms: o.retry_after_ms,
            source: o.source,
            confidence: o.confidence,
            status: o.status,
        }
    }
}

#[pymethods]
impl PyQuotaObservation {
    fn __repr__(&self) -> String {
        let (limit, remaining, reset_at_ms) = (opt(self.limit), opt(self.remaining), opt(self.reset_at_ms));
        let Self { platform, key_id, pool_key, metric, source, confidence, .. } = self;
        format!(
            "QuotaObservation(platform={platform:?}, key_id={key_id}, pool_key={pool_key:?}, metric={metric:?}, limit={limit}, remaining={remaining}, reset_at_ms={reset_at_ms}, source={source:?}, confidence={confidence:?})"
        )
    }
}

/// The merged quota of one (platform, key_id, pool_key, metric) (SPEC §8.2).
#[pyclass(frozen, get_all, name = "QuotaState", module = "quotaengine")]
pub struct PyQuotaState {
    platform: String,
    key_id: i64,
    pool_key: String,
    metric: String,
    limit: Option<i64>,
    remaining: Option<i64>,
    reset_at_ms: Option<i64>,
    source: String,
    confidence: f64,
    observed_at_ms: i64,
}

impl From<QuotaStateRow> for PyQuotaState {
    fn from(r: QuotaStateRow) -> Self {
        Self {
            platform: r.platform,
            key_id: r.key_id,
            pool_key: r.pool_key,
            metric: r.metric,
            limit: r.limit,
            remaining: r.remaining,
            reset_at_ms: r.reset_at_ms,
            source: r.source,
            confidence: r.confidence,
            observed_at_ms: r.observed_at_ms,
        }
    }
}

#[pymethods]
impl PyQuotaState {
    fn __repr__(&self) -> String {
        let (limit, remaining, reset_at_ms) = (opt(self.limit), opt(self.remaining), opt(self.reset_at_ms));
        let Self { platform, key_id, pool_key, metric, source, confidence, observed_at_ms, .. } = self;
        format!(
            "QuotaState(platform={platform:?}, key_id={key_id}, pool_key={pool_key:?}, metric={metric:?}, limit={limit}, remaining={remaining}, reset_at_ms={reset_at_ms}, source={source:?}, confidence={confidence:?}, observed_at_ms={observed_at_ms})"
        )
    }
}

/// What one probe pass did.
#[pyclass(frozen, eq, get_all, name = "ProbePassResult", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyProbePassResult {
    /// Keys whose validator ran in this pass, in order.
    probed_key_ids: Vec<i64>,
    /// Heuristic cooldowns cleared by passing keys.
    cleared_cooldowns: i64,
}

impl From<ProbePassResult> for PyProbePassResult {
    fn from(r: ProbePassResult) -> Self {
        Self { probed_key_ids: r.probed_key_ids, cleared_cooldowns: r.cleared_cooldowns }
    }
}

#[pymethods]
impl PyProbePassResult {
    fn __repr__(&self) -> String {
        format!(
            "ProbePassResult(probed_key_ids={:?}, cleared_cooldowns={})",
            self.probed_key_ids, self.cleared_cooldowns
        )
    }
}
