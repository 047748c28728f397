//! The unit of work of every call: a section reads what other engines changed
//! (sync), decides on the mirror, and ends by committing its writes (leave), or
//! buffers them while the store fails (degraded mode); grouped writes keep the
//! write lock across calls (hold) and flush together. Use cases in the sibling
//! files go through one door, [`Unit::run`] (`tx.rs`: a `Tx` gives the body the
//! mirror, the section's `now` and `push` for its writes); the batches of `batch.rs`
//! open and end their own section (`enter`, `leave_applied`). None touches the store
//! directly: [`Unit`] owns it, privately, with the mirror the sections keep in step
//! with it. The buffer (`buffer.rs`), the hold (`hold.rs`) and the retention
//! (`retention.rs`) are files of their own.
use super::{Engine, Settings};
use crate::core::clock::{Clock, DAY_MS, MINUTE_MS};
use crate::core::error::{Result, StoreError};
use crate::core::limits::LimitSet;
use crate::core::state::{FastMap, Mirror, Prepared, RouteId, Waiting};
use crate::core::store::{LeaseRow, LogRow, Store, Write};
use crate::core::types::Route;
use std::sync::Arc;
use std::time::Duration;

mod buffer;
mod hold;
mod retention;
mod tx;
use buffer::{Buffer, MAX_BUFFERED_LOGS};
use hold::Hold;
pub(super) use hold::HOLD_MAX_MS;
use retention::Retention;

/// A log record for the host's logger, emitted after the engine lock is released.
pub type LogRecord = (log::Level, String);

pub(super) struct Section {
    pub(super) now: i64,
    pub(super) online: bool,
    pub(super) write: bool,
    /// Inside the write lock this engine keeps across calls (`Engine::held`).
    pub(super) held: bool,
    /// A hot-path section (`Access::Decide` or `Access::Append`): its writes may wait
    /// in the held lock.
    pub(super) hot: bool,
    /// Decisions rest on what the engine knew before the section (an optimistic
    /// section): a refusal is confirmed on fresh data, and the commit may conflict.
    pub(super) stale: bool,
}

/// What a write section asks of the store.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    /// The write lock, held from the read to the commit.
    Write,
    /// Writes that decide nothing (usage rows, finished leases): no lock first.
    Append,
    /// Admissions decided on what is known, checked at commit (`begin_optimistic`).
    Decide,
}

/// How a write section ended.
pub(super) enum Committed {
    Done(Vec<i64>),
    /// An optimistic section's decisions were stale: nothing was written.
    Conflict,
    /// The store failed: the engine is degraded.
    Failed,
    /// The server refused (SPEC 19.1): nothing was written, the call fails.
    Rejected(StoreError),
}

/// How a batch's write section ended.
pub(super) enum Applied {
    Done,
    /// Stale decisions: the writes handed back, still applied to the mirror.
    Conflict(Vec<Write>),
    /// The server refused: the writes handed back, still applied to the mirror.
    Rejected(Vec<Write>, StoreError),
}

/// The unit of work's state: the store and the mirror of it (what every decision
/// reads, as a session keeps its identity map), the clock, the writes waiting for the
/// store, the write lock kept across calls, and whether the store answers. Sections
/// (`enter` .. `leave`), sync, commit, buffering and hold are its methods; the
/// engine's use cases open and close sections through them.
pub(super) struct Unit {
    store: Box<dyn Store>,
    /// What the engine knows of the store: synced at each section's start, and every
    /// write applied to it as it is made.
    pub(super) mirror: Mirror,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) settings: Settings,
    /// Records for the host's logger, taken after the engine lock is released.
    pub(super) logs: Vec<LogRecord>,
    /// The leases this engine took for a `Lease` (`lease()`, `lease_any()`) and has
    /// not ended (SPEC 18.5: `close()` ends them), less those whose `Lease` object was
    /// dropped while live (they count until `lease_max_age_ms`, as a crashed
    /// process's do). `acquire_lease`'s ids are the caller's to release. Each with its
    /// row as last written: SPEC 24.1 renews them while they live.
    pub(super) own_leases: FastMap<i64, LeaseRow>,
    /// When the oldest own lease is due for renewal at a call (half its max age since
    /// it was written or last renewed); `i64::MAX` without own leases.
    pub(super) renew_at: i64,

    /// Writes applied to the mirror but not yet to the store (`buffer.rs`).
    pending: Buffer,
    flush_requested: bool,
    degraded: bool,
    loaded: bool,
    rebuild: bool,
    last_now: Option<i64>,
    /// The time of the last section that found the mirror up to date with the store
    /// (or, an optimistic one, brought what changed for the next): how old what the
    /// engine knows of other engines' writes can be.
    known_at: Option<i64>,
    last_sweep: Option<i64>,
    /// The last read section could not read the store.
    read_failed: bool,
    /// The write lock kept across calls (`hold.rs`).
    hold: Hold,
    /// SPEC 27.1: what `stats()` reports of the engine.
    pub(super) counters: crate::core::stats::EngineCounters,
}

