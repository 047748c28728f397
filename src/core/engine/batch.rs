//! The hot path in batches (group commit): `lease`, `lease_any`, `success` and
//! `release` of several callers decided in one section and written in one commit,
//! optimistically where the store allows it (decided on what the engine knows, taken
//! back and made again when another writer changed what they read).
use super::unit::{Access, Applied};
use super::usage::TokenUse;
use super::{admit, check_priority, observed, priced, Engine};
use crate::core::admission::{self, Passed, Verdict};
use crate::core::cooldowns::MODEL_PENALTY_MS;
use crate::core::error::{Error, Reason, Refusal, Result};
use crate::core::limits::LimitSet;
use crate::core::state::{Estimate, RouteId};
use crate::core::store::{TokenKinds, UsageKind, Write};
use crate::core::tenants::TenantList;
use crate::core::types::{check_non_negative, Admission, Exclusion, Route, Strategy};

/// Optimistic attempts of a lease batch before it takes the store's lock.
const OPTIMISTIC_ATTEMPTS: usize = 3;

/// Where a batch's operations go: its section's time, whether usage waits in the
/// buffer (`flush_interval_ms`), and the writes of its one commit.
pub(super) struct Section<'a> {
    now: i64,
    deferred: bool,
    writes: &'a mut Vec<Write>,
}

/// A hot-path operation that can share a commit with other callers' (group commit).
#[derive(Debug, Clone)]
pub enum BatchOp {
    /// `check = false`: `acquire_lease`, no gates.
    Lease {
        route: Route,
        est: Estimate,
        limits: Option<LimitSet>,
        check: bool,
        /// SPEC 22.1: 0 the most important.
        priority: i64,
        /// SPEC 23.2: whom it is served for.
        tenants: TenantList,
    },
    /// `lease_any` (SPEC 17.1): every gate of every candidate, one picked by
    /// `strategy`, its lease taken.
    LeaseAny {
        routes: Vec<Route>,
        est: Estimate,
        strategy: Strategy,
        priority: i64,
        tenants: TenantList,
        /// SPEC 24.7: what the request already skipped; the candidates they cover are
        /// refused ("excluded") without running their gates.
        exclude: Vec<Exclusion>,
    },
    Success {
        lease_id: i64,
        route: Route,
        tokens: Option<TokenUse>,
        /// The lease's tenants: what it records counts for them.
        tenants: TenantList,
    },
    Release(i64),
}

impl BatchOp {
    /// An admission (it takes a lease).
    fn leases(&self) -> bool {
        matches!(self, BatchOp::Lease { .. } | BatchOp::LeaseAny { .. })
    }

    /// It ends a lease (frees capacity a waiter may be waiting for).
    pub fn frees(&self) -> bool {
        !self.leases()
    }
}

/// The result of one [`BatchOp`]: the lease taken and the index of its candidate (0
/// for a `Lease`), or nothing (`Success`, `Release`).
#[derive(Debug)]
pub struct BatchOut(Result<Option<(i64, usize)>>);

impl BatchOut {
    /// A batch operation that failed (the engine closed, the batch lost).
    pub fn failed(e: Error) -> BatchOut {
        BatchOut(Err(e))
    }
    fn of_lease(r: Result<i64>) -> BatchOut {
        BatchOut(r.map(|id| Some((id, 0))))
    }
    fn of_choice(r: Result<(i64, usize)>) -> BatchOut {
        BatchOut(r.map(Some))
    }
    fn of_done(r: Result<()>) -> BatchOut {
        BatchOut(r.map(|()| None))
    }
    pub fn lease_id(self) -> Result<i64> {
        self.chosen().map(|(id, _)| id)
    }
    /// The lease and its candidate's index.
    pub fn chosen(self) -> Result<(i64, usize)> {
        self.0?.ok_or_else(|| Error::Internal("not a lease".into()))
    }
    pub fn done(self) -> Result<()> {
        self.0.map(|_| ())
    }
    /// A refused admission.
    pub fn refused(&self) -> bool {
        matches!(self.0, Err(Error::Refused(_)))
    }
}

impl Engine {
    /// Takes back a batch's lease inserts from the mirror (their commit conflicted,
    /// or a refusal among them is to be confirmed on fresh data). A lease batch
    /// writes nothing else.
    pub(super) fn undo_leases(&mut self, writes: &[Write], now: i64) {
        for w in writes {
            if let Write::InsertLease(l) = w {
                self.unit.apply_local(&Write::DeleteLease(l.id), 0, now);
            }
        }
        self.unit.counters.forget_pending();
        // A lease taken back was never this engine's: "spread" must not see it (SPEC
        // 17.1, 18.6). On Redis another engine's write is what makes one conflict.
        while let Some((rid, before)) = self.leased_undo.pop() {
            match before {
                Some(n) => self.leased_at.insert(rid, n),
                None => self.leased_at.remove(&rid),
            };
        }
    }

