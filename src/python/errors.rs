//! The one place that maps core errors to Python exceptions: `From<Error> for PyErr`,
//! so a core `Result` meets a `PyResult` with `?`.
use crate::core::error::{Error, StoreError};
use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

// The exception classes live in Python (quotaengine/_errors.py) so they can carry
// attributes and be pickled; Rust raises them by import.
pyo3::import_exception!(quotaengine._errors, QuotaEngineError);
pyo3::import_exception!(quotaengine._errors, QuotaExceeded);
pyo3::import_exception!(quotaengine._errors, DatabaseError);
pyo3::import_exception!(quotaengine._errors, EngineClosed);

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        match err {
            Error::Invalid(msg) => PyValueError::new_err(msg),
            Error::Overflow(msg) => PyOverflowError::new_err(msg),
            Error::Runtime(msg) => PyRuntimeError::new_err(msg),
            // must match _errors.QuotaExceeded.__init__ argument order
            Error::Refused(r) => {
                // lease_any: one (platform, model_id, key_id, reason, retry_at_ms) per
                // candidate; a lease()'s one refusal is the exception's own fields (None).
                let all: Option<Vec<RefusalTuple>> = (!r.candidates.is_empty()).then(|| {
                    r.candidates
                        .iter()
                        .map(|c| {
                            (
                                c.platform.clone(),
                                c.model_id.clone(),
                                c.key_id,
                                c.reason.as_str().to_string(),
                                c.retry_at_ms,
                            )
                        })
                        .collect()
                });
                QuotaExceeded::new_err((
                    r.reason.as_str().to_string(),
                    r.retry_at_ms,
                    r.platform,
                    r.model_id,
                    r.key_id,
                    all,
                ))
            }
            Error::Closed => EngineClosed::new_err("engine is closed"),
            Error::Store(StoreError::ReadOnly) => {
                DatabaseError::new_err("the database was opened with readonly=True; this call writes")
            }
            Error::Store(e) => DatabaseError::new_err(e.to_string()),
            Error::Internal(msg) => QuotaEngineError::new_err(format!("internal error: {msg}")),
        }
    }
}

/// A `Refusal` as `QuotaExceeded` takes it: (platform, model_id, key_id, reason, retry_at_ms).
type RefusalTuple = (String, String, i64, String, Option<i64>);

/// Runs binding code outside the engine's own boundary (a constructor, a value type, a
/// module function, a wait's stepper): a Rust panic inside comes back as
/// `QuotaEngineError`, never as `PanicException` (SPEC 18.1).
pub fn shield<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(Error::from_panic(p).into()))
}

pub fn type_error(msg: impl Into<String>) -> PyErr {
    PyTypeError::new_err(msg.into())
}

pub fn overflow_error(msg: impl Into<String>) -> PyErr {
    PyOverflowError::new_err(msg.into())
}
