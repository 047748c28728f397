//! Leases (SPEC §5, 17): admission at once or waiting, the lease objects, and the
//! steppers the async forms drive.
use super::args::{exclude_arg, route, routes_arg, wait_arg};
use super::PyQuotaEngine;
use crate::core::admission::Estimate;
use crate::core::engine::{BatchOp, BatchOut};
use crate::core::tenants::{self, TenantList};
use crate::core::types::{Route, Strategy};
use crate::core::wait::Waiter;
use crate::python::convert::{count_arg, int_arg, opt_priority_arg, str_arg, tenants_arg, Arg};
use crate::python::lease::PyLease;
use crate::python::limits::limits_arg;
use crate::python::run::{on_handle, run_batch, run_waiting};
use crate::python::wait::PyLeaseWaiter;
use pyo3::prelude::*;
use std::time::Duration;

/// What an admission takes: the operation, its candidates, the estimate the lease
/// records, and how long it may wait.
struct Admit {
    op: BatchOp,
    routes: Vec<Route>,
    est: Estimate,
    wait: Duration,
    tenants: TenantList,
}

impl Admit {
    /// `lease()`'s arguments.
    #[allow(clippy::too_many_arguments)]
    fn one(
        platform: &Arg, model_id: &Arg, key_id: &Arg, estimated_tokens: Option<&Arg>, limits: Option<&Arg>,
        estimated_output_tokens: Option<&Arg>, wait_s: Option<&Arg>, priority: Option<&Arg>,
        tenant: Option<&Arg>,
    ) -> PyResult<Admit> {
        let r = route(platform, model_id, key_id)?;
        let est = estimate(estimated_tokens, estimated_output_tokens)?;
        let limits = limits_arg(limits)?;
        let (wait, priority) = (wait_arg(wait_s)?, opt_priority_arg(priority)?);
        let tenants = tenants_arg(tenant)?;
        let op =
            BatchOp::Lease { route: r.clone(), est, limits, check: true, priority, tenants: tenants.clone() };
        Ok(Admit { op, routes: vec![r], est, wait, tenants })
    }

    /// `lease_any()`'s arguments.
    #[allow(clippy::too_many_arguments)]
    fn any(
        routes: &Arg, estimated_tokens: Option<&Arg>, estimated_output_tokens: Option<&Arg>,
        strategy: Option<&Arg>, wait_s: Option<&Arg>, priority: Option<&Arg>, tenant: Option<&Arg>,
        exclude: Option<&Arg>,
    ) -> PyResult<Admit> {
        let rs = routes_arg(routes)?;
        let exclude = exclude_arg(exclude)?;
        let est = estimate(estimated_tokens, estimated_output_tokens)?;
        let strategy: Strategy = match strategy.filter(|s| !s.is_none()) {
            Some(s) => str_arg(s, "strategy")?.parse()?,
            None => Strategy::default(),
        };
        let (wait, priority) = (wait_arg(wait_s)?, opt_priority_arg(priority)?);
        let tenants = tenants_arg(tenant)?;
        let tenants_of_op = tenants.clone();
        let op = BatchOp::LeaseAny {
            routes: rs.clone(),
            est,
            strategy,
            priority,
            tenants: tenants_of_op,
            exclude,
        };
        Ok(Admit { op, routes: rs, est, wait, tenants })
    }

    /// Admits at once (no wait), or waits for capacity (SPEC 17.2); the `Lease`.
    fn lease(mut self, py: Python<'_>, this: &PyQuotaEngine) -> PyResult<Py<PyLease>> {
        let (id, i) = if self.wait.is_zero() {
            // SPEC 27.1: a refusal raised to the caller is counted.
            on_handle(py, &this.handle, |h| h.count_refusal(h.batch(self.op).chosen()))?
        } else {
            run_waiting(py, Waiter::new(&this.handle, self.op, self.wait))?
        };
        PyLease::create(py, &this.handle, id, self.routes.swap_remove(i), self.est, self.tenants)
    }

    /// The stepper of an async admission (SPEC 17.2).
    fn waiter(self, this: &PyQuotaEngine) -> PyLeaseWaiter {
        PyLeaseWaiter {
            waiter: std::sync::Mutex::new(Some(Waiter::new(&this.handle, self.op, self.wait))),
            handle: this.handle.clone(),
            routes: self.routes,
            estimate: self.est,
            tenants: self.tenants,
        }
    }
}

/// `estimated_tokens` and `estimated_output_tokens` (None: 0).
fn estimate(tokens: Option<&Arg>, output: Option<&Arg>) -> PyResult<Estimate> {
    let tokens = tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
    let output = output.map_or(Ok(0), |t| count_arg(t, "estimated_output_tokens"))?;
    Ok(Estimate { tokens, output, cost: 0 })
}