    /// Runs hot-path operations of several callers in ONE section and one commit
    /// (group commit): each sees the effects of the ones before it, exactly as if
    /// they had run one after another, and every one has committed when this returns.
    ///
    /// A batch of leases alone is decided optimistically where the store allows it
    /// (`Store::begin_optimistic`): on what the engine knows, in one round trip to a
    /// networked store. A refusal is confirmed on freshly read data, and a decision
    /// whose inputs another writer changed meanwhile is taken back and made again;
    /// after `OPTIMISTIC_ATTEMPTS` such conflicts the batch takes the lock.
    pub fn run_batch(&mut self, ops: Vec<BatchOp>) -> Vec<BatchOut> {
        let leases = ops.iter().filter(|op| op.leases()).count();
        self.know_recent_quota(&ops);
        let mut access = match leases {
            0 => Access::Append,
            n if n == ops.len() => Access::Decide,
            _ => Access::Write,
        };
        let mut fresh = false;
        for attempt in 1.. {
            if attempt > OPTIMISTIC_ATTEMPTS {
                access = Access::Write;
            }
            match self.run_batch_as(&ops, access, fresh) {
                Ok(outs) => return outs,
                // Decided again on what the conflict (or the confirming read) brought.
                Err(()) => fresh = true,
            }
        }
        unreachable!("the loop returns once the batch holds the lock")
    }

