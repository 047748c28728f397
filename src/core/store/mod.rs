//! Storage behind one trait. The engine keeps the live window state in memory and
//! talks to a store only through [`Store`]: atomic sections, a feed of what other
//! processes changed, and typed writes. SQLite is the first backend; a networked one
//! (Redis, behind the cargo feature `redis`) implements the same trait, and an
//! in-memory twin ([`memory`]) implements it for tests of the engine.
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redis_sentinel;
#[cfg(feature = "redis")]
pub mod redis_topology;
pub mod registry;
pub mod schema;
pub mod sqlite;

use crate::core::error::StoreError;

/// Without the Redis backend a Redis URL is still told from a file path (and refused
/// at open rather than taken for a SQLite file of that name).
#[cfg(not(feature = "redis"))]
pub mod redis {
    /// True when `path` names a Redis server rather than a file.
    pub fn is_redis_url(path: &str) -> bool {
        ["redis://", "rediss://", "redis+", "rediss+", "unix://"].iter().any(|s| path.starts_with(s))
    }
}
use crate::core::limits::Limit;
use crate::core::money::Prices;
use crate::core::tenants::TenantList;
use crate::core::types::{CapOverrides, CooldownSource, KeyInfo, ModelInfo};
use std::sync::Arc;

pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// Where the state lives.
#[derive(Debug, Clone)]
pub enum StoreSpec {
    /// A SQLite file, or `":memory:"` for a private in-memory database.
    Sqlite(String),
    /// A Redis server: `redis://[:password@]host:port/db[?prefix=name]`, `rediss://...`;
    /// Sentinel (`redis+sentinel://`) or Cluster (`redis+cluster://`), SPEC 19.3.
    Redis(String),
}

impl StoreSpec {
    /// A Redis URL names a server; anything else is a SQLite path.
    pub fn from_path(path: &str) -> StoreSpec {
        if redis::is_redis_url(path) {
            StoreSpec::Redis(path.to_string())
        } else {
            StoreSpec::Sqlite(path.to_string())
        }
    }

    /// A Redis URL that cannot be taken apart (no hosts, no service, an unknown
    /// scheme variant, a cluster URL with a database number: SPEC 19.3) is bad input,
    /// refused before anything is opened.
    pub fn check(&self) -> std::result::Result<(), crate::core::error::Error> {
        match self {
            #[cfg(feature = "redis")]
            StoreSpec::Redis(url) => {
                redis::url::parse(url).map(drop).map_err(crate::core::error::Error::Invalid)
            }
            // Refused at open: this build has no Redis backend.
            #[cfg(not(feature = "redis"))]
            StoreSpec::Redis(_) => Ok(()),
            StoreSpec::Sqlite(_) => Ok(()),
        }
    }

    /// Opens the backend it names (and migrates or checks it).
    pub fn open(&self, readonly: bool, busy_timeout_ms: i64) -> StoreResult<Box<dyn Store>> {
        Ok(match self {
            StoreSpec::Sqlite(path) => Box::new(sqlite::SqliteStore::open(path, readonly, busy_timeout_ms)?),
            #[cfg(feature = "redis")]
            StoreSpec::Redis(url) => Box::new(redis::RedisStore::open(url, readonly, busy_timeout_ms)?),
            #[cfg(not(feature = "redis"))]
            StoreSpec::Redis(url) => {
                return Err(StoreError::Incompatible(format!(
                    "cannot open {url:?}: this build has no Redis backend (cargo feature `redis`)"
                )))
            }
        })
    }
}

/// `rate_limit_usage.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageKind {
    Request,
    Tokens,
}

impl UsageKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageKind::Request => "request",
            UsageKind::Tokens => "tokens",
        }
    }
}

