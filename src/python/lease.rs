//! `Lease`: one admitted request, a sync and async context manager.
use super::convert::{failure_args, headers_arg, token_use_arg, Arg};
use super::run::{run, run_batch};
use super::types::PyFailureOutcome;
use crate::core::admission::Estimate;
use crate::core::engine::{BatchOp, BatchOut, FailureInput, TokenUse};
use crate::core::handle::Handle;
use crate::core::tenants::TenantList;
use crate::core::types::Route;
use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// An in-flight request. Leaving a `with` block normally records its estimate as used
/// (`estimated_tokens`, split into input and output as estimated) unless an outcome was
/// already given; leaving it
/// by an exception records nothing. The lease is released either way. The engine's
/// `close()` ends a live lease the same way; one garbage-collected unended keeps
/// counting until `lease_max_age_ms`.
#[pyclass(frozen, name = "Lease", module = "quotaengine")]
pub struct PyLease {
    pub handle: Handle,
    /// The engine generation that took it: after a fork, the child's engine is a new
    /// one, and a lease taken before belongs to the parent (which finishes it).
    pub epoch: u64,
    #[pyo3(get)]
    pub id: i64,
    pub route: Route,
    /// The estimate it was admitted with (its total is `estimated_tokens`).
    pub estimate: Estimate,
    /// The tenants it was taken for (SPEC 23.2): its outcome counts for them.
    pub tenants: TenantList,
    pub done: AtomicBool,
}

impl Drop for PyLease {
    /// SPEC 18.5: a live lease whose object is garbage-collected keeps counting until
    /// `lease_max_age_ms` (its call may still run), and the engine's `close()` does not
    /// end it. The engine is reached with the GIL released.
    fn drop(&mut self) {
        if self.done.load(Ordering::SeqCst) || self.epoch != self.handle.epoch() {
            return;
        }
        let (handle, id) = (self.handle.clone(), self.id);
        let _ = Python::try_attach(|py| py.detach(|| handle.forget_lease(id)));
    }
}

impl PyLease {
    /// A new lease object for lease `id` on `route`.
    pub fn create(
        py: Python<'_>, handle: &Handle, id: i64, route: Route, est: Estimate, tenants: TenantList,
    ) -> PyResult<Py<PyLease>> {
        Py::new(
            py,
            PyLease {
                handle: handle.clone(),
                epoch: handle.epoch(),
                id,
                route,
                estimate: est,
                tenants,
                done: AtomicBool::new(false),
            },
        )
    }

    /// Marks the lease finished; false when it already was, or when it is a lease of
    /// the parent process's engine seen in a forked child (nothing to record here).
    fn take(&self) -> bool {
        !self.done.swap(true, Ordering::SeqCst) && self.epoch == self.handle.epoch()
    }

    /// What failed to end the lease leaves it live (its outcome may be given again).
    fn unless_failed<T>(&self, r: PyResult<T>) -> PyResult<T> {
        r.inspect_err(|_| self.done.store(false, Ordering::SeqCst))
    }

    /// Ends the lease with a failure (once; a lease ended already returns None).
    fn finish_failure(&self, py: Python<'_>, input: FailureInput) -> PyResult<Option<PyFailureOutcome>> {
        if !self.take() {
            return Ok(None);
        }
        let (id, route) = (self.id, &self.route);
        let out = self.unless_failed(run(py, &self.handle, |e| e.finish_lease_failure(id, route, input)))?;
        Ok(Some(out.into()))
    }

    fn finish_success(&self, py: Python<'_>, tokens: Option<TokenUse>) -> PyResult<()> {
        if !self.take() {
            return Ok(());
        }
        let op = BatchOp::Success {
            lease_id: self.id,
            route: self.route.clone(),
            tokens,
            tenants: self.tenants.clone(),
        };
        self.unless_failed(run_batch(py, &self.handle, op, BatchOut::done))
    }

    fn finish_release(&self, py: Python<'_>) -> PyResult<()> {
        if !self.take() {
            return Ok(());
        }
        self.unless_failed(run_batch(py, &self.handle, BatchOp::Release(self.id), BatchOut::done))
    }

    fn exit(&self, py: Python<'_>, exc_type: &Arg) -> PyResult<()> {
        if exc_type.is_none() {
            self.finish_success(py, Some(TokenUse::estimate(self.estimate)))
        } else {
            self.finish_release(py)
        }
    }
}

#[pymethods]
impl PyLease {
    #[getter]
    fn estimated_tokens(&self) -> i64 {
        self.estimate.tokens
    }

