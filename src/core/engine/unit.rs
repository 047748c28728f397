//! The unit of work of every call: a section reads what other engines changed
//! (sync), decides on the mirror, and ends by committing its writes (leave), or
//! buffers them while the store fails (degraded mode); grouped writes keep the
//! write lock across calls (hold) and flush together. Use cases in the sibling
//! files only open and close sections through `read`, `write`, `append`,
//! `enter`/`leave` and `run_batch`; none touches the store directly.
use super::*;
use crate::core::store::KeptUsage;

/// The unit of work's state: the store, the writes waiting for it, the write lock
/// kept across calls, and whether the store answers.
pub(super) struct Unit {
    pub(super) store: Box<dyn Store>,
    /// Writes applied to the mirror but not yet to the store, in order.
    pub(super) pending: Vec<Write>,
    /// Stored leases whose deletion is in `pending`.
    pub(super) pending_deleted: HashSet<i64>,
    /// Leases whose insertion is in `pending` (taken while degraded).
    pub(super) pending_inserted: HashSet<i64>,
    pub(super) compact_at: usize,
    /// Engine time of the oldest write in `pending`.
    pub(super) pending_since: Option<i64>,
    pub(super) flush_requested: bool,
    pub(super) degraded: bool,
    pub(super) loaded: bool,
    pub(super) rebuild: bool,
    pub(super) last_now: Option<i64>,
    pub(super) last_sweep: Option<i64>,
    /// The last read section could not read the store.
    pub(super) read_failed: bool,
    /// Buffered `server_logs` rows were dropped during this outage (warned once).
    pub(super) logs_dropped: bool,
    /// With grouped writes, how long the write lock may be kept from one call to the
    /// next while this engine is the store's only one (`None`: never).
    pub(super) hold_for: Option<Duration>,
    /// Since when this engine keeps the store's write lock (an open transaction)
    /// across calls: nobody else can write meanwhile, so calls neither read nor
    /// write the store; the writes wait in `pending` for the commit that ends it.
    pub(super) held: Option<Instant>,
    /// When to ask the store again whether this engine is its only one.
    pub(super) next_sole_check: Option<Instant>,
}

impl Unit {
    pub(super) fn new(store: Box<dyn Store>) -> Unit {
        Unit {
            store,
            pending: Vec::new(),
            pending_deleted: HashSet::new(),
            pending_inserted: HashSet::new(),
            compact_at: COMPACT_MIN,
            pending_since: None,
            flush_requested: false,
            degraded: false,
            loaded: false,
            rebuild: false,
            last_now: None,
            last_sweep: None,
            read_failed: false,
            logs_dropped: false,
            hold_for: None,
            held: None,
            next_sole_check: None,
        }
    }
}

impl Engine {
    // ---- sections ----------------------------------------------------------------

    pub(super) fn enter(&mut self, write: bool) -> Result<Section> {
        self.enter_as(if write { Access::Write } else { Access::Read })
    }

    pub(super) fn enter_as(&mut self, mut access: Access) -> Result<Section> {
        let write = access != Access::Read;
        if write && self.unit.store.readonly() {
            return Err(StoreError::ReadOnly.into());
        }
        let hot = matches!(access, Access::Decide | Access::Append);
        let start_hold = hot && self.unit.held.is_none() && self.may_hold();
        if start_hold {
            access = Access::Write;
        }
        let held = self.unit.held.is_some();
        let mut online = held;
        let mut stale = false;
        self.unit.read_failed = false;
        // Holding the write lock, nothing can have changed under us.
        let need_store = !held
            && (write
                || !self.unit.loaded
                || self.unit.rebuild
                || self.mirror.needs_reload
                || self.unit.store.changed().unwrap_or(true));
        if need_store {
            // While degraded, probe the store without waiting on its lock.
            if self.unit.degraded {
                self.unit.store.set_busy_timeout(0);
            }
            let began = match access {
                Access::Read | Access::Write => self.unit.store.begin(write),
                Access::Append => self.unit.store.begin_append(),
                Access::Decide => self.unit.store.begin_optimistic().map(|s| stale = s),
            };
            if self.unit.degraded {
                self.unit.store.set_busy_timeout(self.settings.busy_timeout_ms);
            }
            match began {
                Ok(()) => online = true,
                Err(e @ StoreError::Rejected(_)) => {
                    self.rejected(&e);
                    return Err(e.into());
                }
                Err(e) => self.store_failed(&e, write),
            }
        }
        // Read the clock only now: a writer that waited for the lock must see every
        // row stamped before its own admission.
        let now = self.clock.now_ms();
        if let Some(last) = self.unit.last_now {
            if now < last {
                // SPEC §2/§10: the clock stepped back. Events pruned from the minute
                // window may count again: reload the windows, and sweep again.
                self.unit.rebuild = true;
                self.unit.last_sweep = None;
            }
        }
        self.unit.last_now = Some(now);
        if !online && self.unit.rebuild && !write {
            // A read noticed the step back: open a read snapshot to reload from.
            match self.unit.store.begin(false) {
                Ok(()) => online = true,
                Err(e) => self.store_failed(&e, false),
            }
        }
        if online && (!held || self.unit.rebuild) {
            if let Err(e) = self.sync(now) {
                self.unit.store.rollback();
                self.unit.held = None;
                if let StoreError::Rejected(_) = e {
                    self.rejected(&e);
                    return Err(e.into());
                }
                self.store_failed(&e, write);
                online = false;
            }
        }
        if online && start_hold {
            self.unit.held = Some(Instant::now());
        }
        let held = online && self.unit.held.is_some();
        Ok(Section { now, online, write, held, hot, stale: stale && online })
    }

