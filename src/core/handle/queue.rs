//! Group commit: hot-path operations that queue while another caller holds the engine
//! lock are served together by whichever takes the lock next, in one section and one
//! commit. Each still sees the others' effects in order.
use super::boundary::lock;
use crate::core::engine::{BatchOp, BatchOut, Engine};
use crate::core::error::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// One caller's operation in the queue, and its answer once served.
pub(crate) struct Job {
    op: Mutex<Option<BatchOp>>,
    out: Mutex<Option<BatchOut>>,
}

impl Job {
    /// The answer, once a caller that held the engine lock has served this job.
    pub(crate) fn take_out(&self) -> Option<BatchOut> {
        lock(&self.out).take()
    }
}

/// The operations waiting for the engine lock.
pub(crate) struct CommitQueue {
    jobs: Mutex<Vec<Arc<Job>>>,
}

impl CommitQueue {
    pub(crate) const fn new() -> CommitQueue {
        CommitQueue { jobs: Mutex::new(Vec::new()) }
    }

    /// Queues `op` (before its caller waits for the engine lock).
    pub(crate) fn push(&self, op: BatchOp) -> Arc<Job> {
        let job = Arc::new(Job { op: Mutex::new(Some(op)), out: Mutex::new(None) });
        lock(&self.jobs).push(job.clone());
        job
    }

    /// Under the engine lock: runs every queued operation on `engine` in one batch (or
    /// fails them all with its error) and answers each job. Returns `mine`'s answer,
    /// and whether the batch may have freed capacity (a lease ended).
    pub(crate) fn serve(&self, mine: &Job, engine: Result<&mut Engine>) -> (BatchOut, bool) {
        let jobs: Vec<Arc<Job>> = std::mem::take(&mut *lock(&self.jobs));
        let ops: Vec<BatchOp> = jobs.iter().filter_map(|j| lock(&j.op).take()).collect();
        // Only a lease that ends can free capacity: a waiter's own try does not wake
        // the waiters (it would keep them from ever sleeping).
        let frees = ops.iter().any(BatchOp::frees);
        let n = ops.len();
        let all = |e: &Error| (0..n).map(|_| BatchOut::failed(e.clone())).collect();
        let outs: Vec<BatchOut> = match engine {
            Err(e) => all(&e),
            Ok(engine) => match catch_unwind(AssertUnwindSafe(|| {
                // SPEC 24.1: at any call, the leases half their max age old.
                let _ = engine.renew_due_leases();
                engine.run_batch(ops)
            })) {
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
        let out =
            mine.take_out().unwrap_or_else(|| BatchOut::failed(Error::Internal("lost batch result".into())));
        (out, frees)
    }

    /// In a forked child: the parent's queued calls are not in this process.
    pub(crate) fn forget_parent(&self) {
        lock(&self.jobs).clear();
    }
}
