//! The engine: admission, accounting and cooldown state over a [`Store`].
//!
//! Every call runs as one *section*: take the store's lock (writes) or notice that
//! nothing changed (reads), read the clock, pull what other processes changed into
//! the in-memory [`Mirror`], decide from the mirror, then write and commit. The mirror
//! is updated per event, so no call scans history. When the store fails, the engine
//! keeps deciding from the mirror and buffers its writes (degraded mode, SPEC §10).
use crate::core::calendar::Calendar;
use crate::core::clock::{Clock, DAY_MS, MINUTE_MS};
use crate::core::cooldowns::{
    decide_limit, kind_rule, ladder_step, CooldownDecision, KindRule, LimitFacts, AUTH_LADDER_MS,
    EMPTY_STREAK_BENCH, LOCAL_BENCH_MS, UNKNOWN_HIT_WINDOW_MS,
};
use crate::core::env::Env;
use crate::core::error::{Error, Refusal, Result, StoreError};
use crate::core::limits::{Limit, LimitSet, WindowSpec};
use crate::core::parse::{
    infer_failure_kind, parse_provider_limit, parse_retry_after_ms, parse_stated_retry_ms, FailureKind,
    LearnedLimit, LimitAxis,
};
use crate::core::pools::is_local_base_url;
use crate::core::state::{Calendars, CooldownRec, GateContext, LeaseRec, Mirror, RouteId};
pub use crate::core::store::StoreSpec;
use crate::core::store::{
    Changes, CooldownRow, HistoryKind, HistoryRow, LogRow, QuotaStateRow, Store, UsageFilter, UsageKind,
    UsageRow, Write,
};
use crate::core::types::{
    check_name, check_non_negative, Admission, CapOverrides, CapSetting, Cooldown, CooldownSource, KeyInfo,
    Limits, ModelInfo, ProviderCaps, Reason, Route,
};
use crate::core::windows::Counts;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Construction settings (SPEC §3). The environment is a copy read once.
#[derive(Debug, Clone)]
pub struct Settings {
    pub retention_ms: i64,
    pub lease_max_age_ms: i64,
    pub window_usage_ttl_ms: i64,
    pub busy_timeout_ms: i64,
    pub flush_interval_ms: i64,
    pub readonly: bool,
    pub env: Env,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            retention_ms: 86_400_000,
            lease_max_age_ms: 120_000,
            window_usage_ttl_ms: 5_000,
            busy_timeout_ms: 5_000,
            flush_interval_ms: 0,
            readonly: false,
            env: Env::default(),
        }
    }
}

impl Settings {
    fn validate(&self) -> Result<()> {
        check_non_negative("retention_ms", self.retention_ms)?;
        check_non_negative("lease_max_age_ms", self.lease_max_age_ms)?;
        check_non_negative("window_usage_ttl_ms", self.window_usage_ttl_ms)?;
        check_non_negative("busy_timeout_ms", self.busy_timeout_ms)?;
        check_non_negative("flush_interval_ms", self.flush_interval_ms)?;
        Ok(())
    }
}

/// One window of a usage report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowReport {
    pub used: i64,
    pub limit: Option<i64>,
}

/// `usage()` (SPEC §4): recorded usage per window, live leases apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReport {
    pub rpm: WindowReport,
    pub rpd: WindowReport,
    pub tpm: WindowReport,
    pub tpd: WindowReport,
    pub in_flight: i64,
    /// Every other declared limit, by its reason, in gate order (SPEC §14.1).
    pub others: Vec<(String, WindowReport)>,
}

/// `retry_after=` of `record_failure`: header text, or a delay already in ms.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryAfter {
    Text(String),
    Millis(i64),
}

/// The inputs of `record_failure`.
#[derive(Debug, Clone, Default)]
pub struct FailureInput {
    pub status: Option<i64>,
    pub retry_after: Option<RetryAfter>,
    pub message: Option<String>,
    pub kind: Option<FailureKind>,
    pub limits: Option<LimitSet>,
}

/// What `record_failure` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureOutcome {
    pub kind: FailureKind,
    pub cooldown: Option<CooldownDecision>,
    pub learned: Option<LearnedLimit>,
}

type SnapshotUsage = HashMap<Arc<str>, HashMap<Arc<str>, HashMap<i64, Vec<(WindowSpec, Counts)>>>>;

/// The routing guardrail's snapshot (SPEC §9): window usage per route, reused for
/// `window_usage_ttl_ms`. Keys and limits are not part of it: they are read from the
/// mirror at each call, so a key or limit changed through this engine counts at once.
#[derive(Debug, Default)]
struct WindowSnapshot {
    built_at_ms: i64,
    /// platform -> model_id -> key_id -> what each window the route keeps has used.
    usage: SnapshotUsage,
}

/// One observation of a provider's quota (SPEC §8.2).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaObservation {
    pub platform: String,
    pub key_id: i64,
    pub model_id: Option<String>,
    pub pool_key: String,
    pub metric: &'static str,
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
    pub reset_at_ms: Option<i64>,
    pub retry_after_ms: Option<i64>,
    pub source: &'static str,
    pub confidence: f64,
    pub status: i64,
}

/// Confidence of an observation by its source (SPEC §8.2).
pub fn source_confidence(source: &str) -> f64 {
    match source {
        "header" => 1.0,
        "error_body" => 0.75,
        "probe" => 0.6,
        "local_usage" => 0.45,
        "documentation" => 0.35,
        _ => 0.0,
    }
}

/// A state row as it reads at `now`: past its reset, the window is full again.
fn replenished(mut row: QuotaStateRow, now: i64) -> QuotaStateRow {
    if row.reset_at_ms.is_some_and(|t| t <= now) {
        row.remaining = row.limit;
        row.reset_at_ms = None;
    }
    row
}

/// A hot-path operation that can share a commit with other callers' (group commit).
#[derive(Debug, Clone)]
pub enum BatchOp {
    /// `check = false`: `acquire_lease`, no gates.
    Lease {
        route: Route,
        est: i64,
        limits: Option<LimitSet>,
        check: bool,
    },
    Success {
        lease_id: i64,
        route: Route,
        tokens: Option<i64>,
    },
    Release(i64),
}

/// The result of one [`BatchOp`].
#[derive(Debug)]
pub enum BatchOut {
    Lease(Result<i64>),
    Done(Result<()>),
}

impl BatchOut {
    pub fn lease_id(self) -> Result<i64> {
        match self {
            BatchOut::Lease(r) => r,
            BatchOut::Done(r) => r.and(Err(Error::Internal("not a lease".into()))),
        }
    }
    pub fn done(self) -> Result<()> {
        match self {
            BatchOut::Lease(r) => r.map(|_| ()),
            BatchOut::Done(r) => r,
        }
    }
}

/// One route of `snapshot()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub route: Route,
    pub rpm_used: i64,
    pub rpd_used: i64,
    pub tpm_used: i64,
    pub tpd_used: i64,
    pub limits: Limits,
    /// Every other declared limit of the model: (reason, used, limit), in gate order.
    pub others: Vec<(String, i64, i64)>,
    pub in_flight: i64,
    pub cooldown: Option<CooldownRec>,
}

impl SnapshotRow {
    /// The worst used/limit over the declared windows (a limit of 0 counts as full);
    /// `None` without limits (SPEC §9, §12).
    pub fn used_fraction(&self) -> Option<f64> {
        let pairs = [
            (self.rpm_used, self.limits.rpm),
            (self.rpd_used, self.limits.rpd),
            (self.tpm_used, self.limits.tpm),
            (self.tpd_used, self.limits.tpd),
        ];
        let others = self.others.iter().map(|(_, used, limit)| (*used, Some(*limit)));
        pairs
            .into_iter()
            .chain(others)
            .filter_map(|(used, limit)| limit.map(|l| if l <= 0 { 1.0 } else { used as f64 / l as f64 }))
            .fold(None, |acc: Option<f64>, f| Some(acc.map_or(f, |a| a.max(f))))
    }
}

/// A log record for the host's logger, emitted after the engine lock is released.
pub type LogRecord = (log::Level, String);

/// One individual gate of SPEC §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Request,
    Tokens,
    ProviderDaily,
    ProviderMinute,
    ProviderTokens,
    KeyConcurrency,
    Cooldown,
}

struct Section {
    now: i64,
    online: bool,
    write: bool,
    /// Inside the write lock this engine keeps across calls (`Engine::held`).
    held: bool,
    /// A hot-path section (`Access::Decide` or `Access::Append`): its writes may wait
    /// in the held lock.
    hot: bool,
    /// Decisions rest on what the engine knew before the section (an optimistic
    /// section): a refusal is confirmed on fresh data, and the commit may conflict.
    stale: bool,
}

/// What a write section asks of the store.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    /// The write lock, held from the read to the commit.
    Write,
    /// Writes that decide nothing (usage rows, finished leases): no lock first.
    Append,
    /// Admissions decided on what is known, checked at commit (`begin_optimistic`).
    Decide,
}

/// How a write section ended.
enum Committed {
    Done(Vec<i64>),
    /// An optimistic section's decisions were stale: nothing was written.
    Conflict,
    /// The store failed: the engine is degraded.
    Failed,
}

/// Longest a sole engine keeps the write lock across calls (grouped writes): another
/// engine opening the file waits at most this long for it.
const HOLD_MAX_MS: i64 = 10;

/// Optimistic attempts of a lease batch before it takes the store's lock.
const OPTIMISTIC_ATTEMPTS: usize = 3;

/// (platform, model_id, key_id, is a request row, UTC minute) of a merged usage row.
type MergeKey = (Arc<str>, Arc<str>, i64, bool, i64);

