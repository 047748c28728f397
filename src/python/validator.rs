//! The probe's validator: a Python callable (or coroutine function run on a given
//! event loop), called from the probe thread with the GIL held only for the call.
use crate::core::probe::Validator;
use pyo3::prelude::*;
use pyo3::types::PyString;

pub struct PyValidator {
    func: Py<PyAny>,
    event_loop: Option<Py<PyAny>>,
    /// The engine whose passes call it (`Handle::id`).
    engine: usize,
}

impl PyValidator {
    pub fn new(func: Py<PyAny>, event_loop: Option<Py<PyAny>>, engine: usize) -> Self {
        Self { func, event_loop, engine }
    }

    /// SPEC 18.3: whether the calling code runs inside a coroutine validator of a pass
    /// of `engine` (on its event loop's thread, which the pass waits for).
    pub fn in_coroutine_pass(py: Python<'_>, engine: usize) -> PyResult<bool> {
        let engines: Vec<usize> =
            py.import("quotaengine")?.getattr("_probe_pass_engines")?.call_method0("get")?.extract()?;
        Ok(engines.contains(&engine))
    }

    /// True for `async def` functions (and callables whose `__call__` is one).
    pub fn is_coroutine_function(py: Python<'_>, func: &Bound<'_, PyAny>) -> PyResult<bool> {
        let inspect = py.import("inspect")?;
        if inspect.call_method1("iscoroutinefunction", (func,))?.is_truthy()? {
            return Ok(true);
        }
        match func.getattr("__call__") {
            Ok(call) => inspect.call_method1("iscoroutinefunction", (call,))?.is_truthy(),
            Err(_) => Ok(false),
        }
    }

    fn call(&self, py: Python<'_>, key_id: i64) -> PyResult<bool> {
        let mut value = self.func.bind(py).call1((key_id,))?;
        let inspect = py.import("inspect")?;
        if inspect.call_method1("isawaitable", (&value,))?.is_truthy()? {
            let Some(event_loop) = self.event_loop.as_ref() else {
                // A coroutine without a loop: close it and count a failure.
                let _ = value.call_method0("close");
                return Ok(false);
            };
            // Run inside a context that says which engine's pass it is (SPEC 18.3).
            let guarded =
                py.import("quotaengine")?.getattr("_in_probe_pass")?.call1((&value, self.engine))?;
            let fut =
                py.import("asyncio")?.call_method1("run_coroutine_threadsafe", (&guarded, event_loop))?;
            // Waiting on the future releases the GIL (a threading.Condition wait).
            value = fut.call_method0("result")?;
        }
        if let Ok(b) = value.extract::<bool>() {
            return Ok(b && value.is_instance_of::<pyo3::types::PyBool>());
        }
        if let Ok(s) = value.cast::<PyString>() {
            return Ok(s.to_str()? == "valid");
        }
        Ok(false)
    }
}

impl Validator for PyValidator {
    /// `True` or `"valid"` passes; any other value, an exception, or an interpreter
    /// that is shutting down is a failure.
    fn probe(&self, key_id: i64) -> bool {
        Python::try_attach(|py| match self.call(py, key_id) {
            Ok(v) => v,
            Err(e) => {
                log::debug!(target: "quotaengine::probe", "validator raised for key {key_id}: {e}");
                false
            }
        })
        .unwrap_or(false)
    }
}