/// One usage event, or several of one route merged in memory while they wait for
/// the store (degraded mode). `tokens` is always tokens: 0 for a `request` row.
/// `count` is how many requests a `request` row stands for (1 unless merged); a
/// store writes it as that many rows of one request each (SPEC §10), so a plain
/// `COUNT(*)` of request rows is the request count. For a `tokens` row it is 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub platform: Arc<str>,
    pub model_id: Arc<str>,
    pub key_id: i64,
    pub kind: UsageKind,
    /// A `tokens` row: the total.
    pub tokens: i64,
    pub count: i64,
    pub created_at_ms: i64,
    /// A `tokens` row: the split the call reported (SPEC §14.4), `None` where not.
    pub kinds: TokenKinds,
    /// What the event cost in µ$ at the prices in force when it was recorded (SPEC
    /// 23.1; 0 unpriced).
    pub cost: i64,
    /// The tenants it was served for (SPEC 23.2; empty: none).
    pub tenants: TenantList,
}

/// The input, output and cached-input tokens of one call, as reported (SPEC §14.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TokenKinds {
    pub input: Option<i64>,
    pub output: Option<i64>,
    /// Cache reads, part of the input.
    pub cached: Option<i64>,
}

impl TokenKinds {
    /// What the call counts in `input_tokens` windows: input without cached input
    /// (cached above input counts 0).
    pub fn metered_input(&self) -> i64 {
        self.input.map_or(0, |i| i.saturating_sub(self.cached.unwrap_or(0)).max(0))
    }

    pub fn is_empty(&self) -> bool {
        self.input.is_none() && self.output.is_none() && self.cached.is_none()
    }

    /// Two calls' splits added (a part missing from both stays missing).
    pub fn merged(self, o: TokenKinds) -> TokenKinds {
        let add = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        TokenKinds {
            input: add(self.input, o.input),
            output: add(self.output, o.output),
            cached: add(self.cached, o.cached),
        }
    }
}

/// (platform, model_id, key_id, is a request row, UTC minute, tenants): what usage rows
/// must share to be merged into one, by an outage's buffer or a Redis refill journal. Never
/// across tenants: each tenant's windows and budgets count the rows naming it (SPEC 23.2).
pub type UsageMergeKey = (Arc<str>, Arc<str>, i64, bool, i64, TenantList);

impl UsageRow {
    /// The key this row merges under (see [`UsageMergeKey`]).
    pub fn merge_key(&self) -> UsageMergeKey {
        (
            self.platform.clone(),
            self.model_id.clone(),
            self.key_id,
            self.kind == UsageKind::Request,
            self.created_at_ms.div_euclid(crate::core::clock::MINUTE_MS),
            self.tenants.clone(),
        )
    }

    /// Merges `other`, a row of the same [`UsageMergeKey`], into this one: counts, tokens,
    /// their split and cost add up, the later stamp stays.
    pub fn absorb(&mut self, other: &UsageRow) {
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.kinds = self.kinds.merged(other.kinds);
        self.count = self.count.saturating_add(other.count);
        self.cost = self.cost.saturating_add(other.cost);
        self.created_at_ms = self.created_at_ms.max(other.created_at_ms);
    }

    /// The rows of one event each that this row stands for (a request row merged while
    /// degraded stands for several; its cost goes with the first).
    pub fn one_per_event(self) -> impl Iterator<Item = UsageRow> {
        let n = self.requests().max(1);
        (0..n).map(move |i| UsageRow { count: 1, cost: if i == 0 { self.cost } else { 0 }, ..self.clone() })
    }

    /// Requests the row stands for (0 for a `tokens` row).
    pub fn requests(&self) -> i64 {
        match self.kind {
            UsageKind::Request => self.count.max(1),
            UsageKind::Tokens => 0,
        }
    }
}