impl Unit {
    pub(super) fn new(
        store: Box<dyn Store>, clock: Arc<dyn Clock>, settings: Settings, mirror: Mirror,
    ) -> Unit {
        Unit {
            store,
            mirror,
            clock,
            settings,
            logs: Vec::new(),
            own_leases: FastMap::default(),
            renew_at: i64::MAX,
            pending: Buffer::new(),
            flush_requested: false,
            degraded: false,
            loaded: false,
            rebuild: false,
            last_now: None,
            known_at: None,
            last_sweep: None,
            read_failed: false,
            hold: Hold::default(),
            counters: Default::default(),
        }
    }

    // ---- the one entry to the store outside a section's protocol ----------------

    pub(super) fn readonly(&self) -> bool {
        self.store.readonly()
    }

    /// True while the store is failing and the engine serves from memory.
    pub(super) fn degraded(&self) -> bool {
        self.degraded
    }

    /// The last read section could not read the store.
    pub(super) fn read_failed(&self) -> bool {
        self.read_failed
    }

    /// Whether what the engine knows of other engines' writes may be older than
    /// `max_age_ms` at `now` (nothing known yet counts as old).
    pub(super) fn known_before(&self, now: i64, max_age_ms: i64) -> bool {
        self.known_at.is_none_or(|at| now < at || now.saturating_sub(at) >= max_age_ms)
    }

    /// Writes waiting for the store.
    pub(super) fn pending_len(&self) -> usize {
        self.pending.writes.len()
    }

    /// With grouped writes: how long the write lock may be kept across calls.
    pub(super) fn set_hold_for(&mut self, period: Duration) {
        self.hold.set_period(period);
    }

    /// Abandons the open section (nothing of it is written).
    pub(super) fn rollback(&mut self) {
        self.store.rollback();
    }

    /// The next section that reaches the store counts every window again from it.
    pub(super) fn reload(&mut self) {
        self.rebuild = true;
    }

    /// After a caught panic: abandons any open section and reloads from the store.
    pub(super) fn recover_after_panic(&mut self) {
        self.store.rollback();
        self.rebuild = true;
        if self.hold.end() {
            // What the held lock's calls decided is still in `pending`: write it next.
            self.flush_requested = true;
        }
    }

    /// In the child after `fork()`: see [`Store::after_fork`].
    pub(super) fn after_fork(&mut self) -> bool {
        self.hold.end();
        self.store.after_fork()
    }

    /// Reads the store directly, beside the mirror (the analysis reads, the observed
    /// quota states, a claim across the fleet): the one way to the store outside a
    /// section's protocol.
    pub(super) fn store_read<T>(&mut self, f: impl FnOnce(&mut dyn Store) -> T) -> T {
        f(&mut *self.store)
    }

    // ---- sections ------------------------------------------------------------------

    /// Opens the store's side of a section as `access` asks; while degraded, probes
    /// without waiting on another engine's lock. Returns whether its decisions rest
    /// on what was known before (an optimistic section).
    fn begin(&mut self, access: Access, busy_timeout_ms: i64) -> std::result::Result<bool, StoreError> {
        if self.degraded {
            self.store.set_busy_timeout(0);
        }
        let mut stale = false;
        let began = match access {
            Access::Read | Access::Write => self.store.begin(access == Access::Write),
            Access::Append => self.store.begin_append(),
            Access::Decide => self.store.begin_optimistic().map(|s| stale = s),
        };
        if self.degraded {
            self.store.set_busy_timeout(busy_timeout_ms);
        }
        began.map(|()| stale)
    }

    /// A held write lock is kept for this hot-path section's writes (its period is
    /// not over, and no flush asked for it to end).
    fn keeps_holding(&self, sec: &Section) -> bool {
        sec.held && sec.hot && !self.flush_requested && !self.hold.period_over()
    }

    /// Writes the store has not accepted (buffered, or left in doubt).
    fn unwritten(&self) -> usize {
        self.pending.writes.len() + self.store.undelivered()
    }
}

impl Unit {
    // ---- sections ----------------------------------------------------------------

