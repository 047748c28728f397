//! A thread-safe handle on an engine: one lock, panics turned into errors, log
//! records emitted after the lock is released, and the background flusher.
use crate::core::clock::Clock;
use crate::core::engine::{Engine, LogRecord, Settings, StoreSpec};
use crate::core::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

struct Shared {
    engine: Mutex<Option<Engine>>,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// Cloneable handle; all clones share one engine.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
    flusher: Arc<Mutex<Option<JoinHandle<()>>>>,
}

/// Hands engine log records to the `log` facade (target `quotaengine::core::engine`).
pub fn emit(logs: Vec<LogRecord>) {
    for (level, msg) in logs {
        log::log!(target: "quotaengine::core::engine", level, "{msg}");
    }
}

impl Handle {
    pub fn open(spec: &StoreSpec, clock: Arc<dyn Clock>, settings: Settings) -> Result<Handle> {
        let flush_ms = settings.flush_interval_ms;
        let mut engine = catch_unwind(AssertUnwindSafe(|| Engine::open(spec, clock, settings)))
            .unwrap_or_else(|p| Err(Error::from_panic(p)))?;
        emit(engine.take_logs());
        let handle = Handle {
            shared: Arc::new(Shared {
                engine: Mutex::new(Some(engine)),
                stop: Mutex::new(false),
                wake: Condvar::new(),
            }),
            flusher: Arc::new(Mutex::new(None)),
        };
        if flush_ms > 0 {
            let weak = Arc::downgrade(&handle.shared);
            let period = Duration::from_millis(flush_ms as u64);
            let t = std::thread::Builder::new()
                .name("quotaengine-flush".into())
                .spawn(move || loop {
                    let Some(shared) = weak.upgrade() else { return };
                    {
                        let mut stop = shared.stop.lock();
                        if !*stop {
                            shared.wake.wait_for(&mut stop, period);
                        }
                        if *stop {
                            return;
                        }
                    }
                    let logs = {
                        let mut g = shared.engine.lock();
                        match g.as_mut() {
                            Some(e) => {
                                let _ = catch_unwind(AssertUnwindSafe(|| e.flush()));
                                e.take_logs()
                            }
                            None => return,
                        }
                    };
                    emit(logs);
                })
                .map_err(|e| Error::Internal(format!("cannot start the flush thread: {e}")))?;
            *handle.flusher.lock() = Some(t);
        }
        Ok(handle)
    }

    /// Runs `f` on the engine under its lock. A panic inside becomes
    /// [`Error::Internal`] and the engine stays usable.
    pub fn with<T>(&self, f: impl FnOnce(&mut Engine) -> Result<T>) -> Result<T> {
        let (out, logs) = {
            let mut guard = self.shared.engine.lock();
            let engine = guard.as_mut().ok_or(Error::Closed)?;
            let out = catch_unwind(AssertUnwindSafe(|| f(&mut *engine)));
            let out = match out {
                Ok(r) => r,
                Err(p) => {
                    engine.recover_after_panic();
                    Err(Error::from_panic(p))
                }
            };
            (out, engine.take_logs())
        };
        emit(logs);
        out
    }

    pub fn is_closed(&self) -> bool {
        self.shared.engine.lock().is_none()
    }

    /// Stops the flusher, writes what is buffered, closes the store. Idempotent.
    pub fn close(&self) {
        {
            *self.shared.stop.lock() = true;
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.flusher.lock().take() {
            let _ = t.join();
        }
        let engine = self.shared.engine.lock().take();
        if let Some(mut e) = engine {
            let _ = catch_unwind(AssertUnwindSafe(|| e.close()));
            emit(e.take_logs());
        }
    }
}