    #[getter]
    fn platform(&self) -> &str {
        &self.route.platform
    }
    #[getter]
    fn model_id(&self) -> &str {
        &self.route.model_id
    }
    #[getter]
    fn key_id(&self) -> i64 {
        self.route.key_id
    }
    /// True once an outcome was recorded or the lease was released.
    #[getter]
    fn done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Records the request (and its tokens, when given: the total, or input and output
    /// apart, and the cached part of the input; SPEC §14.4) and releases the lease, in
    /// one commit.
    #[pyo3(signature = (tokens=None, *, input_tokens=None, output_tokens=None, cached_tokens=None))]
    fn success(
        &self, py: Python<'_>, tokens: Option<&Arg>, input_tokens: Option<&Arg>, output_tokens: Option<&Arg>,
        cached_tokens: Option<&Arg>,
    ) -> PyResult<()> {
        let used = token_use_arg(tokens, input_tokens, output_tokens, cached_tokens)?;
        self.finish_success(py, used)
    }

    /// `success()` with the estimate it was admitted with, split into input and output
    /// as estimated, so that it costs exactly what it reserved (SPEC 23.1: what
    /// `observe` records of a call that reported no usage).
    fn _success_estimate(&self, py: Python<'_>) -> PyResult<()> {
        self.finish_success(py, Some(TokenUse::estimate(self.estimate)))
    }

    /// `record_failure(...)` for this lease's route, then release. Returns the outcome
    /// (None when the lease was already finished).
    #[pyo3(signature = (*, status=None, retry_after=None, message=None, kind=None))]
    fn failure(
        &self, py: Python<'_>, status: Option<&Arg>, retry_after: Option<&Arg>, message: Option<&Arg>,
        kind: Option<&Arg>,
    ) -> PyResult<Option<PyFailureOutcome>> {
        let input = failure_args(status, retry_after, message, kind)?;
        self.finish_failure(py, input)
    }

    /// SPEC 16: tells the engine what came back and ends the lease, from an HTTP
    /// response, an SDK's exception, or a completion with `usage` (duck-typed; see
    /// `quotaengine._observe`). Returns the `FailureOutcome` of a failure, None on
    /// success. Anything else is a TypeError, and the lease stays live.
    #[pyo3(signature = (outcome, *, tokens=None))]
    fn observe(slf: &Bound<'_, Self>, outcome: &Arg, tokens: Option<&Arg>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let observe = py.import("quotaengine._observe")?.getattr("observe")?;
        let tokens = tokens.map_or_else(|| py.None(), |t| t.clone().unbind());
        Ok(observe.call1((slf, outcome, tokens))?.unbind())
    }

    /// `record_quota_headers` for this lease's route, then `failure(...)` with the
    /// response's headers at hand (a pool 429's cap may sit there, SPEC 21.2): what
    /// `observe` does with a failed response.
    #[pyo3(signature = (headers, *, status, retry_after=None, message=None))]
    fn _failure_with_headers(
        &self, py: Python<'_>, headers: &Arg, status: i64, retry_after: Option<&Arg>, message: Option<&Arg>,
    ) -> PyResult<Option<PyFailureOutcome>> {
        let hs = headers_arg(headers)?;
        let status_obj = status.into_pyobject(py)?.into_any();
        let mut input = failure_args(Some(&status_obj), retry_after, message, None)?;
        self._record_quota_headers(py, headers, status)?;
        input.headers = hs;
        self.finish_failure(py, input)
    }

    /// `record_quota_headers` for this lease's route (what `observe` does with a
    /// response's headers).
    fn _record_quota_headers(&self, py: Python<'_>, headers: &Arg, status: i64) -> PyResult<()> {
        let hs = headers_arg(headers)?;
        let r = &self.route;
        run(py, &self.handle, |e| {
            e.observed()
                .record_quota_headers(&r.platform, r.key_id, &hs, Some(&r.model_id), status)
                .map(|_| ())
        })
    }

    /// Releases the lease without recording anything. Idempotent.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        self.finish_release(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self, py: Python<'_>, exc_type: Option<&Arg>, _exc: Option<&Arg>, _tb: Option<&Arg>,
    ) -> PyResult<bool> {
        match exc_type {
            Some(t) => self.exit(py, t)?,
            None => self.finish_success(py, Some(TokenUse::estimate(self.estimate)))?,
        }
        Ok(false)
    }

    fn __aenter__(slf: Py<Self>, py: Python<'_>) -> PyReady {
        PyReady(Some(slf.into_any()).map(|o| o.clone_ref(py)))
    }

    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __aexit__(
        &self, py: Python<'_>, exc_type: Option<&Arg>, _exc: Option<&Arg>, _tb: Option<&Arg>,
    ) -> PyResult<PyReady> {
        self.__exit__(py, exc_type, None, None)?;
        Ok(PyReady(Some(false.into_pyobject(py)?.to_owned().into_any().unbind())))
    }

    fn __repr__(&self) -> String {
        format!(
            "Lease(id={}, platform={:?}, model_id={:?}, key_id={}, estimated_tokens={}, done={})",
            self.id,
            self.route.platform,
            self.route.model_id,
            self.route.key_id,
            self.estimate.tokens,
            if self.done.load(Ordering::SeqCst) { "True" } else { "False" }
        )
    }
}

/// An awaitable that is already complete (the lease's work is synchronous and short).
#[pyclass(frozen, name = "_Ready", module = "quotaengine")]
pub struct PyReady(pub Option<Py<PyAny>>);

#[pymethods]
impl PyReady {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __next__(&self, py: Python<'_>) -> PyResult<()> {
        let value = self.0.as_ref().map_or_else(|| py.None(), |v| v.clone_ref(py));
        Err(PyStopIteration::new_err((value,)))
    }
}
