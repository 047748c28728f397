//! Waiting for capacity (SPEC 17.2): a call to `lease()` / `lease_any()` with a
//! `wait_s` re-runs its gates until one admits it or the wait runs out.
//!
//! A [`Waiter`] is one waiting call. It queues in its engine (a smaller priority number
//! first, then first come, first served among the waiters on a common key, SPEC 22.1;
//! a call that does not wait never queues) and
//! takes steps: each step tries when it is the waiter's turn, and otherwise says how
//! long to nap. The sync binding naps on the engine's wake-up (a lease of this engine
//! ended, a waiter left, the engine closed) with the GIL released; the async one
//! sleeps on the event loop. Both nap at most [`MAX_NAP`], for other processes and for
//! a `ManualClock` another thread moves.
use crate::core::engine::BatchOp;
use crate::core::error::{Error, Reason, Result};
use crate::core::handle::Handle;
use std::time::{Duration, Instant};

/// The longest nap between two looks at the gates.
pub const MAX_NAP: Duration = Duration::from_millis(50);
/// The longest wait the engine takes (SPEC 18.1: 10^12 s; the binding refuses more).
pub const MAX_WAIT: Duration = Duration::from_secs(1_000_000_000_000);
/// The shortest: a retry time already past (a clock another thread moves) is looked at
/// again without spinning.
const MIN_NAP: Duration = Duration::from_millis(1);

/// What a step came to.
#[derive(Debug)]
pub enum Step {
    /// Admitted: the lease and the index of its candidate.
    Admitted(i64, usize),
    /// Not yet: nap this long (or until woken), then step again.
    Nap(Duration),
}

/// One waiting call; leaves the queue when dropped.
pub struct Waiter {
    handle: Handle,
    op: BatchOp,
    /// Its place in the queue, once it has one: a call first tries unqueued when nobody
    /// waits (so that a wait costs nothing when capacity is there), and queues after
    /// its first refusal; a call that does not wait never queues.
    ticket: Option<u64>,
    waits: bool,
    deadline: Instant,
    generation: u64,
}

impl Waiter {
    /// A wait of `wait` for `op` (a `Lease` or a `LeaseAny`). It queues at once when
    /// others wait (first come, first served), else after its first refusal.
    /// A wait beyond [`MAX_WAIT`] waits that long.
    pub fn new(handle: &Handle, op: BatchOp, wait: Duration) -> Waiter {
        let now = Instant::now();
        let mut w = Waiter {
            handle: handle.clone(),
            op,
            ticket: None,
            waits: !wait.is_zero(),
            deadline: now.checked_add(wait.min(MAX_WAIT)).unwrap_or(now),
            generation: 0,
        };
        if w.waits && handle.has_waiters() {
            w.enqueue();
        }
        w
    }

    fn enqueue(&mut self) {
        if self.ticket.is_some() || !self.waits {
            return;
        }
        let (priority, keys) = match &self.op {
            BatchOp::Lease { route, priority, .. } => {
                (*priority, vec![(route.platform.clone(), route.key_id)])
            }
            BatchOp::LeaseAny { routes, priority, .. } => {
                (*priority, routes.iter().map(|r| (r.platform.clone(), r.key_id)).collect())
            }
            _ => (0, Vec::new()),
        };
        self.ticket = Some(self.handle.enqueue_waiter(priority, keys));
    }

    /// One look at the gates, when it is this waiter's turn (or its wait is over).
    /// `Err(Refused)` once the wait is over, or at once when every refusal names a
    /// retry time beyond the deadline (it never sleeps in vain).
    pub fn step(&mut self) -> Result<Step> {
        let handle = self.handle.clone();
        handle.shielded(|| self.try_step())
    }

    fn try_step(&mut self) -> Result<Step> {
        let (generation, first) = match self.ticket {
            Some(t) => self.handle.waiter_turn(t),
            None => (0, true),
        };
        self.generation = generation;
        let left = self.deadline.saturating_duration_since(Instant::now());
        if !first && !left.is_zero() {
            return Ok(Step::Nap(MAX_NAP.min(left)));
        }
        let refusal = match self.handle.batch(self.op.clone()).chosen() {
            Ok((id, i)) => return Ok(Step::Admitted(id, i)),
            Err(Error::Refused(r)) => r,
            Err(e) => return Err(e),
        };
        // SPEC 24.7: a candidate the request excluded never frees; when every one is
        // excluded, nothing can.
        let all = refusal.all();
        let open: Vec<_> = all.iter().filter(|r| r.reason != Reason::Excluded).collect();
        if left.is_zero() || open.is_empty() {
            return Err(Error::Refused(refusal));
        }
        self.enqueue();
        let mut nap = MAX_NAP.min(left);
        // The refusal's own retry time is the earliest known among its candidates.
        if let Some(at) = refusal.retry_at_ms {
            let until = at.saturating_sub(self.handle.clock_now_ms());
            let all_known = open.iter().all(|r| r.retry_at_ms.is_some());
            if all_known && until > i64::try_from(left.as_millis()).unwrap_or(i64::MAX) {
                return Err(Error::Refused(refusal));
            }
            nap = nap.min(Duration::from_millis(until.max(0) as u64)).max(MIN_NAP);
        }
        Ok(Step::Nap(nap))
    }

    /// Runs `wake` once this engine may have freed capacity since the last step (an
    /// async waiter's nap ends early then).
    pub fn on_wake(&self, wake: crate::core::handle::Wake) {
        self.handle.on_wake(self.generation, wake);
    }

    /// Naps up to `nap`, or until this engine may have freed capacity.
    pub fn nap(&self, nap: Duration) {
        self.handle.nap_waiter(self.generation, nap);
    }

    /// A blocking wait: steps and naps until admitted, refused, or `interrupted`
    /// returns an error (a signal, in the binding), checked after every nap.
    pub fn run(mut self, mut interrupted: impl FnMut() -> Result<()>) -> Result<(i64, usize)> {
        loop {
            match self.step()? {
                Step::Admitted(id, i) => return Ok((id, i)),
                Step::Nap(d) => {
                    self.nap(d);
                    interrupted()?;
                }
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(t) = self.ticket {
            self.handle.dequeue_waiter(t);
        }
    }
}
