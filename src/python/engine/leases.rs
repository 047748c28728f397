//! Leases (SPEC §5, 17.2): admission at once or waiting, and the lease objects.
use super::args::{lease_any_op, lease_op, route};
use super::PyQuotaEngine;
use crate::core::admission::Estimate;
use crate::core::engine::BatchOp;
use crate::core::types::Route;
use crate::core::wait::Waiter;
use crate::python::convert::count_arg;
use crate::python::errors::to_pyerr;
use crate::python::lease::PyLease;
use crate::python::wait::{wait_blocking, PyLeaseWaiter};
use pyo3::prelude::*;
use std::time::Duration;

impl PyQuotaEngine {
    pub(super) fn make_lease(
        &self,
        py: Python<'_>,
        id: i64,
        route: Route,
        est: i64,
    ) -> PyResult<Py<PyLease>> {
        PyLease::create(py, &self.handle, id, route, est)
    }

    /// An admission: at once (`wait` zero), or waiting for capacity (SPEC 17.2).
    pub(super) fn admit(&self, py: Python<'_>, op: BatchOp, wait: Duration) -> PyResult<(i64, usize)> {
        if wait.is_zero() {
            return py.detach(|| self.handle.batch(op).chosen()).map_err(to_pyerr);
        }
        let waiter = Waiter::new(&self.handle, op, wait);
        wait_blocking(py, waiter)
    }

    /// A waiter object for `_lease_waiter` / `_lease_any_waiter` (SPEC 17.2).
    pub(super) fn waiter(&self, op: BatchOp, routes: Vec<Route>, est: i64, wait: Duration) -> PyLeaseWaiter {
        PyLeaseWaiter {
            waiter: std::sync::Mutex::new(Some(Waiter::new(&self.handle, op, wait))),
            handle: self.handle.clone(),
            routes,
            estimated_tokens: est,
        }
    }
}

pub(super) fn acquire_lease(
    this: &PyQuotaEngine,
    py: Python<'_>,
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<i64> {
    let r = route(platform, model_id, key_id)?;
    let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
    let op = BatchOp::Lease { route: r, est: Estimate::tokens(est), limits: None, check: false, priority: 0 };
    py.detach(|| this.handle.batch(op).lease_id()).map_err(to_pyerr)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn lease(
    this: &PyQuotaEngine,
    py: Python<'_>,
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
    limits: Option<&Bound<'_, PyAny>>,
    estimated_output_tokens: Option<&Bound<'_, PyAny>>,
    wait_s: Option<&Bound<'_, PyAny>>,
    priority: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyLease>> {
    let (op, r, est, wait) = lease_op(
        platform,
        model_id,
        key_id,
        estimated_tokens,
        limits,
        estimated_output_tokens,
        wait_s,
        priority,
    )?;
    let (id, _) = this.admit(py, op, wait)?;
    this.make_lease(py, id, r, est)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn lease_any(
    this: &PyQuotaEngine,
    py: Python<'_>,
    routes: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
    estimated_output_tokens: Option<&Bound<'_, PyAny>>,
    strategy: Option<&Bound<'_, PyAny>>,
    wait_s: Option<&Bound<'_, PyAny>>,
    priority: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyLease>> {
    let (op, rs, est, wait) =
        lease_any_op(routes, estimated_tokens, estimated_output_tokens, strategy, wait_s, priority)?;
    let (id, i) = this.admit(py, op, wait)?;
    this.make_lease(py, id, rs[i].clone(), est)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn lease_waiter(
    this: &PyQuotaEngine,
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
    limits: Option<&Bound<'_, PyAny>>,
    estimated_output_tokens: Option<&Bound<'_, PyAny>>,
    wait_s: Option<&Bound<'_, PyAny>>,
    priority: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyLeaseWaiter> {
    let (op, r, est, wait) = lease_op(
        platform,
        model_id,
        key_id,
        estimated_tokens,
        limits,
        estimated_output_tokens,
        wait_s,
        priority,
    )?;
    Ok(this.waiter(op, vec![r], est, wait))
}

pub(super) fn lease_any_waiter(
    this: &PyQuotaEngine,
    routes: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
    estimated_output_tokens: Option<&Bound<'_, PyAny>>,
    strategy: Option<&Bound<'_, PyAny>>,
    wait_s: Option<&Bound<'_, PyAny>>,
    priority: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyLeaseWaiter> {
    let (op, rs, est, wait) =
        lease_any_op(routes, estimated_tokens, estimated_output_tokens, strategy, wait_s, priority)?;
    Ok(this.waiter(op, rs, est, wait))
}
