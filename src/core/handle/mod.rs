//! A thread-safe handle on an engine: one lock, panics turned into errors, log records
//! emitted after the lock is released, and what a forked child does with the engine it
//! inherited ([`crate::core::fork`]). Its parts own their state, each in its file:
//!
//! * [`boundary`]: the one way in, [`Handle::guard`] (also [`Handle::with`] and
//!   [`Handle::batch`], which use it): the fork gate, and a panic inside turned into
//!   [`Error::Internal`];
//! * [`queue`]: group commit of the hot path;
//! * [`waiters`]: the calls waiting for capacity, queued by capacity (SPEC 17.2, 24.5);
//! * [`flusher`] and [`prober`]: the background threads (grouped writes, SPEC §11's probe).
//!
//! The locks are `std::sync` ones so that a forked child finds them in a usable state
//! (see `fork.rs`).
mod boundary;
mod flusher;
mod prober;
mod queue;
mod waiters;

pub use prober::{default_jitter, in_probe_pass, pass_running, ProbePassResult};
pub use waiters::Wake;

use crate::core::capacity::Capacity;
use crate::core::clock::Clock;
use crate::core::engine::{BatchOp, BatchOut, Engine, LogRecord, Settings, StoreSpec};
use crate::core::error::{Error, Result};
use crate::core::fork::{self, Forkable, TURNSTILE};
use crate::core::probe::Validator;
use crate::core::stats::{HandleCounters, Stats};
use boundary::{caught, lock, Boundary};
use flusher::Flusher;
use prober::{Host, Prober};
use queue::CommitQueue;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
pub(crate) use waiters::Place;
use waiters::{run_wakes, Waiters};

/// Locks are taken in this order: the probe's thread, `engine`, the probe's state, the
/// queue, the flusher's thread, the waiters; each only inside a pass of the fork gate,
/// and none across a validator call.
struct Shared {
    engine: Mutex<Option<Engine>>,
    boundary: Boundary,
    /// Hot-path operations waiting for the engine lock (group commit).
    queue: CommitQueue,
    /// Calls waiting for capacity (SPEC 17.2), woken when this engine may have freed some.
    waiters: Waiters,
    flusher: Flusher,
    /// SPEC 24.1: renews the live leases of the engine's `Lease` objects.
    renewer: Flusher,
    prober: Prober,
    /// How to open the engine again (in a forked child).
    spec: StoreSpec,
    clock: Arc<dyn Clock>,
    settings: Settings,
    /// In a forked child until its first call: the engine is to be opened anew
    /// (`engine` is `None`, or an in-memory engine that stays) and its flusher started.
    forked: AtomicBool,
    /// Bumped in the child by every fork: a lease taken before belongs to the parent.
    epoch: AtomicU64,
    /// SPEC 27.1: the refusals raised and the waits, counted without the engine's lock.
    counters: HandleCounters,
}

impl Forkable for Shared {
    /// Before a fork, no call inside: ends the held write lock and writes the buffer,
    /// so that no transaction is open across the fork and a child inherits nothing to
    /// write.
    fn rest(&self) {
        if let Some(e) = lock(&self.engine).as_mut() {
            let _ = catch_unwind(AssertUnwindSafe(|| e.prepare_fork()));
        }
    }

    /// In the child just after a fork (its only thread, no call inside): lets go of the
    /// inherited store without touching what the parent uses, forgets the parent's
    /// threads and their queued calls, and opens the store anew at the next call.
    fn forget_parent(&self) {
        {
            let mut slot = lock(&self.engine);
            if let Some(e) = slot.as_mut() {
                let keep = catch_unwind(AssertUnwindSafe(|| e.after_fork())).unwrap_or(false);
                if !keep {
                    // Its store has let go of everything shared: the rest is memory.
                    *slot = None;
                }
                self.forked.store(true, Ordering::Release);
            }
        }
        self.queue.forget_parent();
        self.waiters.forget_parent();
        self.flusher.forget_parent();
        self.renewer.forget_parent();
        self.prober.forget_parent();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.counters.reset();
    }
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
    caught(|| Engine::open(spec, clock, settings))
}

