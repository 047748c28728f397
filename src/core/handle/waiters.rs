//! The calls of one engine waiting for capacity (SPEC 17.2): a queue, first come, first
//! served among the waiters on a common key, and a generation that moves whenever this
//! engine may have freed some (a lease ended, a waiter left, the engine closed).
use super::boundary::lock;
use crate::core::fork::TURNSTILE;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A one-shot callback of a waiter that does not block on the condition variable (an
/// async one), run when the waiting generation moves: outside every lock and gate pass
/// (it may take the GIL).
pub type Wake = Box<dyn FnOnce() + Send>;

/// Runs async waiters' callbacks (outside every lock and gate pass).
pub(crate) fn run_wakes(wakes: Vec<Wake>) {
    for w in wakes {
        w();
    }
}

/// The queue of calls waiting for capacity: a smaller priority number first (SPEC
/// 22.1), first come, first served within one priority.
#[derive(Default)]
struct Waiting {
    next_ticket: u64,
    /// Ticket -> its priority and the keys `(platform, key_id)` it waits on.
    queue: BTreeMap<u64, (i64, Vec<(String, i64)>)>,
    /// Bumped whenever a lease of this engine ends, a waiter leaves, or it closes.
    generation: u64,
    /// Callbacks to run at the next bump.
    wakes: Vec<Wake>,
}

/// The waiters of one engine; `count` counts them so that a call wakes nobody cheaply.
pub(crate) struct Waiters {
    waiting: Mutex<Waiting>,
    wake: Condvar,
    count: AtomicUsize,
}

impl Waiters {
    pub(crate) fn new() -> Waiters {
        Waiters { waiting: Mutex::new(Waiting::default()), wake: Condvar::new(), count: AtomicUsize::new(0) }
    }

    /// Inside a gate pass: changes the wait queue and wakes every waiter; returns the
    /// async waiters' callbacks, for the caller to run once out of the pass.
    #[must_use]
    fn bump(&self, f: impl FnOnce(&mut Waiting)) -> Vec<Wake> {
        let mut w = lock(&self.waiting);
        f(&mut w);
        w.generation = w.generation.wrapping_add(1);
        self.wake.notify_all();
        std::mem::take(&mut w.wakes)
    }

    /// Inside a gate pass: wakes every waiter (the engine closed: each wait's next try
    /// finds it closed); returns the async waiters' callbacks.
    #[must_use]
    pub(crate) fn wake_all(&self) -> Vec<Wake> {
        self.bump(|_| ())
    }

    /// After a call that may have ended a lease: wakes the waiters, if any.
    #[must_use]
    pub(crate) fn wake_if_any(&self) -> Vec<Wake> {
        if self.any() {
            self.wake_all()
        } else {
            Vec::new()
        }
    }

    /// Runs `wake` at the next move of the waiting generation past `generation` (at
    /// once when it has moved already): how an async waiter learns that this engine
    /// may have freed capacity without blocking a thread on it.
    pub(crate) fn on_wake(&self, generation: u64, wake: Wake) {
        let now = {
            let _pass = TURNSTILE.pass();
            let mut w = lock(&self.waiting);
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

    /// Whether any call waits for capacity.
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// Joins the wait queue; returns the ticket.
    pub(crate) fn enqueue(&self, priority: i64, keys: Vec<(String, i64)>) -> u64 {
        let _pass = TURNSTILE.pass();
        self.count.fetch_add(1, Ordering::AcqRel);
        let mut w = lock(&self.waiting);
        let t = w.next_ticket;
        w.next_ticket += 1;
        w.queue.insert(t, (priority, keys));
        t
    }

    /// Leaves the wait queue (admitted, given up or cancelled): the next may go.
    pub(crate) fn dequeue(&self, ticket: u64) {
        let wakes = {
            let _pass = TURNSTILE.pass();
            let mut removed = false;
            let wakes = self.bump(|w| removed = w.queue.remove(&ticket).is_some());
            if removed {
                self.count.fetch_sub(1, Ordering::AcqRel);
            }
            wakes
        };
        run_wakes(wakes);
    }

    /// The waiting generation, and whether `ticket` is first in line among the waiters
    /// on any of its keys: none of a smaller priority number waits on one, nor an
    /// earlier one of its own priority (SPEC 22.1).
    pub(crate) fn turn(&self, ticket: u64) -> (u64, bool) {
        let _pass = TURNSTILE.pass();
        let w = lock(&self.waiting);
        let Some((prio, mine)) = w.queue.get(&ticket) else { return (w.generation, true) };
        let ahead = |t: &u64, p: &i64| (*p, *t) < (*prio, ticket);
        let first =
            !w.queue.iter().any(|(t, (p, keys))| ahead(t, p) && keys.iter().any(|k| mine.contains(k)));
        (w.generation, first)
    }

    /// Sleeps up to `nap`, or until the waiting generation moves past `generation` (a
    /// lease of this engine ended, a waiter left, the engine closed). Inside a gate pass:
    /// a fork waits for it (at most `nap`) rather than inherit its lock.
    pub(crate) fn nap(&self, generation: u64, nap: Duration) {
        let _pass = TURNSTILE.pass();
        let w = lock(&self.waiting);
        if w.generation == generation {
            let _ = self.wake.wait_timeout_while(w, nap, |w| w.generation == generation);
        }
    }

    /// In a forked child: the parent's waiting threads are not in this process (nor are
    /// their loops: their callbacks are forgotten, not run).
    pub(crate) fn forget_parent(&self) {
        std::mem::forget(std::mem::take(&mut lock(&self.waiting).wakes));
        *lock(&self.waiting) = Waiting::default();
        self.count.store(0, Ordering::Release);
    }
}