/// One live lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub id: i64,
    pub platform: Arc<str>,
    pub model_id: Arc<str>,
    pub key_id: i64,
    pub tokens: i64,
    /// Of `tokens`, the estimated output (SPEC §14.4).
    pub output_tokens: i64,
    /// The µ$ it reserves (SPEC 23.1).
    pub cost: i64,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// The tenants it is taken for (SPEC 23.2; empty: none).
    pub tenants: TenantList,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CooldownRow {
    pub platform: Arc<str>,
    pub model_id: Arc<str>,
    /// `None`: the model is benched for every key of the platform (SPEC 21.1).
    pub key_id: Option<i64>,
    pub expires_at_ms: i64,
    pub source: CooldownSource,
    pub set_at_ms: i64,
}

/// A `server_logs` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRow {
    pub level: &'static str,
    pub source: String,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub event: Option<String>,
    pub message: String,
    pub created_at_ms: i64,
}

/// Kind of a `failure_history` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryKind {
    /// A step of the route's 6.1 ladder.
    Ladder,
    /// An unknown-limit hit (6.1 step 3).
    Unknown,
    /// A 401 of the key (model_id is '').
    Auth,
    /// An empty completion in a row.
    Empty,
    /// A transient bench of the route (no ladder step), SPEC 15.2.
    Transient,
    /// A concurrency failure of the key (model_id is ''); `value` is the key
    /// concurrency cap it taught or confirmed, SPEC 15.4.
    Concurrency,
    /// An upstream failure of the route's model (SPEC 21.1): the (platform, model)'s
    /// rows over every key make the chain its bench doubles along.
    Upstream,
    /// A provider minute-requests cap learned from a pool 429 (model_id ''; `value`
    /// the cap), SPEC 21.2.
    PoolMinute,
    /// A provider daily-requests cap learned from a pool 429 (model_id ''; `value`
    /// the cap), SPEC 21.2.
    PoolDay,
    /// A failure of the route's model that penalizes it for `headroom` and `spread`
    /// (SPEC 24.7: server_error, timeout, transport, empty_completion): the
    /// (platform, model)'s rows over every key, the latest per key.
    Penalty,
}

impl HistoryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Ladder => "ladder",
            HistoryKind::Unknown => "unknown",
            HistoryKind::Auth => "auth",
            HistoryKind::Empty => "empty",
            HistoryKind::Transient => "transient",
            HistoryKind::Concurrency => "concurrency",
            HistoryKind::Upstream => "upstream",
            HistoryKind::PoolMinute => "pool_minute",
            HistoryKind::PoolDay => "pool_day",
            HistoryKind::Penalty => "penalty",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ladder" => HistoryKind::Ladder,
            "unknown" => HistoryKind::Unknown,
            "auth" => HistoryKind::Auth,
            "empty" => HistoryKind::Empty,
            "transient" => HistoryKind::Transient,
            "concurrency" => HistoryKind::Concurrency,
            "upstream" => HistoryKind::Upstream,
            "pool_minute" => HistoryKind::PoolMinute,
            "pool_day" => HistoryKind::PoolDay,
            "penalty" => HistoryKind::Penalty,
            _ => return None,
        })
    }

    /// Kinds kept per key (any model), with `model_id` ''.
    pub fn of_key(self) -> bool {
        matches!(
            self,
            HistoryKind::Auth | HistoryKind::Concurrency | HistoryKind::PoolMinute | HistoryKind::PoolDay
        )
    }
}

/// One `failure_history` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    pub platform: Arc<str>,
    pub model_id: Arc<str>,
    pub key_id: i64,
    pub kind: HistoryKind,
    pub hit_at_ms: i64,
    /// What the hit carries: the learned cap of a `Concurrency`, `PoolMinute` or
    /// `PoolDay` row, else `None`.
    pub value: Option<i64>,
}

