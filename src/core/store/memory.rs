//! The in-memory twin of the stores: the [`Store`] protocol kept faithfully in
//! memory, for tests of the engine without a file or a server (oxigraph keeps one
//! beside its RocksDB storage for the same reason).
//!
//! A [`MemoryStore`] is one handle (one engine's connection); [`MemoryStore::connect`]
//! opens another on the same tables, as a second process opens the same SQLite file
//! or Redis prefix. What the handles share:
//!
//! * the committed tables, and a write lock: `begin(true)` waits for it up to the busy
//!   timeout; the section works on a copy that its commit installs (a reader never
//!   sees half a section);
//! * a feed of usage rows and lease inserts, numbered in commit order, from which
//!   `pull` delivers what other handles wrote (never a handle's own rows), and a
//!   version per table, bumped by every change to it;
//! * optimistic sections, as on Redis: `begin_append` and `begin_optimistic` read
//!   nothing first; their commit takes in what changed (delivered by the next `pull`)
//!   and, for a section that inserted leases, writes nothing and fails with
//!   [`StoreError::Conflict`] when another handle touched the usage or leases of those
//!   accounts or of those leases' tenants, or any small table, since the previous pull;
//! * claims (`try_claim`) across handles, and "only writer" (`sole_writer`) while one
//!   writable handle is open;
//! * a [`Control`] a test keeps while an engine owns the handle: takes the store down
//!   (every call fails as an outage), refuses commits ([`StoreError::Rejected`]) or
//!   loses their replies ([`StoreError::InDoubt`], applied), and counts commits.
use super::{
    Changes, CooldownRow, HistoryKind, HistoryRow, LeaseRow, LogRow, QuotaStateRow, Store, StoreResult,
    TenantLimitsRow, UsageFilter, UsageRow, Write,
};
use crate::core::error::StoreError;
use crate::core::limits::Limit;
use crate::core::money::Prices;
use crate::core::tenants::TenantList;
use crate::core::types::{CapOverrides, KeyInfo, ModelInfo};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Versioned tables, by index.
const LEASES: usize = 0;
const COOLDOWNS: usize = 1;
const KEYS: usize = 2;
const MODELS: usize = 3;
const CAPS: usize = 4;
const HISTORY: usize = 5;
const CALENDARS: usize = 6;
const PRIORITIES: usize = 7;
/// The observed quota: read by the `headroom` pick, which may be up to 5 s old (SPEC
/// §8.2), so a change to it conflicts with no decision (as on Redis).
const QUOTA: usize = 8;
const PRICES: usize = 9;
const PLATFORM_LIMITS: usize = 10;
const TENANT_LIMITS: usize = 11;
/// The small tables: a change to any of them makes an optimistic commit conflict.
const SMALL: [usize; 10] =
    [COOLDOWNS, KEYS, MODELS, CAPS, HISTORY, CALENDARS, PRIORITIES, PRICES, PLATFORM_LIMITS, TENANT_LIMITS];

/// Every table, as committed (or as a locked section's working copy).
#[derive(Clone, Default)]
struct Tables {
    /// Usage rows in commit order: (feed number, writer, row).
    usage: Vec<(u64, u64, UsageRow)>,
    /// Lease inserts in commit order: (feed number, writer, key, platform, tenants),
    /// for the conflict check of optimistic commits.
    lease_feed: Vec<(u64, u64, i64, Arc<str>, TenantList)>,
    /// The highest feed number committed.
    head: u64,
    leases: BTreeMap<i64, LeaseRow>,
    cooldowns: BTreeMap<CooldownId, CooldownRow>,
    keys: BTreeMap<i64, KeyInfo>,
    models: BTreeMap<(String, String), ModelInfo>,
    caps: BTreeMap<String, CapOverrides>,
    history: Vec<HistoryRow>,
    quota: BTreeMap<(String, i64, String, String), QuotaStateRow>,
    logs: Vec<(i64, LogRow)>,
    calendars: BTreeMap<String, String>,
    /// SPEC 22.1: priority -> reserve fraction.
    priorities: BTreeMap<i64, f64>,
    /// SPEC 23.1: (platform, model_id) -> prices.
    prices: BTreeMap<(String, String), Prices>,
    /// SPEC 23.3: platform -> its limits as declared.
    platform_limits: BTreeMap<String, Vec<Limit>>,
    /// SPEC 23.2: tenant or pattern -> its limits as declared and its zone.
    tenant_limits: BTreeMap<String, (Vec<Limit>, Option<String>)>,
    versions: [u64; 12],
}