    /// One attempt of `run_batch`. `Err(())`: an optimistic attempt to make again
    /// (the mirror is as it was before it, and now up to date).
    pub(super) fn run_batch_as(
        &mut self, ops: &[BatchOp], access: Access, fresh: bool,
    ) -> std::result::Result<Vec<BatchOut>, ()> {
        let deferred = self.unit.groups_usage();
        self.leased_undo.clear();
        self.unit.counters.forget_pending();
        let needs_section = access != Access::Append || !deferred;
        let sec = if needs_section {
            match self.unit.enter(access) {
                Ok(sec) => Some(sec),
                Err(e) => return Ok(ops.iter().map(|_| BatchOut::failed(e.clone())).collect()),
            }
        } else {
            None
        };
        let now = sec.as_ref().map_or_else(|| self.unit.clock.now_ms(), |s| s.now);
        let mut writes: Vec<Write> = Vec::new();
        let mut outs = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                BatchOp::Lease { route, est, limits, check, priority, tenants } => {
                    outs.push(BatchOut::of_lease(self.batch_lease(
                        route,
                        *est,
                        limits.clone(),
                        (*check).then_some(*priority),
                        tenants,
                        &mut Section { now, deferred, writes: &mut writes },
                    )));
                }
                BatchOp::LeaseAny { routes, est, strategy, priority, tenants, exclude } => {
                    outs.push(BatchOut::of_choice(self.batch_lease_any(
                        routes,
                        *est,
                        *strategy,
                        (*priority, tenants),
                        exclude,
                        &mut Section { now, deferred, writes: &mut writes },
                    )));
                }
                BatchOp::Success { lease_id, route, tokens, tenants } => {
                    let mut sec = Section { now, deferred, writes: &mut writes };
                    let out = self.batch_success(*lease_id, route, *tokens, tenants, &mut sec);
                    outs.push(BatchOut::of_done(out));
                }
                BatchOp::Release(lease_id) => {
                    let w = Write::DeleteLease(*lease_id);
                    self.unit.apply_local(&w, 0, now);
                    if deferred {
                        self.unit.buffer(w, now);
                    } else {
                        writes.push(w);
                    }
                    outs.push(BatchOut::of_done(Ok(())));
                }
            }
        }
        let Some(sec) = sec else { return Ok(outs) };
        let refused = outs.iter().any(BatchOut::refused);
        if sec.stale && refused && !fresh {
            // What refused may have been freed meanwhile: read, then decide again.
            self.undo_leases(&writes, now);
            self.unit.rollback();
            let _ = self.unit.run(Access::Read, |_| Ok(()));
            return Err(());
        }
        match self.unit.leave_applied(sec, writes) {
            Applied::Done => {
                self.unit.counters.commit_pending();
                Ok(outs)
            }
            Applied::Conflict(writes) => {
                self.undo_leases(&writes, now);
                Err(())
            }
            Applied::Rejected(writes, e) => {
                // Nothing was written: every operation of the batch fails, and the
                // mirror forgets what they did.
                self.undo_leases(&writes, now);
                self.unit.reload();
                let e = Error::from(e);
                Ok(outs.iter().map(|_| BatchOut::failed(e.clone())).collect())
            }
        }
    }

    pub(super) fn batch_lease(
        &mut self, route: &Route, est: Estimate, limits: Option<LimitSet>, check: Option<i64>,
        tenants: &TenantList, sec: &mut Section<'_>,
    ) -> Result<i64> {
        let now = sec.now;
        check_estimate(est)?;
        // `check`: the gates run at that priority (SPEC 22.1); None: no gates.
        let (rid, est) = if let Some(priority) = check {
            check_priority(priority)?;
            let (rid, verdict, priced) = admit(&mut self.unit, route, est, limits, priority, tenants, now)?;
            if let Some(refusal) = refusal_of(route, verdict) {
                return Err(Error::Refused(Box::new(refusal)));
            }
            (rid, priced)
        } else {
            let rid = self.unit.mirror.route_id(&route.platform, &route.model_id, route.key_id);
            (rid, priced(&self.unit.mirror, route, est)?)
        };
        // `lease()`'s: a `Lease` stands for it (SPEC 18.5, 24.1); `acquire_lease`'s id is
        // the caller's to release, never renewed.
        let id = self.take_lease(rid, est, tenants, now, sec.writes, check.is_some());
        Ok(id)
    }

    /// SPEC 17.1 in a batch: every gate of every candidate (duplicates once), one of
    /// those that pass picked by `strategy`, its lease taken. Returns the lease and the
    /// index of its candidate in `routes`.
    pub(super) fn batch_lease_any(
        &mut self, routes: &[Route], est: Estimate, strategy: Strategy,
        (priority, tenants): (i64, &TenantList), exclude: &[Exclusion], sec: &mut Section<'_>,
    ) -> Result<(i64, usize)> {
        let now = sec.now;
        check_estimate(est)?;
        check_priority(priority)?;
        if routes.is_empty() {
            return Err(Error::invalid("routes is empty: give at least one (platform, model_id, key_id)"));
        }
        // The candidates refused, in the given order, with the verdict that refused each:
        // their refusals are built only when none passes (what is then raised).
        let mut refused: Vec<(usize, Verdict)> = Vec::new();
        // The candidates that pass: (index, route, what the strategy reads).
        let mut passed: Vec<(usize, RouteId, Estimate, Passed)> = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            if routes[..i].iter().any(|r| r.key_id == route.key_id && r == route) {
                continue;
            }
            // SPEC 24.7: what the request skipped runs no gate.
            if exclude.iter().any(|x| x.covers(route)) {
                let excluded = Admission::refused(Reason::Excluded, None);
                refused.push((i, Verdict { refused: Some(excluded), room: 0.0, scope: None }));
                continue;
            }
            // Each candidate reserves at its own prices (SPEC 23.2: a cheap route may pass
            // a budget an expensive one breaks).
            let (rid, verdict, priced) = admit(&mut self.unit, route, est, None, priority, tenants, now)?;
            if verdict.refused.as_ref().is_some_and(|a| a.reason.is_some()) {
                refused.push((i, verdict));
                continue;
            }
            let room = verdict.room;
            let key_headroom = match strategy {
                // The key's observed quota headroom (SPEC §8.2), as the mirror holds it.
                Strategy::Headroom => {
                    self.unit.mirror.reader().key_quota_headroom(&route.platform, route.key_id, now)
                }
                _ => None,
            };
            let leased_at = self.leased_at.get(&rid).copied().unwrap_or(0);
            // SPEC 24.7: a model that failed server-side lately ranks after healthy ones.
            let since = now.saturating_sub(MODEL_PENALTY_MS);
            let penalized = strategy != Strategy::Order
                && self.unit.mirror.history.penalized(&route.platform, &route.model_id, since);
            passed.push((i, rid, priced, Passed { room, key_headroom, leased_at, penalized }));
            if strategy == Strategy::Order {
                break;
            }
        }
        match admission::choose(strategy, passed.iter().map(|(_, _, _, p)| p)).map(|j| passed[j]) {
            Some((i, rid, est, _)) => {
                let id = self.take_lease(rid, est, tenants, now, sec.writes, true);
                Ok((id, i))
            }
            None => {
                let refusals = refused.into_iter().filter_map(|(i, v)| refusal_of(&routes[i], v)).collect();
                Err(Error::Refused(Box::new(
                    Refusal::of_candidates(refusals).ok_or_else(|| Error::Internal("no candidate".into()))?,
                )))
            }
        }
    }

    /// SPEC 24.5: the account each route's key belongs to (SPEC §14.3), as the engine
    /// knows it: where a waiting call's candidates stand in the wait queue.
    pub fn accounts_of(&self, routes: &[Route]) -> Vec<std::sync::Arc<str>> {
        let read = self.unit.mirror.reader();
        routes.iter().map(|r| read.account_name(&r.platform, r.key_id)).collect()
    }

    /// Before a batch's section: a `headroom` pick reads the observed quota at most 5 s
    /// old (SPEC §8.2). A store that decides optimistically brings others' writes only
    /// with a round trip, so when the engine last had one longer ago (it was idle), the
    /// store is read first; otherwise the pick reads the mirror as it is.
    fn know_recent_quota(&mut self, ops: &[BatchOp]) {
        let headroom = |op: &BatchOp| matches!(op, BatchOp::LeaseAny { strategy: Strategy::Headroom, .. });
        let now = self.unit.clock.now_ms();
        if !self.unit.degraded()
            && ops.iter().any(headroom)
            && self.unit.known_before(now, observed::HEADROOM_CACHE_MS)
        {
            // Unreadable: the pick reads what the engine knows.
            let _ = self.unit.run(Access::Read, |_| Ok(()));
        }
    }

    /// Takes a lease on the route the gates were run on, inside the batch's section.
    fn take_lease(
        &mut self, rid: RouteId, est: Estimate, tenants: &TenantList, now: i64, writes: &mut Vec<Write>,
        own: bool,
    ) -> i64 {
        let id = self.lease_ids.next();
        let max_age = self.unit.settings.lease_max_age_ms;
        let w = self.unit.mirror.lease_write(rid, id, est, tenants, now, max_age);
        self.unit.apply_decided(&w, now);
        if let (true, Write::InsertLease(row)) = (own, &w) {
            self.unit.keep_own(row.clone());
        }
        writes.push(w);
        if own {
            self.unit.counters.lease_taken(rid);
        }
        self.leases_taken += 1;
        let before = self.leased_at.insert(rid, self.leases_taken);
        self.leased_undo.push((rid, before));
        id
    }

    pub(super) fn batch_success(
        &mut self, lease_id: i64, route: &Route, tokens: Option<TokenUse>, tenants: &TenantList,
        sec: &mut Section<'_>,
    ) -> Result<()> {
        let now = sec.now;
        let total = tokens.map(|t| t.validate()).transpose()?;
        let mut usage = self.usage();
        let mut ws =
            vec![usage.usage_row(route, UsageKind::Request, 0, TokenKinds::default(), tenants, now)?];
        if let (Some(total), Some(t)) = (total, tokens) {
            ws.push(usage.usage_row(route, UsageKind::Tokens, total, t.kinds, tenants, now)?);
        }
        usage.clear_history_on_success(route, &mut ws);
        ws.push(Write::DeleteLease(lease_id));
        for w in ws {
            self.unit.apply_local(&w, 0, now);
            if sec.deferred {
                self.unit.buffer(w, now);
            } else {
                sec.writes.push(w);
            }
        }
        Ok(())
    }
}

/// An estimate's counts are valid: none negative, the output part of the total.
fn check_estimate(est: Estimate) -> Result<()> {
    check_non_negative("estimated_tokens", est.tokens)?;
    check_non_negative("estimated_output_tokens", est.output)?;
    if est.output > est.tokens {
        return Err(Error::invalid(format!(
            "estimated_output_tokens ({}) is part of estimated_tokens ({}): it cannot be larger",
            est.output, est.tokens
        )));
    }
    Ok(())
}

/// The refusal of `route` when its gates refused.
#[inline]
fn refusal_of(route: &Route, verdict: Verdict) -> Option<Refusal> {
    let adm = verdict.refused?;
    Some(Refusal {
        tenant: adm.tenant.as_deref().map(str::to_string),
        scope: verdict.scope,
        reason: adm.reason?,
        retry_at_ms: adm.retry_at_ms,
        platform: route.platform.clone(),
        model_id: route.model_id.clone(),
        key_id: route.key_id,
        candidates: Vec::new(),
    })
}