/// What other writers changed since the previous pull. `None` means "unchanged".
#[derive(Debug, Default)]
pub struct Changes {
    /// New usage rows written by others, in commit order.
    pub usage: Vec<UsageRow>,
    /// The whole set of stored leases, when it may have changed.
    pub leases: Option<Vec<LeaseRow>>,
    pub cooldowns: Option<Vec<CooldownRow>>,
    pub keys: Option<Vec<KeyInfo>>,
    pub models: Option<Vec<ModelInfo>>,
    pub caps: Option<Vec<(String, CapOverrides)>>,
    pub history: Option<Vec<HistoryRow>>,
    /// The stored platform zones: platform -> IANA name.
    pub calendars: Option<Vec<(String, String)>>,
    /// The stored priority reserves (SPEC 22.1): (priority, fraction).
    pub priorities: Option<Vec<(i64, f64)>>,
    /// The observed provider quota rows (SPEC §8.2), every platform's.
    pub quota_states: Option<Vec<QuotaStateRow>>,
    /// The stored model prices (SPEC 23.1): (platform, model_id, prices).
    pub prices: Option<Vec<(String, String, Prices)>>,
    /// The stored platform limits (SPEC 23.3): platform -> its limits as declared.
    pub platform_limits: Option<Vec<(String, Vec<Limit>)>>,
    /// The stored tenant declarations (SPEC 23.2): (tenant or pattern, its limits as
    /// declared, its zone).
    pub tenant_limits: Option<Vec<TenantLimitsRow>>,
}

/// One stored tenant declaration (SPEC 23.2): a tenant's name or a pattern (ending in
/// `*`), its limits as declared (scope `account`) and the zone of its calendar.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantLimitsRow {
    pub tenant: String,
    pub limits: Vec<Limit>,
    pub tz: Option<String>,
}

/// One merged `provider_quota_state` row (SPEC §8.2).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaStateRow {
    pub platform: String,
    pub key_id: i64,
    pub pool_key: String,
    pub metric: String,
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
    pub reset_at_ms: Option<i64>,
    pub source: String,
    pub confidence: f64,
    pub observed_at_ms: i64,
}

/// One change to persisted state.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Usage(UsageRow),
    /// Returns the lease's `id`.
    InsertLease(LeaseRow),
    DeleteLease(i64),
    UpsertCooldown(CooldownRow),
    DeleteCooldown {
        platform: Arc<str>,
        model_id: Arc<str>,
        key_id: i64,
    },
    /// Returns the number of rows deleted.
    DeleteCooldownsForKey(i64),
    /// Deletes cooldowns with `expires_at_ms <= now`; returns the count.
    DeleteExpiredCooldowns(i64),
    UpsertKey(KeyInfo),
    UpsertModel(ModelInfo),
    SetCaps(String, CapOverrides),
    ResetCaps(String),
    InsertHistory(HistoryRow),
    UpsertQuotaState(QuotaStateRow),
    /// Deletes history of `key_id` with one of `kinds`; only of one route when
    /// `route` is given. Returns the count.
    DeleteHistory {
        key_id: i64,
        route: Option<(Arc<str>, Arc<str>)>,
        kinds: Vec<HistoryKind>,
    },
    /// Retention: usage older than `usage_before` (of a model in `kept`, older than
    /// its own `before` instead, SPEC 14.2), leases whose expiry is before
    /// `leases_expired_before` (a lease counts up to and including its expiry).
    Sweep {
        usage_before: i64,
        kept: Arc<[KeptUsage]>,
        leases_expired_before: i64,
        history_before: i64,
    },
    Log(LogRow),
    /// Sets (or with `None` forgets) the stored zone of a platform's calendar.
    SetCalendar {
        platform: String,
        zone: Option<String>,
    },
    /// Sets the reserve fraction of a priority (SPEC 22.1).
    SetPriorityReserve {
        priority: i64,
        fraction: f64,
    },
    /// Sets (or with `None` forgets) a model's prices (SPEC 23.1).
    SetModelPrices {
        platform: String,
        model_id: String,
        prices: Option<Prices>,
    },
    /// Replaces a platform's limits (SPEC 23.3), as declared (scope `account` or
    /// `key`); an empty list forgets them.
    SetPlatformLimits {
        platform: String,
        limits: Vec<Limit>,
    },
    /// Replaces a tenant's (or a pattern's) declaration (SPEC 23.2); empty `limits`
    /// forget it.
    SetTenantLimits(TenantLimitsRow),
    /// SPEC 24.1: the live leases of an engine's `Lease` objects, renewed: each row is
    /// written whole with its new expiry (inserted again when a sweep already took it:
    /// the call it stands for still runs).
    RenewLeases(Vec<LeaseRow>),
}