#[derive(Default)]
struct Faults {
    down: bool,
    reject: usize,
    lose: usize,
}

#[derive(Default)]
struct State {
    tables: Tables,
    /// The handle holding the write lock.
    lock: Option<u64>,
    /// Writable handles open.
    writers: usize,
    claims: HashMap<String, (u64, Instant)>,
    faults: Faults,
    /// Commits that wrote something.
    commits: u64,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    unlocked: Condvar,
    /// Feed numbers and log ids: never handed out twice, even by abandoned sections.
    seq: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Read,
    /// Holds the write lock; works on a copy of the tables.
    Locked,
    /// Reads nothing first; the writes are applied at commit.
    Append,
    Optimistic,
}

/// One handle on an in-memory store (see the module's documentation).
pub struct MemoryStore {
    shared: Arc<Shared>,
    owner: u64,
    readonly: bool,
    busy_timeout_ms: i64,
    section: Option<Section>,
    /// A locked section's copy of the tables.
    work: Option<Tables>,
    /// An unlocked section's writes, applied at commit.
    staged: Vec<Write>,
    /// Accounts (key, platform) an optimistic commit checks.
    watched: Vec<(i64, String)>,
    /// Tenants an optimistic commit checks (those of the leases it inserts).
    watched_tenants: Vec<Arc<str>>,
    /// The feed number up to which changes were taken in.
    cursor: u64,
    /// Table versions as of what was taken in; `None` before the first pull.
    seen: Option<[u64; 12]>,
    /// Taken in by an unlocked commit, delivered by the next pull.
    pending: Changes,
    /// A locked section has written.
    dirty: bool,
}

/// A test's switch for the faults of a memory store, and its counters.
#[derive(Clone)]
pub struct Control(Arc<Shared>);