    /// Whether a hot-path section may take the write lock and keep it across calls:
    /// grouped writes are on, the store answers, and no other engine has it open
    /// (asked at most once per hold period while others do).
    pub(super) fn may_hold(&mut self) -> bool {
        let Some(period) = self.unit.hold_for else { return false };
        if self.unit.degraded {
            return false;
        }
        let now = Instant::now();
        if self.unit.next_sole_check.is_some_and(|t| now < t) {
            return false;
        }
        if self.unit.store.sole_writer() {
            return true;
        }
        self.unit.next_sole_check = Some(now + period);
        false
    }

    /// A held write lock is kept for this hot-path section's writes (its period is
    /// not over, and no flush asked for it to end).
    pub(super) fn keeps_holding(&self, sec: &Section) -> bool {
        sec.held && sec.hot && !self.unit.flush_requested && !self.hold_period_over()
    }

    /// A write lock is kept across calls and its period has not run out.
    pub(super) fn hold_period_over(&self) -> bool {
        self.unit.held.zip(self.unit.hold_for).is_none_or(|(t, period)| t.elapsed() >= period)
    }

    /// Counts every window again from the store: the rows that count at `now` (the
    /// minute, today, and every window a route keeps or a model declares) and what is
    /// buffered.
    pub(super) fn load_usage(&mut self, now: i64) -> std::result::Result<(), StoreError> {
        let since = self.mirror.usage_horizon(now);
        // Rows stream into the windows (a month of them is never held at once). A
        // load that fails half-way leaves `rebuild` set: the next section that
        // reaches the store counts again from scratch.
        self.mirror.reset_usage();
        self.unit.rebuild = true;
        let mirror = &mut self.mirror;
        self.unit.store.load_usage_since(since, &mut |r| mirror.add_usage_row(&r, now))?;
        for w in &self.unit.pending {
            if let Write::Usage(u) = w {
                self.mirror.add_usage_row(u, now);
            }
        }
        self.unit.loaded = true;
        self.unit.rebuild = false;
        Ok(())
    }

    /// A route ready for a decision at `now` under `limits`: pruned, and keeping every
    /// window they read. A window its events were not kept for (a wider sliding one,
    /// a new period) is counted from the store at once when the store answers, else
    /// at the next section that reaches it.
    pub(super) fn ready_route(&mut self, route: &Route, limits: &LimitSet, now: i64) -> RouteId {
        let rid = self.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        self.mirror.prune_route(rid, now);
        if !self.mirror.keep_windows(rid, limits) || self.mirror.needs_reload {
            if self.unit.degraded || self.load_usage(now).is_err() {
                self.unit.rebuild = true;
            }
            self.mirror.prune_route(rid, now);
        }
        rid
    }

    pub(super) fn sync(&mut self, now: i64) -> std::result::Result<(), StoreError> {
        if !self.unit.loaded || self.unit.rebuild || self.mirror.needs_reload {
            self.load_usage(now)?;
        }
        let changes = self.unit.store.pull()?;
        self.apply_changes(changes, now);
        if std::mem::take(&mut self.mirror.needs_reload) {
            // A model declared a window its routes' events were not kept for.
            self.unit.rebuild = true;
        }
        if self.unit.rebuild {
            // A platform's calendar changed: its day windows count again from the store.
            return self.sync(now);
        }
        Ok(())
    }

    pub(super) fn apply_changes(&mut self, ch: Changes, now: i64) {
        for r in &ch.usage {
            self.mirror.add_usage_row(r, now);
        }
        if let Some(leases) = &ch.leases {
            self.mirror.replace_stored_leases(
                leases,
                &self.unit.pending_deleted,
                &self.unit.pending_inserted,
            );
        }
        let tables_changed =
            ch.cooldowns.is_some() || ch.keys.is_some() || ch.models.is_some() || ch.caps.is_some();
        if let Some(c) = &ch.cooldowns {
            self.mirror.replace_cooldowns(c);
        }
        if let Some(k) = ch.keys {
            self.mirror.replace_keys(k);
        }
        if let Some(m) = ch.models {
            self.mirror.replace_models(m);
        }
        if let Some(c) = ch.caps {
            self.mirror.caps = c.into_iter().collect();
        }
        let tables_changed = tables_changed || ch.history.is_some() || ch.calendars.is_some();
        if let Some(h) = ch.history {
            self.mirror.replace_history(h);
        }
        if let Some(c) = ch.calendars {
            if self.mirror.replace_calendars(c.into_iter().collect()) {
                self.unit.rebuild = true;
            }
        }
        if tables_changed && !self.unit.pending.is_empty() {
            // Our own buffered changes are newer than what the store holds.
            let pending = std::mem::take(&mut self.unit.pending);
            // Leases are reconciled by `replace_stored_leases` (pending inserts kept,
            // pending deletes skipped); re-applying an insert would resurrect a
            // lease finished while its writes waited.
            for w in pending
                .iter()
                .filter(|w| !matches!(w, Write::Usage(_) | Write::DeleteLease(_) | Write::InsertLease(_)))
            {
                self.apply_local(w, 0, now);
            }
            self.unit.pending = pending;
        }
    }