/// Usage that retention keeps longer than `retention_ms` (SPEC 14.2, 24.3): the
/// current period of a declared week or month limit, or a declared sliding window
/// wider than the minute. Its rows stamped `before` or later stay: a model's rows, or
/// with `tenant` the rows carrying that tenant, of any model (`platform` and
/// `model_id` are then empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptUsage {
    pub platform: Arc<str>,
    pub model_id: Arc<str>,
    pub tenant: Option<Arc<str>>,
    pub before: i64,
}

impl KeptUsage {
    /// A model's rows.
    pub fn model(platform: Arc<str>, model_id: Arc<str>, before: i64) -> KeptUsage {
        KeptUsage { platform, model_id, tenant: None, before }
    }

    /// The rows carrying a tenant.
    pub fn tenant(tenant: Arc<str>, before: i64) -> KeptUsage {
        KeptUsage { platform: Arc::from(""), model_id: Arc::from(""), tenant: Some(tenant), before }
    }

    /// Whether this names a row of (platform, model_id) carrying `tenants`.
    pub fn names(&self, platform: &str, model_id: &str, tenants: &[Arc<str>]) -> bool {
        match &self.tenant {
            None => &*self.platform == platform && &*self.model_id == model_id,
            Some(t) => tenants.iter().any(|x| x == t),
        }
    }
}

/// The oldest time of a usage row of (platform, model_id) carrying `tenants` that
/// retention keeps: the earliest cut-off of what in `kept` names it, else `before`
/// (SPEC 10, 14.2, 24.3: the rows each limit counts, and no others).
pub fn usage_cutoff(
    kept: &[KeptUsage], before: i64, platform: &str, model_id: &str, tenants: &[Arc<str>],
) -> i64 {
    kept.iter().filter(|k| k.names(platform, model_id, tenants)).fold(before, |cut, k| cut.min(k.before))
}

/// Filter of `usage_events`.
#[derive(Debug, Clone, Default)]
pub struct UsageFilter {
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub platform: Option<String>,
    pub model_id: Option<String>,
    pub key_id: Option<i64>,
}

