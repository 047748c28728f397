//! The recovery probe (SPEC §11): starting and stopping its thread, running a pass.
use super::PyQuotaEngine;
use crate::core::handle::{default_jitter, in_probe_pass, pass_running, Handle};
use crate::python::convert::{count_arg, duration_arg, Arg};
use crate::python::errors::type_error;
use crate::python::run::on_handle;
use crate::python::types::PyProbePassResult;
use crate::python::validator::PyValidator;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::Duration;

impl PyQuotaEngine {
    /// `max_per_pass` / `max_probes`: a count, or (None) the engine's setting.
    fn max_probes(&self, v: Option<&Arg>, name: &str) -> PyResult<usize> {
        match v.filter(|v| !v.is_none()) {
            Some(v) => Ok(usize::try_from(count_arg(v, name)?).unwrap_or(usize::MAX)),
            None => Ok(self.probe_max_per_pass),
        }
    }
}

#[pymethods]
impl PyQuotaEngine {
    /// Starts the background probe thread; True when it runs (a second call starts
    /// nothing and returns True); False with COOLDOWN_PROBE_DISABLED=1. A coroutine
    /// validator needs `loop` (ValueError otherwise).
    #[pyo3(signature = (validator, *, interval_s=None, max_per_pass=None, r#loop=None), text_signature = "(self, validator, *, interval_s=60.0, max_per_pass=None, loop=None)")]
    fn start_probe(
        &self, py: Python<'_>, validator: &Arg, interval_s: Option<&Arg>, max_per_pass: Option<&Arg>,
        r#loop: Option<&Arg>,
    ) -> PyResult<bool> {
        if !validator.is_callable() {
            return Err(type_error("validator must be callable"));
        }
        let interval = match interval_s.filter(|v| !v.is_none()) {
            Some(v) => duration_arg(v, "interval_s")?,
            None => Duration::from_secs(60),
        };
        let max = self.max_probes(max_per_pass, "max_per_pass")?;
        let event_loop = r#loop.filter(|l| !l.is_none()).map(|l| l.clone().unbind());
        if event_loop.is_none() && PyValidator::is_coroutine_function(py, validator)? {
            return Err(PyValueError::new_err(
                "a coroutine validator needs loop= (the event loop to run it on)",
            ));
        }
        let v = Arc::new(PyValidator::new(validator.clone().unbind(), event_loop, self.handle.id()));
        *self.validator.lock() = Some(v.clone());
        if self.probe_disabled {
            return Ok(false);
        }
        let period = interval.max(Duration::from_millis(1));
        on_handle(py, &self.handle, |h| {
            // A second call starts nothing.
            if !h.probe_running()? {
                h.start_probe(v, period, max)?;
            }
            Ok(true)
        })
    }

    /// Stops the background probe; returns promptly, also while a validator runs.
    fn stop_probe(&self, py: Python<'_>) -> PyResult<()> {
        on_handle(py, &self.handle, Handle::stop_probe)
    }

    /// One probe pass in the calling thread (SPEC §11). `validator=None` uses the one
    /// given to `start_probe` (ValueError when there is none); `jitter()` returns a
    /// number in [0, 1) for first-sighting schedules. From inside a pass of this engine
    /// (its validator, or what that calls): RuntimeError (SPEC 18.3).
    #[pyo3(signature = (validator=None, *, jitter=None, max_probes=None))]
    fn run_probe_pass(
        &self, py: Python<'_>, validator: Option<&Arg>, jitter: Option<&Arg>, max_probes: Option<&Arg>,
    ) -> PyResult<PyProbePassResult> {
        // SPEC 18.3: from inside a pass (its validator, or what that calls) this would
        // wait for itself. The core sees a pass on this thread; a coroutine validator runs
        // on its loop's thread, in a context that names the engine.
        let id = self.handle.id();
        if in_probe_pass(id) || PyValidator::in_coroutine_pass(py, id)? {
            return Err(pass_running().into());
        }
        let v: Arc<PyValidator> =
            match validator.filter(|v| !v.is_none()) {
                Some(f) => {
                    if !f.is_callable() {
                        return Err(type_error("validator must be callable"));
                    }
                    Arc::new(PyValidator::new(f.clone().unbind(), None, id))
                }
                None => self.validator.lock().clone().ok_or_else(|| {
                    PyValueError::new_err("no validator: pass one or call start_probe first")
                })?,
            };
        let max = self.max_probes(max_probes, "max_probes")?;
        let jitter_fn: Option<Py<PyAny>> = jitter.filter(|j| !j.is_none()).map(|j| j.clone().unbind());
        let mut jit = move || -> f64 {
            match &jitter_fn {
                Some(f) => {
                    Python::attach(|py| f.bind(py).call0().and_then(|v| v.extract::<f64>()).unwrap_or(0.0))
                }
                None => default_jitter(),
            }
        };
        Ok(on_handle(py, &self.handle, |h| h.run_probe_pass(&*v, &mut jit, max))?.into())
    }
}
