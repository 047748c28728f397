//! The stepper the async forms of a wait for capacity drive (SPEC 17.2); the sync
//! wait is a door of the engine (`engine::run::run_waiting`).
use super::lease::PyLease;
use crate::core::admission::Estimate;
use crate::core::error::Error;
use crate::core::handle::Handle;
use crate::core::types::Route;
use crate::core::wait::{Step, Waiter};
use pyo3::prelude::*;
use std::sync::Mutex;
use std::time::Duration;

/// A pending `lease_async` / `lease_any_async`: `step()` looks at the gates once and
/// returns the `Lease`, or the seconds to sleep before the next look; it raises
/// `QuotaExceeded` when the wait is over. `close()` (or dropping it) leaves the queue.
#[pyclass(frozen, name = "_LeaseWaiter", module = "quotaengine._quotaengine")]
pub struct PyLeaseWaiter {
    pub waiter: Mutex<Option<Waiter>>,
    pub handle: Handle,
    /// The candidates (one for `lease_async`), and the estimate the lease records.
    pub routes: Vec<Route>,
    pub estimate: Estimate,
    /// The tenants the lease is taken for.
    pub tenants: crate::core::tenants::TenantList,
}

#[pymethods]
impl PyLeaseWaiter {
    /// `(lease, 0.0)` when admitted, `(None, seconds)` to sleep first.
    fn step(&self, py: Python<'_>) -> PyResult<(Option<Py<PyLease>>, f64)> {
        let step = py.detach(|| {
            let mut slot = self.waiter.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match slot.as_mut() {
                Some(w) => w.step(),
                None => Err(Error::Invalid("this wait is over".into())),
            }
        });
        match step {
            Ok(Step::Admitted(id, i)) => {
                self.close();
                let route = self
                    .routes
                    .get(i)
                    .cloned()
                    .ok_or_else(|| PyErr::from(Error::Internal("no such candidate".into())))?;
                Ok((
                    Some(PyLease::create(py, &self.handle, id, route, self.estimate, self.tenants.clone())?),
                    0.0,
                ))
            }
            Ok(Step::Nap(d)) => Ok((None, nap_seconds(d))),
            Err(e) => {
                self.close();
                Err(e.into())
            }
        }
    }

    /// Calls `callback()` (from whichever thread ends a lease of this engine; it must be
    /// thread-safe, as `loop.call_soon_threadsafe` is) once the engine may have freed
    /// capacity since the last step, or at once when it already has.
    fn on_wake(&self, py: Python<'_>, callback: Py<PyAny>) {
        let slot = self.waiter.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(w) = slot.as_ref() else { return };
        let wake: crate::core::handle::Wake = Box::new(move || {
            Python::attach(|py| {
                // A closed loop refuses it: the wait is over anyway.
                let _ = callback.call0(py);
            });
        });
        py.detach(|| w.on_wake(wake));
    }

    /// Leaves the queue; idempotent.
    fn close(&self) {
        let w = self.waiter.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        drop(w);
    }
}

fn nap_seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}
