//! The background probe of an engine (SPEC §11): its thread, its pacing state, and one
//! pass. The validator (the user's code) runs with no engine lock held and outside the
//! fork gate; passes never overlap.
use super::boundary::lock;
use crate::core::engine::Engine;
use crate::core::error::{Error, Result};
use crate::core::fork::TURNSTILE;
use crate::core::probe::{ProbeState, Validator};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How long a key probed by one engine is left to it by the others of a fleet (the
/// first step of the probe backoff).
const PROBE_CLAIM_MS: i64 = 120_000;

/// What a pass needs of its engine (the handle).
pub(crate) trait Host: Clone + Send + 'static {
    /// Runs `f` on the engine under its lock, inside the boundary.
    fn with_engine<T>(&self, f: impl FnOnce(&mut Engine) -> Result<T>) -> Result<T>;
    /// The boundary without the fork gate (a pass waits on the validator).
    fn shield<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T>;
    /// The engine's identity within the process.
    fn engine_id(&self) -> usize;
    fn engine_closed(&self) -> bool;
    /// This engine's probe.
    fn prober(&self) -> &Prober;
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

/// One engine's probe.
pub(crate) struct Prober {
    /// The pacing state.
    state: Mutex<ProbeState>,
    /// A pass runs (passes never overlap). A flag, not a lock held across the pass: a
    /// pass calls the validator, which may take long, and a fork must neither wait for
    /// it nor leave a child a lock held by a thread it does not have.
    pass_running: AtomicBool,
    thread: Mutex<Option<ProbeThread>>,
}

impl Prober {
    pub(crate) fn new() -> Prober {
        Prober {
            state: Mutex::new(ProbeState::default()),
            pass_running: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// One probe pass (SPEC §11). The validator and `jitter` run with no engine lock
    /// held; passes never overlap. Called from inside a pass (its validator, or what
    /// that calls), it is [`Error::Runtime`] (SPEC 18.3): waiting for the running pass
    /// would wait for itself.
    pub(crate) fn run_pass(
        &self, host: &impl Host, validator: &dyn Validator, jitter: &mut dyn FnMut() -> f64,
        max_probes: usize,
    ) -> Result<ProbePassResult> {
        if in_probe_pass(host.engine_id()) {
            return Err(pass_running());
        }
        host.shield(|| self.pass(host, validator, jitter, max_probes, None))
    }

    fn pass(
        &self, host: &impl Host, validator: &dyn Validator, jitter: &mut dyn FnMut() -> f64,
        max_probes: usize, flags: Option<&(Mutex<ProbeFlags>, Condvar)>,
    ) -> Result<ProbePassResult> {
        let _inside = InPass::enter(host.engine_id());
        let _running = PassRunning::wait(&self.pass_running);
        let (cds, now) = host.with_engine(|e| Ok((e.failures().probeable_cooldowns()?, e.now_ms())))?;
        let due = {
            let _pass = TURNSTILE.pass();
            lock(&self.state).plan(&cds, now, max_probes, jitter)
        };
        let mut result = ProbePassResult::default();
        for key in due {
            // Another engine of the fleet probes this key now: leave it to that one.
            if !host.with_engine(|e| Ok(e.failures().claim_probe(key, PROBE_CLAIM_MS)))? {
                continue;
            }
            if let Some((f, _)) = flags {
                let mut f = lock(f);
                if f.stop {
                    break;
                }
                f.in_validator = true;
            }
            let passed = validator.probe(key);
            if let Some((f, _)) = flags {
                let mut f = lock(f);
                f.in_validator = false;
                if f.stop {
                    break;
                }
            }
            result.probed_key_ids.push(key);
            let cleared = host.with_engine(|e| {
                let now = e.now_ms();
                lock(&self.state).record(key, passed, now);
                if passed {
                    e.failures().recover_key(key)
                } else {
                    Ok(0)
                }
            })?;
            result.cleared_cooldowns += cleared;
        }
        Ok(result)
    }

    /// Starts the background probe thread, a pass every `interval`; false when one is
    /// already running.
    pub(crate) fn start<H: Host>(
        &self, host: H, validator: Arc<dyn Validator>, interval: Duration, max_per_pass: usize,
    ) -> Result<bool> {
        let mut slot = lock(&self.thread);
        if let Some(t) = slot.as_ref() {
            if !lock(&t.stop.0).done {
                return Ok(false);
            }
        }
        if host.engine_closed() {
            return Err(Error::Closed);
        }
        let flags: Arc<(Mutex<ProbeFlags>, Condvar)> =
            Arc::new((Mutex::new(ProbeFlags::default()), Condvar::new()));
        let f2 = flags.clone();
        let t = std::thread::Builder::new()
            .name("quotaengine-probe".into())
            .spawn(move || {
                let (flag, cv) = &*f2;
                loop {
                    {
                        let mut f = lock(flag);
                        if !f.stop {
                            f = cv.wait_timeout(f, interval).unwrap_or_else(PoisonError::into_inner).0;
                        }
                        if f.stop {
                            break;
                        }
                    }
                    let mut jitter = default_jitter;
                    let pass = host.shield(|| {
                        host.prober().pass(&host, &*validator, &mut jitter, max_per_pass, Some(&f2))
                    });
                    if let Err(Error::Closed) = pass {
                        break;
                    }
                }
                lock(flag).done = true;
                cv.notify_all();
            })
            .map_err(|e| Error::Internal(format!("cannot start the probe thread: {e}")))?;
        *slot = Some(ProbeThread { stop: flags, thread_id: t.thread().id() });
        Ok(true)
    }

    /// Stops the background probe and waits for it to finish, unless it is inside a
    /// validator call or this is the probe thread itself (it then ends on its own).
    pub(crate) fn stop(&self) {
        let t = lock(&self.thread).take();
        let Some(t) = t else { return };
        let (flag, cv) = &*t.stop;
        let mut f = lock(flag);
        f.stop = true;
        cv.notify_all();
        if std::thread::current().id() == t.thread_id {
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !f.done && !f.in_validator {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            f = cv.wait_timeout(f, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Whether the background probe thread runs.
    pub(crate) fn running(&self) -> bool {
        lock(&self.thread).as_ref().is_some_and(|t| !lock(&t.stop.0).done)
    }

    /// In a forked child: the parent's probe thread is not in this process, nor is its
    /// pass; the pacing starts afresh.
    pub(crate) fn forget_parent(&self) {
        std::mem::forget(lock(&self.thread).take());
        *lock(&self.state) = ProbeState::default();
        self.pass_running.store(false, Ordering::Release);
    }
}

thread_local! {
    /// The engines (`Handle::id`) whose probe pass this thread runs: a pass's validator
    /// calling that engine's `run_probe_pass()` finds its engine here.
    static IN_PASS: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether the calling thread is inside a probe pass of engine `id`.
pub fn in_probe_pass(id: usize) -> bool {
    IN_PASS.with(|v| v.borrow().contains(&id))
}

/// SPEC 18.3's error.
pub fn pass_running() -> Error {
    Error::Runtime("a probe pass is running".into())
}

/// Marks the calling thread as inside a probe pass of one engine, for one pass.
struct InPass;

impl InPass {
    fn enter(id: usize) -> InPass {
        IN_PASS.with(|v| v.borrow_mut().push(id));
        InPass
    }
}

impl Drop for InPass {
    fn drop(&mut self) {
        IN_PASS.with(|v| {
            v.borrow_mut().pop();
        });
    }
}

/// Holds the probe's "a pass runs" flag for one pass.
struct PassRunning<'a>(&'a AtomicBool);

impl<'a> PassRunning<'a> {
    /// Waits until no other pass runs (outside the gate and without a lock).
    fn wait(flag: &'a AtomicBool) -> PassRunning<'a> {
        while flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        PassRunning(flag)
    }
}

impl Drop for PassRunning<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
