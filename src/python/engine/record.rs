//! What callers record and learn (SPEC §4, §6, §7, §8.2): requests and tokens used,
//! failures and the benches they take, a limit stated in an error body, a
//! provider's quota headers.
use super::args::route;
use super::PyQuotaEngine;
use crate::python::convert::{
    failure_args, headers_arg, int_arg, opt_int_arg, str_arg, tenants_arg, token_use_arg, Arg,
};
use crate::python::errors::type_error;
use crate::python::limits::limits_arg;
use crate::python::types::{PyCooldownDecision, PyFailureOutcome, PyLearnedLimit, PyQuotaObservation};
use pyo3::prelude::*;

#[pymethods]
impl PyQuotaEngine {
    /// SPEC §4: one request; with `tenant=` (SPEC 23.2) it counts for those tenants too.
    #[pyo3(signature = (platform, model_id, key_id, *, tenant=None))]
    fn record_request(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, tenant: Option<&Arg>,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        let t = tenants_arg(tenant)?;
        self.run(py, move |e| e.usage().record_request_for(&r, &t))
    }

    /// SPEC §4/§14.4: one call's tokens: the total, or input and output apart (the
    /// total is then their sum), and the cached part of the input.
    #[pyo3(signature = (platform, model_id, key_id, tokens=None, *, input_tokens=None, output_tokens=None, cached_tokens=None, tenant=None))]
    #[allow(clippy::too_many_arguments)]
    fn record_tokens(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, tokens: Option<&Arg>,
        input_tokens: Option<&Arg>, output_tokens: Option<&Arg>, cached_tokens: Option<&Arg>,
        tenant: Option<&Arg>,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        let used = token_use_arg(tokens, input_tokens, output_tokens, cached_tokens)?.ok_or_else(|| {
            type_error("record_tokens needs tokens, input_tokens, output_tokens or cached_tokens")
        })?;
        let t = tenants_arg(tenant)?;
        self.run(py, move |e| e.usage().record_token_use_for(&r, used, &t))
    }

    /// SPEC §6.1: decides (and counts hits and ladder steps) but sets no cooldown.
    #[pyo3(signature = (platform, model_id, key_id, limits=None, retry_after_ms=None, quota_signal=true))]
    #[allow(clippy::too_many_arguments)]
    fn cooldown_decision_for_limit(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, limits: Option<&Arg>,
        retry_after_ms: Option<&Arg>, quota_signal: bool,
    ) -> PyResult<PyCooldownDecision> {
        let r = route(platform, model_id, key_id)?;
        let l = limits_arg(limits)?;
        let ra = opt_int_arg(retry_after_ms, "retry_after_ms")?;
        Ok(self.run(py, move |e| e.failures().cooldown_decision_for_limit(&r, l, ra, quota_signal))?.into())
    }

    /// SPEC §6.2: one call for any failure; benches the route and learns limits. An
    /// "upstream" failure benches the model on every key of the platform instead (SPEC
    /// 21.1); a pool 429 teaches the account a provider cap (21.2).
    #[pyo3(signature = (platform, model_id, key_id, *, status=None, retry_after=None, message=None, kind=None, limits=None))]
    #[allow(clippy::too_many_arguments)]
    fn record_failure(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, status: Option<&Arg>,
        retry_after: Option<&Arg>, message: Option<&Arg>, kind: Option<&Arg>, limits: Option<&Arg>,
    ) -> PyResult<PyFailureOutcome> {
        let r = route(platform, model_id, key_id)?;
        let mut input = failure_args(status, retry_after, message, kind)?;
        input.limits = limits_arg(limits)?;
        Ok(self.run(py, move |e| e.failures().record_failure(&r, input))?.into())
    }

    /// SPEC §7: writes the model's limit only when it tightens it; returns what changed.
    fn learn_limit_from_error(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, message: Option<&Arg>,
    ) -> PyResult<Option<PyLearnedLimit>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        let msg = match message.filter(|m| !m.is_none()) {
            Some(x) => Some(str_arg(x, "message")?),
            None => None,
        };
        Ok(self.run(py, |e| e.failures().learn_limit_from_error(p, m, msg))?.map(PyLearnedLimit::from))
    }

    /// SPEC §8.2: reads x-ratelimit-*, anthropic-ratelimit-* and retry-after headers
    /// (names case-insensitive); merges them into the quota state.
    #[pyo3(signature = (platform, key_id, headers, *, model_id=None, status=None), text_signature = "(self, platform, key_id, headers, *, model_id=None, status=200)")]
    fn record_quota_headers(
        &self, py: Python<'_>, platform: &Arg, key_id: &Arg, headers: &Arg, model_id: Option<&Arg>,
        status: Option<&Arg>,
    ) -> PyResult<Vec<PyQuotaObservation>> {
        let p = str_arg(platform, "platform")?;
        let k = int_arg(key_id, "key_id")?;
        let m = match model_id.filter(|m| !m.is_none()) {
            Some(m) => Some(str_arg(m, "model_id")?),
            None => None,
        };
        let st = opt_int_arg(status, "status")?.unwrap_or(200);
        let hs = headers_arg(headers)?;
        let obs = self.run(py, |e| e.observed().record_quota_headers(p, k, &hs, m, st))?;
        Ok(obs.into_iter().map(PyQuotaObservation::from).collect())
    }
}