static OWNERS: AtomicU64 = AtomicU64::new(1);

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A new, empty store and its first handle.
    pub fn new() -> MemoryStore {
        Self::handle(Arc::new(Shared::default()), false)
    }

    /// Another handle on the same store, as another engine would open it.
    pub fn connect(&self) -> MemoryStore {
        Self::handle(self.shared.clone(), false)
    }

    /// A read-only handle on the same store.
    pub fn connect_readonly(&self) -> MemoryStore {
        Self::handle(self.shared.clone(), true)
    }

    /// The store's fault switches and counters.
    pub fn control(&self) -> Control {
        Control(self.shared.clone())
    }

    fn handle(shared: Arc<Shared>, readonly: bool) -> MemoryStore {
        if !readonly {
            shared.state.lock().writers += 1;
        }
        MemoryStore {
            shared,
            owner: OWNERS.fetch_add(1, Ordering::Relaxed),
            readonly,
            busy_timeout_ms: 5_000,
            section: None,
            work: None,
            staged: Vec::new(),
            watched: Vec::new(),
            watched_tenants: Vec::new(),
            cursor: 0,
            seen: None,
            pending: Changes::default(),
            dirty: false,
        }
    }

    fn down(state: &State) -> StoreResult<()> {
        if state.faults.down {
            return Err(StoreError::Unavailable("memory store: down".into()));
        }
        Ok(())
    }

    /// Waits (up to the busy timeout) until no other handle holds the write lock.
    fn wait_unlocked<'a>(
        &self, mut state: parking_lot::MutexGuard<'a, State>,
    ) -> StoreResult<parking_lot::MutexGuard<'a, State>> {
        let deadline = Instant::now() + Duration::from_millis(self.busy_timeout_ms.max(0) as u64);
        while state.lock.is_some_and(|o| o != self.owner) {
            if self.shared.unlocked.wait_until(&mut state, deadline).timed_out()
                && state.lock.is_some_and(|o| o != self.owner)
            {
                return Err(StoreError::Unavailable("memory store: locked past the busy timeout".into()));
            }
        }
        Ok(state)
    }

    fn next_seq(&self) -> u64 {
        self.shared.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// What changed in `t` since what this handle took in, without its own rows.
    fn changes_in(&self, t: &Tables) -> Changes {
        let seen = self.seen;
        let changed = |i: usize| seen.is_none_or(|s| s[i] != t.versions[i]);
        let mut ch = Changes {
            usage: t
                .usage
                .iter()
                .filter(|(n, who, _)| *n > self.cursor && *who != self.owner)
                .map(|(_, _, u)| u.clone())
                .collect(),
            ..Changes::default()
        };
        if changed(LEASES) {
            ch.leases = Some(t.leases.values().cloned().collect());
        }
        if changed(COOLDOWNS) {
            ch.cooldowns = Some(t.cooldowns.values().cloned().collect());
        }
        if changed(KEYS) {
            ch.keys = Some(t.keys.values().cloned().collect());
        }
        if changed(MODELS) {
            ch.models = Some(t.models.values().cloned().collect());
        }
        if changed(CAPS) {
            ch.caps = Some(t.caps.iter().map(|(p, c)| (p.clone(), *c)).collect());
        }
        if changed(HISTORY) {
            ch.history = Some(t.history.clone());
        }
        if changed(CALENDARS) {
            ch.calendars = Some(t.calendars.iter().map(|(p, z)| (p.clone(), z.clone())).collect());
        }
        if changed(PRIORITIES) {
            ch.priorities = Some(t.priorities.iter().map(|(p, f)| (*p, *f)).collect());
        }
        if changed(QUOTA) {
            ch.quota_states = Some(t.quota.values().cloned().collect());
        }
        if changed(PRICES) {
            ch.prices = Some(t.prices.iter().map(|((p, m), v)| (p.clone(), m.clone(), *v)).collect());
        }
        if changed(PLATFORM_LIMITS) {
            ch.platform_limits =
                Some(t.platform_limits.iter().map(|(p, l)| (p.clone(), l.clone())).collect());
        }
        if changed(TENANT_LIMITS) {
            ch.tenant_limits = Some(
                t.tenant_limits
                    .iter()
                    .map(|(n, (l, tz))| TenantLimitsRow {
                        tenant: n.clone(),
                        limits: l.clone(),
                        tz: tz.clone(),
                    })
                    .collect(),
            );
        }
        ch
    }

    /// Takes in what changed in `t` (for the next pull), up to its head.
    fn take_in(&mut self, t: &Tables) {
        let fresh = self.changes_in(t);
        let mut pending = std::mem::take(&mut self.pending);
        pending.usage.extend(fresh.usage);
        // A table read now replaces one taken in before.
        macro_rules! newer {
            ($($f:ident),*) => { $( if fresh.$f.is_some() { pending.$f = fresh.$f; } )* };
        }
        newer!(
            leases,
            cooldowns,
            keys,
            models,
            caps,
            history,
            calendars,
            priorities,
            quota_states,
            prices,
            platform_limits,
            tenant_limits
        );
        self.pending = pending;
        self.cursor = t.head;
        self.seen = Some(t.versions);
    }

    /// An optimistic commit's check: another handle touched a watched account's usage
    /// or leases, or a watched tenant's (SPEC 23.2), or changed a small table, since
    /// what this handle took in.
    fn conflicts(&self, t: &Tables) -> bool {
        let Some(seen) = self.seen else { return true };
        if SMALL.iter().any(|&i| seen[i] != t.versions[i]) {
            return true;
        }
        let watched = |k: i64, p: &str, tenants: &[Arc<str>]| {
            self.watched.iter().any(|(wk, wp)| *wk == k && wp == p)
                || tenants.iter().any(|t| self.watched_tenants.contains(t))
        };
        let usage = t
            .usage
            .iter()
            .rev()
            .take_while(|(n, ..)| *n > self.cursor)
            .any(|(_, who, u)| *who != self.owner && watched(u.key_id, &u.platform, &u.tenants));
        let leases = t
            .lease_feed
            .iter()
            .rev()
            .take_while(|(n, ..)| *n > self.cursor)
            .any(|(_, who, k, p, tenants)| *who != self.owner && watched(*k, p, tenants));
        usage || leases
    }

    /// Applies one write to `t`; returns an insert's id or a delete's count.
    fn apply(&self, t: &mut Tables, w: &Write) -> i64 {
        let bump = |t: &mut Tables, i: usize| t.versions[i] += 1;
        match w {
            Write::Usage(u) => {
                let n = self.next_seq();
                t.usage.push((n, self.owner, u.clone()));
                t.head = t.head.max(n);
                return n as i64;
            }
            Write::InsertLease(l) => {
                let n = self.next_seq();
                t.lease_feed.push((n, self.owner, l.key_id, l.platform.clone(), l.tenants.clone()));
                t.head = t.head.max(n);
                t.leases.insert(l.id, l.clone());
                bump(t, LEASES);
                return l.id;
            }
            Write::RenewLeases(rows) => {
                for l in rows {
                    let n = self.next_seq();
                    t.lease_feed.push((n, self.owner, l.key_id, l.platform.clone(), l.tenants.clone()));
                    t.head = t.head.max(n);
                    t.leases.insert(l.id, l.clone());
                }
                bump(t, LEASES);
                return 0;
            }
            Write::DeleteLease(id) => {
                let gone = t.leases.remove(id).is_some();
                if gone {
                    bump(t, LEASES);
                }
                return i64::from(gone);
            }
            Write::UpsertCooldown(c) => {
                t.cooldowns.insert((c.platform.clone(), c.model_id.clone(), c.key_id), c.clone());
                bump(t, COOLDOWNS);
            }
            Write::DeleteCooldown { platform, model_id, key_id } => {
                let gone = t.cooldowns.remove(&(platform.clone(), model_id.clone(), Some(*key_id))).is_some();
                if gone {
                    bump(t, COOLDOWNS);
                }
                return i64::from(gone);
            }
            Write::DeleteCooldownsForKey(key_id) => {
                return retain_counted(&mut t.cooldowns, &mut t.versions[COOLDOWNS], |c| {
                    c.key_id != Some(*key_id)
                })
            }
            Write::DeleteExpiredCooldowns(now) => {
                return retain_counted(&mut t.cooldowns, &mut t.versions[COOLDOWNS], |c| {
                    c.expires_at_ms > *now
                })
            }
            Write::UpsertKey(k) => {
                t.keys.insert(k.key_id, k.clone());
                bump(t, KEYS);
            }
            Write::UpsertModel(m) => {
                t.models.insert((m.platform.clone(), m.model_id.clone()), m.clone());
                bump(t, MODELS);
            }
            Write::SetCaps(p, c) => {
                t.caps.insert(p.clone(), *c);
                bump(t, CAPS);
            }
            Write::ResetCaps(p) => {
                let gone = t.caps.remove(p).is_some();
                if gone {
                    bump(t, CAPS);
                }
                return i64::from(gone);
            }
            Write::InsertHistory(h) => {
                t.history.push(h.clone());
                bump(t, HISTORY);
            }
            Write::DeleteHistory { key_id, route, kinds } => {
                let before = t.history.len();
                t.history.retain(|h| {
                    let on_route = route.as_ref().is_none_or(|(p, m)| h.platform == *p && h.model_id == *m);
                    !(h.key_id == *key_id && kinds.contains(&h.kind) && on_route)
                });
                let n = before - t.history.len();
                if n > 0 {
                    bump(t, HISTORY);
                }
                return n as i64;
            }
            Write::UpsertQuotaState(q) => {
                let key = (q.platform.clone(), q.key_id, q.pool_key.clone(), q.metric.clone());
                if t.quota.insert(key, q.clone()).as_ref() != Some(q) {
                    bump(t, QUOTA);
                }
            }
            Write::Sweep { usage_before, kept, leases_expired_before, history_before } => {
                let before = t.history.len();
                // SPEC 24.2: a learned concurrency cap's rows are never swept.
                t.history.retain(|h| h.hit_at_ms >= *history_before || h.kind == HistoryKind::Concurrency);
                if t.history.len() != before {
                    bump(t, HISTORY);
                }
                let before = t.leases.len();
                t.leases.retain(|_, l| l.expires_at_ms >= *leases_expired_before);
                if t.leases.len() != before {
                    bump(t, LEASES);
                }
                let before = t.usage.len();
                // SPEC 14.2: a kept model's rows stay back to its own cut-off.
                t.usage.retain(|(_, _, u)| {
                    u.created_at_ms
                        >= super::usage_cutoff(kept, *usage_before, &u.platform, &u.model_id, &u.tenants)
                });
                return (before - t.usage.len()) as i64;
            }
            Write::Log(l) => {
                let id = self.next_seq() as i64;
                t.logs.push((id, l.clone()));
                return id;
            }
            Write::SetCalendar { platform, zone } => {
                let changed = match zone {
                    Some(z) => t.calendars.insert(platform.clone(), z.clone()).is_none_or(|old| old != *z),
                    None => t.calendars.remove(platform).is_some(),
                };
                if changed {
                    bump(t, CALENDARS);
                }
                return i64::from(changed);
            }
            Write::SetPriorityReserve { priority, fraction } => {
                if t.priorities.insert(*priority, *fraction) != Some(*fraction) {
                    bump(t, PRIORITIES);
                }
            }
            Write::SetModelPrices { platform, model_id, prices } => {
                let route = (platform.clone(), model_id.clone());
                let changed = match prices {
                    Some(p) => t.prices.insert(route, *p) != Some(*p),
                    None => t.prices.remove(&route).is_some(),
                };
                if changed {
                    bump(t, PRICES);
                }
                return i64::from(changed);
            }
            Write::SetPlatformLimits { platform, limits } => {
                let changed = if limits.is_empty() {
                    t.platform_limits.remove(platform).is_some()
                } else {
                    t.platform_limits.insert(platform.clone(), limits.clone()).as_ref() != Some(limits)
                };
                if changed {
                    bump(t, PLATFORM_LIMITS);
                }
            }
            Write::SetTenantLimits(TenantLimitsRow { tenant, limits, tz }) => {
                let changed = if limits.is_empty() {
                    t.tenant_limits.remove(tenant).is_some()
                } else {
                    let row = (limits.clone(), tz.clone());
                    t.tenant_limits.insert(tenant.clone(), row.clone()).as_ref() != Some(&row)
                };
                if changed {
                    bump(t, TENANT_LIMITS);
                }
            }
        }
        0
    }

    /// Reads the committed tables, or a locked section's copy (its own writes
    /// included, as a transaction reads its own).
    fn read<T>(&self, f: impl FnOnce(&Tables) -> T) -> StoreResult<T> {
        if let Some(w) = &self.work {
            return Ok(f(w));
        }
        let state = self.shared.state.lock();
        Self::down(&state)?;
        Ok(f(&state.tables))
    }

    /// A write section's commit (the section is ended by the caller).
    fn commit_writes(
        &mut self, section: Section, state: parking_lot::MutexGuard<'_, State>,
    ) -> StoreResult<()> {
        Self::down(&state)?;
        let wrote = match section {
            Section::Locked => self.dirty,
            _ => !self.staged.is_empty(),
        };
        if !wrote {
            return Ok(());
        }
        let mut state = match section {
            Section::Locked => state,
            _ => self.wait_unlocked(state)?,
        };
        if section != Section::Locked {
            let leases = self.staged.iter().any(|w| matches!(w, Write::InsertLease(_)));
            let conflict = section == Section::Optimistic && leases && self.conflicts(&state.tables);
            // What others wrote is taken in either way: the next pull delivers it.
            self.take_in(&state.tables);
            if conflict {
                return Err(StoreError::Conflict);
            }
        }
        let lost = match Self::fault(&mut state) {
            Some(Err(e)) => return Err(e),
            Some(Ok(())) => true,
            None => false,
        };
        let tables = match section {
            Section::Locked => self.work.take().unwrap_or_default(),
            _ => {
                let mut t = std::mem::take(&mut state.tables);
                for w in std::mem::take(&mut self.staged) {
                    self.apply(&mut t, &w);
                }
                t
            }
        };
        state.tables = tables;
        state.commits += 1;
        // Everything else was taken in before these writes: only they are new.
        self.cursor = state.tables.head;
        self.seen = Some(state.tables.versions);
        if lost {
            return Err(StoreError::InDoubt("memory store: the commit's reply was lost".into()));
        }
        Ok(())
    }

    fn end_section(&mut self) {
        if self.section == Some(Section::Locked) {
            let mut state = self.shared.state.lock();
            if state.lock == Some(self.owner) {
                state.lock = None;
            }
            self.shared.unlocked.notify_all();
        }
        self.section = None;
        self.work = None;
        self.staged.clear();
        self.watched.clear();
        self.watched_tenants.clear();
    }

    fn open_unlocked(&mut self, section: Section) -> StoreResult<()> {
        if self.readonly {
            return Err(StoreError::ReadOnly);
        }
        if self.section.is_some() {
            self.rollback();
        }
        Self::down(&self.shared.state.lock())?;
        self.section = Some(section);
        Ok(())
    }

    /// The commit's fault, if the test asked for one: `Some(Err)` refuses it,
    /// `Some(Ok)` applies it and loses the reply.
    fn fault(state: &mut State) -> Option<StoreResult<()>> {
        if state.faults.reject > 0 {
            state.faults.reject -= 1;
            return Some(Err(StoreError::Rejected("memory store: commit refused".into())));
        }
        if state.faults.lose > 0 {
            state.faults.lose -= 1;
            return Some(Ok(()));
        }
        None
    }
}

