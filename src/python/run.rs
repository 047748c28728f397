//! The binding's doors into the core, and the only code of it that releases the GIL
//! (the fork hooks, the destructors and the async wait's stepper aside):
//! `run` (the engine under its lock), `run_batch` (a lease operation grouped with
//! other threads' in one commit), `run_waiting` (an admission that waits for
//! capacity), `on_handle` (what the handle serves without the engine's lock: the
//! probe's thread, closing) and `open`. Errors and panics come back as Python exceptions.
use crate::core::clock::Clock;
use crate::core::engine::{BatchOp, BatchOut, Engine, Settings, StoreSpec};
use crate::core::error::{Error, Result as CoreResult};
use crate::core::handle::Handle;
use crate::core::wait::Waiter;
use pyo3::prelude::*;
use std::sync::Arc;

/// Runs `op` on the engine under its lock, the GIL released.
pub(crate) fn run<T: Send>(
    py: Python<'_>, handle: &Handle, op: impl FnOnce(&mut Engine) -> CoreResult<T> + Send,
) -> PyResult<T> {
    on_handle(py, handle, |h| h.with(op))
}

/// Runs a lease operation with group commit (`Handle::batch`), the GIL released;
/// `out` reads its result (`BatchOut::done`, `lease_id` or `chosen`).
pub(crate) fn run_batch<T: Send>(
    py: Python<'_>, handle: &Handle, op: BatchOp, out: fn(BatchOut) -> CoreResult<T>,
) -> PyResult<T> {
    on_handle(py, handle, |h| out(h.batch(op)))
}

/// What the handle serves without the engine's lock (starting, stopping and running
/// the probe, closing), the GIL released.
pub(crate) fn on_handle<T: Send>(
    py: Python<'_>, handle: &Handle, f: impl FnOnce(&Handle) -> CoreResult<T> + Send,
) -> PyResult<T> {
    Ok(py.detach(|| f(handle))?)
}

/// Opens the store, the GIL released.
pub(crate) fn open(
    py: Python<'_>, spec: StoreSpec, clock: Arc<dyn Clock>, settings: Settings,
) -> PyResult<Handle> {
    Ok(py.detach(move || Handle::open(&spec, clock, settings))?)
}

/// A blocking wait for capacity (SPEC 17.2) with the GIL released; between naps (at
/// most 50 ms apart) it takes the GIL to run Python's signal handlers, and what one
/// raises (`KeyboardInterrupt`) ends the wait with nothing leased.
pub(crate) fn run_waiting(py: Python<'_>, waiter: Waiter) -> PyResult<(i64, usize)> {
    let mut signal: Option<PyErr> = None;
    let out = py.detach(|| {
        waiter.run(|| {
            Python::attach(|py| {
                // A signal handler may also have run inside Python code this thread
                // called meanwhile (a logging handler of the engine's records) and left
                // its exception there: that one ends the wait too.
                match PyErr::take(py) {
                    Some(e) => Err(e),
                    None => py.check_signals(),
                }
            })
            .map_err(|e| {
                signal = Some(e);
                Error::Internal("interrupted by a signal".into())
            })
        })
    });
    if let Some(e) = signal {
        return Err(e);
    }
    Ok(out?)
}