/// Above this many buffered writes, usage rows outside the minute window are merged
/// per (route, kind, minute), so a long outage holds at most a day of minutes.
const COMPACT_MIN: usize = 4096;

pub struct Engine {
    store: Box<dyn Store>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    mirror: Mirror,
    /// Writes applied to the mirror but not yet to the store, in order.
    pending: Vec<Write>,
    /// Stored leases whose deletion is in `pending`.
    pending_deleted: HashSet<i64>,
    /// Leases whose insertion is in `pending` (taken while degraded).
    pending_inserted: HashSet<i64>,
    compact_at: usize,
    /// Engine time of the oldest write in `pending`.
    pending_since: Option<i64>,
    flush_requested: bool,
    degraded: bool,
    loaded: bool,
    rebuild: bool,
    last_now: Option<i64>,
    last_sweep: Option<i64>,
    lease_ids: LeaseIds,
    platform_env: HashMap<String, (ProviderCaps, Option<i64>)>,
    logs: Vec<LogRecord>,
    window_snapshot: Option<WindowSnapshot>,
    /// `key_quota_headroom` per platform: (built at, key -> headroom).
    headroom_cache: HashMap<String, (i64, Vec<(i64, f64)>)>,
    /// The last read section could not read the store.
    read_failed: bool,
    /// With grouped writes, how long the write lock may be kept from one call to the
    /// next while this engine is the store's only one (`None`: never).
    hold_for: Option<Duration>,
    /// Since when this engine keeps the store's write lock (an open transaction)
    /// across calls: nobody else can write meanwhile, so calls neither read nor
    /// write the store; the writes wait in `pending` for the commit that ends it.
    held: Option<Instant>,
    /// When to ask the store again whether this engine is its only one.
    next_sole_check: Option<Instant>,
}

impl Engine {
    /// Opens the store and loads today's state.
    pub fn open(spec: &StoreSpec, clock: Arc<dyn Clock>, settings: Settings) -> Result<Engine> {
        settings.validate()?;
        let store = spec.open(settings.readonly, settings.busy_timeout_ms)?;
        Self::with_store(store, clock, settings)
    }

    /// Builds an engine over any store.
    pub fn with_store(store: Box<dyn Store>, clock: Arc<dyn Clock>, settings: Settings) -> Result<Engine> {
        settings.validate()?;
        let day_zones = settings.env.day_zones();
        let mut engine = Engine {
            store,
            clock,
            settings,
            mirror: Mirror::with_calendars(Calendars::with_env(day_zones)),
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
            lease_ids: LeaseIds::new(),
            platform_env: HashMap::new(),
            logs: Vec::new(),
            window_snapshot: None,
            headroom_cache: HashMap::new(),
            read_failed: false,
            hold_for: None,
            held: None,
            next_sole_check: None,
        };
        if engine.settings.flush_interval_ms > 0 && !engine.settings.readonly {
            // Half the interval: a held lock ends at most one flusher tick after its
            // period, so nothing waits longer than `flush_interval_ms`.
            let ms = (engine.settings.flush_interval_ms / 2).clamp(1, HOLD_MAX_MS);
            engine.hold_for = Some(Duration::from_millis(ms as u64));
        }
        // Load now, so that a broken database is reported by the constructor.
        let sec = engine.enter(false)?;
        engine.leave(sec, Vec::new())?;
        // What is wrong in the environment is said once, here, and lands in
        // `server_logs` for every other reader of the store (SPEC §12).
        for w in engine.settings.env.warnings() {
            engine.note(log::Level::Warn, Some("config"), w);
        }
        engine.flush()?;
        Ok(engine)
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// True while the store is failing and the engine serves from memory.
    pub fn degraded(&self) -> bool {
        self.degraded
    }

    /// Log records produced since the last call (emit them outside any lock).
    pub fn take_logs(&mut self) -> Vec<LogRecord> {
        std::mem::take(&mut self.logs)
    }

    /// After a caught panic: abandon any open store section and reload from the store,
    /// so a half-applied change cannot linger in memory.
    pub fn recover_after_panic(&mut self) {
        self.store.rollback();
        self.rebuild = true;
        if self.held.take().is_some() {
            // What the held lock's calls decided is still in `pending`: write it next.
            self.flush_requested = true;
        }
    }

    /// Before `fork()`: ends a held write lock and writes what is buffered, so that no
    /// transaction is open across the fork and the child inherits nothing to write.
    pub fn prepare_fork(&mut self) {
        let _ = self.flush();
    }

    /// In the child just after `fork()`: true when this engine stays usable (its store
    /// is the child's own copy, an in-memory database); otherwise its store has let go
    /// of what the parent still uses, nothing of it is written, and the child opens
    /// the engine anew.
    pub fn after_fork(&mut self) -> bool {
        self.held = None;
        self.store.after_fork()
    }

    /// Number of writes waiting for the store.
    pub fn pending_writes(&self) -> usize {
        self.pending.len()
    }

    // ---- sections ----------------------------------------------------------------

    fn enter(&mut self, write: bool) -> Result<Section> {
        self.enter_as(if write { Access::Write } else { Access::Read })
    }

    fn enter_as(&mut self, mut access: Access) -> Result<Section> {
        let write = access != Access::Read;
        if write && self.store.readonly() {
            return Err(StoreError::ReadOnly.into());
        }
        let hot = matches!(access, Access::Decide | Access::Append);
        let start_hold = hot && self.held.is_none() && self.may_hold();
        if start_hold {
            access = Access::Write;
        }
        let held = self.held.is_some();
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
            // While degraded, probe the store without waiting on its lock.
            if self.degraded {
                self.store.set_busy_timeout(0);
            }
            let began = match access {
                Access::Read | Access::Write => self.store.begin(write),
                Access::Append => self.store.begin_append(),
                Access::Decide => self.store.begin_optimistic().map(|s| stale = s),
            };
            if self.degraded {
                self.store.set_busy_timeout(self.settings.busy_timeout_ms);
            }
            match began {
                Ok(()) => online = true,
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
                self.store.rollback();
                self.held = None;
                self.store_failed(&e, write);
                online = false;
            }
        }
        if online && start_hold {
            self.held = Some(Instant::now());
        }
        let held = online && self.held.is_some();
        Ok(Section { now, online, write, held, hot, stale: stale && online })
    }

    /// Whether a hot-path section may take the write lock and keep it across calls:
    /// grouped writes are on, the store answers, and no other engine has it open
    /// (asked at most once per hold period while others do).
    fn may_hold(&mut self) -> bool {
        let Some(period) = self.hold_for else { return false };
        if self.degraded {
            return false;
        }
        let now = Instant::now();
        if self.next_sole_check.is_some_and(|t| now < t) {
            return false;
        }
        if self.store.sole_writer() {
            return true;
        }
        self.next_sole_check = Some(now + period);
        false
    }

    /// A held write lock is kept for this hot-path section's writes (its period is
    /// not over, and no flush asked for it to end).
    fn keeps_holding(&self, sec: &Section) -> bool {
        sec.held && sec.hot && !self.flush_requested && !self.hold_period_over()
    }

    /// A write lock is kept across calls and its period has not run out.
    fn hold_period_over(&self) -> bool {
        self.held.zip(self.hold_for).is_none_or(|(t, period)| t.elapsed() >= period)
    }

    /// Counts every window again from the store: the rows that count at `now` (the
    /// minute, today, and every window a route keeps or a model declares) and what is
    /// buffered.
    fn load_usage(&mut self, now: i64) -> std::result::Result<(), StoreError> {
        let since = self.mirror.usage_horizon(now);
        // Rows stream into the windows (a month of them is never held at once). A
        // load that fails half-way leaves `rebuild` set: the next section that
        // reaches the store counts again from scratch.
        self.mirror.reset_usage();
        self.rebuild = true;
        let mirror = &mut self.mirror;
        self.store.load_usage_since(since, &mut |r| mirror.add_usage_row(&r, now))?;
        for w in &self.pending {
            if let Write::Usage(u) = w {
                self.mirror.add_usage_row(u, now);
            }
        }
        self.loaded = true;
        self.rebuild = false;
        Ok(())
    }

    /// A route ready for a decision at `now` under `limits`: pruned, and keeping every
    /// window they read. A window its events were not kept for (a wider sliding one,
    /// a new period) is counted from the store at once when the store answers, else
    /// at the next section that reaches it.
    fn ready_route(&mut self, route: &Route, limits: &LimitSet, now: i64) -> RouteId {
        let rid = self.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        self.mirror.prune_route(rid, now);
        if !self.mirror.keep_windows(rid, limits) || self.mirror.needs_reload {
            if self.degraded || self.load_usage(now).is_err() {
                self.rebuild = true;
            }
            self.mirror.prune_route(rid, now);
        }
        rid
    }

    fn sync(&mut self, now: i64) -> std::result::Result<(), StoreError> {
        if !self.loaded || self.rebuild || self.mirror.needs_reload {
            self.load_usage(now)?;
        }
        let changes = self.store.pull()?;
        self.apply_changes(changes, now);
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

    fn apply_changes(&mut self, ch: Changes, now: i64) {
        for r in &ch.usage {
            self.mirror.add_usage_row(r, now);
        }
        if let Some(leases) = &ch.leases {
            self.mirror.replace_stored_leases(leases, &self.pending_deleted, &self.pending_inserted);
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
                self.rebuild = true;
            }
        }
        if tables_changed && !self.pending.is_empty() {
            // Our own buffered changes are newer than what the store holds.
            let pending = std::mem::take(&mut self.pending);
            // Leases are reconciled by `replace_stored_leases` (pending inserts kept,
            // pending deletes skipped); re-applying an insert would resurrect a
            // lease finished while its writes waited.
            for w in pending
                .iter()
                .filter(|w| !matches!(w, Write::Usage(_) | Write::DeleteLease(_) | Write::InsertLease { .. }))
            {
                self.apply_local(w, 0, now);
            }
            self.pending = pending;
        }
    }