    /// Inside an online write section: writes what is buffered (when due), the
    /// retention sweep and `writes`, then commits. Returns the per-write results.
    pub(super) fn commit_section(&mut self, now: i64, writes: &[Write]) -> Committed {
        let sweep_due = !matches!(self.unit.last_sweep, Some(t) if now >= t && now - t < MINUTE_MS);
        // Grouped writes (flush_interval_ms) wait until they are due; buffered
        // writes of an outage go first thing.
        let flush_pending = self.unit.degraded
            || self.unit.held.is_some()
            || self.unit.flush_requested
            || self.unit.pending_since.is_none_or(|t| now < t || now - t >= self.settings.flush_interval_ms);
        // Worked out only when a sweep or buffered usage needs it (not per commit).
        let retention = (sweep_due || (flush_pending && !self.unit.pending.is_empty()))
            .then(|| self.retention(now, false));
        let sweep = match &retention {
            Some(r) if sweep_due => Some(Write::Sweep {
                usage_before: r.before,
                kept: r.kept.clone(),
                leases_expired_before: now,
                history_before: now.saturating_sub(DAY_MS),
            }),
            _ => None,
        };
        let mut ids = Vec::with_capacity(writes.len());
        let result = (|| -> std::result::Result<(), StoreError> {
            if flush_pending {
                // A lease taken and finished while both waited here never reaches the
                // store, nor does a usage row buffered past the retention.
                let (inserted, deleted) = (&self.unit.pending_inserted, &self.unit.pending_deleted);
                let live: Vec<&Write> = self
                    .unit
                    .pending
                    .iter()
                    .filter(|w| match w {
                        Write::InsertLease(l) => !deleted.contains(&l.id),
                        Write::DeleteLease(id) => !inserted.contains(id),
                        Write::Usage(u) => retention.as_ref().is_none_or(|r| r.keeps(u)),
                        _ => true,
                    })
                    .collect();
                self.unit.store.write_all(&live)?;
            }
            for w in writes {
                ids.push(self.unit.store.write(w)?);
            }
            // Last, so that it sees every row, the section's own included.
            if let Some(s) = &sweep {
                self.unit.store.write(s)?;
            }
            self.unit.store.commit()
        })();
        // The commit (or the rollback) ends a held lock.
        self.unit.held = None;
        // SPEC 19.2: a commit that got no reply is the store's to deliver, applied
        // once: committed for the engine, which is degraded until the store answers.
        let in_doubt = match &result {
            Err(StoreError::InDoubt(e)) => Some(e.clone()),
            _ => None,
        };
        match result {
            Err(StoreError::InDoubt(_)) | Ok(()) => {
                if sweep.is_some() {
                    // A sweep that stopped at its bound goes on at the next commit.
                    if !self.unit.store.sweep_unfinished() {
                        self.unit.last_sweep = Some(now);
                    }
                    self.prune_own_leases(now);
                }
                let flushed = if flush_pending { self.unit.pending.len() } else { 0 };
                if flush_pending {
                    self.unit.pending.clear();
                    self.unit.pending_deleted.clear();
                    self.unit.pending_inserted.clear();
                    self.unit.pending_since = None;
                    self.unit.compact_at = COMPACT_MIN;
                }
                self.unit.flush_requested = false;
                if flush_pending {
                    self.unit.logs_dropped = false;
                }
                if let Some(e) = in_doubt {
                    self.store_failed(&StoreError::Unavailable(e), true);
                } else if self.unit.degraded {
                    self.unit.degraded = false;
                    self.logs.push((
                        log::Level::Info,
                        format!("database answers again: wrote {flushed} buffered changes"),
                    ));
                }
                Committed::Done(ids)
            }
            // The store took in what changed; the section is over.
            Err(StoreError::Conflict) => Committed::Conflict,
            // SPEC 19.1: not an outage; the call fails, what was buffered stays.
            Err(e @ StoreError::Rejected(_)) => {
                self.unit.store.rollback();
                self.rejected(&e);
                Committed::Rejected(e)
            }
            Err(e) => {
                self.unit.store.rollback();
                self.store_failed(&e, true);
                Committed::Failed
            }
        }
    }

    /// Ends a section: writes (after anything buffered), commits, then applies the
    /// writes to the mirror. Returns, per write, the id of an insert or the number of
    /// rows a delete removed. When the store fails, the writes are applied and kept
    /// for later (degraded mode).
    pub(super) fn leave(&mut self, sec: Section, writes: Vec<Write>) -> Result<Vec<i64>> {
        let now = sec.now;
        if !sec.write {
            if sec.online && !sec.held {
                // Ends the read snapshot.
                let _ = self.unit.store.commit();
            }
            return Ok(Vec::new());
        }
        if sec.online && !self.keeps_holding(&sec) {
            // Only `Access::Decide` sections can conflict, and they end in `leave_applied`.
            match self.commit_section(now, &writes) {
                Committed::Done(ids) => {
                    let mut out = Vec::with_capacity(ids.len());
                    for (w, id) in writes.iter().zip(ids) {
                        let local = self.apply_local(w, id, now);
                        out.push(if matches!(w, Write::InsertLease(_)) { id } else { local.max(id) });
                    }
                    return Ok(out);
                }
                Committed::Rejected(e) => return Err(e.into()),
                Committed::Conflict | Committed::Failed => {}
            }
        }
        let mut out = Vec::with_capacity(writes.len());
        for w in writes {
            let id = match &w {
                Write::InsertLease(l) => l.id,
                _ => 0,
            };
            out.push(self.apply_local(&w, id, now).max(id));
            self.buffer(w, now);
        }
        Ok(out)
    }

