//! Waiting for capacity (SPEC 17.2): a call to `lease()` / `lease_any()` with a
//! `wait_s` re-runs its gates until one admits it or the wait runs out.
//!
//! A [`Waiter`] is one waiting call. It queues in its engine by the capacity that
//! refused it, never by key (SPEC 24.5; see [`crate::core::capacity`]): among the
//! waiters for one capacity a smaller priority number first, then first come, first
//! served (SPEC 17.2, 22.1); a call that does not wait never queues. It takes steps:
//! each step tries the candidates that no waiter ahead of it waits for a capacity of
//! (a candidate whose gates all pass is then admitted, whatever waits elsewhere), and
//! otherwise says how long to nap. The sync binding naps on the engine's wake-up (a
//! lease of this engine ended, a waiter left, the engine closed) with the GIL
//! released; the async one sleeps on the event loop. Both nap at most [`MAX_NAP`], for other processes and for
//! a `ManualClock` another thread moves.
use crate::core::capacity::Spot;
use crate::core::engine::BatchOp;
use crate::core::error::{Error, Reason, Refusal, Result};
use crate::core::handle::{Handle, Place};
use crate::core::types::Route;
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
    /// Others waited when it began: it queues before its first try (first come).
    queue_at_once: bool,
    /// Its candidates as the queue sees them, once it queues.
    spots: Vec<Spot>,
    deadline: Instant,
    generation: u64,
    /// When it began, and whether it was not admitted at once: a look refused it or a
    /// step napped (held behind a waiter ahead, it napped before its first look). SPEC
    /// 27.1 counts the calls that waited: a wait given and not admitted at once.
    began: Instant,
    not_at_once: bool,
}

impl Waiter {
    /// A wait of `wait` for `op` (a `Lease` or a `LeaseAny`). It queues at once when
    /// others wait (first come, first served), else after its first refusal.
    /// A wait beyond [`MAX_WAIT`] waits that long.
    pub fn new(handle: &Handle, op: BatchOp, wait: Duration) -> Waiter {
        let now = Instant::now();
        let waits = !wait.is_zero();
        // Queued at its first step (it may take the engine's lock, which is not taken
        // here: the binding may hold the GIL).
        let queue_at_once = waits && handle.has_waiters();
        Waiter {
            handle: handle.clone(),
            op,
            ticket: None,
            waits,
            queue_at_once,
            spots: Vec::new(),
            deadline: now.checked_add(wait.min(MAX_WAIT)).unwrap_or(now),
            generation: 0,
            began: now,
            not_at_once: false,
        }
    }

    /// Its candidates (one for a `lease()`).
    fn routes(&self) -> &[Route] {
        match &self.op {
            BatchOp::Lease { route, .. } => std::slice::from_ref(route),
            BatchOp::LeaseAny { routes, .. } => routes,
            _ => &[],
        }
    }

