//! `QuotaEngine`: argument conversion, then the core with the GIL released.
//!
//! The class is declared by topic: each file holds its own `#[pymethods]` block, each
//! method with its docstring and signature: the engine itself, opened and closed
//! (`open`); keys, models, calendars, reserves and provider caps (`config`); the
//! single gates and `check` (`gates`); leases (`leases`); what callers record
//! (`record`); cooldowns (`cooldowns`); the probe (`probe`); what the engine reports
//! (`reports`); tenants (`tenants`); `args` the argument conversions they share. Each goes into the core
//! through a door of `python::run`.
use super::validator::PyValidator;
use crate::core::clock::Clock;
use crate::core::engine::Engine;
use crate::core::error::Result as CoreResult;
use crate::core::handle::Handle;
use pyo3::prelude::*;
use std::sync::Arc;

mod args;
mod config;
mod cooldowns;
mod gates;
mod leases;
mod metrics;
pub(crate) use metrics::metric_families;
mod open;
mod probe;
mod record;
mod reports;
mod tenants;

/// The quota and cooldown engine (SPEC §3). Every method releases the GIL while it
/// works; it is safe to share one engine between threads. `path` is a SQLite file,
/// `":memory:"`, or a Redis URL (`redis://[:password@]host:port/db[?prefix=name]`, `rediss://` with
/// `?ssl_ca_certs=ca.pem` for a private CA; `redis+sentinel://` and `redis+cluster://`, SPEC 19.3).
#[pyclass(frozen, weakref, name = "_QuotaEngine", module = "quotaengine._quotaengine", subclass)]
pub struct PyQuotaEngine {
    handle: Handle,
    clock: Arc<dyn Clock>,
    /// The database path this engine opened.
    #[pyo3(get)]
    path: String,
    #[pyo3(get)]
    readonly: bool,
    /// The validator given to `start_probe` (used by `run_probe_pass(None)`).
    validator: parking_lot::Mutex<Option<Arc<PyValidator>>>,
    probe_disabled: bool,
    probe_max_per_pass: usize,
}

impl Drop for PyQuotaEngine {
    /// An engine dropped without `close()`: stop its threads and write what is
    /// buffered, with the GIL released (the threads may be waiting for it).
    fn drop(&mut self) {
        let handle = self.handle.clone();
        // Nothing to raise to from a destructor; a caught panic is dropped here.
        let _ = Python::attach(|py| py.detach(|| handle.close()));
    }
}

impl PyQuotaEngine {
    /// [`run`](crate::python::run::run) on this engine: `op` on the engine under its
    /// lock, the GIL released.
    fn run<T: Send>(
        &self, py: Python<'_>, op: impl FnOnce(&mut Engine) -> CoreResult<T> + Send,
    ) -> PyResult<T> {
        crate::python::run::run(py, &self.handle, op)
    }
}
