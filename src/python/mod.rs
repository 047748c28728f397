//! The Python binding: the only code that uses pyo3. Thin by design: convert
//! arguments, release the GIL, call the core, convert results.
mod convert;
mod engine;
mod errors;
mod lease;
mod limits;
mod money;
mod providers;
mod run;
mod types;
mod validator;
mod wait;

use pyo3::prelude::*;

#[pymodule]
mod _quotaengine {
    use super::convert::Arg;
    use super::errors::shield;
    use super::*;

    #[pymodule_export]
    use super::engine::PyQuotaEngine;
    #[pymodule_export]
    use super::lease::{PyLease, PyReady};
    #[pymodule_export]
    use super::limits::{PyLimit, PyLimits, PyProviderCaps};
    #[pymodule_export]
    use super::money::PyPrices;
    #[pymodule_export]
    use super::providers::provider_hosts;
    #[pymodule_export]
    use super::types::{
        PyAdmission, PyCooldown, PyCooldownDecision, PyFailureOutcome, PyLearnedLimit, PyManualClock,
        PyProbePassResult, PyQuotaObservation, PyQuotaState,
    };
    #[pymodule_export]
    use super::wait::PyLeaseWaiter;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        // Rust `log` records -> Python `logging` under "quotaengine.*" (SPEC §12).
        // Cache the logger objects but not their levels, so that a level set after
        // the engine first logged still takes effect.
        if let Ok(logger) = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::Loggers) {
            let _ = logger.install();
        }
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        // Whether SQLite is compiled into this extension (cargo feature `bundled-sqlite`,
        // the Windows wheel) rather than the library Python's sqlite3 uses (SPEC 26).
        m.add("_sqlite_compiled_in", cfg!(feature = "bundled-sqlite"))?;
        // SPEC 27.2's families, for `quotaengine.metrics` (one table, in the core), and
        // the Content-Type of `QuotaEngine._metrics_text()`.
        m.add("_metric_families", super::engine::metric_families())?;
        m.add("_metrics_content_type", crate::core::metrics::CONTENT_TYPE)?;
        Ok(())
    }

    /// SPEC §6.2: delta-seconds or an HTTP-date -> ms (clamped to 24 h); None if unparsable.
    #[pyfunction]
    #[pyo3(signature = (value, now_ms=None))]
    fn parse_retry_after_ms(value: Option<&str>, now_ms: Option<&Arg>) -> PyResult<Option<i64>> {
        use crate::core::clock::Clock;
        let now = match now_ms {
            Some(n) if !n.is_none() => super::convert::int_arg(n, "now_ms")?,
            _ => crate::core::clock::SystemClock.now_ms(),
        };
        shield(|| Ok(crate::core::parse::parse_retry_after_ms(value, now)))
    }

    /// SPEC §6.2: a delay stated in an error body ("try again in 7.66s", retryDelay "17s").
    #[pyfunction]
    #[pyo3(signature = (message))]
    fn parse_stated_retry_ms(message: Option<&str>) -> PyResult<Option<i64>> {
        shield(|| Ok(crate::core::parse::parse_stated_retry_ms(message)))
    }

    /// SPEC §7: "limit N" plus a confident axis, else None.
    #[pyfunction]
    #[pyo3(signature = (message))]
    fn parse_provider_limit(message: Option<&str>) -> PyResult<Option<PyLearnedLimit>> {
        shield(|| Ok(crate::core::parse::parse_provider_limit(message).map(PyLearnedLimit::from)))
    }

    /// SPEC §8.1: the quota pool a (platform, model) draws from (case-sensitive, 18.6).
    #[pyfunction]
    #[pyo3(signature = (platform, model_id=None))]
    fn infer_quota_pool_key(platform: &str, model_id: Option<&str>) -> PyResult<String> {
        crate::core::types::check_name("platform", platform)?;
        shield(|| Ok(crate::core::pools::infer_quota_pool_key(platform, model_id)))
    }

    /// SPEC §8.1: true for platforms whose keys share one account-wide pool.
    #[pyfunction]
    fn is_shared_pool(platform: &str) -> PyResult<bool> {
        crate::core::types::check_name("platform", platform)?;
        shield(|| Ok(crate::core::pools::is_shared_pool(platform)))
    }

    /// Fork hook (`os.register_at_fork(before=...)`): brings every engine to rest.
    #[pyfunction]
    fn _before_fork(py: Python<'_>) {
        py.detach(crate::core::fork::before_fork);
    }

    /// Fork hook (`after_in_parent`): every engine goes on.
    #[pyfunction]
    fn _after_fork_in_parent(py: Python<'_>) {
        py.detach(crate::core::fork::after_fork_in_parent);
    }

    /// Fork hook (`after_in_child`): every inherited engine lets go of the parent's
    /// connection and threads and opens its store anew at its next call.
    #[pyfunction]
    fn _after_fork_in_child(py: Python<'_>) {
        py.detach(crate::core::fork::after_fork_in_child);
    }

    /// The version of the SQLite library the engine runs on; equals `sqlite3.sqlite_version`.
    #[pyfunction]
    fn sqlite_version() -> &'static str {
        crate::core::store::sqlite::sqlite_version()
    }
}
