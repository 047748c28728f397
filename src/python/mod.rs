//! The Python binding: the only code that uses pyo3. Thin by design: convert
//! arguments, release the GIL, call the core, convert results.
mod convert;
mod engine;
mod errors;
mod lease;
mod types;

use pyo3::prelude::*;

#[pymodule]
mod _quotaengine {
    use super::*;

    #[pymodule_export]
    use super::engine::PyQuotaEngine;
    #[pymodule_export]
    use super::lease::{PyLease, PyReady};
    #[pymodule_export]
    use super::types::{PyAdmission, PyCooldown, PyLimits, PyManualClock, PyProviderCaps};

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        // Rust `log` records -> Python `logging` under "quotaengine.*" (SPEC §12).
        let _ = pyo3_log::try_init();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        Ok(())
    }

    /// The version of the SQLite library the engine runs on; equals `sqlite3.sqlite_version`.
    #[pyfunction]
    fn sqlite_version() -> &'static str {
        crate::core::store::sqlite::sqlite_version()
    }
}
