//! The background flusher of an engine that groups writes (`flush_interval_ms > 0`).
use super::boundary::lock;
use crate::core::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The flusher thread of one engine: stopped through `stop` (and an unpark).
pub(crate) struct Flusher {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Flusher {
    pub(crate) fn new() -> Flusher {
        Flusher { stop: Arc::new(AtomicBool::new(false)), thread: Mutex::new(None) }
    }

    /// Starts the thread: it wakes every `tick` and runs `work`, until it is stopped or
    /// `work` answers false (the engine is gone or closed).
    pub(crate) fn start(
        &self, name: &str, tick: Duration, mut work: impl FnMut() -> bool + Send + 'static,
    ) -> Result<()> {
        let stop = self.stop.clone();
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                std::thread::park_timeout(tick);
                if stop.load(Ordering::Acquire) || !work() {
                    return;
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the thread {name}: {e}")))?;
        *lock(&self.thread) = Some(t);
        Ok(())
    }

    /// Stops the thread and waits for it to end.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let thread = lock(&self.thread).take();
        if let Some(t) = thread {
            t.thread().unpark();
            let _ = t.join();
        }
    }

    /// In a forked child: the parent's thread is not in this process (joining it would
    /// fail); the child starts its own at its first call.
    pub(crate) fn forget_parent(&self) {
        std::mem::forget(lock(&self.thread).take());
        self.stop.store(false, Ordering::Release);
    }
}