impl Handle {
    pub fn open(spec: &StoreSpec, clock: Arc<dyn Clock>, settings: Settings) -> Result<Handle> {
        let _pass = TURNSTILE.pass();
        let mut engine = open_engine(spec, clock.clone(), settings.clone())?;
        emit(engine.take_logs());
        let handle = Handle {
            shared: Arc::new(Shared {
                engine: Mutex::new(Some(engine)),
                boundary: Boundary::new(),
                queue: CommitQueue::new(),
                waiters: Waiters::new(),
                flusher: Flusher::new(),
                renewer: Flusher::new(),
                prober: Prober::new(),
                spec: spec.clone(),
                clock,
                settings,
                forked: AtomicBool::new(false),
                epoch: AtomicU64::new(0),
                counters: HandleCounters::default(),
            }),
        };
        handle.start_flusher()?;
        handle.start_renewer()?;
        let weak: Weak<Shared> = Arc::downgrade(&handle.shared);
        fork::register(weak);
        Ok(handle)
    }

    /// Starts the background flusher when writes are grouped (`flush_interval_ms > 0`).
    fn start_flusher(&self) -> Result<()> {
        let s = &self.shared;
        let flush_ms = s.settings.flush_interval_ms;
        if flush_ms <= 0 || s.settings.readonly {
            return Ok(());
        }
        let Some(tick) = lock(&s.engine).as_ref().map(Engine::tick_period) else { return Ok(()) };
        let weak = Arc::downgrade(s);
        let period = Duration::from_millis(flush_ms as u64);
        let mut last_flush = std::time::Instant::now();
        // Wakes every hold period (a write lock kept across calls ends on time even when
        // no call comes), flushes every `flush_interval_ms`.
        s.flusher.start("quotaengine-flush", tick, move || {
            let Some(shared) = weak.upgrade() else { return false };
            let logs = {
                let _pass = TURNSTILE.pass();
                let mut g = lock(&shared.engine);
                let Some(e) = g.as_mut() else { return false };
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
            true
        })
    }

    /// SPEC 24.1: starts the thread that renews the engine's live leases at least every
    /// `lease_max_age_ms / 4` of real time (not on a read-only engine, which takes none).
    fn start_renewer(&self) -> Result<()> {
        let s = &self.shared;
        if s.settings.readonly {
            return Ok(());
        }
        let quarter = (s.settings.lease_max_age_ms / 4).clamp(10, 3_600_000);
        let weak = Arc::downgrade(s);
        s.renewer.start("quotaengine-renew", Duration::from_millis(quarter as u64), move || {
            let Some(shared) = weak.upgrade() else { return false };
            let logs = {
                let _pass = TURNSTILE.pass();
                let mut g = lock(&shared.engine);
                let Some(e) = g.as_mut() else { return false };
                let _ = catch_unwind(AssertUnwindSafe(|| e.renew_leases(true)));
                e.take_logs()
            };
            emit(logs);
            true
        })
    }

    /// The one boundary: the fork gate, then `f`, a panic inside it turned into
    /// [`Error::Internal`].
    pub fn guard<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.shared.boundary.guard(f)
    }