    fn enqueue(&mut self) {
        if self.ticket.is_some() || !self.waits {
            return;
        }
        let (priority, tenants) = match &self.op {
            BatchOp::Lease { priority, tenants, .. } | BatchOp::LeaseAny { priority, tenants, .. } => {
                (*priority, tenants.clone())
            }
            _ => (0, crate::core::tenants::TenantList::from([])),
        };
        let routes = self.routes().to_vec();
        // The accounts of its keys; a closed engine (its next try says so) or a failure
        // counts each key as its own account.
        let accounts = self.handle.with(|e| Ok(e.accounts_of(&routes))).unwrap_or_default();
        self.spots = routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let own = || std::sync::Arc::from(format!("key:{}", r.key_id));
                Spot::new(r, accounts.get(i).cloned().unwrap_or_else(own))
            })
            .collect();
        let place = Place::new(priority, self.spots.clone(), tenants);
        self.ticket = Some(self.handle.enqueue_waiter(place));
    }

    /// After a refusal: what each candidate it tried waits for now.
    fn refused(&self, refusal: &Refusal) {
        let Some(ticket) = self.ticket else { return };
        let mut waits_for = Vec::new();
        for r in refusal.all() {
            for (i, spot) in self.spots.iter().enumerate() {
                if spot.is(&r.platform, &r.model_id, r.key_id) {
                    waits_for.push((i, spot.refused_by(&r)));
                }
            }
        }
        self.handle.waiter_refused(ticket, waits_for);
    }

    /// The operation on the candidates `clear` (indices) alone.
    fn op_on(&self, clear: &[usize]) -> BatchOp {
        match &self.op {
            BatchOp::LeaseAny { routes, est, strategy, priority, tenants, exclude } => BatchOp::LeaseAny {
                routes: clear.iter().filter_map(|&i| routes.get(i).cloned()).collect(),
                est: *est,
                strategy: *strategy,
                priority: *priority,
                tenants: tenants.clone(),
                exclude: exclude.clone(),
            },
            op => op.clone(),
        }
    }

    /// One look at the gates of the candidates no waiter ahead holds (all of them once
    /// the wait is over).
    /// `Err(Refused)` once the wait is over, or at once when every refusal names a
    /// retry time beyond the deadline (it never sleeps in vain).
    pub fn step(&mut self) -> Result<Step> {
        let handle = self.handle.clone();
        let step = handle.shielded(|| self.try_step());
        if matches!(&step, Ok(Step::Nap(_)) | Err(Error::Refused(_))) {
            self.not_at_once = true;
        }
        // SPEC 27.1: the refusal that ends the wait is raised to the caller.
        handle.count_refusal(step)
    }

    fn try_step(&mut self) -> Result<Step> {
        if std::mem::take(&mut self.queue_at_once) {
            self.enqueue();
        }
        let (generation, held) = match self.ticket {
            Some(t) => self.handle.waiter_turn(t),
            None => (0, Vec::new()),
        };
        self.generation = generation;
        let left = self.deadline.saturating_duration_since(Instant::now());
        // SPEC 24.5: the candidates no waiter ahead waits for a capacity of are tried
        // (all of them once the wait is over: its last look).
        let n = self.routes().len();
        let clear: Vec<usize> = (0..n).filter(|&i| !held.get(i).copied().unwrap_or(false)).collect();
        let partial = clear.len() < n && !left.is_zero();
        if partial && clear.is_empty() {
            return Ok(Step::Nap(MAX_NAP.min(left)));
        }
        let op = if partial { self.op_on(&clear) } else { self.op.clone() };
        let refusal = match self.handle.batch(op).chosen() {
            Ok((id, i)) if partial => return Ok(Step::Admitted(id, clear.get(i).copied().unwrap_or(i))),
            Ok((id, i)) => return Ok(Step::Admitted(id, i)),
            Err(Error::Refused(r)) => r,
            Err(e) => return Err(e),
        };
        // SPEC 24.7: a candidate the request excluded never frees; when every one is
        // excluded, nothing can.
        let all = refusal.all();
        let open: Vec<_> = all.iter().filter(|r| r.reason != Reason::Excluded).collect();
        if left.is_zero() || (open.is_empty() && !partial) {
            return Err(Error::Refused(refusal));
        }
        self.enqueue();
        self.refused(&refusal);
        let mut nap = MAX_NAP.min(left);
        // The refusal's own retry time is the earliest known among its candidates.
        if let Some(at) = refusal.retry_at_ms {
            let until = at.saturating_sub(self.handle.clock_now_ms());
            // A held candidate (not tried) may free sooner: never in vain then.
            let all_known = !partial && open.iter().all(|r| r.retry_at_ms.is_some());
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
        if self.waits && self.not_at_once {
            self.handle.counters().waited(self.began.elapsed());
        }
        if let Some(t) = self.ticket {
            self.handle.dequeue_waiter(t);
        }
    }
}
