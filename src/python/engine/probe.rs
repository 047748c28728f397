//! The recovery probe (SPEC §9): starting it and running a pass.
use super::PyQuotaEngine;
use crate::python::convert::{count_arg, duration_arg};
use crate::python::errors::to_pyerr;
use crate::python::validator::PyValidator;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::Duration;

pub(super) fn start_probe(
    this: &PyQuotaEngine,
    py: Python<'_>,
    validator: &Bound<'_, PyAny>,
    interval_s: Option<&Bound<'_, PyAny>>,
    max_per_pass: Option<&Bound<'_, PyAny>>,
    r#loop: Option<&Bound<'_, PyAny>>,
) -> PyResult<bool> {
    if !validator.is_callable() {
        return Err(crate::python::errors::type_error("validator must be callable"));
    }
    let interval = match interval_s.filter(|v| !v.is_none()) {
        Some(v) => duration_arg(v, "interval_s")?,
        None => Duration::from_secs(60),
    };
    let max = match max_per_pass.filter(|v| !v.is_none()) {
        Some(v) => usize::try_from(count_arg(v, "max_per_pass")?).unwrap_or(usize::MAX),
        None => this.probe_max_per_pass,
    };
    let event_loop = r#loop.filter(|l| !l.is_none()).map(|l| l.clone().unbind());
    if event_loop.is_none() && PyValidator::is_coroutine_function(py, validator)? {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "a coroutine validator needs loop= (the event loop to run it on)",
        ));
    }
    let v = Arc::new(PyValidator::new(validator.clone().unbind(), event_loop, this.handle.id()));
    *this.validator.lock() = Some(v.clone());
    if this.probe_disabled {
        return Ok(false);
    }
    if py.detach(|| this.handle.probe_running()).map_err(to_pyerr)? {
        return Ok(true);
    }
    let period = interval.max(Duration::from_millis(1));
    py.detach(|| this.handle.start_probe(v, period, max)).map_err(to_pyerr)?;
    Ok(true)
}

pub(super) fn run_probe_pass(
    this: &PyQuotaEngine,
    py: Python<'_>,
    validator: Option<&Bound<'_, PyAny>>,
    jitter: Option<&Bound<'_, PyAny>>,
    max_probes: Option<&Bound<'_, PyAny>>,
) -> PyResult<crate::python::types::PyProbePassResult> {
    // SPEC 18.3: from inside a pass (its validator, or what that calls) this would
    // wait for itself. The core sees a pass on this thread; a coroutine validator runs
    // on its loop's thread, in a context that names the engine.
    let id = this.handle.id();
    if crate::core::handle::in_probe_pass(id) || PyValidator::in_coroutine_pass(py, id)? {
        return Err(to_pyerr(crate::core::handle::pass_running()));
    }
    let v: Arc<PyValidator> = match validator.filter(|v| !v.is_none()) {
        Some(f) => {
            if !f.is_callable() {
                return Err(crate::python::errors::type_error("validator must be callable"));
            }
            Arc::new(PyValidator::new(f.clone().unbind(), None, this.handle.id()))
        }
        None => this.validator.lock().clone().ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err("no validator: pass one or call start_probe first")
        })?,
    };
    let max = match max_probes.filter(|v| !v.is_none()) {
        Some(m) => usize::try_from(count_arg(m, "max_probes")?).unwrap_or(usize::MAX),
        None => this.probe_max_per_pass,
    };
    let jitter_fn: Option<Py<PyAny>> = jitter.filter(|j| !j.is_none()).map(|j| j.clone().unbind());
    let out = py.detach(|| {
        let mut jit = || -> f64 {
            match &jitter_fn {
                Some(f) => {
                    Python::attach(|py| f.bind(py).call0().and_then(|v| v.extract::<f64>()).unwrap_or(0.0))
                }
                None => crate::core::handle::default_jitter(),
            }
        };
        this.handle.run_probe_pass(&*v, &mut jit, max)
    });
    Ok(crate::python::types::PyProbePassResult(out.map_err(to_pyerr)?))
}