/// A cooldown's identity: (platform, model, key), no key for a model-wide bench.
type CooldownId = (Arc<str>, Arc<str>, Option<i64>);

/// Keeps the cooldowns `keep` says; returns how many went (and bumps their version).
fn retain_counted(
    rows: &mut BTreeMap<CooldownId, CooldownRow>, version: &mut u64, keep: impl Fn(&CooldownRow) -> bool,
) -> i64 {
    let before = rows.len();
    rows.retain(|_, c| keep(c));
    let n = before - rows.len();
    if n > 0 {
        *version += 1;
    }
    n as i64
}

impl Drop for MemoryStore {
    fn drop(&mut self) {
        self.rollback();
        if !self.readonly {
            self.shared.state.lock().writers -= 1;
        }
    }
}

impl Store for MemoryStore {
    fn readonly(&self) -> bool {
        self.readonly
    }

    fn changed(&mut self) -> StoreResult<bool> {
        let state = self.shared.state.lock();
        let t = &state.tables;
        let pending = &self.pending;
        let taken_in = !pending.usage.is_empty()
            || pending.leases.is_some()
            || pending.cooldowns.is_some()
            || pending.keys.is_some()
            || pending.models.is_some()
            || pending.caps.is_some()
            || pending.history.is_some()
            || pending.calendars.is_some()
            || pending.priorities.is_some()
            || pending.quota_states.is_some()
            || pending.prices.is_some()
            || pending.platform_limits.is_some()
            || pending.tenant_limits.is_some();
        Ok(state.faults.down || self.seen != Some(t.versions) || t.head > self.cursor || taken_in)
    }

