//! A thread-safe handle on an engine: one lock, panics turned into errors, log
//! records emitted after the lock is released, the background flusher, and what a
//! forked child does with the engine it inherited ([`crate::core::fork`]).
//!
//! Every way in goes through [`Handle::guard`] (also [`Handle::with`] and
//! [`Handle::batch`], which use it): the fork gate, and a panic inside turned into
//! [`Error::Internal`]. The locks are `std::sync` ones so that a forked child finds them
//! in a usable state (see `fork.rs`).
use crate::core::clock::Clock;
use crate::core::engine::{BatchOp, BatchOut, Engine, LogRecord, Settings, StoreSpec};
use crate::core::error::{Error, Result};
use crate::core::fork::GATE;
use crate::core::probe::{ProbeState, Validator};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a key probed by one engine is left to it by the others of a fleet (the
/// first step of the probe backoff).
const PROBE_CLAIM_MS: i64 = 120_000;

/// Locks are taken in this order: `probe_thread`, `engine`, `probe`, `queue`, `flusher`;
/// each only inside a pass of the fork gate, and none across a validator call.
struct Shared {
    engine: Mutex<Option<Engine>>,
    /// The flusher stops when this is set (and its thread unparked).
    stop: AtomicBool,
    /// The probe's pacing state.
    probe: Mutex<ProbeState>,
    /// A probe pass runs (passes never overlap). A flag, not a lock held across the
    /// pass: a pass calls the validator, which may take long, and a fork must neither
    /// wait for it nor leave a child a lock held by a thread it does not have.
    pass_running: AtomicBool,
    probe_thread: Mutex<Option<ProbeThread>>,
    /// Hot-path operations waiting for the engine lock (group commit).
    queue: Mutex<Vec<Arc<Job>>>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// How to open the engine again (in a forked child).
    spec: StoreSpec,
    clock: Arc<dyn Clock>,
    settings: Settings,
    /// In a forked child until its first call: the engine is to be opened anew
    /// (`engine` is `None`, or an in-memory engine that stays) and its flusher started.
    forked: AtomicBool,
    /// Bumped in the child by every fork: a lease taken before belongs to the parent.
    epoch: AtomicU64,
    /// Test hook: this many next crossings of the boundary panic inside it.
    inject_panics: AtomicU32,
    /// Calls waiting for capacity (SPEC 17.2), woken when this engine may have freed
    /// some; `waiters` counts them so that a call wakes nobody cheaply.
    waiting: Mutex<Waiting>,
    wake: Condvar,
    waiters: AtomicUsize,
}

/// A one-shot callback of a waiter that does not block on `wake` (an async one), run
/// when the waiting generation moves: outside every lock and gate pass (it may take the
/// GIL).
pub type Wake = Box<dyn FnOnce() + Send>;

/// The queue of calls waiting for capacity: a smaller priority number first (SPEC
/// 22.1), first come, first served within one priority.
#[derive(Default)]
struct Waiting {
    next_ticket: u64,
    /// Ticket -> its priority and the keys `(platform, key_id)` it waits on.
    queue: std::collections::BTreeMap<u64, (i64, Vec<(String, i64)>)>,
    /// Bumped whenever a lease of this engine ends, a waiter leaves, or it closes.
    generation: u64,
    /// Callbacks to run at the next bump.
    wakes: Vec<Wake>,
}

/// Runs async waiters' callbacks (outside every lock and gate pass).
fn run_wakes(wakes: Vec<Wake>) {
    for w in wakes {
        w();
    }
}

/// Every engine of the process, for the fork hooks.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// A lock, whatever a panic elsewhere left in it (the engine recovers itself).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
}

/// Hands engine log records to the `log` facade (target `quotaengine::core::engine`).
pub fn emit(logs: Vec<LogRecord>) {
    for (level, msg) in logs {
        log::log!(target: "quotaengine::core::engine", level, "{msg}");
    }
}

fn open_engine(spec: &StoreSpec, clock: Arc<dyn Clock>, settings: Settings) -> Result<Engine> {
    catch_unwind(AssertUnwindSafe(|| Engine::open(spec, clock, settings)))
        .unwrap_or_else(|p| Err(Error::from_panic(p)))
}

