//! The calls of one engine waiting for capacity (SPEC 17.2, 24.5): a queue by the
//! capacity that refused them, never by key (first come, first served and a smaller
//! priority number first among the waiters for one capacity), and a generation that
//! moves whenever this engine may have freed some (a lease ended, a waiter left, the
//! engine closed).
use super::boundary::lock;
use crate::core::capacity::{Capacity, Spot};
use crate::core::fork::TURNSTILE;
use crate::core::tenants::TenantList;
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

/// A waiting call's place in the queue (SPEC 24.5).
pub(crate) struct Place {
    /// SPEC 22.1: 0 the most important.
    pub priority: i64,
    /// Its candidates (one for a `lease()`), with their keys' accounts.
    pub spots: Vec<Spot>,
    /// Whom it is made for (SPEC 23.2).
    pub tenants: TenantList,
    /// What each candidate waits for: the capacity its last refusal named; before its
    /// first, the capacity a waiter ahead holds it behind (so that those who come
    /// after it for that capacity come after it); `None` while nothing is known.
    waits_for: Vec<Option<Capacity>>,
}

impl Place {
    pub(crate) fn new(priority: i64, spots: Vec<Spot>, tenants: TenantList) -> Place {
        let waits_for = vec![None; spots.len()];
        Place { priority, spots, tenants, waits_for }
    }
}

/// The queue of calls waiting for capacity: among the waiters for one capacity, a
/// smaller priority number first (SPEC 22.1), first come, first served within one
/// priority (SPEC 17.2, 24.5).
#[derive(Default)]
struct Waiting {
    next_ticket: u64,
    /// Ticket -> its place.
    queue: BTreeMap<u64, Place>,
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
    pub(crate) fn enqueue(&self, place: Place) -> u64 {
        let _pass = TURNSTILE.pass();
        self.count.fetch_add(1, Ordering::AcqRel);
        let mut w = lock(&self.waiting);
        let t = w.next_ticket;
        w.next_ticket += 1;
        w.queue.insert(t, place);
        t
    }

    /// After a refusal: what the candidates tried wait for now (candidate index, the
    /// capacity its refusal named).
    pub(crate) fn refused(&self, ticket: u64, waits_for: Vec<(usize, Option<Capacity>)>) {
        let _pass = TURNSTILE.pass();
        let mut w = lock(&self.waiting);
        if let Some(place) = w.queue.get_mut(&ticket) {
            for (i, c) in waits_for {
                if let Some(slot) = place.waits_for.get_mut(i) {
                    *slot = c;
                }
            }
        }
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

    /// The waiting generation, and which candidates of `ticket` are held (by index;
    /// empty when it does not queue): those whose admission would draw on a capacity
    /// a waiter ahead of it waits for, one of a smaller priority number or an earlier
    /// one of its own (SPEC 22.1, 24.5). A candidate held before its first refusal
    /// takes what holds it as what it waits for.
    pub(crate) fn turn(&self, ticket: u64) -> (u64, Vec<bool>) {
        let _pass = TURNSTILE.pass();
        let mut w = lock(&self.waiting);
        let generation = w.generation;
        let Some(me) = w.queue.get(&ticket) else { return (generation, Vec::new()) };
        let mine = (me.priority, ticket);
        let mut held = vec![false; me.spots.len()];
        let mut adopt: Vec<(usize, Capacity)> = Vec::new();
        for (t, other) in &w.queue {
            if (other.priority, *t) >= mine {
                continue;
            }
            for c in other.waits_for.iter().flatten() {
                for (i, spot) in me.spots.iter().enumerate() {
                    if !held[i] && spot.draws_on(&me.tenants, c) {
                        held[i] = true;
                        if me.waits_for[i].is_none() {
                            adopt.push((i, c.clone()));
                        }
                    }
                }
            }
        }
        if let Some(me) = w.queue.get_mut(&ticket) {
            for (i, c) in adopt {
                me.waits_for[i] = Some(c);
            }
        }
        (generation, held)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::error::{Reason, Refusal};
    use crate::core::limits::Scope;
    use crate::core::types::Route;
    use std::sync::Arc;

    fn spot(model: &str, key: i64) -> Spot {
        Spot::new(&Route { platform: "p".into(), model_id: model.into(), key_id: key }, Arc::from("org"))
    }

    /// What a refusal of `spot` by a model's account-scope window waits for.
    fn model_window(s: &Spot) -> Option<Capacity> {
        s.refused_by(&Refusal {
            reason: Reason::declared("rpm"),
            retry_at_ms: None,
            platform: s.platform.to_string(),
            model_id: s.model_id.to_string(),
            key_id: s.key_id,
            tenant: None,
            scope: Some(Scope::Account),
            candidates: Vec::new(),
        })
    }

    fn place(priority: i64, spots: Vec<Spot>) -> Place {
        Place::new(priority, spots, TenantList::from([]))
    }

    #[test]
    fn a_candidate_is_held_only_behind_a_waiter_ahead_for_a_capacity_it_draws_on() {
        let w = Waiters::new();
        let (full1, full2, free1) = (spot("full", 1), spot("full", 2), spot("free", 1));
        // An earlier waiter on the full model, refused by its account-wide window.
        let first = w.enqueue(place(1, vec![full1.clone()]));
        w.refused(first, vec![(0, model_window(&full1))]);
        // A later one on the same model through another key of the account, and on a free
        // model of the first's key: only the first candidate is held.
        let later = w.enqueue(place(1, vec![full2.clone(), free1.clone()]));
        assert_eq!(w.turn(later).1, vec![true, false]);
        assert_eq!(w.turn(first).1, vec![false]);
        // A more important one, later, is held by nobody; the first is now held behind it
        // once it waits for the window too, and nobody is held once it leaves.
        let urgent = w.enqueue(place(0, vec![full2.clone()]));
        assert_eq!(w.turn(urgent).1, vec![false]);
        assert_eq!(w.turn(first).1, vec![false]);
        w.refused(urgent, vec![(0, model_window(&full2))]);
        assert_eq!(w.turn(first).1, vec![true]);
        w.dequeue(urgent);
        assert_eq!(w.turn(first).1, vec![false]);
        // A candidate held before its first refusal waits for what holds it: a waiter that
        // comes after it for that capacity comes after it.
        let fresh = w.enqueue(place(1, vec![free1, full1.clone()]));
        assert_eq!(w.turn(fresh).1, vec![false, true]);
        w.dequeue(first);
        let last = w.enqueue(place(1, vec![full1]));
        assert_eq!(w.turn(last).1, vec![true]);
        // Not in the queue: nothing held.
        assert!(w.turn(u64::MAX).1.is_empty());
    }
}