    fn begin(&mut self, write: bool) -> StoreResult<()> {
        if write && self.readonly {
            return Err(StoreError::ReadOnly);
        }
        if self.section.is_some() {
            self.rollback();
        }
        let shared = self.shared.clone();
        let state = shared.state.lock();
        Self::down(&state)?;
        if !write {
            self.section = Some(Section::Read);
            return Ok(());
        }
        let mut state = self.wait_unlocked(state)?;
        state.lock = Some(self.owner);
        // What others wrote up to now is the section's to pull; from here on only
        // this handle writes.
        self.take_in(&state.tables);
        self.work = Some(state.tables.clone());
        self.dirty = false;
        self.section = Some(Section::Locked);
        Ok(())
    }

    fn begin_append(&mut self) -> StoreResult<()> {
        self.open_unlocked(Section::Append)
    }

    fn begin_optimistic(&mut self) -> StoreResult<bool> {
        self.open_unlocked(Section::Optimistic).map(|()| true)
    }

    fn commit(&mut self) -> StoreResult<()> {
        let Some(section) = self.section else { return Ok(()) };
        let result = if section == Section::Read {
            Ok(())
        } else {
            let shared = self.shared.clone();
            let state = shared.state.lock();
            self.commit_writes(section, state)
        };
        self.end_section();
        result
    }