    /// Inside an online write section: writes what is buffered (when due), the
    /// retention sweep and `writes`, then commits. Returns the per-write results.
    fn commit_section(&mut self, now: i64, writes: &[Write]) -> Committed {
        // SPEC §14.2: the rows of the current period of a declared week or month limit
        // (and of a declared sliding window) are kept past the retention.
        let retained_from =
            now.saturating_sub(self.settings.retention_ms).min(self.mirror.declared_usage_from(now));
        let sweep = match self.last_sweep {
            Some(t) if now >= t && now - t < MINUTE_MS => None,
            _ => Some(Write::Sweep {
                usage_before: retained_from,
                leases_expired_before: now,
                history_before: now.saturating_sub(DAY_MS),
            }),
        };
        // Grouped writes (flush_interval_ms) wait until they are due; buffered
        // writes of an outage go first thing.
        let flush_pending = self.degraded
            || self.held.is_some()
            || self.flush_requested
            || self.pending_since.is_none_or(|t| now < t || now - t >= self.settings.flush_interval_ms);
        let result = (|| -> std::result::Result<Vec<i64>, StoreError> {
            if flush_pending {
                // A lease taken and finished while both waited here never reaches the
                // store, nor does a usage row buffered past the retention.
                let (inserted, deleted) = (&self.pending_inserted, &self.pending_deleted);
                let live: Vec<&Write> = self
                    .pending
                    .iter()
                    .filter(|w| match w {
                        Write::InsertLease { id, .. } => !deleted.contains(id),
                        Write::DeleteLease(id) => !inserted.contains(id),
                        Write::Usage(u) => u.created_at_ms >= retained_from,
                        _ => true,
                    })
                    .collect();
                self.store.write_all(&live)?;
            }
            let mut ids = Vec::with_capacity(writes.len());
            for w in writes {
                ids.push(self.store.write(w)?);
            }
            // Last, so that it sees every row, the section's own included.
            if let Some(s) = &sweep {
                self.store.write(s)?;
            }
            self.store.commit()?;
            Ok(ids)
        })();
        // The commit (or the rollback) ends a held lock.
        self.held = None;
        match result {
            Ok(ids) => {
                if sweep.is_some() {
                    self.last_sweep = Some(now);
                }
                let flushed = if flush_pending { self.pending.len() } else { 0 };
                if flush_pending {
                    self.pending.clear();
                    self.pending_deleted.clear();
                    self.pending_inserted.clear();
                    self.pending_since = None;
                    self.compact_at = COMPACT_MIN;
                }
                self.flush_requested = false;
                if self.degraded {
                    self.degraded = false;
                    self.logs.push((
                        log::Level::Info,
                        format!("database answers again: wrote {flushed} buffered changes"),
                    ));
                }
                Committed::Done(ids)
            }
            // The store took in what changed; the section is over.
            Err(StoreError::Conflict) => Committed::Conflict,
            Err(e) => {
                self.store.rollback();
                self.store_failed(&e, true);
                Committed::Failed
            }
        }
    }

