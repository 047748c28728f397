//! What a process that forks does with its engines (gunicorn `--preload`, Celery's
//! prefork pool, `multiprocessing` with "fork").
//!
//! Every call into any engine of the process passes one [`Turnstile`]. Before a fork,
//! the forking thread closes the turnstile and waits until no call is inside any
//! engine: then no thread holds an engine's lock, its probe state or its queue, and no
//! SQLite transaction or Redis round trip is half done. A probe's validator (the user's
//! code, which may take long or hang) runs outside the turnstile and holds no lock, so
//! a fork never waits for it. It then ends each engine's held write lock and writes its
//! buffer ([`crate::core::engine::Engine::prepare_fork`]), so the child inherits
//! nothing to write. In the parent the turnstile opens again; in the child each engine
//! first lets go of the store it inherited (without writing or unlocking anything the
//! parent uses) and of the parent's threads, then the turnstile opens: each engine
//! opens its store anew at its first call there. (A turnstile, not a gate: the gates
//! are admission's, `core::admission`.)
//!
//! The engine's own locks are `std::sync` ones (a futex word each): a forked child sees
//! them unlocked, whatever threads the parent had waiting. `parking_lot` keeps waiting
//! threads in a process-wide table that a child inherits half-written; it is not used
//! for anything a child may wait on.
//!
//! The turnstile costs two atomic increments per call and no system call; the fork hooks are
//! called by the Python layer (`os.register_at_fork`). They reach the engines through
//! the registry beside them: every engine registers itself ([`register`]) as a
//! [`Forkable`], what the hooks do with one engine.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::Duration;

/// Calls into the engines of the process, and whether a fork is being prepared.
pub struct Turnstile {
    inside: AtomicUsize,
    closed: AtomicBool,
    lock: Mutex<()>,
    opened: Condvar,
}

/// The process's one turnstile.
pub static TURNSTILE: Turnstile = Turnstile::new();

/// One fork at a time: held from `before_fork` to the hook after it (by the forking
/// thread, which is also the child's only thread).
static FORKS: Mutex<()> = Mutex::new(());

thread_local! {
    /// Passes this thread holds (calls nest: a probe's validator may call the engine).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static FORKING: std::cell::RefCell<Option<std::sync::MutexGuard<'static, ()>>> =
        const { std::cell::RefCell::new(None) };
}

/// A call through the turnstile; leaving drops it.
pub struct Pass(());

impl Turnstile {
    const fn new() -> Turnstile {
        Turnstile {
            inside: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            opened: Condvar::new(),
        }
    }

    /// Enters (waiting while a fork is being prepared, unless this thread is inside already).
    pub fn pass(&'static self) -> Pass {
        let depth = DEPTH.with(Cell::get);
        if depth == 0 {
            loop {
                self.inside.fetch_add(1, Ordering::SeqCst);
                if !self.closed.load(Ordering::SeqCst) {
                    break;
                }
                // A fork is being prepared: step out and wait until it is done.
                self.inside.fetch_sub(1, Ordering::SeqCst);
                let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
                while self.closed.load(Ordering::SeqCst) {
                    g = self.opened.wait(g).unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
        DEPTH.with(|d| d.set(depth + 1));
        Pass(())
    }

    /// Closes the turnstile and waits until no other thread is inside.
    fn close_and_drain(&self) {
        let mine = usize::from(DEPTH.with(Cell::get) > 0);
        self.closed.store(true, Ordering::SeqCst);
        while self.inside.load(Ordering::SeqCst) > mine {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn open(&self) {
        let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_all();
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let depth = DEPTH.with(Cell::get).saturating_sub(1);
        DEPTH.with(|d| d.set(depth));
        if depth == 0 {
            TURNSTILE.inside.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What the fork hooks do with one engine of the process.
pub trait Forkable: Send + Sync {
    /// Before a fork, no call inside any engine (the gate is closed and drained): come
    /// to rest, so that no transaction is open across the fork and a child inherits
    /// nothing to write.
    fn rest(&self);
    /// In the child just after a fork (its only thread, no call inside): let go of what
    /// was inherited without touching what the parent uses, and forget the parent's
    /// threads and their queued calls.
    fn forget_parent(&self);
}

/// Every engine of the process, for the fork hooks.
static LIVE: Mutex<Vec<Weak<dyn Forkable>>> = Mutex::new(Vec::new());

/// Registers an engine with the fork hooks, for as long as it lives.
pub fn register(engine: Weak<dyn Forkable>) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|w| w.strong_count() > 0);
    live.push(engine);
}

/// The live engines.
fn live() -> Vec<Arc<dyn Forkable>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect()
}

/// Before `fork()`, in the forking thread (not holding the GIL): waits until no call is
/// inside an engine and keeps new ones out, then brings every engine to rest.
pub fn before_fork() {
    let one = FORKS.lock().unwrap_or_else(PoisonError::into_inner);
    FORKING.with(|f| *f.borrow_mut() = Some(one));
    TURNSTILE.close_and_drain();
    for engine in live() {
        engine.rest();
    }
}

/// After `fork()` in the parent: calls go on.
pub fn after_fork_in_parent() {
    if FORKING.with(|f| f.borrow_mut().take()).is_some() {
        TURNSTILE.open();
    }
}

/// After `fork()` in the child: every engine lets go of what it inherited, then calls go on.
pub fn after_fork_in_child() {
    if FORKING.with(|f| f.borrow_mut().take()).is_some() {
        for engine in live() {
            engine.forget_parent();
        }
        TURNSTILE.open();
    }
}
