//! Opening an engine (SPEC §3): the environment, the path, the clock, the settings.
use super::PyQuotaEngine;
use crate::core::clock::{Clock, SystemClock};
use crate::core::engine::{Settings, StoreSpec};
use crate::core::env::Env;
use crate::core::handle::Handle;
use crate::python::convert::count_arg;
use crate::python::errors::to_pyerr;
use crate::python::types::PyManualClock;
use pyo3::prelude::*;
use pyo3::types::PyMapping;
use std::collections::HashMap;
use std::sync::Arc;

#[allow(clippy::too_many_arguments)]
pub(super) fn new(
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
) -> PyResult<PyQuotaEngine> {
    // A panic anywhere in here (conversions, opening the store) is an exception.
    crate::python::errors::shield(|| {
        // The environment is read once, here: a mapping replaces os.environ.
        let env_obj = match env {
            Some(e) if !e.is_none() => e.clone(),
            _ => py.import("os")?.getattr("environ")?,
        };
        let mapping = env_obj
            .cast::<PyMapping>()
            .map_err(|_| crate::python::errors::type_error("env must be a mapping"))?;
        let mut vars = HashMap::new();
        for item in mapping.items()?.iter() {
            let (k, v): (String, String) = item
                .extract()
                .map_err(|_| crate::python::errors::type_error("env keys and values must be str"))?;
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
                    crate::python::errors::type_error("clock must be a quotaengine.ManualClock or None")
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