    /// Opens a section as `access` asks (see [`Unit::run`]; a batch opens and ends
    /// its own, `batch.rs`).
    pub(super) fn enter(&mut self, mut access: Access) -> Result<Section> {
        let write = access != Access::Read;
        if write && self.readonly() {
            return Err(StoreError::ReadOnly.into());
        }
        let hot = matches!(access, Access::Decide | Access::Append);
        let start_hold = hot && !self.hold.held() && !self.degraded && self.hold.may_start(&mut *self.store);
        if start_hold {
            access = Access::Write;
        }
        let held = self.hold.held();
        let mut online = held;
        let mut stale = false;
        self.read_failed = false;
        // Holding the write lock, nothing can have changed under us.
        let need_store = !held
            && (write
                || !self.loaded
                || self.rebuild
                || self.mirror.needs_reload
                || self.store.changed().unwrap_or(true));
        if need_store {
            match self.begin(access, self.settings.busy_timeout_ms) {
                Ok(s) => {
                    online = true;
                    stale = s;
                }
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
        if let Some(last) = self.last_now {
            if now < last {
                // SPEC §2/§10: the clock stepped back. Events pruned from the minute
                // window may count again: reload the windows, and sweep again.
                self.rebuild = true;
                self.last_sweep = None;
            }
        }
        self.last_now = Some(now);
        if !online && self.rebuild && !write {
            // A read noticed the step back: open a read snapshot to reload from.
            match self.store.begin(false) {
                Ok(()) => online = true,
                Err(e) => self.store_failed(&e, false),
            }
        }
        if online && (!held || self.rebuild) {
            if let Err(e) = self.sync(now) {
                self.rollback();
                self.hold.end();
                if let StoreError::Rejected(_) = e {
                    self.rejected(&e);
                    return Err(e.into());
                }
                self.store_failed(&e, write);
                online = false;
            }
        }
        if online && start_hold {
            self.hold.start();
        }
        let held = online && self.hold.held();
        if online || !need_store {
            self.known_at = Some(now);
        }
        Ok(Section { now, online, write, held, hot, stale: stale && online })
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
        self.rebuild = true;
        let mirror = &mut self.mirror;
        self.store.load_usage_since(since, &mut |r| mirror.add_usage_row(&r, now))?;
        for w in &self.pending.writes {
            if let Write::Usage(u) = w {
                self.mirror.add_usage_row(u, now);
            }
        }
        self.loaded = true;
        self.rebuild = false;
        Ok(())
    }

    /// A decision prepared by the mirror (see [`Mirror::prepare`]); a window the
    /// route's events were not kept for is counted from the store at once when the
    /// store answers, else at the next section that reaches it.
    pub(super) fn prepare(
        &mut self, route: &Route, limits: Option<LimitSet>, priority: i64, now: i64,
    ) -> Prepared {
        let p = self.mirror.prepare(route, limits, priority, now);
        if let (Some(rid), false) = (p.route, p.complete) {
            self.reload_windows(now);
            self.mirror.prune_route(rid, now);
        }
        p
    }

    /// A route ready for a decision at `now` under `limits`: pruned, and keeping every
    /// window they read. A window its events were not kept for (a wider sliding one,
    /// a new period) is counted from the store at once when the store answers, else
    /// at the next section that reaches it.
    pub(super) fn ready_route(&mut self, route: &Route, limits: &LimitSet, now: i64) -> RouteId {
        let rid = self.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        self.mirror.prune_route(rid, now);
        if !self.mirror.keep_windows(rid, limits) || self.mirror.needs_reload {
            self.reload_windows(now);
            self.mirror.prune_route(rid, now);
        }
        rid
    }

    /// Counts the windows a route now keeps from the store (or, degraded, at the next
    /// sync that can).
    pub(super) fn reload_windows(&mut self, now: i64) {
        if self.degraded || self.load_usage(now).is_err() {
            self.rebuild = true;
        }
    }

    pub(super) fn sync(&mut self, now: i64) -> std::result::Result<(), StoreError> {
        if !self.loaded || self.rebuild || self.mirror.needs_reload {
            self.load_usage(now)?;
        }
        self.lost_store(false);
        let changes = self.store.pull()?;
        let p = &self.pending;
        let waiting = Waiting { writes: &p.writes, deleted: &p.deleted, inserted: &p.inserted };
        self.rebuild |= self.mirror.apply_changes(changes, now, waiting);
        if std::mem::take(&mut self.mirror.needs_reload) {
            // A model declared a window its routes' events were not kept for.
            self.rebuild = true;
        }
        if self.rebuild {
            // A platform's calendar changed: its day windows count again from the store.
            return self.sync(now);
        }
        Ok(())
    }

    /// Inside an online write section: writes what is buffered (when due), the
    /// retention sweep and `writes`, then commits. Returns the per-write results.
    pub(super) fn commit_section(&mut self, now: i64, writes: &[Write]) -> Committed {
        let sweep_due = !matches!(self.last_sweep, Some(t) if now >= t && now.saturating_sub(t) < MINUTE_MS);
        // Grouped writes (flush_interval_ms) wait until they are due; buffered
        // writes of an outage go first thing.
        let flush_pending = self.degraded
            || self.hold.held()
            || self.flush_requested
            || self
                .pending
                .since
                .is_none_or(|t| now < t || now.saturating_sub(t) >= self.settings.flush_interval_ms);
        // Worked out only when a sweep or buffered usage needs it (not per commit).
        let retention = (sweep_due || (flush_pending && !self.pending.writes.is_empty()))
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
        let live = flush_pending.then(|| self.pending.live(retention.as_ref()));
        let result = write_and_commit(&mut *self.store, live, writes, sweep.as_ref(), &mut ids);
        // The commit (or the rollback) ends a held lock.
        self.hold.end();
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
                    if !self.store.sweep_unfinished() {
                        self.last_sweep = Some(now);
                    }
                }
                let flushed = if flush_pending { self.pending.writes.len() } else { 0 };
                if flush_pending {
                    self.pending.flushed();
                }
                self.flush_requested = false;
                // Its `server_logs` row goes with the next commit.
                self.lost_store(false);
                if let Some(e) = in_doubt {
                    self.store_failed(&StoreError::Unavailable(e), true);
                } else if self.degraded {
                    self.degraded = false;
                    self.counters.degraded(false);
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
                self.rollback();
                self.rejected(&e);
                Committed::Rejected(e)
            }
            Err(e) => {
                self.rollback();
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
                let _ = self.store.commit();
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

    /// Applies a write to the mirror. Returns the count of a delete (0 otherwise).
    pub(super) fn apply_local(&mut self, w: &Write, id: i64, now: i64) -> i64 {
        if let Write::DeleteLease(id) = w {
            self.drop_own(*id);
        }
        let (n, recount) = self.mirror.apply(w, id, now);
        // A platform's day windows started over: count them again from the store.
        self.rebuild |= recount;
        n
    }

    /// Applies a write a hot-path section decided to the mirror, before its commit
    /// (later operations of the batch see it). The keys the decision read are derived
    /// from it: on Redis, a lease on a shared account conflicts with any other engine's
    /// writes on the account's other keys (SPEC §14.3).
    pub(super) fn apply_decided(&mut self, w: &Write, now: i64) {
        if let Write::InsertLease(l) = w {
            if let Some(keys) = self.mirror.lease_account_keys(l) {
                self.store.watch_keys(&l.platform, &keys);
            }
            self.apply_local(w, l.id, now);
        } else {
            self.apply_local(w, 0, now);
        }
    }

    /// Keeps a write for the store (degraded, or grouped by `flush_interval_ms`).
    pub(super) fn buffer(&mut self, w: Write, now: i64) {
        if self.pending.push(w, now, self.hold.held()) {
            self.compact_pending(now);
            self.pending.compacted();
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
        if self.pending.compact(now, &retention) {
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
        self.read_failed = true;
        if self.lost_store(true) {
            return;
        }
        if !write {
            // A failed read: keep serving from memory; writes decide degraded mode.
            self.logs.push((log::Level::Debug, format!("database read failed: {e}")));
            return;
        }
        if !self.degraded {
            self.degraded = true;
            self.counters.degraded(true);
            let msg = format!(
                "database write failed ({e}); serving from memory and buffering changes until it answers"
            );
            self.note(log::Level::Warn, Some("degraded"), msg);
        }
    }

    /// SPEC 24.4: when the store was found to have lost its data, logs the error (its
    /// `server_logs` row goes with the next commit). The store writes back what this
    /// engine knows before its call goes on; when that could not be written (`failed`),
    /// the engine serves degraded, enforcing every limit from memory, until it is.
    /// True when the store had lost its data.
    fn lost_store(&mut self, failed: bool) -> bool {
        let Some(lost) = self.store.take_lost() else { return false };
        let msg = if failed {
            self.degraded = true;
            format!("{lost}; serving from memory until what this engine knows is written back")
        } else {
            format!("{lost}; wrote back what this engine knew (configuration, cooldowns, learned limits, its usage)")
        };
        self.note(log::Level::Error, Some("store_lost"), msg);
        true
    }

    /// A record for the host's logger. Warnings and errors also become a
    /// `server_logs` row (SPEC §12), written with the next commit, so that every
    /// engine and notebook on the store sees them.
    pub(super) fn note(&mut self, level: log::Level, event: Option<&str>, message: String) {
        if level <= log::Level::Warn && !self.readonly() {
            self.pending.writes.push(Write::Log(LogRow {
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

    /// A lease taken for a `Lease` object: renewed while it lives (SPEC 24.1).
    pub(super) fn keep_own(&mut self, row: LeaseRow) {
        let half = self.settings.lease_max_age_ms / 2;
        self.renew_at = self.renew_at.min(row.expires_at_ms.saturating_sub(half));
        self.own_leases.insert(row.id, row);
    }

    /// Lease `id` is no longer renewed (it ended, or its `Lease` object went away).
    pub(super) fn drop_own(&mut self, id: i64) {
        if self.own_leases.remove(&id).is_some() && self.own_leases.is_empty() {
            self.renew_at = i64::MAX;
        }
    }

    /// No lease is renewed any more (they ended, or belong to the parent of a fork).
    pub(super) fn drop_all_own(&mut self) -> impl Iterator<Item = LeaseRow> + '_ {
        self.renew_at = i64::MAX;
        self.own_leases.drain().map(|(_, l)| l)
    }

    /// Usage writes (and lease releases) wait to be grouped (`flush_interval_ms > 0`).
    pub(super) fn groups_usage(&self) -> bool {
        self.settings.flush_interval_ms > 0 && !self.readonly()
    }

    /// Writes everything buffered (the flusher thread, `close()`).
    pub fn flush(&mut self) -> Result<()> {
        // Nothing buffered, held or left in doubt: nothing to do.
        let idle = self.pending.writes.is_empty() && !self.hold.held() && self.store.undelivered() == 0;
        if idle || self.readonly() {
            return Ok(());
        }
        self.flush_requested = true;
        // Buffered writes were decided when they were made: they only append now.
        let out = self.run(Access::Append, |_| Ok(()));
        self.flush_requested = false;
        out.map(|_| ())
    }

    /// Ends a held write lock whose period is over (the flusher thread: an idle
    /// engine does not keep others waiting).
    pub fn end_hold_if_due(&mut self) -> Result<()> {
        if self.hold.held() && self.hold.period_over() {
            return self.flush();
        }
        Ok(())
    }

    /// The period of the flusher thread: the hold period when a write lock may be
    /// held across calls, else `flush_interval_ms`.
    pub fn tick_period(&self) -> Duration {
        self.hold.period().unwrap_or(Duration::from_millis(self.settings.flush_interval_ms.max(0) as u64))
    }
}

impl Engine {
    /// Writes everything buffered (the flusher thread, `close()`).
    pub fn flush(&mut self) -> Result<()> {
        self.unit.flush()
    }

    /// Ends a held write lock whose period is over (the flusher thread).
    pub fn end_hold_if_due(&mut self) -> Result<()> {
        self.unit.end_hold_if_due()
    }

    /// The period of the flusher thread.
    pub fn tick_period(&self) -> Duration {
        self.unit.tick_period()
    }

    /// Ends this engine's live leases (SPEC 18.5), flushes and reports whether
    /// anything stayed unwritten.
    pub fn close(&mut self) -> Result<()> {
        if !self.unit.readonly() {
            let _ = self.end_own_leases();
        }
        let _ = self.unit.flush();
        let n = self.unit.unwritten();
        if n > 0 {
            self.unit.logs.push((
                log::Level::Error,
                format!("closing with {n} changes the database did not accept; they are lost"),
            ));
        }
        Ok(())
    }
}

/// Inside an online write section: writes what is buffered (`live`), then `writes`,
/// then `sweep`, and commits. The per-write results (as far as they got) land in
/// `ids`.
fn write_and_commit(
    store: &mut dyn Store, live: Option<Vec<&Write>>, writes: &[Write], sweep: Option<&Write>,
    ids: &mut Vec<i64>,
) -> std::result::Result<(), StoreError> {
    if let Some(live) = live {
        // A lease taken and finished while both waited here never reaches the
        // store, nor does a usage row buffered past the retention.
        store.write_all(&live)?;
    }
    for w in writes {
        ids.push(store.write(w)?);
    }
    // Last, so that it sees every row, the section's own included.
    if let Some(s) = sweep {
        store.write(s)?;
    }
    store.commit()
}