    /// Ends a section: writes (after anything buffered), commits, then applies the
    /// writes to the mirror. Returns, per write, the id of an insert or the number of
    /// rows a delete removed. When the store fails, the writes are applied and kept
    /// for later (degraded mode).
    fn leave(&mut self, sec: Section, writes: Vec<Write>) -> Result<Vec<i64>> {
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
            if let Committed::Done(ids) = self.commit_section(now, &writes) {
                let mut out = Vec::with_capacity(ids.len());
                for (w, id) in writes.iter().zip(ids) {
                    let local = self.apply_local(w, id, now);
                    out.push(if matches!(w, Write::InsertLease { .. }) { id } else { local.max(id) });
                }
                return Ok(out);
            }
        }
        let mut out = Vec::with_capacity(writes.len());
        for w in writes {
            let id = match &w {
                Write::InsertLease { id, .. } => *id,
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
    fn leave_applied(&mut self, sec: Section, writes: Vec<Write>) -> Option<Vec<Write>> {
        let now = sec.now;
        if sec.online && !self.keeps_holding(&sec) {
            match self.commit_section(now, &writes) {
                Committed::Done(_) => return None,
                Committed::Conflict => return Some(writes),
                Committed::Failed => {}
            }
        }
        for w in writes {
            self.buffer(w, now);
        }
        None
    }

    /// Takes back a batch's lease inserts from the mirror (their commit conflicted,
    /// or a refusal among them is to be confirmed on fresh data). A lease batch
    /// writes nothing else.
    fn undo_leases(&mut self, writes: &[Write], now: i64) {
        for w in writes {
            if let Write::InsertLease { id, .. } = w {
                self.apply_local(&Write::DeleteLease(*id), 0, now);
            }
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
        let leases = ops.iter().filter(|op| matches!(op, BatchOp::Lease { .. })).count();
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
    fn run_batch_as(
        &mut self,
        ops: &[BatchOp],
        access: Access,
        fresh: bool,
    ) -> std::result::Result<Vec<BatchOut>, ()> {
        let deferred = self.groups_usage();
        let needs_section = access != Access::Append || !deferred;
        let sec = if needs_section {
            match self.enter_as(access) {
                Ok(sec) => Some(sec),
                Err(e) => {
                    return Ok(ops
                        .iter()
                        .map(|op| match op {
                            BatchOp::Lease { .. } => BatchOut::Lease(Err(e.clone())),
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
        let refused = outs.iter().any(|o| matches!(o, BatchOut::Lease(Err(Error::Refused(_)))));
        if sec.stale && refused && !fresh {
            // What refused may have been freed meanwhile: read, then decide again.
            self.undo_leases(&writes, now);
            self.store.rollback();
            let _ = self.read(|_, _| ());
            return Err(());
        }
        match self.leave_applied(sec, writes) {
            None => Ok(outs),
            Some(writes) => {
                self.undo_leases(&writes, now);
                Err(())
            }
        }
    }

    fn batch_lease(
        &mut self,
        route: &Route,
        est: i64,
        limits: Option<LimitSet>,
        check: bool,
        now: i64,
        writes: &mut Vec<Write>,
    ) -> Result<i64> {
        check_non_negative("estimated_tokens", est)?;
        if check {
            let adm = self.decide(route, est, limits, now);
            if let Some(reason) = adm.reason.filter(|_| !adm.allowed) {
                return Err(Error::Refused(Box::new(Refusal {
                    reason,
                    retry_at_ms: adm.retry_at_ms,
                    platform: route.platform.clone(),
                    model_id: route.model_id.clone(),
                    key_id: route.key_id,
                })));
            }
        }
        let w = self.lease_write(route, est, now);
        let Write::InsertLease { id, .. } = w else { unreachable!("lease_write builds an InsertLease") };
        self.apply_local(&w, id, now);
        writes.push(w);
        Ok(id)
    }

    fn batch_success(
        &mut self,
        lease_id: i64,
        route: &Route,
        tokens: Option<i64>,
        now: i64,
        deferred: bool,
        writes: &mut Vec<Write>,
    ) -> Result<()> {
        if let Some(t) = tokens {
            check_non_negative("tokens", t)?;
        }
        let mut ws = vec![self.usage_row(route, UsageKind::Request, 0, now)];
        if let Some(t) = tokens {
            ws.push(self.usage_row(route, UsageKind::Tokens, t, now));
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
    fn apply_local(&mut self, w: &Write, id: i64, now: i64) -> i64 {
        match w {
            Write::Usage(u) => self.mirror.add_usage_row(u, now),
            Write::InsertLease {
                platform, model_id, key_id, tokens, created_at_ms, expires_at_ms, ..
            } => {
                let rid = self.mirror.route_id(platform, model_id, *key_id);
                self.mirror.add_lease(
                    id,
                    LeaseRec {
                        route: rid,
                        tokens: *tokens,
                        created_at_ms: *created_at_ms,
                        expires_at_ms: *expires_at_ms,
                    },
                );
                return id;
            }
            Write::DeleteLease(id) => return i64::from(self.mirror.remove_lease(*id).is_some()),
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
                    self.rebuild = true;
                }
            }
            Write::Log(_) | Write::UpsertQuotaState(_) => {}
        }
        0
    }

    /// Keeps a write for the store (degraded, or grouped by `flush_interval_ms`).
    fn buffer(&mut self, w: Write, now: i64) {
        if self.pending_since.is_none() {
            self.pending_since = Some(now);
        }
        match w {
            Write::Sweep { .. } => return,
            // A lease taken while degraded is written when the store answers again,
            // so that other processes count it from then on.
            Write::InsertLease { id, .. } => {
                self.pending_inserted.insert(id);
                self.pending.push(w);
            }
            Write::DeleteLease(id) => {
                self.pending_deleted.insert(id);
                self.pending.push(w);
            }
            w => self.pending.push(w),
        }
        // A held lock's writes are committed within its period: nothing to merge.
        if self.pending.len() >= self.compact_at && self.held.is_none() {
            self.compact_pending(now);
            self.compact_at = (self.pending.len() * 2).max(COMPACT_MIN);
        }
    }

    /// Merges buffered usage rows that left the minute window into one row per
    /// (route, kind, UTC minute), keeping their day; memory stays bounded by the
    /// windows' widths while nothing is lost from the day counts.
    fn compact_pending(&mut self, now: i64) {
        let horizon = now.saturating_sub(MINUTE_MS);
        let mut merged: HashMap<MergeKey, UsageRow> = HashMap::new();
        let mut kept = Vec::with_capacity(self.pending.len());
        let mut order = Vec::new();
        for w in self.pending.drain(..) {
            match w {
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
                            m.count = m.count.saturating_add(u.count);
                            m.created_at_ms = m.created_at_ms.max(u.created_at_ms);
                        }
                        None => {
                            order.push(key.clone());
                            merged.insert(key, u);
                        }
                    }
                }
                w => kept.push(w),
            }
        }
        self.pending =
            order.into_iter().filter_map(|k| merged.remove(&k)).map(Write::Usage).chain(kept).collect();
    }

    fn store_failed(&mut self, e: &StoreError, write: bool) {
        self.read_failed = true;
        if !write {
            // A failed read: keep serving from memory; writes decide degraded mode.
            self.logs.push((log::Level::Debug, format!("database read failed: {e}")));
            return;
        }
        if !self.degraded {
            self.degraded = true;
            let msg = format!(
                "database write failed ({e}); serving from memory and buffering changes until it answers"
            );
            self.note(log::Level::Warn, Some("degraded"), msg);
        }
    }

    /// A record for the host's logger. Warnings and errors also become a
    /// `server_logs` row (SPEC §12), written with the next commit, so that every
    /// engine and notebook on the store sees them.
    fn note(&mut self, level: log::Level, event: Option<&str>, message: String) {
        if level <= log::Level::Warn && !self.store.readonly() {
            self.pending.push(Write::Log(LogRow {
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
    fn read<T>(&mut self, f: impl FnOnce(&mut Mirror, i64) -> T) -> Result<T> {
        let sec = self.enter(false)?;
        let out = f(&mut self.mirror, sec.now);
        self.leave(sec, Vec::new())?;
        Ok(out)
    }

    /// A write section with writes that do not depend on the mirror.
    fn write(&mut self, writes: Vec<Write>) -> Result<Vec<i64>> {
        let sec = self.enter(true)?;
        self.leave(sec, writes)
    }

    /// Writes that decide nothing (usage rows, buffered changes): no need to take the
    /// store's lock first.
    fn append(&mut self, writes: Vec<Write>) -> Result<()> {
        let sec = self.enter_as(Access::Append)?;
        self.leave(sec, writes).map(|_| ())
    }

    /// Usage writes (and lease releases) wait to be grouped (`flush_interval_ms > 0`).
    fn groups_usage(&self) -> bool {
        self.settings.flush_interval_ms > 0 && !self.store.readonly()
    }

    /// Usage writes: committed now, or grouped when `flush_interval_ms > 0`.
    fn write_usage(&mut self, writes: Vec<Write>) -> Result<()> {
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
        if (self.pending.is_empty() && self.held.is_none()) || self.store.readonly() {
            return Ok(());
        }
        self.flush_requested = true;
        // Buffered writes were decided when they were made: they only append now.
        let out = self.append(Vec::new());
        self.flush_requested = false;
        out
    }

    /// Ends a held write lock whose period is over (the flusher thread: an idle
    /// engine does not keep others waiting).
    pub fn end_hold_if_due(&mut self) -> Result<()> {
        if self.held.is_some() && self.hold_period_over() {
            return self.flush();
        }
        Ok(())
    }

    /// The period of the flusher thread: the hold period when a write lock may be
    /// held across calls, else `flush_interval_ms`.
    pub fn tick_period(&self) -> Duration {
        self.hold_for.unwrap_or(Duration::from_millis(self.settings.flush_interval_ms.max(0) as u64))
    }

    /// Flushes and reports whether anything stayed unwritten.
    pub fn close(&mut self) -> Result<()> {
        let _ = self.flush();
        if !self.pending.is_empty() {
            let n = self.pending.len();
            self.logs.push((
                log::Level::Error,
                format!("closing with {n} changes the database did not accept; they are lost"),
            ));
        }
        Ok(())
    }

    // ---- configuration -----------------------------------------------------------

    fn platform_env(&mut self, platform: &str) -> (ProviderCaps, Option<i64>) {
        if let Some(v) = self.platform_env.get(platform) {
            return *v;
        }
        let caps = self.settings.env.provider_caps(platform);
        let conc = self.settings.env.key_concurrency_cap(platform);
        self.platform_env.insert(platform.to_string(), (caps, conc));
        (caps, conc)
    }

    /// Effective caps: `set_provider_caps` wins over env, env over defaults.
    fn caps_for(&mut self, platform: &str) -> ProviderCaps {
        let (env_caps, _) = self.platform_env(platform);
        let o = self.mirror.caps.get(platform).copied().unwrap_or_default();
        fn pick(s: CapSetting, env: Option<i64>) -> Option<i64> {
            match s {
                CapSetting::Inherit => env,
                CapSetting::NoCap => None,
                CapSetting::Cap(v) => Some(v),
            }
        }
        ProviderCaps {
            daily_requests: pick(o.daily_requests, env_caps.daily_requests),
            minute_requests: pick(o.minute_requests, env_caps.minute_requests),
            daily_tokens: pick(o.daily_tokens, env_caps.daily_tokens),
        }
    }

    fn limits_for(&self, platform: &str, model_id: &str, given: Option<LimitSet>) -> LimitSet {
        limits_from(&self.mirror, platform, model_id, given)
    }

    fn gate_context(&mut self, route: &Route, limits: Option<LimitSet>) -> GateContext {
        let (_, conc) = self.platform_env(&route.platform);
        GateContext {
            limits: self.limits_for(&route.platform, &route.model_id, limits),
            caps: self.caps_for(&route.platform),
            concurrency_cap: conc,
        }
    }

    pub fn register_key(&mut self, key: KeyInfo) -> Result<()> {
        check_name("platform", &key.platform)?;
        self.write(vec![Write::UpsertKey(key)]).map(|_| ())
    }

    pub fn set_model_limits(&mut self, model: ModelInfo) -> Result<()> {
        check_name("platform", &model.platform)?;
        check_name("model_id", &model.model_id)?;
        // A declared limit on a classic window at account scope IS that classic limit
        // (SPEC §14.1): it is stored in its column, the others beside.
        let set = LimitSet::with_classic(model.limits.validate()?, model.others.clone())?;
        let model = ModelInfo { limits: set.classic(), others: set.others(), ..model };
        self.write(vec![Write::UpsertModel(model)]).map(|_| ())
    }

    // ---- provider calendars (SPEC §14.2) ---------------------------------------------

    /// Sets the zone of a platform's calendar (persisted, shared; wins over the
    /// environment and the built-in zone); `None` forgets it.
    pub fn set_platform_calendar(&mut self, platform: &str, zone: Option<&str>) -> Result<()> {
        check_name("platform", platform)?;
        if let Some(z) = zone {
            if Calendar::of_zone(z).is_none() {
                return Err(Error::Invalid(format!(
                    "unknown time zone {z:?}: give an IANA name such as \"America/Los_Angeles\" or \"UTC\""
                )));
            }
        }
        let w = Write::SetCalendar { platform: platform.to_string(), zone: zone.map(str::to_string) };
        self.write(vec![w]).map(|_| ())
    }

    /// The calendar in force for a platform (what `f` is given), after reading what
    /// other engines changed.
    fn with_calendar<T>(&mut self, platform: &str, f: impl FnOnce(&Calendar, i64) -> T) -> Result<T> {
        check_name("platform", platform)?;
        self.read(|m, now| f(&m.calendars.of(platform), now))
    }

    /// The zone in force for a platform's days.
    pub fn platform_calendar(&mut self, platform: &str) -> Result<String> {
        self.with_calendar(platform, |c, _| c.name().to_string())
    }

    /// Start of the platform's day holding `at_ms` (default now).
    pub fn day_start_ms(&mut self, platform: &str, at_ms: Option<i64>) -> Result<i64> {
        self.with_calendar(platform, |c, now| c.day_start(at_ms.unwrap_or(now)))
    }

    /// Start of the platform's day after the one holding `at_ms` (default now).
    pub fn next_day_start_ms(&mut self, platform: &str, at_ms: Option<i64>) -> Result<i64> {
        self.with_calendar(platform, |c, now| c.next_day_start(at_ms.unwrap_or(now)))
    }

    pub fn model_limits(&mut self, platform: &str, model_id: &str) -> Result<Option<Limits>> {
        self.read(|m, _| m.model(platform, model_id).map(|m| m.limits))
    }

    /// Every declared limit of a model, the classic four included, in gate order.
    pub fn model_limit_list(&mut self, platform: &str, model_id: &str) -> Result<Vec<Limit>> {
        self.read(|m, _| m.limit_set(platform, model_id).iter().map(|d| d.limit.clone()).collect())
    }

    // ---- usage -------------------------------------------------------------------

    /// The route's names as the mirror holds them (shared, not copied per write).
    fn route_names(&mut self, route: &Route) -> (Arc<str>, Arc<str>) {
        let rid = self.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        let r = self.mirror.route(rid);
        (r.platform.clone(), r.model_id.clone())
    }

    /// One event: a request (`tokens` 0), or `tokens` tokens.
    fn usage_row(&mut self, route: &Route, kind: UsageKind, tokens: i64, t: i64) -> Write {
        let (platform, model_id) = self.route_names(route);
        Write::Usage(UsageRow {
            platform,
            model_id,
            key_id: route.key_id,
            kind,
            tokens,
            count: 1,
            created_at_ms: t,
        })
    }

    pub fn record_request(&mut self, route: &Route) -> Result<()> {
        let now = self.clock.now_ms();
        let mut writes = vec![self.usage_row(route, UsageKind::Request, 0, now)];
        self.clear_history_on_success(route, &mut writes);
        self.write_usage(writes)
    }

    /// SPEC §4/§6: a success clears the route's ladder, unknown-limit and
    /// empty-completion history and its key's auth ladder. Only when there is some,
    /// so the hot path writes nothing extra.
    fn clear_history_on_success(&self, route: &Route, writes: &mut Vec<Write>) {
        let (route_rows, auth_rows) = self.mirror.has_history_to_clear(route);
        if route_rows {
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: Some((Arc::from(route.platform.as_str()), Arc::from(route.model_id.as_str()))),
                kinds: vec![HistoryKind::Ladder, HistoryKind::Unknown, HistoryKind::Empty],
            });
        }
        if auth_rows {
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: None,
                kinds: vec![HistoryKind::Auth],
            });
        }
    }

    pub fn record_tokens(&mut self, route: &Route, tokens: i64) -> Result<()> {
        check_non_negative("tokens", tokens)?;
        let now = self.clock.now_ms();
        let row = self.usage_row(route, UsageKind::Tokens, tokens, now);
        self.write_usage(vec![row])
    }

    /// SPEC §4/§14.1: recorded usage in each window, the classic four always, and
    /// every other declared limit by its reason.
    pub fn usage(&mut self, route: &Route, limits: Option<LimitSet>) -> Result<UsageReport> {
        let sec = self.enter(false)?;
        let now = sec.now;
        let limits = self.limits_for(&route.platform, &route.model_id, limits);
        let rid = self.ready_route(route, &limits, now);
        let m = &self.mirror;
        let win = &m.route(rid).win;
        let (minute, day) = (win.minute(), win.day(now));
        let mut report = UsageReport {
            rpm: WindowReport { used: minute.requests, limit: None },
            rpd: WindowReport { used: day.requests, limit: None },
            tpm: WindowReport { used: minute.tokens, limit: None },
            tpd: WindowReport { used: day.tokens, limit: None },
            in_flight: m.route_in_flight(rid, now).count,
            others: Vec::new(),
        };
        for d in limits.iter() {
            let slot = match d.reason {
                Reason::Rpm => &mut report.rpm,
                Reason::Rpd => &mut report.rpd,
                Reason::Tpm => &mut report.tpm,
                Reason::Tpd => &mut report.tpd,
                _ => {
                    let used = win.counts(d.limit.window, now).unwrap_or_default().get(d.limit.metric);
                    report.others.push((
                        d.reason.as_str().to_string(),
                        WindowReport { used, limit: Some(d.limit.limit) },
                    ));
                    continue;
                }
            };
            slot.limit = Some(d.limit.limit);
        }
        self.leave(sec, Vec::new())?;
        Ok(report)
    }

    // ---- gates -------------------------------------------------------------------

    /// All gates of SPEC §4, in order.
    pub fn check(&mut self, route: &Route, est: i64, limits: Option<LimitSet>) -> Result<Admission> {
        check_non_negative("estimated_tokens", est)?;
        let sec = self.enter(false)?;
        let adm = self.decide(route, est, limits, sec.now);
        self.leave(sec, Vec::new())?;
        Ok(adm)
    }

    fn decide(&mut self, route: &Route, est: i64, limits: Option<LimitSet>, now: i64) -> Admission {
        let ctx = self.gate_context(route, limits);
        let rid = self.ready_route(route, &ctx.limits, now);
        self.mirror.evaluate(rid, est, &ctx, now)
    }

    /// One gate; true when it admits. Provider gates need no model (`route.model_id`
    /// may be empty for them); the token gate uses it to bill the estimate.
    pub fn gate(&mut self, gate: Gate, route: &Route, est: i64, limits: Option<LimitSet>) -> Result<bool> {
        check_non_negative("estimated_tokens", est)?;
        let sec = self.enter(false)?;
        let now = sec.now;
        let ctx = self.gate_context(route, limits);
        let m = &mut self.mirror;
        let a = m.account_id(&route.platform, route.key_id);
        m.prune_account_id(a, now);
        let rid = if route.model_id.is_empty() {
            None
        } else {
            let limits = ctx.limits.clone();
            Some(self.ready_route(route, &limits, now))
        };
        let m = &mut self.mirror;
        let v = m.view(rid, a, &ctx, now);
        let refused = match (gate, rid) {
            (Gate::Request, Some(_)) => m.gate_metrics(&v, &ctx.limits, false, est, now),
            (Gate::Tokens, Some(_)) => m.gate_metrics(&v, &ctx.limits, true, est, now),
            (Gate::Cooldown, Some(rid)) => m.gate_cooldown(rid, now),
            (Gate::ProviderDaily, _) => m.gate_provider_daily(&v, &ctx, now),
            (Gate::ProviderMinute, _) => m.gate_provider_minute(&v, &ctx),
            (Gate::ProviderTokens, _) => m.gate_provider_tokens(&v, est, &ctx, now),
            (Gate::KeyConcurrency, _) => m.gate_concurrency(&v, &ctx),
            (_, None) => None,
        };
        self.leave(sec, Vec::new())?;
        Ok(refused.is_none())
    }

    // ---- leases ------------------------------------------------------------------

    fn lease_write(&mut self, route: &Route, est: i64, now: i64) -> Write {
        let (platform, model_id) = self.route_names(route);
        Write::InsertLease {
            id: self.lease_ids.next(),
            platform,
            model_id,
            key_id: route.key_id,
            tokens: est,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(self.settings.lease_max_age_ms),
        }
    }

    fn single(&mut self, op: BatchOp) -> BatchOut {
        self.run_batch(vec![op]).pop().unwrap_or(BatchOut::Done(Err(Error::Internal("empty batch".into()))))
    }

    /// Takes a lease without checking any gate.
    pub fn acquire_lease(&mut self, route: &Route, est: i64) -> Result<i64> {
        self.single(BatchOp::Lease { route: route.clone(), est, limits: None, check: false }).lease_id()
    }

    /// SPEC §5: every gate of `check()` and the lease, as one atomic step across
    /// threads and processes (the store's write lock is held throughout).
    pub fn lease(&mut self, route: &Route, est: i64, limits: Option<LimitSet>) -> Result<i64> {
        self.single(BatchOp::Lease { route: route.clone(), est, limits, check: true }).lease_id()
    }

    /// Idempotent.
    pub fn release_lease(&mut self, lease_id: i64) -> Result<()> {
        self.single(BatchOp::Release(lease_id)).done()
    }

    /// A lease's success: its request (and tokens, when given) recorded and the lease
    /// released, in one commit.
    pub fn finish_lease_success(&mut self, lease_id: i64, route: &Route, tokens: Option<i64>) -> Result<()> {
        self.single(BatchOp::Success { lease_id, route: route.clone(), tokens }).done()
    }

    // ---- cooldowns ---------------------------------------------------------------

    fn cooldown_of(m: &Mirror, rid: RouteId, now: i64) -> Option<Cooldown> {
        let c = m.active_cooldown(rid, now)?;
        let r = m.route(rid);
        Some(Cooldown {
            route: Route {
                platform: r.platform.to_string(),
                model_id: r.model_id.to_string(),
                key_id: r.key_id,
            },
            expires_at_ms: c.expires_at_ms,
            source: c.source,
            set_at_ms: c.set_at_ms,
        })
    }

    /// The operator's bench: always overwrites.
    pub fn set_cooldown(&mut self, route: &Route, duration_ms: i64, source: CooldownSource) -> Result<()> {
        check_non_negative("duration_ms", duration_ms)?;
        let sec = self.enter(true)?;
        let now = sec.now;
        let w = Write::UpsertCooldown(CooldownRow {
            platform: Arc::from(route.platform.as_str()),
            model_id: Arc::from(route.model_id.as_str()),
            key_id: route.key_id,
            expires_at_ms: now.saturating_add(duration_ms),
            source,
            set_at_ms: now,
        });
        self.logs.push((
            log::Level::Info,
            format!("cooldown {route} set for {duration_ms} ms ({}, by the operator)", source.as_str()),
        ));
        self.leave(sec, vec![w]).map(|_| ())
    }

    pub fn cooldown(&mut self, route: &Route) -> Result<Option<Cooldown>> {
        self.read(|m, now| {
            let rid = m.find_route(&route.platform, &route.model_id, route.key_id)?;
            Self::cooldown_of(m, rid, now)
        })
    }

    /// Active cooldowns, soonest expiry first; `key_ids` filters.
    pub fn active_cooldowns(&mut self, key_ids: Option<&[i64]>) -> Result<Vec<Cooldown>> {
        self.read(|m, now| {
            let mut v: Vec<Cooldown> = m
                .cooldowns
                .keys()
                .filter_map(|rid| Self::cooldown_of(m, *rid, now))
                .filter(|c| key_ids.is_none_or(|ks| ks.contains(&c.route.key_id)))
                .collect();
            v.sort_by(|a, b| {
                (a.expires_at_ms, &a.route.platform, &a.route.model_id, a.route.key_id).cmp(&(
                    b.expires_at_ms,
                    &b.route.platform,
                    &b.route.model_id,
                    b.route.key_id,
                ))
            });
            v
        })
    }

    pub fn clear_cooldown_early(&mut self, route: &Route) -> Result<bool> {
        let ids = self.write(vec![Write::DeleteCooldown {
            platform: Arc::from(route.platform.as_str()),
            model_id: Arc::from(route.model_id.as_str()),
            key_id: route.key_id,
        }])?;
        let cleared = ids.first().copied().unwrap_or(0) > 0;
        if cleared {
            self.logs.push((log::Level::Info, format!("cooldown {route} cleared early")));
        }
        Ok(cleared)
    }

    /// Operator reset: the key's cooldowns and all its failure history.
    pub fn clear_cooldowns_for_key(&mut self, key_id: i64) -> Result<i64> {
        let ids = self.write(vec![
            Write::DeleteCooldownsForKey(key_id),
            Write::DeleteHistory {
                key_id,
                route: None,
                kinds: vec![HistoryKind::Ladder, HistoryKind::Unknown, HistoryKind::Auth, HistoryKind::Empty],
            },
        ])?;
        Ok(ids.first().copied().unwrap_or(0))
    }

    pub fn cleanup_expired_cooldowns(&mut self) -> Result<i64> {
        let sec = self.enter(true)?;
        let now = sec.now;
        let ids = self.leave(sec, vec![Write::DeleteExpiredCooldowns(now)])?;
        Ok(ids.first().copied().unwrap_or(0))
    }

    /// Active heuristic cooldowns (the ones a probe may clear), soonest first.
    /// Claims the probe of `key_id` for this engine (SPEC §7: one prober per fleet).
    /// True when this engine may probe it; also true when the store cannot say.
    pub fn claim_probe(&mut self, key_id: i64, ttl_ms: i64) -> bool {
        self.store.try_claim(&format!("probe:{key_id}"), ttl_ms).unwrap_or(true)
    }

    pub fn probeable_cooldowns(&mut self) -> Result<Vec<Cooldown>> {
        Ok(self
            .active_cooldowns(None)?
            .into_iter()
            .filter(|c| c.source == CooldownSource::Heuristic)
            .collect())
    }

    fn is_local(&self, key_id: i64) -> bool {
        self.mirror.keys.get(&key_id).and_then(|k| k.base_url.as_deref()).is_some_and(is_local_base_url)
    }

    fn history_row(route: &Route, kind: HistoryKind, now: i64) -> Write {
        let (platform, model_id): (Arc<str>, Arc<str>) = if kind == HistoryKind::Auth {
            (Arc::from(route.platform.as_str()), Arc::from(""))
        } else {
            (Arc::from(route.platform.as_str()), Arc::from(route.model_id.as_str()))
        };
        Write::InsertHistory(HistoryRow { platform, model_id, key_id: route.key_id, kind, hit_at_ms: now })
    }

    /// SPEC §6.1 inside an open write section: decides, and queues the hits and the
    /// ladder step it counts.
    fn limit_decision(
        &mut self,
        route: &Route,
        limits: Limits,
        retry_after_ms: Option<i64>,
        quota_signal: bool,
        now: i64,
        writes: &mut Vec<Write>,
    ) -> CooldownDecision {
        if self.is_local(route.key_id) {
            return CooldownDecision::new(LOCAL_BENCH_MS, CooldownSource::Heuristic);
        }
        let rid = self.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        self.mirror.prune_route(rid, now);
        let day = self.mirror.route(rid).win.day(now);
        let daily_exhausted =
            limits.rpd.is_some_and(|l| day.requests >= l) || limits.tpd.is_some_and(|l| day.tokens >= l);
        let mut effectively_exhausted = false;
        if limits.rpd.is_none() && limits.tpd.is_none() && quota_signal {
            let earlier = self.mirror.history_count(
                route,
                HistoryKind::Unknown,
                now.saturating_sub(UNKNOWN_HIT_WINDOW_MS),
            );
            writes.push(Self::history_row(route, HistoryKind::Unknown, now));
            effectively_exhausted = earlier + 1 >= 2;
        }
        let facts = LimitFacts {
            daily_exhausted,
            effectively_exhausted,
            ladder_steps: self.mirror.history_count(route, HistoryKind::Ladder, now.saturating_sub(DAY_MS)),
        };
        let next_day = self.mirror.route_calendar(rid).next_day_start(now);
        let (decision, stepped) = decide_limit(facts, retry_after_ms, now, next_day);
        if stepped {
            writes.push(Self::history_row(route, HistoryKind::Ladder, now));
        }
        decision
    }

    /// SPEC §6.1 as a call of its own: decides and counts, sets no cooldown.
    pub fn cooldown_decision_for_limit(
        &mut self,
        route: &Route,
        limits: Option<LimitSet>,
        retry_after_ms: Option<i64>,
        quota_signal: bool,
    ) -> Result<CooldownDecision> {
        if let Some(ra) = retry_after_ms {
            check_non_negative("retry_after_ms", ra)?;
        }
        let sec = self.enter(true)?;
        let now = sec.now;
        let limits = self.limits_for(&route.platform, &route.model_id, limits).classic();
        let mut writes = Vec::new();
        let d = self.limit_decision(route, limits, retry_after_ms, quota_signal, now, &mut writes);
        self.leave(sec, writes)?;
        Ok(d)
    }

    /// SPEC §7 inside an open write section: the limit a message states, written only
    /// when it tightens the stored one.
    fn learn(
        &mut self,
        platform: &str,
        model_id: &str,
        message: Option<&str>,
        writes: &mut Vec<Write>,
    ) -> Option<LearnedLimit> {
        let learned = parse_provider_limit(message)?;
        let mut model = self.mirror.model(platform, model_id).cloned().unwrap_or_else(|| ModelInfo {
            platform: platform.to_string(),
            model_id: model_id.to_string(),
            limits: Limits::default(),
            others: Vec::new(),
            monthly_token_budget: None,
        });
        let slot = match learned.kind {
            LimitAxis::Rpm => &mut model.limits.rpm,
            LimitAxis::Rpd => &mut model.limits.rpd,
            LimitAxis::Tpm => &mut model.limits.tpm,
            LimitAxis::Tpd => &mut model.limits.tpd,
        };
        if slot.is_some_and(|v| v <= learned.limit) {
            return None;
        }
        *slot = Some(learned.limit);
        self.logs.push((
            log::Level::Info,
            format!(
                "learned {} = {} for {platform}/{model_id} from a provider error",
                learned.kind.as_str(),
                learned.limit
            ),
        ));
        // Apply now so a decision in the same section sees it.
        self.mirror.put_model(model.clone());
        writes.push(Write::UpsertModel(model));
        Some(learned)
    }

    pub fn learn_limit_from_error(
        &mut self,
        platform: &str,
        model_id: &str,
        message: Option<&str>,
    ) -> Result<Option<LearnedLimit>> {
        check_name("platform", platform)?;
        check_name("model_id", model_id)?;
        if parse_provider_limit(message).is_none() {
            return Ok(None);
        }
        let sec = self.enter(true)?;
        let mut writes = Vec::new();
        let learned = self.learn(platform, model_id, message, &mut writes);
        self.leave(sec, writes)?;
        Ok(learned)
    }

    /// SPEC §6.2: one call for any failure. Benches the route (never shortening a
    /// later-expiring cooldown), counts ladder/auth/streak history, learns limits.
    pub fn record_failure(&mut self, route: &Route, f: FailureInput) -> Result<FailureOutcome> {
        let limits = f.limits;
        if let Some(RetryAfter::Millis(ms)) = f.retry_after {
            check_non_negative("retry_after", ms)?;
        }
        let kind = f.kind.unwrap_or_else(|| infer_failure_kind(f.status, f.message.as_deref()));
        let sec = self.enter(true)?;
        let now = sec.now;
        let mut writes = Vec::new();
        let retry_ms = match &f.retry_after {
            Some(RetryAfter::Text(t)) => parse_retry_after_ms(Some(t), now),
            Some(RetryAfter::Millis(ms)) => Some((*ms).min(DAY_MS)),
            None => None,
        }
        .or_else(|| parse_stated_retry_ms(f.message.as_deref()));
        let learned = if kind == FailureKind::Auth {
            None
        } else {
            self.learn(&route.platform, &route.model_id, f.message.as_deref(), &mut writes)
        };
        let limits = self.limits_for(&route.platform, &route.model_id, limits).classic();
        let local = self.is_local(route.key_id);
        if kind != FailureKind::EmptyCompletion
            && self.mirror.history_count(route, HistoryKind::Empty, i64::MIN) > 0
        {
            // Any other outcome ends the empty-completion streak.
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: Some((Arc::from(route.platform.as_str()), Arc::from(route.model_id.as_str()))),
                kinds: vec![HistoryKind::Empty],
            });
        }
        let local_bench = CooldownDecision::new(LOCAL_BENCH_MS, CooldownSource::Heuristic);
        let decision = match kind_rule(kind) {
            KindRule::None => None,
            // SPEC §6.2: a local endpoint gets 5 s whenever the kind benches at all;
            // nothing escalates (the streak still counts, to know when it benches).
            KindRule::EmptyStreak => {
                let n = self.mirror.history_count(route, HistoryKind::Empty, i64::MIN) + 1;
                writes.push(Self::history_row(route, HistoryKind::Empty, now));
                (n >= EMPTY_STREAK_BENCH).then(|| {
                    if local {
                        local_bench
                    } else {
                        self.limit_decision(route, limits, retry_ms, false, now, &mut writes)
                    }
                })
            }
            _ if local => Some(local_bench),
            KindRule::Fixed(d) => Some(d),
            KindRule::AuthLadder => {
                let n = self.mirror.history_count(route, HistoryKind::Auth, now.saturating_sub(DAY_MS)) + 1;
                writes.push(Self::history_row(route, HistoryKind::Auth, now));
                Some(CooldownDecision::new(ladder_step(&AUTH_LADDER_MS, n), CooldownSource::Heuristic))
            }
            KindRule::DailyQuota => {
                let rid = self.mirror.route_id(&route.platform, &route.model_id, route.key_id);
                let next_day = self.mirror.route_calendar(rid).next_day_start(now);
                Some(CooldownDecision::new(
                    retry_ms.unwrap_or_else(|| next_day.saturating_sub(now)).min(DAY_MS),
                    CooldownSource::Authoritative,
                ))
            }
            KindRule::Limit { quota_signal } => {
                Some(self.limit_decision(route, limits, retry_ms, quota_signal, now, &mut writes))
            }
        };
        let cooldown = decision.map(|d| {
            let rid = self.mirror.route_id(&route.platform, &route.model_id, route.key_id);
            let expires = now.saturating_add(d.duration_ms);
            match self.mirror.active_cooldown(rid, now) {
                // Never shorten: a cooldown that lasts as long or longer stands.
                Some(c) if c.expires_at_ms >= expires => {
                    CooldownDecision::new(c.expires_at_ms.saturating_sub(now), c.source)
                }
                _ => {
                    writes.push(Write::UpsertCooldown(CooldownRow {
                        platform: Arc::from(route.platform.as_str()),
                        model_id: Arc::from(route.model_id.as_str()),
                        key_id: route.key_id,
                        expires_at_ms: expires,
                        source: d.source,
                        set_at_ms: now,
                    }));
                    self.logs.push((
                        log::Level::Info,
                        format!(
                            "cooldown {route} for {} ms ({}, {})",
                            d.duration_ms,
                            d.source.as_str(),
                            kind.as_str()
                        ),
                    ));
                    d
                }
            }
        });
        self.leave(sec, writes)?;
        Ok(FailureOutcome { kind, cooldown, learned })
    }

    /// A probe passed for `key_id` (SPEC §11): clears every heuristic cooldown of the
    /// key, on every model, keeping the ladder history; logs `cooldown_recovered`.
    /// Returns how many cooldowns went.
    pub fn recover_key(&mut self, key_id: i64) -> Result<i64> {
        let sec = self.enter(true)?;
        let now = sec.now;
        let mut writes = Vec::new();
        let mut cleared = Vec::new();
        for (rid, c) in self.mirror.cooldowns.iter() {
            let r = self.mirror.route(*rid);
            if r.key_id == key_id && c.source == CooldownSource::Heuristic && now < c.expires_at_ms {
                cleared.push(format!("{}/{}", r.platform, r.model_id));
                writes.push(Write::DeleteCooldown {
                    platform: r.platform.clone(),
                    model_id: r.model_id.clone(),
                    key_id,
                });
            }
        }
        if writes.is_empty() {
            self.leave(sec, writes)?;
            return Ok(0);
        }
        let n = writes.len() as i64;
        cleared.sort();
        let message =
            format!("cooldown_recovered: key {key_id} passed a probe; cleared {}", cleared.join(", "));
        let platform = cleared.first().and_then(|r| r.split('/').next()).map(str::to_string);
        self.logs.push((log::Level::Info, message.clone()));
        writes.push(Write::Log(LogRow {
            level: "info",
            source: "cooldown-probe".into(),
            provider: platform,
            model: None,
            event: Some("cooldown_recovered".into()),
            message,
            created_at_ms: now,
        }));
        self.leave(sec, writes)?;
        Ok(n)
    }

    /// A lease's failure: `record_failure` for its route, then the lease released.
    pub fn finish_lease_failure(
        &mut self,
        lease_id: i64,
        route: &Route,
        f: FailureInput,
    ) -> Result<FailureOutcome> {
        let out = self.record_failure(route, f)?;
        self.release_lease(lease_id)?;
        Ok(out)
    }

    // ---- provider pools ----------------------------------------------------------

    pub fn provider_caps(&mut self, platform: &str) -> Result<ProviderCaps> {
        check_name("platform", platform)?;
        let sec = self.enter(false)?;
        let caps = self.caps_for(platform);
        self.leave(sec, Vec::new())?;
        Ok(caps)
    }

    /// `None` in a slot keeps what is set; `Some(setting)` replaces it.
    pub fn set_provider_caps(
        &mut self,
        platform: &str,
        daily_requests: Option<CapSetting>,
        minute_requests: Option<CapSetting>,
        daily_tokens: Option<CapSetting>,
    ) -> Result<()> {
        check_name("platform", platform)?;
        for s in [daily_requests, minute_requests, daily_tokens].into_iter().flatten() {
            if let CapSetting::Cap(v) = s {
                check_non_negative("cap", v)?;
            }
        }
        let sec = self.enter(true)?;
        let old = self.mirror.caps.get(platform).copied().unwrap_or_default();
        let new = CapOverrides {
            daily_requests: daily_requests.unwrap_or(old.daily_requests),
            minute_requests: minute_requests.unwrap_or(old.minute_requests),
            daily_tokens: daily_tokens.unwrap_or(old.daily_tokens),
        };
        self.leave(sec, vec![Write::SetCaps(platform.to_string(), new)]).map(|_| ())
    }

    pub fn reset_provider_caps(&mut self, platform: &str) -> Result<()> {
        check_name("platform", platform)?;
        self.write(vec![Write::ResetCaps(platform.to_string())]).map(|_| ())
    }

    pub fn provider_daily_request_count(&mut self, platform: &str, key_id: i64) -> Result<i64> {
        self.read(|m, now| m.provider_day_requests(platform, key_id, now))
    }

    pub fn provider_minute_request_count(&mut self, platform: &str, key_id: i64) -> Result<i64> {
        self.read(|m, now| {
            let a = m.account_id(platform, key_id);
            m.prune_account_id(a, now);
            m.provider_minute_requests(platform, key_id, now)
        })
    }

    pub fn provider_daily_token_count(&mut self, platform: &str, key_id: i64) -> Result<i64> {
        let sec = self.enter(false)?;
        let cap = self.caps_for(platform).daily_tokens;
        let n = self.mirror.provider_day_tokens(platform, key_id, cap, sec.now);
        self.leave(sec, Vec::new())?;
        Ok(n)
    }

    // ---- analysis ----------------------------------------------------------------

    pub fn usage_events(&mut self, filter: &UsageFilter) -> Result<Vec<UsageRow>> {
        let _ = self.flush();
        Ok(self.store.usage_events(filter)?)
    }

    pub fn server_logs(&mut self, limit: i64) -> Result<Vec<(i64, LogRow, Option<String>)>> {
        check_non_negative("limit", limit)?;
        let _ = self.flush();
        Ok(self.store.server_logs(limit)?)
    }

    /// Writes a `server_logs` row (and hands the record to the host's logger).
    pub fn log_event(&mut self, level: log::Level, row: LogRow) -> Result<()> {
        self.logs.push((level, row.message.clone()));
        if self.store.readonly() {
            return Ok(());
        }
        self.write(vec![Write::Log(row)]).map(|_| ())
    }

    // ---- observed provider quota (SPEC §8.2) -----------------------------------

    /// Reads quota headers of one response; merges what they say into the state and
    /// returns the observations. A 429 or 402 adds an error-body observation.
    pub fn record_quota_headers(
        &mut self,
        platform: &str,
        key_id: i64,
        headers: &[(String, String)],
        model_id: Option<&str>,
        status: i64,
    ) -> Result<Vec<QuotaObservation>> {
        check_name("platform", platform)?;
        if let Some(m) = model_id {
            check_name("model_id", m)?;
        }
        let sec = self.enter(true)?;
        let now = sec.now;
        let parsed = crate::core::headers::parse_quota_headers(headers, now);
        let pool_key = crate::core::pools::infer_quota_pool_key(platform, model_id);
        let mut obs: Vec<QuotaObservation> = parsed
            .quotas
            .iter()
            .map(|q| QuotaObservation {
                platform: platform.to_string(),
                key_id,
                model_id: model_id.map(str::to_string),
                pool_key: pool_key.clone(),
                metric: q.metric.as_str(),
                limit: q.limit,
                remaining: q.remaining,
                reset_at_ms: q.reset_at_ms,
                retry_after_ms: parsed.retry_after_ms,
                source: "header",
                confidence: source_confidence("header"),
                status,
            })
            .collect();
        if status == 429 || status == 402 {
            obs.push(QuotaObservation {
                platform: platform.to_string(),
                key_id,
                model_id: model_id.map(str::to_string),
                pool_key: pool_key.clone(),
                metric: "requests",
                limit: None,
                remaining: Some(0),
                reset_at_ms: parsed.retry_after_ms.map(|ms| now.saturating_add(ms)),
                retry_after_ms: parsed.retry_after_ms,
                source: "error_body",
                confidence: source_confidence("error_body"),
                status,
            });
        }
        if obs.is_empty() {
            self.leave(sec, Vec::new())?;
            return Ok(obs);
        }
        let existing = match self.store.quota_states(Some(platform)) {
            Ok(rows) => rows,
            Err(e) => {
                self.store.rollback();
                self.store_failed(&e, true);
                Vec::new()
            }
        };
        let mut merged: Vec<QuotaStateRow> = Vec::new();
        for o in &obs {
            let old = merged
                .iter()
                .position(|r| r.key_id == key_id && r.pool_key == o.pool_key && r.metric == o.metric)
                .map(|i| merged.remove(i))
                .or_else(|| {
                    existing
                        .iter()
                        .find(|r| r.key_id == key_id && r.pool_key == o.pool_key && r.metric == o.metric)
                        .cloned()
                });
            let row = match old {
                // Known values replace, missing ones keep the old, confidence is the max.
                Some(old) => QuotaStateRow {
                    limit: o.limit.or(old.limit),
                    remaining: o.remaining.or(old.remaining),
                    reset_at_ms: o.reset_at_ms.or(old.reset_at_ms),
                    source: o.source.to_string(),
                    confidence: o.confidence.max(old.confidence),
                    observed_at_ms: now,
                    ..old
                },
                None => QuotaStateRow {
                    platform: platform.to_string(),
                    key_id,
                    pool_key: o.pool_key.clone(),
                    metric: o.metric.to_string(),
                    limit: o.limit,
                    remaining: o.remaining,
                    reset_at_ms: o.reset_at_ms,
                    source: o.source.to_string(),
                    confidence: o.confidence,
                    observed_at_ms: now,
                },
            };
            merged.push(replenished(row, now));
        }
        self.leave(sec, merged.into_iter().map(Write::UpsertQuotaState).collect())?;
        self.headroom_cache.remove(platform);
        Ok(obs)
    }

    /// The merged quota rows; rows past their reset read (and are stored) full again.
    pub fn quota_state(&mut self) -> Result<Vec<QuotaStateRow>> {
        let write = !self.store.readonly();
        let sec = self.enter(write)?;
        let now = sec.now;
        let rows =
            if sec.online || !write { self.store.quota_states(None).unwrap_or_default() } else { Vec::new() };
        let mut writes = Vec::new();
        let rows: Vec<QuotaStateRow> = rows
            .into_iter()
            .map(|r| {
                let fresh = replenished(r.clone(), now);
                if fresh != r && write {
                    writes.push(Write::UpsertQuotaState(fresh.clone()));
                }
                fresh
            })
            .collect();
        self.leave(sec, writes)?;
        Ok(rows)
    }

    /// SPEC §8.2: per key of the platform, the worst `min(1, remaining / limit)` over
    /// its confident rows (a row past its reset counts 1.0). Cached for 5 s; a new
    /// observation through this engine drops the cache.
    pub fn key_quota_headroom(&mut self, platform: &str) -> Result<Vec<(i64, f64)>> {
        check_name("platform", platform)?;
        let now = self.clock.now_ms();
        if let Some((at, v)) = self.headroom_cache.get(platform) {
            if now >= *at && now - *at < 5_000 {
                return Ok(v.clone());
            }
        }
        let sec = self.enter(false)?;
        let rows = self.store.quota_states(Some(platform)).unwrap_or_default();
        self.leave(sec, Vec::new())?;
        let mut worst: HashMap<i64, f64> = HashMap::new();
        for r in rows {
            if r.confidence < 0.7 {
                continue;
            }
            let (Some(remaining), Some(limit)) = (r.remaining, r.limit) else { continue };
            if limit <= 0 {
                continue;
            }
            let h = if r.reset_at_ms.is_some_and(|t| t <= now) {
                1.0
            } else {
                (remaining.max(0) as f64 / limit as f64).min(1.0)
            };
            let e = worst.entry(r.key_id).or_insert(h);
            *e = e.min(h);
        }
        let mut v: Vec<(i64, f64)> = worst.into_iter().collect();
        v.sort_by_key(|(k, _)| *k);
        self.headroom_cache.insert(platform.to_string(), (now, v.clone()));
        Ok(v)
    }

    // ---- routing guardrail (SPEC §9) --------------------------------------------

    /// Drops the guardrail snapshot; the next call rebuilds it.
    pub fn invalidate_window_usage(&mut self) {
        self.window_snapshot = None;
    }

    fn rebuild_window_snapshot(&mut self) -> Result<bool> {
        let sec = self.enter(false)?;
        let now = sec.now;
        let failed = self.read_failed;
        let mut snap = WindowSnapshot { built_at_ms: now, ..WindowSnapshot::default() };
        self.mirror.prune_all(now);
        for (_, r) in self.mirror.routes() {
            let used = r.win.all_counts(now);
            if used.iter().all(|(_, c)| *c == Counts::default()) {
                continue;
            }
            snap.usage
                .entry(r.platform.clone())
                .or_default()
                .entry(r.model_id.clone())
                .or_default()
                .insert(r.key_id, used);
        }
        self.leave(sec, Vec::new())?;
        if failed {
            self.window_snapshot = None;
            return Ok(false);
        }
        self.window_snapshot = Some(snap);
        Ok(true)
    }

    /// The routes of a model's routable keys keep every window of `limits` (an ad hoc
    /// `limits=` may name one they do not): when one did not, the snapshot is rebuilt.
    fn keep_guardrail_windows(&mut self, platform: &str, model_id: &str, limits: &LimitSet) -> Result<()> {
        let keys = self.mirror.routable_keys(platform).to_vec();
        let missing = keys.iter().any(|k| {
            self.mirror.find_route(platform, model_id, *k).is_none_or(|rid| {
                let win = &self.mirror.route(rid).win;
                limits.windows().any(|w| !win.keeps(w))
            })
        });
        if !missing {
            return Ok(());
        }
        let sec = self.enter(false)?;
        for k in keys {
            let route = Route { platform: platform.to_string(), model_id: model_id.to_string(), key_id: k };
            self.ready_route(&route, limits, sec.now);
        }
        self.leave(sec, Vec::new())?;
        self.window_snapshot = None;
        Ok(())
    }

    /// SPEC §9: how much of its window quota a model has used, following the key
    /// with the most headroom; `None` without window limits, without a routable key,
    /// or when the database cannot be read. Served from a snapshot reused for
    /// `window_usage_ttl_ms`; live leases are not counted.
    pub fn model_window_used_fraction(
        &mut self,
        platform: &str,
        model_id: &str,
        limits: Option<LimitSet>,
        key_id: Option<i64>,
    ) -> Result<Option<f64>> {
        let limits = self.limits_for(platform, model_id, limits);
        if limits.is_empty() {
            return Ok(None);
        }
        self.keep_guardrail_windows(platform, model_id, &limits)?;
        let now = self.clock.now_ms();
        let fresh = self
            .window_snapshot
            .as_ref()
            .is_some_and(|s| now >= s.built_at_ms && now - s.built_at_ms < self.settings.window_usage_ttl_ms);
        if !fresh && !self.rebuild_window_snapshot()? {
            return Ok(None);
        }
        let Some(snap) = self.window_snapshot.as_ref() else { return Ok(None) };
        let keys = self.mirror.routable_keys(platform);
        let per_model = snap.usage.get(platform).and_then(|m| m.get(model_id));
        let mut best: Option<f64> = None;
        for k in keys.iter().filter(|k| key_id.is_none_or(|want| **k == want)) {
            let used = per_model.and_then(|m| m.get(k));
            let worst = limits
                .iter()
                .map(|d| {
                    let u = used
                        .and_then(|u| u.iter().find(|(w, _)| *w == d.limit.window))
                        .map_or(0, |(_, c)| c.get(d.limit.metric));
                    if d.limit.limit <= 0 {
                        1.0
                    } else {
                        u as f64 / d.limit.limit as f64
                    }
                })
                .fold(0.0f64, f64::max);
            best = Some(best.map_or(worst, |b| b.min(worst)));
        }
        Ok(best)
    }

    /// One row per route that has usage today, a live lease or an active cooldown,
    /// sorted by (platform, model_id, key_id) (SPEC §12).
    pub fn snapshot(&mut self) -> Result<Vec<SnapshotRow>> {
        self.read(|m, now| {
            m.prune_all(now);
            let mut rows = Vec::new();
            for (rid, r) in m.routes() {
                let (minute, day) = (r.win.minute(), r.win.day(now));
                let in_flight = m.route_in_flight(rid, now).count;
                let cooldown = m.active_cooldown(rid, now);
                if day.requests == 0
                    && day.tokens == 0
                    && minute.requests == 0
                    && minute.tokens == 0
                    && in_flight == 0
                    && cooldown.is_none()
                {
                    continue;
                }
                let limits = m.model(&r.platform, &r.model_id).map(|x| x.limits).unwrap_or_default();
                let others = m
                    .limit_set(&r.platform, &r.model_id)
                    .iter()
                    .filter(|d| !matches!(d.reason, Reason::Rpm | Reason::Rpd | Reason::Tpm | Reason::Tpd))
                    .map(|d| {
                        let used = r.win.counts(d.limit.window, now).unwrap_or_default().get(d.limit.metric);
                        (d.reason.as_str().to_string(), used, d.limit.limit)
                    })
                    .collect();
                rows.push(SnapshotRow {
                    route: Route {
                        platform: r.platform.to_string(),
                        model_id: r.model_id.to_string(),
                        key_id: r.key_id,
                    },
                    rpm_used: minute.requests,
                    rpd_used: day.requests,
                    tpm_used: minute.tokens,
                    tpd_used: day.tokens,
                    limits,
                    others,
                    in_flight,
                    cooldown,
                });
            }
            rows.sort_by(|a, b| {
                (&a.route.platform, &a.route.model_id, a.route.key_id).cmp(&(
                    &b.route.platform,
                    &b.route.model_id,
                    b.route.key_id,
                ))
            });
            rows
        })
    }

    /// Deliberately panics inside the engine (tests prove a panic becomes an exception).
    pub fn debug_panic(&mut self) -> Result<()> {
        panic!("debug_panic: a deliberate panic inside the engine")
    }
}

/// The limits a call uses: the given ones, else the model's declared ones, else none.
pub fn limits_from(m: &Mirror, platform: &str, model_id: &str, given: Option<LimitSet>) -> LimitSet {
    given.unwrap_or_else(|| m.limit_set(platform, model_id))
}

/// Lease ids: random 63-bit numbers, distinct across processes without coordination
/// (a random 40-bit prefix per engine and a 23-bit counter, re-randomised on wrap).
struct LeaseIds {
    prefix: i64,
    counter: i64,
}

impl LeaseIds {
    fn new() -> Self {
        Self { prefix: Self::prefix(), counter: 0 }
    }
    fn prefix() -> i64 {
        // 40 bits, never zero, so that ids are > 0.
        ((crate::core::random::random_u64() >> 24) as i64 & ((1 << 40) - 1)).max(1)
    }
    fn next(&mut self) -> i64 {
        self.counter += 1;
        if self.counter >= (1 << 23) {
            self.prefix = Self::prefix();
            self.counter = 1;
        }
        (self.prefix << 23) | self.counter
    }
}