    /// Ends a write section whose writes were already applied to the mirror (a
    /// batch: later operations had to see earlier ones). On a conflict the writes are
    /// handed back, still applied to the mirror.
    pub(super) fn leave_applied(&mut self, sec: Section, writes: Vec<Write>) -> Applied {
        let now = sec.now;
        if sec.online && !self.keeps_holding(&sec) {
            match self.commit_section(now, &writes) {
                Committed::Done(_) => return Applied::Done,
                Committed::Conflict => return Applied::Conflict(writes),
                Committed::Rejected(e) => return Applied::Rejected(writes, e),
                Committed::Failed => {}
            }
        }
        for w in writes {
            self.buffer(w, now);
        }
        Applied::Done
    }

    /// Takes back a batch's lease inserts from the mirror (their commit conflicted,
    /// or a refusal among them is to be confirmed on fresh data). A lease batch
    /// writes nothing else.
    pub(super) fn undo_leases(&mut self, writes: &[Write], now: i64) {
        for w in writes {
            if let Write::InsertLease(l) = w {
                self.apply_local(&Write::DeleteLease(l.id), 0, now);
            }
        }
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
        let leases =
            ops.iter().filter(|op| matches!(op, BatchOp::Lease { .. } | BatchOp::LeaseAny { .. })).count();
        self.refresh_headroom_for(&ops);
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
        &mut self,
        ops: &[BatchOp],
        access: Access,
        fresh: bool,
    ) -> std::result::Result<Vec<BatchOut>, ()> {
        let deferred = self.groups_usage();
        self.leased_undo.clear();
        let needs_section = access != Access::Append || !deferred;
        let sec = if needs_section {
            match self.enter_as(access) {
                Ok(sec) => Some(sec),
                Err(e) => {
                    return Ok(ops
                        .iter()
                        .map(|op| match op {
                            BatchOp::Lease { .. } => BatchOut::Lease(Err(e.clone())),
                            BatchOp::LeaseAny { .. } => BatchOut::LeaseAny(Err(e.clone())),
                            _ => BatchOut::Done(Err(e.clone())),
                        })
                        .collect())
                }
            }
        } else {
            None
        };
        let now = sec.as_ref().map_or_else(|| self.clock.now_ms(), |s| s.now);
        let mut writes: Vec<Write> = Vec::new();
        let mut outs = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                BatchOp::Lease { route, est, limits, check } => {
                    outs.push(BatchOut::Lease(self.batch_lease(
                        route,
                        *est,
                        limits.clone(),
                        *check,
                        now,
                        &mut writes,
                    )));
                }
                BatchOp::LeaseAny { routes, est, strategy } => {
                    outs.push(BatchOut::LeaseAny(self.batch_lease_any(
                        routes,
                        *est,
                        *strategy,
                        now,
                        &mut writes,
                    )));
                }
                BatchOp::Success { lease_id, route, tokens } => {
                    let out = self.batch_success(*lease_id, route, *tokens, now, deferred, &mut writes);
                    outs.push(BatchOut::Done(out));
                }
                BatchOp::Release(lease_id) => {
                    let w = Write::DeleteLease(*lease_id);
                    self.apply_local(&w, 0, now);
                    if deferred {
                        self.buffer(w, now);
                    } else {
                        writes.push(w);
                    }
                    outs.push(BatchOut::Done(Ok(())));
                }
            }
        }
        let Some(sec) = sec else { return Ok(outs) };
        let refused = outs.iter().any(BatchOut::refused);
        if sec.stale && refused && !fresh {
            // What refused may have been freed meanwhile: read, then decide again.
            self.undo_leases(&writes, now);
            self.unit.store.rollback();
            let _ = self.read(|_, _| ());
            return Err(());
        }
        match self.leave_applied(sec, writes) {
            Applied::Done => Ok(outs),
            Applied::Conflict(writes) => {
                self.undo_leases(&writes, now);
                Err(())
            }
            Applied::Rejected(writes, e) => {
                // Nothing was written: every operation of the batch fails, and the
                // mirror forgets what they did.
                self.undo_leases(&writes, now);
                self.unit.rebuild = true;
                let e = Error::from(e);
                Ok(outs
                    .into_iter()
                    .map(|o| match o {
                        BatchOut::Lease(_) => BatchOut::Lease(Err(e.clone())),
                        BatchOut::LeaseAny(_) => BatchOut::LeaseAny(Err(e.clone())),
                        BatchOut::Done(_) => BatchOut::Done(Err(e.clone())),
                    })
                    .collect())
            }
        }
    }

    pub(super) fn batch_lease(
        &mut self,
        route: &Route,
        est: Estimate,
        limits: Option<LimitSet>,
        check: bool,
        now: i64,
        writes: &mut Vec<Write>,
    ) -> Result<i64> {
        check_estimate(est)?;
        let rid = if check {
            let (rid, _, adm) = self.judge(route, est, limits, now);
            if let Some(refusal) = refusal_of(route, &adm) {
                return Err(Error::Refused(Box::new(refusal)));
            }
            rid
        } else {
            self.mirror.route_id(&route.platform, &route.model_id, route.key_id)
        };
        let id = self.take_lease(route, rid, est, now, writes);
        if check {
            // `lease()`'s: a `Lease` stands for it (SPEC 18.5); `acquire_lease`'s id is
            // the caller's to release.
            self.own_leases.insert(id);
        }
        Ok(id)
    }

    /// SPEC 17.1 in a batch: every gate of every candidate (duplicates once), one of
    /// those that pass picked by `strategy`, its lease taken. Returns the lease and the
    /// index of its candidate in `routes`.
    pub(super) fn batch_lease_any(
        &mut self,
        routes: &[Route],
        est: Estimate,
        strategy: Strategy,
        now: i64,
        writes: &mut Vec<Write>,
    ) -> Result<(i64, usize)> {
        check_estimate(est)?;
        if routes.is_empty() {
            return Err(Error::invalid("routes is empty: give at least one (platform, model_id, key_id)"));
        }
        let mut refusals = Vec::new();
        // The pick so far: (index, score), a larger score better.
        let mut best: Option<(usize, RouteId, f64)> = None;
        for (i, route) in routes.iter().enumerate() {
            if routes[..i].iter().any(|r| r.key_id == route.key_id && r == route) {
                continue;
            }
            let ctx = self.gate_context(route, None, now);
            let rid = self.ready_route(route, &ctx.limits, now);
            let (adm, room) = if strategy == Strategy::Headroom {
                self.mirror.evaluate_scored(rid, est, &ctx, now)
            } else {
                (self.mirror.evaluate(rid, est, &ctx, now), 0.0)
            };
            if let Some(refusal) = refusal_of(route, &adm) {
                refusals.push(refusal);
                continue;
            }
            let score = match strategy {
                Strategy::Order => {
                    best = Some((i, rid, 0.0));
                    break;
                }
                Strategy::Headroom => {
                    self.cached_headroom(&route.platform, route.key_id, now).map_or(room, |k| room.min(k))
                }
                // Least recently leased first; never leased before all.
                Strategy::Spread => -(self.leased_at.get(&rid).copied().unwrap_or(0) as f64),
            };
            if best.is_none_or(|(_, _, b)| score > b) {
                best = Some((i, rid, score));
            }
        }
        match best {
            Some((i, rid, _)) => {
                let id = self.take_lease(&routes[i], rid, est, now, writes);
                self.own_leases.insert(id);
                Ok((id, i))
            }
            None => Err(Error::Refused(Box::new(
                Refusal::of_candidates(refusals).ok_or_else(|| Error::Internal("no candidate".into()))?,
            ))),
        }
    }

    /// `key_quota_headroom` of a key as this engine last read it (refreshed before the
    /// batch by `refresh_headroom_for`), while fresh.
    fn cached_headroom(&self, platform: &str, key_id: i64, now: i64) -> Option<f64> {
        self.fresh_headroom(platform, now)?.iter().find(|(k, _)| *k == key_id).map(|(_, h)| *h)
    }

    /// Before a batch's section: the observed quota headroom of the platforms a
    /// `headroom` pick will read (cached 5 s; a store read at most that often).
    fn refresh_headroom_for(&mut self, ops: &[BatchOp]) {
        let now = self.clock.now_ms();
        let mut stale: Vec<String> = Vec::new();
        for op in ops {
            if let BatchOp::LeaseAny { routes, strategy: Strategy::Headroom, .. } = op {
                for r in routes {
                    if self.fresh_headroom(&r.platform, now).is_none() && !stale.contains(&r.platform) {
                        stale.push(r.platform.clone());
                    }
                }
            }
        }
        for p in stale {
            // Unreadable quota state: pick on the windows alone.
            let _ = self.key_quota_headroom(&p);
        }
    }

    /// Takes the lease (the gates already passed), inside the batch's section.
    fn take_lease(
        &mut self,
        route: &Route,
        rid: RouteId,
        est: Estimate,
        now: i64,
        writes: &mut Vec<Write>,
    ) -> i64 {
        // On Redis, a lease on a shared account conflicts with any other engine's
        // writes on the account's other keys (SPEC §14.3).
        if let Some(keys) = self.mirror.shared_account_keys(route) {
            self.unit.store.watch_keys(&route.platform, &keys);
        }
        let w = self.lease_write(route, est, now);
        let Write::InsertLease(LeaseRow { id, .. }) = w else {
            unreachable!("lease_write builds an InsertLease")
        };
        self.apply_local(&w, id, now);
        writes.push(w);
        self.leases_taken += 1;
        let before = self.leased_at.insert(rid, self.leases_taken);
        self.leased_undo.push((rid, before));
        id
    }

    pub(super) fn batch_success(
        &mut self,
        lease_id: i64,
        route: &Route,
        tokens: Option<TokenUse>,
        now: i64,
        deferred: bool,
        writes: &mut Vec<Write>,
    ) -> Result<()> {
        let total = tokens.map(|t| t.validate()).transpose()?;
        let mut ws = vec![self.usage_row(route, UsageKind::Request, 0, TokenKinds::default(), now)];
        if let (Some(total), Some(t)) = (total, tokens) {
            ws.push(self.usage_row(route, UsageKind::Tokens, total, t.kinds, now));
        }
        self.clear_history_on_success(route, &mut ws);
        ws.push(Write::DeleteLease(lease_id));
        for w in ws {
            self.apply_local(&w, 0, now);
            if deferred {
                self.buffer(w, now);
            } else {
                writes.push(w);
            }
        }
        Ok(())
    }

    /// Applies a write to the mirror. Returns the count of a delete (0 otherwise).
    pub(super) fn apply_local(&mut self, w: &Write, id: i64, now: i64) -> i64 {
        match w {
            Write::Usage(u) => self.mirror.add_usage_row(u, now),
            Write::InsertLease(l) => {
                let rid = self.mirror.route_id(&l.platform, &l.model_id, l.key_id);
                self.mirror.add_lease(
                    id,
                    LeaseRec {
                        route: rid,
                        tokens: l.tokens,
                        output_tokens: l.output_tokens,
                        created_at_ms: l.created_at_ms,
                        expires_at_ms: l.expires_at_ms,
                    },
                );
                return id;
            }
            Write::DeleteLease(id) => {
                self.own_leases.remove(id);
                return i64::from(self.mirror.remove_lease(*id).is_some());
            }
            Write::UpsertCooldown(c) => {
                let rid = self.mirror.route_id(&c.platform, &c.model_id, c.key_id);
                self.mirror.cooldowns.insert(
                    rid,
                    CooldownRec { expires_at_ms: c.expires_at_ms, source: c.source, set_at_ms: c.set_at_ms },
                );
            }
            Write::DeleteCooldown { platform, model_id, key_id } => {
                if let Some(rid) = self.mirror.find_route(platform, model_id, *key_id) {
                    return i64::from(self.mirror.cooldowns.remove(&rid).is_some());
                }
            }
            Write::DeleteCooldownsForKey(key_id) => {
                let routes: Vec<RouteId> = self
                    .mirror
                    .cooldowns
                    .keys()
                    .copied()
                    .filter(|rid| self.mirror.route(*rid).key_id == *key_id)
                    .collect();
                for rid in &routes {
                    self.mirror.cooldowns.remove(rid);
                }
                return routes.len() as i64;
            }
            Write::DeleteExpiredCooldowns(t) => {
                let before = self.mirror.cooldowns.len();
                self.mirror.cooldowns.retain(|_, c| c.expires_at_ms > *t);
                return (before - self.mirror.cooldowns.len()) as i64;
            }
            Write::UpsertKey(k) => self.mirror.put_key(k.clone()),
            Write::UpsertModel(m) => self.mirror.put_model(m.clone()),
            Write::SetCaps(p, c) => {
                self.mirror.caps.insert(p.clone(), *c);
            }
            Write::ResetCaps(p) => {
                self.mirror.caps.remove(p);
            }
            Write::InsertHistory(h) => self.mirror.add_history(h.clone()),
            Write::DeleteHistory { key_id, route, kinds } => {
                return self.mirror.remove_history(*key_id, route.as_ref().map(|(p, m)| (&**p, &**m)), kinds);
            }
            Write::Sweep { history_before, .. } => {
                self.mirror.prune_history(*history_before);
            }
            Write::SetCalendar { platform, zone } => {
                let set = self.mirror.zones_with(platform, zone.as_deref());
                if self.mirror.replace_calendars(set) {
                    // The platform's day windows start over: count them again from the store.
                    self.unit.rebuild = true;
                }
            }
            Write::Log(_) | Write::UpsertQuotaState(_) => {}
        }
        0
    }

    /// Keeps a write for the store (degraded, or grouped by `flush_interval_ms`).
    pub(super) fn buffer(&mut self, w: Write, now: i64) {
        if self.unit.pending_since.is_none() {
            self.unit.pending_since = Some(now);
        }
        match w {
            Write::Sweep { .. } => return,
            // A lease taken while degraded is written when the store answers again,
            // so that other processes count it from then on.
            Write::InsertLease(LeaseRow { id, .. }) => {
                self.unit.pending_inserted.insert(id);
                self.unit.pending.push(w);
            }
            Write::DeleteLease(id) => {
                self.unit.pending_deleted.insert(id);
                self.unit.pending.push(w);
            }
            w => self.unit.pending.push(w),
        }
        // A held lock's writes are committed within its period: nothing to merge.
        if self.unit.pending.len() >= self.unit.compact_at && self.unit.held.is_none() {
            self.compact_pending(now);
            self.unit.compact_at = (self.unit.pending.len() * 2).max(COMPACT_MIN);
        }
    }

    /// What the retention sweep keeps at `now` (SPEC 10, 14.2): usage younger than
    /// `retention_ms`, and of a model with a declared week, month or sliding window
    /// (wider than the minute), the rows that window counts, per model in its own
    /// platform's calendar; with `with_day` also today's rows of a model declaring a
    /// day window (the degraded buffer, SPEC 18.2).
    pub(super) fn retention(&mut self, now: i64, with_day: bool) -> Retention {
        let before = now.saturating_sub(self.settings.retention_ms);
        Retention { before, kept: self.mirror.retained_usage(now, before, with_day).into() }
    }

    /// Compacts the buffer, so that however long an outage lasts it holds about the
    /// windows' width of events (SPEC 18.2): buffered usage the sweep after the replay
    /// would delete is dropped (what retention keeps, and today when a model declares
    /// a day window), usage rows that left the minute window are merged into one row
    /// per (route, kind, UTC minute), a lease taken and ended while both waited goes
    /// (neither ever reaches the store), an observed quota row keeps its last value,
    /// and `server_logs` rows beyond the newest 10,000 go, with one warning. Nothing
    /// is lost from any window that counts.
    pub(super) fn compact_pending(&mut self, now: i64) {
        let retention = self.retention(now, true);
        let logs = self.unit.pending.iter().filter(|w| matches!(w, Write::Log(_))).count();
        let mut logs_to_drop = logs.saturating_sub(MAX_BUFFERED_LOGS);
        let horizon = now.saturating_sub(MINUTE_MS);
        let mut merged: HashMap<MergeKey, UsageRow> = HashMap::new();
        let mut kept = Vec::with_capacity(self.unit.pending.len());
        let mut order = Vec::new();
        let mut quota_at: HashMap<(String, i64, String, String), usize> = HashMap::new();
        let (inserted, deleted) = (&self.unit.pending_inserted, &self.unit.pending_deleted);
        let mut ended = Vec::new();
        for w in self.unit.pending.drain(..) {
            match w {
                Write::Usage(u) if !retention.keeps(&u) => {}
                Write::Usage(u) if u.created_at_ms <= horizon => {
                    let minute = u.created_at_ms.div_euclid(MINUTE_MS);
                    let key = (
                        u.platform.clone(),
                        u.model_id.clone(),
                        u.key_id,
                        u.kind == UsageKind::Request,
                        minute,
                    );
                    match merged.get_mut(&key) {
                        Some(m) => {
                            m.tokens = m.tokens.saturating_add(u.tokens);
                            m.kinds = m.kinds.merged(u.kinds);
                            m.count = m.count.saturating_add(u.count);
                            m.created_at_ms = m.created_at_ms.max(u.created_at_ms);
                        }
                        None => {
                            order.push(key.clone());
                            merged.insert(key, u);
                        }
                    }
                }
                Write::InsertLease(l) if deleted.contains(&l.id) => ended.push(l.id),
                Write::DeleteLease(id) if inserted.contains(&id) => {}
                Write::Log(_) if logs_to_drop > 0 => logs_to_drop -= 1,
                Write::UpsertQuotaState(q) => {
                    let key = (q.platform.clone(), q.key_id, q.pool_key.clone(), q.metric.clone());
                    match quota_at.get(&key) {
                        Some(&i) => kept[i] = Write::UpsertQuotaState(q),
                        None => {
                            quota_at.insert(key, kept.len());
                            kept.push(Write::UpsertQuotaState(q));
                        }
                    }
                }
                w => kept.push(w),
            }
        }
        for id in ended {
            self.unit.pending_inserted.remove(&id);
            self.unit.pending_deleted.remove(&id);
        }
        self.unit.pending =
            order.into_iter().filter_map(|k| merged.remove(&k)).map(Write::Usage).chain(kept).collect();
        if logs > MAX_BUFFERED_LOGS && !self.unit.logs_dropped {
            self.unit.logs_dropped = true;
            let msg = format!(
                "the database is still failing: server_logs rows beyond the newest {MAX_BUFFERED_LOGS} \
                 are dropped from the buffer"
            );
            self.note(log::Level::Warn, Some("degraded"), msg);
        }
    }

    /// SPEC 19.1: the server refused for a reason that waiting will not cure; an
    /// error for the log (and `server_logs`), not an outage.
    pub(super) fn rejected(&mut self, e: &StoreError) {
        self.note(log::Level::Error, Some("database"), format!("the database refused: {e}"));
    }

    pub(super) fn store_failed(&mut self, e: &StoreError, write: bool) {
        self.unit.read_failed = true;
        if !write {
            // A failed read: keep serving from memory; writes decide degraded mode.
            self.logs.push((log::Level::Debug, format!("database read failed: {e}")));
            return;
        }
        if !self.unit.degraded {
            self.unit.degraded = true;
            let msg = format!(
                "database write failed ({e}); serving from memory and buffering changes until it answers"
            );
            self.note(log::Level::Warn, Some("degraded"), msg);
        }
    }

    /// A record for the host's logger. Warnings and errors also become a
    /// `server_logs` row (SPEC §12), written with the next commit, so that every
    /// engine and notebook on the store sees them.
    pub(super) fn note(&mut self, level: log::Level, event: Option<&str>, message: String) {
        if level <= log::Level::Warn && !self.unit.store.readonly() {
            self.unit.pending.push(Write::Log(LogRow {
                level: if level == log::Level::Error { "error" } else { "warn" },
                source: "quotaengine".into(),
                provider: None,
                model: None,
                event: event.map(str::to_string),
                message: message.clone(),
                created_at_ms: self.clock.now_ms(),
            }));
        }
        self.logs.push((level, message));
    }

    /// Runs `f` on the mirror inside a read section.
    pub(super) fn read<T>(&mut self, f: impl FnOnce(&mut Mirror, i64) -> T) -> Result<T> {
        let sec = self.enter(false)?;
        let out = f(&mut self.mirror, sec.now);
        self.leave(sec, Vec::new())?;
        Ok(out)
    }

    /// A use case that only reads, in one section: `f` answers with the engine as of
    /// `now` (the mirror synced with what other engines wrote).
    pub(super) fn reading<T>(&mut self, f: impl FnOnce(&mut Self, i64) -> T) -> Result<T> {
        let sec = self.enter(false)?;
        let out = f(self, sec.now);
        self.leave(sec, Vec::new())?;
        Ok(out)
    }

    /// A use case that writes, in one section holding the store's write lock: `f`
    /// decides at `now` and queues its writes, committed with the section; when `f`
    /// fails, none of them is. Returns what `f` answers and, per write, the id of an
    /// insert or the number of rows a delete removed.
    pub(super) fn writing<T>(
        &mut self,
        f: impl FnOnce(&mut Self, i64, &mut Vec<Write>) -> Result<T>,
    ) -> Result<(T, Vec<i64>)> {
        let sec = self.enter(true)?;
        let mut writes = Vec::new();
        match f(self, sec.now, &mut writes) {
            Ok(out) => Ok((out, self.leave(sec, writes)?)),
            Err(e) => {
                self.leave(sec, Vec::new())?;
                Err(e)
            }
        }
    }

    /// A write section with writes that do not depend on the mirror.
    pub(super) fn write(&mut self, writes: Vec<Write>) -> Result<Vec<i64>> {
        let sec = self.enter(true)?;
        self.leave(sec, writes)
    }

    /// Writes that decide nothing (usage rows, buffered changes): no need to take the
    /// store's lock first.
    pub(super) fn append(&mut self, writes: Vec<Write>) -> Result<()> {
        let sec = self.enter_as(Access::Append)?;
        self.leave(sec, writes).map(|_| ())
    }

    /// Usage writes (and lease releases) wait to be grouped (`flush_interval_ms > 0`).
    pub(super) fn groups_usage(&self) -> bool {
        self.settings.flush_interval_ms > 0 && !self.unit.store.readonly()
    }

    /// Usage writes: committed now, or grouped when `flush_interval_ms > 0`.
    pub(super) fn write_usage(&mut self, writes: Vec<Write>) -> Result<()> {
        if self.groups_usage() {
            let now = self.clock.now_ms();
            for w in writes {
                self.apply_local(&w, 0, now);
                self.buffer(w, now);
            }
            Ok(())
        } else {
            self.append(writes)
        }
    }

    /// Writes everything buffered (the flusher thread, `close()`).
    pub fn flush(&mut self) -> Result<()> {
        let idle =
            self.unit.pending.is_empty() && self.unit.held.is_none() && self.unit.store.undelivered() == 0;
        if idle || self.unit.store.readonly() {
            return Ok(());
        }
        self.unit.flush_requested = true;
        // Buffered writes were decided when they were made: they only append now.
        let out = self.append(Vec::new());
        self.unit.flush_requested = false;
        out
    }

    /// Ends a held write lock whose period is over (the flusher thread: an idle
    /// engine does not keep others waiting).
    pub fn end_hold_if_due(&mut self) -> Result<()> {
        if self.unit.held.is_some() && self.hold_period_over() {
            return self.flush();
        }
        Ok(())
    }

    /// The period of the flusher thread: the hold period when a write lock may be
    /// held across calls, else `flush_interval_ms`.
    pub fn tick_period(&self) -> Duration {
        self.unit.hold_for.unwrap_or(Duration::from_millis(self.settings.flush_interval_ms.max(0) as u64))
    }

    /// Ends this engine's live leases (SPEC 18.5), flushes and reports whether
    /// anything stayed unwritten.
    pub fn close(&mut self) -> Result<()> {
        if !self.unit.store.readonly() {
            let _ = self.end_own_leases();
        }
        let _ = self.flush();
        if !self.unit.pending.is_empty() || self.unit.store.undelivered() > 0 {
            let n = self.unit.pending.len() + self.unit.store.undelivered();
            self.logs.push((
                log::Level::Error,
                format!("closing with {n} changes the database did not accept; they are lost"),
            ));
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

/// The refusal of `route` when `adm` refuses.
fn refusal_of(route: &Route, adm: &Admission) -> Option<Refusal> {
    let reason = adm.reason.clone().filter(|_| !adm.allowed)?;
    Some(Refusal {
        reason,
        retry_at_ms: adm.retry_at_ms,
        platform: route.platform.clone(),
        model_id: route.model_id.clone(),
        key_id: route.key_id,
        candidates: Vec::new(),
    })
}

/// The retention of usage at one time (SPEC 10, 14.2): rows stamped `before` or later
/// stay, and of a model in `kept`, those stamped at or after its own cut-off.
#[derive(Debug, Clone)]
pub(super) struct Retention {
    pub before: i64,
    pub kept: Arc<[KeptUsage]>,
}

impl Retention {
    /// The oldest time of a row of this model that retention keeps.
    pub fn cutoff(&self, platform: &str, model_id: &str) -> i64 {
        self.kept
            .iter()
            .find(|k| &*k.platform == platform && &*k.model_id == model_id)
            .map_or(self.before, |k| k.before)
    }

    pub fn keeps(&self, u: &UsageRow) -> bool {
        u.created_at_ms >= self.cutoff(&u.platform, &u.model_id)
    }
}
