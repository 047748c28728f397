//! The engine itself (SPEC §3): opening it (the environment, the path, the clock, the
//! settings), its state, closing it, and the test hooks.
use super::PyQuotaEngine;
use crate::core::clock::{Clock, SystemClock};
use crate::core::engine::{Settings, StoreSpec};
use crate::core::env::Env;
use crate::core::handle::Handle;
use crate::python::convert::{count_arg, Arg};
use crate::python::errors::{shield, type_error};
use crate::python::run::{on_handle, open};
use crate::python::types::PyManualClock;
use pyo3::prelude::*;
use pyo3::types::{PyMapping, PyTuple};
use std::collections::HashMap;
use std::sync::Arc;

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
        py: Python<'_>, path: Option<&Arg>, clock: Option<&Arg>, env: Option<&Arg>,
        retention_ms: Option<&Arg>, lease_max_age_ms: Option<&Arg>, window_usage_ttl_ms: Option<&Arg>,
        busy_timeout_ms: Option<&Arg>, flush_interval_ms: Option<&Arg>, readonly: bool,
    ) -> PyResult<Self> {
        // A panic anywhere in here (conversions, opening the store) is an exception.
        shield(|| {
            // The environment is read once, here: a mapping replaces os.environ.
            let env_obj = match env {
                Some(e) if !e.is_none() => e.clone(),
                _ => py.import("os")?.getattr("environ")?,
            };
            let mapping = env_obj.cast::<PyMapping>().map_err(|_| type_error("env must be a mapping"))?;
            let mut vars = HashMap::new();
            for item in mapping.items()?.iter() {
                let (k, v): (String, String) =
                    item.extract().map_err(|_| type_error("env keys and values must be str"))?;
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
                    let c = c
                        .cast::<PyManualClock>()
                        .map_err(|_| type_error("clock must be a quotaengine.ManualClock or None"))?;
                    c.get().0.clone()
                }
                _ => Arc::new(SystemClock),
            };
            let d = Settings::default();
            let ms = |v: Option<&Arg>, name: &str, default: i64| match v {
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
            let handle = open(py, StoreSpec::from_path(&path), clock.clone(), settings)?;
            Ok(PyQuotaEngine {
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
        on_handle(py, &self.handle, Handle::close)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("QuotaEngine({:?}{})", self.path, if self.readonly { ", readonly=True" } else { "" })
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