    /// A panic inside `f` turned into [`Error::Internal`], without the fork gate: for
    /// what takes several steps on the engine, each passing the gate itself (a wait's
    /// step).
    pub(crate) fn shielded<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.shared.boundary.shield(f)
    }

    /// Test hook: the next `n` calls into the engine panic inside the boundary.
    pub fn inject_panics(&self, n: u32) {
        self.shared.boundary.inject_panics(n);
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

    /// The one locked entry of [`Handle::with`] and [`Handle::batch`]: `before` runs
    /// inside the fork gate before the engine lock is taken (a batch queues its
    /// operation there), then `f` under the lock (its [`Entry`] opens the engine anew
    /// in a forked child, when asked for it); `f` says whether what it did may free
    /// capacity a waiter waits for. Once the lock is released: those waiters woken,
    /// the flusher of an engine opened anew started, the engine's log records emitted.
    fn locked<B, T>(
        &self, before: impl FnOnce() -> B, f: impl FnOnce(B, &mut Entry<'_>) -> (T, bool),
    ) -> Result<T> {
        let mut reopened = false;
        let (out, logs, wakes) = self.guard(|| {
            let b = before();
            let mut entry = Entry { handle: self, slot: lock(&self.shared.engine), reopened: false };
            let (out, frees) = f(b, &mut entry);
            reopened = entry.reopened;
            let logs = entry.slot.as_mut().map(Engine::take_logs).unwrap_or_default();
            drop(entry);
            let wakes = if frees { self.shared.waiters.wake_if_any() } else { Vec::new() };
            Ok((out, logs, wakes))
        })?;
        run_wakes(wakes);
        if reopened {
            self.start_flusher()?;
            self.start_renewer()?;
        }
        emit(logs);
        Ok(out)
    }

    /// SPEC 27.1: the engine's counters since it was opened (read under its lock by
    /// `engine_stats` when given, so that a caller reading more at once reads them in
    /// the same section), with the refusals and waits counted at the doors.
    pub fn counters(&self) -> &HandleCounters {
        &self.shared.counters
    }

    /// [`Engine::stats`] completed with the handle's counters.
    pub fn complete_stats(&self, mut s: Stats) -> Stats {
        self.shared.counters.read(&mut s);
        s
    }

    /// `stats()`: the engine's counters and the handle's.
    pub fn stats(&self) -> Result<Stats> {
        let s = self.with(|e| Ok(e.stats()))?;
        Ok(self.complete_stats(s))
    }

    /// A refusal about to be raised to a caller (SPEC 27.1 counts it).
    pub fn count_refusal<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(Error::Refused(f)) = &r {
            self.shared.counters.refused(f.reason.as_str());
        }
        r
    }

    /// Runs `f` on the engine under its lock. A panic inside becomes
    /// [`Error::Internal`] and the engine stays usable.
    pub fn with<T>(&self, f: impl FnOnce(&mut Engine) -> Result<T>) -> Result<T> {
        self.locked(
            || (),
            |(), entry| match entry.engine() {
                Ok(engine) => {
                    let out = match catch_unwind(AssertUnwindSafe(|| {
                        // SPEC 24.1: at any call, the leases half their max age old.
                        let _ = engine.renew_due_leases();
                        f(&mut *engine)
                    })) {
                        Ok(r) => r,
                        Err(p) => {
                            engine.recover_after_panic();
                            Err(Error::from_panic(p))
                        }
                    };
                    (out, true)
                }
                Err(e) => (Err(e), false),
            },
        )?
    }

    /// Runs a hot-path operation with group commit ([`queue`]): callers that queue while
    /// another holds the engine lock are served together by whichever takes the lock
    /// next, in one section and one commit.
    pub fn batch(&self, op: BatchOp) -> BatchOut {
        let s = &*self.shared;
        let served = self.locked(
            || s.queue.push(op),
            |job, entry| {
                if let Some(out) = job.take_out() {
                    // A caller that held the lock before us already ran our operation.
                    return (out, false);
                }
                s.queue.serve(&job, entry.engine())
            },
        );
        served.unwrap_or_else(BatchOut::failed)
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
        let _pass = TURNSTILE.pass();
        lock(&self.shared.engine).is_none() && !self.shared.forked.load(Ordering::Acquire)
    }

    /// One probe pass (SPEC §11); from inside a pass, [`Error::Runtime`] (SPEC 18.3).
    pub fn run_probe_pass(
        &self, validator: &dyn Validator, jitter: &mut dyn FnMut() -> f64, max_probes: usize,
    ) -> Result<ProbePassResult> {
        self.shared.prober.run_pass(self, validator, jitter, max_probes)
    }

    /// Starts the background probe; false when one is already running.
    pub fn start_probe(
        &self, validator: Arc<dyn Validator>, interval: Duration, max_per_pass: usize,
    ) -> Result<bool> {
        self.guard(|| self.shared.prober.start(self.clone(), validator, interval, max_per_pass))
    }

    /// Stops the background probe and waits for it to finish, unless it is inside a
    /// validator call or this is the probe thread itself (it then ends on its own).
    pub fn stop_probe(&self) -> Result<()> {
        self.guard(|| {
            self.shared.prober.stop();
            Ok(())
        })
    }

    pub fn probe_running(&self) -> Result<bool> {
        self.guard(|| Ok(self.shared.prober.running()))
    }

    /// Stops the flusher, writes what is buffered, closes the store. Idempotent.
    pub fn close(&self) -> Result<()> {
        let s = &self.shared;
        self.guard(|| {
            s.prober.stop();
            s.flusher.stop();
            s.renewer.stop();
            let engine = lock(&s.engine).take();
            // A forked child's engine that was never opened there stays closed.
            s.forked.store(false, Ordering::Release);
            if let Some(mut e) = engine {
                let _ = catch_unwind(AssertUnwindSafe(|| e.close()));
                emit(e.take_logs());
            }
            // Every wait ends: its next try finds the engine closed.
            Ok(s.waiters.wake_all())
        })
        .map(run_wakes)
    }

    // ---- waiting for capacity (SPEC 17.2): see `waiters` ---------------------------

    /// Runs `wake` at the next move of the waiting generation past `generation`.
    pub(crate) fn on_wake(&self, generation: u64, wake: Wake) {
        self.shared.waiters.on_wake(generation, wake);
    }

    /// Whether any call of this engine waits for capacity.
    pub(crate) fn has_waiters(&self) -> bool {
        self.shared.waiters.any()
    }

    /// Joins the wait queue (SPEC 22.1, 24.5); returns the ticket.
    pub(crate) fn enqueue_waiter(&self, place: Place) -> u64 {
        self.shared.waiters.enqueue(place)
    }

    /// After a refused step: what the candidates it tried wait for now.
    pub(crate) fn waiter_refused(&self, ticket: u64, waits_for: Vec<(usize, Option<Capacity>)>) {
        self.shared.waiters.refused(ticket, waits_for);
    }

    /// Leaves the wait queue (admitted, given up or cancelled): the next may go.
    pub(crate) fn dequeue_waiter(&self, ticket: u64) {
        self.shared.waiters.dequeue(ticket);
    }

    /// The waiting generation, and which candidates of `ticket` wait behind a waiter
    /// ahead of it for a capacity they draw on.
    pub(crate) fn waiter_turn(&self, ticket: u64) -> (u64, Vec<bool>) {
        self.shared.waiters.turn(ticket)
    }

    /// Sleeps up to `nap`, or until the waiting generation moves past `generation`.
    pub(crate) fn nap_waiter(&self, generation: u64, nap: Duration) {
        self.shared.waiters.nap(generation, nap);
    }

    /// The engine's clock, read without its lock.
    pub(crate) fn clock_now_ms(&self) -> i64 {
        self.shared.clock.now_ms()
    }
}

impl Host for Handle {
    fn with_engine<T>(&self, f: impl FnOnce(&mut Engine) -> Result<T>) -> Result<T> {
        self.with(f)
    }

    fn shield<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.shared.boundary.shield(f)
    }

    fn engine_id(&self) -> usize {
        self.id()
    }

    fn engine_closed(&self) -> bool {
        self.is_closed()
    }

    fn prober(&self) -> &Prober {
        &self.shared.prober
    }
}

/// The engine's slot under its lock, in [`Handle::locked`].
struct Entry<'h> {
    handle: &'h Handle,
    slot: MutexGuard<'h, Option<Engine>>,
    /// The engine was opened anew (in a forked child): its flusher is to be started.
    reopened: bool,
}

impl Entry<'_> {
    /// The engine, opened anew first in a forked child.
    fn engine(&mut self) -> Result<&mut Engine> {
        self.reopened = self.handle.ready(&mut self.slot)?;
        self.slot.as_mut().ok_or(Error::Closed)
    }
}
