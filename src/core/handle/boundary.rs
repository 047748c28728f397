//! The boundary every call crosses into an engine: the fork gate, and a panic inside
//! turned into [`Error::Internal`] (SPEC 18.1).
use crate::core::error::{Error, Result};
use crate::core::fork::TURNSTILE;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A lock, whatever a panic elsewhere left in it (the engine recovers itself).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `f`, a panic inside it turned into [`Error::Internal`].
pub(crate) fn caught<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(Error::from_panic(p)))
}

/// One engine's side of the boundary, with its test hook.
pub(crate) struct Boundary {
    /// Test hook: this many next crossings of the boundary panic inside it.
    inject_panics: AtomicU32,
}

impl Boundary {
    pub(crate) const fn new() -> Boundary {
        Boundary { inject_panics: AtomicU32::new(0) }
    }

    /// The one boundary: the fork gate, then `f`, a panic inside it turned into
    /// [`Error::Internal`].
    pub(crate) fn guard<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _pass = TURNSTILE.pass();
        self.shield(f)
    }

    /// The boundary without the fork gate, for what takes several steps on the engine
    /// or waits on the user's code (a wait's step, a probe pass and its validator):
    /// each of its steps on the engine passes the gate itself.
    pub(crate) fn shield<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        caught(|| {
            self.injected_panic();
            f()
        })
    }

    /// Test hook: the next `n` calls into the engine panic inside the boundary.
    pub(crate) fn inject_panics(&self, n: u32) {
        self.inject_panics.store(n, Ordering::SeqCst);
    }

    fn injected_panic(&self) {
        let n = &self.inject_panics;
        if n.load(Ordering::Relaxed) > 0
            && n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
        {
            panic!("injected panic (test hook)");
        }
    }
}
