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
                // lease_any: one (platform, model_id, key_id, reason, retry_at_ms, tenant)
                // per candidate; a lease()'s one refusal is the exception's own fields (None).
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
                                c.tenant.clone(),
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
                    r.tenant,
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

/// A `Refusal` as `QuotaExceeded` takes it: (platform, model_id, key_id, reason,
/// retry_at_ms, tenant).
type RefusalTuple = (String, String, i64, String, Option<i64>, Option<String>);

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! The mapping, run against the exception classes of the source tree (with the
    //! `python` feature: `cargo test --lib python::errors`).
    use super::*;
    use crate::core::error::Refusal;
    use crate::core::types::Reason;
    use pyo3::types::PyModule;

    /// Runs `f` with `quotaengine._errors` importable from `python/`, without the
    /// package's `__init__` (which needs the built extension).
    fn with_errors_module(f: impl FnOnce(Python<'_>)) {
        Python::initialize();
        Python::attach(|py| {
            let pkg = PyModule::new(py, "quotaengine").unwrap();
            pkg.setattr("__path__", vec![concat!(env!("CARGO_MANIFEST_DIR"), "/python/quotaengine")])
                .unwrap();
            py.import("sys").unwrap().getattr("modules").unwrap().set_item("quotaengine", pkg).unwrap();
            f(py)
        })
    }

    fn refusal(key_id: i64, retry_at_ms: Option<i64>) -> Refusal {
        Refusal {
            reason: Reason::declared("rpm"),
            retry_at_ms,
            platform: "groq".into(),
            model_id: "m".into(),
            key_id,
            tenant: None,
            scope: None,
            candidates: Vec::new(),
        }
    }

    #[test]
    fn every_core_error_is_its_python_exception() {
        with_errors_module(|py| {
            let cases = [
                (Error::Invalid("bad".into()), "ValueError", "bad"),
                (Error::Overflow("big".into()), "OverflowError", "big"),
                (Error::Runtime("inside".into()), "RuntimeError", "inside"),
                (Error::Closed, "EngineClosed", "engine is closed"),
                (
                    Error::Store(StoreError::ReadOnly),
                    "DatabaseError",
                    "the database was opened with readonly=True; this call writes",
                ),
                (Error::Internal("boom".into()), "QuotaEngineError", "internal error: boom"),
            ];
            for (err, class, message) in cases {
                let e = PyErr::from(err);
                assert_eq!(e.get_type(py).name().unwrap().to_string(), class);
                assert_eq!(e.value(py).str().unwrap().to_string(), message);
            }
        });
    }

    #[test]
    fn a_refusal_is_quota_exceeded_with_its_candidates() {
        with_errors_module(|py| {
            let one = PyErr::from(Error::Refused(Box::new(refusal(1, Some(5)))));
            assert!(one.is_instance_of::<QuotaExceeded>(py));
            let v = one.value(py);
            assert_eq!(v.getattr("reason").unwrap().extract::<String>().unwrap(), "rpm");
            assert_eq!(v.getattr("retry_at_ms").unwrap().extract::<Option<i64>>().unwrap(), Some(5));
            assert_eq!(v.getattr("key_id").unwrap().extract::<i64>().unwrap(), 1);
            assert!(v.getattr("_refusals").unwrap().is_none());
            assert!(v.getattr("tenant").unwrap().is_none());
            // SPEC 23.2: a tenant's refusal names the tenant, on the exception and each Refusal.
            let mut by_tenant = refusal(3, None);
            by_tenant.tenant = Some("team:x".into());
            let v = PyErr::from(Error::Refused(Box::new(by_tenant))).value(py).clone();
            assert_eq!(v.getattr("tenant").unwrap().extract::<String>().unwrap(), "team:x");
            let r = v.getattr("refusals").unwrap().get_item(0).unwrap();
            assert_eq!(r.getattr("tenant").unwrap().extract::<String>().unwrap(), "team:x");

            let any = Refusal::of_candidates(vec![refusal(1, None), refusal(2, Some(9))]).unwrap();
            let v = PyErr::from(Error::Refused(Box::new(any))).value(py).clone();
            assert_eq!(v.getattr("key_id").unwrap().extract::<i64>().unwrap(), 2);
            let all = v.getattr("refusals").unwrap();
            assert_eq!(all.len().unwrap(), 2);
            let first = all.get_item(0).unwrap();
            assert_eq!(first.getattr("key_id").unwrap().extract::<i64>().unwrap(), 1);
            assert!(first.getattr("retry_at_ms").unwrap().is_none());
        });
    }
}