    fn rollback(&mut self) {
        self.end_section();
    }

    fn pull(&mut self) -> StoreResult<Changes> {
        match self.section {
            // Nothing is read before an unlocked section's commit.
            Some(Section::Append | Section::Optimistic) => {}
            Some(Section::Locked) => {
                if let Some(w) = self.work.take() {
                    self.take_in(&w);
                    self.work = Some(w);
                }
            }
            Some(Section::Read) | None => {
                let shared = self.shared.clone();
                let state = shared.state.lock();
                Self::down(&state)?;
                self.take_in(&state.tables);
            }
        }
        Ok(std::mem::take(&mut self.pending))
    }

    fn load_usage_since(&mut self, since_ms: i64, f: &mut dyn FnMut(UsageRow)) -> StoreResult<()> {
        let head = self.read(|t| {
            for (_, _, u) in t.usage.iter().filter(|(_, _, u)| u.created_at_ms >= since_ms) {
                f(u.clone());
            }
            t.head
        })?;
        // The rows just loaded include any the feed held for the next pull.
        self.pending.usage.clear();
        self.cursor = self.cursor.max(head);
        Ok(())
    }

    fn write(&mut self, w: &Write) -> StoreResult<i64> {
        if self.readonly {
            return Err(StoreError::ReadOnly);
        }
        match self.section {
            Some(Section::Locked) => {
                let mut work = self.work.take().unwrap_or_default();
                let out = self.apply(&mut work, w);
                self.work = Some(work);
                self.dirty = true;
                Ok(out)
            }
            Some(Section::Append | Section::Optimistic) => {
                self.staged.push(w.clone());
                Ok(match w {
                    Write::InsertLease(l) => {
                        self.watch_keys(&l.platform, &[l.key_id]);
                        if self.section == Some(Section::Optimistic) {
                            // SPEC 23.2: its tenants' usage and leases too.
                            for tenant in l.tenants.iter() {
                                if !self.watched_tenants.contains(tenant) {
                                    self.watched_tenants.push(tenant.clone());
                                }
                            }
                        }
                        l.id
                    }
                    _ => 0,
                })
            }
            Some(Section::Read) | None => {
                Err(StoreError::Unavailable("memory store: no write section open".into()))
            }
        }
    }

