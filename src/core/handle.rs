//! A thread-safe handle on an engine: one lock, panics turned into errors, log
//! records emitted after the lock is released, and the background flusher.
use crate::core::clock::Clock;
use crate::core::engine::{BatchOp, BatchOut, Engine, LogRecord, Settings, StoreSpec};
use crate::core::error::{Error, Result};
use crate::core::probe::{ProbeState, Validator};
use parking_lot::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a key probed by one engine is left to it by the others of a fleet (the
/// first step of the probe backoff).
const PROBE_CLAIM_MS: i64 = 120_000;

struct Shared {
    engine: Mutex<Option<Engine>>,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Passes never overlap; the pacing state lives with this lock.
    probe: Mutex<ProbeState>,
    probe_thread: Mutex<Option<ProbeThread>>,
    /// Hot-path operations waiting for the engine lock (group commit).
    queue: Mutex<Vec<Arc<Job>>>,
}

/// One caller's operation in the group-commit queue.
struct Job {
    op: Mutex<Option<BatchOp>>,
    out: Mutex<Option<BatchOut>>,
}

/// The background probe thread: stopped through `stop`, reports its exit on `done`.
struct ProbeThread {
    stop: Arc<(Mutex<ProbeFlags>, Condvar)>,
    thread_id: std::thread::ThreadId,
}

#[derive(Default)]
struct ProbeFlags {
    stop: bool,
    done: bool,
    /// The thread is inside a validator call (stop does not wait for it).
    in_validator: bool,
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbePassResult {
    pub probed_key_ids: Vec<i64>,
    pub cleared_cooldowns: i64,
}

/// A uniform number in [0, 1) for first-probe jitter (no external RNG).
pub fn default_jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9e37_79b9_7f4a_7c15);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
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
        let tick = engine.tick_period();
        let handle = Handle {
            shared: Arc::new(Shared {
                engine: Mutex::new(Some(engine)),
                stop: Mutex::new(false),
                wake: Condvar::new(),
                probe: Mutex::new(ProbeState::default()),
                probe_thread: Mutex::new(None),
                queue: Mutex::new(Vec::new()),
            }),
            flusher: Arc::new(Mutex::new(None)),
        };
        if flush_ms > 0 {
            let weak = Arc::downgrade(&handle.shared);
            let period = Duration::from_millis(flush_ms as u64);
            let mut last_flush = std::time::Instant::now();
            let t = std::thread::Builder::new()
                .name("quotaengine-flush".into())
                .spawn(move || loop {
                    let Some(shared) = weak.upgrade() else { return };
                    {
                        let mut stop = shared.stop.lock();
                        if !*stop {
                            // Wakes every hold period (a write lock kept across calls
                            // ends on time even when no call comes), flushes every
                            // `flush_interval_ms`.
                            shared.wake.wait_for(&mut stop, tick);
                        }
                        if *stop {
                            return;
                        }
                    }
                    let logs = {
                        let mut g = shared.engine.lock();
                        match g.as_mut() {
                            Some(e) => {
                                let _ = catch_unwind(AssertUnwindSafe(|| {
                                    if last_flush.elapsed() >= period {
                                        last_flush = std::time::Instant::now();
                                        e.flush()
                                    } else {
                                        e.end_hold_if_due()
                                    }
                                }));
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

    /// Runs a hot-path operation with group commit: callers that queue while another
    /// holds the engine lock are served together by whichever takes the lock next,
    /// in one section and one commit. Each still sees the others' effects in order.
    pub fn batch(&self, op: BatchOp) -> BatchOut {
        let job = Arc::new(Job { op: Mutex::new(Some(op)), out: Mutex::new(None) });
        self.shared.queue.lock().push(job.clone());
        let logs = {
            let mut guard = self.shared.engine.lock();
            let done = job.out.lock().take();
            if let Some(out) = done {
                // A caller that held the lock before us already ran our operation.
                return out;
            }
            let jobs: Vec<Arc<Job>> = std::mem::take(&mut *self.shared.queue.lock());
            let ops: Vec<BatchOp> = jobs.iter().filter_map(|j| j.op.lock().take()).collect();
            let n = ops.len();
            let outs: Vec<BatchOut> = match guard.as_mut() {
                None => (0..n).map(|_| BatchOut::Done(Err(Error::Closed))).collect(),
                Some(engine) => match catch_unwind(AssertUnwindSafe(|| engine.run_batch(ops))) {
                    Ok(outs) => outs,
                    Err(p) => {
                        engine.recover_after_panic();
                        let e = Error::from_panic(p);
                        (0..n).map(|_| BatchOut::Done(Err(e.clone()))).collect()
                    }
                },
            };
            for (j, o) in jobs.iter().zip(outs) {
                *j.out.lock() = Some(o);
            }
            guard.as_mut().map(Engine::take_logs).unwrap_or_default()
        };
        emit(logs);
        let out = job.out.lock().take();
        out.unwrap_or(BatchOut::Done(Err(Error::Internal("lost batch result".into()))))
    }

    pub fn is_closed(&self) -> bool {
        self.shared.engine.lock().is_none()
    }

    /// One probe pass (SPEC §11). The validator and `jitter` run with no engine lock
    /// held; passes never overlap.
    pub fn run_probe_pass(
        &self,
        validator: &dyn Validator,
        jitter: &mut dyn FnMut() -> f64,
        max_probes: usize,
    ) -> Result<ProbePassResult> {
        self.probe_pass(validator, jitter, max_probes, None)
    }

    fn probe_pass(
        &self,
        validator: &dyn Validator,
        jitter: &mut dyn FnMut() -> f64,
        max_probes: usize,
        flags: Option<&(Mutex<ProbeFlags>, Condvar)>,
    ) -> Result<ProbePassResult> {
        let mut state = self.shared.probe.lock();
        let (cds, now) = self.with(|e| Ok((e.probeable_cooldowns()?, e.now_ms())))?;
        let due = state.plan(&cds, now, max_probes, jitter);
        let mut result = ProbePassResult::default();
        for key in due {
            // Another engine of the fleet probes this key now: leave it to that one.
            if !self.with(|e| Ok(e.claim_probe(key, PROBE_CLAIM_MS)))? {
                continue;
            }
            if let Some((f, _)) = flags {
                let mut f = f.lock();
                if f.stop {
                    break;
                }
                f.in_validator = true;
            }
            let passed = validator.probe(key);
            if let Some((f, _)) = flags {
                let mut f = f.lock();
                f.in_validator = false;
                if f.stop {
                    break;
                }
            }
            result.probed_key_ids.push(key);
            let cleared = self.with(|e| {
                let now = e.now_ms();
                state.record(key, passed, now);
                if passed {
                    e.recover_key(key)
                } else {
                    Ok(0)
                }
            })?;
            result.cleared_cooldowns += cleared;
        }
        Ok(result)
    }

    /// Starts the background probe; false when one is already running.
    pub fn start_probe(
        &self,
        validator: Arc<dyn Validator>,
        interval: Duration,
        max_per_pass: usize,
    ) -> Result<bool> {
        let mut slot = self.shared.probe_thread.lock();
        if let Some(t) = slot.as_ref() {
            if !t.stop.0.lock().done {
                return Ok(false);
            }
        }
        if self.is_closed() {
            return Err(Error::Closed);
        }
        let flags: Arc<(Mutex<ProbeFlags>, Condvar)> =
            Arc::new((Mutex::new(ProbeFlags::default()), Condvar::new()));
        let me = self.clone();
        let f2 = flags.clone();
        let t = std::thread::Builder::new()
            .name("quotaengine-probe".into())
            .spawn(move || {
                let (lock, cv) = &*f2;
                loop {
                    {
                        let mut f = lock.lock();
                        if !f.stop {
                            cv.wait_for(&mut f, interval);
                        }
                        if f.stop {
                            break;
                        }
                    }
                    let mut jitter = default_jitter;
                    if let Err(Error::Closed) =
                        me.probe_pass(&*validator, &mut jitter, max_per_pass, Some(&f2))
                    {
                        break;
                    }
                }
                let mut f = lock.lock();
                f.done = true;
                cv.notify_all();
            })
            .map_err(|e| Error::Internal(format!("cannot start the probe thread: {e}")))?;
        *slot = Some(ProbeThread { stop: flags, thread_id: t.thread().id() });
        Ok(true)
    }

    /// Stops the background probe and waits for it to finish, unless it is inside a
    /// validator call or this is the probe thread itself (it then ends on its own).
    pub fn stop_probe(&self) {
        let t = self.shared.probe_thread.lock().take();
        let Some(t) = t else { return };
        let (lock, cv) = &*t.stop;
        let mut f = lock.lock();
        f.stop = true;
        cv.notify_all();
        if std::thread::current().id() == t.thread_id {
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !f.done && !f.in_validator {
            if cv.wait_until(&mut f, deadline).timed_out() {
                break;
            }
        }
    }

    pub fn probe_running(&self) -> bool {
        self.shared.probe_thread.lock().as_ref().is_some_and(|t| !t.stop.0.lock().done)
    }

    /// Stops the flusher, writes what is buffered, closes the store. Idempotent.
    pub fn close(&self) {
        self.stop_probe();
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
