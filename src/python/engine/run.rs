//! The single way into the core (`run`: the GIL released, the engine locked, errors
//! and panics as Python exceptions) and the two helpers built on it.
use super::PyQuotaEngine;
use crate::core::admission::Can;
use crate::core::engine::Engine;
use crate::core::error::Result as CoreResult;
use crate::core::types::Route;
use crate::python::convert::{limits_arg, opt_int_arg, str_arg};
use crate::python::errors::to_pyerr;
use pyo3::prelude::*;

impl PyQuotaEngine {
    /// The single way into the core: drop the GIL, lock, run; panics and errors come
    /// back as Python exceptions.
    pub(super) fn run<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&mut Engine) -> CoreResult<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.handle.with(op)).map_err(to_pyerr)
    }

    /// The `can_*` gates: the limits argument, then one gate in the core.
    pub(super) fn gate(
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
    pub(super) fn day_bound(
        &self,
        py: Python<'_>,
        platform: &Bound<'_, PyAny>,
        at_ms: Option<&Bound<'_, PyAny>>,
        bound: fn(&mut Engine, &str, Option<i64>) -> CoreResult<i64>,
    ) -> PyResult<i64> {
        let (p, at) = (str_arg(platform, "platform")?, opt_int_arg(at_ms, "at_ms")?);
        self.run(py, |e| bound(e, p, at))
    }
}