impl Handle {
    pub fn open(spec: &StoreSpec, clock: Arc<dyn Clock>, settings: Settings) -> Result<Handle> {
        let _pass = GATE.pass();
        let mut engine = open_engine(spec, clock.clone(), settings.clone())?;
        emit(engine.take_logs());
        let handle = Handle {
            shared: Arc::new(Shared {
                engine: Mutex::new(Some(engine)),
                stop: AtomicBool::new(false),
                probe: Mutex::new(ProbeState::default()),
                pass_running: AtomicBool::new(false),
                probe_thread: Mutex::new(None),
                queue: Mutex::new(Vec::new()),
                flusher: Mutex::new(None),
                spec: spec.clone(),
                clock,
                settings,
                forked: AtomicBool::new(false),
                epoch: AtomicU64::new(0),
                inject_panics: AtomicU32::new(0),
                waiting: Mutex::new(Waiting::default()),
                wake: Condvar::new(),
                waiters: AtomicUsize::new(0),
            }),
        };
        handle.start_flusher()?;
        let mut live = lock(&LIVE);
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&handle.shared));
        Ok(handle)
    }

    /// Starts the background flusher when writes are grouped (`flush_interval_ms > 0`).
    fn start_flusher(&self) -> Result<()> {
        let flush_ms = self.shared.settings.flush_interval_ms;
        if flush_ms <= 0 || self.shared.settings.readonly {
            return Ok(());
        }
        let Some(tick) = lock(&self.shared.engine).as_ref().map(Engine::tick_period) else { return Ok(()) };
        let weak = Arc::downgrade(&self.shared);
        let period = Duration::from_millis(flush_ms as u64);
        let mut last_flush = std::time::Instant::now();
        let t = std::thread::Builder::new()
            .name("quotaengine-flush".into())
            .spawn(move || loop {
                // Wakes every hold period (a write lock kept across calls ends on time
                // even when no call comes), flushes every `flush_interval_ms`.
                std::thread::park_timeout(tick);
                let Some(shared) = weak.upgrade() else { return };
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                let logs = {
                    let _pass = GATE.pass();
                    let mut g = lock(&shared.engine);
                    let Some(e) = g.as_mut() else { return };
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        if last_flush.elapsed() >= period {
                            last_flush = std::time::Instant::now();
                            e.flush()
                        } else {
                            e.end_hold_if_due()
                        }
                    }));
                    e.take_logs()
                };
                emit(logs);
            })
            .map_err(|e| Error::Internal(format!("cannot start the flush thread: {e}")))?;
        *lock(&self.shared.flusher) = Some(t);
        Ok(())
    }

    /// The one boundary: the fork gate, then `f`, a panic inside it turned into
    /// [`Error::Internal`].
    pub fn guard<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _pass = GATE.pass();
        self.boundary(f)
    }

    /// A panic inside `f` turned into [`Error::Internal`], without the fork gate: for
    /// what takes several steps on the engine, each passing the gate itself (a wait's
    /// step).
    pub(crate) fn shielded<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.boundary(f)
    }

    /// The boundary without the fork gate, for what waits on the user's code (a probe
    /// pass and its validator): each of its steps on the engine passes the gate itself.
    fn boundary<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        catch_unwind(AssertUnwindSafe(|| {
            self.injected_panic();
            f()
        }))
        .unwrap_or_else(|p| Err(Error::from_panic(p)))
    }

    /// Test hook: the next `n` calls into the engine panic inside the boundary.
    pub fn inject_panics(&self, n: u32) {
        self.shared.inject_panics.store(n, Ordering::SeqCst);
    }

    fn injected_panic(&self) {
        let n = &self.shared.inject_panics;
        if n.load(Ordering::Relaxed) > 0
            && n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
        {
            panic!("injected panic (test hook)");
        }
    }

    /// This engine's identity within the process (the same for every clone).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Generation of the engine this handle reaches: a forked child's engine is a new one.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch.load(Ordering::Relaxed)
    }

    /// Under the engine lock, before a call: in a forked child the first call opens the
    /// engine anew, as the child would have. True when it did: the caller starts the
    /// flusher once the lock is released.
    fn ready(&self, slot: &mut Option<Engine>) -> Result<bool> {
        if !self.shared.forked.load(Ordering::Acquire) {
            return Ok(false);
        }
        if slot.is_none() {
            let s = &self.shared;
            *slot = Some(open_engine(&s.spec, s.clock.clone(), s.settings.clone())?);
        }
        self.shared.forked.store(false, Ordering::Release);
        Ok(true)
    }

    /// Runs `f` on the engine under its lock. A panic inside becomes
    /// [`Error::Internal`] and the engine stays usable.
    pub fn with<T>(&self, f: impl FnOnce(&mut Engine) -> Result<T>) -> Result<T> {
        let mut reopened = false;
        let (out, logs, wakes) = self.guard(|| {
            let mut slot = lock(&self.shared.engine);
            reopened = self.ready(&mut slot)?;
            let engine = slot.as_mut().ok_or(Error::Closed)?;
            let out = match catch_unwind(AssertUnwindSafe(|| f(&mut *engine))) {
                Ok(r) => r,
                Err(p) => {
                    engine.recover_after_panic();
                    Err(Error::from_panic(p))
                }
            };
            let logs = engine.take_logs();
            drop(slot);
            Ok((out, logs, self.wake_waiters()))
        })?;
        run_wakes(wakes);
        if reopened {
            self.start_flusher()?;
        }
        emit(logs);
        out
    }

    /// Runs a hot-path operation with group commit: callers that queue while another
    /// holds the engine lock are served together by whichever takes the lock next,
    /// in one section and one commit. Each still sees the others' effects in order.
    pub fn batch(&self, op: BatchOp) -> BatchOut {
        let mut reopened = false;
        let served = self.guard(|| {
            let job = Arc::new(Job { op: Mutex::new(Some(op)), out: Mutex::new(None) });
            lock(&self.shared.queue).push(job.clone());
            let mut slot = lock(&self.shared.engine);
            if let Some(out) = lock(&job.out).take() {
                // A caller that held the lock before us already ran our operation.
                return Ok((out, Vec::new(), Vec::new()));
            }
            let ready = self.ready(&mut slot);
            reopened = ready.as_ref().is_ok_and(|r| *r);
            let jobs: Vec<Arc<Job>> = std::mem::take(&mut *lock(&self.shared.queue));
            let ops: Vec<BatchOp> = jobs.iter().filter_map(|j| lock(&j.op).take()).collect();
            // Only a lease that ends can free capacity: a waiter's own try does not wake
            // the waiters (it would keep them from ever sleeping).
            let frees = ops.iter().any(|op| matches!(op, BatchOp::Success { .. } | BatchOp::Release(_)));
            let n = ops.len();
            let all = |e: &Error| (0..n).map(|_| BatchOut::Done(Err(e.clone()))).collect();
            let outs: Vec<BatchOut> = match (&ready, slot.as_mut()) {
                (Err(e), _) => all(e),
                (Ok(_), None) => all(&Error::Closed),
                (Ok(_), Some(engine)) => match catch_unwind(AssertUnwindSafe(|| engine.run_batch(ops))) {
                    Ok(outs) => outs,
                    Err(p) => {
                        engine.recover_after_panic();
                        all(&Error::from_panic(p))
                    }
                },
            };
            for (j, o) in jobs.iter().zip(outs) {
                *lock(&j.out) = Some(o);
            }
            let logs = slot.as_mut().map(Engine::take_logs).unwrap_or_default();
            drop(slot);
            let wakes = if frees { self.wake_waiters() } else { Vec::new() };
            let out = lock(&job.out).take();
            Ok((out.unwrap_or(BatchOut::Done(Err(Error::Internal("lost batch result".into())))), logs, wakes))
        });
        let (out, logs, wakes) = match served {
            Ok(v) => v,
            Err(e) => return BatchOut::Done(Err(e)),
        };
        run_wakes(wakes);
        if reopened {
            if let Err(e) = self.start_flusher() {
                return BatchOut::Done(Err(e));
            }
        }
        emit(logs);
        out
    }

    /// SPEC 18.5: the `Lease` object of live lease `id` went away unended: the lease
    /// counts until `lease_max_age_ms`, and `close()` leaves it alone. A closed engine
    /// has nothing to forget.
    pub fn forget_lease(&self, id: i64) {
        let _ = self.guard(|| {
            if let Some(e) = lock(&self.shared.engine).as_mut() {
                e.forget_lease(id);
            }
            Ok(())
        });
    }

    pub fn is_closed(&self) -> bool {
        let _pass = GATE.pass();
        lock(&self.shared.engine).is_none() && !self.shared.forked.load(Ordering::Acquire)
    }

    /// One probe pass (SPEC §11). The validator and `jitter` run with no engine lock
    /// held; passes never overlap. Called from inside a pass (its validator, or what
    /// that calls), it is [`Error::Runtime`] (SPEC 18.3): waiting for the running pass
    /// would wait for itself.
    pub fn run_probe_pass(
        &self,
        validator: &dyn Validator,
        jitter: &mut dyn FnMut() -> f64,
        max_probes: usize,
    ) -> Result<ProbePassResult> {
        if in_probe_pass(self.id()) {
            return Err(pass_running());
        }
        self.boundary(|| self.probe_pass(validator, jitter, max_probes, None))
    }

    fn probe_pass(
        &self,
        validator: &dyn Validator,
        jitter: &mut dyn FnMut() -> f64,
        max_probes: usize,
        flags: Option<&(Mutex<ProbeFlags>, Condvar)>,
    ) -> Result<ProbePassResult> {
        let _inside = InPass::enter(self.id());
        let _running = PassRunning::wait(&self.shared.pass_running);
        let (cds, now) = self.with(|e| Ok((e.probeable_cooldowns()?, e.now_ms())))?;
        let due = {
            let _pass = GATE.pass();
            lock(&self.shared.probe).plan(&cds, now, max_probes, jitter)
        };
        let mut result = ProbePassResult::default();
        for key in due {
            // Another engine of the fleet probes this key now: leave it to that one.
            if !self.with(|e| Ok(e.claim_probe(key, PROBE_CLAIM_MS)))? {
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
            let cleared = self.with(|e| {
                let now = e.now_ms();
                lock(&self.shared.probe).record(key, passed, now);
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
        self.guard(|| self.start_probe_thread(validator, interval, max_per_pass))
    }

    fn start_probe_thread(
        &self,
        validator: Arc<dyn Validator>,
        interval: Duration,
        max_per_pass: usize,
    ) -> Result<bool> {
        let mut slot = lock(&self.shared.probe_thread);
        if let Some(t) = slot.as_ref() {
            if !lock(&t.stop.0).done {
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
                    let pass =
                        me.boundary(|| me.probe_pass(&*validator, &mut jitter, max_per_pass, Some(&f2)));
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
    pub fn stop_probe(&self) -> Result<()> {
        self.guard(|| {
            self.stop_probe_thread();
            Ok(())
        })
    }

    fn stop_probe_thread(&self) {
        let t = lock(&self.shared.probe_thread).take();
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

    pub fn probe_running(&self) -> Result<bool> {
        self.guard(|| Ok(lock(&self.shared.probe_thread).as_ref().is_some_and(|t| !lock(&t.stop.0).done)))
    }

    /// Stops the flusher, writes what is buffered, closes the store. Idempotent.
    pub fn close(&self) -> Result<()> {
        self.guard(|| {
            self.stop_probe_thread();
            self.shared.stop.store(true, Ordering::Release);
            let flusher = lock(&self.shared.flusher).take();
            if let Some(t) = flusher {
                t.thread().unpark();
                let _ = t.join();
            }
            let engine = lock(&self.shared.engine).take();
            // A forked child's engine that was never opened there stays closed.
            self.shared.forked.store(false, Ordering::Release);
            if let Some(mut e) = engine {
                let _ = catch_unwind(AssertUnwindSafe(|| e.close()));
                emit(e.take_logs());
            }
            // Every wait ends: its next try finds the engine closed.
            Ok(self.bump_waiting(|_| ()))
        })
        .map(run_wakes)
    }

    // ---- waiting for capacity (SPEC 17.2) ------------------------------------------

    /// Inside a gate pass: changes the wait queue and wakes every waiter; returns the
    /// async waiters' callbacks, for the caller to run once out of the pass.
    #[must_use]
    fn bump_waiting(&self, f: impl FnOnce(&mut Waiting)) -> Vec<Wake> {
        let mut w = lock(&self.shared.waiting);
        f(&mut w);
        w.generation = w.generation.wrapping_add(1);
        self.shared.wake.notify_all();
        std::mem::take(&mut w.wakes)
    }

    /// After a call that may have ended a lease: wakes the waiters, if any.
    #[must_use]
    fn wake_waiters(&self) -> Vec<Wake> {
        if self.shared.waiters.load(Ordering::Acquire) > 0 {
            self.bump_waiting(|_| ())
        } else {
            Vec::new()
        }
    }

    /// Runs `wake` at the next move of the waiting generation past `generation` (at
    /// once when it has moved already): how an async waiter learns that this engine
    /// may have freed capacity without blocking a thread on it.
    pub(crate) fn on_wake(&self, generation: u64, wake: Wake) {
        let now = {
            let _pass = GATE.pass();
            let mut w = lock(&self.shared.waiting);
            if w.generation == generation {
                w.wakes.push(wake);
                None
            } else {
                Some(wake)
            }
        };
        if let Some(wake) = now {
            wake();
        }
    }

    /// Whether any call of this engine waits for capacity.
    pub(crate) fn has_waiters(&self) -> bool {
        self.shared.waiters.load(Ordering::Acquire) > 0
    }

    /// Joins the wait queue; returns the ticket.
    pub(crate) fn enqueue_waiter(&self, priority: i64, keys: Vec<(String, i64)>) -> u64 {
        let _pass = GATE.pass();
        self.shared.waiters.fetch_add(1, Ordering::AcqRel);
        let mut w = lock(&self.shared.waiting);
        let t = w.next_ticket;
        w.next_ticket += 1;
        w.queue.insert(t, (priority, keys));
        t
    }

    /// Leaves the wait queue (admitted, given up or cancelled): the next may go.
    pub(crate) fn dequeue_waiter(&self, ticket: u64) {
        let wakes = {
            let _pass = GATE.pass();
            let mut removed = false;
            let wakes = self.bump_waiting(|w| removed = w.queue.remove(&ticket).is_some());
            if removed {
                self.shared.waiters.fetch_sub(1, Ordering::AcqRel);
            }
            wakes
        };
        run_wakes(wakes);
    }

    /// The waiting generation, and whether `ticket` is first in line among the waiters
    /// on any of its keys: none of a smaller priority number waits on one, nor an
    /// earlier one of its own priority (SPEC 22.1).
    pub(crate) fn waiter_turn(&self, ticket: u64) -> (u64, bool) {
        let _pass = GATE.pass();
        let w = lock(&self.shared.waiting);
        let Some((prio, mine)) = w.queue.get(&ticket) else { return (w.generation, true) };
        let ahead = |t: &u64, p: &i64| (*p, *t) < (*prio, ticket);
        let first =
            !w.queue.iter().any(|(t, (p, keys))| ahead(t, p) && keys.iter().any(|k| mine.contains(k)));
        (w.generation, first)
    }

    /// Sleeps up to `nap`, or until the waiting generation moves past `generation` (a
    /// lease of this engine ended, a waiter left, the engine closed). Inside a gate pass:
    /// a fork waits for it (at most `nap`) rather than inherit its lock.
    pub(crate) fn nap_waiter(&self, generation: u64, nap: Duration) {
        let _pass = GATE.pass();
        let w = lock(&self.shared.waiting);
        if w.generation == generation {
            let _ = self.shared.wake.wait_timeout_while(w, nap, |w| w.generation == generation);
        }
    }

    /// The engine's clock, read without its lock.
    pub(crate) fn clock_now_ms(&self) -> i64 {
        self.shared.clock.now_ms()
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

/// The live engines (for the fork hooks; the gate is closed and drained).
fn live() -> Vec<Arc<Shared>> {
    lock(&LIVE).iter().filter_map(Weak::upgrade).collect()
}

/// Before a fork, no call inside any engine: each ends its held write lock and writes
/// its buffer, so that no transaction is open across the fork and a child inherits
/// nothing to write.
pub(crate) fn rest_all() {
    for s in live() {
        if let Some(e) = lock(&s.engine).as_mut() {
            let _ = catch_unwind(AssertUnwindSafe(|| e.prepare_fork()));
        }
    }
}

/// In the child just after a fork (its only thread, no call inside): each engine lets
/// go of its inherited store without touching what the parent uses, forgets the
/// parent's threads and their queued calls, and opens its store anew at its next call.
pub(crate) fn forget_parent_all() {
    for s in live() {
        {
            let mut slot = lock(&s.engine);
            if let Some(e) = slot.as_mut() {
                let keep = catch_unwind(AssertUnwindSafe(|| e.after_fork())).unwrap_or(false);
                if !keep {
                    // Its store has let go of everything shared: the rest is memory.
                    *slot = None;
                }
                s.forked.store(true, Ordering::Release);
            }
        }
        lock(&s.queue).clear();
        // The parent's waiting threads are not in this process (nor are their loops:
        // their callbacks are forgotten, not run).
        std::mem::forget(std::mem::take(&mut lock(&s.waiting).wakes));
        *lock(&s.waiting) = Waiting::default();
        s.waiters.store(0, Ordering::Release);
        // Threads of the parent: not in this process (joining one would fail).
        std::mem::forget(lock(&s.flusher).take());
        std::mem::forget(lock(&s.probe_thread).take());
        *lock(&s.probe) = ProbeState::default();
        s.pass_running.store(false, Ordering::Release);
        s.stop.store(false, Ordering::Release);
        s.epoch.fetch_add(1, Ordering::SeqCst);
    }
}