#[pymethods]
impl PyQuotaEngine {
    /// Takes a lease without checking any gate; returns its id.
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0)")]
    fn acquire_lease(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, estimated_tokens: Option<&Arg>,
    ) -> PyResult<i64> {
        let route = route(platform, model_id, key_id)?;
        let est = Estimate::tokens(estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?);
        let op =
            BatchOp::Lease { route, est, limits: None, check: false, priority: 0, tenants: tenants::none() };
        run_batch(py, &self.handle, op, BatchOut::lease_id)
    }

    /// Releases a lease; idempotent.
    fn release_lease(&self, py: Python<'_>, lease_id: &Arg) -> PyResult<()> {
        let id = int_arg(lease_id, "lease_id")?;
        run_batch(py, &self.handle, BatchOp::Release(id), BatchOut::done)
    }

    /// Runs every gate and takes the lease as one atomic step (across threads and
    /// processes); raises QuotaExceeded when a gate refuses. With `wait_s`, waits up to
    /// that many seconds for a gate to open (SPEC 17.2), the GIL released.
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None, *, estimated_output_tokens=None, wait_s=None, priority=None, tenant=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0, limits=None, *, estimated_output_tokens=0, wait_s=0.0, priority=0, tenant=None)")]
    #[allow(clippy::too_many_arguments)]
    fn lease(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, estimated_tokens: Option<&Arg>,
        limits: Option<&Arg>, estimated_output_tokens: Option<&Arg>, wait_s: Option<&Arg>,
        priority: Option<&Arg>, tenant: Option<&Arg>,
    ) -> PyResult<Py<PyLease>> {
        let (est, output) = (estimated_tokens, estimated_output_tokens);
        Admit::one(platform, model_id, key_id, est, limits, output, wait_s, priority, tenant)?.lease(py, self)
    }

    /// SPEC 17.1: among `routes` ((platform, model_id, key_id) candidates, each with
    /// its stored limits), every gate of every candidate, one of those that pass
    /// picked by `strategy` ("headroom", "order" or "spread"), and its lease taken, in
    /// one atomic step; with `wait_s`, waits for capacity as `lease()` does.
    #[pyo3(signature = (routes, estimated_tokens=None, *, estimated_output_tokens=None, strategy=None, wait_s=None, priority=None, tenant=None, exclude=None), text_signature = "(self, routes, estimated_tokens=0, *, estimated_output_tokens=0, strategy='headroom', wait_s=0.0, priority=0, tenant=None, exclude=None)")]
    #[allow(clippy::too_many_arguments)]
    fn lease_any(
        &self, py: Python<'_>, routes: &Arg, estimated_tokens: Option<&Arg>,
        estimated_output_tokens: Option<&Arg>, strategy: Option<&Arg>, wait_s: Option<&Arg>,
        priority: Option<&Arg>, tenant: Option<&Arg>, exclude: Option<&Arg>,
    ) -> PyResult<Py<PyLease>> {
        let output = estimated_output_tokens;
        Admit::any(routes, estimated_tokens, output, strategy, wait_s, priority, tenant, exclude)?
            .lease(py, self)
    }

    /// The stepper behind `lease_async` (see `quotaengine.QuotaEngine.lease_async`).
    #[pyo3(signature = (platform, model_id, key_id, estimated_tokens=None, limits=None, *, estimated_output_tokens=None, wait_s=None, priority=None, tenant=None), text_signature = "(self, platform, model_id, key_id, estimated_tokens=0, limits=None, *, estimated_output_tokens=0, wait_s=0.0, priority=0, tenant=None)")]
    #[allow(clippy::too_many_arguments)]
    fn _lease_waiter(
        &self, platform: &Arg, model_id: &Arg, key_id: &Arg, estimated_tokens: Option<&Arg>,
        limits: Option<&Arg>, estimated_output_tokens: Option<&Arg>, wait_s: Option<&Arg>,
        priority: Option<&Arg>, tenant: Option<&Arg>,
    ) -> PyResult<PyLeaseWaiter> {
        let (est, output) = (estimated_tokens, estimated_output_tokens);
        Ok(Admit::one(platform, model_id, key_id, est, limits, output, wait_s, priority, tenant)?
            .waiter(self))
    }

    /// The stepper behind `lease_any_async`.
    #[pyo3(signature = (routes, estimated_tokens=None, *, estimated_output_tokens=None, strategy=None, wait_s=None, priority=None, tenant=None, exclude=None), text_signature = "(self, routes, estimated_tokens=0, *, estimated_output_tokens=0, strategy='headroom', wait_s=0.0, priority=0, tenant=None, exclude=None)")]
    #[allow(clippy::too_many_arguments)]
    fn _lease_any_waiter(
        &self, routes: &Arg, estimated_tokens: Option<&Arg>, estimated_output_tokens: Option<&Arg>,
        strategy: Option<&Arg>, wait_s: Option<&Arg>, priority: Option<&Arg>, tenant: Option<&Arg>,
        exclude: Option<&Arg>,
    ) -> PyResult<PyLeaseWaiter> {
        let output = estimated_output_tokens;
        Ok(Admit::any(routes, estimated_tokens, output, strategy, wait_s, priority, tenant, exclude)?
            .waiter(self))
    }
}
