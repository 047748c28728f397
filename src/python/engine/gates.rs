//! The gates (SPEC §4): each one alone, and `check()` running them all in order.
use super::args::{account, route};
use super::PyQuotaEngine;
use crate::core::admission::Can;
use crate::core::types::Route;
use crate::python::convert::{count_arg, Arg};
use crate::python::limits::limits_arg;
use crate::python::types::PyAdmission;
use pyo3::prelude::*;

impl PyQuotaEngine {
    /// One gate in the core, after the limits argument.
    fn gate(&self, py: Python<'_>, can: Can, route: Route, est: i64, limits: Option<&Arg>) -> PyResult<bool> {
        let limits = limits_arg(limits)?;
        self.run(py, move |e| e.check_gate(can, &route, est, limits))
    }
}

#[pymethods]
impl PyQuotaEngine {
    #[pyo3(signature = (platform, model_id, key_id, limits=None))]
    fn can_make_request(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, limits: Option<&Arg>,
    ) -> PyResult<bool> {
        self.gate(py, Can::Request, route(platform, model_id, key_id)?, 0, limits)
    }

    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens, limits=None))]
    fn can_use_tokens(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, estimated_tokens: &Arg,
        limits: Option<&Arg>,
    ) -> PyResult<bool> {
        let est = count_arg(estimated_tokens, "estimated_tokens")?;
        self.gate(py, Can::Tokens, route(platform, model_id, key_id)?, est, limits)
    }

    fn can_use_provider(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<bool> {
        self.gate(py, Can::ProviderDaily, account(platform, key_id)?, 0, None)
    }

    fn can_use_provider_minute(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<bool> {
        self.gate(py, Can::ProviderMinute, account(platform, key_id)?, 0, None)
    }

    fn can_use_provider_tokens(
        &self, py: Python<'_>, platform: &Arg, key_id: &Arg, model_id: &Arg, estimated_tokens: &Arg,
    ) -> PyResult<bool> {
        let est = count_arg(estimated_tokens, "estimated_tokens")?;
        self.gate(py, Can::ProviderTokens, route(platform, model_id, key_id)?, est, None)
    }

    fn can_use_key_concurrency(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<bool> {
        self.gate(py, Can::KeyConcurrency, account(platform, key_id)?, 0, None)
    }

    fn is_on_cooldown(&self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg) -> PyResult<bool> {
        Ok(!self.gate(py, Can::Cooldown, route(platform, model_id, key_id)?, 0, None)?)
    }

    /// Every gate, in order; the first that fails names the reason (SPEC §4).
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0, limits=None)")]
    fn check(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, estimated_tokens: Option<&Arg>,
        limits: Option<&Arg>,
    ) -> PyResult<PyAdmission> {
        let r = route(platform, model_id, key_id)?;
        let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
        let l = limits_arg(limits)?;
        Ok(self.run(py, move |e| e.check(&r, est, l))?.into())
    }

    /// Benchmark floor, not part of the API: takes `check()`'s arguments and does
    /// nothing (`benches/bench_compare.py` compares `check()` with it).
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None))]
    fn _noop_check(
        &self, platform: &Arg, model_id: &Arg, key_id: &Arg, estimated_tokens: Option<&Arg>,
        limits: Option<&Arg>,
    ) {
        let _ = (platform, model_id, key_id, estimated_tokens, limits);
    }
}