/// A storage backend.
///
/// Protocol: `begin(write)` opens an atomic section (with `write`, the exclusive
/// cross-process write lock, waited for up to the busy timeout); inside it `pull`
/// returns what others changed since the previous pull and `write` applies changes;
/// `commit` makes them durable and visible to every other process. The engine reads
/// the clock only after `begin`, so a writer that waited for the lock sees every row
/// stamped before its own.
pub trait Store: Send {
    /// Opened read-only: every `write` fails with [`StoreError::ReadOnly`].
    fn readonly(&self) -> bool;
    /// Outside a section: true when another writer may have changed something since
    /// the previous pull (cheap; used to skip a read section).
    fn changed(&mut self) -> StoreResult<bool>;
    fn begin(&mut self, write: bool) -> StoreResult<()>;
    /// Opens a write section whose writes only append (usage rows, finished leases)
    /// and decide nothing, so nothing needs to be read first. A networked store
    /// may then write in one round trip at commit; the default takes the lock.
    fn begin_append(&mut self) -> StoreResult<()> {
        self.begin(true)
    }
    /// Opens a write section for admissions decided on what the engine already knows,
    /// with no round trip first. `commit` then applies the writes only if no other
    /// writer has changed what such a decision reads since the previous pull (usage
    /// or leases of the accounts of the inserted leases, or any small table);
    /// otherwise it writes nothing, reads what changed (for the next `pull`) and
    /// fails with [`StoreError::Conflict`]. Returns false when the section holds the
    /// write lock instead (the default): then nothing can conflict.
    fn begin_optimistic(&mut self) -> StoreResult<bool> {
        self.begin(true).map(|()| false)
    }
    fn commit(&mut self) -> StoreResult<()>;
    /// Abandons the section; never fails.
    fn rollback(&mut self);
    /// Inside a section: what others changed since the previous pull.
    fn pull(&mut self) -> StoreResult<Changes>;
    /// Inside a section: all usage rows with `created_at_ms >= since_ms`, and resets
    /// the usage feed to follow on from them (start-up, or after the clock stepped back).
    fn load_usage_since(&mut self, since_ms: i64, f: &mut dyn FnMut(UsageRow)) -> StoreResult<()>;
    /// Inside a write section: applies one change. Returns the new row id for inserts,
    /// the number of affected rows for deletes, 0 otherwise.
    fn write(&mut self, w: &Write) -> StoreResult<i64>;
    /// Inside a write section: applies several changes in order (buffered writes), as
    /// `write` would one by one.
    fn write_all(&mut self, ws: &[&Write]) -> StoreResult<()> {
        for w in ws {
            self.write(w)?;
        }
        Ok(())
    }
    /// After a commit: true when its retention sweep stopped at its bound with more
    /// left to delete (the engine sweeps again at its next commit). Taken once.
    fn sweep_unfinished(&mut self) -> bool {
        false
    }
    /// Claims `name` for this engine for `ttl_ms` (real time): false while another
    /// engine holds it. Re-entrant for the holder. Used so that one engine of a
    /// fleet probes a key; a store on one host may always say yes.
    fn try_claim(&mut self, _name: &str, _ttl_ms: i64) -> StoreResult<bool> {
        Ok(true)
    }
    /// True when no other engine has this store open (checked now): this engine may
    /// then keep its write lock from one call to the next. A store shared across
    /// hosts, or that cannot tell, says false (the default).
    fn sole_writer(&mut self) -> bool {
        false
    }
    /// Waits at most this long for another process's lock (0: fail at once).
    fn set_busy_timeout(&mut self, ms: i64);
    /// Writes the store took over from a commit that got no reply
    /// ([`StoreError::InDoubt`]) and has not delivered yet (0 for most stores).
    fn undelivered(&self) -> usize {
        0
    }
    /// `Some(what happened)` when a call found the store had lost its data (SPEC 24.4:
    /// a Redis restarted without persistence or flushed), told once. The store writes
    /// back what this engine knows before any call of it goes on (that call, when the
    /// write-back succeeds; else the next one that can make it).
    fn take_lost(&mut self) -> Option<String> {
        None
    }
    /// Inside a section: the admission being decided depends on these keys' usage and
    /// leases too (the keys of one account), so a store that decides optimistically
    /// must refuse the commit when another engine touched them meanwhile.
    fn watch_keys(&mut self, _platform: &str, _keys: &[i64]) {}
    /// In a child process just after `fork()` (no section open): true when the store
    /// is this process's own copy (an in-memory database) and stays usable. Otherwise
    /// it lets go of what it inherited (a connection the parent still uses) without
    /// writing, unlocking or closing anything the parent relies on, and is not used
    /// again: the child opens a store of its own.
    fn after_fork(&mut self) -> bool;
    /// Analysis reads (no section needed): one row per event, a request row one
    /// request (`count` 1, `tokens` 0).
    fn usage_events(&mut self, f: &UsageFilter) -> StoreResult<Vec<UsageRow>>;
    /// Inside a section (or outside, for reads): the observed quota rows, of one
    /// platform or all.
    fn quota_states(&mut self, platform: Option<&str>) -> StoreResult<Vec<QuotaStateRow>>;
    fn server_logs(&mut self, limit: i64) -> StoreResult<Vec<(i64, LogRow, Option<String>)>>;
}
