//! What callers record and learn: tokens used, the cooldown a limit failure takes,
//! a limit stated in an error body.
use super::args::route;
use super::PyQuotaEngine;
use crate::python::convert::{limits_arg, opt_int_arg, str_arg, token_use_arg};
use crate::python::errors::type_error;
use crate::python::types::{PyCooldownDecision, PyLearnedLimit};
use pyo3::prelude::*;

#[allow(clippy::too_many_arguments)]
pub(super) fn record_tokens(
    this: &PyQuotaEngine,
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
    this.run(py, move |e| e.usage().record_token_use(&r, used))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn cooldown_decision_for_limit(
    this: &PyQuotaEngine,
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
    Ok(PyCooldownDecision(
        this.run(py, move |e| e.failures().cooldown_decision_for_limit(&r, l, ra, quota_signal))?,
    ))
}

pub(super) fn learn_limit_from_error(
    this: &PyQuotaEngine,
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
    Ok(this.run(py, |e| e.failures().learn_limit_from_error(p, m, msg))?.map(PyLearnedLimit))
}