    fn try_claim(&mut self, name: &str, ttl_ms: i64) -> StoreResult<bool> {
        let mut state = self.shared.state.lock();
        Self::down(&state)?;
        let now = Instant::now();
        let free = state.claims.get(name).is_none_or(|(who, until)| *who == self.owner || *until <= now);
        if free {
            let until = now + Duration::from_millis(ttl_ms.max(1) as u64);
            state.claims.insert(name.to_string(), (self.owner, until));
        }
        Ok(free)
    }

    fn sole_writer(&mut self) -> bool {
        let state = self.shared.state.lock();
        state.writers == 1 && !self.readonly && !state.faults.down
    }

    fn set_busy_timeout(&mut self, ms: i64) {
        self.busy_timeout_ms = ms;
    }

    fn watch_keys(&mut self, platform: &str, keys: &[i64]) {
        if self.section != Some(Section::Optimistic) {
            return;
        }
        for k in keys {
            if !self.watched.iter().any(|(wk, wp)| wk == k && wp == platform) {
                self.watched.push((*k, platform.to_string()));
            }
        }
    }

    fn after_fork(&mut self) -> bool {
        // The child's memory is its own copy.
        true
    }

    fn usage_events(&mut self, f: &UsageFilter) -> StoreResult<Vec<UsageRow>> {
        let mut out: Vec<(i64, u64, UsageRow)> = self.read(|t| {
            t.usage
                .iter()
                .filter(|(_, _, u)| {
                    f.since_ms.is_none_or(|s| u.created_at_ms >= s)
                        && f.until_ms.is_none_or(|s| u.created_at_ms < s)
                        && f.platform.as_deref().is_none_or(|p| *u.platform == *p)
                        && f.model_id.as_deref().is_none_or(|m| *u.model_id == *m)
                        && f.key_id.is_none_or(|k| u.key_id == k)
                })
                .map(|(n, _, u)| (u.created_at_ms, *n, u.clone()))
                .collect()
        })?;
        out.sort_by_key(|(t, n, _)| (*t, *n));
        // One row per request, as in the SQLite table.
        Ok(out.into_iter().flat_map(|(_, _, u)| u.one_per_event()).collect())
    }

    fn quota_states(&mut self, platform: Option<&str>) -> StoreResult<Vec<QuotaStateRow>> {
        // Ordered by (platform, key, pool, metric): the map's order.
        self.read(|t| {
            t.quota.values().filter(|q| platform.is_none_or(|p| p == q.platform)).cloned().collect()
        })
    }

    fn server_logs(&mut self, limit: i64) -> StoreResult<Vec<(i64, LogRow, Option<String>)>> {
        let mut rows = self.read(|t| t.logs.clone())?;
        rows.sort_by_key(|(id, l)| std::cmp::Reverse((l.created_at_ms, *id)));
        Ok(rows.into_iter().take(limit.max(0) as usize).map(|(id, l)| (id, l, None)).collect())
    }
}

impl Control {
    /// Another handle on the store (as [`MemoryStore::connect`]).
    pub fn connect(&self) -> MemoryStore {
        MemoryStore::handle(self.0.clone(), false)
    }

    /// A read-only handle on the store.
    pub fn connect_readonly(&self) -> MemoryStore {
        MemoryStore::handle(self.0.clone(), true)
    }

    /// Takes the store down (every call fails as an outage) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.0.state.lock().faults.down = down;
    }

    /// The next `n` commits that write are refused ([`StoreError::Rejected`]):
    /// nothing of them is written.
    pub fn reject_commits(&self, n: usize) {
        self.0.state.lock().faults.reject = n;
    }

    /// The next `n` commits that write are applied, and their reply is lost
    /// ([`StoreError::InDoubt`]).
    pub fn lose_replies(&self, n: usize) {
        self.0.state.lock().faults.lose = n;
    }

    /// Commits that wrote something, so far.
    pub fn commits(&self) -> u64 {
        self.0.state.lock().commits
    }

    /// Usage rows stored (a request row merged while degraded counts once).
    pub fn usage_rows(&self) -> usize {
        self.0.state.lock().tables.usage.len()
    }

    /// Live leases stored.
    pub fn leases(&self) -> usize {
        self.0.state.lock().tables.leases.len()
    }

    /// History rows stored of this kind.
    pub fn history(&self, kind: HistoryKind) -> usize {
        self.0.state.lock().tables.history.iter().filter(|h| h.kind == kind).count()
    }
}
